"""Phases of the predator-prey scenarios (simple_tag, simple_world_comm): adversaries are
agent ids 0..A-1 (A = p.num_adversaries), good agents the rest. Touches are counted by
the good agents (`caught`), then summed by each adversary (`touching_pairs`): two
phases, each thread writing only its own entry."""
from .compile import jit
from .physics import agents_collide


@jit
def caught(env, agent, s, p):
    """A good agent: how many adversaries touch it (0 for an adversary), in s.hits."""
    hits = 0
    if agent >= p.num_adversaries:
        for adversary in range(p.num_adversaries):
            if agents_collide(s, env, adversary, agent):
                hits += 1
    s.hits[env, agent] = hits


@jit
def touching_pairs(s, env):
    """How many (good agent, adversary) pairs touch."""
    pairs = 0
    for good in range(s.hits.shape[1]):
        pairs += s.hits[env, good]
    return pairs
