"""`python -m gpusim.plot RUN_DIR`: learning curves.

Its body is `gpusim.training.trained.learning_curves`.
"""
import sys

from gpusim.training.trained.learning_curves import main

if __name__ == "__main__":
    sys.exit(main())
