"""mountain_car_continuous: gymnasium's MountainCarContinuous-v0 as portable phases.

gymnasium's state is float64 right after its reset (a float64 position, a
velocity of 0) and float32 after every step (its step stores
`np.array([position, velocity], dtype=np.float32)`); under NumPy 2's
promotion rules (NEP 50: a Python float next to a float32 is a float32) its
step therefore computes in float32 except on the first step of an episode,
and the constants it compares with are rounded to float32 too, except where
a clip has just replaced a value by a Python float. The state arrays here
are float64, so that they can hold the reset position unrounded, and the
step follows gymnasium's dtype of every intermediate value: float64 when
`timestep == 0`, float32 (each value rounded as gymnasium's is) otherwise.
Only scalar locals are used, so the same source compiles into the CUDA kernel.
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

from .config import MountainCarContinuousConfig

STATE = ("position", "velocity")
SLOPE = 0.0025  # gymnasium's step writes this constant in: velocity -= 0.0025 cos(3 position)
MIN_ACTION, MAX_ACTION = -1.0, 1.0  # and these are fixed in its __init__


@numba.jit(nopython=True)
def narrow(x):
    """x rounded to float32 (held as a float64): a NumPy float32 scalar's value."""
    return np.float64(numba.float32(x))


@numba.jit(nopython=True)
def bound(value, wide):
    """A constant as gymnasium compares with it: a float32 scalar compares with the
    float32 rounding of a Python float (NEP 50), a float64 or Python float with itself."""
    return value if wide else narrow(value)


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    """(position, velocity) as float32."""
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
    # the raw float32 action (raw_continuous_actions: the runtime does not clip it; it may
    # be out of bounds, and NaN or infinite when check_actions is off)
    action = s.continuous_actions[env, agent, 0]
    # gymnasium's force = min(max(action, -1.0), 1.0): the Python float bound when the
    # action lies beyond it, else the float32 action itself (also one exactly at a bound:
    # max/min keep their first argument on a tie). NaN (which gymnasium would pass through
    # into its state) is taken as the low bound, as check_actions refuses it anyway.
    clipped = True
    if not action >= MIN_ACTION:  # below the bound, or NaN
        force = MIN_ACTION
    elif action > MAX_ACTION:
        force = MAX_ACTION
    else:
        force = np.float64(action)
        clipped = False
    wide = s.timestep[env] == 0  # gymnasium's state is float64 only right after reset
    if wide:
        position = s.position[env]
        velocity = s.velocity[env]
        slope = SLOPE * math.cos(3.0 * position)
    else:
        position = narrow(s.position[env])
        velocity = narrow(s.velocity[env])
        slope = SLOPE * math.cos(narrow(3.0 * position))
    # velocity += force * power - 0.0025 * cos(3 * position): in float64 with a clipped
    # (Python float) force, else float32 (`float32 * power`, then `- slope` rounded)
    if clipped:
        delta = force * p.power - slope
    else:
        delta = narrow(narrow(force * p.power32) - narrow(slope))
    velocity = velocity + delta if wide else narrow(velocity + narrow(delta))
    velocity_wide = wide
    if velocity > bound(p.max_speed, velocity_wide):
        velocity, velocity_wide = p.max_speed, True
    if velocity < bound(-p.max_speed, velocity_wide):
        velocity, velocity_wide = -p.max_speed, True
    position = position + velocity if wide else narrow(position + narrow(velocity))
    position_wide = wide
    if position > bound(p.max_position, position_wide):
        position, position_wide = p.max_position, True
    if position < bound(p.min_position, position_wide):
        position, position_wide = p.min_position, True
    if position == bound(p.min_position, position_wide) and velocity < 0.0:
        velocity, velocity_wide = 0.0, True
    terminated = (position >= bound(p.goal_position, position_wide)
                  and velocity >= bound(p.goal_velocity, velocity_wide))

    s.position[env] = narrow(position)  # gymnasium stores its state as float32
    s.velocity[env] = narrow(velocity)
    s.timestep[env] += 1
    observe(env, agent, s, p)
    # gymnasium's reward = (100.0 if terminated else 0) - math.pow(action, 2) * 0.1, in
    # float64, of the RAW action (not the clipped force): -0.169 for an action of 1.3, -inf
    # for an infinite one, NaN for NaN. The square of a float32 is exact in float64.
    a = np.float64(action)
    reward = (100.0 if terminated else 0.0) - (a * a) * 0.1
    s.reward[env, agent] = numba.float32(reward)
    s.terminated[env] = terminated
    s.truncated[env] = (not terminated) and s.timestep[env] >= p.max_episode_steps


class MountainCarContinuous(Env):
    name = "mountain_car_continuous"
    config_class = MountainCarContinuousConfig
    reset_phases = (agent_phase(spawn),)
    step_phases = (agent_phase(physics),)
    observe_phases = (agent_phase(observe),)
    # the step kernel leaves the actions unclipped: `physics` clips the force itself and
    # charges the reward on the raw action, as gymnasium does
    raw_continuous_actions = True

    render_arrays = STATE

    def draw(self, ax, frame):
        from .render import draw
        draw(ax, frame, self.config)

    def setup(self, config):
        self.num_agents = 1
        self.time_limit = config.max_episode_steps
        self.obs_dim = 2
        self.action_box = Box(low=(MIN_ACTION,), high=(MAX_ACTION,))
        self.policies = {"agent": (0,)}

    def array_specs(self):
        specs = {name: ArraySpec(torch.float64, scope="env", state=True) for name in STATE}
        specs["timestep"] = ArraySpec(torch.int32, scope="env", state=True)
        return specs

    float_type = np.float64  # gymnasium's arithmetic is float64

    def derived(self):
        # `float32 action * power` rounds power first
        return dict(power32=np.float64(np.float32(self.config.power)))
