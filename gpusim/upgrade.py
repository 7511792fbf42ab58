"""`python -m gpusim.upgrade RUN_DIR`: a run directory written by an older gpusim, rewritten
in today's run format (the originals kept beside).

Its body is `gpusim.training.trained.run_upgrade`.
"""
import sys

from gpusim.training.trained.run_upgrade import main

if __name__ == "__main__":
    sys.exit(main())
