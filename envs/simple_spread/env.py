"""simple_spread as portable phases over the particle base. Rules: README.md in this folder.

The shared cover reward (minus the sum over landmarks of the nearest agent's
distance) is computed once per replica: in `cover` each thread takes the
landmarks agent, agent + N, ... and writes their nearest distance; `finish`
(one thread per replica) sums them and decides success; every agent then
reads the sum. No thread writes another's entries.
"""
import numba
import numpy as np
import torch

from gpusim.arrays import ArraySpec
from gpusim.kernels import agent_phase, env_phase

from .._mpe.compile import jit
from .._mpe.observe import put_own_motion, put_seen_landmarks, put_seen_others, put_zeros
from .._mpe.physics import agents_collide, count_step, landmark_distance
from .._mpe.world import (MOVE, SPAWN, Landmarks, ParticleEnv, Role, neighbor_arrays,
                          neighbor_params)
from .config import SimpleSpreadConfig

CAPTURE_RADIUS = 0.1  # mpe2: a landmark is covered by an agent closer than this
AGENT_SIZE = 0.15


@jit
def cover(env, agent, s, p):
    """The nearest agent's distance to each of this thread's landmarks."""
    for landmark in range(agent, s.landmark_pos.shape[1], s.pos.shape[1]):
        nearest = np.float32(np.inf)
        for other in range(s.pos.shape[1]):
            nearest = min(nearest, landmark_distance(s, env, other, landmark))
        s.cover_dist[env, landmark] = nearest


@jit
def finish(env, s, p):
    """The shared reward, and the end of the episode: truncated at max_cycles, else
    terminated on success when terminate_on_success."""
    total = 0.0  # float64: the sum over up to hundreds of landmarks
    covered = True
    for landmark in range(s.landmark_pos.shape[1]):
        total += s.cover_dist[env, landmark]
        covered = covered and s.cover_dist[env, landmark] < p.capture_radius
    s.cover_reward[env] = -numba.float32(total)
    truncated = count_step(env, s, p)
    s.terminated[env] = p.terminate_on_success and covered and not truncated


@jit
def score(env, agent, s, p):
    """cover reward * (1 - local_ratio) + (minus one per colliding agent) * local_ratio."""
    collisions = 0
    if p.collision_penalty:
        for other in range(s.pos.shape[1]):
            if other != agent and agents_collide(s, env, agent, other):
                collisions += 1
    s.reward[env, agent] = (s.cover_reward[env] * p.global_ratio
                            - numba.float32(collisions) * p.local_ratio)


@jit
def observe(env, agent, s, p):
    """[self_vel, self_pos, landmark_rel_positions, other_agent_rel_positions,
    communication] (the nearest few of each with partial observability); the agents are
    silent, so their communication is zeros."""
    k = put_own_motion(s, env, agent, 0)
    k = put_seen_landmarks(s, env, agent, k, p)
    k = put_seen_others(s, env, agent, k, p)
    heard = p.agent_neighbors if p.agent_neighbors > 0 else s.pos.shape[1] - 1
    put_zeros(s, env, agent, k, 2 * heard)


class SimpleSpread(ParticleEnv):
    name = "simple_spread"
    config_class = SimpleSpreadConfig
    mpe2_module = "simple_spread_v3"
    dim_c = 2
    reset_phases = (*SPAWN, agent_phase(observe))
    step_phases = (*MOVE, agent_phase(cover), env_phase(finish), agent_phase(score),
                   agent_phase(observe))
    observe_phases = (agent_phase(observe),)

    @classmethod
    def roles(cls, config):
        landmarks = config.num_landmark_neighbors or config.N
        others = config.num_agent_neighbors or config.N - 1
        return (Role("agent", config.N, obs_dim=4 + 2 * landmarks + 4 * others,
                     size=AGENT_SIZE, color=(0.35, 0.35, 0.85)),)

    @classmethod
    def landmark_groups(cls, config):
        return (Landmarks(config.N, collide=False),)

    def scenario_arrays(self):
        f32 = torch.float32
        return {"cover_dist": ArraySpec(f32, (self.config.N,), scope="env"),
                "cover_reward": ArraySpec(f32, scope="env"), **neighbor_arrays(self.config)}

    def scenario_params(self):
        c, f32 = self.config, np.float32
        return dict(global_ratio=f32(1 - c.local_ratio),
                    collision_penalty=np.bool_(not c.curriculum),
                    capture_radius=f32(CAPTURE_RADIUS), **neighbor_params(c))
