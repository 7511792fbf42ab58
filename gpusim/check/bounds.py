"""Out-of-bounds indices caught on the CPU, and named: check_env's bounds-checked twin.

On the `cpu` backend an index past the end of a row reads or writes the
neighbouring memory (the next agent's row, another replica's), silently.
check_env runs the env with the kernels of `BoundsCheckedCPU` instead: the
same source compiled with numba's bounds checks (separate compile-cache
entries: a run's kernels stay unchecked). A checked kernel keeps a copy of
its inputs; when numba raises its bare IndexError ("index is out of
bounds"), the launch is replayed in Python from that copy
(gpusim.check.kernel_replay), which finds the access and raises `KernelFault`: one
line naming the array, the index, the agent and replica, the phase, and the
source line.
"""
from __future__ import annotations

import contextlib

import numpy as np

from gpusim.backends.base import Kernel
from gpusim.backends.cpu import CPUBackend
from gpusim.check.kernel_replay import KernelFault, ReplayStopped, recorded_arrays, replay
from gpusim.check.recorder import Recorder
from gpusim.errors import GpusimError


class BoundsCheckedCPU(CPUBackend):
    """The `cpu` backend with bounds-checked kernels that name an out-of-bounds access."""
    boundscheck = True

    def _compile(self, spec):
        return CheckedKernel(super()._compile(spec), spec)


class CheckedKernel(Kernel):
    def __init__(self, inner, spec):
        self.inner, self.spec = inner, spec

    def precompile(self, s, p):
        self.inner.precompile(s, p)

    def __call__(self, num_envs, num_agents, s, p):
        inputs = {name: array.copy() for name, array in zip(s._fields, s)}
        try:
            self.inner(num_envs, num_agents, s, p)
        except (IndexError, SystemError) as exc:  # SystemError: raised in a parallel loop
            cause = exc if isinstance(exc, IndexError) else exc.__cause__
            if not isinstance(cause, IndexError):
                raise
            raise out_of_bounds(self.spec, inputs, s, p, num_agents, num_envs,
                                str(cause)) from None


def out_of_bounds(spec, inputs: dict, s, p, num_agents, num_envs, numba_says) -> GpusimError:
    """The KernelFault of an out-of-bounds launch of `spec`, found by replaying it on
    `inputs` (the arrays before the launch) replica by replica."""
    aliases = _aliases(s)
    recorder = Recorder()
    arrays = recorded_arrays(inputs, recorder, aliases=aliases)
    try:
        replay(spec, arrays, p, num_agents, range(num_envs), recorder)
    except KernelFault as fault:
        return fault
    except ReplayStopped as stopped:
        return KernelFault(f"kernel '{spec.name}' indexed an array out of bounds (numba: "
                           f"{numba_says}); replaying it in Python stopped first: {stopped}")
    return KernelFault(f"kernel '{spec.name}' indexed an array out of bounds (numba: "
                       f"{numba_says}), which its Python replay did not repeat")


def _aliases(s) -> dict:
    """Fields of `s` that view the memory of an earlier field (agent_active), by name."""
    seen, aliases = {}, {}
    for name, array in zip(s._fields, s):
        key = (array.__array_interface__["data"][0], array.shape, array.dtype.str)
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
    return aliases


_TWIN = BoundsCheckedCPU()


def checking_backend(backend):
    """The backend check_env's fresh instances use: the bounds-checked twin of `cpu`."""
    return _TWIN if type(backend) is CPUBackend else backend


def _checks_bounds(env) -> bool:
    """Whether `env`'s kernels raise IndexError on numpy views (the CUDA simulator)."""
    return all(isinstance(view, np.ndarray) for view in env.arrays.views)


def name_faults(env):
    """From now on, an IndexError of `env`'s kernels is replayed and named (a backend
    whose kernels check bounds themselves on numpy arrays: the CUDA simulator)."""
    if _checks_bounds(env) and not isinstance(env._step_kernel, CheckedKernel):
        env._reset_kernel = CheckedKernel(env._reset_kernel, env.reset_kernel_spec())
        env._step_kernel = CheckedKernel(env._step_kernel, env.step_kernel_spec())


@contextlib.contextmanager
def checked_kernels(env):
    """Within the block, `env` launches bounds-checked kernels where its backend is `cpu`,
    and names an index out of bounds where its backend raises one (the CUDA simulator)."""
    saved = env._reset_kernel, env._step_kernel
    twin = checking_backend(env.backend)
    if twin is not env.backend:
        views = env.arrays.views
        env._reset_kernel = twin.compile(env.reset_kernel_spec(), views, env._params)
        env._step_kernel = twin.compile(env.step_kernel_spec(), views, env._params)
    else:
        name_faults(env)
    try:
        yield
    finally:
        env._reset_kernel, env._step_kernel = saved
