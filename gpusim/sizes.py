"""Memory sizes: read from text ('2GiB') and written for people ('1.50 GiB')."""
from __future__ import annotations

import re

from gpusim.errors import GpusimError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from '2GiB', '512MiB', '1.5GB', '1000000'."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise GpusimError(f"cannot read memory size '{text}' (examples: 2GiB, 512MiB, 1.5GB)")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise GpusimError(f"memory size must be positive, got '{text}'")
    return size


def format_size(num_bytes) -> str:
    if num_bytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"
