"""acrobot: gymnasium's Acrobot-v1 as portable phases, one agent per replica.

The state is kept in float64, as gymnasium keeps it after its first step,
and every step is gymnasium's: one RK4 step of `_dsdt` over dt, then the
angles wrapped into [-pi, pi] and the velocities clipped, each expression
written in gymnasium's operation order. Only scalar locals are used (no
arrays inside phases), so the same source compiles into the CUDA kernel.
"""
import math

import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.env import Env
from gpusim.kernels import agent_phase

from .config import AcrobotConfig

STATE = ("theta1", "theta2", "dtheta1", "dtheta2")
GRAVITY = 9.8                 # gymnasium's `_dsdt` fixes g = 9.8
HALF_PI = math.pi / 2.0
TWO_PI = math.pi - (-math.pi)  # gymnasium's wrap(x, -pi, pi): diff = M - m


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    """(cos th1, sin th1, cos th2, sin th2, dth1, dth2) as float32, from the float64 state."""
    theta1, theta2 = s.theta1[env], s.theta2[env]
    s.obs[env, agent, 0] = numba.float32(math.cos(theta1))
    s.obs[env, agent, 1] = numba.float32(math.sin(theta1))
    s.obs[env, agent, 2] = numba.float32(math.cos(theta2))
    s.obs[env, agent, 3] = numba.float32(math.sin(theta2))
    s.obs[env, agent, 4] = numba.float32(s.dtheta1[env])
    s.obs[env, agent, 5] = numba.float32(s.dtheta2[env])


@numba.jit(nopython=True)
def spawn(env, agent, s, p):
    """Each component uniform in [-init_range, init_range], rounded to float32 as gymnasium."""
    v0 = numba.float32((2.0 * rng.uniform(s.rng_state, env, agent) - 1.0) * p.init_range)
    v1 = numba.float32((2.0 * rng.uniform(s.rng_state, env, agent) - 1.0) * p.init_range)
    v2 = numba.float32((2.0 * rng.uniform(s.rng_state, env, agent) - 1.0) * p.init_range)
    v3 = numba.float32((2.0 * rng.uniform(s.rng_state, env, agent) - 1.0) * p.init_range)
    s.theta1[env] = np.float64(v0)
    s.theta2[env] = np.float64(v1)
    s.dtheta1[env] = np.float64(v2)
    s.dtheta2[env] = np.float64(v3)
    s.timestep[env] = 0
    observe(env, agent, s, p)


@numba.jit(nopython=True)
def dsdt(p, a, theta1, theta2, dtheta1, dtheta2):
    """gymnasium's `AcrobotEnv._dsdt`: (dtheta1, dtheta2, ddtheta1, ddtheta2) under torque a."""
    m1, m2, l1 = p.link_mass_1, p.link_mass_2, p.link_length_1
    lc1, lc2, i1, i2, g = p.link_com_pos_1, p.link_com_pos_2, p.link_moi, p.link_moi, p.gravity
    d1 = m1 * (lc1 * lc1) + m2 * (l1 * l1 + lc2 * lc2 + 2.0 * l1 * lc2 * math.cos(theta2)) \
        + i1 + i2
    d2 = m2 * (lc2 * lc2 + l1 * lc2 * math.cos(theta2)) + i2
    phi2 = m2 * lc2 * g * math.cos(theta1 + theta2 - HALF_PI)
    phi1 = ((-m2) * l1 * lc2 * (dtheta2 * dtheta2) * math.sin(theta2)
            - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * math.sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * math.cos(theta1 - HALF_PI)
            + phi2)
    if p.nips:
        ddtheta2 = (a + d2 / d1 * phi1 - phi2) / (m2 * (lc2 * lc2) + i2 - (d2 * d2) / d1)
    else:
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * math.sin(theta2)
                    - phi2) / (m2 * (lc2 * lc2) + i2 - (d2 * d2) / d1)
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return dtheta1, dtheta2, ddtheta1, ddtheta2


@numba.jit(nopython=True)
def physics(env, agent, s, p):
    action = s.actions[env, agent, 0]
    a = p.torque_0 if action == 0 else (p.torque_1 if action == 1 else p.torque_2)
    y0, y1 = s.theta1[env], s.theta2[env]
    y2, y3 = s.dtheta1[env], s.dtheta2[env]
    # gymnasium's rk4(_dsdt, s_augmented, [0, dt]): one step, written out per component
    dt = p.dt
    dt2 = dt / 2.0
    k1_0, k1_1, k1_2, k1_3 = dsdt(p, a, y0, y1, y2, y3)
    k2_0, k2_1, k2_2, k2_3 = dsdt(p, a, y0 + dt2 * k1_0, y1 + dt2 * k1_1,
                                  y2 + dt2 * k1_2, y3 + dt2 * k1_3)
    k3_0, k3_1, k3_2, k3_3 = dsdt(p, a, y0 + dt2 * k2_0, y1 + dt2 * k2_1,
                                  y2 + dt2 * k2_2, y3 + dt2 * k2_3)
    k4_0, k4_1, k4_2, k4_3 = dsdt(p, a, y0 + dt * k3_0, y1 + dt * k3_1,
                                  y2 + dt * k3_2, y3 + dt * k3_3)
    dt6 = dt / 6.0
    theta1 = y0 + dt6 * (k1_0 + 2.0 * k2_0 + 2.0 * k3_0 + k4_0)
    theta2 = y1 + dt6 * (k1_1 + 2.0 * k2_1 + 2.0 * k3_1 + k4_1)
    dtheta1 = y2 + dt6 * (k1_2 + 2.0 * k2_2 + 2.0 * k3_2 + k4_2)
    dtheta2 = y3 + dt6 * (k1_3 + 2.0 * k2_3 + 2.0 * k3_3 + k4_3)
    # wrap(x, -pi, pi) and bound(x, -max, max), as gymnasium
    while theta1 > math.pi:
        theta1 = theta1 - TWO_PI
    while theta1 < -math.pi:
        theta1 = theta1 + TWO_PI
    while theta2 > math.pi:
        theta2 = theta2 - TWO_PI
    while theta2 < -math.pi:
        theta2 = theta2 + TWO_PI
    dtheta1 = min(max(dtheta1, -p.max_vel_1), p.max_vel_1)
    dtheta2 = min(max(dtheta2, -p.max_vel_2), p.max_vel_2)

    s.theta1[env] = theta1
    s.theta2[env] = theta2
    s.dtheta1[env] = dtheta1
    s.dtheta2[env] = dtheta2
    s.timestep[env] += 1
    observe(env, agent, s, p)
    terminated = -math.cos(theta1) - math.cos(theta2 + theta1) > 1.0
    s.reward[env, agent] = numba.float32(0.0) if terminated else numba.float32(-1.0)
    s.terminated[env] = terminated
    s.truncated[env] = (not terminated) and s.timestep[env] >= p.max_episode_steps


class Acrobot(Env):
    name = "acrobot"
    config_class = AcrobotConfig
    reset_phases = (agent_phase(spawn),)
    step_phases = (agent_phase(physics),)
    observe_phases = (agent_phase(observe),)

    render_arrays = ("theta1", "theta2")

    def draw(self, ax, frame):
        from .render import draw
        draw(ax, frame, self.config)

    def setup(self, config):
        self.num_agents = 1
        self.time_limit = config.max_episode_steps
        self.obs_dim = 6
        self.action_nvec = (3,)
        self.policies = {"agent": (0,)}

    def array_specs(self):
        specs = {name: ArraySpec(torch.float64, scope="env", state=True) for name in STATE}
        specs["timestep"] = ArraySpec(torch.int32, scope="env", state=True)
        return specs

    float_type = np.float64  # gymnasium's arithmetic is float64

    def derived(self):
        c, f64 = self.config, np.float64
        return dict(gravity=f64(GRAVITY), torque_0=f64(c.avail_torque[0]),
                    torque_1=f64(c.avail_torque[1]), torque_2=f64(c.avail_torque[2]),
                    nips=np.int32(c.book_or_nips == "nips"))
