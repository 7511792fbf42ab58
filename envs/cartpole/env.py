"""cartpole: gymnasium's CartPole-v1 as portable phases, one agent per replica.

The dynamics are computed in float64 from the float32 state, in gymnasium's
order (explicit Euler), and stored as float32, as gymnasium does.
"""
import math

import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.env import Env
from gpusim.kernels import agent_phase

from .config import CartPoleConfig

STATE = ("x", "x_dot", "theta", "theta_dot")


@numba.jit(nopython=True)
def spawn(env, agent, s, p):
    """Each component uniform in [-init_range, init_range]."""
    for k in range(4):
        u = rng.uniform(s.rng_state, env, agent)
        s.obs[env, agent, k] = numba.float32((2.0 * u - 1.0) * p.init_range)
    s.x[env] = s.obs[env, agent, 0]
    s.x_dot[env] = s.obs[env, agent, 1]
    s.theta[env] = s.obs[env, agent, 2]
    s.theta_dot[env] = s.obs[env, agent, 3]
    s.timestep[env] = 0


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    """The observation is the state: x, x_dot, theta, theta_dot."""
    s.obs[env, agent, 0] = s.x[env]
    s.obs[env, agent, 1] = s.x_dot[env]
    s.obs[env, agent, 2] = s.theta[env]
    s.obs[env, agent, 3] = s.theta_dot[env]


@numba.jit(nopython=True)
def physics(env, agent, s, p):
    x, x_dot = np.float64(s.x[env]), np.float64(s.x_dot[env])
    theta, theta_dot = np.float64(s.theta[env]), np.float64(s.theta_dot[env])
    force = p.force_mag if s.actions[env, agent, 0] == 1 else -p.force_mag
    cos_t = math.cos(theta)
    sin_t = math.sin(theta)
    temp = (force + p.polemass_length * (theta_dot * theta_dot) * sin_t) / p.total_mass
    theta_acc = (p.gravity * sin_t - cos_t * temp) / (
        p.pole_half_length * (4.0 / 3.0 - p.pole_mass * (cos_t * cos_t) / p.total_mass))
    x_acc = temp - p.polemass_length * theta_acc * cos_t / p.total_mass
    x = x + p.tau * x_dot
    x_dot = x_dot + p.tau * x_acc
    theta = theta + p.tau * theta_dot
    theta_dot = theta_dot + p.tau * theta_acc

    s.x[env] = numba.float32(x)
    s.x_dot[env] = numba.float32(x_dot)
    s.theta[env] = numba.float32(theta)
    s.theta_dot[env] = numba.float32(theta_dot)
    s.timestep[env] += 1
    observe(env, agent, s, p)
    s.reward[env, agent] = numba.float32(1.0)
    # Termination is decided on the float64 values, as gymnasium does.
    terminated = (x < -p.x_threshold or x > p.x_threshold
                  or theta < -p.theta_threshold or theta > p.theta_threshold)
    s.terminated[env] = terminated
    s.truncated[env] = (not terminated) and s.timestep[env] >= p.max_episode_steps


class CartPole(Env):
    name = "cartpole"
    config_class = CartPoleConfig
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
        self.obs_dim = 4
        self.action_nvec = (2,)
        self.policies = {"agent": (0,)}

    def array_specs(self):
        specs = {name: ArraySpec(torch.float32, scope="env", state=True) for name in STATE}
        specs["timestep"] = ArraySpec(torch.int32, scope="env", state=True)
        return specs

    float_type = np.float64  # gymnasium's arithmetic is float64

    def derived(self):
        c, f64 = self.config, np.float64
        return dict(total_mass=f64(c.pole_mass + c.cart_mass),
                    polemass_length=f64(c.pole_mass * c.pole_half_length),
                    theta_threshold=f64(c.theta_threshold_degrees * 2 * math.pi / 360))
