"""Training end to end on the CPU: PPO/A2C learning, the run directory, resume, the CLI."""
import json
import math
import os

import pytest
import torch
import yaml

from gpusim import train
from gpusim.envs import env_class
from gpusim.errors import ConfigError
from gpusim.training.loop import Trainer
from gpusim.training.records import checkpoint
from gpusim.training.records.tensorboard import read_scalars
from gpusim.training.run_config import load_run_config

CARTPOLE = env_class("cartpole")
TIME_KEYS = ("time_s", "env_steps_per_s", "time_share/env", "time_share/forward",
             "time_share/update")


def cartpole_config(**trainer):
    base = {"trainer.backend": "cpu", "trainer.num_envs": 16, "trainer.rollout_len": 64,
            "trainer.target_return": None}
    base.update({f"trainer.{k}": v for k, v in trainer.items()})
    return load_run_config("cartpole", CARTPOLE, overrides=base)


def test_tiny_ppo_run_improves_on_cartpole():
    trainer = Trainer(cartpole_config(total_steps=40_000), CARTPOLE)
    trainer.algorithm.collect(0)
    finished = trainer.algorithm.episodes.finished()["agent"]
    start = sum(finished) / len(finished)
    trainer.iteration = 0
    summary = trainer.train()
    assert start < 40  # a random policy balances ~20 steps
    assert summary["episode_return"]["agent"] > 2.5 * start


def test_ppo_ratio_really_varies():
    """After the first epoch the policy has moved from the one that acted: the ratio is not
    1 (a KL estimate above 0, and at this rate some ratios clipped)."""
    trainer = Trainer(cartpole_config(total_steps=3 * 1024, update_epochs=4), CARTPOLE)
    trainer.algorithm.collect(0)
    (stats,) = trainer.algorithm.update(1e-2).values()
    assert stats["approx_kl"] > 1e-5 and stats["clip_fraction"] > 0
    assert 0 < stats["entropy"] <= math.log(2)


def test_a2c_runs_and_learns_something():
    trainer = Trainer(cartpole_config(algorithm="a2c", update_epochs=1, num_minibatches=1,
                                      rollout_len=8, lr=7e-4, total_steps=16 * 8 * 60),
                      CARTPOLE)
    before = [p.clone() for p in trainer.algorithm.policies[0].model.parameters()]
    trainer.train()
    after = list(trainer.algorithm.policies[0].model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_multi_policy_env_trains_each_policy():
    config = load_run_config("tag_continuous", env_class("tag_continuous"), overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 2, "trainer.rollout_len": 8,
        "trainer.total_steps": 32, "env.num_taggers": 2, "env.num_runners": 4,
        "env.num_other_agents_observed": 3, "env.episode_length": 10})
    trainer = Trainer(config, env_class("tag_continuous"))
    assert [g.name for g in trainer.algorithm.policies] == ["tagger", "runner"]
    trainer.algorithm.collect(0)
    before = {p.name: [q.clone() for q in p.model.parameters()]
              for p in trainer.algorithm.policies}
    metrics = trainer.metrics(trainer.algorithm.update(1e-3), 1.0, 1e-3)
    for p in trainer.algorithm.policies:  # each learned: its own loss, its own step
        assert metrics[f"value_loss/{p.name}"] > 0 and metrics[f"entropy/{p.name}"] > 0
        assert all(not torch.equal(a, b) for a, b in zip(before[p.name], p.model.parameters()))
    assert trainer.algorithm.policies[0].model is not trainer.algorithm.policies[1].model


@pytest.mark.parametrize("overrides, message", [
    ({"trainer.bogus": 1}, "unknown config key 'trainer.bogus'"),
    ({"trainer.num_envs": -4}, "'trainer.num_envs' must be at least 1"),
    ({"trainer.gamma": 1.5}, "'trainer.gamma' must lie in [0, 1]"),
    ({"trainer.algorithm": "dqn"}, "'trainer.algorithm' must be one of"),
    ({"trainer.algorithm": "a2c", "trainer.update_epochs": 4},
     "a2c takes one gradient step per rollout"),
    ({"trainer.algorithm": "sac", "trainer.clip_coef": 0.1},
     "'trainer.clip_coef' does not apply to algorithm sac (it is a key of ppo, a2c)"),
    ({"trainer.replay_size": 10}, "'trainer.replay_size' does not apply to algorithm ppo"),
    ({"policy.hidden_sizes": []}, "'policy.hidden_sizes' must be a non-empty list"),
    ({"nosection.key": 1}, "unknown config key 'nosection.key'"),
])
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_run_config("cartpole", CARTPOLE, overrides=overrides)
    assert message in str(err.value)


def test_set_values_are_parsed():
    config = load_run_config("cartpole", CARTPOLE, sets=["trainer.lr=3e-4", "trainer.norm_adv=false",
                                                         "policy.hidden_sizes=[32, 16]"])
    assert config.trainer.lr == 3e-4 and config.algo.norm_adv is False
    assert config.policy.hidden_sizes == (32, 16)
    with pytest.raises(ConfigError, match="--set expects section.key=value"):
        load_run_config("cartpole", CARTPOLE, sets=["lr"])


def run_cli(tmp_path, *args):
    return train.main(["--env", "cartpole", "--backend", "cpu", "--num_envs", "8",
                       "--rollout_len", "32", "--results_dir", str(tmp_path), "--quiet",
                       "--set", "trainer.target_return=null", "--set", "trainer.anneal_lr=false",
                       "--set", "trainer.checkpoint_every=3", *args])


def metrics_of(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIME_KEYS} for row in rows]


def only_run(path):
    (run_dir,) = [p for p in path.iterdir() if p.is_dir()]
    return run_dir


def test_run_directory_contents(tmp_path, capsys):
    assert run_cli(tmp_path, "--total_steps", str(256 * 4)) == 0
    out = capsys.readouterr().out
    run_dir = only_run(tmp_path)
    assert f"run directory: {run_dir}" in out and out.strip().splitlines()[-1].startswith("done")
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["env_name"] == "cartpole" and resolved["trainer"]["num_envs"] == 8
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    for key in ("iteration", "env_steps", "time_s", "env_steps_per_s", "episode_return/agent",
                "policy_loss/agent", "value_loss/agent", "entropy/agent"):
        assert key in rows[-1]
    (events,) = (run_dir / "tensorboard").iterdir()
    scalars = read_scalars(events)
    assert [step for step, _ in scalars] == [r["env_steps"] for r in rows]
    assert scalars[-1][1]["value_loss/agent"] == pytest.approx(rows[-1]["value_loss/agent"], rel=1e-6)
    saved = checkpoint.list_checkpoints(run_dir / "checkpoints")
    assert [p.name for p in saved] == ["checkpoint_000003.pt", "checkpoint_000004.pt"]
    state = torch.load(saved[-1], weights_only=True)
    assert state["iteration"] == 4 and "agent" in state["algorithm"]["models"]


def test_interrupted_and_resumed_run_matches_uninterrupted(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert run_cli(full, "--total_steps", str(256 * 8)) == 0
    assert run_cli(part, "--total_steps", str(256 * 5)) == 0
    part_dir = only_run(part)
    # simulate a crash after iteration 5 but before its checkpoint was written
    (part_dir / "checkpoints" / "checkpoint_000005.pt").unlink()
    assert train.main(["--resume", str(part_dir), "--total_steps", str(256 * 8), "--quiet"]) == 0
    assert metrics_of(part_dir) == metrics_of(only_run(full))


def test_crash_mid_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    checkpoint.save(directory, 1, {"iteration": 1, "weights": torch.ones(3)})

    def crash(payload, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        checkpoint.save(directory, 2, {"iteration": 2})
    assert checkpoint.load_latest(directory)["iteration"] == 1
    # a torn newest file (e.g. copied in half) is skipped in favour of the previous one
    (directory / "checkpoint_000002.pt").write_bytes(b"torn")
    assert checkpoint.load_latest(directory)["iteration"] == 1


def test_a_saved_config_reruns_alone_and_rounding_is_said(tmp_path, capsys):
    assert run_cli(tmp_path / "first", "--total_steps", str(256 * 2)) == 0
    saved = only_run(tmp_path / "first") / "config.yaml"
    capsys.readouterr()
    assert train.main(["--config", str(saved), "--results_dir", str(tmp_path / "again"),
                       "--total_steps", "600", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "total_steps 600 is not a whole number of iterations: running 512 env steps" in out
    assert metrics_of(only_run(tmp_path / "again"))[-1]["env_steps"] == 512


def test_user_env_by_module_path(tmp_path):
    assert train.main(["--env", "gpusim.envs.cartpole.env:CartPole", "--backend", "cpu",
                       "--num_envs", "4", "--rollout_len", "16", "--total_steps", "64",
                       "--results_dir", str(tmp_path), "--quiet"]) == 0


@pytest.mark.parametrize("args, message", [
    (["--env", "nope"], "unknown env 'nope'"),
    (["--env", "cartpole", "--num_envs", "-1"], "'trainer.num_envs' must be at least 1"),
    (["--env", "cartpole", "--rollout_len", "0"], "'trainer.rollout_len' must be at least 1"),
    (["--resume", "/nonexistent/run"], "is not a run directory"),
    ([], "--env is required"),
    (["--env", "cartpole", "--set", "trainer.lr"], "--set expects section.key=value"),
])
def test_cli_bad_input_is_one_line_and_nonzero(args, message, capsys, tmp_path):
    assert train.main(args + ["--results_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


def test_cli_bad_yaml(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {lr: [\n")
    assert train.main(["--env", "cartpole", "--config", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_cli_as_a_process_exits_nonzero_with_one_line(tmp_path):
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "gpusim.train", "--env", "nope"],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 2
    from gpusim.envs import env_names
    assert result.stderr.strip() == (f"error: unknown env 'nope' (registered: "
                                     f"{', '.join(env_names())}; or give module:Class)")
    assert "cartpole, " in result.stderr


def test_plot_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from gpusim.training.trained import learning_curves
    assert run_cli(tmp_path, "--total_steps", str(256 * 3)) == 0
    paths = learning_curves.plot_run(only_run(tmp_path))
    assert [p.name for p in paths] == ["returns.png", "losses.png", "throughput.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert learning_curves.main([str(tmp_path / "missing")]) == 2


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize("env, target, budget", [
    ("cartpole", 475, 500_000),
    ("acrobot", -100, 500_000),
    ("pendulum", -200, 1_000_000),  # continuous actions: the Gaussian head
])
def test_recipe_solves_within_budget(tmp_path, env, target, budget):
    """The shipped recipe reaches its target mean return (last 100 episodes) in budget."""
    assert train.main(["--env", env, "--backend", "cpu", "--results_dir", str(tmp_path),
                       "--quiet"]) == 0
    rows = [json.loads(line) for line in
            (only_run(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["episode_return/agent"] >= target and rows[-1]["env_steps"] <= budget
