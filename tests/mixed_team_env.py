"""A small env whose two policies observe and act differently, with per-agent done.

Every agent walks a line towards its own goal. Policy `glider` (agents 0 and
1) observes (x, goal) and sets its velocity continuously, a Box in
[-max_speed, max_speed]; policy `stepper` (agent 2) also observes the time
left and steps left, stays or steps right (action_nvec (3,)). Each step an
agent in play gets -0.1 * |x - goal|; one that comes within `goal_radius`
of its goal gets +1 and leaves play (per-agent done: `in_play`), observing
zeros and getting 0 from then on. A replica terminates when nobody is in
play and is truncated after `episode_length` steps.
"""
import numba
import numpy as np
import torch
from dataclasses import dataclass

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.config import EnvConfig, require
from gpusim.env import Env
from gpusim.kernels import agent_phase, env_phase
from gpusim.spaces import Box

STEPPER = 2  # the agent id of policy stepper


@dataclass(frozen=True)
class MixedTeamConfig(EnvConfig):
    episode_length: int = 20   # steps before truncation
    goal_radius: float = 0.1   # an agent this close to its goal leaves play
    max_speed: float = 0.2     # gliders' velocity bound, and the stepper's step

    def check(self):
        require(self.episode_length >= 1, "episode_length", "must be at least 1")
        require(self.goal_radius > 0, "goal_radius", "must be positive")
        require(self.max_speed > 0, "max_speed", "must be positive")


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    playing = s.in_play[env, agent] != 0
    s.obs[env, agent, 0] = s.x[env, agent] if playing else numba.float32(0.0)
    s.obs[env, agent, 1] = s.goal[env, agent] if playing else numba.float32(0.0)
    s.obs[env, agent, 2] = numba.float32(0.0)
    if agent == STEPPER and playing:
        s.obs[env, agent, 2] = numba.float32(1.0 - s.timestep[env] / p.episode_length)


@numba.jit(nopython=True)
def spawn(env, agent, s, p):
    s.x[env, agent] = numba.float32(2.0 * rng.uniform(s.rng_state, env, agent) - 1.0)
    s.goal[env, agent] = numba.float32(2.0 * rng.uniform(s.rng_state, env, agent) - 1.0)
    s.in_play[env, agent] = 1
    if agent == 0:
        s.timestep[env] = 0


@numba.jit(nopython=True)
def move(env, agent, s, p):
    if s.in_play[env, agent] == 0:
        s.reward[env, agent] = numba.float32(0.0)
        return
    if agent == STEPPER:
        delta = numba.float32(s.actions[env, agent, 0] - 1) * p.max_speed
    else:
        delta = s.continuous_actions[env, agent, 0]  # already clipped to +-max_speed
    x = min(max(s.x[env, agent] + delta, numba.float32(-1.5)), numba.float32(1.5))
    s.x[env, agent] = x
    distance = abs(x - s.goal[env, agent])
    reward = numba.float32(-0.1) * distance
    if distance < p.goal_radius:
        reward += numba.float32(1.0)
        s.in_play[env, agent] = 0
    s.reward[env, agent] = reward


@numba.jit(nopython=True)
def finish(env, s, p):
    s.timestep[env] += 1
    playing = 0
    for agent in range(s.in_play.shape[1]):
        playing += s.in_play[env, agent]
    terminated = playing == 0
    s.terminated[env] = terminated
    s.truncated[env] = (not terminated) and s.timestep[env] >= p.episode_length


class MixedTeam(Env):
    name = "mixed_team"
    config_class = MixedTeamConfig
    reset_phases = (agent_phase(spawn), agent_phase(observe))
    step_phases = (agent_phase(move), env_phase(finish), agent_phase(observe))
    agent_active_array = "in_play"

    def setup(self, config):
        self.num_agents = 3
        self.time_limit = config.episode_length
        self.obs_dim = 3
        self.policies = {"glider": (0, 1), "stepper": (STEPPER,)}
        self.policy_obs_dim = {"glider": 2}
        self.policy_actions = {"glider": Box(low=(-config.max_speed,), high=(config.max_speed,)),
                               "stepper": (3,)}

    def array_specs(self):
        return {"x": ArraySpec(torch.float32, state=True),
                "goal": ArraySpec(torch.float32, state=True),
                "in_play": ArraySpec(torch.int32, state=True),
                "timestep": ArraySpec(torch.int32, scope="env", state=True)}

    def params(self):
        c = self.config
        return dict(episode_length=np.float32(c.episode_length),
                    goal_radius=np.float32(c.goal_radius), max_speed=np.float32(c.max_speed))


@dataclass(frozen=True)
class TwoSetsConfig(EnvConfig):
    episode_length: int = 8    # steps before truncation

    def check(self):
        require(self.episode_length >= 1, "episode_length", "must be at least 1")


@numba.jit(nopython=True)
def score_choices(env, agent, s, p):
    """Policy `pair` (agents 0, 1; 2 choices) earns 1 for choice 1; policy `triple`
    (agent 2; 4 x 3 choices) earns a0 / 3 + a1 / 2: the largest choices pay best."""
    if agent < 2:
        s.reward[env, agent] = numba.float32(1.0 if s.actions[env, agent, 0] == 1 else 0.0)
    else:
        s.reward[env, agent] = numba.float32(s.actions[env, agent, 0] / 3.0
                                             + s.actions[env, agent, 1] / 2.0)
    s.obs[env, agent, 0] = numba.float32(agent)
    s.obs[env, agent, 1] = numba.float32(s.timestep[env] + 1) / p.episode_length


@numba.jit(nopython=True)
def start_clock(env, agent, s, p):
    if agent == 0:  # one writer per replica entry (check_env's races check)
        s.timestep[env] = 0
    s.obs[env, agent, 0] = numba.float32(agent)
    s.obs[env, agent, 1] = numba.float32(0.0)


@numba.jit(nopython=True)
def tick(env, s, p):
    s.timestep[env] += 1
    s.terminated[env] = False
    s.truncated[env] = s.timestep[env] >= p.episode_length


class TwoSets(Env):
    """Two discrete policies with different action sets (and component counts)."""
    name = "two_sets"
    config_class = TwoSetsConfig
    reset_phases = (agent_phase(start_clock),)
    step_phases = (agent_phase(score_choices), env_phase(tick))

    def setup(self, config):
        self.num_agents = 3
        self.time_limit = config.episode_length
        self.obs_dim = 2
        self.policies = {"pair": (0, 1), "triple": (2,)}
        self.policy_actions = {"pair": (2,), "triple": (4, 3)}

    def array_specs(self):
        return {"timestep": ArraySpec(torch.int32, scope="env", state=True)}

    def params(self):
        return dict(episode_length=np.float32(self.config.episode_length))
