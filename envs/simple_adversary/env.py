"""simple_adversary as portable phases over the particle base. Rules: README.md here.

Agent 0 is the adversary, agents 1..N the good agents; `goal` (per replica)
is the goal landmark. Each agent writes its own distance to the goal, then
every agent reads them all for its reward.
"""
import torch

from gpusim.arrays import ArraySpec
from gpusim.kernels import agent_phase, env_phase

from .._mpe.compile import jit
from .._mpe.goals import choose_goal, goal_distance
from .._mpe.observe import fill_zeros, put_landmark, put_seen_landmarks, put_seen_others
from .._mpe.physics import tick
from .._mpe.world import (MOVE, SPAWN, Landmarks, ParticleEnv, Role, neighbor_arrays,
                          neighbor_params)
from .config import SimpleAdversaryConfig

@jit
def score(env, agent, s, p):
    """Adversary: minus its distance to the goal. Good agents (all alike): minus the
    nearest good agent's distance to the goal, plus the adversary's."""
    if agent == 0:
        s.reward[env, agent] = -s.goal_dist[env, 0]
        return
    nearest = s.goal_dist[env, 1]
    for good in range(2, s.pos.shape[1]):
        nearest = min(nearest, s.goal_dist[env, good])
    s.reward[env, agent] = -nearest + s.goal_dist[env, 0]


@jit
def observe(env, agent, s, p):
    """Good agents: [goal_rel_position, landmark_rel_positions, other_agent_rel_positions];
    the adversary: the same without the goal (the nearest few with partial observability)."""
    k = 0
    if agent > 0:
        k = put_landmark(s, env, agent, k, s.goal[env])
    k = put_seen_landmarks(s, env, agent, k, p)
    fill_zeros(s, env, agent, put_seen_others(s, env, agent, k, p))


class SimpleAdversary(ParticleEnv):
    name = "simple_adversary"
    config_class = SimpleAdversaryConfig
    mpe2_module = "simple_adversary_v3"
    dim_c = 2
    reset_phases = (*SPAWN, env_phase(choose_goal), agent_phase(observe))
    step_phases = (*MOVE, env_phase(tick), agent_phase(goal_distance), agent_phase(score),
                   agent_phase(observe))
    observe_phases = (agent_phase(observe),)
    render_arrays = ParticleEnv.render_arrays + ("goal",)

    @classmethod
    def roles(cls, config):
        seen = (2 * (config.num_landmark_neighbors or config.N)
                + 2 * (config.num_agent_neighbors or config.N))
        return (Role("adversary", 1, seen, size=0.15, collide=False, color=(0.85, 0.35, 0.35)),
                Role("agent", config.N, seen + 2, size=0.15, collide=False,
                     color=(0.35, 0.35, 0.85)))

    @classmethod
    def landmark_groups(cls, config):
        return (Landmarks(config.N, size=0.08, collide=False, color=(0.15, 0.15, 0.15)),)

    def scenario_arrays(self):
        return {"goal": ArraySpec(torch.int32, scope="env", state=True),
                "goal_dist": ArraySpec(torch.float32), **neighbor_arrays(self.config)}

    def scenario_params(self):
        return neighbor_params(self.config)

    def index_ranges(self):
        return {"goal": self.num_landmarks}
