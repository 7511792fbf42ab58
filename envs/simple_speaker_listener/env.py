"""simple_speaker_listener as portable phases over the particle base. Rules: README.md.

Agent 0 is the speaker (it cannot move; it sees the goal's colour and says
one of three words), agent 1 the listener (it moves, hears the word, and is
silent). Both get minus the listener's squared distance to the goal.
"""
import numpy as np
import torch

from gpusim.arrays import ArraySpec
from gpusim.kernels import agent_phase, env_phase

from .._mpe.compile import jit
from .._mpe.goals import choose_goal
from .._mpe.observe import (fill_zeros, put_comm, put_landmark_color, put_landmarks,
                            put_velocity)
from .._mpe.physics import tick
from .._mpe.world import MOVE, SPAWN, Landmarks, ParticleEnv, Role
from .config import SimpleSpeakerListenerConfig

LANDMARK_COLORS = ((0.65, 0.15, 0.15), (0.15, 0.65, 0.15), (0.15, 0.15, 0.65))
SPEAKER, LISTENER = 0, 1


@jit
def score(env, agent, s, p):
    goal = s.goal[env]
    dx = s.pos[env, LISTENER, 0] - s.landmark_pos[env, goal, 0]
    dy = s.pos[env, LISTENER, 1] - s.landmark_pos[env, goal, 1]
    s.reward[env, agent] = -(dx * dx + dy * dy)


@jit
def observe(env, agent, s, p):
    """Speaker: [goal colour]; listener: [self_vel, landmark_rel_positions, the word]."""
    if agent == SPEAKER:
        fill_zeros(s, env, agent, put_landmark_color(s, env, agent, 0, s.goal[env]))
    else:
        k = put_velocity(s, env, agent, 0, agent)
        k = put_landmarks(s, env, agent, k, 0, s.landmark_pos.shape[1])
        put_comm(s, env, agent, k, SPEAKER, p.dim_c)


class SimpleSpeakerListener(ParticleEnv):
    name = "simple_speaker_listener"
    config_class = SimpleSpeakerListenerConfig
    mpe2_module = "simple_speaker_listener_v4"
    dim_c = 3
    reset_phases = (*SPAWN, env_phase(choose_goal), agent_phase(observe))
    step_phases = (*MOVE, env_phase(tick), agent_phase(score), agent_phase(observe))
    observe_phases = (agent_phase(observe),)
    render_arrays = ParticleEnv.render_arrays + ("goal",)

    @classmethod
    def roles(cls, config):
        return (Role("speaker", 1, 3, size=0.075, movable=False, silent=False, collide=False),
                Role("listener", 1, 11, size=0.075, collide=False))

    @classmethod
    def landmark_groups(cls, config):
        return tuple(Landmarks(1, size=0.04, collide=False, color=c) for c in LANDMARK_COLORS)

    def scenario_arrays(self):
        return {"goal": ArraySpec(torch.int32, scope="env", state=True),
                "landmark_color": ArraySpec(torch.float32, (len(LANDMARK_COLORS), 3),
                                            scope="global")}

    def scenario_initial_values(self):
        return {"landmark_color": np.array(LANDMARK_COLORS, np.float32)}

    def index_ranges(self):
        return {"goal": len(LANDMARK_COLORS)}
