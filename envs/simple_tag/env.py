"""simple_tag as portable phases over the particle base. Rules: README.md in this folder.

Adversaries are agent ids 0..A-1, good agents A..N-1. Touches are counted
as `_mpe.chase` says: O(N) per thread, each thread writing its own entry.
"""
import numba
import numpy as np
import torch

from gpusim.arrays import ArraySpec
from gpusim.kernels import agent_phase, env_phase

from .._mpe.chase import caught, touching_pairs
from .._mpe.compile import jit
from .._mpe.observe import (fill_zeros, put_own_motion, put_seen_landmarks, put_seen_others,
                            put_velocity, put_zeros)
from .._mpe.physics import bound_penalty, count_step
from .._mpe.world import (MOVE, SPAWN, Landmarks, ParticleEnv, Role, neighbor_arrays,
                          neighbor_params)
from .config import SimpleTagConfig

CURRICULUM_PREY_SPEED = 0.5  # mpe2's curriculum stage 0: the prey's share of its speed


@jit
def finish(env, s, p):
    """Truncated at max_cycles, else terminated (terminate_on_success) once every good
    agent is touched by an adversary."""
    all_caught = True
    for agent in range(p.num_adversaries, s.pos.shape[1]):
        all_caught = all_caught and s.hits[env, agent] > 0
    truncated = count_step(env, s, p)
    s.terminated[env] = p.terminate_on_success and all_caught and not truncated


@jit
def score(env, agent, s, p):
    """Adversaries: +10 for every (good agent, adversary) pair that touches. Good agents:
    -10 per adversary touching it, minus the bound penalty of each coordinate."""
    if agent < p.num_adversaries:
        s.reward[env, agent] = np.float32(10.0) * numba.float32(touching_pairs(s, env))
    else:
        s.reward[env, agent] = (-np.float32(10.0) * numba.float32(s.hits[env, agent])
                                - bound_penalty(abs(s.pos[env, agent, 0]))
                                - bound_penalty(abs(s.pos[env, agent, 1])))


@jit
def observe(env, agent, s, p):
    """[self_vel, self_pos, landmark_rel_positions, other_agent_rel_positions,
    good agents' velocities]: with full observation the velocities of the other good
    agents; with num_agent_neighbors, one velocity slot per neighbour slot, zero where the
    neighbour is an adversary or missing."""
    k = put_own_motion(s, env, agent, 0)
    k = put_seen_landmarks(s, env, agent, k, p)
    k = put_seen_others(s, env, agent, k, p)
    if p.agent_neighbors > 0:
        for slot in range(p.agent_neighbors):
            other = s.near[env, agent, slot]
            if other >= p.num_adversaries:
                k = put_velocity(s, env, agent, k, other)
            else:
                k = put_zeros(s, env, agent, k, 2)
    else:
        for other in range(p.num_adversaries, s.pos.shape[1]):
            if other != agent:
                k = put_velocity(s, env, agent, k, other)
    fill_zeros(s, env, agent, k)


class SimpleTag(ParticleEnv):
    name = "simple_tag"
    config_class = SimpleTagConfig
    mpe2_module = "simple_tag_v3"
    dim_c = 2
    reset_phases = (*SPAWN, agent_phase(observe))
    step_phases = (*MOVE, agent_phase(caught), env_phase(finish), agent_phase(score),
                   agent_phase(observe))
    observe_phases = (agent_phase(observe),)

    @classmethod
    def roles(cls, config):
        c = config
        n = c.num_good + c.num_adversaries
        landmarks = c.num_landmark_neighbors or c.num_obstacles
        if c.num_agent_neighbors:
            seen = 4 + 2 * landmarks + 4 * c.num_agent_neighbors
            adversary_obs, good_obs = seen, seen
        else:
            adversary_obs = 4 + 2 * landmarks + 2 * (n - 1) + 2 * c.num_good
            good_obs = adversary_obs - 2
        speed = CURRICULUM_PREY_SPEED if c.curriculum else 1.0
        return (Role("adversary", c.num_adversaries, adversary_obs, size=0.075, accel=3.0,
                     max_speed=1.0, color=(0.85, 0.35, 0.35)),
                Role("agent", c.num_good, good_obs, size=0.05, accel=4.0 * speed,
                     max_speed=1.3 * speed, color=(0.35, 0.85, 0.35)))

    @classmethod
    def landmark_groups(cls, config):
        return (Landmarks(config.num_obstacles, size=0.2, spawn=0.9),)

    def scenario_arrays(self):
        return {"hits": ArraySpec(torch.int32), **neighbor_arrays(self.config)}

    def scenario_params(self):
        return neighbor_params(self.config)
