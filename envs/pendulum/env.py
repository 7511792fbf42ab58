"""pendulum: gymnasium's Pendulum-v1 as portable phases, one agent per replica.

The state is kept in float64, as gymnasium keeps it (its reset draws float64
values and its step computes and stores float64), and every step is
gymnasium's, each expression in gymnasium's operation order. The action is
float32 (clipped to +-max_torque by the step kernel before this phase runs),
and the two terms gymnasium computes from it in float32 under NumPy 2's
promotion rules (NEP 50: a Python float next to a float32 is a float32) are
rounded to float32 here too. Only scalar locals are used, so the same source
compiles into the CUDA kernel.
"""
import math

import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.env import Env
from gpusim.kernels import agent_phase
from gpusim.spaces import Box

from .config import PendulumConfig

STATE = ("theta", "theta_dot")
TWO_PI = 2 * math.pi  # gymnasium's angle_normalize: ((x + pi) % (2 * pi)) - pi


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    """(cos theta, sin theta, theta_dot) as float32, from the float64 state."""
    theta = s.theta[env]
    s.obs[env, agent, 0] = numba.float32(math.cos(theta))
    s.obs[env, agent, 1] = numba.float32(math.sin(theta))
    s.obs[env, agent, 2] = numba.float32(s.theta_dot[env])


@numba.jit(nopython=True)
def spawn(env, agent, s, p):
    """theta uniform in +-init_theta, then theta_dot uniform in +-init_theta_dot (float64)."""
    u0 = np.float64(rng.uniform(s.rng_state, env, agent))
    u1 = np.float64(rng.uniform(s.rng_state, env, agent))
    s.theta[env] = (2.0 * u0 - 1.0) * p.init_theta
    s.theta_dot[env] = (2.0 * u1 - 1.0) * p.init_theta_dot
    s.timestep[env] = 0
    observe(env, agent, s, p)


@numba.jit(nopython=True)
def physics(env, agent, s, p):
    u = s.continuous_actions[env, agent, 0]  # float32, already in [-max_torque, max_torque]
    th = s.theta[env]
    thdot = s.theta_dot[env]
    # costs = angle_normalize(th)**2 + 0.1 * thdot**2 + 0.001 * (u**2); the last term is
    # float32 in gymnasium (u is a float32 scalar and 0.001 a Python float)
    angle = ((th + math.pi) % TWO_PI) - math.pi
    torque_cost = numba.float32(p.torque_cost_coef * numba.float32(u * u))
    costs = angle * angle + 0.1 * (thdot * thdot) + np.float64(torque_cost)
    # newthdot = thdot + (3 * g / (2 * l) * sin(th) + 3.0 / (m * l**2) * u) * dt, with the
    # torque term float32 in gymnasium for the same reason
    push = np.float64(numba.float32(p.torque_coef * u))
    newthdot = thdot + (p.gravity_coef * math.sin(th) + push) * p.dt
    newthdot = min(max(newthdot, -p.max_speed), p.max_speed)
    newth = th + newthdot * p.dt

    s.theta[env] = newth
    s.theta_dot[env] = newthdot
    s.timestep[env] += 1
    observe(env, agent, s, p)
    s.reward[env, agent] = numba.float32(-costs)
    s.terminated[env] = False
    s.truncated[env] = s.timestep[env] >= p.max_episode_steps


class Pendulum(Env):
    name = "pendulum"
    config_class = PendulumConfig
    reset_phases = (agent_phase(spawn),)
    step_phases = (agent_phase(physics),)
    observe_phases = (agent_phase(observe),)

    render_arrays = ("theta",)

    def draw(self, ax, frame):
        from .render import draw
        draw(ax, frame, self.config)

    def setup(self, config):
        self.num_agents = 1
        self.time_limit = config.max_episode_steps
        self.obs_dim = 3
        self.action_box = Box(low=(-config.max_torque,), high=(config.max_torque,))
        self.policies = {"agent": (0,)}

    def array_specs(self):
        specs = {name: ArraySpec(torch.float64, scope="env", state=True) for name in STATE}
        specs["timestep"] = ArraySpec(torch.int32, scope="env", state=True)
        return specs

    float_type = np.float64  # gymnasium's arithmetic is float64
    episode_ends = ("truncation",)  # a pendulum never terminates

    def derived(self):
        c, f64, f32 = self.config, np.float64, np.float32
        # gymnasium's coefficients, as it computes them (Python floats); those that
        # multiply the float32 action are float32 there (NEP 50), so float32 here
        return dict(gravity_coef=f64(3 * c.g / (2 * c.l)),
                    torque_coef=f32(3.0 / (c.m * c.l ** 2)), torque_cost_coef=f32(0.001))
