"""What the benchmarks share: the repository's root, and the machine every benchmark prints
first."""
from __future__ import annotations

import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: benchmarks run from here


def machine() -> str:
    """CPU model and cores, GPU (if torch sees one), and the versions that matter."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import numba
    import numpy as np
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (f"CPU: {cpu}, {os.cpu_count()} cores | GPU: {gpu} | torch {torch.__version__}, "
            f"numba {numba.__version__}, numpy {np.__version__}")
