"""What check_env's checks read: one random rollout of the env, and initial states.

The recorders pass no verdict: they keep compact facts per step (the first unwritten
or non-finite entry, the first replica with wrong flags, the rows of replicas right
after their auto-reset, the first entry beyond tolerance from the reference), never
whole (steps, num_envs, ...) arrays, and an exception with the step it stopped them at.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from gpusim import masks
from gpusim.check.compare import (ActionSource, BadActions, actions_to, as_numpy, first_index,
                                  replica_rows, reference_difference,
                                  reference_problem, tensor_problems)

# Written into obs and reward before reset/step: an entry still holding it was not written.
SENTINEL = np.float32(-2.4691357e38)
FLAG_SENTINEL = 2  # byte value written into the bool flags before a step
_INITIAL_REPLICAS = 16  # initial states looked at to tell constant entries from random ones


@dataclass
class InitialStates:
    """Initial states drawn by reset(seed=seed + k), k = 0, 1, ...: per seed a dict of
    "obs" and the replica-indexed state arrays of the first (at most 16) replicas."""
    seed: int
    num_envs: int
    draws: list = field(default_factory=list)
    error: Exception | None = None  # what a reset raised, if one did


@dataclass
class Finished:
    """The replicas that finished at one step, read right after their auto-reset."""
    replicas: list
    obs_kept: np.ndarray  # per replica: its new observation equals its final one
    rows: dict  # "obs" and each replica-indexed state array, at `replicas`


@dataclass
class ReferenceStep:
    """The first `reference_envs` replicas at one step, against the reference."""
    problem: str | None  # what keeps the reference's return value from the protocol
    compared: bool = False  # the env's step completed and was compared
    difference: str | None = None  # the first entry beyond tolerance, as text


@dataclass
class StepRecord:
    """What one step showed; None where it showed nothing of the kind."""
    unwritten: tuple | None = None  # (name, index): first entry still holding its sentinel
    nonfinite: tuple | None = None  # (name, index, value): first NaN or Inf
    wrong_reset_mask: tuple | None = None  # (replica, reset_mask, done): first that differ
    both_flags: int | None = None  # first replica both terminated and truncated
    finished: Finished | None = None
    reference: ReferenceStep | None = None
    dead_mask: str | None = None  # the action mask leaves an agent no legal choice: how
    terminated: int = 0  # replicas that ended by termination, by truncation
    truncated: int = 0
    agents_left: int = 0  # agents that left play (per-agent done) in this step


@dataclass
class Rollout:
    """One rollout: a StepRecord per step begun, and what stopped it early, if anything."""
    num_steps: int  # steps asked for
    obs_dim: int
    reference_envs: int  # replicas fed to the reference
    atol: float  # the reference's tolerance: atol + rtol * |reference|
    rtol: float
    state_scopes: dict  # state array name -> scope
    actions: str = "random actions"  # what drove it (ActionSource.kind)
    per_agent_done: bool = False  # whether the env declares agent_active_array
    steps: list = field(default_factory=list)
    malformed: list = field(default_factory=list)  # what is wrong with step()'s first outputs
    error: tuple | None = None  # (step, exception) that stopped the rollout
    reference_error: tuple | None = None  # (step, exception); the reference is not called again


def record_initial_states(env, seed) -> InitialStates:
    """reset(seed=seed + k) for enough k to see 16 initial states (at least 4 seeds)."""
    per_reset = min(env.num_envs, _INITIAL_REPLICAS)
    resets = max(4, math.ceil(_INITIAL_REPLICAS / per_reset))
    samples = InitialStates(seed, env.num_envs)
    try:
        for k in range(resets):
            # as in the rollout, so an entry the reset phases never write reads alike in both
            env.arrays["obs"].fill_(float(SENTINEL))
            obs = env.reset(seed=seed + k)
            samples.draws.append(_replica_rows(env, obs, slice(0, per_reset)))
    except Exception as exc:
        samples.error = exc
    return samples


def record_rollout(env, steps, seed, reference=None, *, reference_steps=0, reference_envs=0,
                   atol=0.0, rtol=0.0, source=None, watch=None) -> Rollout:
    """env.reset(seed=seed), then `steps` steps with actions from `source` (an
    ActionSource; by default random from a torch generator seeded with `seed`); the first
    `reference_steps` are also asked of `reference`, from the state before the step.
    `watch` (gpusim.check.races.RaceWatch) sees the arrays before the reset and each
    step. Stops at the first exception, or after a first step whose outputs are
    malformed."""
    n = min(reference_envs, env.num_envs)
    source = source or ActionSource(seed)
    rollout = Rollout(steps, env.obs_dim, n, atol, rtol,
                      {"rng_state": "agent",
                       **{name: env.arrays.specs[name].scope for name in env.arrays.state_names()}},
                      source.kind, env.agent_active_array is not None)
    draw = source.fresh()
    t = 0  # the step an exception is reported at
    try:
        if watch is not None:
            watch.before_reset(seed)
        obs = env.reset(seed=seed)
        for t in range(steps):
            record = StepRecord()
            rollout.steps.append(record)
            actions = actions_to(draw(env, obs, t), env.device)
            if reference is not None and t < reference_steps and rollout.reference_error is None:
                state = _state_rows(env, slice(0, n), rng=True)
                replica_actions = replica_rows(actions, n)
                try:
                    answer = reference(state, replica_actions)
                except Exception as exc:
                    rollout.reference_error = (t, exc)
                else:
                    record.reference = ReferenceStep(reference_problem(answer, state))
            active = env.agent_active()
            active = None if active is None else active.clone()
            if watch is not None:
                watch.before_step(t)
            out = _step(env, actions)
            if t == 0:
                rollout.malformed = _output_problems(env, out)
                if rollout.malformed:
                    break
            _record_step(env, out, record, active)
            if watch is not None:
                watch.after_step(t, out, active)
            obs = out[0]
            if record.reference is not None and record.reference.problem is None:
                _compare_with_reference(env, out, answer, rollout, record.reference)
    except BadActions:
        raise  # check_env's argument, not the env, is wrong
    except Exception as exc:
        rollout.error = (t, exc)
    return rollout


def _step(env, actions):
    """env.step with sentinels in obs, reward and the flags, to show what it leaves alone."""
    arrays = env.arrays
    arrays["obs"].fill_(float(SENTINEL))
    arrays["reward"].fill_(float(SENTINEL))
    for flag in ("terminated", "truncated"):
        arrays[flag].view(torch.uint8).fill_(FLAG_SENTINEL)
    return env.step(actions)


def _output_problems(env, out) -> list:
    if not isinstance(out, tuple) or len(out) != 5:
        return ["not a 5-tuple (obs, reward, terminated, truncated, info)"]
    obs, reward, terminated, truncated, info = out
    E, A, device = env.num_envs, env.num_agents, env.device
    problems = tensor_problems("obs", obs, (E, A, env.obs_dim), torch.float32, device)
    problems += tensor_problems("reward", reward, (E, A), torch.float32, device)
    problems += tensor_problems("terminated", terminated, (E,), torch.bool, device)
    problems += tensor_problems("truncated", truncated, (E,), torch.bool, device)
    if not isinstance(info, dict) or not {"final_obs", "reset_mask"} <= set(info):
        problems.append("info must be a dict with 'final_obs' and 'reset_mask'")
    else:
        problems += tensor_problems('info["final_obs"]', info["final_obs"],
                                    (E, A, env.obs_dim), torch.float32, device)
        problems += tensor_problems('info["reset_mask"]', info["reset_mask"], (E,),
                                    torch.bool, device)
    return problems


def _record_step(env, out, record, active):
    """The facts of one step's outputs (`active`: agent_active() before it, or None);
    turns the flags' sentinel bytes back into bools."""
    obs, reward, terminated, truncated, info = out
    # every entry written when the minimum is above the sentinel (NaN: looked at whole)
    if not (float(obs.min()) > SENTINEL and float(reward.min()) > SENTINEL
            and int(terminated.view(torch.uint8).max()) < FLAG_SENTINEL
            and int(truncated.view(torch.uint8).max()) < FLAG_SENTINEL):
        record.unwritten = _first_true({
            "obs": obs == float(SENTINEL),
            "reward": reward == float(SENTINEL),
            "terminated": terminated.view(torch.uint8) == FLAG_SENTINEL,
            "truncated": truncated.view(torch.uint8) == FLAG_SENTINEL})
    for flag in (terminated, truncated):  # sentinel bytes back to plain bools
        flag.copy_(flag.view(torch.uint8) != 0)
    done = terminated | truncated
    record.terminated, record.truncated = int(terminated.sum()), int(truncated.sum())
    if active is not None:  # in finished replicas, who was in play when they ended
        now = torch.where(done[:, None], env.final_active(), env.agent_active())
        record.agents_left = int((active & ~now).sum())
    record.nonfinite = _first_nonfinite(
        {"obs": obs, "reward": reward, 'info["final_obs"]': info["final_obs"]}, done)
    wrong = first_index(info["reset_mask"] != done)
    if wrong is not None:
        record.wrong_reset_mask = (wrong[0], bool(info["reset_mask"][wrong]), bool(done[wrong]))
    both = first_index(terminated & truncated)
    record.both_flags = None if both is None else both[0]
    if bool(done.any()):
        record.finished = _finished(env, obs, info["final_obs"], done)
    record.dead_mask = masks.problem(env)  # the mask the next step's actions obey


def _compare_with_reference(env, out, answer, rollout, reference_step):
    """The env's step against the reference's answer, for the replicas it was given."""
    obs, reward, terminated, truncated, info = out
    rows = slice(0, rollout.reference_envs)
    got = {"obs": obs[rows], "reward": reward[rows], "terminated": terminated[rows],
           "truncated": truncated[rows], 'info["final_obs"]': info["final_obs"][rows]}
    reference_step.difference = reference_difference(
        answer, got, _state_rows(env, rows, rng=True), rollout.state_scopes, rollout.atol,
        rollout.rtol)
    reference_step.compared = True


def _first_nonfinite(values: dict, done):
    """(name, index, value) of the first NaN or Inf in `values`, or None; in
    info["final_obs"] only finished replicas count."""
    if all(bool(torch.isfinite(value.sum(dtype=torch.float64))) for value in values.values()):
        return None  # a finite sum: every entry finite (an overflow is looked at whole)
    nonfinite = {name: ~torch.isfinite(value) for name, value in values.items()}
    nonfinite['info["final_obs"]'] &= done.view(-1, 1, 1)
    found = _first_true(nonfinite)
    if found is None:
        return None
    name, idx = found
    return name, idx, values[name][idx].item()


def _finished(env, obs, final_obs, done) -> Finished:
    index = done.nonzero().flatten()
    kept = (final_obs[index] == obs[index]).flatten(1).all(1)
    return Finished(index.tolist(), as_numpy(kept), _replica_rows(env, obs, index))


def _first_true(masks: dict):
    """(name, index) of the first true entry in the first of `masks` that has one, or None."""
    for name, mask in masks.items():
        idx = first_index(mask)
        if idx is not None:
            return name, idx
    return None


def _state_rows(env, rows, with_global=True, rng=False) -> dict:
    """The state arrays as numpy copies: replica-indexed ones at `rows`, global ones whole;
    with `rng`, the RNG streams' states (`rng_state`) of those rows too."""
    out = {"rng_state": as_numpy(env.arrays["rng_state"][rows]).copy()} if rng else {}
    for name in env.arrays.state_names():
        tensor = env.arrays[name]
        if env.arrays.specs[name].scope == "global":
            if with_global:
                out[name] = as_numpy(tensor).copy()
        else:
            out[name] = as_numpy(tensor[rows]).copy()
    return out


def _replica_rows(env, obs, rows) -> dict:
    """Numpy copies of obs and the replica-indexed state arrays at `rows`, by name."""
    return {"obs": as_numpy(obs[rows]).copy(), **_state_rows(env, rows, with_global=False)}
