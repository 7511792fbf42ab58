"""check_env's own arguments, refused at once, before anything runs: a TypeError or
ValueError (`BadActions` for `actions=` an env cannot take) naming the argument, since
bad input is the caller's mistake, not a failing check of the env."""
from __future__ import annotations

import numbers

from gpusim.check.checks import is_int_at_least
from gpusim.check.compare import BadActions, action_problem
from gpusim.check.report import CHECKS
from gpusim.env import Env


def sized(actions) -> bool:
    """Whether `actions` (check_env's `actions=`) has a length: a sequence of steps."""
    return actions is not None and hasattr(actions, "__len__")


def check_arguments(env, reference, steps, seed, reference_steps, reference_envs, atol, rtol,
                    compare_steps, skip, policy=None, actions=None):
    """Raise at once, naming the argument, where check_env's arguments are wrong."""
    if not isinstance(env, Env):
        raise TypeError(f"check_env needs an instance of gpusim.Env, got {type(env).__name__}"
                        + (" (a class: instantiate it first)" if isinstance(env, type) else ""))
    if not hasattr(env, "arrays"):
        raise TypeError(f"{type(env).__name__} instance is not initialised "
                        "(did its __init__ call Env.__init__?)")
    for key, value, low in (("steps", steps, 1), ("reference_steps", reference_steps, 1),
                            ("reference_envs", reference_envs, 1),
                            ("compare_steps", compare_steps, 1), ("seed", seed, 0)):
        if not is_int_at_least(value, low):
            raise ValueError(f"check_env: {key} must be an integer >= {low}, got {value!r}")
    for key, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
            raise ValueError(f"check_env: {key} must be a number >= 0, got {value!r}")
    if reference is not None and not callable(reference):
        raise TypeError("check_env: reference must be a callable (state, actions) -> "
                        "(next_state, obs, reward, terminated, truncated), "
                        f"got {type(reference).__name__}")
    if policy is not None and actions is not None:
        raise ValueError("check_env: pass policy= or actions=, not both")
    if policy is not None and not callable(policy):
        raise TypeError("check_env: policy must be a callable (obs, step) -> actions, "
                        f"got {type(policy).__name__}")
    if actions is not None:
        if not sized(actions) or not hasattr(actions, "__getitem__"):
            raise TypeError("check_env: actions must be a sequence of per-step actions "
                            f"(a list, or a tensor with a leading step axis), got "
                            f"{type(actions).__name__}")
        if len(actions) < steps:
            raise ValueError(f"check_env: actions holds {len(actions)} steps but steps is "
                             f"{steps}; pass steps={len(actions)} or more actions")
        for t in range(steps):
            problem = action_problem(env, actions[t])
            if problem:
                raise BadActions(f"check_env: actions[{t}] gives {problem}")
    if isinstance(skip, str):
        raise TypeError("check_env: skip must be a collection of check names, not a string")
    unknown = set(skip) - set(CHECKS)
    if unknown:
        raise ValueError(f"check_env: unknown check names in skip: {sorted(unknown)} "
                         f"(checks: {', '.join(CHECKS)})")
