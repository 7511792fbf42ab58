"""Section timers that add no host sync: CUDA events on a GPU, the wall clock on a CPU."""
from __future__ import annotations

import collections
import time
from contextlib import contextmanager

import torch


class SectionTimer:
    """`with timer("env"): ...` accumulates time per section; `totals()` reads them once."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self):
        self._wall = collections.defaultdict(float)
        self._events = collections.defaultdict(list)

    @contextmanager
    def __call__(self, section: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events[section].append((start, end))
        else:
            start = time.perf_counter()
            yield
            self._wall[section] += time.perf_counter() - start

    def totals(self) -> dict:
        """Seconds per section (synchronises once on a GPU)."""
        if not self.cuda:
            return dict(self._wall)
        torch.cuda.synchronize()
        return {name: sum(s.elapsed_time(e) for s, e in pairs) / 1000.0
                for name, pairs in self._events.items()}
