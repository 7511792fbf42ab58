"""A plain run's snapshots over training (trainer.keep_snapshots) and their cross-play's
transitivity summary (training.judge.transitivity): `python -m gpusim.league RUN_DIR`."""
import json

import numba
import pytest
import torch

from gpusim import train
from gpusim.envs import env_class
from gpusim.errors import ConfigError
from gpusim.training.judge import league_cli as league_eval, transitivity
from gpusim.training.judge.players import Player, league_players, open_run
from gpusim.training.records import snapshots
from gpusim.training.run_config import load_run_config

TINY = ["--env", "simple_tag", "--backend", "cpu", "--num_envs", "8", "--quiet",
        "--set", "policy.hidden_sizes=[16,16]", "--set", "trainer.final_eval_episodes=0"]


def _train(argv):
    threads = torch.get_num_threads(), numba.get_num_threads()
    try:
        assert train.main(argv) == 0
    finally:  # the trainer binds this process's thread counts
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """10 iterations of one simple_tag episode each, 4 snapshots kept: 3, 5, 8, 10."""
    root = tmp_path_factory.mktemp("snapshot_runs")
    _train(TINY + ["--total_steps", "2000", "--set", "trainer.keep_snapshots=4",
                   "--results_dir", str(root)])
    (run,) = root.iterdir()
    return run


def test_snapshots_are_evenly_spaced_and_end_at_the_last_iteration():
    taken = [i for i in range(1, 11) if snapshots.due(i, 10, 4)]
    assert taken == [3, 5, 8, 10]
    assert [i for i in range(1, 4) if snapshots.due(i, 3, 16)] == [1, 2, 3]  # more than run
    assert not any(snapshots.due(i, 10, 0) for i in range(1, 11))
    assert sum(snapshots.due(i, 625, 16) for i in range(1, 626)) == 16


def test_a_plain_run_keeps_its_snapshots_as_players(plain_run):
    assert [i for i, _ in snapshots.listed(plain_run)] == [3, 5, 8, 10]
    models = snapshots.load(plain_run / "snapshots" / "iter_000003.pt")
    assert set(models) == {"adversary", "agent"}
    run = open_run(plain_run)
    players = league_players(run)
    for side in ("adversary", "agent"):  # the last snapshot is the final network: left out
        assert [p.label for p in players[side]] == ["u3", "u5", "u8", "final"]
        assert [p.update for p in players[side]] == [3, 5, 8, 10]
        first = players[side][0].model.state_dict()
        assert all(torch.equal(first[k], models[side][k]) for k in first)


def test_a_resumed_run_takes_its_later_snapshots_again(plain_run, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(plain_run, copy)
    snapshots.drop_after(copy, 5)
    assert [i for i, _ in snapshots.listed(copy)] == [3, 5]


def test_bad_keep_snapshots_is_one_line():
    for value in (-1, "many", 2.5):
        with pytest.raises(ConfigError) as caught:
            load_run_config("simple_tag", env_class("simple_tag"),
                            overrides={"trainer.keep_snapshots": value})
        assert "trainer.keep_snapshots" in str(caught.value)
        assert "\n" not in str(caught.value)


def test_league_cross_plays_a_plain_run_and_summarises_it(plain_run, tmp_path, capsys):
    assert league_eval.main([str(plain_run), "--episodes", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 adversary x 4 agent players" in out
    assert "| against a fixed opponent: a later snapshot scores less (forgetting) |" in out
    assert "intransitive triples" in out
    saved = json.loads((tmp_path / "league.json").read_text())
    summary = saved["transitivity"]
    assert summary["symmetric"]["times"] == [3, 5, 8, 10]
    assert summary["symmetric"]["pairs"] == 6 and summary["symmetric"]["triples"] == 4
    assert summary["sides"]["agent"]["comparisons"] == 6 * 4


def _players(n):
    return [Player(f"u{k}", "run", k, False, torch.nn.Identity()) for k in range(n)]


def _cells(x_return):
    """Cells of a made-up matrix: X's return per episode x_return(i, j, e), Y's its
    negative; 8 episodes per cell."""
    n = 3
    return {(i, j): {"x": [x_return(i, j, e) for e in range(8)],
                     "y": [-x_return(i, j, e) for e in range(8)]}
            for i in range(n) for j in range(n)}


def test_a_transitive_game_climbs_and_a_cyclic_one_cycles():
    players = {"x": _players(3), "y": _players(3)}
    noise = [0.1 * ((-1) ** e) for e in range(8)]
    climbing = transitivity.summary(_cells(lambda i, j, e: i - j + noise[e]), ["x", "y"],
                                    players)
    sym = climbing["symmetric"]
    assert sym["later_beats_earlier_sig"] == 3 and sym["earlier_beats_later"] == 0
    assert sym["cycles"] == 0
    for side in ("x", "y"):  # every later snapshot better against every opponent
        assert climbing["sides"][side]["later_better"] == 9
        assert climbing["sides"][side]["later_worse"] == 0
    # rock-paper-scissors over time: 1 beats 0, 2 beats 1, 0 beats 2
    rps = {(0, 1): -1, (1, 0): 1, (1, 2): -1, (2, 1): 1, (2, 0): -1, (0, 2): 1}
    cyclic = transitivity.summary(_cells(lambda i, j, e: rps.get((i, j), 0) + noise[e]),
                                  ["x", "y"], players)
    assert cyclic["symmetric"]["cycles"] == 1 and cyclic["symmetric"]["cycles_sig"] == 1
    assert cyclic["sides"]["x"]["later_worse"] > 0  # forgetting against some opponent
    # X's final (2) scores -1 against Y0 and 0 against Y2, where X1 and X0 score +1
    assert cyclic["sides"]["x"]["final_worse_against"] == ["u0", "u2"]
