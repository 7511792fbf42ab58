"""`python -m gpusim.plot RUN_DIR`: learning curves (its body is `gpusim.training.trained.plot`)."""
import sys

from gpusim.training.trained.plot import main

if __name__ == "__main__":
    sys.exit(main())
