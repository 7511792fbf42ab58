"""`python -m gpusim.evaluate RUN_DIR`: trained and random policies, paired.

Its body is `gpusim.training.trained.evaluate`.
"""
import sys

from gpusim.training.trained.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
