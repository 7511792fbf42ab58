"""A portable kernel replayed in Python, one thread after another, over recording arrays.

`replay` runs a `KernelSpec`'s sections for some replicas as the GPU kernel
would, phase by phase with a barrier between phases: an agent phase once per
agent (the recorder told which agent is running), an env phase as agent 0.
It works on copies of the arrays, so nothing it writes reaches the env.

What it reports: each problem the recorder found (races, an entry written by
a thread that does not own it, other replicas' entries, global arrays
written), as one line that adds the phase, the kernel and `context` (the
step); an index out of bounds is raised at once as `KernelFault`, in one line
naming the array, the index, the agent, the phase and the source line.
"""
from __future__ import annotations

import collections
import math
import types
import warnings

import numpy as np

from gpusim.check.recorder import OutOfBounds, Recorded, Recorder, array_meta
from gpusim.errors import GpusimError
from gpusim.kernels import is_jit, to_python

_PYTHON = {}  # jit function -> its pure-Python copy (callees swapped too)


class KernelFault(GpusimError):
    """A phase indexed an array out of bounds; the message names where."""
    exit_code = 1


class ReplayStopped(Exception):
    """The Python replay raised where the compiled kernel did not (pure-Python arithmetic:
    a ZeroDivisionError where numba gives inf): nothing is known past that point."""


def python_of(fn):
    """A pure-Python copy of jit function `fn` whose jit callees are pure Python too, those
    reached through a module (`rng.uniform`) included."""
    if fn not in _PYTHON:
        _PYTHON[fn] = _copy(fn, {})
    return _PYTHON[fn]


def python_copy(fn, swaps: dict):
    """`python_of(fn)`, uncached, with global objects swapped (by identity) for stand-ins:
    `{numba.cuda: recording_cuda}` for a raw kernel."""
    return _copy(fn, {}, swaps)


def _copy(fn, memo, swaps=None):
    def rewrite(value, memo):  # numba's math, and modules whose jit functions are read
        if value is math:
            return _NUMBA_MATH
        if isinstance(value, types.ModuleType) and _has_jit(value):
            return _PythonModule(value, memo, swaps)
        return None
    return to_python(fn, swaps, memo, rewrite)


def _has_jit(module) -> bool:
    return any(is_jit(v) for v in vars(module).values())


class _NumbaMath:
    """`math` as numba computes it: NaN or Inf where Python's raises (a square root of a
    negative number, an overflowing exp), so the replay goes on where the kernel did."""
    _NUMPY = {"sqrt": np.sqrt, "log": np.log, "log10": np.log10, "log2": np.log2,
              "log1p": np.log1p, "acos": np.arccos, "asin": np.arcsin, "acosh": np.arccosh,
              "atanh": np.arctanh, "exp": np.exp, "expm1": np.expm1, "cosh": np.cosh,
              "sinh": np.sinh, "fmod": np.fmod, "pow": np.power}

    def __getattr__(self, name):
        return self._NUMPY.get(name) or getattr(math, name)


_NUMBA_MATH = _NumbaMath()


class _PythonModule:
    """A module whose jit functions read as their pure-Python copies."""

    def __init__(self, module, memo, swaps=None):
        self._module, self._memo, self._swaps = module, memo, swaps

    def __getattr__(self, name):
        value = getattr(self._module, name)
        return _copy(value, self._memo, self._swaps) if is_jit(value) else value


def phase_name(fn) -> str:
    return getattr(getattr(fn, "py_func", fn), "__name__", repr(fn))


def recorded_arrays(arrays: dict, recorder, scopes: dict | None = None,
                    aliases: dict | None = None):
    """A namedtuple (fields in `arrays`' order) of Recorded over `arrays`, scoped by
    `scopes` (name -> scope; unknown names are "global" for the rules, never owned);
    `aliases` (field -> array name) share their array's recording, as on the device."""
    aliases = aliases or {}
    scopes = scopes or {}
    made = {}
    for name, data in arrays.items():
        if name in aliases:
            continue
        made[name] = Recorded.of(data, array_meta(name, scopes.get(name, "unknown"),
                                                  data.shape), recorder)
    values = [made[aliases.get(name, name)] for name in arrays]
    return _tuple_type(tuple(arrays))(*values)


_TYPES = {}


def _tuple_type(fields):
    if fields not in _TYPES:
        _TYPES[fields] = collections.namedtuple("RecordedArrays", fields)
    return _TYPES[fields]


def replay(spec, s, p, num_agents: int, replicas, recorder: Recorder,
           context: str = "", skip=()) -> list:
    """Run `spec` on replicas `replicas` over recorded arrays `s` (see recorded_arrays)
    and parameters `p`; the problems found, each one line. Phases whose function is in
    `skip` are left out (in guarded sections only: the auto-reset's reset phases, once
    the reset kernel was replayed). Raises KernelFault on an index out of bounds and
    ReplayStopped on any other exception a phase raises."""
    lines = []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # uint64 wrap-around, 0/0: as numba
        for env in replicas:
            recorder.replica = env
            for section in spec.sections:
                if section.guard is not None:
                    recorder.agent_phase, recorder.alone = False, True
                    recorder.thread = 0
                    run = _call(spec, section.guard, True, recorder, env, s, p, context)
                    recorder.barrier()
                    if not run:
                        continue
                for phase in section.phases:
                    if section.guard is not None and phase.fn in skip:
                        continue
                    recorder.agent_phase = not phase.per_env
                    recorder.alone = phase.per_env or num_agents == 1
                    recorder.phase = phase.fn
                    before = len(recorder.problems)
                    if phase.per_env:
                        recorder.thread = 0
                        _call(spec, phase.fn, True, recorder, env, s, p, context)
                    else:
                        for agent in range(num_agents):
                            recorder.thread = agent
                            _call(spec, phase.fn, False, recorder, env, s, p, context, agent)
                    recorder.barrier()
                    where = _phase_text(spec, phase.fn, phase.per_env)
                    lines += [f"{q.what}, in {where} ({q.where}){context}: {q.advice}"
                              for q in recorder.problems[before:]]
                    q = recorder.nonfinite
                    if q is not None and recorder.nonfinite_line is None:
                        recorder.nonfinite_line = f"{q.what} in {where} ({q.where}){context}"
    return lines


def _phase_text(spec, fn, per_env) -> str:
    return f"{'env' if per_env else 'agent'} phase '{phase_name(fn)}' of kernel '{spec.name}'"


def _call(spec, fn, per_env, recorder, env, s, p, context, agent=None):
    py = python_of(fn)
    try:
        return py(env, s, p) if agent is None else py(env, agent, s, p)
    except OutOfBounds as exc:
        who = f"agent {exc.thread}" if agent is not None else "thread 0"
        raise KernelFault(f"{who} of replica {env} {exc.what}, in "
                          f"{_phase_text(spec, fn, per_env)} ({exc.where}){context}"
                          f"{_hint(exc.what)}") from None
    except Exception as exc:
        raise ReplayStopped(f"{_phase_text(spec, fn, per_env)} raised "
                            f"{type(exc).__name__} in Python{context}: {exc}") from None


def _hint(what: str) -> str:
    if " obs[" in what or " final_obs[" in what:
        return " (is obs_dim declared smaller than the phases write?)"
    return ""
