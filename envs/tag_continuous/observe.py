"""tag_continuous's observation phase (README.md in this folder, "Observation").

Computed from the state after moves and before tagging. The default is
WarpDrive's: seven neighbour blocks, then the timestep. Two opt-in config keys
change it: `observe_own_state` (params `own_state`) appends five floats about
the agent itself before the timestep, and `observe_in_own_frame` (`own_frame`)
rotates the Δx, Δy blocks into the observer's frame (forward, left). With
both off, no new arithmetic runs, so the default stays bit for bit.
"""
import math

import numba
import numpy as np

TWO_PI = np.float32(2 * np.pi)
F32_ZERO = np.float32(0.0)
F32_ONE = np.float32(1.0)
FEATURES = 7  # dx, dy, dspeed, dacceleration, ddirection, is_tagger, still_in_game
OWN_FEATURES = 5  # x / L, y / L, cos(direction), sin(direction), speed / max_speed


@numba.jit(nopython=True)
def write_features(s, p, env, agent, other, column, width, cos_t, sin_t):
    """Neighbour `other` as column `column` of the seven feature blocks of `width`.

    (cos_t, sin_t): the observer's heading, used only with `p.observe_in_own_frame`."""
    row = s.obs
    dx = s.loc_x[env, other] - s.loc_x[env, agent]
    dy = s.loc_y[env, other] - s.loc_y[env, agent]
    if p.observe_in_own_frame:  # forward, left: the offset as seen along the observer's heading
        dx, dy = dx * cos_t + dy * sin_t, dy * cos_t - dx * sin_t
    row[env, agent, column] = dx / p.position_scale
    row[env, agent, width + column] = dy / p.position_scale
    row[env, agent, 2 * width + column] = (s.speed[env, other] - s.speed[env, agent]) / p.speed_scale
    row[env, agent, 3 * width + column] = (
        (s.acceleration[env, other] - s.acceleration[env, agent]) / p.speed_scale)
    row[env, agent, 4 * width + column] = (s.direction[env, other] - s.direction[env, agent]) / TWO_PI
    row[env, agent, 5 * width + column] = numba.float32(s.agent_type[env, other])
    row[env, agent, 6 * width + column] = numba.float32(s.still_in_game[env, other])


@numba.jit(nopython=True)
def write_own_state(s, p, env, agent, first, cos_t, sin_t):
    """The agent's own position, heading and speed as five floats from index `first`."""
    row = s.obs
    row[env, agent, first] = s.loc_x[env, agent] / p.grid_length
    row[env, agent, first + 1] = s.loc_y[env, agent] / p.grid_length
    row[env, agent, first + 2] = cos_t
    row[env, agent, first + 3] = sin_t
    row[env, agent, first + 4] = s.speed[env, agent] / p.speed_scale


@numba.jit(nopython=True)
def squared_distance(s, env, a, b):
    dx = s.loc_x[env, b] - s.loc_x[env, a]
    dy = s.loc_y[env, b] - s.loc_y[env, a]
    return dx * dx + dy * dy


@numba.jit(nopython=True)
def previous_bound(s, p, env, agent):
    """An upper bound on the K-th smallest squared distance, or inf.

    Last step's K neighbours (distinct ids, -1 where none) that are still in
    the game are K candidates, so the K-th nearest is no farther than the
    farthest of them. Slightly inflated so that a candidate whose distance
    rounds to the same float32 square root is never screened out.
    """
    bound = np.float32(0.0)
    for k in range(p.num_other_agents_observed):
        other = s.nbr_idx[env, agent, k]
        if other < 0 or other == agent or s.still_in_game[env, other] == 0:
            return np.float32(np.inf)
        bound = max(bound, squared_distance(s, env, agent, other))
    return bound * np.float32(1.000001)


@numba.jit(nopython=True)
def nearest_in_game(s, p, env, agent):
    """Sorted list (distance, then id) of the K nearest other agents in the game; its size.

    Candidates come in increasing id, so a tie with the current K-th never
    displaces it. A squared-distance bound screens out most candidates before
    any square root or insertion (sqrt is monotonic, so it never drops one
    that belongs in the list).
    """
    k_max = p.num_other_agents_observed
    screen = previous_bound(s, p, env, agent)
    count = 0
    worst = np.float32(np.inf)  # distance of the K-th entry once the list is full
    for other in range(s.loc_x.shape[1]):
        if other == agent or s.still_in_game[env, other] == 0:
            continue
        d_sq = squared_distance(s, env, agent, other)
        if d_sq > screen:
            continue
        d = math.sqrt(d_sq)
        if count < k_max:
            slot = count
            count += 1
        elif d < worst:
            slot = k_max - 1
        else:
            continue
        while slot > 0 and s.nbr_dist[env, agent, slot - 1] > d:
            s.nbr_dist[env, agent, slot] = s.nbr_dist[env, agent, slot - 1]
            s.nbr_idx[env, agent, slot] = s.nbr_idx[env, agent, slot - 1]
            slot -= 1
        s.nbr_dist[env, agent, slot] = d
        s.nbr_idx[env, agent, slot] = other
        if count == k_max:
            worst = s.nbr_dist[env, agent, k_max - 1]
            screen = min(screen, squared_distance(s, env, agent, s.nbr_idx[env, agent, k_max - 1])
                         * np.float32(1.000001))
    for k in range(count, k_max):
        s.nbr_idx[env, agent, k] = -1
    return count


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    """Spec observation, from the state after moves and before tagging."""
    obs_dim = s.obs.shape[2]
    if s.still_in_game[env, agent] == 0:
        for k in range(obs_dim):
            s.obs[env, agent, k] = F32_ZERO
        return
    own = OWN_FEATURES if p.observe_own_state else 0
    width = (obs_dim - 1 - own) // FEATURES  # neighbour slots per block
    cos_t, sin_t = F32_ONE, F32_ZERO  # the heading, computed only where an option reads it
    if p.observe_own_state or p.observe_in_own_frame:
        direction = s.direction[env, agent]
        cos_t, sin_t = math.cos(direction), math.sin(direction)
    if p.use_full_observation:
        column = 0
        for other in range(s.loc_x.shape[1]):
            if other != agent:
                write_features(s, p, env, agent, other, column, width, cos_t, sin_t)
                column += 1
    else:
        count = nearest_in_game(s, p, env, agent)
        for column in range(count):
            write_features(s, p, env, agent, s.nbr_idx[env, agent, column], column, width,
                           cos_t, sin_t)
        for column in range(count, width):
            for f in range(FEATURES):
                s.obs[env, agent, f * width + column] = F32_ZERO
    if p.observe_own_state:
        write_own_state(s, p, env, agent, FEATURES * width, cos_t, sin_t)
    s.obs[env, agent, obs_dim - 1] = numba.float32(s.timestep[env]) / p.episode_length_f
