"""`python -m gpusim.league RUN_DIR`: cross-play, ratings and best responses of a league.

Its body is `gpusim.training.judge.league_cli`.
"""
import sys

from gpusim.training.judge.league_cli import main

if __name__ == "__main__":
    sys.exit(main())
