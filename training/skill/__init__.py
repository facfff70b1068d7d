"""Scores: RMSE, anomaly correlation and the centroid's error by lead time, beside the baselines."""
