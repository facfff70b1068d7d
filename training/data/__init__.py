"""Datasets: the anemoi-style Zarr reader and the built-in synthetic dataset."""

from training.data.dataset import DatasetError, ZarrDataset
from training.data.generate import check_built_in_path, generate_rossby_haurwitz, write_rossby_haurwitz

__all__ = ["DatasetError", "ZarrDataset", "check_built_in_path", "generate_rossby_haurwitz", "write_rossby_haurwitz"]
