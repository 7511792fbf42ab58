"""A pool change never lands mid-episode (training.league.acting): each frozen replica plays
the snapshot it drew until its episode ends, even when the pool overwrites that slot, and
its episode is credited to that snapshot or to none."""
import pytest
import torch

from test_league import assert_same_acting, league_trainer

LONG = {"env.episode_length": 60, "trainer.league_capacity": 2,
        "trainer.league_snapshot_every": 1, "trainer.rollout_len": 8}


def watch(trainer):
    """Per step and policy: the weights every frozen replica acted on, the slot credited,
    the pool's weights at that slot, and which replicas' episodes ended."""
    seen = []
    for name, actor in trainer.algorithm.league.actors.items():
        original = actor.episode_ended

        def spy(t, done, actor=actor, original=original, name=name):
            if actor.frozen is not None:  # (called after the step the weights acted in)
                params = list(actor.pool.nets.stacked()[0].values())
                seen.append({"name": name, "weights": [w.clone() for w in actor.weights],
                             "credit": actor.credit.clone(),
                             "pool": [p.clone() for p in params],
                             "done": done[actor.frozen].clone()})
            original(t, done)
        actor.episode_ended = spy
    return seen


@pytest.mark.parametrize("lazy", [True, False])  # the CPU's path, and a captured rollout's
def test_a_pool_change_never_lands_mid_episode(lazy):
    trainer = league_trainer(**LONG)
    for actor in trainer.algorithm.league.actors.values():
        actor.lazy = lazy
    seen = watch(trainer)
    for _ in range(12):  # a snapshot every update into 2 slots: evictions under episodes
        trainer.iterate(1e-3)
    names = {s["name"] for s in seen}
    assert names == {"tagger", "runner"}
    capacity = 2
    kept = changed = orphaned = credited = 0
    for name in names:
        steps = [s for s in seen if s["name"] == name]
        for before, now in zip(steps, steps[1:]):
            going = ~before["done"]  # replicas whose episode went on into this step
            for w0, w1 in zip(before["weights"], now["weights"]):
                same = (w0 == w1).flatten(1).all(1)
                assert bool(same[going].all()), "an opponent's weights changed mid-episode"
            kept += int(going.sum())
            first = (before["weights"][0] != now["weights"][0]).flatten(1).any(1)
            changed += int((first & before["done"]).sum())
        for s in steps:  # a credited slot holds exactly the weights the replica plays
            for row, slot in enumerate(s["credit"].tolist()):
                if slot == capacity:
                    orphaned += 1
                    continue
                credited += 1
                for mine, pool in zip(s["weights"], s["pool"]):
                    assert torch.equal(mine[row], pool[slot])
    assert kept and changed  # episodes went on, and new ones drew other snapshots
    assert orphaned and credited  # slots were overwritten under episodes, and credited
    for pool in trainer.algorithm.league.pools.values():
        assert pool.adds == 13 and sorted(pool.stamp.tolist()) == [12, 13]


def test_an_episode_whose_snapshot_was_evicted_counts_for_no_snapshot():
    """League.record drops the games of replicas credited to no slot."""
    trainer = league_trainer(**LONG)
    league = trainer.algorithm.league
    trainer.iterate(1e-3)
    for actor in league.actors.values():
        actor.faced.fill_(2)  # every step: a snapshot no longer in the pool
    for pool in league.pools.values():
        pool.games.zero_()
        pool.wins.zero_()
    league.record(trainer.algorithm.episodes)
    for pool in league.pools.values():
        assert float(pool.games.sum()) == 0.0 and float(pool.wins.sum()) == 0.0


def test_a_resumed_league_plays_on_the_evicted_snapshot_it_drew():
    """A checkpoint keeps the weights of snapshots still played that the pool evicted."""
    whole = league_trainer(**LONG)
    for _ in range(5):
        whole.iterate(1e-3)
    whole.iteration = 5
    assert any(bool((a.credit == 2).any()) for a in whole.algorithm.league.actors.values())
    state = whole.state_dict()
    again = league_trainer(**LONG)
    again.load_state_dict(state)
    assert_same_acting(whole, again)
    assert [whole.iterate(1e-3) for _ in range(2)] == [again.iterate(1e-3) for _ in range(2)]
