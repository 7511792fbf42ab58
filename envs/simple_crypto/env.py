"""simple_crypto as portable phases over the particle base. Rules: README.md here.

Agents 0, 1, 2 are Eve, Bob and Alice; none moves, all speak (4 channels).
Each replica draws a goal landmark (the message: its one-hot colour) and a
key landmark (the key: its colour). Rewards compare Bob's and Eve's
utterances with the message; an all-zero utterance (possible with
continuous actions) counts as no guess.
"""
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.kernels import agent_phase, env_phase

from .._mpe.compile import jit
from .._mpe.observe import fill_zeros, put_comm, put_landmark_color
from .._mpe.physics import ZERO, tick
from .._mpe.world import MOVE, SPAWN, Landmarks, ParticleEnv, Role
from .config import SimpleCryptoConfig

EVE, BOB, ALICE = 0, 1, 2
DIM_C = 4
NUM_LANDMARKS = 2  # landmark j's colour is one-hot in channel j


@jit
def choose_secrets(env, s, p):
    """The message (goal landmark), then the key (another uniform landmark draw)."""
    s.goal[env] = rng.randint(s.rng_state, env, 0, s.landmark_pos.shape[1])
    s.key[env] = rng.randint(s.rng_state, env, 0, s.landmark_pos.shape[1])


@jit
def guess_error(s, env, agent):
    """Squared distance of the agent's utterance from the message; 0 for silence."""
    error = ZERO
    spoke = False
    for k in range(s.landmark_color.shape[1]):
        said = s.comm[env, agent, k]
        spoke = spoke or said != ZERO
        miss = said - s.landmark_color[s.goal[env], k]
        error += miss * miss
    return error if spoke else ZERO


@jit
def score(env, agent, s, p):
    """Eve: minus her error. Bob and Alice: Eve's error minus Bob's."""
    eve = guess_error(s, env, EVE)
    if agent == EVE:
        s.reward[env, agent] = -eve
    else:
        s.reward[env, agent] = eve - guess_error(s, env, BOB)


@jit
def observe(env, agent, s, p):
    """Eve: [Alice's utterance]; Bob: [key, Alice's utterance]; Alice: [message, key]."""
    k = 0
    if agent == ALICE:
        k = put_landmark_color(s, env, agent, k, s.goal[env])
    if agent != EVE:
        k = put_landmark_color(s, env, agent, k, s.key[env])
    if agent != ALICE:
        k = put_comm(s, env, agent, k, ALICE, p.dim_c)
    fill_zeros(s, env, agent, k)


class SimpleCrypto(ParticleEnv):
    name = "simple_crypto"
    config_class = SimpleCryptoConfig
    mpe2_module = "simple_crypto_v3"
    dim_c = DIM_C
    reset_phases = (*SPAWN, env_phase(choose_secrets), agent_phase(observe))
    step_phases = (*MOVE, env_phase(tick), agent_phase(score), agent_phase(observe))
    observe_phases = (agent_phase(observe),)
    render_arrays = ParticleEnv.render_arrays + ("goal",)

    @classmethod
    def roles(cls, config):
        still = dict(movable=False, silent=False, collide=False)
        return (Role("eve", 1, DIM_C, color=(0.75, 0.25, 0.25), **still),
                Role("bob", 1, 2 * DIM_C, **still),
                Role("alice", 1, 2 * DIM_C, **still))

    @classmethod
    def landmark_groups(cls, config):
        return tuple(Landmarks(1, collide=False, color=tuple(np.eye(3)[j]))
                     for j in range(NUM_LANDMARKS))

    def scenario_arrays(self):
        i32 = torch.int32
        return {"goal": ArraySpec(i32, scope="env", state=True),
                "key": ArraySpec(i32, scope="env", state=True),
                "landmark_color": ArraySpec(torch.float32, (NUM_LANDMARKS, DIM_C),
                                            scope="global")}

    def scenario_initial_values(self):
        return {"landmark_color": np.eye(NUM_LANDMARKS, DIM_C, dtype=np.float32)}

    def index_ranges(self):
        return {"goal": NUM_LANDMARKS, "key": NUM_LANDMARKS}
