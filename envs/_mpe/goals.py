"""Phases of the scenarios whose replica has a goal landmark (`goal`, an env-scope int32
state array): drawing it at reset, and each agent's distance to it."""
from gpusim import rng

from .compile import jit
from .physics import landmark_distance


@jit
def choose_goal(env, s, p):
    """The goal landmark, uniform over the landmarks (mpe2: np_random.integers)."""
    s.goal[env] = rng.randint(s.rng_state, env, 0, s.landmark_pos.shape[1])


@jit
def goal_distance(env, agent, s, p):
    s.goal_dist[env, agent] = landmark_distance(s, env, agent, s.goal[env])
