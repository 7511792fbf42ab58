"""An env's declared episode outcome (gpusim.outcome): biased_rps's payoff sign and
tag_continuous's runner survival, counted by hand; a league's win statistics
(training.league.wins) and cross-play's ratings (training.judge.ratings) by it."""
import numpy as np
import pytest
import torch

import gpusim
from gpusim.errors import GpusimError
from gpusim.outcome import Outcome, win
from gpusim.training.judge import ratings
from gpusim.training.judge.crossplay import OUTCOME
from gpusim.training.league.wins import LeagueOutcome

from test_league import league_trainer

ROCK, PAPER, SCISSORS = range(3)


def test_the_outcome_rule():
    assert [win(v, 0.0, 1.0) for v in (1.0, 0.0, -2.0)] == [1.0, 0.5, 0.0]
    assert [win(v, 5.0, -1.0) for v in (4.0, 5.0, 6.0)] == [1.0, 0.5, 0.0]
    declared = gpusim.make("tag_continuous", num_envs=1, backend="cpu").outcome
    assert declared.direction("runner", ("tagger", "runner")) == 1.0
    assert declared.direction("tagger", ("tagger", "runner")) == -1.0
    one = Outcome("x", sides={"a": "lower"}, tracker=None)
    assert one.direction("b", ("a", "b")) == 1.0  # a game of two: the other way
    with pytest.raises(GpusimError, match="names no direction for policy 'c'"):
        one.direction("c", ("a", "b", "c"))
    with pytest.raises(GpusimError, match="sides must map"):
        Outcome("x", sides={"a": "up"}, tracker=None)


def test_biased_rps_wins_match_a_hand_counted_episode():
    """Three rounds, each replica's plays fixed: the row's payoff summed by hand (rock
    wins 1, paper 2, scissors 3), and who won it for each learner."""
    env = gpusim.make("biased_rps", num_envs=3, backend="cpu", rounds=3)
    outcome = LeagueOutcome(env, ["row", "column"], rollout_len=3)
    env.reset(seed=0)
    plays = [  # per round, per replica: (row, column)
        [(ROCK, SCISSORS), (PAPER, PAPER), (ROCK, PAPER)],
        [(ROCK, PAPER), (SCISSORS, PAPER), (SCISSORS, ROCK)],
        [(PAPER, PAPER), (PAPER, SCISSORS), (PAPER, ROCK)],
    ]
    # by hand: replica 0: +1 (rock beats scissors) -2 (paper beats rock) +0 = -1;
    # replica 1: 0 +3 (scissors beat paper) -3 (scissors beat paper) = 0;
    # replica 2: -2 (paper beats rock) -1 (rock beats scissors) +2 (paper beats rock) = -1
    for t, round_plays in enumerate(plays):
        actions = torch.tensor(round_plays, dtype=torch.int32)[:, :, None]
        _, _, terminated, truncated, _ = env.step(actions)
        outcome.after_step(t, terminated | truncated)
    assert bool(terminated.all())
    assert outcome.values[2].tolist() == [-1.0, 0.0, -1.0]
    baseline = torch.zeros(2)  # (a fixed threshold: the running mean is not read)
    value = outcome.values[2:3]
    row = outcome.wins(value, torch.zeros(3, dtype=torch.long), baseline)
    column = outcome.wins(value, torch.ones(3, dtype=torch.long), baseline)
    assert row.tolist() == [[0.0, 0.5, 0.0]] and column.tolist() == [[1.0, 0.5, 1.0]]


def test_tag_continuous_wins_match_a_hand_counted_episode():
    """Random play until an episode ends: the runners' mean steps survived, counted from
    the env's tagged_by array step by step, is the outcome's value; runners win above the
    running mean, taggers below."""
    env = gpusim.make("tag_continuous", num_envs=4, backend="cpu", num_taggers=2,
                      num_runners=3, episode_length=20)
    length = 20
    outcome = LeagueOutcome(env, ["tagger", "runner"], rollout_len=length)
    env.reset(seed=3)
    runners = env.policies["runner"]
    free = np.ones((4, len(runners)), dtype=bool)
    survived = np.zeros(4)
    ended_at = {}
    gen = torch.Generator().manual_seed(0)
    for t in range(length):
        actions = torch.stack([torch.randint(0, n, (4, env.num_agents), generator=gen)
                               for n in env.action_nvec], -1).to(torch.int32)
        _, _, terminated, truncated, _ = env.step(actions)
        done = terminated | truncated
        survived += free.mean(1)
        free &= env.arrays["tagged_by"][:, list(runners)].numpy() < 0
        outcome.after_step(t, done)
        for e in np.flatnonzero(done.numpy()):
            if e not in ended_at:
                ended_at[e] = (t, survived[e])
        survived[done.numpy()] = 0.0
        free[done.numpy()] = True
    assert len(ended_at) == 4  # every replica's first episode ended within the rollout
    mean = float(np.mean([v for _, v in ended_at.values()]))
    baseline = torch.full((2,), mean)
    for e, (t, by_hand) in ended_at.items():
        value = outcome.values[t, e:e + 1][None]
        assert float(value) == pytest.approx(by_hand)
        tagger = outcome.wins(value, torch.zeros(1, dtype=torch.long), baseline)
        runner = outcome.wins(value, torch.ones(1, dtype=torch.long), baseline)
        want = 1.0 if by_hand > mean else 0.5 if by_hand == mean else 0.0
        assert float(runner) == pytest.approx(want)
        assert float(tagger) == pytest.approx(1.0 - want)


def test_a_league_counts_biased_rps_wins_by_the_payoff_sign():
    """The pools' win statistics (what pfsp draws by) after one rollout: every frozen
    replica's episode counted for the snapshot it faced, won by the payoff's sign."""
    trainer = league_trainer("biased_rps", **{"trainer.num_envs": 16,
                                              "trainer.rollout_len": 4})
    algorithm = trainer.algorithm
    league = algorithm.league
    assert league.outcome.name == "row_payoff"
    trainer.iterate(1e-3)
    episodes = algorithm.episodes  # (the rollout just recorded, before its snapshot)
    for name, actor in league.actors.items():
        frozen = actor.frozen
        learner = league.matchups.group[frozen]
        payoff = episodes.returns[:, 0, frozen]  # the row player's return: its payoff
        direction = torch.where(learner == 0, 1.0, -1.0)
        margin = direction * payoff
        won = ((margin > 0).float() + 0.5 * (margin == 0).float()) * episodes.dones[:, frozen]
        pool = league.pools[name]
        # one rollout, every replica facing slot 0 (then the snapshot went into slot 1)
        assert float(pool.games[0]) == pytest.approx(float(episodes.dones[:, frozen].sum()))
        assert float(pool.wins[0]) == pytest.approx(float(won.sum()))
        assert float(pool.games[1]) == float(pool.wins[1]) == 0.0


def test_ratings_use_the_declared_outcome():
    """Cross-play's cells carrying outcome values are won by them, not by the returns."""
    cells = {(0, 0): {"row": [5.0, 5.0], "column": [0.0, 0.0], OUTCOME: [1.0, -1.0]},
             (0, 1): {"row": [-9.0, -9.0], "column": [0.0, 0.0], OUTCOME: [2.0, 0.0]}}
    rps = gpusim.make("biased_rps", num_envs=1, backend="cpu").outcome
    wins, threshold, rule = ratings.episode_wins(cells, "row", rps, ["row", "column"])
    assert wins == {(0, 0): [1.0, 0.0], (0, 1): [1.0, 0.5]} and threshold == 0.0
    assert "row_payoff is above 0" in rule
    # the column's view: the same episodes, the other way
    wins, _, _ = ratings.episode_wins(cells, "column", rps, ["row", "column"])
    assert wins == {(0, 0): [0.0, 1.0], (0, 1): [0.0, 0.5]}
    # no threshold: the median of the values over the matrix (here 0.5), lower wins
    tag = Outcome("survived", sides={"tagger": "lower", "runner": "higher"}, tracker=None)
    wins, median, _ = ratings.episode_wins(
        {k: {"tagger": c["row"], "runner": c["column"], OUTCOME: c[OUTCOME]}
         for k, c in cells.items()}, "tagger", tag, ["tagger", "runner"])
    assert median == 0.5 and wins == {(0, 0): [0.0, 1.0], (0, 1): [0.0, 1.0]}
    # without the outcome (or its values): the returns' median rule, as before
    wins, median, _ = ratings.episode_wins(cells, "row")
    assert median == -2.0 and wins == {(0, 0): [1.0, 1.0], (0, 1): [0.0, 0.0]}
