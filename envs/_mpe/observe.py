"""Writing an agent's observation row, piece by piece, in mpe2's order.

Each helper writes entries `k, k + 1, ...` of `obs[env, agent]` and returns the
next free index, so a scenario's `observe` reads as mpe2's `np.concatenate`:

    k = put_own_motion(s, env, agent, 0)          # [self_vel, self_pos]
    k = put_landmarks(s, env, agent, k, 0, L)     # landmark_rel_positions
    k = put_others(s, env, agent, k)              # other_agent_rel_positions
    fill_zeros(s, env, agent, k)                  # the rest of the row (a policy that
                                                  # observes fewer entries than the widest)

`nearest` selects mpe2's partial observation (`num_agent_neighbors`,
`num_landmark_neighbors`): the n nearest entities, closest first, into the
agent's scratch row `near` (-1 where fewer exist).
"""
from .compile import jit
from .physics import ZERO


@jit
def put(s, env, agent, k, value):
    s.obs[env, agent, k] = value
    return k + 1


@jit
def put_pair(s, env, agent, k, x, y):
    s.obs[env, agent, k] = x
    s.obs[env, agent, k + 1] = y
    return k + 2


@jit
def put_zeros(s, env, agent, k, count):
    for j in range(k, k + count):
        s.obs[env, agent, j] = ZERO
    return k + count


@jit
def fill_zeros(s, env, agent, k):
    """Zeros from entry k to the end of the row."""
    put_zeros(s, env, agent, k, s.obs.shape[2] - k)


@jit
def put_velocity(s, env, agent, k, of):
    return put_pair(s, env, agent, k, s.vel[env, of, 0], s.vel[env, of, 1])


@jit
def put_own_motion(s, env, agent, k):
    """[self_vel, self_pos]."""
    k = put_velocity(s, env, agent, k, agent)
    return put_pair(s, env, agent, k, s.pos[env, agent, 0], s.pos[env, agent, 1])


@jit
def put_landmark(s, env, agent, k, landmark):
    """One landmark's position relative to the agent."""
    return put_pair(s, env, agent, k, s.landmark_pos[env, landmark, 0] - s.pos[env, agent, 0],
                    s.landmark_pos[env, landmark, 1] - s.pos[env, agent, 1])


@jit
def put_landmarks(s, env, agent, k, first, count):
    for landmark in range(first, first + count):
        k = put_landmark(s, env, agent, k, landmark)
    return k


@jit
def put_other(s, env, agent, k, other):
    """Another agent's position relative to this one."""
    return put_pair(s, env, agent, k, s.pos[env, other, 0] - s.pos[env, agent, 0],
                    s.pos[env, other, 1] - s.pos[env, agent, 1])


@jit
def put_others(s, env, agent, k):
    """Every other agent's relative position, in id order."""
    for other in range(s.pos.shape[1]):
        if other != agent:
            k = put_other(s, env, agent, k, other)
    return k


@jit
def put_landmark_color(s, env, agent, k, landmark):
    """A landmark's colour, from the scenario's `landmark_color` table (landmarks x width)."""
    for channel in range(s.landmark_color.shape[1]):
        k = put(s, env, agent, k, s.landmark_color[landmark, channel])
    return k


@jit
def put_comm(s, env, agent, k, of, width):
    for j in range(width):
        s.obs[env, agent, k + j] = s.comm[env, of, j]
    return k + width


# ---- partial observation: the n nearest ------------------------------------------------
@jit
def nearest(s, env, agent, n, landmarks):
    """The n nearest other agents (or landmarks), closest first (ties to the lower id),
    into s.near[env, agent, :n]; -1 in the slots beyond the candidates. Returns how many."""
    x = s.pos[env, agent, 0]
    y = s.pos[env, agent, 1]
    count = 0
    candidates = s.landmark_pos.shape[1] if landmarks else s.pos.shape[1]
    for other in range(candidates):
        if not landmarks and other == agent:
            continue
        if landmarks:
            dx = s.landmark_pos[env, other, 0] - x
            dy = s.landmark_pos[env, other, 1] - y
        else:
            dx = s.pos[env, other, 0] - x
            dy = s.pos[env, other, 1] - y
        d = dx * dx + dy * dy
        if count < n:
            slot = count
            count += 1
        elif d < s.near_dist[env, agent, n - 1]:
            slot = n - 1
        else:
            continue
        while slot > 0 and s.near_dist[env, agent, slot - 1] > d:
            s.near[env, agent, slot] = s.near[env, agent, slot - 1]
            s.near_dist[env, agent, slot] = s.near_dist[env, agent, slot - 1]
            slot -= 1
        s.near[env, agent, slot] = other
        s.near_dist[env, agent, slot] = d
    for slot in range(count, n):
        s.near[env, agent, slot] = -1
    return count


@jit
def put_nearest_landmarks(s, env, agent, k, n):
    """mpe2's padded_relative_positions over the landmarks (n slots, zero padded)."""
    found = nearest(s, env, agent, n, True)
    for slot in range(found):
        k = put_landmark(s, env, agent, k, s.near[env, agent, slot])
    return put_zeros(s, env, agent, k, 2 * (n - found))


@jit
def put_nearest_others(s, env, agent, k, n):
    """mpe2's padded_relative_positions over the other agents; s.near keeps the selection
    for what follows (their velocities, their comm)."""
    found = nearest(s, env, agent, n, False)
    for slot in range(found):
        k = put_other(s, env, agent, k, s.near[env, agent, slot])
    return put_zeros(s, env, agent, k, 2 * (n - found))



@jit
def put_seen_landmarks(s, env, agent, k, p):
    """Every landmark, or the p.landmark_neighbors nearest where that is set (> 0)."""
    if p.landmark_neighbors > 0:
        return put_nearest_landmarks(s, env, agent, k, p.landmark_neighbors)
    return put_landmarks(s, env, agent, k, 0, s.landmark_pos.shape[1])


@jit
def put_seen_others(s, env, agent, k, p):
    """Every other agent, or the p.agent_neighbors nearest where that is set (> 0)."""
    if p.agent_neighbors > 0:
        return put_nearest_others(s, env, agent, k, p.agent_neighbors)
    return put_others(s, env, agent, k)
