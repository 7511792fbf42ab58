"""NumPy reference (test oracle) of tag_gridworld, written from the rules in README.md.

Vectorised over replicas: every function takes and returns arrays with a
leading replica axis E. Agents are ordered taggers 0..N-1, then the runner
(column N). The RNG is not modelled: `reset` takes the runner's corner
draws, `step` takes the actions, and a step never resets (the caller
decides what a finished replica does next).

State format, for E replicas and A = N + 1 agents:
    pos_x, pos_y : (E, A) int32 cells, 0 <= value < grid_size
    timestep     : (E,)   int32
"""
from __future__ import annotations

import numpy as np

STATE_KEYS = ("pos_x", "pos_y", "timestep")

# action -> (dx, dy): stay, +x, -x, +y, -y
MOVES = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], dtype=np.int64)

__all__ = ["STATE_KEYS", "MOVES", "corner_cells", "reset", "observe", "step"]


def corner_cells(config) -> np.ndarray:
    """(4, 2) cells of the corners in draw order: (0,0), (G-1,0), (0,G-1), (G-1,G-1)."""
    far = config.grid_size - 1
    return np.array([[0, 0], [far, 0], [0, far], [far, far]], dtype=np.int32)


def reset(config, corners):
    """Initial states given each replica's corner draw in 0..3; returns (state, obs)."""
    corners = np.asarray(corners, dtype=np.int64)
    if corners.ndim != 1 or (corners.size and (corners.min() < 0 or corners.max() > 3)):
        raise ValueError("corners must be a 1-d array of values in 0..3")
    E, N = corners.shape[0], config.num_taggers
    pos = np.full((E, N + 1, 2), config.grid_size // 2, dtype=np.int32)
    pos[:, N] = corner_cells(config)[corners]
    state = {"pos_x": np.ascontiguousarray(pos[..., 0]),
             "pos_y": np.ascontiguousarray(pos[..., 1]),
             "timestep": np.zeros(E, dtype=np.int32)}
    return state, observe(config, state)


def observe(config, state) -> np.ndarray:
    """(E, A, 2N + 6) float32 observations of `state`."""
    N = config.num_taggers
    pos = np.stack([np.asarray(state["pos_x"]), np.asarray(state["pos_y"])], axis=-1)
    pos = pos.astype(np.int64)                       # (E, A, 2)
    E, A = pos.shape[:2]
    span = np.float32(config.grid_size - 1)
    own = pos[:, :, None, :]                         # (E, A, 1, 2)
    runner_offset = pos[:, None, N:N + 1, :] - own   # (E, A, 1, 2)
    tagger_offsets = pos[:, None, :N, :] - own       # (E, A, N, 2)

    def scaled(cells):
        return cells.astype(np.float32) / span

    is_tagger = (np.arange(A) < N).astype(np.float32)
    clock = np.asarray(state["timestep"]).astype(np.float32) / np.float32(config.episode_length)
    parts = [
        scaled(pos),                                       # own position
        scaled(runner_offset).reshape(E, A, 2),            # runner - own
        scaled(tagger_offsets).reshape(E, A, 2 * N),       # x0, y0, x1, y1, ...
        np.broadcast_to(is_tagger[None, :, None], (E, A, 1)),
        np.broadcast_to(clock[:, None, None], (E, A, 1)),
    ]
    obs = np.concatenate(parts, axis=-1).astype(np.float32)
    assert obs.shape[-1] == 2 * N + 6
    return obs


def step(config, state, actions):
    """One step of every replica from `state` under `actions` (E, A) or (E, A, 1).

    Returns (next_state, obs, reward, terminated, truncated); the inputs are
    not modified. `next_state` and `obs` are those right after the step,
    before any reset.
    """
    N = config.num_taggers
    G = config.grid_size
    f32 = np.float32
    x = np.array(state["pos_x"], dtype=np.int64)
    y = np.array(state["pos_y"], dtype=np.int64)
    E, A = x.shape
    if A != N + 1:
        raise ValueError(f"state has {A} agents, config has {N + 1}")
    actions = np.asarray(actions).reshape(E, A)
    if actions.size and (actions.min() < 0 or actions.max() >= len(MOVES)):
        raise ValueError(f"actions must lie in 0..{len(MOVES) - 1}")

    # 1. simultaneous moves; off-grid moves are cancelled and penalised
    want_x = x + MOVES[actions, 0]
    want_y = y + MOVES[actions, 1]
    on_grid = (want_x >= 0) & (want_x < G) & (want_y >= 0) & (want_y < G)
    x = np.where(on_grid, want_x, x)
    y = np.where(on_grid, want_y, y)
    wall_term = np.where(on_grid, f32(0.0), f32(config.wall_penalty)).astype(f32)

    # 2. clock and tag check
    timestep = np.asarray(state["timestep"]).astype(np.int64) + 1
    tagged = ((x[:, :N] == x[:, N:]) & (y[:, :N] == y[:, N:])).any(axis=1)

    # 3. outcome terms, flags
    taggers = np.where(tagged, f32(config.tag_reward), f32(config.step_penalty_tagger))
    runner = np.where(tagged, f32(config.tag_penalty), f32(config.step_reward_runner))
    outcome = np.concatenate([np.repeat(taggers[:, None], N, axis=1), runner[:, None]],
                             axis=1).astype(f32)
    reward = (wall_term + outcome).astype(f32)
    terminated = tagged
    truncated = ~tagged & (timestep >= config.episode_length)

    next_state = {"pos_x": x.astype(np.int32), "pos_y": y.astype(np.int32),
                  "timestep": timestep.astype(np.int32)}
    return next_state, observe(config, next_state), reward, terminated, truncated
