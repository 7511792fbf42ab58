"""Shared by the classic-control references: step gymnasium's own env once per replica
from an injected state, in `gpusim.check.check_env`'s reference protocol.

Each env's `reference.py` builds its gymnasium env with the config's constants
and says how a replica's state and action are handed to it; the stepping,
the bookkeeping of flags and truncation, and the result arrays are here.
"""
from __future__ import annotations

import numpy as np


def step_replicas(gym, state, actions, physics, obs_dim, max_episode_steps, discrete,
                  load_state=None):
    """One step of every replica of one-agent `state`, without reset.

    `physics`: the state keys gymnasium's `gym.state` holds, in its order;
    `actions` (E, 1, 1): choice indices (`discrete`) or float32 values handed
    over unclipped; `load_state(state, e)`: replica e's `gym.state` (default:
    float64). Returns (next_state, obs (E, 1, obs_dim) float32, reward (E, 1)
    float32, terminated, truncated); next_state holds gymnasium's state after
    the step, as float64, and the timestep.
    """
    actions = np.asarray(actions) if discrete else np.asarray(actions, dtype=np.float32)
    num_envs = len(state[physics[0]])
    if actions.shape != (num_envs, 1, 1):
        raise ValueError(f"actions must have shape {(num_envs, 1, 1)}, got {actions.shape}")
    obs = np.zeros((num_envs, 1, obs_dim), dtype=np.float32)
    reward = np.zeros((num_envs, 1), dtype=np.float32)
    terminated = np.zeros(num_envs, dtype=bool)
    truncated = np.zeros(num_envs, dtype=bool)
    next_state = {k: np.zeros(num_envs, dtype=np.float64) for k in physics}
    timestep = np.asarray(state["timestep"], dtype=np.int32) + 1
    for e in range(num_envs):
        gym.state = load_state(state, e) if load_state is not None \
            else np.array([state[k][e] for k in physics], dtype=np.float64)
        action = int(actions[e, 0, 0]) if discrete else actions[e, 0]
        obs[e, 0], reward[e, 0], terminated[e], _, _ = gym.step(action)
        for i, k in enumerate(physics):
            next_state[k][e] = gym.state[i]
        truncated[e] = (not terminated[e]) and timestep[e] >= max_episode_steps
    next_state["timestep"] = timestep
    return next_state, obs, reward, terminated, truncated
