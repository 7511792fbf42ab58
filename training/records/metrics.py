"""metrics.jsonl: one JSON record per iteration, read back on resume and for plots.

Reading it never trusts it: a line that is not a JSON object with an integer
`iteration` is not a record, and a path that is not a readable file is one
clear error.
"""
from __future__ import annotations

import json
from pathlib import Path

from gpusim.errors import GpusimError, reading


def record(line: str) -> dict | None:
    """The metrics record a line holds, or None if it holds none."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    iteration = row.get("iteration") if isinstance(row, dict) else None
    if isinstance(iteration, bool) or not isinstance(iteration, int):
        return None
    return row


def read_lines(path: Path) -> list:
    """The non-empty lines of metrics file `path`, or one line saying why it cannot be read."""
    if not path.is_file():
        raise GpusimError(f"{path} is not a file: move it away, or restore the run's metrics")
    with reading(path):
        text = path.read_text(encoding="utf-8", errors="replace")  # a bad byte: a bad line
    return [line for line in text.splitlines() if line.strip()]


def not_a_record(path: Path, number: int) -> GpusimError:
    return GpusimError(f"{path}: line {number} is not a metrics record (a JSON object with an "
                       "integer iteration); repair or remove that line")
