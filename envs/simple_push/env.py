"""simple_push as portable phases over the particle base. Rules: README.md here.

Agent 0 is the adversary, agent 1 the good agent; `goal` (per replica) is the
goal landmark. Colours are part of the good agent's observation: landmark j
is (0.1, 0.1, 0.1) with 0.9 in channel j + 1, the good agent (0.25, 0.25,
0.25) with 0.75 in channel goal + 1.
"""
import numpy as np
import torch

from gpusim.arrays import ArraySpec
from gpusim.kernels import agent_phase, env_phase

from .._mpe.compile import jit
from .._mpe.goals import choose_goal, goal_distance
from .._mpe.observe import fill_zeros, put, put_landmark, put_landmarks, put_others, put_velocity
from .._mpe.physics import tick
from .._mpe.world import MOVE, SPAWN, Landmarks, ParticleEnv, Role
from .config import SimplePushConfig

NUM_LANDMARKS = 2
LANDMARK_BASE, LANDMARK_LIT = 0.1, 0.9  # mpe2: 0.1 everywhere, + 0.8 in channel j + 1
AGENT_BASE, AGENT_LIT = 0.25, 0.75      # mpe2: 0.25 everywhere, + 0.5 in channel goal + 1


@jit
def score(env, agent, s, p):
    """Good agent: minus its distance to the goal. Adversary: the good agent's distance
    minus its own."""
    if agent == 0:
        s.reward[env, agent] = s.goal_dist[env, 1] - s.goal_dist[env, 0]
    else:
        s.reward[env, agent] = -s.goal_dist[env, agent]


@jit
def put_color(s, env, agent, k, lit_channel, base, lit):
    for channel in range(3):
        k = put(s, env, agent, k, lit if channel == lit_channel else base)
    return k


@jit
def observe(env, agent, s, p):
    """Good agent: [self_vel, goal_rel_position, own colour, landmark_rel_positions,
    landmark colours, other_agent_rel_positions]; adversary: [self_vel,
    landmark_rel_positions, other_agent_rel_positions]."""
    k = put_velocity(s, env, agent, 0, agent)
    if agent == 0:
        k = put_landmarks(s, env, agent, k, 0, s.landmark_pos.shape[1])
    else:
        k = put_landmark(s, env, agent, k, s.goal[env])
        k = put_color(s, env, agent, k, s.goal[env] + 1, p.agent_base, p.agent_lit)
        k = put_landmarks(s, env, agent, k, 0, s.landmark_pos.shape[1])
        for landmark in range(s.landmark_pos.shape[1]):
            k = put_color(s, env, agent, k, landmark + 1, p.landmark_base, p.landmark_lit)
    k = put_others(s, env, agent, k)
    fill_zeros(s, env, agent, k)


class SimplePush(ParticleEnv):
    name = "simple_push"
    config_class = SimplePushConfig
    mpe2_module = "simple_push_v3"
    dim_c = 2
    reset_phases = (*SPAWN, env_phase(choose_goal), agent_phase(observe))
    step_phases = (*MOVE, env_phase(tick), agent_phase(goal_distance), agent_phase(score),
                   agent_phase(observe))
    observe_phases = (agent_phase(observe),)
    render_arrays = ParticleEnv.render_arrays + ("goal",)

    @classmethod
    def roles(cls, config):
        return (Role("adversary", 1, 8, color=(0.75, 0.25, 0.25)),
                Role("agent", 1, 19))

    @classmethod
    def landmark_groups(cls, config):
        return tuple(Landmarks(1, collide=False, color=lit_color(j + 1, LANDMARK_BASE, LANDMARK_LIT))
                     for j in range(NUM_LANDMARKS))

    def scenario_arrays(self):
        return {"goal": ArraySpec(torch.int32, scope="env", state=True),
                "goal_dist": ArraySpec(torch.float32)}

    def scenario_params(self):
        f32 = np.float32
        return dict(landmark_base=f32(LANDMARK_BASE), landmark_lit=f32(LANDMARK_LIT),
                    agent_base=f32(AGENT_BASE), agent_lit=f32(AGENT_LIT))

    def index_ranges(self):
        return {"goal": NUM_LANDMARKS}


def lit_color(channel: int, base: float, lit: float) -> tuple:
    """An RGB colour: `base` in every channel but `lit` in `channel`."""
    return tuple(lit if c == channel else base for c in range(3))
