"""Datasets: the anemoi-style Zarr reader and the built-in synthetic dataset."""

from training.data.dataset import DatasetError, ZarrDataset
from training.data.generate import generate_rossby_haurwitz

__all__ = ["DatasetError", "ZarrDataset", "generate_rossby_haurwitz"]
