"""gpusim: massively parallel multi-agent RL environments as GPU (or CPU) kernels."""
from gpusim.backends import get_backend
from gpusim.check import check_env
from gpusim.env import Env
from gpusim.errors import ArrayError, BackendError, ConfigError, GpusimError
from gpusim.kernels import KernelSpec, Phase, Section, agent_phase, env_phase
from gpusim.registry import env_names, make, register
from gpusim.sampler import ActionSampler

__version__ = "0.1.0"

__all__ = ["make", "register", "env_names", "get_backend", "check_env", "Env", "ActionSampler",
           "KernelSpec", "Phase", "Section", "agent_phase", "env_phase",
           "GpusimError", "ConfigError", "ArrayError", "BackendError"]
