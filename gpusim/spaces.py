"""What a policy observes and how it acts: the per-policy spaces an env declares.

An env's `setup` sets `obs_dim` and either `action_nvec` (multi-discrete: the
number of choices per action component) or `action_box` (a `Box`: one
continuous value per dimension, between its bounds); these hold for every
policy. A policy that differs says so in `policy_obs_dim` (name -> int, at
most `obs_dim`: it reads the first that many entries of the `obs` array) or
`policy_actions` (name -> a `Box`, or a tuple nvec). `Env.policy_specs`
resolves all of it into one `PolicySpec` per policy.

On the device, discrete actions are the int32 array `actions` and continuous
ones the float32 array `continuous_actions`, both (num_envs, num_agents,
widest policy's width): a phase reads the one its agent's policy writes, in
the action set of that policy.
Continuous actions are clipped to the agent's bounds inside the step kernel,
before the env's phases read them.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from gpusim.errors import GpusimError


@dataclass(frozen=True)
class Box:
    """Continuous actions: dimension k lies in [low[k], high[k]] (finite, low < high)."""
    low: tuple
    high: tuple

    def __post_init__(self):
        low, high = _floats(self.low, "low"), _floats(self.high, "high")
        if len(low) != len(high) or not low:
            raise GpusimError(f"Box needs as many low as high bounds, at least one: "
                              f"got {len(low)} and {len(high)}")
        for k, (lo, hi) in enumerate(zip(low, high)):
            if not lo < hi:
                raise GpusimError(f"Box dimension {k}: low {lo} must be below high {hi}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def dim(self) -> int:
        return len(self.low)


def _floats(values, what) -> tuple:
    values = tuple(values) if isinstance(values, (tuple, list)) else (values,)
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
               for v in values):
        raise GpusimError(f"Box {what} bounds must be finite numbers, got {values!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class PolicySpec:
    """One policy of an env: its agents, observation size and action space."""
    agent_ids: tuple
    obs_dim: int
    actions: tuple | Box  # a tuple: multi-discrete nvec

    @property
    def continuous(self) -> bool:
        return isinstance(self.actions, Box)

    @property
    def action_width(self) -> int:
        """Entries per agent in its action array: components, or Box dimensions."""
        return self.actions.dim if self.continuous else len(self.actions)

    @property
    def num_agents(self) -> int:
        return len(self.agent_ids)


def agent_index(ids, device):
    """How to index a policy's agents: a slice when the ids are contiguous (a view, no
    copy), else a tensor of them."""
    ids = sorted(ids)
    if ids == list(range(ids[0], ids[-1] + 1)):
        return slice(ids[0], ids[-1] + 1)
    return torch.tensor(ids, dtype=torch.long, device=device)


def resolve(env) -> dict:
    """name -> PolicySpec from an env's setup attributes; a GpusimError names what is wrong."""
    nvec = tuple(getattr(env, "action_nvec", ()) or ())
    box = getattr(env, "action_box", None)
    if nvec and box is not None:
        raise GpusimError(f"env {env.name}: set action_nvec or action_box, not both "
                          "(per-policy spaces go in policy_actions)")
    obs_dims = dict(getattr(env, "policy_obs_dim", None) or {})
    actions = dict(getattr(env, "policy_actions", None) or {})
    for what, table in (("policy_obs_dim", obs_dims), ("policy_actions", actions)):
        unknown = set(table) - set(env.policies)
        if unknown:
            raise GpusimError(f"env {env.name}: {what} names {sorted(unknown)}, which are not "
                              f"policies ({', '.join(env.policies)})")
    _check_owners(env)
    specs = {}
    for name, ids in env.policies.items():
        space = actions.get(name, box if box is not None else nvec)
        if not isinstance(space, Box):
            space = tuple(int(n) for n in space)
            if not space or min(space) < 1:
                raise GpusimError(f"env {env.name}: policy {name!r} has no action space "
                                  "(set action_nvec, action_box or policy_actions)")
        obs_dim = int(obs_dims.get(name, env.obs_dim))
        if not 1 <= obs_dim <= env.obs_dim:
            raise GpusimError(f"env {env.name}: policy {name!r} observes {obs_dim} entries; "
                              f"it must be 1..obs_dim ({env.obs_dim})")
        specs[name] = PolicySpec(tuple(sorted(int(i) for i in ids)), obs_dim, space)
    return specs


def _check_owners(env):
    """Every agent in exactly one policy: a trainer would otherwise never act for it, or
    act for it twice."""
    if not isinstance(env.policies, dict) or not env.policies:
        raise GpusimError(f"env {env.name}: policies must be a non-empty dict of policy name "
                          f"-> agent ids, got {env.policies!r}")
    owner = {}
    for name, ids in env.policies.items():
        if not len(ids):
            raise GpusimError(f"env {env.name}: policy {name!r} has no agents")
        for i in ids:
            if not isinstance(i, numbers.Integral) or not 0 <= i < env.num_agents:
                raise GpusimError(f"env {env.name}: policy {name!r} holds {i!r}, which is not "
                                  f"an agent id 0..{env.num_agents - 1}")
            if int(i) in owner:
                raise GpusimError(f"env {env.name}: agent {i} is in policies "
                                  f"{owner[int(i)]!r} and {name!r}; each agent needs one policy")
            owner[int(i)] = name
    missing = [i for i in range(env.num_agents) if i not in owner]
    if missing:
        more = ", ..." if len(missing) > 5 else ""
        raise GpusimError(f"env {env.name}: agents {', '.join(map(str, missing[:5]))}{more} "
                          "are in no policy; each agent needs one")


# ---- agent names ---------------------------------------------------------------------
def per_role_names(policies: dict) -> tuple:
    """Agent names numbered from 0 within each policy, in agent-id order: an env whose
    users expect names like "tagger_0", "runner_0" sets `self.agent_names =
    per_role_names(self.policies)` in `setup`.

    {"tagger": (0, 2), "runner": (1, 3)} -> ("tagger_0", "runner_0", "tagger_1", "runner_1")
    """
    named = {i: f"{policy}_{k}" for policy, ids in policies.items()
             for k, i in enumerate(sorted(ids))}
    return tuple(named[i] for i in sorted(named))


def default_names(policies: dict) -> tuple:
    """The names of an env that declares none: policy and global agent id ("runner_3")."""
    named = {i: f"{policy}_{i}" for policy, ids in policies.items() for i in ids}
    return tuple(named[i] for i in sorted(named))


def agent_names(env) -> tuple:
    """The env's agent names, one per agent in agent-id order: what its `setup` declared in
    `agent_names`, else `default_names`. A GpusimError says what is wrong with them."""
    declared = getattr(env, "agent_names", None)
    if declared is None:
        return default_names(env.policies)
    problem = name_problem(declared, env.num_agents)
    if problem:
        raise GpusimError(f"env {env.name}: agent_names {problem}")
    return tuple(declared)


def name_problem(names, num_agents: int) -> str | None:
    """What is wrong with `names` as the names of `num_agents` agents, or None."""
    if not isinstance(names, (tuple, list)):
        return f"must be a tuple of strings, one per agent, got {type(names).__name__}"
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        return f"must be non-empty strings, got {bad[0]!r}"
    if len(names) != num_agents:
        return f"names {len(names)} agents; the env has {num_agents}"
    seen, repeated = set(), []
    for n in names:
        if n in seen:
            repeated.append(n)
        seen.add(n)
    if repeated:
        return f"repeats {repeated[0]!r}; each agent needs its own name"
    return None
