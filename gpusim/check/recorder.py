"""Recording arrays: every element a thread reads or writes, between two barriers.

A kernel's phases are plain Python functions before numba compiles them
(`py_func`). Run over `Recorded` arrays instead of numpy ones, each element
access tells a `Recorder` which thread made it; the recorder finds, within one
segment (between two barriers):

- a race: an element one thread writes and another thread reads or writes,
  unless both accesses are atomic (`cuda.atomic.*`, raw kernels only);
- in an agent phase: a thread writing another agent's entry of an agent-scope
  array (`ownership`), or a per-replica entry updated (read, then written) by
  two different agents, in any steps (`update`: a shared count);
- an entry of another replica read or written, a global array written;
- an index out of bounds (raised as `OutOfBounds`, with the array and index);
- the first NaN or Inf written (for the finite check's message).

Elements are named by (array, flat index); the flat index becomes the full
index only when a problem is reported. A write's source line is kept when it
is first seen (a read's only when it races), so the common case stays cheap.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

import numpy as np

# Files whose frames never name where an access is: the recorder's, the replay's,
# gpusim's RNG helpers (a race in rng_state is the caller's line).
_SKIP_FILES = {os.path.join(os.path.dirname(__file__), name)
               for name in ("recorder.py", "kernel_replay.py", "raw_kernel_races.py")}
_SKIP_FILES.add(os.path.join(os.path.dirname(os.path.dirname(__file__)), "rng.py"))


@dataclass(frozen=True)
class ArrayMeta:
    """What the recorder knows of an array: its name, scope and leading sizes."""
    name: str
    scope: str  # "agent", "env", "global", or "shared" (a raw kernel's shared memory)
    shape: tuple
    per_replica: int = 0  # elements per replica (agent and env scopes)
    per_agent: int = 0  # elements per agent (agent scope)


def array_meta(name, scope, shape) -> ArrayMeta:
    shape = tuple(int(n) for n in shape)
    size = int(np.prod(shape, dtype=np.int64))
    if scope in ("agent", "env") and shape and shape[0]:
        per_replica = size // shape[0]
        per_agent = per_replica // shape[1] if scope == "agent" and len(shape) > 1 \
            and shape[1] else 0
        return ArrayMeta(name, scope, shape, per_replica, per_agent)
    return ArrayMeta(name, scope, shape)


class OutOfBounds(IndexError):
    """An index past an array's end: `what` names the array, index and access."""

    def __init__(self, what: str, where: str = "?", thread=None):
        super().__init__(what)
        self.what, self.where, self.thread = what, where, thread


@dataclass
class Problem:
    """One race or rule broken: what happened, the source line(s), what to do instead.
    The driver adds the phase and step: `f"{what}, in {phase} ({where}): {advice}"`."""
    kind: str  # "race", "ownership", "update", "replica", "global", "bounds", "blocks"
    what: str
    where: str
    advice: str


def site(depth: int = 2) -> tuple:
    """(file, line) of the innermost frame outside the recorder and gpusim's helpers."""
    frame = sys._getframe(depth)
    while frame.f_code.co_filename in _SKIP_FILES and frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def site_text(where: tuple) -> str:
    return f"{os.path.basename(where[0])}:{where[1]}"


def location(depth: int = 2) -> str:
    """`file.py:line` of the innermost frame outside the recorder and gpusim's helpers."""
    return site_text(site(depth + 1))


def index_text(meta: ArrayMeta, flat: int) -> str:
    idx = np.unravel_index(flat, meta.shape) if meta.shape else ()
    return f"{meta.name}[{', '.join(str(int(i)) for i in idx)}]"


class Recorder:
    """The accesses of the current segment, and the problems found so far.

    The driver sets `thread` (an agent id, or (block, thread) in a raw kernel),
    `replica` (the replica it runs, None where any may be touched), `agent_phase`
    (whether the agent-phase rules apply), `alone` (one thread runs the segment, so
    nothing can race) and calls `barrier()` between segments.
    """

    LATER = "in a later phase"  # where a read of another thread's write belongs

    def __init__(self, limit: int = 20, updaters: dict | None = None):
        self.thread = 0
        self.replica = None
        self.phase = None  # the running phase's function (updates are told apart by it)
        self.agent_phase = False
        # (phase, array, entry within a replica) -> the first agent that updated it; shared
        # by the recorders of one check, so two agents updating one entry in different
        # steps are seen
        self.updaters = {} if updaters is None else updaters
        self.alone = False  # the segment runs one thread (an env phase, a guard)
        self.atomic = False
        self.accesses = 0  # recorded so far (the races check's budget)
        self.limit = limit
        self.problems: list[Problem] = []
        self.faults: list[Problem] = []  # indices out of bounds
        # the first NaN or Inf written in the lowest replica (as the finite check finds
        # them), and its line with the phase (set by the replay)
        self.nonfinite: Problem | None = None
        self.nonfinite_replica = None
        self.nonfinite_line: str | None = None
        self._seen = set()  # (kind, array name): one problem of a kind per array
        self.found = set()  # (phase, array name) of every problem (static_races skips them)
        self.barrier()

    def barrier(self):
        # (name, flat) -> [writer, its source line, reader, another reader,
        #                  atomic updater, another atomic updater]; None where none
        self._seen_in_segment = {}

    # ---- accesses ---------------------------------------------------------------------
    def read(self, meta: ArrayMeta, flat: int):
        self.accesses += 1
        thread = self.thread
        if self.replica is not None and meta.per_replica \
                and flat // meta.per_replica != self.replica:
            self._other_replica(meta, flat, thread, "reads")
        if self.alone:  # one thread in this segment (an env phase): nothing to race with
            return
        key = (meta.name, flat)
        entry = self._seen_in_segment.get(key)
        if entry is None:
            self._seen_in_segment[key] = [None, None, None, None, thread, None] if self.atomic \
                else [None, None, thread, None, None, None]
            return
        writer = entry[0]
        if writer is not None and writer != thread:
            self._race(meta, flat, thread, "reads", writer, "writes", entry[1])
        if self.atomic:
            _add(entry, 4, thread)
            return
        if entry[4] is not None:
            other = _other(entry, 4, thread)
            if other is not None:
                self._race(meta, flat, thread, "reads", other, "updates atomically", None)
        reader = entry[2]
        if reader is None:
            entry[2] = thread
        elif reader != thread and entry[3] is None:
            entry[3] = thread

    def write(self, meta: ArrayMeta, flat: int):
        self.accesses += 1
        thread = self.thread
        if meta.scope == "global":
            self._problem("global", meta, f"{self._thread_text(thread)} writes "
                          f"{index_text(meta, flat)} of a global array, shared by every "
                          "replica", location(3), "keep what phases write in agent- or "
                          "env-scope arrays")
        elif self.replica is not None and meta.per_replica:
            if flat // meta.per_replica != self.replica:
                self._other_replica(meta, flat, thread, "writes")
            elif self.agent_phase and meta.per_agent \
                    and (flat % meta.per_replica) // meta.per_agent != thread:
                self._problem("ownership", meta, f"agent {thread} writes "
                              f"{index_text(meta, flat)}, agent "
                              f"{(flat % meta.per_replica) // meta.per_agent}'s entry",
                              location(3), "in an agent phase a thread writes only its own "
                              "agent's entries; gather across agents in a later phase")
        if self.alone:
            return
        key = (meta.name, flat)
        entry = self._seen_in_segment.get(key)
        if entry is None:
            self._seen_in_segment[key] = [None, None, None, None, thread, None] if self.atomic \
                else [thread, site(3), None, None, None, None]
            return
        if self.agent_phase and meta.scope == "env" and not self.atomic \
                and thread in (entry[2], entry[3]):  # an update: read, then written
            first = self.updaters.setdefault((self.phase, meta.name, flat % meta.per_replica),
                                             thread)
            if first != thread:
                self._problem("update", meta, f"agents {first} and {thread} both update "
                              f"{index_text(meta, flat)}, a per-replica entry (read it, then "
                              "write it)", location(3), "a shared count: when two agents "
                              "update it in one step on a GPU, one update is lost; update it "
                              "in an env phase, from per-agent entries written before")
        verb = "updates atomically" if self.atomic else "writes"
        if entry[0] is not None and entry[0] != thread:
            self._race(meta, flat, thread, verb, entry[0], "writes", entry[1])
        other = _other(entry, 2, thread)
        if other is not None:
            self._race(meta, flat, thread, verb, other, "reads", None)
        if self.atomic:
            _add(entry, 4, thread)
            return
        other = _other(entry, 4, thread)
        if other is not None:
            self._race(meta, flat, thread, verb, other, "updates atomically", None)
        if entry[0] is None:
            entry[0], entry[1] = thread, site(3)

    def saw_nonfinite(self, meta, flat, value):
        """Keep the first NaN or Inf written, the one in the lowest replica."""
        replica = self.replica if self.replica is not None else 0
        if self.nonfinite is not None and self.nonfinite_replica <= replica:
            return
        self.nonfinite = Problem("nonfinite", f"{_thread_text(self.thread)} writes "
                                 f"{index_text(meta, flat)} = {value}", location(3), "")
        self.nonfinite_replica, self.nonfinite_line = replica, None

    def out_of_bounds(self, what, where) -> OutOfBounds:
        """The exception for an index out of bounds (kept as a problem too)."""
        self.faults.append(Problem("bounds", f"{self._thread_text(self.thread)} {what}", where,
                                   "an index out of bounds reads or writes another entry, or "
                                   "faults, on a GPU"))
        return OutOfBounds(what, where, self.thread)

    # ---- the rules --------------------------------------------------------------------
    def _other_replica(self, meta, flat, thread, verb):
        self._problem("replica", meta, f"{self._thread_text(thread)} of replica "
                      f"{self.replica} {verb} {index_text(meta, flat)}, replica "
                      f"{flat // meta.per_replica}'s entry", location(4),
                      "replicas never touch each other's entries")

    def _race(self, meta, flat, thread, verb, other, other_verb, other_where):
        here = location(4)
        there = None if other_where is None else site_text(other_where)
        where = here if there is None or there == here else f"{here}, {there}"
        self._problem("race", meta, f"{self._thread_text(thread)} {verb} "
                      f"{index_text(meta, flat)}, which {self._thread_text(other)} "
                      f"{other_verb} between the same two barriers", where,
                      "on a GPU they run at once, so updates are lost and results depend on "
                      f"timing; write each entry from one thread, read it {self.LATER}")

    _thread_text = staticmethod(lambda thread: _thread_text(thread))

    def _problem(self, kind, meta, what, where, advice):
        self.found.add((self.phase, meta.name))
        if (kind, meta.name) in self._seen or len(self.problems) >= self.limit:
            return
        self._seen.add((kind, meta.name))
        self.problems.append(Problem(kind, what, where, advice))


def _thread_text(thread) -> str:
    if isinstance(thread, tuple):
        return f"thread {thread[1]} of block {thread[0]}"
    return f"agent {thread}"


_FLOATS = (float, np.float32, np.float64, np.float16)


def _add(entry, slot, thread):
    """Record `thread` in the two slots from `slot`: the first thread, another one."""
    if entry[slot] is None:
        entry[slot] = thread
    elif entry[slot] != thread and entry[slot + 1] is None:
        entry[slot + 1] = thread


def _other(entry, slot, thread):
    """A thread other than `thread` in the two slots from `slot`, or None."""
    if entry[slot] is not None and entry[slot] != thread:
        return entry[slot]
    return entry[slot + 1]


class Recorded:
    """A numpy array (or a view of one) whose element accesses go to a Recorder."""
    __slots__ = ("_data", "_ids", "_meta", "_rec", "_ndim")

    def __init__(self, data: np.ndarray, ids: np.ndarray, meta: ArrayMeta, recorder):
        self._data, self._ids, self._meta, self._rec = data, ids, meta, recorder
        self._ndim = data.ndim

    @classmethod
    def of(cls, data: np.ndarray, meta: ArrayMeta, recorder) -> "Recorded":
        return cls(data, np.arange(data.size, dtype=np.int64).reshape(data.shape), meta,
                   recorder)

    shape = property(lambda self: self._data.shape)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    dtype = property(lambda self: self._data.dtype)

    def __len__(self):
        return len(self._data)

    def _flat(self, key, verb):
        """The flat index of element `key`, or the ids of the view it selects."""
        try:
            if (key.__class__ is tuple and len(key) == self._ndim) \
                    or (self._ndim == 1 and key.__class__ is int):
                return self._ids.item(key)  # one element: a Python int, fast
            ids = self._ids[key]
        except IndexError:
            raise self._rec.out_of_bounds(f"{verb} {_out_of_bounds(self._meta, self._ids, key)}",
                                          location(3)) from None
        except (TypeError, ValueError):  # slices in a full-length key
            ids = self._ids[key]
        return ids if ids.__class__ is np.ndarray else int(ids)

    def __getitem__(self, key):
        if key.__class__ is tuple and len(key) == self._ndim:  # one element: the fast path
            try:
                flat = self._ids.item(key)
            except (TypeError, ValueError, IndexError):
                flat = self._flat(key, "reads")
        else:
            flat = self._flat(key, "reads")
        if flat.__class__ is int:
            self._rec.read(self._meta, flat)
            return self._data[key]
        return Recorded(self._data[key], flat, self._meta, self._rec)

    def __setitem__(self, key, value):
        flat = self._flat(key, "writes")
        if flat.__class__ is int:
            self._rec.write(self._meta, flat)
            if value.__class__ in _FLOATS and not math.isfinite(value):
                self._rec.saw_nonfinite(self._meta, flat, value)
        else:
            for one in flat.flat:
                self._rec.write(self._meta, int(one))
        self._data[key] = value.snapshot() if isinstance(value, Recorded) else value

    def __iter__(self):
        for k in range(len(self._data)):
            yield self[k]

    def snapshot(self) -> np.ndarray:
        """The values, every element recorded as read."""
        for flat in self._ids.flat:
            self._rec.read(self._meta, int(flat))
        return self._data.copy()

    def __array__(self, dtype=None, copy=None):
        values = self.snapshot()
        return values if dtype is None else values.astype(dtype)


def _out_of_bounds(meta: ArrayMeta, ids: np.ndarray, key) -> str:
    """`name[i, j, k] (index k is past the end of axis 2, of size n; name is (...))`, the
    index counted from the whole array where `ids` is a view of its leading entries."""
    parts = key if isinstance(key, tuple) else (key,)
    lead = ()
    if ids.size and ids.ndim < len(meta.shape):
        lead = np.unravel_index(int(ids.flat[0]), meta.shape)[:len(meta.shape) - ids.ndim]
    full = [int(i) for i in lead] + list(parts)
    text = ", ".join(":" if isinstance(k, slice) else str(k) for k in full)
    axis = next((a for a, k in enumerate(full) if not isinstance(k, slice) and a < len(meta.shape)
                 and not -meta.shape[a] <= int(k) < meta.shape[a]), None)
    if axis is None:
        return f"{meta.name}[{text}] (more indices than its {len(meta.shape)} axes)"
    return (f"{meta.name}[{text}]: index {full[axis]} is out of bounds for axis {axis} of size "
            f"{meta.shape[axis]} ({meta.name} has shape {meta.shape})")
