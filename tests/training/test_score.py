"""Scores beside training, the gradient noise scale, and the time_to_score search."""
import json
import random

import pytest
import torch

import gpusim
from gpusim.errors import GpusimError
from gpusim.scale.size_search import doublings, quickest

SMALL_TAG = ["--set", "env.num_taggers=2", "--set", "env.num_runners=4",
             "--set", "env.num_other_agents_observed=4", "--set", "env.episode_length=12",
             "--set", "trainer.num_envs=4", "--set", "trainer.rollout_len=8"]


def train(tmp_path, *argv):
    from gpusim.train import main
    code = main(["--backend", "cpu", "--quiet", "--results_dir", str(tmp_path), *argv])
    rows = []
    if code == 0:
        (run_dir,) = tmp_path.iterdir()
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return code, rows


# ---- the score's values, on the device --------------------------------------------------
def test_survival_on_device_matches_a_hand_count():
    """Each ended episode's mean steps survived per runner, counted on the host from the
    env's own record of who tagged whom at each step."""
    from gpusim.envs.tag_continuous.measures import SurvivalOnDevice
    env = gpusim.make("tag_continuous", num_envs=3, backend="cpu", seed=4, num_taggers=2,
                      num_runners=5, num_other_agents_observed=4, episode_length=30)
    env.reset()
    tracker = SurvivalOnDevice(env)
    runners = env.policies["runner"]
    tagged_at = [[None] * len(runners) for _ in range(3)]
    steps = [0, 0, 0]
    generator = torch.Generator().manual_seed(0)
    expected, got = [], []
    for _ in range(75):
        actions = torch.randint(0, 21, (3, env.num_agents, env.discrete_width),
                                generator=generator, dtype=torch.int32)
        env.step(actions)
        done = env.arrays["reset_mask"].clone()
        tagged = env.arrays["tagged_by"][:, runners] >= 0
        for e in range(3):
            steps[e] += 1
            for k in range(len(runners)):
                if tagged[e, k] and tagged_at[e][k] is None:
                    tagged_at[e][k] = steps[e]
        value = tracker.after_step(done)[0]
        for e in done.nonzero().flatten().tolist():
            expected.append(sum(steps[e] if t is None else t for t in tagged_at[e])
                            / len(runners))
            got.append(float(value[e]))
            tagged_at[e], steps[e] = [None] * len(runners), 0
    assert len(expected) >= 6
    assert got == pytest.approx(expected)


def test_monitor_keeps_ended_episodes_in_order_without_host_reads():
    from gpusim.training.score_monitor import ScoreMonitor
    monitor = ScoreMonitor.__new__(ScoreMonitor)
    monitor.values = torch.zeros(6)
    monitor.count = torch.zeros((), dtype=torch.long)
    monitor._keep(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False, True]))
    monitor._keep(torch.tensor([4.0, 5.0, 6.0]), torch.tensor([False, False, False]))
    monitor._keep(torch.tensor([7.0, 8.0, 9.0]), torch.tensor([False, True, False]))
    assert monitor.finished() == [1.0, 3.0, 8.0]
    assert monitor.finished() == []
    for _ in range(3):  # more than the buffer holds: the first five kept, the rest binned
        monitor._keep(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, True, True]))
    assert monitor.finished() == [1.0, 2.0, 3.0, 1.0, 2.0]


# ---- the score while training --------------------------------------------------------
def test_tag_runs_show_the_score_and_stop_at_its_target(tmp_path):
    code, rows = train(tmp_path, "--env", "tag_continuous", "--total_steps", "4000",
                       *SMALL_TAG, "--set", "trainer.score_window=4",
                       "--set", "trainer.target_score={tagger: 1000}")  # lower is better: any
    assert code == 0
    key = "score/runner_steps_survived/tagger"
    assert rows[0][key] is None and rows[0]["score_episodes"] == 0
    assert rows[-1][key] is not None and 0 < rows[-1][key] <= 12
    assert rows[-1]["score_episodes"] >= 4
    assert 0 < rows[-1]["time_share/score"] <= 1
    assert rows[-1]["env_steps"] < 4000  # stopped at the target, before the budget


def test_the_runner_side_improves_upward(tmp_path):
    code, rows = train(tmp_path, "--env", "tag_continuous", "--total_steps", "640",
                       *SMALL_TAG, "--set", "trainer.score_window=2",
                       "--set", "trainer.target_score={runner: 1000}")  # higher: unreachable
    assert code == 0
    assert rows[-1]["env_steps"] == 640 and rows[-1]["score/runner_steps_survived/runner"]


def test_an_env_without_a_score_is_scored_by_its_return(tmp_path):
    code, rows = train(tmp_path, "--env", "cartpole", "--total_steps", "40000",
                       "--set", "trainer.target_score=15", "--set", "trainer.target_return=null")
    assert code == 0
    assert rows[-1]["env_steps"] < 40000 and rows[-1]["episode_return/agent"] >= 15
    assert not any(key.startswith("score/") for key in rows[-1])


@pytest.mark.parametrize("argv,message", [
    (["--env", "cartpole", "--set", "trainer.target_score={agent: 1}"], "names none"),
    (["--env", "tag_continuous", "--set", "trainer.target_score={seeker: 1}"],
     "must name sides of env tag_continuous's score"),
    (["--env", "tag_continuous", "--set", "trainer.target_score=200"],
     "names the sides of tag_continuous's score and their targets, e.g. {tagger: 200}"),
    (["--env", "tag_continuous", "--set", "trainer.target_score={tagger: many}"],
     "'trainer.target_score' must map the score's sides to targets"),
    (["--env", "tag_continuous", "--set", "trainer.target_score={}"],
     "'trainer.target_score' must map the score's sides to targets"),
    (["--env", "tag_continuous", "--set", "trainer.score_every=0"], "trainer.score_every"),
    (["--env", "cartpole", "--set", "trainer.score_opponents=scripted"], "names none"),
    (["--env", "tag_continuous", "--set", "trainer.score_envs=0"],
     "'trainer.target_score' is measured on tag_continuous's score"),
    (["--env", "cartpole", "--set", "trainer.noise_scale_every=-1"], "noise_scale_every"),
    (["--env", "cartpole", "--auto_scale", "--set", "scale.noise_scale=0"], "noise_scale"),
])
def test_score_inputs_refused_in_one_line(argv, message, tmp_path, capsys):
    from gpusim.train import main
    code = main(["--backend", "cpu", "--quiet", "--results_dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_two_sided_score_stops_when_both_sides_reach_their_targets(tmp_path, capsys):
    """Each side measured on its own replicas against the other side's fixed opponents; the
    run stops once both targets hold over full windows; the progress line shows both."""
    code, rows = train(tmp_path, "--env", "tag_continuous", "--total_steps", "8000",
                       *SMALL_TAG, "--set", "trainer.score_window=4",
                       "--set", "trainer.target_score={tagger: 1000, runner: 1}")
    assert code == 0
    last = rows[-1]
    assert 0 < last["score/runner_steps_survived/tagger"] <= 12
    assert 1 <= last["score/runner_steps_survived/runner"] <= 12
    assert last["score_episodes"] >= 4 and last["env_steps"] < 8000  # both held: stopped
    from gpusim.training.records.logger import RunLogger
    (tmp_path / "shown").mkdir()
    logger = RunLogger(tmp_path / "shown", total_iterations=last["iteration"])
    logger.progress(last, last=True)  # the line a log shows for it
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "| runner_steps_survived tagger=" in line and ", runner=" in line, line
    logger.close()


def test_a_checkpoint_keeps_the_scores_window(tmp_path):
    from gpusim.train import main
    code, rows = train(tmp_path, "--env", "tag_continuous", "--total_steps", "640",
                       *SMALL_TAG)
    (run_dir,) = tmp_path.iterdir()
    assert main(["--resume", str(run_dir), "--total_steps", "960", "--quiet"]) == 0
    resumed = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert resumed[-1]["score_episodes"] >= rows[-1]["score_episodes"] > 0


# ---- the gradient noise scale ----------------------------------------------------------
def ppo_after_rollout(**algo):
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    from gpusim.envs import env_class
    cls = env_class("cartpole")
    config = load_run_config("cartpole", cls, sets=["trainer.backend=cpu",
                                                    "trainer.compile=off",
                                                    "trainer.num_envs=8",
                                                    "trainer.rollout_len=16"]
                             + [f"trainer.{k}={v}" for k, v in algo.items()])
    trainer = Trainer(config, cls)
    trainer.algorithm.collect(0)
    return trainer


def test_noise_scale_groups_average_to_the_whole_rollouts_gradient():
    from gpusim.training.noise_scale import NoiseScale
    trainer = ppo_after_rollout()
    ppo = trainer.algorithm
    (p,) = ppo.policies
    noise = NoiseScale(1, 8)
    g_big, g_small, big, small = noise.norms(ppo, p)
    assert (big, small) == (8 * 16, 16)
    # the whole rollout's gradient, in one pass, from the same normalised advantages
    buf = p.buffer
    with torch.no_grad():
        next_value = ppo.values(p, ppo.next_obs, None)
        adv, _ = p.gae(buf.rewards, buf.values, buf.dones, next_value.float())
        adv = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)
    log_prob, _, _ = p.model(buf.obs, buf.actions)
    actor = [q for name, q in p.model.named_parameters() if not name.startswith("critic")]
    grads = torch.autograd.grad(-(adv * log_prob).sum() / big, actor)
    whole = sum(float(g.pow(2).sum()) for g in grads)
    assert g_big == pytest.approx(whole, rel=1e-4)
    assert g_small > g_big  # a part's gradient is noisier than the whole's


def test_noise_scale_estimates_follow_the_formulas(monkeypatch):
    from gpusim.training.noise_scale import NoiseScale
    noise = NoiseScale(2, 8)
    norms = iter([(4.0, 10.0, 100, 10), (3.0, 12.0, 100, 10)])
    monkeypatch.setattr(noise, "norms", lambda ppo, p: next(norms))

    class P:
        name = "agent"

    class PPO:
        policies = [P()]

    g2 = [(100 * 4 - 10 * 10) / 90, (100 * 3 - 10 * 12) / 90]
    trace = [(10 - 4) / (1 / 10 - 1 / 100), (12 - 3) / (1 / 10 - 1 / 100)]
    first = noise.measure(PPO())["agent"]
    assert first["noise_scale"] == pytest.approx(trace[0] / g2[0])
    assert noise.measure(PPO()) == {}  # not due: every second call
    second = noise.measure(PPO())["agent"]
    assert second["noise_scale"] == pytest.approx((0.9 * trace[0] + trace[1])
                                                  / (0.9 * g2[0] + g2[1]))
    assert second["noise_scale_run"] == pytest.approx(sum(trace) / sum(g2))


def test_noise_scale_is_logged_where_asked(tmp_path):
    code, rows = train(tmp_path, "--env", "cartpole", "--total_steps", "4096",
                       "--set", "trainer.noise_scale_every=2", "--num_envs", "8")
    assert code == 0
    measured = [r["iteration"] for r in rows if "noise_scale_run/agent" in r]
    assert measured and all(i % 2 == 1 for i in measured)


# ---- the time_to_score search -------------------------------------------------------
def u_shaped(rates, noise_scale, per_step=8):
    return lambda value, rate: 1e5 * (1 + value * per_step / noise_scale) / rate


def test_quickest_finds_the_bottom_of_the_u():
    rates = {4: 1000, 8: 1900, 16: 3500, 32: 6000, 64: 8000, 128: 9000, 256: 9500}
    tried = []

    def throughput(value):
        tried.append(value)
        return rates.get(value)
    out = quickest(throughput, u_shaped(rates, 400), 16, doublings(16, 256))
    # 128 not tried: at 8000 x (8000 / 6000) env steps/s it would still lose to 32
    assert out.pick == 32 and tried == [16, 8, 32, 64]
    assert min(out.times, key=out.times.get) == 32
    assert "128 could not beat" in out.why


def test_quickest_prefers_the_config_among_near_ties():
    rates = {8: 5000, 16: 9600, 32: 19000, 64: 20000}
    out = quickest(rates.get, lambda v, r: 1e5 / r * (1 + v / 1e6), 16, doublings(16, 64))
    assert out.pick == 32  # 16 is 2x slower; 32 and 64 tie: the nearer
    flat = {8: 9000, 16: 9500, 32: 10000, 64: 10200}
    assert quickest(flat.get, lambda v, r: 1e5 / r, 16, doublings(16, 64)).pick == 16


def test_quickest_picks_steadily_under_trial_noise():
    """Throughputs jittered by 3% (a quiet machine's trials): the pick stays put."""
    rates = {2: 1200, 4: 2300, 8: 4200, 16: 7000, 32: 9500, 64: 11000, 128: 11500}
    picks = set()
    rng = random.Random(0)
    for _ in range(50):
        noisy = {v: r * (1 + rng.uniform(-0.03, 0.03)) for v, r in rates.items()}
        picks.add(quickest(noisy.get, u_shaped(rates, 300), 16, doublings(16, 128)).pick)
    assert len(picks) == 1


def test_quickest_tries_the_measured_sizes_only_and_skips_hopeless_ones():
    """E measured at 1x, 4x and 16x of 16 replicas, throughput flat (a 2-core CPU):
    64 wins on E alone, and 256, whose E is 64's, is never run."""
    e = {16: 656e3, 64: 512e3, 256: 512e3}
    tried = []

    def throughput(value):
        tried.append(value)
        return 2000.0
    out = quickest(throughput, lambda v, r: e[v] / r, 16, [16, 64, 256])
    assert out.pick == 64 and tried == [16, 64]
    assert "256 could not beat" in out.why
    with pytest.raises(GpusimError, match="not among the sizes"):
        quickest(throughput, lambda v, r: 1.0, 32, [16, 64])


def test_doublings():
    assert doublings(16, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert doublings(16, 64, lowest=4) == [4, 8, 16, 32, 64]
    assert doublings(12, 50, lowest=3) == [3, 6, 12, 24, 48]


def test_quickest_edge_cases():
    assert quickest(lambda v: None, lambda v, r: 1.0, 4, doublings(4, 8)).pick == 0
    out = quickest(lambda v: 100.0 * v if v <= 8 else None, lambda v, r: 1e3 / r, 4,
                   doublings(4, 64))
    assert out.pick == 8 and out.times[16] is None  # a size that did not fit ends the climb


def test_a_search_cap_below_the_config_names_both_keys(tmp_path, capsys):
    from gpusim.train import main
    code = main(["--env", "cartpole", "--backend", "cpu", "--auto_scale", "--quiet",
                 "--results_dir", str(tmp_path), "--set", "scale.max_num_envs=16"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "'scale.max_num_envs' (16) is below trainer.num_envs (32)" in err


def test_the_recipes_score_settings_hold_for_its_env_settings(capsys):
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    cls = env_class("tag_continuous")
    recipe = load_run_config("tag_continuous", cls).trainer
    assert (recipe.target_score, recipe.score_opponents) == ({"tagger": 200}, "scripted")
    other = load_run_config("tag_continuous", cls, sets=["env.episode_length=50"])
    assert (other.trainer.target_score, other.trainer.score_opponents) == (None, "random")
    kept = load_run_config("tag_continuous", cls, sets=["env.num_runners=8",
                                                        "trainer.score_opponents=scripted"])
    assert kept.trainer.score_opponents == "scripted"
    assert capsys.readouterr().err == ""
    given = load_run_config("tag_continuous", cls, sets=["env.episode_length=50",
                                                         "trainer.target_score={tagger: 30}"])
    assert given.trainer.target_score == {"tagger": 30}


def test_quickest_measures_the_start_and_the_near_ones_again():
    """A cold first trial made the start look slow: measured again, it is kept."""
    first = {16: 1000, 8: 1500, 4: 1450, 32: 900}
    second = {16: 1600, 8: 1520, 4: 1500, 32: 900}
    calls = []

    def again(value):
        calls.append(value)
        return second[value]
    out = quickest(first.get, lambda v, r: 1e5 / r, 16, doublings(16, 64), again=again)
    assert calls == [16]  # the start at once: then 8 is no quicker, and 4 is not tried
    assert out.rates[16] == 1600 and out.pick == 16 and 4 not in out.rates
    calls.clear()
    second[8] = 1900  # 8 is the quickest, and measured twice
    out = quickest({16: 1000, 8: 1800, 4: 1100}.get, lambda v, r: 1e5 / r, 16,
                   doublings(16, 64), again=again)
    assert calls == [16, 8] and out.rates[8] == 1900 and out.pick == 8


# ---- the score's pace: counted, so a seed gives one run ---------------------------------
TIMED = ("time_s", "env_steps_per_s", "time_share/")


def untimed(rows):
    return [{k: v for k, v in row.items() if not k.startswith(TIMED)} for row in rows]


def test_a_resumed_run_logs_the_rows_of_one_never_stopped(tmp_path):
    """Killed after its checkpoint of iteration 4 (the later ones lost), resumed: every
    row from there on, score rows included, is the uninterrupted run's."""
    import shutil
    from gpusim.train import main
    whole = tmp_path / "whole"
    argv = ["--env", "tag_continuous", "--total_steps", "384", *SMALL_TAG,
            "--set", "trainer.score_window=2", "--set", "trainer.checkpoint_every=4",
            "--set", "trainer.score_opponents=scripted"]
    code, rows = train(whole, *argv)
    assert code == 0 and len(rows) == 12
    assert sum(r["score/runner_steps_survived/tagger"] is not None for r in rows) >= 6
    (run_dir,) = whole.iterdir()
    killed = tmp_path / "killed"
    shutil.copytree(run_dir, killed)
    for late in (killed / "checkpoints").glob("checkpoint_0000[0-9][0-9].pt"):
        if int(late.stem.split("_")[1]) > 4:
            late.unlink()
    assert main(["--resume", str(killed), "--quiet"]) == 0
    resumed = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert untimed(resumed) == untimed(rows)


def test_the_score_pace_is_counted_in_iterations(tmp_path):
    """score_every 3: a chunk at iterations 0, 3, 6, ...; the same seed, the same rows."""
    argv = ["--env", "tag_continuous", "--total_steps", "256", *SMALL_TAG,
            "--set", "trainer.score_window=1", "--set", "trainer.score_every=3"]
    code, rows = train(tmp_path / "a", *argv)
    assert code == 0
    grew = [r["iteration"] for r, before in zip(rows, [{"score_episodes": 0}] + rows)
            if r["score_episodes"] > before["score_episodes"]]
    assert grew and all((i - 1) % 3 == 0 for i in grew)  # (rows count iterations from 1)
    again = train(tmp_path / "b", *argv)[1]
    assert untimed(again) == untimed(rows)


def test_scripted_opponents_play_the_score_replicas():
    from gpusim.envs import env_class
    from gpusim.envs.tag_continuous.scripted import Chaser, Fleer
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    cls = env_class("tag_continuous")
    sets = [item for item in SMALL_TAG if item != "--set"] + ["trainer.backend=cpu"]
    for side, opponent in (("tagger", Fleer), ("runner", Chaser)):
        config = load_run_config("tag_continuous", cls, sets=sets + [
            f"trainer.target_score={{{side}: null}}", "trainer.score_opponents=scripted"])
        (monitor,) = Trainer(config, cls).score.monitors.values()
        (other,) = [name for name in ("tagger", "runner") if name != side]
        assert isinstance(monitor.actors.policies[other], opponent)
        assert not isinstance(monitor.actors.policies[side], (Chaser, Fleer))
