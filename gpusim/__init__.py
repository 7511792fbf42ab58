"""gpusim: massively parallel multi-agent RL environments as GPU (or CPU) kernels.

This namespace is the public facade: it re-exports the runtime's API, and
`make`, `register` and `env_names` from the env table in `gpusim.envs`, and
`load_policies` (a run's trained policies) from `gpusim.training.trained.policies`, both
imported on first use, since they are built on the runtime.
"""
# First, before torch or numba load their OpenMP runtimes, which read it once:
# idle pool threads sleep rather than spin (unless the user chose; gpusim.cpu_threads).
from gpusim import cpu_threads as _cpu_threads

_cpu_threads.early_defaults()

from gpusim.backends import get_backend
from gpusim.check import check_env
from gpusim.env import Env
from gpusim.errors import ArrayError, BackendError, ConfigError, GpusimError
from gpusim.kernels import KernelSpec, Phase, Section, agent_phase, env_phase
from gpusim.sampler import ActionSampler

from gpusim.version import __version__

_FROM_ENVS = ("make", "register", "env_names")

__all__ = ["make", "register", "env_names", "load_policies", "get_backend", "check_env", "Env",
           "ActionSampler", "KernelSpec", "Phase", "Section", "agent_phase", "env_phase",
           "GpusimError", "ConfigError", "ArrayError", "BackendError"]


def __getattr__(name):
    if name in _FROM_ENVS:
        from gpusim import envs
        return getattr(envs, name)
    if name == "load_policies":
        from gpusim.training.trained.policies import load_policies
        return load_policies
    raise AttributeError(f"module 'gpusim' has no attribute {name!r}")
