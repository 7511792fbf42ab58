"""Reference (test oracle) for pendulum: gymnasium's own Pendulum-v1 step.

Each replica is stepped by gymnasium's `PendulumEnv.step` (which clips the
torque itself), with the constants taken from the config, so the oracle is
code independent of `env.py`. Needs gymnasium (`pip install gymnasium`,
part of the `test` extra).

State format: a dict of numpy arrays for E replicas:
    theta, theta_dot : (E,) float64
    timestep         : (E,) int32
"""
from __future__ import annotations

import numpy as np

STATE_KEYS = ("theta", "theta_dot", "timestep")
_PHYSICS = ("theta", "theta_dot")


def gym_pendulum(config):
    """A gymnasium PendulumEnv with the config's constants."""
    try:
        from gymnasium.envs.classic_control.pendulum import PendulumEnv
    except ImportError:
        raise ImportError("the pendulum reference needs gymnasium: pip install gymnasium") \
            from None
    gym = PendulumEnv(g=config.g)
    gym.max_speed = config.max_speed
    gym.max_torque = config.max_torque
    gym.dt = config.dt
    gym.m = config.m
    gym.l = config.l
    return gym


def step(config, state, actions, gym=None):
    """One step of every replica, without reset.

    `actions` is (E, 1, 1) float32 torques, not yet clipped (gymnasium's step
    clips them to +-max_torque). Returns (next_state, obs, reward, terminated,
    truncated) as numpy arrays; obs is (E, 1, 3) float32, reward (E, 1)
    float32, next_state's theta and theta_dot float64 (gymnasium's state).
    """
    gym = gym_pendulum(config) if gym is None else gym
    actions = np.asarray(actions, dtype=np.float32)
    num_envs = len(state["theta"])
    if actions.shape != (num_envs, 1, 1):
        raise ValueError(f"actions must have shape {(num_envs, 1, 1)}, got {actions.shape}")
    obs = np.zeros((num_envs, 1, 3), dtype=np.float32)
    reward = np.zeros((num_envs, 1), dtype=np.float32)
    terminated = np.zeros(num_envs, dtype=bool)
    truncated = np.zeros(num_envs, dtype=bool)
    next_state = {k: np.zeros(num_envs, dtype=np.float64) for k in _PHYSICS}
    timestep = np.asarray(state["timestep"], dtype=np.int32) + 1
    for e in range(num_envs):
        gym.state = np.array([state[k][e] for k in _PHYSICS], dtype=np.float64)
        obs[e, 0], r, term, _, _ = gym.step(actions[e, 0])
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
    gym = gym_pendulum(config)

    def reference(state, actions):
        return step(config, state, actions, gym)
    return reference
