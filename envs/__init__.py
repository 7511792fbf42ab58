"""The environments, installed as `gpusim.envs`, and the table of their names.

Every subpackage here is one env, whole in its folder: `config.py` (its
config dataclass: the one place of its defaults), `env.py` (its arrays,
portable phases and `Env` subclass), `reference.py` (an independent NumPy
oracle for the tests), `README.md` (its exact rules), `config.yaml` (its
training recipe) and any CUDA C kernel of its own. A subpackage's
`__init__` names its env class `ENV`; the table below is found by listing
the subpackages, so adding a built-in env is adding a folder. A subpackage
whose name starts with "_" is code shared by env folders (`_mpe`: the MPE
particle base), not an env.
"""
from __future__ import annotations

import importlib
import pkgutil

from gpusim.env import Env
from gpusim.errors import GpusimError, describe

_registered: dict = {}  # name -> "module:Class", added by register()


def builtin_names() -> tuple:
    """The env folders; a folder whose name starts with "_" is shared code, not an env."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                        if m.ispkg and not m.name.startswith("_")))


def env_names() -> tuple:
    return tuple(sorted(set(builtin_names()) | set(_registered)))


def register(name: str, target: str):
    """Register an env class under `name`; `target` is "package.module:ClassName"."""
    _registered[name] = target


def env_class(name: str):
    """The env class for a name (built-in or registered) or a `module:Class` path."""
    target = _registered.get(name, name)
    if ":" not in target:
        if target not in builtin_names():
            raise GpusimError(f"unknown env '{name}' (registered: {', '.join(env_names())}; "
                              "or give module:Class)")
        return importlib.import_module(f"{__name__}.{target}").ENV
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error while importing it
        raise GpusimError(f"cannot import env module '{module_name}': {describe(exc)}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise GpusimError(f"module '{module_name}' has no env class '{class_name}'")
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise GpusimError(f"'{target}' is not an env class (a subclass of gpusim.Env)")
    cls.check_config_class()
    return cls


def make(name: str, num_envs: int = 1, backend="auto", seed: int = 0,
         check_actions: bool | None = None, config=None, **env_config):
    """Build env `name` with `num_envs` replicas on `backend`.

    Keyword arguments not named here override fields of the env's config
    dataclass (its defaults otherwise).
    """
    cls = env_class(name)
    if config is None:
        config = cls.config_class.load(**env_config)
    elif env_config:
        raise GpusimError("give either config= or config keys as keywords, not both")
    return cls(num_envs=num_envs, backend=backend, seed=seed, config=config,
               check_actions=check_actions)
