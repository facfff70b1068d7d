"""``python -m training`` (and the ``gridshard-train`` command): train a forecaster
(:mod:`training.app`)."""

import sys

from training.launch.errors import exit_on_bad_command_line


def main() -> None:
    """Train from the command line's Hydra overrides. They are checked before the app's modules
    load (seconds of imports), so that a misspelt key is one quick line."""
    exit_on_bad_command_line(sys.argv[1:])
    from training.app import _hydra_main  # deferred: the model, torch_geometric, zarr (seconds)
    from training.launch.launcher import main as launch  # deferred: as training.app

    launch(_hydra_main, check_command_line=False)


if __name__ == "__main__":
    main()
