"""NumPy reference (test oracle) of biased_rps, written from the rules in README.md.

Vectorised over replicas E; agents are row (0) and column (1). `step` never
resets (the caller decides what a finished replica does next). The payoff
comes from the matrix of `equilibrium.payoff_matrix`, not from env.py's rule.

State format: timestep : (E,) int32
"""
from __future__ import annotations

import numpy as np

from .equilibrium import payoff_matrix

STATE_KEYS = ("timestep",)


def reset(config, num_envs: int):
    state = {"timestep": np.zeros(num_envs, dtype=np.int32)}
    return state, observe(config, state)


def observe(config, state) -> np.ndarray:
    """(E, 2, 2) float32: [1, timestep / rounds] for both players."""
    t = np.asarray(state["timestep"]).astype(np.float32) / np.float32(config.rounds)
    obs = np.stack([np.ones_like(t), t], axis=-1)
    return np.repeat(obs[:, None, :], 2, axis=1).astype(np.float32)


def step(config, state, actions):
    """One play of every replica under `actions` (E, 2) or (E, 2, 1). Returns
    (next_state, obs, reward, terminated, truncated)."""
    actions = np.asarray(actions).reshape(len(state["timestep"]), 2)
    matrix = payoff_matrix(config).astype(np.float32)
    row = matrix[actions[:, 0], actions[:, 1]]
    reward = np.stack([row, -row], axis=-1).astype(np.float32)
    timestep = np.asarray(state["timestep"], dtype=np.int32) + 1
    nxt = {"timestep": timestep}
    terminated = timestep >= config.rounds
    return nxt, observe(config, nxt), reward, terminated, np.zeros_like(terminated)


def check_env_reference(config):
    """This reference in `gpusim.check.check_env`'s protocol: `(state, actions) -> step(...)`."""
    def reference(state, actions):
        return step(config, state, actions)
    return reference
