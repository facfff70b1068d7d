"""The encoder–processor–decoder forecaster and its graphs."""

from training.model.forecaster import Forecaster, ShardedGrids

__all__ = ["Forecaster", "ShardedGrids"]
