"""The command-line parser of every gpusim tool: a mistake is one `error:` line, exit code 2.

Here in the runtime so that its own tools (`python -m gpusim.doctor`) use it
without the training package; `gpusim.training.arguments` builds on it.
"""
from __future__ import annotations

import argparse
import sys


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one `error:` line (exit code 2), like every other error
    (argparse's own print the usage first)."""

    def error(self, message):
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)
