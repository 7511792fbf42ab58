"""Auto-scaling: the search on injected predicates, trial classification, and a real run."""
import math

import pytest
import yaml

from gpusim import sizes
from gpusim.backends import get_backend
from gpusim.errors import GpusimError
from gpusim.scale.size_search import Searcher, fastest, largest_passing
from gpusim.sizes import parse_size


def predicate(limit, log):
    def trial(value):
        log.append(value)
        return value <= limit
    return trial


@pytest.mark.parametrize("limit,cap", [(1, 1000), (2, 1000), (3, 1000), (37, 1000),
                                       (511, 1000), (512, 1000), (513, 1000), (999, 1000),
                                       (1000, 1000), (5000, 1000), (70000, 65536),
                                       (12345, 65536)])
def test_search_is_maximal_in_logarithmic_trials(limit, cap):
    tried = []
    best, values = largest_passing(predicate(limit, tried), cap)
    assert values == tried
    assert best == min(limit, cap)
    assert best == cap or best + 1 in tried  # the next step up was tried and failed
    assert len(tried) == len(set(tried))  # nothing tried twice
    assert len(tried) <= 2 * math.ceil(math.log2(cap)) + 2


def test_search_failure_at_one():
    tried = []
    best, _ = largest_passing(predicate(0, tried), 1024)
    assert best == 0 and tried == [1]


def test_search_success_up_to_cap_brackets_by_doubling():
    tried = []
    best, _ = largest_passing(predicate(10**9, tried), 1000)
    assert best == 1000
    assert tried == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]


def test_search_propagates_other_errors():
    def trial(value):
        if value > 8:
            raise ValueError("not a resource problem")
        return True
    with pytest.raises(ValueError, match="not a resource problem"):
        largest_passing(trial, 1000)


def test_search_stops_starting_trials_after_its_time_limit():
    tried = []
    best, _ = largest_passing(predicate(10**9, tried), 10**6, time_limit_s=0.0)
    assert best == 1 and tried == [1]  # the first trial always runs


# ---- the throughput objective on injected throughput curves ---------------------------
def saturating(n):
    """Throughput that grows linearly at first and saturates (gains 5% per doubling at ~950)."""
    return 1000.0 * n / (1 + n / 100)


def test_fastest_steps_geometrically_then_refines_the_last_bracket():
    tried = []

    def rate(n):
        tried.append(n)
        return saturating(n)
    out = fastest(rate, cap=65536, saturation=0.05, start=16)
    assert tried[:4] == [16, 64, 256, 1024]   # x4 from the start
    pick = out.pick
    assert 512 <= pick <= 2048
    assert saturating(pick) / saturating(pick // 2) >= 1.05      # the last doubling paid
    assert saturating(2 * pick) / saturating(pick) < 1.05        # the next one would not
    assert len(tried) <= 7 and max(tried) <= 4096                # a handful, never the cap
    assert "gained" in out.why and "less than" in out.why


def test_fastest_refines_a_bracket_only_where_its_step_paid_something():
    # 16 -> 64 gains 8%: less than the 10% two doublings should, more than one's 5%
    out = fastest(lambda n: {16: 100.0, 64: 108.0, 32: 106.0}[n], cap=64, saturation=0.05,
                  start=16)
    assert sorted(out.rates) == [16, 32, 64] and out.pick == 32
    out = fastest(lambda n: {16: 100.0, 64: 102.0}[n], cap=64, saturation=0.05, start=16)
    assert sorted(out.rates) == [16, 64] and out.pick == 16  # +2%: no midpoint


def test_fastest_never_goes_below_its_start():
    out = fastest(lambda n: 100.0 / n, cap=4096, saturation=0.05, start=16)
    assert out.pick == 16 and min(out.rates) == 16
    assert sorted(out.rates) == [16, 64]  # the x4 step lost: no midpoint tried


def test_fastest_respects_memory_it_was_told_and_what_did_not_fit():
    def fits_below_300(n):
        return saturating(n) if n <= 300 else None
    out = fastest(fits_below_300, cap=65536, saturation=0.05)
    assert 256 <= out.pick <= 300
    assert all(rate is None for n, rate in out.rates.items() if n > 300)
    assert "did not fit" in out.why
    # a memory bound stops the steps at the bound, untried beyond it
    out = fastest(lambda n: float(n), cap=65536, saturation=0.05, start=10, bound=lambda: 500)
    assert out.pick == 500 and max(out.rates) == 500
    assert "memory allows" in out.why


def test_fastest_with_noise_free_flat_curve_keeps_the_smallest():
    out = fastest(lambda n: 5.0, cap=1024, saturation=0.05)
    assert out.pick == 1 and sorted(out.rates) == [1, 4]
    assert "+0%" in out.why


def test_fastest_edge_cases():
    assert fastest(lambda n: None, cap=64, saturation=0.05).pick == 0  # start does not fit
    out = fastest(lambda n: float(n), cap=100, saturation=0.05)  # linear: the cap
    assert out.pick == 100 and "scale.max_num_envs" in out.why
    out = fastest(lambda n: float(n), cap=10**6, saturation=0.05, time_limit_s=0.0)
    assert out.pick == 1 and list(out.rates) == [1] and "time limit" in out.why
    out = fastest(lambda n: float(min(n, 4096)), cap=65536, saturation=0.05, start=1024)
    assert out.pick == 4096
    with pytest.raises(GpusimError, match="search start"):
        fastest(lambda n: 1.0, cap=8, saturation=0.05, start=16)


def test_searcher_bounds_the_next_size_by_the_memory_measured():
    from gpusim.scale.size_search import Trial
    searcher = Searcher("n", None, FakeBackend(), limit_bytes=1000, cap=10**6,
                        log=lambda *a: None)
    assert searcher.largest_fitting() == 10**6  # nothing measured: no bound yet
    searcher.trials.append(Trial(10, True, 1.0, peak_bytes=100))
    assert searcher.largest_fitting() == 100   # through zero: 10 bytes a value
    searcher.trials.append(Trial(20, True, 1.0, peak_bytes=150))
    assert searcher.largest_fitting() == 190   # 5 bytes a value past a fixed 50
    searcher.trials.append(Trial(40, False, 1.0, peak_bytes=None, note="out of memory"))
    assert searcher.largest_fitting() == 190   # a failure adds no measurement


class FakeBackend:
    """The cpu backend's classification, with a counter of clean-ups."""

    def __init__(self):
        self.real = get_backend("cpu")
        self.device = self.real.device
        self.freed = 0

    def is_resource_error(self, exc):
        return self.real.is_resource_error(exc)

    def free_memory(self):
        self.freed += 1


@pytest.mark.slow
def test_searcher_counts_oom_as_failure_and_aborts_on_other_errors():
    backend = FakeBackend()

    def body(value):
        if value > 40:
            raise MemoryError("cannot allocate")
        if value > 20:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 10 GB")
        return {}
    searcher = Searcher("n", body, backend, limit_bytes=2**40, cap=1000, log=lambda *a: None)
    assert searcher.run() == 20
    failures = [t for t in searcher.trials if not t.ok]
    assert failures and all("allocate" in t.note for t in failures)
    assert backend.freed == len(searcher.trials) + 1  # every trial cleaned up (and warm-up)

    def broken(value):
        if value > 4:
            raise KeyError("a bug, not a lack of memory")
        return {}
    with pytest.raises(KeyError):
        Searcher("n", broken, backend, 2**40, 1000, log=lambda *a: None).run()


@pytest.mark.slow
def test_searcher_measures_peak_memory_against_its_limit():
    import numpy as np
    backend = FakeBackend()

    def body(value):  # value MiB, touched, then freed: only the peak sees it
        block = np.ones(value * 2**20 // 8)
        del block
        return {}
    searcher = Searcher("mib", body, backend, limit_bytes=48 * 2**20, cap=256,
                        log=lambda *a: None)
    best = searcher.run()
    assert 40 <= best <= 48
    over = [t for t in searcher.trials if not t.ok]
    assert all(t.peak_bytes > 48 * 2**20 for t in over)


@pytest.mark.parametrize("text,size", [("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20),
                                       ("1.5GB", 1_500_000_000), ("1000", 1000),
                                       ("64 mib", 64 * 2**20)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "2 parsecs", "-1GiB", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(GpusimError):
        parse_size(text)


def auto_scaled(tmp_path, capsys, *argv) -> tuple:
    """(saved config, its auto-scale report, stdout) of a real `--auto_scale` run."""
    from gpusim.train import main
    code = main(["--backend", "cpu", "--auto_scale", "--quiet", "--results_dir",
                 str(tmp_path), *argv])
    out = capsys.readouterr().out
    assert code == 0, out
    (run_dir,) = tmp_path.iterdir()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return config, config["auto_scale_report"], out


@pytest.mark.slow
def test_memory_objective_picks_fit_and_next_step_up_does_not(tmp_path, capsys):
    """A real `--auto_scale` (objective memory) on tag_continuous under a small budget."""
    config, report, out = auto_scaled(
        tmp_path, capsys, "--env", "tag_continuous", "--memory_budget", "48MiB",
        "--total_steps", "2000", "--set", "env.num_taggers=2", "--set", "env.num_runners=6",
        "--set", "env.num_other_agents_observed=4", "--set", "scale.objective=memory",
        "--set", "scale.max_rollout_len=64", "--set", "scale.min_rollout_len=8")
    num_envs, rollout_len = report["num_envs"], report["rollout_len"]
    assert config["trainer"]["num_envs"] == num_envs
    assert config["trainer"]["rollout_len"] == rollout_len
    assert f"picked num_envs={num_envs}, rollout_len={rollout_len}" in out

    # search 1: its pick passed within the replicas' limit; one more replica did not
    env_trials = {t["value"]: t for t in report["trials"]["num_envs"]}
    pick = report["num_envs_search_pick"]
    assert env_trials[pick]["ok"] and env_trials[pick]["peak_bytes"] <= report["env_limit_bytes"]
    assert not env_trials[pick + 1]["ok"]
    assert env_trials[pick + 1]["peak_bytes"] > report["env_limit_bytes"]
    assert num_envs in [pick >> k for k in range(20)]  # halved only if a batch did not fit

    # search 2: the pick passed within the usable budget; one more step did not
    batch_trials = {t["value"]: t for t in report["trials"]["rollout_len"]
                    if t["num_envs"] == num_envs}
    assert batch_trials[rollout_len]["ok"]
    assert batch_trials[rollout_len]["peak_bytes"] <= report["usable_bytes"]
    if rollout_len < 64:
        assert not batch_trials[rollout_len + 1]["ok"]
        assert batch_trials[rollout_len + 1]["peak_bytes"] > report["usable_bytes"]
    assert report["search_s"] > 0 and report["final_env_steps_per_s"] > 0

    # Rerunning with the saved config reproduces the sizes without searching.
    from gpusim.training.run_config import load_run_dir_config
    (run_dir,) = tmp_path.iterdir()
    _, rerun = load_run_dir_config(run_dir)
    assert (rerun.trainer.num_envs, rerun.trainer.rollout_len) == (num_envs, rollout_len)


@pytest.mark.slow
def test_throughput_objective_run_reports_every_trial_and_its_speedup(tmp_path, capsys):
    """A real `--auto_scale` (the throughput objective) on a small tag_continuous."""
    from gpusim.train import main
    code = main(["--env", "tag_continuous", "--backend", "cpu", "--auto_scale",
                 "--set", "scale.objective=throughput",
                 "--memory_budget", "2GiB", "--total_steps", "3000", "--quiet",
                 "--results_dir", str(tmp_path), "--set", "trainer.num_envs=4",
                 "--set", "trainer.rollout_len=8",
                 "--set", "env.num_taggers=2", "--set", "env.num_runners=6",
                 "--set", "env.num_other_agents_observed=4", "--set", "env.episode_length=20",
                 "--set", "scale.max_num_envs=64", "--set", "scale.trial_seconds=0.2"])
    out = capsys.readouterr().out
    assert code == 0, out
    (run_dir,) = tmp_path.iterdir()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    report = config["auto_scale_report"]
    assert report["objective"] == "throughput"
    assert config["trainer"]["num_envs"] == report["num_envs"]
    assert config["trainer"]["rollout_len"] == report["rollout_len"] == 8  # given: kept as given
    (base,) = report["trials"]["baseline"]
    assert base["value"] == 4 and base["ok"] and base["info"]["env_steps_per_s"] > 0
    trials = {t["value"]: t for t in report["trials"]["num_envs"]}
    assert all(t["peak_bytes"] is not None for t in trials.values())
    pick = report["num_envs"]
    rate = {v: t["info"]["env_steps_per_s"] for v, t in trials.items() if t["ok"]}
    if pick < 64:  # it stopped because a larger value did not fit or gained too little
        assert any(v > pick for v in trials)
    assert report["speedup_over_config"] == pytest.approx(
        report["trial_env_steps_per_s"] / report["baseline_env_steps_per_s"], rel=0.01)
    assert f"{report['speedup_over_config']:.2f}x the config's" in out
    if report["speedup_over_config"] < 1.5:
        assert "below 1.5x the config because" in out and report["why_not_faster"]
    assert min(trials) == 4 and rate[4] > 0 and report["final_env_steps_per_s"] > 0


@pytest.mark.parametrize("argv,message", [
    (["--memory_budget", "1GiB"], "add --auto_scale"),
    (["--auto_scale", "--num_envs", "8"], "drop --num_envs"),
    (["--auto_scale", "--memory_budget", "lots"], "cannot read memory size"),
])
def test_auto_scale_flag_errors(argv, message, capsys, tmp_path):
    from gpusim.train import main
    code = main(["--env", "cartpole", "--backend", "cpu", "--results_dir", str(tmp_path)] + argv)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_format_size():
    assert sizes.format_size(3 * 2**30) == "3.00 GiB"
    assert sizes.format_size(None) == "-"


@pytest.mark.slow
def test_auto_scale_with_two_processes_agrees_on_the_picks(tmp_path):
    """Both ranks search; the run uses the minimum, and rank 0 records it."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = str(root)
    done = subprocess.run(
        [sys.executable, "-m", "gpusim.train", "--env", "tag_continuous", "--backend", "cpu",
         "--num_gpus", "2", "--auto_scale", "--memory_budget", "40MiB", "--total_steps", "2000",
         "--quiet", "--results_dir", str(tmp_path), "--set", "env.num_taggers=2",
         "--set", "env.num_runners=6", "--set", "env.num_other_agents_observed=4",
         "--set", "scale.max_num_envs=256", "--set", "scale.max_rollout_len=16",
         "--set", "scale.min_rollout_len=1", "--set", "scale.objective=memory"],
        capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("auto-scale picked") == 1  # rank 0 alone reports
    (run_dir,) = tmp_path.iterdir()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    report = config["auto_scale_report"]
    assert report["processes"] == 2
    assert report["num_envs_search_pick"] <= report["num_envs_rank0_pick"]  # min over ranks
    assert report["num_envs"] <= report["num_envs_search_pick"]
    assert config["trainer"]["num_envs"] == report["num_envs"]


def tiny_tag(**overrides):
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    cls = env_class("tag_continuous")
    return cls, load_run_config("tag_continuous", cls, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 8,
        "trainer.total_steps": 10_000, "env.num_taggers": 2, "env.num_runners": 6,
        "env.num_other_agents_observed": 4, "env.episode_length": 20,
        "scale.trial_seconds": 0.05, "scale.memory_budget": "4GiB",
        "scale.objective": "throughput", **overrides})


def searched_tiny_tag(**overrides) -> tuple:
    """(the config AutoScale picks for tiny_tag(**overrides) on the CPU, its log lines)."""
    from gpusim.scale.device import DeviceContext
    from gpusim.training.autoscale.auto_scale import AutoScale
    cls, config = tiny_tag(**overrides)
    context = DeviceContext()
    context.bind("cpu", quiet=True)
    lines = []
    return AutoScale(config, cls, context, log=lines.append).run(), lines


def test_search_starts_at_the_config_and_trials_compile_nothing_new():
    """Trials run uncompiled (even where the run compiles): after the first trial, no trial
    builds a kernel or compiles a graph; and the search never goes below the config."""
    picked, lines = searched_tiny_tag(**{"trainer.compile": "on", "scale.max_num_envs": 16,
                                         "scale.min_rollout_len": 8})
    report = picked.auto_scale_report
    trials = report["trials"]["num_envs"]
    assert trials[0]["value"] == 4 == report["trials"]["baseline"][0]["value"]
    assert [t["value"] for t in trials][:2] == [4, 16]
    assert all(t["info"]["compiles"] == 0 for t in trials[1:]), trials
    assert isinstance(report["compiles"], int) and picked.trainer.compile == "on"  # the run
    # itself compiles
    assert picked.trainer.num_envs >= 4
    assert any(line.startswith("search 1 stopped: ") for line in lines)


def test_a_run_with_a_target_score_searches_without_one(capsys):
    """The search's trials (and its noise-scale run) time training alone, with no score
    replicas: a run with a target score (the tag recipe's) searches, and keeps its target."""
    picked, lines = searched_tiny_tag(**{"scale.objective": "time_to_score",
                                         "scale.max_num_envs": 8, "trainer.target_score": 15.0})
    assert picked.trainer.target_score == 15.0 and picked.trainer.score_envs > 0
    assert any("noise scale" in line for line in lines), lines


class CudaAPIError(Exception):
    """Stands in for numba's launch error (matched by class name and code)."""

    def __init__(self, code, text):
        super().__init__(f"[{code}] {text}")
        self.code = code


@pytest.mark.parametrize("error", [
    lambda: __import__("torch").OutOfMemoryError("CUDA out of memory. Tried to allocate 55 GiB"),
    lambda: CudaAPIError(701, "Call to cuLaunchKernel results in "
                              "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")])
def test_out_of_memory_while_training_is_one_error_line(error, monkeypatch, capsys, tmp_path):
    from gpusim.train import main
    from gpusim.training.loop import Trainer

    def fail(self):
        raise error()
    monkeypatch.setattr(Trainer, "train", fail)
    code = main(["--env", "cartpole", "--backend", "cpu", "--total_steps", "256", "--quiet",
                 "--results_dir", str(tmp_path), "--set", "trainer.final_eval_episodes=0"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("error: the run does not fit cpu") and err.count("\n") == 1, err
    assert "replicas x rollout_len" in err and "lower trainer.num_envs" in err


def test_time_to_score_objective_sizes_the_run_and_its_budget(tmp_path, capsys):
    config, report, out = auto_scaled(
        tmp_path, capsys, "--env", "cartpole", "--set", "scale.objective=time_to_score",
        "--set", "scale.noise_scale=2000", "--set", "scale.trial_seconds=0.1",
        "--set", "scale.max_num_envs=64", "--set", "trainer.target_return=30")
    assert report["noise_scale"] == 2000 and report["objective"] == "time_to_score"
    assert config["trainer"]["num_envs"] == report["num_envs"]
    assert set(report["predicted_s"]) >= {32}
    assert "predicted" in out and "to the score" in out
    # every trial timed the recipe's first rollout of its episodes, from a reset
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    from gpusim.training.replicas import follow
    recipe = load_run_config("cartpole", env_class("cartpole"),
                             sets=["trainer.target_return=30"])
    recipe_rollout = recipe.trainer.rollout_len
    trials = report["trials"]["num_envs"]
    for trial in trials:
        rollout = follow(recipe, trial["value"]).config.trainer.rollout_len
        assert trial["info"]["iterations"] == -(-recipe_rollout // rollout), trial
        assert trial["info"]["windows"] >= 1, trial
    start = recipe.trainer.num_envs
    assert [t["value"] for t in trials][:2] == [start, start]  # the start twice: it ran cold
    # the budget keeps the recipe's iterations past the floor (training.replicas)
    # the budget keeps the recipe's iterations past the floor (training.replicas)
    assert config["trainer"]["total_steps"] == \
        follow(recipe, report["num_envs"]).config.trainer.total_steps
