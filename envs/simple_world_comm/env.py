"""simple_world_comm as portable phases over the particle base. Rules: README.md here.

Agent 0 is the leader (an adversary that speaks), agents 1..A-1 the other
adversaries, A..N-1 the good agents. Landmarks: obstacles, then food, then
forests. Each agent first records which forests it is in (`enter_forests`),
so that every observation can read every agent's forests after a barrier.
"""
import numba
import numpy as np
import torch

from gpusim.arrays import ArraySpec
from gpusim.kernels import agent_phase, env_phase

from .._mpe.chase import caught, touching_pairs
from .._mpe.compile import jit
from .._mpe.observe import (fill_zeros, put, put_comm, put_landmarks, put_other,
                            put_own_motion, put_velocity, put_zeros)
from .._mpe.physics import (agent_distance, bound_penalty, landmark_distance, tick,
                            touches_landmark)
from .._mpe.world import MOVE, SPAWN, Landmarks, ParticleEnv, Role
from .config import SimpleWorldCommConfig

LEADER = 0
F32 = np.float32


@jit
def enter_forests(env, agent, s, p):
    for f in range(p.num_forests):
        s.in_forest[env, agent, f] = touches_landmark(s, env, agent, p.first_forest + f)


@jit
def in_any_forest(s, env, agent, p):
    for f in range(p.num_forests):
        if s.in_forest[env, agent, f]:
            return True
    return False


@jit
def sees(s, env, agent, other, p):
    """mpe2's forest rule: both in one forest; or neither in any forest; or the leader."""
    for f in range(p.num_forests):
        if s.in_forest[env, agent, f] and s.in_forest[env, other, f]:
            return True
    if agent == LEADER:
        return True
    return not in_any_forest(s, env, agent, p) and not in_any_forest(s, env, other, p)


@jit
def score(env, agent, s, p):
    """Adversaries: -0.1 x the nearest good agent's distance, +5 per touching
    (good, adversary) pair. Good agents: -5 per adversary touching it, -2 x the bound
    penalty of each coordinate, +2 per food it touches, -0.05 x the nearest food's
    distance."""
    if agent < p.num_adversaries:
        nearest = F32(np.inf)
        for good in range(p.num_adversaries, s.pos.shape[1]):
            nearest = min(nearest, agent_distance(s, env, agent, good))
        s.reward[env, agent] = (-F32(0.1) * nearest
                                + F32(5.0) * numba.float32(touching_pairs(s, env)))
        return
    reward = -F32(5.0) * numba.float32(s.hits[env, agent])
    reward -= F32(2.0) * bound_penalty(abs(s.pos[env, agent, 0]))
    reward -= F32(2.0) * bound_penalty(abs(s.pos[env, agent, 1]))
    nearest = F32(np.inf)
    for food in range(p.first_food, p.first_food + p.num_food):
        if touches_landmark(s, env, agent, food):
            reward += F32(2.0)
        nearest = min(nearest, landmark_distance(s, env, agent, food))
    s.reward[env, agent] = reward - F32(0.05) * nearest


@jit
def put_others_in_sight(s, env, agent, k, p):
    for other in range(s.pos.shape[1]):
        if other == agent:
            continue
        if sees(s, env, agent, other, p):
            k = put_other(s, env, agent, k, other)
        else:
            k = put_zeros(s, env, agent, k, 2)
    return k


@jit
def put_good_velocities(s, env, agent, k, p):
    for other in range(p.num_adversaries, s.pos.shape[1]):
        if other == agent:
            continue
        if sees(s, env, agent, other, p):
            k = put_velocity(s, env, agent, k, other)
        else:
            k = put_zeros(s, env, agent, k, 2)
    return k


@jit
def put_own_forests(s, env, agent, k, p):
    for f in range(p.num_forests):
        k = put(s, env, agent, k, F32(1.0) if s.in_forest[env, agent, f] else F32(-1.0))
    return k


@jit
def observe(env, agent, s, p):
    """[self_vel, self_pos, landmark_rel_positions, other_agent_rel_positions, then
    adversaries: good agents' velocities, in_forest, the leader's words; good agents:
    in_forest, other good agents' velocities]. An agent hidden by the forests is (0, 0)."""
    k = put_own_motion(s, env, agent, 0)
    k = put_landmarks(s, env, agent, k, 0, s.landmark_pos.shape[1])
    k = put_others_in_sight(s, env, agent, k, p)
    if agent < p.num_adversaries:
        k = put_good_velocities(s, env, agent, k, p)
        k = put_own_forests(s, env, agent, k, p)
        k = put_comm(s, env, agent, k, LEADER, p.dim_c)
    else:
        k = put_own_forests(s, env, agent, k, p)
        k = put_good_velocities(s, env, agent, k, p)
    fill_zeros(s, env, agent, k)


class SimpleWorldComm(ParticleEnv):
    name = "simple_world_comm"
    config_class = SimpleWorldCommConfig
    mpe2_module = "simple_world_comm_v3"
    dim_c = 4
    reset_phases = (*SPAWN, agent_phase(enter_forests), agent_phase(observe))
    step_phases = (*MOVE, env_phase(tick), agent_phase(enter_forests), agent_phase(caught),
                   agent_phase(score), agent_phase(observe))
    observe_phases = (agent_phase(enter_forests), agent_phase(observe))

    @classmethod
    def roles(cls, config):
        c = config
        n = c.num_good + c.num_adversaries
        landmarks = c.num_obstacles + c.num_food + c.num_forests
        seen = 4 + 2 * landmarks + 2 * (n - 1) + c.num_forests
        hunter = dict(size=0.075, accel=3.0, max_speed=1.0)
        roles = (Role("leadadversary", 1, seen + 2 * c.num_good + cls.dim_c, silent=False,
                      color=(0.65, 0.15, 0.15), **hunter),
                 Role("adversary", c.num_adversaries - 1, seen + 2 * c.num_good + cls.dim_c,
                      color=(0.95, 0.45, 0.45), **hunter),
                 Role("agent", c.num_good, seen + 2 * (c.num_good - 1), size=0.045, accel=4.0,
                      max_speed=1.3, color=(0.45, 0.95, 0.45)))
        return tuple(r for r in roles if r.count)

    @classmethod
    def landmark_groups(cls, config):
        c = config
        return (Landmarks(c.num_obstacles, size=0.2, spawn=0.9),
                Landmarks(c.num_food, size=0.03, collide=False, spawn=0.9,
                          color=(0.15, 0.15, 0.65)),
                Landmarks(c.num_forests, size=0.3, collide=False, spawn=0.9,
                          color=(0.6, 0.9, 0.6)))

    def scenario_arrays(self):
        return {"hits": ArraySpec(torch.int32),
                "in_forest": ArraySpec(torch.int32, (max(self.config.num_forests, 1),))}

    def scenario_params(self):
        c, i32 = self.config, np.int32
        return dict(first_food=i32(c.num_obstacles),
                    first_forest=i32(c.num_obstacles + c.num_food))
