"""benchmarks/learning/league_strength.py's statistics on a synthetic matrix with known answers:
panel win rates without same-seed cells, worst cases, seed-level t-intervals, paired
differences."""
import math

import pytest


@pytest.fixture(scope="module")
def ls():
    from benchmarks.learning import league_strength
    return league_strength


def test_seed_ci_is_a_t_interval(ls):
    mean, half = ls.seed_ci([1.0, 2.0, 3.0, 4.0])
    # sd of 1..4 = sqrt(5/3); t(3) = 3.182; n = 4
    assert mean == 2.5 and half == pytest.approx(3.182 * math.sqrt(5 / 3) / 2)
    assert math.isnan(ls.seed_ci([0.7])[1])
    mean, half = ls.paired_ci({0: 0.6, 1: 0.7, 2: 0.8}, {0: 0.5, 1: 0.5, 2: 0.5, 9: 0.0})
    # differences 0.1, 0.2, 0.3 (seed 9 has no pair): mean 0.2, sd 0.1, t(2) = 4.303
    assert mean == pytest.approx(0.2) and half == pytest.approx(4.303 * 0.1 / math.sqrt(3))


def test_panel_scores_leave_out_the_own_seed_and_keep_the_worst(ls):
    judged = ["league0", "league1"]
    panel = ["plain0", "plain1", "chaser"]
    seed_of = {"league0": 0, "league1": 1, "plain0": 0, "plain1": 1}
    wins = {("league0", "plain0"): [0.0, 0.0],          # own seed: left out
            ("league0", "plain1"): [1.0, 0.5],           # 0.75
            ("league0", "chaser"): [0.0, 1.0, 0.5, 0.5],  # 0.5
            ("league1", "plain0"): [1.0, 1.0],            # 1.0
            ("league1", "plain1"): [1.0, 1.0],            # own seed: left out
            ("league1", "chaser"): [0.0, 0.0]}            # 0.0
    got = ls.panel_scores(wins, judged, panel, seed_of)
    assert got["league0"] == {"mean": 0.625, "worst": 0.5, "opponents": 2}
    assert got["league1"] == {"mean": 0.5, "worst": 0.0, "opponents": 2}


def test_mode_rows_on_a_known_matrix(ls):
    """Three seeds where the league's mean win rate is 0.1 above plain's on every seed:
    the paired interval is 0 wide and says the league wins; its worst case ties."""
    scores = {}
    for k in range(3):
        scores[f"league{k}"] = {"mean": 0.6 + 0.05 * k, "worst": 0.2}
        scores[f"plain{k}"] = {"mean": 0.5 + 0.05 * k, "worst": 0.2}
    modes = {"league": {k: f"league{k}" for k in range(3)},
             "plain": {k: f"plain{k}" for k in range(3)}}
    rows = {measure: (value, verdict) for measure, value, verdict in
            ls.mode_rows(scores, modes, "agent")}
    value, verdict = rows["agent: league minus plain, mean (paired by seed)"]
    assert value == "0.100 +- 0.000" and "3/3" in verdict and "the league wins" in verdict
    value, verdict = rows["agent: league minus plain, worst (paired by seed)"]
    assert value == "0.000 +- 0.000" and "no difference shown" in verdict
    value, seeds = rows["agent: league, mean win rate against the panel"]
    assert value == ls.fmt(ls.seed_ci([0.6, 0.65, 0.7])) and seeds == \
        "seeds 0.600, 0.650, 0.700"
