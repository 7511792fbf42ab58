"""`python -m gpusim.evaluate RUN_DIR`: trained and random policies, paired.

Its body is `gpusim.training.trained.evaluation`.
"""
import sys

from gpusim.training.trained.evaluation import main

if __name__ == "__main__":
    sys.exit(main())
