"""mpe2's particle world (`_mpe_utils/core.py`, `simple_env.py`) as portable phases.

One step, as mpe2's `World.step` after `SimpleEnv._set_action`:

1. `discrete_forces` / `continuous_forces` (agent): the action becomes the
   agent's control force `u` (times its `accel`, mpe2's sensitivity, 5 by
   default) and its utterance `comm`; then the contact forces of every other
   colliding entity are added, agents first, then landmarks, in id order (the
   order in which mpe2 sums them for that entity);
2. `integrate` (agent, movable agents only): `pos += vel * dt`, then
   `vel = vel * (1 - damping) + force / mass * dt`, then the speed is
   limited to `max_speed`;
3. `tick` (env): the step counter, truncation at `max_cycles`.

Each thread writes only its own agent's entries; landmarks never move
(no scenario makes one movable), so they are per-replica state that only
the reset writes. Everything is float32.

Arrays every scenario has (`world.ParticleEnv.array_specs`): `pos`, `vel`
(agent, (2,)), `landmark_pos` (env, (L, 2)), `timestep` (env), scratch
`force` (agent, (2,)) and `comm` (agent, (max(dim_c, 1),)), and three
constant tables whose columns are named below: `agent_body` (N x 4 float32),
`agent_flags` (N x 3 int32) and `landmark_body` (L x 3 float32). Few arrays
keep kernels quick to compile: on a GPU every call of a phase or helper
passes them all (on the CPU, one pointer to them: gpusim.backends.cpu_refs).
"""
import math

import numpy as np

from gpusim import rng

from .compile import jit

# columns of the constant tables, in the order world.py fills them
AGENT_BODY = ("size", "accel", "mass", "max_speed")   # float32; max_speed inf for none
SIZE, ACCEL, MASS, MAX_SPEED = range(4)
AGENT_FLAGS = ("movable", "silent", "collide")        # int32 0 / 1
MOVABLE, SILENT, COLLIDE = range(3)
LANDMARK_BODY = ("size", "spawn", "collide")          # float32; collide 0.0 / 1.0
SPAWN = 1                                             # (SIZE and COLLIDE as above)

ZERO = np.float32(0.0)
ONE = np.float32(1.0)
TWO = np.float32(2.0)
MOVES = 5  # mpe2's movement choices: no-op, -x, +x, -y, +y


# ---- reset ------------------------------------------------------------------------
@jit
def spawn_uniform(s, env, agent, half_width):
    """A float32 uniform in [-half_width, half_width), from the agent's stream."""
    return (rng.uniform(s.rng_state, env, agent) * TWO - ONE) * half_width


@jit
def spawn(env, agent, s, p):
    """The agent at rest, uniform in [-1, 1)^2, silent; landmarks agent, agent + N, ... are
    placed by this thread, uniform in [-spawn, spawn)^2 (1 or 0.9, as the scenario says)."""
    s.pos[env, agent, 0] = spawn_uniform(s, env, agent, ONE)
    s.pos[env, agent, 1] = spawn_uniform(s, env, agent, ONE)
    s.vel[env, agent, 0] = ZERO
    s.vel[env, agent, 1] = ZERO
    for k in range(s.comm.shape[2]):
        s.comm[env, agent, k] = ZERO
    for landmark in range(agent, s.landmark_pos.shape[1], s.pos.shape[1]):
        half = s.landmark_body[landmark, SPAWN]
        s.landmark_pos[env, landmark, 0] = spawn_uniform(s, env, agent, half)
        s.landmark_pos[env, landmark, 1] = spawn_uniform(s, env, agent, half)


@jit
def start_clock(env, s, p):
    s.timestep[env] = 0


# ---- step -------------------------------------------------------------------------
@jit
def discrete_forces(env, agent, s, p):
    """mpe2's discrete action: one integer, `move + 5 * word` for a movable agent that
    speaks, `move` for a silent one, `word` for one that cannot move."""
    choice = s.actions[env, agent, 0]
    ux = ZERO
    uy = ZERO
    if s.agent_flags[agent, MOVABLE]:
        move = choice % MOVES
        choice = choice // MOVES
        if move == 1:
            ux = -s.agent_body[agent, ACCEL]
        elif move == 2:
            ux = s.agent_body[agent, ACCEL]
        elif move == 3:
            uy = -s.agent_body[agent, ACCEL]
        elif move == 4:
            uy = s.agent_body[agent, ACCEL]
    speaks = not s.agent_flags[agent, SILENT]
    for k in range(p.dim_c):
        s.comm[env, agent, k] = ONE if speaks and k == choice else ZERO
    apply_forces(env, agent, s, p, ux, uy)


@jit
def continuous_forces(env, agent, s, p):
    """mpe2's continuous action, already clipped to [0, 1]: (no-op, -x, +x, -y, +y) for a
    movable agent, u = (a[2] - a[1], a[4] - a[3]) * accel; then the utterance itself."""
    ux = ZERO
    uy = ZERO
    first = 0
    if s.agent_flags[agent, MOVABLE]:
        a = s.continuous_actions
        ux = (a[env, agent, 2] - a[env, agent, 1]) * s.agent_body[agent, ACCEL]
        uy = (a[env, agent, 4] - a[env, agent, 3]) * s.agent_body[agent, ACCEL]
        first = MOVES
    speaks = not s.agent_flags[agent, SILENT]
    for k in range(p.dim_c):
        s.comm[env, agent, k] = s.continuous_actions[env, agent, first + k] if speaks else ZERO
    apply_forces(env, agent, s, p, ux, uy)


@jit
def apply_forces(env, agent, s, p, ux, uy):
    """force = control + the contact force of every colliding agent, then landmark."""
    fx = ux
    fy = uy
    if s.agent_flags[agent, MOVABLE] and s.agent_flags[agent, COLLIDE]:
        x = s.pos[env, agent, 0]
        y = s.pos[env, agent, 1]
        size = s.agent_body[agent, SIZE]
        for other in range(s.pos.shape[1]):
            if other == agent or not s.agent_flags[other, COLLIDE]:
                continue
            dx = x - s.pos[env, other, 0]
            dy = y - s.pos[env, other, 1]
            scale = contact_scale(dx * dx + dy * dy, size + s.agent_body[other, SIZE], p)
            fx += scale * dx
            fy += scale * dy
        for landmark in range(s.landmark_pos.shape[1]):
            if s.landmark_body[landmark, COLLIDE] == ZERO:
                continue
            dx = x - s.landmark_pos[env, landmark, 0]
            dy = y - s.landmark_pos[env, landmark, 1]
            scale = contact_scale(dx * dx + dy * dy, size + s.landmark_body[landmark, SIZE], p)
            fx += scale * dx
            fy += scale * dy
    s.force[env, agent, 0] = fx
    s.force[env, agent, 1] = fy


@jit
def contact_scale(dist_sq, dist_min, p):
    """The contact force is `scale * (own position - other's)`: mpe2's
    contact_force * penetration / dist, penetration = k * log(1 + exp(-(dist - dist_min) / k)),
    k = contact_margin. Zero beyond `contact_reach` past contact (the force is below 1e-16
    there) and for coincident centres (mpe2 divides by zero: NaN)."""
    reach = dist_min + p.contact_reach
    if dist_sq >= reach * reach or dist_sq == ZERO:
        return ZERO
    dist = math.sqrt(dist_sq)
    x = -(dist - dist_min) / p.contact_margin
    if x > ZERO:  # log(1 + exp(x)) without overflow
        softplus = x + math.log1p(math.exp(-x))
    else:
        softplus = math.log1p(math.exp(x))
    return p.contact_force * (softplus * p.contact_margin) / dist


@jit
def integrate(env, agent, s, p):
    """mpe2's integrate_state for a movable agent: position with the old velocity, then
    damping, the force, and the speed limit."""
    if not s.agent_flags[agent, MOVABLE]:
        return
    vx = s.vel[env, agent, 0]
    vy = s.vel[env, agent, 1]
    s.pos[env, agent, 0] += vx * p.dt
    s.pos[env, agent, 1] += vy * p.dt
    mass = s.agent_body[agent, MASS]
    vx = vx * p.keep_velocity + s.force[env, agent, 0] / mass * p.dt
    vy = vy * p.keep_velocity + s.force[env, agent, 1] / mass * p.dt
    max_speed = s.agent_body[agent, MAX_SPEED]
    speed = math.sqrt(vx * vx + vy * vy)
    if speed > max_speed:  # max_speed is inf where mpe2 has None
        vx = vx / speed * max_speed
        vy = vy / speed * max_speed
    s.vel[env, agent, 0] = vx
    s.vel[env, agent, 1] = vy


@jit
def count_step(env, s, p):
    """The step counter; returns whether the episode is truncated (mpe2: steps >= max_cycles)."""
    s.timestep[env] += 1
    truncated = s.timestep[env] >= p.max_cycles
    s.truncated[env] = truncated
    return truncated


@jit
def tick(env, s, p):
    """The clock of a scenario that never terminates early."""
    count_step(env, s, p)
    s.terminated[env] = False


# ---- geometry shared by rewards and observations ---------------------------------------
@jit
def agent_distance(s, env, a, b):
    dx = s.pos[env, a, 0] - s.pos[env, b, 0]
    dy = s.pos[env, a, 1] - s.pos[env, b, 1]
    return math.sqrt(dx * dx + dy * dy)


@jit
def landmark_distance(s, env, agent, landmark):
    dx = s.pos[env, agent, 0] - s.landmark_pos[env, landmark, 0]
    dy = s.pos[env, agent, 1] - s.landmark_pos[env, landmark, 1]
    return math.sqrt(dx * dx + dy * dy)


@jit
def agents_collide(s, env, a, b):
    """mpe2's scenario is_collision: centres closer than the sum of the sizes."""
    return agent_distance(s, env, a, b) < s.agent_body[a, SIZE] + s.agent_body[b, SIZE]


@jit
def touches_landmark(s, env, agent, landmark):
    reach = s.agent_body[agent, SIZE] + s.landmark_body[landmark, SIZE]
    return landmark_distance(s, env, agent, landmark) < reach


@jit
def bound_penalty(x):
    """simple_tag's and simple_world_comm's penalty for straying: x = |coordinate|."""
    if x < np.float32(0.9):
        return ZERO
    if x < ONE:
        return (x - np.float32(0.9)) * np.float32(10.0)
    return min(math.exp(TWO * x - TWO), np.float32(10.0))
