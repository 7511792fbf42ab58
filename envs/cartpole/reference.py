"""Reference (test oracle) for cartpole: gymnasium's own CartPole-v1 step.

Each replica is stepped by gymnasium's `CartPoleEnv.step`, with the physics
constants taken from the config, so the oracle is code independent of
`env.py`. Needs gymnasium (`pip install gymnasium`, part of the `test` extra).

State format: a dict of numpy arrays for E replicas:
    x, x_dot, theta, theta_dot : (E,) float32
    timestep                   : (E,) int32
"""
from __future__ import annotations

import math

import numpy as np

STATE_KEYS = ("x", "x_dot", "theta", "theta_dot", "timestep")
_PHYSICS = ("x", "x_dot", "theta", "theta_dot")


def gym_cartpole(config):
    """A gymnasium CartPoleEnv with the config's constants."""
    try:
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv
    except ImportError:
        raise ImportError("the cartpole reference needs gymnasium: pip install gymnasium") from None
    gym = CartPoleEnv()
    gym.gravity = config.gravity
    gym.masscart = config.cart_mass
    gym.masspole = config.pole_mass
    gym.total_mass = config.pole_mass + config.cart_mass
    gym.length = config.pole_half_length
    gym.polemass_length = config.pole_mass * config.pole_half_length
    gym.force_mag = config.force_mag
    gym.tau = config.tau
    gym.x_threshold = config.x_threshold
    gym.theta_threshold_radians = config.theta_threshold_degrees * 2 * math.pi / 360
    return gym


def step(config, state, actions, gym=None):
    """One step of every replica, without reset.

    `actions` is (E, 1, 1) with 0 (push left) or 1 (push right). Returns
    (next_state, obs, reward, terminated, truncated) as numpy arrays; obs is
    (E, 1, 4) float32, reward (E, 1) float32.
    """
    gym = gym_cartpole(config) if gym is None else gym
    actions = np.asarray(actions)
    num_envs = len(state["x"])
    if actions.shape != (num_envs, 1, 1):
        raise ValueError(f"actions must have shape {(num_envs, 1, 1)}, got {actions.shape}")
    obs = np.zeros((num_envs, 1, 4), dtype=np.float32)
    reward = np.zeros((num_envs, 1), dtype=np.float32)
    terminated = np.zeros(num_envs, dtype=bool)
    truncated = np.zeros(num_envs, dtype=bool)
    timestep = np.asarray(state["timestep"], dtype=np.int32) + 1
    for e in range(num_envs):
        gym.state = np.array([state[k][e] for k in _PHYSICS], dtype=np.float64)
        gym.steps_beyond_terminated = None
        obs[e, 0], r, term, _, _ = gym.step(int(actions[e, 0, 0]))
        reward[e, 0] = r
        terminated[e] = term
        truncated[e] = (not term) and timestep[e] >= config.max_episode_steps
    next_state = {k: obs[:, 0, i].copy() for i, k in enumerate(_PHYSICS)}
    next_state["timestep"] = timestep
    return next_state, obs, reward, terminated, truncated


def check_env_reference(config):
    """This reference in `gpusim.check.check_env`'s protocol: `(state, actions) -> step(...)`.

        check_env(env, reference=check_env_reference(env.config))
    """
    gym = gym_cartpole(config)

    def reference(state, actions):
        return step(config, state, actions, gym)
    return reference
