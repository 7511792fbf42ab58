"""mountain_car: gymnasium's MountainCar-v0 as portable phases, one agent per replica.

The state is kept in float64, as gymnasium keeps it (its reset draws a
float64 position and its step computes and stores float64), and every step
is gymnasium's, each expression in gymnasium's operation order; termination
and the left-wall rule are decided on those float64 values. Only the
observation is rounded to float32, as gymnasium's is.
"""
import math

import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.env import Env
from gpusim.kernels import agent_phase

from .config import MountainCarConfig

STATE = ("position", "velocity")


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    """(position, velocity) as float32, from the float64 state."""
    s.obs[env, agent, 0] = numba.float32(s.position[env])
    s.obs[env, agent, 1] = numba.float32(s.velocity[env])


@numba.jit(nopython=True)
def spawn(env, agent, s, p):
    """Position uniform in [reset_low, reset_high] (float64, as gymnasium's), velocity 0."""
    u = np.float64(rng.uniform(s.rng_state, env, agent))
    s.position[env] = p.reset_low + (p.reset_high - p.reset_low) * u
    s.velocity[env] = 0.0
    s.timestep[env] = 0
    observe(env, agent, s, p)


@numba.jit(nopython=True)
def physics(env, agent, s, p):
    position = s.position[env]
    velocity = s.velocity[env]
    push = np.float64(s.actions[env, agent, 0] - 1)
    # gymnasium: velocity += (action - 1) * force + cos(3 * position) * (-gravity)
    velocity = velocity + (push * p.force + math.cos(3.0 * position) * (-p.gravity))
    velocity = min(max(velocity, -p.max_speed), p.max_speed)
    position = position + velocity
    position = min(max(position, p.min_position), p.max_position)
    if position == p.min_position and velocity < 0.0:
        velocity = 0.0

    s.position[env] = position
    s.velocity[env] = velocity
    s.timestep[env] += 1
    observe(env, agent, s, p)
    s.reward[env, agent] = numba.float32(-1.0)
    terminated = position >= p.goal_position and velocity >= p.goal_velocity
    s.terminated[env] = terminated
    s.truncated[env] = (not terminated) and s.timestep[env] >= p.max_episode_steps


class MountainCar(Env):
    name = "mountain_car"
    config_class = MountainCarConfig
    reset_phases = (agent_phase(spawn),)
    step_phases = (agent_phase(physics),)
    observe_phases = (agent_phase(observe),)

    render_arrays = STATE

    def draw(self, ax, frame):
        from .render import draw
        draw(ax, frame, self.config)

    def setup(self, config):
        self.num_agents = 1
        self.time_limit = config.max_episode_steps
        self.obs_dim = 2
        self.action_nvec = (3,)
        self.policies = {"agent": (0,)}

    def array_specs(self):
        specs = {name: ArraySpec(torch.float64, scope="env", state=True) for name in STATE}
        specs["timestep"] = ArraySpec(torch.int32, scope="env", state=True)
        return specs

    float_type = np.float64  # gymnasium's arithmetic is float64
