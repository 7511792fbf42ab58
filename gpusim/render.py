"""`python -m gpusim.render RUN_DIR_OR_ENV --out episode.gif`: watch episodes.

Its body is `gpusim.training.trained.animation`.
"""
import sys

from gpusim.training.trained.animation import main

if __name__ == "__main__":
    sys.exit(main())
