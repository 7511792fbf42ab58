"""Plain NumPy reference implementation (test oracle) of tag_continuous.

Written directly from the rules (README.md in this folder), with
simple per-replica / per-agent Python loops; it is meant to be obviously
correct, not fast.  All arithmetic is done in float32.

State format: a dict of numpy arrays for E replicas and N agents:
    loc_x, loc_y, speed, direction, acceleration : (E, N) float32
    still_in_game, agent_type                    : (E, N) int32 (agent_type 1 = tagger)
    num_runners_left, timestep                   : (E,)   int32

Actions: (E, N, 2). Discrete (the default): integer indices into the
acceleration and turn tables. With `config.continuous_actions`: floats, the
acceleration change and the turn themselves, taken in float32 and clipped
to [min_acceleration, max_acceleration] and [min_turn, max_turn].
"""
from __future__ import annotations

import math

import numpy as np

from .config import TagContinuousConfig

STATE_KEYS = ("loc_x", "loc_y", "speed", "direction", "acceleration",
              "still_in_game", "agent_type", "num_runners_left", "timestep")

_F32_KEYS = ("loc_x", "loc_y", "speed", "direction", "acceleration")
_I32_KEYS = ("still_in_game", "agent_type", "num_runners_left", "timestep")

F32 = np.float32
TWO_PI = F32(2.0 * np.pi)
ZERO = F32(0.0)
NUM_FEATURES = 7
NUM_OWN_FEATURES = 5  # with observe_own_state: x/L, y/L, cos, sin of heading, speed/max_speed

__all__ = ["STATE_KEYS", "TWO_PI", "obs_dim", "action_tables", "action_changes", "observe",
           "step", "TagContinuousConfig"]


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------
def _num_slots(config) -> int:
    """Number of neighbour slots per feature block."""
    if config.use_full_observation:
        return config.num_taggers + config.num_runners - 1
    return config.num_other_agents_observed


def obs_dim(config) -> int:
    """7K+1 for partial observation, 7(N-1)+1 for full observation; 5 more with
    observe_own_state."""
    own = NUM_OWN_FEATURES if config.observe_own_state else 0
    return NUM_FEATURES * _num_slots(config) + own + 1


def _table(lo, hi, n) -> np.ndarray:
    table = np.zeros(n + 1, dtype=np.float32)
    table[1:] = np.linspace(lo, hi, n).astype(np.float32)
    return table


def action_tables(config):
    """(acc_table, turn_table): float32, index 0 = 0.0, 1..n = linspace(min, max, n)."""
    acc = _table(config.min_acceleration, config.max_acceleration,
                 config.num_acceleration_levels)
    turn = _table(config.min_turn, config.max_turn, config.num_turn_levels)
    return acc, turn


def action_changes(config, actions) -> tuple[np.ndarray, np.ndarray]:
    """(acceleration change, turn) per agent, float32 (E, N) each, from (E, N, 2) actions.

    Discrete: table lookups of the indices (out of range is an error).
    Continuous: the floats in float32, clipped into [min, max] (NaN or inf is an error).
    """
    actions = np.asarray(actions)
    if config.continuous_actions:
        values = actions.astype(np.float32)
        if not np.isfinite(values).all():
            raise ValueError("continuous actions must be finite")
        bounds = ((config.min_acceleration, config.max_acceleration),
                  (config.min_turn, config.max_turn))
        return tuple(np.clip(values[..., col], F32(lo), F32(hi)).astype(np.float32)
                     for col, (lo, hi) in enumerate(bounds))
    acc_table, turn_table = action_tables(config)
    changes = []
    for table, col, name in ((acc_table, 0, "acceleration"), (turn_table, 1, "turn")):
        a = actions[..., col]
        if a.size and (a.min() < 0 or a.max() >= len(table)):
            raise ValueError(f"{name} action index out of range 0..{len(table) - 1}")
        changes.append(table[a.astype(np.int64)])
    return tuple(changes)


def _copy_state(state) -> dict:
    out = {}
    for key in _F32_KEYS:
        out[key] = np.array(state[key], dtype=np.float32, copy=True)
    for key in _I32_KEYS:
        out[key] = np.array(state[key], dtype=np.int32, copy=True)
    E, N = out["loc_x"].shape
    for key in _F32_KEYS + ("still_in_game", "agent_type"):
        if out[key].shape != (E, N):
            raise ValueError(f"state[{key!r}] must have shape {(E, N)}, got {out[key].shape}")
    for key in ("num_runners_left", "timestep"):
        if out[key].shape != (E,):
            raise ValueError(f"state[{key!r}] must have shape {(E,)}, got {out[key].shape}")
    return out


def _dist(dx, dy):
    dx = F32(dx)
    dy = F32(dy)
    return F32(np.sqrt(dx * dx + dy * dy))


# ----------------------------------------------------------------------------
# observation
# ----------------------------------------------------------------------------
def _observe_one(config, s, e, i, K, pos_norm, vel_norm, t_frac) -> np.ndarray:
    """Observation row of agent i in replica e (state s, already float32)."""
    row = np.zeros(obs_dim(config), dtype=np.float32)
    if s["still_in_game"][e, i] == 0:
        return row  # out of the game: everything zero, timestep float included
    N = s["loc_x"].shape[1]
    xi, yi = s["loc_x"][e, i], s["loc_y"][e, i]
    heading = s["direction"][e, i]
    cos_t, sin_t = F32(np.cos(heading)), F32(np.sin(heading))

    if config.use_full_observation:
        # every other agent, in id order, whether or not it is still in the game
        slots = [j for j in range(N) if j != i]
    else:
        candidates = []
        for j in range(N):
            if j == i or s["still_in_game"][e, j] == 0:
                continue
            d = _dist(s["loc_x"][e, j] - xi, s["loc_y"][e, j] - yi)
            candidates.append((float(d), j))
        candidates.sort()  # by (distance, id): ties go to the lower id
        slots = [j for _, j in candidates[:K]]

    for k, j in enumerate(slots):
        dx, dy = F32(s["loc_x"][e, j] - xi), F32(s["loc_y"][e, j] - yi)
        if config.observe_in_own_frame:  # (forward, left) along the observer's heading
            dx, dy = (F32(F32(dx * cos_t) + F32(dy * sin_t)),
                      F32(F32(dy * cos_t) - F32(dx * sin_t)))
        feats = (
            dx / pos_norm,
            dy / pos_norm,
            (s["speed"][e, j] - s["speed"][e, i]) / vel_norm,
            (s["acceleration"][e, j] - s["acceleration"][e, i]) / vel_norm,
            (s["direction"][e, j] - s["direction"][e, i]) / TWO_PI,
            F32(1.0) if s["agent_type"][e, j] == 1 else ZERO,
            F32(1.0) if s["still_in_game"][e, j] != 0 else ZERO,
        )
        for f, value in enumerate(feats):
            row[f * K + k] = F32(value)
    if config.observe_own_state:  # after the seven blocks, before the timestep
        L = F32(config.grid_length)
        own = (xi / L, yi / L, cos_t, sin_t, s["speed"][e, i] / vel_norm)
        row[NUM_FEATURES * K:NUM_FEATURES * K + NUM_OWN_FEATURES] = [F32(v) for v in own]
    row[-1] = t_frac
    return row


def observe(config, state) -> np.ndarray:
    """(E, N, obs_dim) float32 observation of `state`, using state['timestep']."""
    s = _copy_state(state)
    E, N = s["loc_x"].shape
    K = _num_slots(config)
    pos_norm = F32(math.sqrt(2.0)) * F32(config.grid_length)
    vel_norm = F32(config.max_speed) + F32(1e-10)
    ep_len = F32(config.episode_length)
    obs = np.zeros((E, N, obs_dim(config)), dtype=np.float32)
    for e in range(E):
        t_frac = F32(F32(s["timestep"][e]) / ep_len)
        for i in range(N):
            obs[e, i] = _observe_one(config, s, e, i, K, pos_norm, vel_norm, t_frac)
    return obs


# ----------------------------------------------------------------------------
# step
# ----------------------------------------------------------------------------
def step(config, state, actions):
    """One step t -> t+1 for every replica.

    Returns (next_state, obs, reward, terminated, truncated); `state` and
    `actions` are not modified.
    """
    s = _copy_state(state)
    E, N = s["loc_x"].shape
    actions = np.asarray(actions)
    if actions.shape != (E, N, 2):
        raise ValueError(f"actions must have shape {(E, N, 2)}, got {actions.shape}")
    acc_change, turn_change = action_changes(config, actions)

    L = F32(config.grid_length)
    vmax_tagger = F32(config.max_speed) * F32(config.skill_level_tagger)
    vmax_runner = F32(config.max_speed) * F32(config.skill_level_runner)
    edge_penalty = F32(config.edge_hit_penalty)
    tag_threshold = F32(config.tagging_distance) * L
    ep_len = config.episode_length

    reward = np.zeros((E, N), dtype=np.float32)
    terminated = np.zeros(E, dtype=bool)
    truncated = np.zeros(E, dtype=bool)

    for e in range(E):
        t_next = int(s["timestep"][e]) + 1
        in_game_at_start = s["still_in_game"][e].copy()
        hit_edge = np.zeros(N, dtype=bool)

        # --- steps 1-4: movement -------------------------------------------
        for i in range(N):
            alive = F32(s["still_in_game"][e, i])

            # 1. direction
            d = F32(s["direction"][e, i] + turn_change[e, i])
            s["direction"][e, i] = F32(np.mod(d, TWO_PI)) * alive

            # 2. acceleration
            acc = F32(s["acceleration"][e, i] + acc_change[e, i])

            # 3. speed
            vmax = vmax_tagger if s["agent_type"][e, i] == 1 else vmax_runner
            speed = F32(np.clip(F32(s["speed"][e, i] + acc), ZERO, vmax)) * alive
            speed = F32(speed)
            if not (ZERO < speed < vmax):
                acc = ZERO
            s["speed"][e, i] = speed
            s["acceleration"][e, i] = acc

            # 4. move, clip to the square, remember edge hits
            direction = s["direction"][e, i]
            x = F32(s["loc_x"][e, i] + speed * F32(np.cos(direction)))
            y = F32(s["loc_y"][e, i] + speed * F32(np.sin(direction)))
            if x < ZERO or x > L or y < ZERO or y > L:
                hit_edge[i] = True
            s["loc_x"][e, i] = F32(min(max(x, ZERO), L))
            s["loc_y"][e, i] = F32(min(max(y, ZERO), L))

        s["timestep"][e] = t_next

        # --- step 6: rewards and tagging -----------------------------------
        for i in range(N):
            if in_game_at_start[i] == 0:
                continue
            r = edge_penalty if hit_edge[i] else ZERO
            if s["agent_type"][e, i] == 1:
                r = F32(r + F32(config.step_penalty_for_tagger))
            else:
                r = F32(r + F32(config.step_reward_for_runner))
            reward[e, i] = r

        taggers = [j for j in range(N) if s["agent_type"][e, j] == 1]
        for i in range(N):  # runners in increasing id order
            if s["agent_type"][e, i] == 1 or s["still_in_game"][e, i] == 0:
                continue
            best_j, best_d = -1, None
            for j in taggers:  # increasing id: strict '<' keeps the lower id on ties
                d = _dist(s["loc_x"][e, j] - s["loc_x"][e, i],
                          s["loc_y"][e, j] - s["loc_y"][e, i])
                if best_d is None or d < best_d:
                    best_j, best_d = j, d
            if best_j >= 0 and best_d < tag_threshold:
                reward[e, i] = F32(reward[e, i] + F32(config.tag_penalty_for_runner))
                reward[e, best_j] = F32(reward[e, best_j] + F32(config.tag_reward_for_tagger))
                if config.runner_exits_game_after_tagged:
                    s["still_in_game"][e, i] = 0
                    s["num_runners_left"][e] -= 1

        # --- step 7: end-of-game reward ------------------------------------
        if t_next == ep_len:
            for i in range(N):
                if s["agent_type"][e, i] == 0 and s["still_in_game"][e, i] != 0:
                    reward[e, i] = F32(reward[e, i]
                                       + F32(config.end_of_game_reward_for_runner))

        # --- step 8: done flags ----------------------------------------------
        terminated[e] = s["num_runners_left"][e] == 0
        truncated[e] = (t_next >= ep_len) and not terminated[e]

    # --- step 5: observation after moves, before tagging, timestep t+1 ------
    # (tagging only changes still_in_game / num_runners_left, so rebuild that view)
    pre_tag = {k: v for k, v in s.items()}
    pre_tag["still_in_game"] = np.array(state["still_in_game"], dtype=np.int32, copy=True)
    obs = observe(config, pre_tag)

    return s, obs, reward, terminated, truncated


def check_env_reference(config):
    """This reference in `gpusim.check.check_env`'s protocol: `(state, actions) -> step(...)`.

        check_env(env, reference=check_env_reference(env.config))
    """
    def reference(state, actions):
        return step(config, state, actions)
    return reference
