"""Watching and judging runs: `gpusim.render` writes animations that decode, and
`gpusim.evaluate` pairs trained and random policies with confidence intervals."""
import json

import pytest

from gpusim import train
from gpusim.envs import env_class
from gpusim.training.trained import evaluation
from gpusim.training.trained import animation

PIL = pytest.importorskip("PIL.Image", reason="rendering tests decode GIFs with Pillow")
pytest.importorskip("matplotlib")


def frames_in(path):
    with PIL.open(path) as image:
        return image.n_frames


@pytest.mark.parametrize("name", ["cartpole", "tag_gridworld", "tag_continuous"])
def test_random_policies_render_headless_to_a_gif(tmp_path, name):
    out = tmp_path / f"{name}.gif"
    count = animation.render(name, out, max_steps=6, seed=1)
    assert count == 6 and frames_in(out) == 6


def test_a_trained_run_renders_and_is_evaluated(tmp_path, capsys):
    results = tmp_path / "runs"
    assert train.main(["--env", "tag_continuous", "--backend", "cpu", "--num_envs", "4",
                       "--rollout_len", "8", "--total_steps", "64", "--quiet",
                       "--results_dir", str(results), "--set", "env.num_taggers=2",
                       "--set", "env.num_runners=4", "--set", "env.episode_length=12",
                       "--set", "env.num_other_agents_observed=3"]) == 0
    (run_dir,) = results.iterdir()
    out = tmp_path / "episode.gif"
    assert animation.main([str(run_dir), "--out", str(out), "--episodes", "2"]) == 0
    assert frames_in(out) == 2 * 12  # two whole episodes, one frame per step
    assert evaluation.main([str(run_dir), "--episodes", "8"]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((run_dir / "eval.json").read_text())
    assert list(saved["pairings"]) == ["tagger trained, runner trained",
                                       "tagger trained, runner random",
                                       "tagger random, runner trained",
                                       "tagger random, runner random"]
    for pairing, figures in saved["pairings"].items():
        assert pairing in printed
        assert set(figures) == {"return/tagger", "return/runner", "runner_steps_survived",
                                "runners_free_at_end"}
        survived = figures["runner_steps_survived"]
        assert 1 <= survived["mean"] <= 12 and survived["ci95"] >= 0
        assert 0 <= figures["runners_free_at_end"]["mean"] <= 1


def test_runner_survival_counts_steps_until_tagged():
    env = env_class("tag_continuous")(num_envs=1, backend="cpu", seed=0, config=env_class(
        "tag_continuous").config_class.load(num_taggers=1, num_runners=2, episode_length=3,
                                            num_other_agents_observed=1))
    measures = env.episode_measures()
    env.reset()
    import torch
    tagged = env.arrays["tagged_by"]
    for step, by in enumerate(([-1, -1, 0], [-1, -1, -1], [-1, -1, -1])):  # runner 2 at step 1
        tagged.copy_(torch.tensor([by], dtype=torch.int32))
        measures.after_step(torch.tensor([step == 2]))
    figures = measures.per_episode()
    assert figures["runner_steps_survived"] == [pytest.approx((3 + 1) / 2)]
    assert figures["runners_free_at_end"] == [0.5]


def test_confidence_interval_and_pairings():
    mean, half = evaluation.mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and half == pytest.approx(1.96 * (5 / 3 / 4) ** 0.5)
    assert evaluation.pairings(["a"]) == [("a",), ()]
    assert len(evaluation.pairings(["a", "b", "c"])) == 8


@pytest.mark.parametrize("argv, message", [
    (["nope_env", "--out", "x.gif"], "unknown env 'nope_env'"),
    (["cartpole", "--out", "x.avi"], "must end in .gif or .mp4"),
    (["cartpole", "--every", "0"], "argument --every: must be at least 1"),
    (["cartpole", "--replica", "3", "--out", "x.gif"], None),
])
def test_render_bad_input(tmp_path, capsys, argv, message):
    argv = [a if a != "x.gif" else str(tmp_path / "x.gif") for a in argv]
    code = exit_code(animation.main, argv)
    if message is None:  # a replica past the first is built and recorded
        assert code == 0
        return
    assert code == 2 and message in capsys.readouterr().err


def exit_code(main, argv) -> int:
    """What a tool's main returns, or the code it exits with (argument errors)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_evaluate_bad_input(tmp_path, capsys):
    assert evaluation.main([str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert exit_code(evaluation.main, [str(tmp_path), "--episodes", "1"]) == 2
