"""python -m gpusim.league: cross-play, Bradley-Terry ratings, best responses, bad input.

Tiny simple_tag runs (a league with a snapshot every update, and plain runs) are trained
once per module, in this process."""
import json
import math
import sys

import numba
import numpy as np
import pytest
import torch

from gpusim import train
from gpusim.training.judge import league_cli as league_eval, ratings
from gpusim.training.judge.crossplay import cross_play, quotas, tiles
from gpusim.training.judge.league_cli import env_maker
from gpusim.training.judge.players import StackedPlayers, league_players, open_run, run_players
from gpusim.training.trained.evaluation import play

TINY = ["--backend", "cpu", "--num_envs", "8", "--quiet", "--set", "policy.hidden_sizes=[16,16]",
        "--set", "trainer.final_eval_episodes=0"]
RUNS = {  # simple_tag: a replica's episode is one iteration of rollout_len 25
    # 4 updates, a snapshot after each into a pool of 3: u3 and u4 evict u0 and u1
    "league": ["--env", "simple_tag", "--total_steps", "800", "--set", "trainer.league=true",
               "--set", "trainer.league_snapshot_every=1", "--set", "trainer.league_capacity=3"],
    "plain": ["--env", "simple_tag", "--total_steps", "1000", "--seed", "1"],
    "plain2": ["--env", "simple_tag", "--total_steps", "600", "--seed", "2"],
    "narrow": ["--env", "simple_tag", "--total_steps", "200", "--set",
               "policy.hidden_sizes=[8,8]"],
    "gridworld": ["--env", "tag_gridworld", "--total_steps", "256", "--rollout_len", "32",
                  "--set", "env.episode_length=20"],
    "cartpole": ["--env", "cartpole", "--total_steps", "64", "--rollout_len", "8"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("league_runs")
    made = {}

    def get(kind):
        if kind not in made:
            threads = torch.get_num_threads(), numba.get_num_threads()
            try:
                assert train.main(TINY + RUNS[kind] + ["--results_dir", str(root / kind)]) == 0
            finally:  # the trainer binds this process's thread counts
                torch.set_num_threads(threads[0])
                numba.set_num_threads(threads[1])
            (made[kind],) = (root / kind).iterdir()
        return made[kind]
    # one thread each while these tiny envs play (a second one only waits, on a busy
    # machine for milliseconds per operation), as a training rollout of their size takes
    threads = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    yield get
    torch.set_num_threads(threads[0])
    numba.set_num_threads(threads[1])


def test_a_cell_plays_what_evaluate_plays(runs):
    """Every cell of a matrix batched in tiles returns exactly the episodes evaluate.play
    gives the same two networks on as many replicas with the same seed (the slots of the
    stacked players, the tiles and the counted episodes all line up)."""
    opened = [open_run(runs("league")), open_run(runs("plain")), open_run(runs("plain2"))]
    players = run_players(opened)
    sides = opened[0].sides
    make = env_maker(opened[0], 7)
    # 4 replicas per cell, at most 24 at once: a tile of two rows by three columns (the
    # columns' players strided over the replicas), then one of the last row
    assert [(list(a), list(b)) for a, b in tiles(3, 3, 4, 24)] == [([0, 1], [0, 1, 2]),
                                                                  ([2], [0, 1, 2])]
    cells = cross_play(make, sides, players, 6, 4, 24, seed=7)
    assert quotas(6, 4) == [2, 2, 1, 1]
    for (i, j), cell in cells.items():
        env = opened[0].cls(num_envs=4, backend="cpu", seed=7, config=opened[0].config.env)
        direct = play(env, {sides[0]: players[sides[0]][i].model,
                            sides[1]: players[sides[1]][j].model}, 6)
        for side in sides:
            assert len(cell[side]) == 6
            assert sorted(cell[side]) == sorted(direct[f"return/{side}"]), (i, j, side)
    # different players meet different outcomes: the test could tell them apart
    assert len({tuple(c[sides[1]]) for c in cells.values()}) > 1


def test_identical_players_cells_agree(runs, tmp_path):
    """A run given twice: its two copies are one player, so every cell where the same
    networks meet agrees (exactly, under common random numbers; within its interval
    whatever the seed), and the copies get one rating."""
    league, plain = str(runs("league")), str(runs("plain"))
    result = league_eval.judge([league, plain, league], episodes=8, out=tmp_path,
                               log=lambda line: None)
    x, y = result["sides"]
    cell = {(c["i"], c["j"]): c["returns"] for c in result["cells"]}
    for side in (x, y):
        for a, b in [((0, 0), (2, 2)), ((0, 2), (2, 0)), ((0, 0), (0, 2)), ((0, 1), (2, 1)),
                     ((1, 0), (1, 2))]:
            assert cell[a][side]["episodes"] == cell[b][side]["episodes"], (side, a, b)
            assert abs(cell[a][side]["mean"] - cell[b][side]["mean"]) <= cell[a][side]["ci95"]
    elo = result["ratings"]["players"]
    for side in (x, y):
        assert elo[side][0]["elo"] == pytest.approx(elo[side][2]["elo"], abs=1e-6)
    # another seed: other starts, the same players; the means agree within the intervals
    other = league_eval.judge([league, league], episodes=16, seed=99, out=tmp_path / "b",
                              log=lambda line: None)
    c = {(c["i"], c["j"]): c["returns"] for c in other["cells"]}
    for side in (x, y):
        mean, ci = c[(0, 0)][side]["mean"], c[(0, 0)][side]["ci95"]
        assert abs(mean - cell[(0, 0)][side]["mean"]) <= math.hypot(ci, cell[(0, 0)][side]["ci95"])


def test_stacked_players_act_as_their_networks(runs):
    """Replicas in any slot order: each acts as its own player's network would."""
    opened = open_run(runs("league"))
    players = league_players(opened)
    side = opened.sides[1]
    models = [p.model for p in players[side]][:3]
    slots = torch.tensor([2, 0, 1, 1, 0, 2, 2, 1, 0])
    stacked = StackedPlayers(models, slots, "cpu")
    obs = torch.randn(9, 1, models[0].actor[0].weight.shape[1])
    out = stacked.log_probs(obs)
    for e, k in enumerate(slots.tolist()):
        torch.testing.assert_close(out[e], models[k].log_probs(obs[e]), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError):
        StackedPlayers(models, torch.tensor([0, 0, 1, 2]), "cpu")


def test_league_players_json_and_plot(runs, tmp_path, capsys, monkeypatch):
    """A league run's players: its pool's snapshots by update, then its final network;
    league.json and league.png written; without matplotlib, one line says so."""
    run = runs("league")
    assert league_eval.main([str(run), "--episodes", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    saved = json.loads((tmp_path / "league.json").read_text())
    x, y = saved["sides"]
    labels = [p["label"] for p in saved["players"][x]]
    # the pool held u3, u4 and u2 (slots 0, 1, 2); u4 is the final network itself
    assert labels == ["u2", "u3", "final"]
    assert [p["update"] for p in saved["players"][x]] == [2, 3, 4]
    assert len(saved["cells"]) == len(labels) * len(saved["players"][y])
    assert all(len(c["returns"][x]["episodes"]) == 4 for c in saved["cells"])
    rated = saved["ratings"]["players"]
    assert sum(r["elo"] for s in (x, y) for r in rated[s]) == pytest.approx(0.0, abs=1e-6)
    assert (tmp_path / "league.png").stat().st_size > 0
    assert "tagger" not in out.out and f"{x}'s mean episode return" in out.out
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert league_eval.main([str(run), "--episodes", "2", "--out", str(tmp_path / "n")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "league.png" in line]
    assert lines == ["league.png not drawn: matplotlib is not installed "
                     "(pip install 'gpusim[plot]')"]


def test_bradley_terry_hand_computed():
    """One X player won 3 of 4 games against one Y player: the odds are 3, so the centred
    strengths are +-ln(3)/2 (95.4 Elo points), with variance 1 / (4 n p (1 - p))."""
    theta, se = ratings.bradley_terry({(0, 0): 3.0}, {(0, 0): 4}, 1, 1, prior_sd=None)
    assert theta == pytest.approx([math.log(3) / 2, -math.log(3) / 2], abs=1e-9)
    assert ratings.ELO * theta[0] == pytest.approx(95.424, abs=1e-3)
    assert se == pytest.approx([math.sqrt(1 / 3)] * 2, abs=1e-9)
    # two X players, one Y: 3 of 4 and 1 of 4 -> ln 3, -ln 3 and 0
    theta, _ = ratings.bradley_terry({(0, 0): 3.0, (1, 0): 1.0}, {(0, 0): 4, (1, 0): 4}, 2, 1,
                                     prior_sd=None)
    assert theta == pytest.approx([math.log(3), -math.log(3), 0.0], abs=1e-9)
    # the prior keeps a player that won every game finite, and barely moves the others
    theta, _ = ratings.bradley_terry({(0, 0): 4.0}, {(0, 0): 4}, 1, 1)
    assert 1.0 < theta[0] < 6.0


def test_bradley_terry_recovers_the_order():
    """Games drawn from known strengths: the fit recovers their order (exact expected
    counts: the strengths themselves, centred)."""
    true = np.array([-1.0, 0.0, 1.5, 0.7, -0.4, 0.3])  # X players 0..2, Y players 3..5
    true -= true.mean()
    gen = np.random.default_rng(0)
    wins, expected, games = {}, {}, {}
    for i in range(3):
        for j in range(3):
            p = 1 / (1 + math.exp(-(true[i] - true[3 + j])))
            games[(i, j)] = 400
            expected[(i, j)] = 400 * p
            wins[(i, j)] = float(gen.binomial(400, p))
    theta, _ = ratings.bradley_terry(expected, games, 3, 3, prior_sd=None)
    assert theta == pytest.approx(true, abs=1e-8)
    theta, se = ratings.bradley_terry(wins, games, 3, 3)
    assert list(np.argsort(theta)) == list(np.argsort(true))
    assert np.all(np.abs(theta - true) < 3 * se)


def test_outcome_is_the_median_rule():
    cells = {(0, 0): {"a": [1.0, 2.0, 3.0], "b": [0, 0, 0]},
             (0, 1): {"a": [2.0, 5.0], "b": [0, 0]}}
    wins, games, median = ratings.outcomes(cells, "a")
    assert median == 2.0 and games == {(0, 0): 3, (0, 1): 2}
    assert wins == {(0, 0): 1.5, (0, 1): 1.5}  # above: 1, at the median: 1/2


def test_best_response_on_a_tiny_budget(runs, tmp_path, capsys):
    run = runs("plain")
    assert league_eval.main([str(run), "--best_response", "agent", "--budget", "400",
                             "--episodes", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "margin" in out.out and out.err == ""
    saved = json.loads((tmp_path / "best_response_agent.json").read_text())
    assert saved["training"]["env_steps"] == 400 and saved["frozen"] == "adversary"
    margin = saved["margin"]
    assert math.isfinite(margin["mean"]) and margin["ci95"] >= 0
    gap = saved["best_response"]["agent"]["mean"] - saved["own"]["agent"]["mean"]
    assert margin["mean"] == pytest.approx(gap, abs=1e-4)  # paired: the same episodes


@pytest.mark.parametrize("case", [
    "missing", "no_config", "one_policy", "other_env", "other_shapes", "plain_alone",
    "unknown_side", "budget_alone", "two_best_responses", "budget_too_small", "one_episode",
    "out_is_a_file"])
def test_bad_input_is_one_line(case, runs, tmp_path, capsys):
    plain, league = str(runs("plain")), str(runs("league"))
    argv = {
        "missing": [str(tmp_path / "nowhere")],
        "no_config": [str(tmp_path)],
        "one_policy": [str(runs("cartpole"))] if case == "one_policy" else None,
        "other_env": [plain, str(runs("gridworld"))] if case == "other_env" else None,
        "other_shapes": [plain, str(runs("narrow"))] if case == "other_shapes" else None,
        "plain_alone": [plain],
        "unknown_side": [plain, "--best_response", "tagger"],
        "budget_alone": [league, "--budget", "100"],
        "two_best_responses": [plain, league, "--best_response", "agent"],
        "budget_too_small": [plain, "--best_response", "agent", "--budget", "10"],
        "one_episode": [league, "--episodes", "1"],
        "out_is_a_file": [league, "--out", str(tmp_path / "a_file")],
    }[case]
    (tmp_path / "a_file").write_text("")
    capsys.readouterr()  # (the runs' training lines)
    with pytest.raises(SystemExit) if case == "one_episode" else _nothing() as caught:
        code = league_eval.main(argv)
    code = caught.value.code if case == "one_episode" else code
    out = capsys.readouterr()
    assert code == 2
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
