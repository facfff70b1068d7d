"""Checkpoints: written atomically, read, and what a run may continue from."""
