"""CUDA graphs: a whole step recorded once and replayed, so the GPU no longer waits on Python.

At rollout sizes a GPU step is dozens of small kernels (each policy's forward,
the sampler, the env's step kernel, the rollout store's copies, the episode
bookkeeping), each launched from Python in more time than it runs. A CUDA
graph records the launches of one call and replays them all with one.

`StepGraph(step, what)` runs `step()` eagerly at its first call (which makes
what the step keeps: allocator pools, Adam's state), captures it at the
second and replays it from then on. A step may be captured only if it is
static: the same operations on the same tensors at every call, no host read
of a device value, no Python state that changes between calls
(tests/test_static_steps.py checks the learners' steps on the CPU). What
changes per call goes in through tensors the step reads (a learning rate
filled in place), and its results come out through tensors it writes, which
every replay overwrites. gpusim's env and sampler kernels launch on torch's
current stream, so the capture records them too.

A capture that fails prints one line, and the step runs eagerly from then on.
"""
from __future__ import annotations

import sys

import torch

from gpusim.errors import ConfigError, describe

MODES = ("auto", "on", "off")


def graphs_enabled(choice: str, device: torch.device) -> bool:
    """`auto`: on CUDA devices (the CPU has nothing to gain: its launches cost nothing)."""
    if choice == "on" and device.type != "cuda":
        raise ConfigError("config key 'trainer.cuda_graphs' on needs a CUDA device (use auto or "
                          "off on the CPU)")
    return device.type == "cuda" and choice != "off"


class StepGraph:
    """`step()` eagerly once, then captured into a CUDA graph and replayed (see the module)."""

    def __init__(self, step, what: str, enabled: bool, timer=None):
        self.step = step
        self.what = what
        self.enabled = enabled
        self.timer = timer  # paused during the capture: its events would be recorded, not run
        self.calls = 0
        self.graph = None

    def warming_up(self) -> bool:
        """Whether a call is still to capture the graph."""
        return self.enabled and self.graph is None

    def __call__(self):
        self.calls += 1
        if not self.enabled or self.calls == 1:
            return self.step()
        if self.graph is None:
            self._capture()
            if self.graph is None:
                return self.step()
        self.graph.replay()

    def drop(self):
        """Forget the graph (the tensors it reads were replaced): the next call captures."""
        self.graph, self.calls = None, min(self.calls, 1)

    def _capture(self):
        graph = torch.cuda.CUDAGraph()
        # the eager call ran on the current stream; the capture runs on torch's side stream
        torch.cuda.synchronize()
        try:
            with _paused(self.timer), torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.step()
        except Exception as exc:  # noqa: BLE001 - any capture failure: run eagerly
            torch.cuda.synchronize()
            print(f"gpusim: a CUDA graph of {self.what} could not be captured "
                  f"({describe(exc)[:200]}); running it eagerly", file=sys.stderr, flush=True)
            self.enabled = False
            return
        self.graph = graph


class _paused:
    """The section timer off for the duration (a no-op without one)."""

    def __init__(self, timer):
        self.timer = timer

    def __enter__(self):
        if self.timer is not None:
            self.timer.paused = True

    def __exit__(self, *exc):
        if self.timer is not None:
            self.timer.paused = False
        return False
