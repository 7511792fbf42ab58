"""`python -m gpusim.train`: the training CLI (its body is `gpusim.training.cli`)."""
import sys

from gpusim.training.cli import main

if __name__ == "__main__":
    sys.exit(main())
