"""Values as check_env reports them, and comparisons that find the first difference.

`mismatch` compares two arrays entry by entry; `reference_difference` one step of
an env with its reference's; `lockstep` steps two envs with the same random actions
and compares everything they return.
"""
from __future__ import annotations

import numpy as np
import torch

from gpusim.errors import ArrayError


def as_numpy(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def first_index(mask: torch.Tensor):
    """The index (a tuple) of the first true entry of a bool tensor, or None."""
    return tuple(mask.nonzero()[0].tolist()) if bool(mask.any()) else None


def index_text(idx) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def value_text(value) -> str:
    """A numpy or torch scalar as plain text: 9 significant digits for floats."""
    value = value.item() if hasattr(value, "item") else value
    return f"{value:.9g}" if isinstance(value, float) else str(value)


def one_line(exc) -> str:
    """An exception's message on one line of at most 300 characters."""
    text = " ".join(str(exc).split())
    return text if len(text) < 300 else text[:297] + "..."


def tensor_problems(name, tensor, shape, dtype, device) -> list:
    """How `tensor` differs from a torch tensor of that shape, dtype and device."""
    if not isinstance(tensor, torch.Tensor):
        return [f"{name} is a {type(tensor).__name__}, not a torch tensor"]
    problems = []
    if tuple(tensor.shape) != tuple(shape):
        problems.append(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    if tensor.dtype != dtype:
        problems.append(f"{name} has dtype {tensor.dtype}, expected {dtype}")
    if tensor.device != device:
        problems.append(f"{name} is on {tensor.device}, expected env.device {device}")
    return problems


def mismatch(name, got, want, atol=0.0, rtol=0.0, rows=None, labels=("got", "want")):
    """The first differing entry of `got` and `want` as text, or None.

    Floats within atol + rtol*|want| (NaN equals NaN), others exactly;
    `rows` (a bool mask over the first axis) limits the comparison.
    """
    got, want = as_numpy(got), as_numpy(want)
    if got.shape != want.shape:
        return f"{name} has shape {got.shape}, expected {want.shape}"
    if got.dtype.kind == "f" or want.dtype.kind == "f":
        g, w = got.astype(np.float64), want.astype(np.float64)
        close = np.isclose(g, w, atol=atol, rtol=rtol, equal_nan=True) if (atol or rtol) \
            else ((g == w) | (np.isnan(g) & np.isnan(w)))
    else:
        close = got == want
    if rows is not None:
        close = close | ~np.asarray(rows, dtype=bool).reshape((-1,) + (1,) * (close.ndim - 1))
    if close.all():
        return None
    idx = tuple(np.argwhere(~close)[0])
    return (f"{name}{index_text(idx)}: {labels[0]} {value_text(got[idx])}, "
            f"{labels[1]} {value_text(want[idx])}"
            + (f" (tolerance atol={atol:g}, rtol={rtol:g})" if (atol or rtol) else ""))


def reference_problem(answer, state_names) -> str | None:
    """What keeps a reference's return value from check_env's protocol, or None."""
    if not isinstance(answer, (tuple, list)) or len(answer) != 5 \
            or not isinstance(answer[0], dict):
        return ("the reference must return (next_state dict, obs, reward, terminated, "
                "truncated)")
    unknown = set(answer[0]) - set(state_names)
    if unknown:
        return (f"the reference's next_state has keys {sorted(unknown)} that are not state "
                f"arrays (state arrays: {', '.join(sorted(state_names))})")
    return None


def reference_difference(answer, got, got_state, scopes, atol, rtol) -> str | None:
    """The first entry where one env step disagrees with the reference's `answer`, as
    text, or None. `got`: the env's obs, reward, terminated, truncated and
    info["final_obs"] by those names; `got_state`: its state after the step; both of
    the replicas the reference was given. `scopes`: state name -> scope."""
    next_state, obs, reward, terminated, truncated = answer
    terminated = np.asarray(terminated, dtype=bool)
    truncated = np.asarray(truncated, dtype=bool)
    labels = ("env", "reference")
    found = (mismatch("terminated", got["terminated"], terminated, labels=labels)
             or mismatch("truncated", got["truncated"], truncated, labels=labels)
             or mismatch("reward", got["reward"], reward, atol, rtol, labels=labels))
    if found:
        return found
    # the flags agree; a finished replica's obs is its final one (the env has already
    # reset it, so its next_state is not compared)
    live = ~(terminated | truncated)
    found = (mismatch("obs", got["obs"], obs, atol, rtol, rows=live, labels=labels)
             or mismatch('info["final_obs"]', got['info["final_obs"]'], obs, atol, rtol,
                         rows=~live, labels=labels))
    if found:
        return found
    for name, value in next_state.items():
        rows = None if scopes[name] == "global" else live
        found = mismatch(name, got_state[name], value, atol, rtol, rows=rows, labels=labels)
        if found:
            return found
    return None


def random_actions(generator, env):
    """Random actions in the form `env.step` takes: discrete ones uniform over each
    component (int32), continuous ones uniform over a range 10% wider than the bounds
    on each side (so clipping happens); a dict per policy when policies act differently."""
    if env.mixed_actions:
        return {name: _policy_actions(generator, env.num_envs, spec)
                for name, spec in env.policy_specs.items()}
    if not env.continuous_dim:  # one nvec for every agent
        cols = [torch.randint(0, int(k), (env.num_envs, env.num_agents), generator=generator)
                for k in env.action_nvec]
        return torch.stack(cols, dim=-1).to(torch.int32)
    actions = torch.zeros((env.num_envs, env.num_agents, env.continuous_dim))
    for spec in env.policy_specs.values():  # bounds differ per policy
        actions[:, list(spec.agent_ids), :spec.action_width] = \
            _policy_actions(generator, env.num_envs, spec)
    return actions


def _policy_actions(generator, num_envs, spec) -> torch.Tensor:
    shape = (num_envs, spec.num_agents)
    if spec.continuous:
        low, high = (torch.tensor(b, dtype=torch.float32) for b in (spec.actions.low,
                                                                    spec.actions.high))
        margin = 0.1 * (high - low)
        u = torch.rand(shape + (spec.action_width,), generator=generator)
        return (low - margin) + u * (high - low + 2 * margin)
    cols = [torch.randint(0, int(k), shape, generator=generator) for k in spec.actions]
    return torch.stack(cols, dim=-1).to(torch.int32)


class ActionSource:
    """Where check_env's rollouts take their actions, the same in every rollout:
    `random_actions` from a generator seeded with `seed`; or `policy(obs, step)`, a
    callable given the observation and the step index; or `actions[step]`, a sequence
    of per-step actions. Actions are in any form `env.step` takes."""

    def __init__(self, seed: int, policy=None, actions=None):
        self.seed, self.policy, self.actions = seed, policy, actions

    @property
    def kind(self) -> str:
        return "the policy" if self.policy is not None else \
            "the given actions" if self.actions is not None else "random actions"

    def fresh(self):
        """`draw(env, obs, step)` for one rollout."""
        generator = torch.Generator().manual_seed(self.seed)

        def draw(env, obs, step):
            if self.policy is not None:
                actions = self.policy(obs, step)
                problem = action_problem(env, actions)
                if problem:
                    raise BadActions(f"check_env: policy(obs, {step}) returned {problem}")
                return actions
            if self.actions is not None:
                return self.actions[step]
            return random_actions(generator, env)
        return draw


class BadActions(ArrayError):
    """check_env's policy= or actions= gave actions env.step cannot take: raised by
    check_env, not reported as a check's failure."""


def action_problem(env, actions) -> str | None:
    """What is wrong with one step's `actions` for `env` (shape, or a NaN or Inf), or None."""
    if isinstance(actions, dict):
        if set(actions) != set(env.policy_specs):
            return (f"a dict of {', '.join(map(repr, actions))}; expected one entry per "
                    f"policy ({', '.join(map(repr, env.policy_specs))})")
        for name, value in actions.items():
            spec = env.policy_specs[name]
            found = _tensor_problem(f"actions[{name!r}]", value,
                                    (env.num_envs, spec.num_agents, spec.action_width),
                                    f"(num_envs, agents of {name!r}, action width)")
            if found:
                return found
        return None
    if getattr(env, "mixed_actions", False):
        return (f"a {type(actions).__name__}; expected a dict policy name -> actions (the "
                "policies act in different action spaces)")
    width = env.continuous_dim or len(env.action_nvec)
    return _tensor_problem("actions", actions, (env.num_envs, env.num_agents, width),
                           "(num_envs, num_agents, action width)")


def _tensor_problem(what, value, shape, axes) -> str | None:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        return f"{what} as a {type(value).__name__}; expected a tensor or array of shape {shape}"
    if tuple(value.shape) != shape:
        return f"{what} of shape {tuple(value.shape)}; expected {axes} = {shape}"
    if value.dtype.is_floating_point and not value.is_meta:
        bad = ~torch.isfinite(value)
        if bool(bad.any()):
            at = tuple(int(i) for i in bad.nonzero()[0])
            return (f"{what}[{', '.join(map(str, at))}] = {float(value[at])}; expected finite "
                    "values")
    return None


def actions_to(actions, device):
    """`actions` (a tensor or a dict of them) on `device`."""
    if isinstance(actions, dict):
        return {name: _to(a, device) for name, a in actions.items()}
    return _to(actions, device)


def _to(value, device):
    return value.to(device) if isinstance(value, torch.Tensor) else value  # env.step checks


def replica_rows(actions, n: int):
    """The first `n` replicas of `actions` as numpy (a dict of arrays when per policy)."""
    if isinstance(actions, dict):
        return {name: as_numpy(a)[:n] for name, a in actions.items()}
    return as_numpy(actions)[:n]


def lockstep(a, b, steps, seed, atol, rtol, labels, source=None):
    """Step two envs with the same actions (`source`, an ActionSource; by default random
    from `seed`); the first difference as text, or None."""
    draw = (source or ActionSource(seed)).fresh()
    obs = a.reset(seed=seed)
    found = mismatch("obs", obs, b.reset(seed=seed), atol, rtol, labels=labels)
    if found:
        return f"after reset: {found}"
    for t in range(steps):
        actions = draw(a, obs, t)
        out_a = a.step(actions_to(actions, a.device))
        obs = out_a[0]
        out_b = b.step(actions_to(actions, b.device))
        done = as_numpy(out_a[2] | out_a[3])
        for k, name in enumerate(("obs", "reward", "terminated", "truncated")):
            found = mismatch(name, out_a[k], out_b[k], atol, rtol, labels=labels)
            if found:
                return f"at step {t}: {found}"
        found = mismatch('info["final_obs"]', out_a[4]["final_obs"], out_b[4]["final_obs"],
                         atol, rtol, rows=done, labels=labels)
        if found:
            return f"at step {t}: {found}"
    state_a, state_b = a.get_state(include_rng=True), b.get_state(include_rng=True)
    for name in state_a:
        exact = name == "rng_state"  # the streams must agree to the bit on any backend
        found = mismatch(name, state_a[name], state_b[name], 0.0 if exact else atol,
                         0.0 if exact else rtol, labels=labels)
        if found:
            return f"in the state after {steps} steps: {found}"
    return None
