"""Reference (test oracle) for mountain_car: gymnasium's own MountainCar-v0 step.

Each replica is stepped by gymnasium's `MountainCarEnv.step`, with the
constants taken from the config, so the oracle is code independent of
`env.py`. Needs gymnasium (`pip install gymnasium`, part of the `test` extra).

State format: a dict of numpy arrays for E replicas:
    position, velocity : (E,) float64
    timestep           : (E,) int32
"""
from __future__ import annotations

import numpy as np

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
    actions = np.asarray(actions)
    num_envs = len(state["position"])
    if actions.shape != (num_envs, 1, 1):
        raise ValueError(f"actions must have shape {(num_envs, 1, 1)}, got {actions.shape}")
    obs = np.zeros((num_envs, 1, 2), dtype=np.float32)
    reward = np.zeros((num_envs, 1), dtype=np.float32)
    terminated = np.zeros(num_envs, dtype=bool)
    truncated = np.zeros(num_envs, dtype=bool)
    next_state = {k: np.zeros(num_envs, dtype=np.float64) for k in _PHYSICS}
    timestep = np.asarray(state["timestep"], dtype=np.int32) + 1
    for e in range(num_envs):
        gym.state = np.array([state[k][e] for k in _PHYSICS], dtype=np.float64)
        obs[e, 0], r, term, _, _ = gym.step(int(actions[e, 0, 0]))
        for i, k in enumerate(_PHYSICS):
            next_state[k][e] = gym.state[i]
        reward[e, 0] = r
        terminated[e] = term
        truncated[e] = (not term) and timestep[e] >= config.max_episode_steps
    next_state["timestep"] = timestep
    return next_state, obs, reward, terminated, truncated


def check_env_reference(config):
    """This reference in `gpusim.check.check_env`'s protocol: `(state, actions) -> step(...)`.

        check_env(env, reference=check_env_reference(env.config))
    """
    gym = gym_mountain_car(config)

    def reference(state, actions):
        return step(config, state, actions, gym)
    return reference
