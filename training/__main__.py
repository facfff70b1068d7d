"""``python -m training``: train a forecaster (:mod:`training.app`)."""

import sys

from training.launch.errors import exit_on_bad_command_line

if __name__ == "__main__":
    exit_on_bad_command_line(sys.argv[1:])  # before the app's modules load: a misspelt key is one quick line
    from training.app import _hydra_main
    from training.launch.launcher import main

    main(_hydra_main)
