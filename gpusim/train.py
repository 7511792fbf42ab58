"""`python -m gpusim.train`: the training CLI (its body is `gpusim.training.train_cli`)."""
import sys

from gpusim.training.train_cli import main

if __name__ == "__main__":
    sys.exit(main())
