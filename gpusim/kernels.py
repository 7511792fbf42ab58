"""Portable kernels: a list of phases compiled for a GPU block or a CPU loop.

A phase is a plain `numba.jit` function. An agent phase is called as
`fn(env, agent, s, p)` once per agent; an env phase as `fn(env, s, p)` once
per replica. `s` is a namedtuple of the env's arrays, `p` a namedtuple of
its scalar parameters. A `Section` runs its phases only in the replicas where
its guard `guard(env, s, p)` is true (used for auto-reset).

Between phases comes a barrier: `cuda.syncthreads()` in the CUDA kernel
(grid = replicas, block = agents), the end of the agent loop in the CPU
kernel (chunks of replicas across cores with prange, each chunk one call of a
function into which the backend inlines every phase). This module writes the source
of both kernels; the backends compile it.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Phase:
    fn: Callable
    per_env: bool = False
    # arrays this agent phase writes from several agents safely in a way check_env's
    # static_races check cannot prove (gpusim.check.static_races); it skips them. Not
    # compared: the compiled code is the same, so is the compiled kernel
    race_free: tuple = field(default=(), compare=False)


def agent_phase(fn, race_free: tuple = ()) -> Phase:
    """`race_free`: names of arrays check_env's static race check leaves alone here."""
    if isinstance(race_free, str):
        race_free = (race_free,)
    return Phase(fn, per_env=False, race_free=tuple(race_free))


def env_phase(fn) -> Phase:
    return Phase(fn, per_env=True)


@dataclass(frozen=True)
class Section:
    phases: tuple
    guard: Callable | None = None


@dataclass(frozen=True)
class KernelSpec:
    """What a kernel does: its sections in order. Hashable, so compiled kernels are cached.

    `cuda_c` optionally names a hand-written CUDA C kernel with the same
    semantics, as "file.cu:function"; the `cuda_c` backend runs that instead
    of the phases. A relative file is looked for in `cuda_c_dir` (the folder
    of the env's module), then in the `gpusim.cuda_kernels` package.
    """
    name: str
    sections: tuple
    cuda_c: str | None = None
    cuda_c_dir: str | None = None
    no_cuda_c: str | None = None  # why it has no CUDA C kernel, where that depends on config

    @classmethod
    def of(cls, name, *parts, cuda_c: str | None = None, cuda_c_dir: str | None = None):
        """Build from phases and sections; bare phases form unguarded sections."""
        sections, run = [], []
        for part in parts:
            if isinstance(part, Section):
                if run:
                    sections.append(Section(tuple(run)))
                    run = []
                sections.append(part)
            else:
                run.append(part if isinstance(part, Phase) else agent_phase(part))
        if run:
            sections.append(Section(tuple(run)))
        return cls(name, tuple(sections), cuda_c, cuda_c_dir)


def _callables(spec: KernelSpec) -> dict:
    names = {}
    for k, section in enumerate(spec.sections):
        if section.guard is not None:
            names[f"guard{k}"] = section.guard
        for j, phase in enumerate(section.phases):
            names[f"phase{k}_{j}"] = phase.fn
    return names


def cuda_source(spec: KernelSpec) -> tuple[str, dict]:
    """Source of `kernel(s, p)` for a grid of replicas x a block of agents."""
    lines = ["def kernel(s, p):",
             "    env = cuda.blockIdx.x",
             "    agent = cuda.threadIdx.x"]
    for k, section in enumerate(spec.sections):
        pad = "    "
        if section.guard is not None:
            # The guard is uniform over the block, so barriers inside it are safe.
            lines.append(f"    run{k} = guard{k}(env, s, p)")
            lines.append("    cuda.syncthreads()")
            lines.append(f"    if run{k}:")
            pad = "        "
        for j, phase in enumerate(section.phases):
            if phase.per_env:
                lines.append(f"{pad}if agent == 0:")
                lines.append(f"{pad}    phase{k}_{j}(env, s, p)")
            else:
                lines.append(f"{pad}phase{k}_{j}(env, agent, s, p)")
            lines.append(f"{pad}cuda.syncthreads()")
    return "\n".join(lines) + "\n", _callables(spec)


CPU_CHUNK = 16  # the most replicas per call of a CPU kernel's per-chunk function


def cpu_chunk(num_envs: int, threads: int) -> int:
    """Replicas per chunk: CPU_CHUNK, or fewer where that would leave a thread fewer than 4
    chunks (16 replicas of 100 agents on 2 threads: 2 per chunk)."""
    return max(1, min(CPU_CHUNK, num_envs // (4 * threads)))


def cpu_source(spec: KernelSpec, wrap: str | None = None) -> tuple[str, dict]:
    """Source of `kernel(num_envs, num_agents, s, p, size)`: chunks of `size` replicas
    (`cpu_chunk`) in prange, each run by `replicas(first, end, num_agents, s, p)` (the
    backend compiles both). With `wrap`, the name of a function, the phases get `wrap(s)`
    and `wrap(p)` as their `s` and `p`."""
    if wrap:
        lines = ["def replicas(first, end, num_agents, arrays, params):",
                 f"    s = {wrap}(arrays)", f"    p = {wrap}(params)"]
    else:
        lines = ["def replicas(first, end, num_agents, s, p):"]
    lines.append("    for env in range(first, end):")
    for k, section in enumerate(spec.sections):
        pad = "        "
        if section.guard is not None:
            lines.append(f"        if guard{k}(env, s, p):")
            pad = "            "
        for j, phase in enumerate(section.phases):
            if phase.per_env:
                lines.append(f"{pad}phase{k}_{j}(env, s, p)")
            else:
                lines.append(f"{pad}for agent in range(num_agents):")
                lines.append(f"{pad}    phase{k}_{j}(env, agent, s, p)")
    if not spec.sections:
        lines.append("        pass")
    lines += ["", "",
              "def kernel(num_envs, num_agents, s, p, size):",
              "    chunks = (num_envs + size - 1) // size",
              "    for chunk in prange(chunks):",
              "        first = chunk * size",
              "        replicas(first, min(first + size, num_envs), num_agents, s, p)"]
    return "\n".join(lines) + "\n", _callables(spec)


def build(source: str, namespace: dict, name: str = "kernel"):
    """Execute generated source in `namespace` and return the function."""
    code = compile(source, f"<gpusim kernel {namespace.get('__kernel_name__', name)}>", "exec")
    exec(code, namespace)
    return namespace[name]


def to_python(fn, swaps=None, _memo=None, rewrite=None):
    """A pure-Python copy of `fn` whose jit-compiled callees are pure Python too.

    The CUDA simulator interprets kernels as Python, and compiled dispatchers
    cannot be called with its array stand-ins, so every dispatcher reachable
    through a function's globals (phases, RNG helpers, device functions) is
    swapped for its `py_func`, recursively. `swaps` maps global objects (by
    identity) to stand-ins, e.g. the `numba.cuda` module to the simulator's;
    `rewrite(value, memo)` may give any other global a stand-in (None: keep it).
    """
    memo = {} if _memo is None else _memo
    swaps = {} if swaps is None else swaps
    py = getattr(fn, "py_func", fn)
    if not isinstance(py, types.FunctionType):
        return fn
    if py in memo:
        return memo[py]
    globs = dict(py.__globals__)
    clone = types.FunctionType(py.__code__, globs, py.__name__, py.__defaults__, py.__closure__)
    memo[py] = clone
    for key, value in py.__globals__.items():
        stand_in = None if rewrite is None else rewrite(value, memo)
        if any(value is original for original in swaps):
            globs[key] = next(v for k, v in swaps.items() if k is value)
        elif stand_in is not None:
            globs[key] = stand_in
        elif is_jit(value):
            globs[key] = to_python(value, swaps, memo, rewrite)
    return clone


def is_jit(value) -> bool:
    """A numba dispatcher (asked of numba's objects only: others, such as pytest's `mark`,
    make an attribute of any name)."""
    return type(value).__module__.startswith("numba") and hasattr(value, "py_func")
