"""CUDA graphs: a whole step recorded once and replayed, so the GPU no longer waits on Python.

At rollout sizes a GPU step is dozens of small kernels (each policy's forward,
the sampler, the env's step kernel, the rollout store's copies, the episode
bookkeeping), each launched from Python in more time than it runs. A CUDA
graph records the launches of one call and replays them all with one.

`StepGraph(step, what, enabled)` wraps a plain function of tensors: it runs
`step(*inputs)` eagerly at its first call (which makes what the step keeps:
allocator pools, the optimizer's state), captures it at the second and replays it
from then on. The function is the same one an eager run calls; nothing in it asks
how it is run. A step may be captured only if it is static: the same operations on
tensors of the same shapes at every call, no host read of a device value, no
Python state that changes between calls (tests/training/test_static_steps.py checks the
learners' steps on the CPU). Its inputs are copied into tensors the graph reads
(kept from the capture; nested inputs too: lists, tuples, named tuples and dicts;
inputs of other shapes are captured again); its outputs are the tensors the capture made, which every
replay overwrites (read them before the next call). What it reads besides (buffers,
parameters, a learning rate changed in place) must be the same tensors at every
call. gpusim's env and sampler kernels launch on torch's current stream, so the
capture records them too.

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


def step_graph(step, what: str, static: bool, enabled: bool, timer=None):
    """`step` as a `StepGraph` where it is static (captured where `enabled`; the tests run
    the static form eagerly), else `step` itself: a step never captured needs no wrapper."""
    return StepGraph(step, what, enabled, timer) if static else step


def graphs_of(steps) -> list:
    """The `StepGraph`s among `steps` (the others are plain functions)."""
    return [s for s in steps if isinstance(s, StepGraph)]


class StepGraph:
    """`step()` eagerly once, then captured into a CUDA graph and replayed (see the module)."""

    def __init__(self, step, what: str, enabled: bool, timer=None):
        self.step = step
        self.what = what
        self.enabled = enabled
        self.timer = timer  # paused during the capture: its events would be recorded, not run
        self.calls = 0
        self.graph = None
        self.inputs = self.outputs = self.layout = None  # the captured call's

    def warming_up(self) -> bool:
        """Whether a call is still to capture the graph."""
        return self.enabled and self.graph is None

    def __call__(self, *inputs):
        self.calls += 1
        if not self.enabled or self.calls == 1:
            return self.step(*inputs)
        given, layout = tree_flatten(inputs)
        if self.graph is not None and layout != self.layout:  # (another shape: capture again)
            self.graph = None
        if self.graph is None:
            self._capture(given, layout)
            if self.graph is None:
                return self.step(*inputs)
        for static, new in zip(self.inputs, given):
            if isinstance(static, torch.Tensor):
                static.copy_(new)
        self.graph.replay()
        return self.outputs

    def drop(self):
        """Forget the graph (the tensors it reads were replaced): the next call captures."""
        self.graph, self.calls = None, min(self.calls, 1)

    def _capture(self, given: list, layout):
        graph = torch.cuda.CUDAGraph()
        static = [x.clone() if isinstance(x, torch.Tensor) else x for x in given]
        # the eager call ran on the current stream; the capture runs on torch's side stream
        torch.cuda.synchronize()
        try:
            with _paused(self.timer), torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = self.step(*tree_unflatten(iter(static), layout.spec))
        except Exception as exc:  # noqa: BLE001 - any capture failure: run eagerly
            torch.cuda.synchronize()
            print(f"gpusim: a CUDA graph of {self.what} could not be captured "
                  f"({describe(exc)[:200]}); running it eagerly", file=sys.stderr, flush=True)
            self.enabled = False
            return
        self.graph, self.inputs, self.outputs, self.layout = graph, static, outputs, layout


class TreeLayout:
    """Inputs' nesting and their tensors' shapes: a captured graph replays only on inputs
    laid out as the capture's."""

    def __init__(self, spec, shapes: list):
        self.spec, self.shapes = spec, shapes

    def __eq__(self, other):
        return isinstance(other, TreeLayout) and self.spec == other.spec \
            and self.shapes == other.shapes


def tree_flatten(inputs: tuple) -> tuple:
    """(the tensors and other leaves of nested inputs, their layout)."""
    leaves, spec = _flatten(inputs)
    return leaves, TreeLayout(spec, [x.shape if isinstance(x, torch.Tensor) else x
                                     for x in leaves])


def _flatten(x) -> tuple:
    """(leaves, nesting) of `x`: lists, tuples, named tuples and dicts are opened, anything
    else is a leaf (nesting None)."""
    if isinstance(x, dict):
        parts = [_flatten(v) for v in x.values()]
        return [leaf for p in parts for leaf in p[0]], (dict, tuple(x), tuple(p[1] for p in parts))
    if isinstance(x, (list, tuple)):
        parts = [_flatten(v) for v in x]
        return [leaf for p in parts for leaf in p[0]], (type(x), None, tuple(p[1] for p in parts))
    return [x], None


def tree_unflatten(leaves, spec):
    """The nested value of nesting `spec` holding the leaves of iterator `leaves`."""
    if spec is None:
        return next(leaves)
    kind, keys, children = spec
    values = [tree_unflatten(leaves, child) for child in children]
    if kind is dict:
        return dict(zip(keys, values))
    return kind(*values) if hasattr(kind, "_fields") else kind(values)


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


class FixedChunks:
    """`fn(rows)` -> one output per row, run over any number of rows in chunks of `size`
    rows; with `pad`, every chunk `size` rows (the last padded with copies of its first
    row, whose outputs are dropped), each a `StepGraph` replay where `enabled`."""

    def __init__(self, fn, size: int, what: str, pad: bool, enabled: bool, timer=None):
        self.size, self.pad = size, pad
        self.graph = StepGraph(fn, what, enabled, timer)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        out = None
        for start in range(0, rows.shape[0], self.size):
            part = rows[start:start + self.size]
            n = part.shape[0]
            if self.pad and n < self.size:
                part = torch.cat([part, part[:1].expand(self.size - n, *part.shape[1:])])
            chunk = self.graph(part)[:n]  # (a replay's output: overwritten by the next)
            if out is None and n == rows.shape[0]:
                return chunk.clone() if self.graph.enabled else chunk
            if out is None:
                out = chunk.new_empty((rows.shape[0],) + chunk.shape[1:])
            out[start:start + n] = chunk
        return out

    def warming_up(self) -> bool:
        return self.graph.warming_up()

    def drop(self):
        self.graph.drop()
