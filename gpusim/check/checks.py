"""The checks of check_env, one function each: it returns its PASS message or raises
Failure with its FAIL message.

attributes, reset, determinism and backends work on the env; seeding, step, finite,
auto_reset and reference only read what gpusim.check.rollout_facts recorded.
"""
from __future__ import annotations

import dataclasses
import numbers

import numpy as np
import torch

from gpusim import masks, spaces
from gpusim.check.compare import (first_index, index_text, lockstep, one_line, tensor_problems,
                                  value_text)
from gpusim.check.bounds import name_faults
from gpusim.check.kernel_replay import KernelFault
from gpusim.check.rollout_facts import SENTINEL

_FRESH_MAX_ENVS = 64  # replicas of the fresh instances built for determinism


class Failure(Exception):
    """Raised by a check to report its failure with a message."""


# ---- on the env ---------------------------------------------------------------------
def attributes(env) -> str:
    problems = []
    for key in ("num_agents", "obs_dim"):
        value = getattr(env, key, None)
        if not is_int_at_least(value, low=1):
            problems.append(f"{key} must be a positive integer, got {value!r}")
    nvec = getattr(env, "action_nvec", None)
    if not isinstance(nvec, (tuple, list)) \
            or not all(is_int_at_least(n, low=1) for n in nvec):
        problems.append(f"action_nvec must be a tuple of positive integers "
                        f"(choices per action component), got {nvec!r}")
    elif not getattr(env, "discrete_width", 0) and not getattr(env, "continuous_dim", 0):
        problems.append("the env declares no actions: set action_nvec (discrete) or "
                        "action_box (continuous)")
    problems += _policy_problems(env)
    names = spaces.name_problem(getattr(env, "agent_names", None),
                                getattr(env, "num_agents", 0))
    if names:
        problems.append(f"agent_names {names}")
    cfg = getattr(env, "config_class", None)
    if cfg is None or not dataclasses.is_dataclass(cfg) or not hasattr(cfg, "load"):
        problems.append("config_class must be a dataclass with a load() classmethod "
                        "(subclass gpusim.config.EnvConfig)")
    if problems:
        raise Failure("; ".join(problems))
    plural = "" if env.num_agents == 1 else "s"
    policies = ", ".join(f"{name} ({_space_text(spec)})"
                         for name, spec in env.policy_specs.items())
    return f"{env.num_agents} agent{plural}, obs_dim {env.obs_dim}, policies {policies}"


def _space_text(spec) -> str:
    actions = (f"Box {list(spec.actions.low)}..{list(spec.actions.high)}" if spec.continuous
               else f"action_nvec {tuple(spec.actions)}")
    return f"obs {spec.obs_dim}, {actions}"


def is_int_at_least(value, low) -> bool:
    """An integer (not a bool) >= low."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= low


def _policy_problems(env) -> list:
    policies = getattr(env, "policies", None)
    if not isinstance(policies, dict) or not policies:
        return [f"policies must be a non-empty dict of name -> agent ids, got {policies!r}"]
    num_agents = getattr(env, "num_agents", None)
    known = isinstance(num_agents, numbers.Integral)
    problems, owner = [], {}
    for name, ids in policies.items():
        if not isinstance(name, str) or not name:
            problems.append(f"policy names must be non-empty strings, got {name!r}")
        try:
            ids = list(ids)
        except TypeError:
            problems.append(f"policies[{name!r}] must be a sequence of agent ids")
            continue
        if not ids:
            problems.append(f"policies[{name!r}] has no agents")
        for i in ids:
            if not known or not is_int_at_least(i, low=0) or i >= num_agents:
                problems.append(f"policies[{name!r}] holds {i!r}, not an agent id "
                                f"0..{num_agents - 1 if isinstance(num_agents, int) else '?'}")
            elif i in owner:
                problems.append(f"agent {i} is in policies {owner[i]!r} and {name!r}")
            else:
                owner[int(i)] = name
    if known:
        missing = [i for i in range(num_agents) if i not in owner]
        if missing:
            more = "..." if len(missing) > 10 else ""
            problems.append(f"agents {missing[:10]}{more} belong to no policy")
    return problems


def reset(env, seed) -> str:
    env.arrays["obs"].fill_(float(SENTINEL))
    obs = env.reset(seed=seed)
    problems = tensor_problems("obs", obs, (env.num_envs, env.num_agents, env.obs_dim),
                               torch.float32, env.device)
    if problems:
        raise Failure("reset() returned " + "; ".join(problems))
    unwritten = first_index(obs == float(SENTINEL))
    if unwritten is not None:
        raise Failure(f"obs{index_text(unwritten)} was not written by the reset phases "
                      f"(obs_dim is {env.obs_dim}: is it declared larger than the phases "
                      "fill? every obs entry must be written)")
    return f"obs {tuple(obs.shape)} float32 on {env.device}, every entry written"


def determinism(env, steps, seed, source=None) -> str:
    n = min(env.num_envs, _FRESH_MAX_ENVS)
    found = lockstep(_fresh(env, seed, n), _fresh(env, seed, n), steps, seed, 0.0, 0.0,
                     ("first", "second"), source)
    if found:
        raise Failure(f"two fresh instances with seed {seed} differ {found}: phases "
                      "must draw only from gpusim.rng on s.rng_state (no np.random, no "
                      "clock), read only arrays they or earlier phases wrote, and never "
                      "an entry another thread writes in the same phase")
    return f"two fresh instances ({n} replicas, seed {seed}) agree bit for bit " \
           f"over {steps} steps"


def backends(env, other_backend, steps, seed, atol, rtol, source=None) -> str:
    n = min(env.num_envs, 2)
    mine = _fresh(env, seed, n)
    other = _fresh(env, seed, n, backend=other_backend)
    name_faults(other)  # the CUDA simulator's IndexError, named
    found = lockstep(mine, other, steps, seed, atol, rtol,
                     (env.backend.name, other.backend.name), source)
    if found:
        raise Failure(f"{env.backend.name} and {other.backend.name} differ {found}")
    return (f"{env.backend.name} and {other.backend.name} agree over {steps} steps "
            f"({n} replicas)")


def _fresh(env, seed, num_envs, backend=None):
    """Another instance of env's class: same config, given seed/backend."""
    try:
        return type(env)(num_envs=num_envs, backend=env.backend if backend is None else backend,
                         seed=seed, config=env.config, check_actions=env.check_actions)
    except Exception as exc:
        raise Failure(f"could not build another instance as {type(env).__name__}(num_envs=..., "
                      f"backend=..., seed=..., config=env.config, check_actions=...): "
                      f"{type(exc).__name__}: {one_line(exc)}") from None


# ---- on the initial states ------------------------------------------------------------
def seeding(samples) -> str:
    if samples.error is not None:
        raise samples.error  # reported as a crash, like any other check's
    a, b = samples.draws[0], samples.draws[1]
    if all(np.array_equal(a[n], b[n], equal_nan=a[n].dtype.kind == "f") for n in a):
        raise Failure(f"reset(seed={samples.seed}) and reset(seed={samples.seed + 1}) give the "
                      "same states and observations: the reset phases must draw from the env's "
                      "RNG streams (gpusim.rng.uniform/randint on s.rng_state)")
    if samples.num_envs < 2:
        return "seeds change the initial state (one replica: replicas not compared)"
    if all(np.all(a[n] == a[n][:1]) for n in a):
        raise Failure(f"all {samples.num_envs} replicas start from the same state: draw "
                      "with the replica's own stream, rng.uniform(s.rng_state, env, agent)")
    return "seeds change the initial state; replicas start from different states"


def _initial_constants(samples) -> dict:
    """name -> (mask of the entries equal in every initial state drawn, their values), for
    the state arrays. Not obs: an observation entry can be the same in 16 draws by chance
    (tag: every runner's k-th neighbour a runner), and the reset check already sees every
    obs entry written by the same reset phases the auto-reset runs."""
    constants = {}
    for name in (n for n in samples.draws[0] if n != "obs"):
        stacked = np.concatenate([draw[name] for draw in samples.draws])
        first = stacked[0]
        same = np.all(stacked == first, axis=0)
        if stacked.dtype.kind == "f":
            same &= ~np.isnan(first)
        constants[name] = (same, first)
    return constants


# ---- on the rollout -------------------------------------------------------------------
def step(rollout) -> str:
    if rollout.error is not None:
        t, exc = rollout.error
        if isinstance(exc, KernelFault):
            raise KernelFault(f"at step {t}, {exc}")
        raise Failure(f"at step {t}, the rollout raised {type(exc).__name__}: {one_line(exc)}")
    if rollout.malformed:
        raise Failure("step() returned " + "; ".join(rollout.malformed))
    for t, record in enumerate(rollout.steps):
        if record.unwritten is not None:
            name, idx = record.unwritten
            extra = (f" (obs_dim is {rollout.obs_dim}: is it declared larger than the "
                     "phases fill?)" if name == "obs" else "")
            raise Failure(f"at step {t}, {name}{index_text(idx)} was not written by the step "
                          f"phases{extra}: every step must write every obs and reward entry "
                          "(zeros included) and both flags of every replica")
        if record.dead_mask is not None:
            raise Failure(f"after step {t}, {record.dead_mask}; {masks.ADVICE}")
    return (f"{rollout.num_steps} steps: output shapes, dtypes and device right, every obs, "
            "reward and flag written")


def _fail_if_stopped(rollout):
    """Raise Failure if the rollout stopped before its end (the step check says why)."""
    if rollout.error is not None:
        raise Failure(f"not run past step {rollout.error[0]}: the rollout raised "
                      "(see the step check)")
    if rollout.malformed:
        raise Failure("not run: step() outputs are malformed (see the step check)")


def finite(rollout, source=None) -> str:
    """`source`: (step, line), where the races check's replay saw the first NaN or Inf
    written, named where it is that step's."""
    for t, record in enumerate(rollout.steps):
        if record.nonfinite is not None:
            name, idx, value = record.nonfinite
            written = f": {source[1]}" if source and source[0] == t else ""
            raise Failure(f"at step {t}, {name}{index_text(idx)} = {value_text(value)}{written}")
    _fail_if_stopped(rollout)
    return f"no NaN or Inf in obs, reward and final_obs over {rollout.num_steps} steps"


def auto_reset(rollout, samples) -> str:
    """`samples`: the initial states, None where the seeding check was skipped."""
    constants = None if samples is None or samples.error is not None \
        else _initial_constants(samples)
    ends = [r.finished for r in rollout.steps if r.finished is not None]
    finished = sum(len(f.replicas) for f in ends)
    if finished and all(kept for f in ends for kept in f.obs_kept):
        # one fresh observation may equal the last one (small discrete observations);
        # all of them never changing means the reset phases do not write obs
        raise Failure(f"in all {finished} replicas that finished, the new observation equals "
                      "its final one: the reset phases must draw a new initial state and "
                      "write obs")
    for t, record in enumerate(rollout.steps):
        found = _flag_problem(t, record) or _restart_problem(t, record.finished, constants)
        if found:
            raise Failure(found)
    _fail_if_stopped(rollout)
    if finished == 0:
        raise Failure(f"no replica finished in {rollout.num_steps} steps, so auto-reset was "
                      "not exercised: pass a larger steps= (or a config with shorter episodes)")
    extra = "" if constants is not None else " (initial-state constants not checked: " \
                                             "seeding was skipped or failed)"
    return f"{finished} episodes ended and restarted from fresh initial states{extra}"


def _flag_problem(t, record):
    if record.wrong_reset_mask is not None:
        e, reset_mask, done = record.wrong_reset_mask
        return f"at step {t}, reset_mask[{e}] is {reset_mask} but terminated | truncated is {done}"
    if record.both_flags is not None:
        return (f"at step {t}, replica {record.both_flags} is both terminated and truncated: "
                "set truncated only where the episode did not terminate (a truncated "
                "replica's final observation is bootstrapped by the trainer)")
    return None


def _restart_problem(t, finished, constants):
    """What is wrong with the replicas that finished at step t, right after their auto-reset."""
    if finished is None:
        return None
    for name, (same, value) in (constants or {}).items():
        for j, e in enumerate(finished.replicas):
            wrong = same & (finished.rows[name][j] != value)
            if wrong.any():
                where = tuple(np.argwhere(wrong)[0])
                return (f"replica {e} finished at step {t}, but after its auto-reset "
                        f"{name}{index_text((e,) + where)} = "
                        f"{value_text(finished.rows[name][(j,) + where])} where every initial "
                        f"state has {value_text(value[where])}: the reset phases must "
                        "re-initialise every state entry (and write every obs entry)")
    return None


def reference(rollout) -> str:
    agreed = 0
    for t, record in enumerate(rollout.steps):
        step = record.reference
        if step is None:  # past reference_steps, or the reference raised
            break
        if step.problem:
            raise Failure(step.problem)
        if step.difference:
            raise Failure(f"at step {t}: {step.difference} (state before the step from "
                          "env.get_state(), so earlier steps agreed)")
        if step.compared:
            agreed = t + 1
    if rollout.reference_error is not None:
        t, exc = rollout.reference_error
        raise Failure(f"at step {t}, the reference raised {type(exc).__name__}: {one_line(exc)}")
    _fail_if_stopped(rollout)
    return (f"agrees with the reference for {agreed} steps x {rollout.reference_envs} replicas "
            f"(atol={rollout.atol:g}, rtol={rollout.rtol:g})")
