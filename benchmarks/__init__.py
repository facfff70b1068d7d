"""Benchmarks of the processor and of training steps (see docs/benchmarks.md)."""
