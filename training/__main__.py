from training.app import _hydra_main
from training.launch.launcher import main

if __name__ == "__main__":
    main(_hydra_main)
