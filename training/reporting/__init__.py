"""What a run shows: its report, MLflow tracking, the metrics file and the plots."""
