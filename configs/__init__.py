"""Hydra configuration groups of gridshard training runs (a package so that Hydra finds them when installed)."""
