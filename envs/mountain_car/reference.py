"""Reference (test oracle) for mountain_car: gymnasium's own MountainCar-v0 step.

Each replica is stepped by gymnasium's `MountainCarEnv.step`, with the
constants taken from the config, so the oracle is code independent of
`env.py`. Needs gymnasium (`pip install gymnasium`, part of the `test` extra).

State format: a dict of numpy arrays for E replicas:
    position, velocity : (E,) float64
    timestep           : (E,) int32
"""
from __future__ import annotations

import functools

from gpusim.envs.gymnasium_reference import step_replicas

STATE_KEYS = ("position", "velocity", "timestep")
_PHYSICS = ("position", "velocity")


def gym_mountain_car(config):
    """A gymnasium MountainCarEnv with the config's constants."""
    try:
        from gymnasium.envs.classic_control.mountain_car import MountainCarEnv
    except ImportError:
        raise ImportError("the mountain_car reference needs gymnasium: "
                          "pip install gymnasium") from None
    gym = MountainCarEnv(goal_velocity=config.goal_velocity)
    gym.min_position = config.min_position
    gym.max_position = config.max_position
    gym.max_speed = config.max_speed
    gym.goal_position = config.goal_position
    gym.force = config.force
    gym.gravity = config.gravity
    return gym


def step(config, state, actions, gym=None):
    """One step of every replica, without reset.

    `actions` is (E, 1, 1) with 0 (push left), 1 (no push) or 2 (push right).
    Returns (next_state, obs, reward, terminated, truncated) as numpy arrays;
    obs is (E, 1, 2) float32, reward (E, 1) float32, next_state's position and
    velocity float64 (gymnasium's state after a step).
    """
    gym = gym_mountain_car(config) if gym is None else gym
    return step_replicas(gym, state, actions, _PHYSICS, 2, config.max_episode_steps,
                         discrete=True)


def check_env_reference(config):
    """This reference in `gpusim.check.check_env`'s protocol: `(state, actions) -> step(...)`.

        check_env(env, reference=check_env_reference(env.config))
    """
    return functools.partial(step, config, gym=gym_mountain_car(config))
