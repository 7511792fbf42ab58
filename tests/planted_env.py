"""`Pursuit`, a small env with per-agent done, and five mistakes an author makes, planted.

Three chasers and two runners on the unit square (moves: stay, +x, -x, +y, -y).
A runner within `catch_radius` of a chaser is caught and leaves play; the
episode terminates when no runner is left and is truncated after
`episode_length` steps. A chaser earns 1 per runner caught in the step and pays
0.01 times the mean distance to the runners still free; a runner pays 1 when
caught and earns 0.01 while free. An agent observes its position and, per other
agent, the offset to it and whether it plays.

`bug` (a config key) plants one mistake; every variant shares the compiled
kernels:
- RACE: a caught runner decrements the replica's count itself, in an agent
  phase (a read-modify-write of one replica entry by several threads);
- WIDE_OBS / NARROW_OBS: obs_dim one larger / one smaller than the phases write;
- NAN_REWARD: a runner's reward takes the square root of a negative number;
- ZERO_BY_ZERO: the chasers' mean distance divides by the runners left, 0/0 on
  the step that ends an episode by termination (random actions rarely get there;
  `chase` does).
and, for the race check's other rules: every agent writing one replica entry
(SHARED_WRITE), reading a neighbour's entry the neighbour writes in the same phase
(READ_WHILE_WRITTEN), a runner writing a chaser's entry (OTHERS_ROW), an entry of
the next replica (OTHER_REPLICA), a global table (GLOBAL_WRITE), and reading past
the last agent (READ_PAST_END).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import torch

from gpusim import Env, rng
from gpusim.arrays import ArraySpec
from gpusim.config import EnvConfig
from gpusim.kernels import agent_phase, env_phase
from gpusim.measures import StepSums

OK, RACE, WIDE_OBS, NARROW_OBS, NAN_REWARD, ZERO_BY_ZERO = range(6)
# more mistakes, one per rule of the race check and one more index out of bounds
SHARED_WRITE, READ_WHILE_WRITTEN, OTHERS_ROW, OTHER_REPLICA, GLOBAL_WRITE, READ_PAST_END = \
    range(6, 12)
CHASERS, RUNNERS = 3, 2
MOVES = ((0.0, 0.0), (1.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (0.0, -1.0))


@dataclass(frozen=True)
class PursuitConfig(EnvConfig):
    episode_length: int = 30
    catch_radius: float = 0.05  # random actions catch runners, and never both in 500 steps
    speed: float = 0.03
    bug: int = OK


@numba.jit(nopython=True)
def spawn(env, agent, s, p):
    s.x[env, agent] = rng.uniform(s.rng_state, env, agent)
    s.y[env, agent] = rng.uniform(s.rng_state, env, agent)
    s.playing[env, agent] = 1


@numba.jit(nopython=True)
def start(env, s, p):
    s.left[env] = p.runners
    s.timestep[env] = 0


@numba.jit(nopython=True)
def move(env, agent, s, p):
    if p.bug == SHARED_WRITE:
        s.leader[env] = agent  # every agent writes the same replica entry
    elif p.bug == READ_WHILE_WRITTEN:  # the neighbour writes its x in this phase too
        s.seen[env, agent] = numba.int32(s.x[env, (agent + 1) % s.x.shape[1]] > 0.5)
    elif p.bug == READ_PAST_END:
        s.seen[env, agent] = numba.int32(s.x[env, agent + 1] > 0.5)
    elif p.bug == GLOBAL_WRITE:
        s.deltas[0] = numba.float32(0.0)
    if s.playing[env, agent] == 0:
        return
    a = s.actions[env, agent, 0]
    s.x[env, agent] = min(max(s.x[env, agent] + s.deltas[2 * a] * p.speed, numba.float32(0.0)),
                          numba.float32(1.0))
    s.y[env, agent] = min(max(s.y[env, agent] + s.deltas[2 * a + 1] * p.speed,
                              numba.float32(0.0)), numba.float32(1.0))


@numba.jit(nopython=True)
def distance(s, env, a, b):
    dx = s.x[env, a] - s.x[env, b]
    dy = s.y[env, a] - s.y[env, b]
    return math.sqrt(dx * dx + dy * dy)


@numba.jit(nopython=True)
def catch(env, agent, s, p):
    """A runner in play is caught when a chaser is within the radius."""
    s.caught[env, agent] = 0
    if agent < p.chasers or s.playing[env, agent] == 0:
        return
    for chaser in range(p.chasers):
        if distance(s, env, agent, chaser) < p.catch_radius:
            s.caught[env, agent] = 1
            s.playing[env, agent] = 0
            if p.bug == RACE:  # counts itself out: several runners at once lose updates
                s.left[env] -= 1
            elif p.bug == OTHERS_ROW:  # credits the chaser in the chaser's own row
                s.caught[env, chaser] = 1
            elif p.bug == OTHER_REPLICA:
                s.caught[(env + 1) % s.caught.shape[0], agent] = 1
            return


@numba.jit(nopython=True)
def tally(env, s, p):
    s.timestep[env] += 1
    if p.bug != RACE:
        for agent in range(p.chasers, s.x.shape[1]):
            s.left[env] -= s.caught[env, agent]
    terminated = s.left[env] == 0
    s.terminated[env] = terminated
    s.truncated[env] = (not terminated) and s.timestep[env] >= p.episode_length


@numba.jit(nopython=True)
def pay(env, agent, s, p):
    if agent >= p.chasers:
        if s.caught[env, agent] == 1:
            s.reward[env, agent] = numba.float32(-1.0)
        elif s.playing[env, agent] == 1:
            s.reward[env, agent] = numba.float32(0.01)
            if p.bug == NAN_REWARD:  # the square root of a negative number
                s.reward[env, agent] += numba.float32(math.sqrt(s.x[env, agent] - 2.0))
        else:
            s.reward[env, agent] = numba.float32(0.0)
        return
    caught, total = 0, numba.float32(0.0)
    for runner in range(p.chasers, s.x.shape[1]):
        caught += s.caught[env, runner]
        if s.playing[env, runner] == 1:
            total += distance(s, env, agent, runner)
    left = s.left[env]
    if p.bug == ZERO_BY_ZERO or left > 0:  # the fix: no mean over no runner
        spread = total / numba.float32(left)
    else:
        spread = numba.float32(0.0)
    s.reward[env, agent] = numba.float32(caught) - numba.float32(0.01) * spread


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    s.obs[env, agent, 0] = s.x[env, agent]
    s.obs[env, agent, 1] = s.y[env, agent]
    k = 2
    for other in range(s.x.shape[1]):
        if other != agent:
            s.obs[env, agent, k] = s.x[env, other] - s.x[env, agent]
            s.obs[env, agent, k + 1] = s.y[env, other] - s.y[env, agent]
            s.obs[env, agent, k + 2] = numba.float32(s.playing[env, other])
            k += 3


class Pursuit(Env):
    name = "pursuit"
    config_class = PursuitConfig
    reset_phases = (agent_phase(spawn), env_phase(start), agent_phase(observe))
    step_phases = (agent_phase(move), agent_phase(catch), env_phase(tally), agent_phase(pay),
                   agent_phase(observe))
    observe_phases = (agent_phase(observe),)

    def episode_measures(self):
        # `caught` is written by every step and left alone by the reset phases
        return StepSums(self, runners_caught=lambda env: env.arrays["caught"].sum(1))

    def setup(self, config):
        self.num_agents = CHASERS + RUNNERS
        self.obs_dim = 2 + 3 * (self.num_agents - 1) + {WIDE_OBS: 1, NARROW_OBS: -1}.get(
            config.bug, 0)
        self.action_nvec = (len(MOVES),)
        self.policies = {"chaser": tuple(range(CHASERS)),
                         "runner": tuple(range(CHASERS, CHASERS + RUNNERS))}
        self.agent_active_array = "playing"

    def array_specs(self):
        f32, i32 = torch.float32, torch.int32
        return {"x": ArraySpec(f32, state=True), "y": ArraySpec(f32, state=True),
                "playing": ArraySpec(i32, state=True),
                "caught": ArraySpec(i32),
                "leader": ArraySpec(i32, scope="env"),  # written by planted mistakes only
                "seen": ArraySpec(i32),
                "deltas": ArraySpec(f32, (2 * len(MOVES),), scope="global"),
                "left": ArraySpec(i32, scope="env", state=True),
                "timestep": ArraySpec(i32, scope="env", state=True)}

    def initial_values(self):
        return {"deltas": np.array(MOVES, dtype=np.float32).reshape(-1)}

    def params(self):
        c = self.config
        return dict(chasers=np.int32(CHASERS), runners=np.int32(RUNNERS),
                    episode_length=np.int32(c.episode_length),
                    catch_radius=np.float32(c.catch_radius), speed=np.float32(c.speed),
                    bug=np.int32(c.bug))


def pursuit(bug=OK, num_envs=8, **config):
    return Pursuit(num_envs=num_envs, backend="cpu", seed=0,
                   config=PursuitConfig(bug=bug, **config))


def chase(obs, step):
    """A scripted policy: each chaser steps toward the nearest runner in play (runners
    stand still), so every episode ends by termination within a few dozen steps."""
    actions = torch.zeros(obs.shape[0], obs.shape[1], 1, dtype=torch.int32)
    for chaser in range(CHASERS):
        best = None
        for k, other in enumerate(o for o in range(CHASERS + RUNNERS) if o != chaser):
            if other < CHASERS:
                continue
            dx, dy, playing = (obs[:, chaser, 2 + 3 * k + j] for j in range(3))
            far = torch.where(playing > 0, dx.abs() + dy.abs(), torch.full_like(dx, 9.0))
            if best is None:
                best, bx, by = far, dx, dy
            else:
                closer = far < best
                best, bx, by = (torch.where(closer, far, best), torch.where(closer, dx, bx),
                                torch.where(closer, dy, by))
        along_x = bx.abs() >= by.abs()
        move = torch.where(along_x, torch.where(bx > 0, 1, 2), torch.where(by > 0, 3, 4))
        actions[:, chaser, 0] = move.to(torch.int32)
    return actions
