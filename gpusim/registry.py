"""Environment registry and `make`: names, or `module:Class` for a user's own env."""
from __future__ import annotations

import importlib

from gpusim.errors import GpusimError

# name -> "module:Class", imported on first use
_REGISTRY = {
    "tag_continuous": "gpusim.envs.tag_continuous.env:TagContinuous",
    "cartpole": "gpusim.envs.cartpole.env:CartPole",
    "tag_gridworld": "gpusim.envs.tag_gridworld.env:TagGridworld",
}


def register(name: str, target: str):
    """Register an env class under `name`; `target` is "package.module:ClassName"."""
    _REGISTRY[name] = target


def env_names() -> tuple:
    return tuple(sorted(_REGISTRY))


def env_class(name: str):
    """The env class for a registered name or a `module:Class` path."""
    target = _REGISTRY.get(name, name)
    if ":" not in target:
        raise GpusimError(f"unknown env '{name}' (registered: {', '.join(env_names())}; "
                          "or give module:Class)")
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GpusimError(f"cannot import env module '{module_name}': {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise GpusimError(f"module '{module_name}' has no env class '{class_name}'")
    return cls


def make(name: str, num_envs: int = 1, backend="auto", seed: int = 0,
         check_actions: bool | None = None, config=None, **env_config):
    """Build env `name` with `num_envs` replicas on `backend`.

    Keyword arguments not named here override keys of the env's config file.
    """
    cls = env_class(name)
    if config is None:
        config = cls.config_class.load(**env_config)
    elif env_config:
        raise GpusimError("give either config= or config keys as keywords, not both")
    return cls(num_envs=num_envs, backend=backend, seed=seed, config=config,
               check_actions=check_actions)
