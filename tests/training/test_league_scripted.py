"""Scripted policies in a league's pools (`trainer.league_scripted`): drawn beside the
snapshots, acting in the replicas that drew them exactly as the env's scripted policy,
weighed by PFSP with the snapshots, and a frozen side that plays them alone."""
import pytest
import torch

from gpusim.envs.tag_continuous.scripted import Chaser, Fleer
from gpusim.errors import GpusimError

from test_league import league_trainer


def test_a_pool_holds_the_sides_scripted_policies_beside_its_snapshots():
    trainer = league_trainer(**{"trainer.league_scripted": True})
    pools = trainer.algorithm.league.pools
    for name, kind in (("tagger", Chaser), ("runner", Fleer)):
        pool = pools[name]
        assert [type(s) for s in pool.scripted] == [kind]
        assert pool.size == pool.capacity + 1
        assert pool.filled.tolist() == [True] + [False] * (pool.capacity - 1) + [True]
        weights = pool.weights("pfsp")
        assert weights[0] > 0 and weights[-1] > 0 and not weights[1:-1].any()


def test_replicas_that_drew_a_scripted_slot_act_as_it():
    trainer = league_trainer(**{"trainer.league_scripted": True})
    league = trainer.algorithm.league
    env = trainer.env
    for name, kind in (("runner", Fleer), ("tagger", Chaser)):
        actor, pool = league.actors[name], league.pools[name]
        frozen = torch.arange(env.num_envs)[actor.frozen]
        drew = torch.arange(len(frozen)) % 2 == 0  # every other frozen replica: scripted
        actor.opponent.copy_(torch.where(drew, pool.capacity, 0))
        actor.restart()
        env.reset()
        spec = env.policy_specs[name]
        obs = env.arrays["obs"][:, list(spec.agent_ids)]
        got = actor.log_probs(obs)
        wanted = kind(env, name).log_probs(None)
        rows = frozen[drew]
        assert len(rows) >= 1
        assert torch.equal(got[rows], wanted[rows])
        network = pool.nets.lead("log_probs", obs[actor.frozen], None,
                                 tensors=pool.gather(torch.zeros_like(actor.opponent)))
        others = frozen[~drew]
        assert torch.equal(got[others], network[~drew])
        assert not torch.equal(got[rows], network[drew])  # the script, not the network


def test_a_frozen_side_with_scripted_policies_plays_them_alone():
    trainer = league_trainer(**{"trainer.league_scripted": True,
                                "trainer.league_frozen": ["tagger"]})
    league, env = trainer.algorithm.league, trainer.env
    pool = league.pools["tagger"]
    assert pool.filled.tolist() == [False] * pool.capacity + [True]
    assert league.actors["tagger"].opponent.tolist() == [pool.capacity] * env.num_envs
    trainer.iterate(1e-3)  # episodes ended (12 steps each): the draws stay on it
    assert league.actors["tagger"].opponent.tolist() == [pool.capacity] * env.num_envs
    spec = env.policy_specs["tagger"]
    obs = env.arrays["obs"][:, list(spec.agent_ids)]
    assert torch.equal(league.actors["tagger"].log_probs(obs), Chaser(env, "tagger").log_probs(None))


def test_pfsp_counts_games_against_scripted_slots_and_survives_a_resume():
    trainer = league_trainer(**{"trainer.league_scripted": True,
                                "trainer.league_learner_share": 0.25})
    for _ in range(4):
        trainer.iterate(1e-3)
    league = trainer.algorithm.league
    played = {n: float(p.games[p.capacity:].sum()) for n, p in league.pools.items()}
    assert sum(played.values()) > 0
    state = trainer.state_dict()
    again = league_trainer(**{"trainer.league_scripted": True,
                              "trainer.league_learner_share": 0.25})
    again.load_state_dict(state)
    for name, pool in again.algorithm.league.pools.items():
        assert torch.equal(pool.games, league.pools[name].games)
        assert torch.equal(pool.wins, league.pools[name].wins)


@pytest.mark.parametrize("env,extra,message", [
    ("biased_rps", {}, "ships none"),
    ("tag_continuous", {"env.continuous_actions": True}, "plays discrete actions"),
])
def test_scripted_pools_are_refused_where_they_cannot_play(env, extra, message):
    with pytest.raises(GpusimError, match=message):
        league_trainer(env, **{"trainer.league_scripted": True, **extra})
