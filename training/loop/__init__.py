"""The training loop: the trainer and one optimisation step."""
