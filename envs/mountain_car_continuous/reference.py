"""Reference (test oracle) for mountain_car_continuous: gymnasium's own
MountainCarContinuous-v0 step.

Each replica is stepped by gymnasium's `Continuous_MountainCarEnv.step`, with
the constants taken from the config, so the oracle is code independent of
`env.py`. It is given the actions unclipped (gymnasium clips the force
itself) and the state in the dtype gymnasium itself would hold: float64 at
timestep 0 (its reset's), float32 after any step (its step's). Everything it
returns is gymnasium's own, the reward included (which penalises the raw,
unclipped action), rounded to float32. Needs gymnasium (`pip install
gymnasium`, part of the `test` extra).

State format: a dict of numpy arrays for E replicas:
    position, velocity : (E,) float64
    timestep           : (E,) int32
"""
from __future__ import annotations

import functools

import numpy as np

from gpusim.envs.gymnasium_reference import step_replicas

STATE_KEYS = ("position", "velocity", "timestep")
_PHYSICS = ("position", "velocity")


def gym_mountain_car_continuous(config):
    """A gymnasium Continuous_MountainCarEnv with the config's constants."""
    try:
        from gymnasium.envs.classic_control.continuous_mountain_car import \
            Continuous_MountainCarEnv
    except ImportError:
        raise ImportError("the mountain_car_continuous reference needs gymnasium: "
                          "pip install gymnasium") from None
    gym = Continuous_MountainCarEnv(goal_velocity=config.goal_velocity)
    gym.min_position = config.min_position
    gym.max_position = config.max_position
    gym.max_speed = config.max_speed
    gym.goal_position = config.goal_position
    gym.power = config.power
    return gym


def gym_state(position, velocity, timestep):
    """The state array gymnasium would hold: float64 right after reset, float32 after a step."""
    return np.array([position, velocity], dtype=np.float64 if timestep == 0 else np.float32)


def _load_state(state, e):
    return gym_state(state["position"][e], state["velocity"][e], state["timestep"][e])


def step(config, state, actions, gym=None):
    """One step of every replica, without reset.

    `actions` is (E, 1, 1) float32 forces, not yet clipped. Returns
    (next_state, obs, reward, terminated, truncated) as numpy arrays; obs is
    (E, 1, 2) float32, reward (E, 1) float32, next_state's position and
    velocity float64 (holding gymnasium's float32 state after the step).
    """
    gym = gym_mountain_car_continuous(config) if gym is None else gym
    return step_replicas(gym, state, actions, _PHYSICS, 2, config.max_episode_steps,
                         discrete=False, load_state=_load_state)


def check_env_reference(config):
    """This reference in `gpusim.check.check_env`'s protocol: `(state, actions) -> step(...)`.

        check_env(env, reference=check_env_reference(env.config))
    """
    return functools.partial(step, config, gym=gym_mountain_car_continuous(config))
