"""Adapters from a gpusim env to other RL libraries' env APIs (docs/interop.md).

- `to_gymnasium(env)`: a gymnasium VectorEnv over a one-agent env's replicas;
- `to_sb3(env)`: the same as a Stable-Baselines3 VecEnv;
- `to_pettingzoo(env, replica=0)`: a PettingZoo ParallelEnv over one replica;
- `to_torchrl(env)`: a TorchRL env over all replicas at once (batched).

Each adapter module imports its library, so this package imports them only
when an adapter is asked for: `import gpusim.wrappers` needs none of them.
"""
from __future__ import annotations

import importlib

from gpusim.env import Env
from gpusim.errors import GpusimError

INTEROP = "pip install 'gpusim[interop]'"


def check_is_env(env, adapter: str):
    if not isinstance(env, Env):
        raise GpusimError(f"{adapter} takes a gpusim env (gpusim.make(...)), "
                          f"got {type(env).__name__}")


def _require(adapter: str, library: str, install: str = INTEROP):
    """Import `library` or say, in one line, what to install for `adapter`."""
    try:
        importlib.import_module(library)
    except ImportError:
        raise GpusimError(f"{adapter} needs {library}: {install}") from None


def to_gymnasium(env):
    """A `gymnasium.vector.VectorEnv` over the replicas of one-agent `env` (SAME_STEP autoreset)."""
    _require("to_gymnasium", "gymnasium")
    from gpusim.wrappers.gymnasium import GymnasiumVectorEnv
    return GymnasiumVectorEnv(env)


def to_sb3(env):
    """A Stable-Baselines3 `VecEnv` over one-agent `env` (or a SAME_STEP gymnasium VectorEnv)."""
    _require("to_sb3", "gymnasium")
    _require("to_sb3", "stable_baselines3", "pip install stable-baselines3")
    from gpusim.wrappers.gymnasium import to_sb3 as adapt
    return adapt(env)


def to_pettingzoo(env, replica: int = 0):
    """A `pettingzoo.ParallelEnv` over replica `replica` of `env`."""
    _require("to_pettingzoo", "gymnasium")
    _require("to_pettingzoo", "pettingzoo")
    from gpusim.wrappers.pettingzoo import GpusimParallelEnv
    return GpusimParallelEnv(env, replica=replica)


def to_torchrl(env, **options):
    """A TorchRL env over every replica of `env` (see gpusim.wrappers.torchrl)."""
    _require("to_torchrl", "torchrl")
    from gpusim.wrappers.torchrl import to_torchrl as adapt
    return adapt(env, **options)
