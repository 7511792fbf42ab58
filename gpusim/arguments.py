"""The command-line arguments of every gpusim tool: a mistake is one `error:` line, exit code 2.

Here in the runtime so that its own tools (`python -m gpusim.doctor`, `gpusim.check_env`)
use it without the training package; training's tools (train, evaluate, render, ...)
use it too.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpusim.errors import GpusimError


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one `error:` line (exit code 2), like every other error
    (argparse's own print the usage first)."""

    def error(self, message):
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def int_in(low: int, high: int | None = None):
    """An argparse `type`: an integer in [low, high] (no upper bound when high is None)."""
    def parse(text: str) -> int:
        value = int(text)  # a ValueError: argparse says "invalid int value"
        if value < low or (high is not None and value > high):
            bound = f"at least {low}" if high is None else f"in {low}..{high:,}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    parse.__name__ = "int"  # what argparse calls the type in its messages
    return parse


def output_file(path, suffixes: tuple, flag: str = "--out") -> Path:
    """`path` as a file to write: one of `suffixes`, in a folder that exists, not a folder."""
    path = Path(path)
    if path.is_dir():
        raise GpusimError(f"{flag} {path} is a directory: name a file, e.g. "
                          f"{path / ('episode' + suffixes[0])}")
    if path.suffix.lower() not in suffixes:
        raise GpusimError(f"{flag} must end in {' or '.join(suffixes)}, got {path}")
    if not path.parent.is_dir():
        raise GpusimError(f"{flag} {path}: the folder {path.parent} does not exist")
    return path
