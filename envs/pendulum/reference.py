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

import functools

from gpusim.envs.gymnasium_reference import step_replicas

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
    return step_replicas(gym, state, actions, _PHYSICS, 3, config.max_episode_steps,
                         discrete=False)


def check_env_reference(config):
    """This reference in `gpusim.check.check_env`'s protocol: `(state, actions) -> step(...)`.

        check_env(env, reference=check_env_reference(env.config))
    """
    return functools.partial(step, config, gym=gym_pendulum(config))
