"""`Pincer`: `Pursuit` (tests/planted_env.py) counting, per replica, the runners caught by
every chaser at once, a path random actions never take: what only check_env's
`static_races` check sees.

`fix` (a config key) picks how the count is kept; the variants share their kernels:
- RACY: each such runner adds itself to the count in an agent phase (a read-modify-write
  of a per-replica entry that several runners can make in one step);
- GUARDED: each runner flags itself; in the next phase agent 0 alone adds the flags up.
`PincerOptedOut` keeps RACY but declares the count safe (`race_free`), and
`pincer_atomic_specs()` the kernels of an atomic count (`cuda.atomic.add`: GPU only, so
its env is never built here).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch
from numba import cuda

from gpusim.arrays import ArraySpec
from gpusim.kernels import KernelSpec, agent_phase, env_phase
from planted_env import Pursuit, PursuitConfig, catch, distance, move, observe, pay, tally

RACY, GUARDED = range(2)


@dataclass(frozen=True)
class PincerConfig(PursuitConfig):
    fix: int = RACY


@numba.jit(nopython=True)
def pincered(env, agent, s, p):
    """Whether runner `agent`, caught this step, is within reach of every chaser."""
    if s.caught[env, agent] == 0:
        return False
    near = 0
    for chaser in range(p.chasers):
        if distance(s, env, agent, chaser) < p.catch_radius:
            near += 1
    return near == p.chasers


@numba.jit(nopython=True)
def catch_pincers(env, agent, s, p):
    catch(env, agent, s, p)
    s.pincered[env, agent] = 0
    if pincered(env, agent, s, p):
        if p.fix == RACY:
            s.pincers[env] += 1
        else:
            s.pincered[env, agent] = 1


@numba.jit(nopython=True)
def count_pincers(env, agent, s, p):
    if agent == 0 and p.fix == GUARDED:  # one agent adds the flags the last phase wrote
        for runner in range(p.chasers, s.x.shape[1]):
            s.pincers[env] += s.pincered[env, runner]


@numba.jit(nopython=True)
def catch_pincers_atomic(env, agent, s, p):
    catch(env, agent, s, p)
    if pincered(env, agent, s, p):
        cuda.atomic.add(s.pincers, env, 1)


class Pincer(Pursuit):
    name = "pincer"
    config_class = PincerConfig
    step_phases = (agent_phase(move), agent_phase(catch_pincers), agent_phase(count_pincers),
                   env_phase(tally), agent_phase(pay), agent_phase(observe))

    def array_specs(self):
        return {**super().array_specs(), "pincered": ArraySpec(torch.int32),
                "pincers": ArraySpec(torch.int32, scope="env")}

    def params(self):
        return dict(super().params(), fix=np.int32(self.config.fix))


class PincerOptedOut(Pincer):
    """RACY, its count declared safe (it is not: the opt-out is the author's word)."""
    step_phases = (agent_phase(move), agent_phase(catch_pincers, race_free=("pincers",)),
                   agent_phase(count_pincers), env_phase(tally), agent_phase(pay),
                   agent_phase(observe))


def pincer(fix=RACY, cls=Pincer, num_envs=8):
    return cls(num_envs=num_envs, backend="cpu", seed=0, config=PincerConfig(fix=fix))


def pincer_atomic_specs():
    return [KernelSpec.of("pincer_atomic.step", agent_phase(move),
                          agent_phase(catch_pincers_atomic), env_phase(tally),
                          agent_phase(pay), agent_phase(observe))]
