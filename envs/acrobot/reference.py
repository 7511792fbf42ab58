"""Reference (test oracle) for acrobot: gymnasium's own Acrobot-v1 step.

Each replica is stepped by gymnasium's `AcrobotEnv.step` (its `_dsdt`, `rk4`,
`wrap` and `bound`), with the constants taken from the config, so the oracle
is code independent of `env.py`. Needs gymnasium (`pip install gymnasium`,
part of the `test` extra).

State format: a dict of numpy arrays for E replicas:
    theta1, theta2, dtheta1, dtheta2 : (E,) float64
    timestep                         : (E,) int32
"""
from __future__ import annotations

import functools

from gpusim.envs.gymnasium_reference import step_replicas

STATE_KEYS = ("theta1", "theta2", "dtheta1", "dtheta2", "timestep")
_PHYSICS = ("theta1", "theta2", "dtheta1", "dtheta2")


def gym_acrobot(config):
    """A gymnasium AcrobotEnv with the config's constants (g = 9.8 is fixed in gymnasium)."""
    try:
        from gymnasium.envs.classic_control.acrobot import AcrobotEnv
    except ImportError:
        raise ImportError("the acrobot reference needs gymnasium: pip install gymnasium") from None
    gym = AcrobotEnv()
    gym.LINK_LENGTH_1 = config.link_length_1
    gym.LINK_LENGTH_2 = config.link_length_2
    gym.LINK_MASS_1 = config.link_mass_1
    gym.LINK_MASS_2 = config.link_mass_2
    gym.LINK_COM_POS_1 = config.link_com_pos_1
    gym.LINK_COM_POS_2 = config.link_com_pos_2
    gym.LINK_MOI = config.link_moi
    gym.MAX_VEL_1 = config.max_vel_1
    gym.MAX_VEL_2 = config.max_vel_2
    gym.AVAIL_TORQUE = list(config.avail_torque)
    gym.dt = config.dt
    gym.book_or_nips = config.book_or_nips
    gym.torque_noise_max = 0.0
    return gym


def step(config, state, actions, gym=None):
    """One step of every replica, without reset.

    `actions` is (E, 1, 1) with 0, 1 or 2 (torque -1, 0, +1). Returns
    (next_state, obs, reward, terminated, truncated) as numpy arrays; obs is
    (E, 1, 6) float32, reward (E, 1) float32, next_state's angles and
    velocities float64 (gymnasium's state after a step).
    """
    gym = gym_acrobot(config) if gym is None else gym
    return step_replicas(gym, state, actions, _PHYSICS, 6, config.max_episode_steps,
                         discrete=True)


def check_env_reference(config):
    """This reference in `gpusim.check.check_env`'s protocol: `(state, actions) -> step(...)`.

        check_env(env, reference=check_env_reference(env.config))
    """
    return functools.partial(step, config, gym=gym_acrobot(config))
