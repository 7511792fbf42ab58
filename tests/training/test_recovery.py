"""Recovery edges: divergence, Ctrl-C, a locked run directory, corrupt or partial files,
TensorBoard after a resume, and the learning rate of an extended run."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gpusim import train
from gpusim.envs import env_class
from gpusim.errors import GpusimError
from gpusim.training.loop import Trainer
from gpusim.training.records import checkpoint
from gpusim.training.records.logger import lock_run_dir
from gpusim.training.records.tensorboard import read_scalars
from gpusim.training.run_config import load_run_config

ROOT = Path(__file__).resolve().parents[2]
TIME_KEYS = ("time_s", "env_steps_per_s", "time_share/env", "time_share/forward",
             "time_share/update")
CARTPOLE = ["--env", "cartpole", "--backend", "cpu", "--num_envs", "8", "--rollout_len", "32",
            "--quiet", "--set", "trainer.target_return=null", "--set", "trainer.anneal_lr=false"]


def only_run(path):
    (run_dir,) = [p for p in Path(path).iterdir() if p.is_dir()]
    return run_dir


def metrics_of(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIME_KEYS} for row in rows]


def child_env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


def test_divergence_stops_the_run_naming_the_policy(tmp_path, capsys):
    code = train.main(CARTPOLE + ["--results_dir", str(tmp_path), "--total_steps", str(256 * 20),
                                  "--set", "trainer.lr=1e30",
                                  "--set", "trainer.checkpoint_every=1"])
    err = capsys.readouterr().err
    assert code == 1
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "training diverged at iteration" in line and "policy 'agent'" in line
    failed_at = int(line.split("iteration ")[1].split(":")[0])
    run_dir = only_run(tmp_path)
    saved = [int(p.name[11:17]) for p in checkpoint.list_checkpoints(run_dir / "checkpoints")]
    assert all(it < failed_at for it in saved)  # nothing kept from the diverged iteration
    if (run_dir / "metrics.jsonl").exists():
        assert all(r["iteration"] < failed_at for r in metrics_of(run_dir))


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_signal_checkpoints_the_current_iteration_and_resume_is_exact(tmp_path, sig):
    total = ["--total_steps", str(256 * 12)]
    every = ["--set", "trainer.checkpoint_every=1000"]  # no regular checkpoint would happen
    proc = subprocess.Popen([sys.executable, "-m", "gpusim.train", *CARTPOLE, *total, *every,
                             "--results_dir", str(tmp_path / "part")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    metrics = None
    deadline = time.monotonic() + 120
    while metrics is None and time.monotonic() < deadline:  # wait for a first iteration
        runs = list((tmp_path / "part").glob("*/metrics.jsonl"))
        if runs and runs[0].read_text().strip():
            metrics = runs[0]
        time.sleep(0.05)
    assert metrics is not None, "no iteration was logged"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    run_dir = metrics.parent
    assert proc.returncode == 130, err
    assert f"--resume {run_dir}" in err  # the run's own path, not a placeholder
    saved = checkpoint.list_checkpoints(run_dir / "checkpoints")
    assert len(saved) == 1
    stopped_at = torch.load(saved[0], weights_only=True)["iteration"]
    assert 1 <= stopped_at < 12 and len(metrics_of(run_dir)) == stopped_at
    assert train.main(["--resume", str(run_dir), *total, "--quiet"]) == 0
    assert train.main(CARTPOLE + total + every + ["--results_dir", str(tmp_path / "full")]) == 0
    assert metrics_of(run_dir) == metrics_of(only_run(tmp_path / "full"))
    # TensorBoard shows each iteration once, re-run ones included
    steps = [step for events in (run_dir / "tensorboard").iterdir()
             for step, _ in read_scalars(events)]
    assert sorted(steps) == [256 * k for k in range(1, 13)]


def test_a_run_in_use_cannot_be_resumed_twice(tmp_path, capsys):
    assert train.main(CARTPOLE + ["--results_dir", str(tmp_path), "--total_steps", "256"]) == 0
    run_dir = only_run(tmp_path)
    before = (run_dir / "metrics.jsonl").read_text()
    holder = lock_run_dir(run_dir)  # as a running --resume would hold it
    try:
        code = train.main(["--resume", str(run_dir), "--total_steps", "512", "--quiet"])
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert code == 2 and f"run directory {run_dir} is in use by pid {os.getpid()}" in err
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing touched


def test_corrupt_newest_checkpoint_is_reported_and_skipped(tmp_path):
    directory = tmp_path / "checkpoints"
    checkpoint.save(directory, 1, {"iteration": 1})
    (directory / "checkpoint_000002.pt").write_bytes(b"torn")
    warnings = []
    assert checkpoint.load_latest(directory, warn=warnings.append)["iteration"] == 1
    assert len(warnings) == 1 and "checkpoint_000002.pt cannot be loaded" in warnings[0]


def test_stale_partial_checkpoints_are_removed_at_start(tmp_path):
    assert train.main(CARTPOLE + ["--results_dir", str(tmp_path), "--total_steps", "256"]) == 0
    run_dir = only_run(tmp_path)
    stale = run_dir / "checkpoints" / ".checkpoint_000007.pt.tmp"
    stale.write_bytes(b"half")
    (run_dir / "metrics.jsonl").open("a").write('{"iteration": 2, "env_')  # torn last line
    assert train.main(["--resume", str(run_dir), "--total_steps", "512", "--quiet"]) == 0
    assert not stale.exists()
    assert [r["iteration"] for r in metrics_of(run_dir)] == [1, 2]


def test_a_corrupt_metrics_line_in_the_middle_is_a_clear_error(tmp_path, capsys):
    assert train.main(CARTPOLE + ["--results_dir", str(tmp_path), "--total_steps", "512"]) == 0
    run_dir = only_run(tmp_path)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("not json\n" + "\n".join(lines) + "\n")
    assert train.main(["--resume", str(run_dir), "--total_steps", "768", "--quiet"]) == 2
    assert "line 1 is not a metrics record" in capsys.readouterr().err


def test_extending_an_annealed_run_never_raises_the_learning_rate(tmp_path):
    cls = env_class("cartpole")

    def trainer(total):
        return Trainer(load_run_config("cartpole", cls, overrides={
            "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 8,
            "trainer.total_steps": 32 * total, "trainer.anneal_lr": True,
            "trainer.lr": 1e-3}), cls)
    first = trainer(10)
    first.train()  # 10 iterations, the last one at 1e-3 * (1 - 9/10) = 1e-4
    state = first.state_dict()
    same = trainer(10)
    same.load_state_dict(state)
    assert same.learning_rate() == pytest.approx(0.0)  # unchanged schedule: at its end
    longer = trainer(20)
    longer.load_state_dict(state)
    rates = []
    for _ in range(10):
        rates.append(longer.learning_rate())
        longer.iteration += 1
    assert rates[0] == pytest.approx(state["lr"]) == pytest.approx(1e-4)
    assert all(b <= a for a, b in zip(rates, rates[1:])) and rates[-1] > 0
    # and the anchor travels with the checkpoint: resuming that again keeps the line
    again = trainer(20)
    again.load_state_dict(longer.state_dict())
    assert again.learning_rate() == pytest.approx(longer.learning_rate())


def test_a_checkpoint_write_that_fails_keeps_the_previous_one(tmp_path, monkeypatch):
    """A full disk, as a patched writer: torch.save writes half, then the disk is full."""
    import errno

    directory = tmp_path / "checkpoints"
    checkpoint.save(directory, 1, {"iteration": 1})
    real_save = torch.save

    def full_disk(payload, f):
        real_save(payload, f)  # what torch.save reports when its writes fail: a RuntimeError
        f.truncate(f.tell() // 2)  # with the OSError that caused it as its context
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(GpusimError) as err:
        checkpoint.save(directory, 2, {"iteration": 2})
    assert str(err.value) == (f"cannot write {directory / 'checkpoint_000002.pt'}: "
                              "No space left on device")
    assert sorted(p.name for p in directory.iterdir()) == ["checkpoint_000001.pt"]  # no .tmp
    assert checkpoint.load_latest(directory)["iteration"] == 1


def test_a_run_stopped_by_the_envs_nan_reward_says_so_first(tmp_path, capsys):
    """An env whose reward is NaN (planted: the square root of a negative number): the
    line names the env, its reward array, the step, replica and agent, not the learning
    rate."""
    code = train.main(["--env", "planted_env:Pursuit", "--backend", "cpu", "--quiet",
                       "--results_dir", str(tmp_path), "--total_steps", "512",
                       "--set", "env.bug=4", "--set", "trainer.num_envs=4",
                       "--set", "trainer.rollout_len=16"])
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert code == 1
    assert "env pursuit returned runner reward[step 0, replica 0, runner 0] = nan" in line
    assert "not the learning" in line and "lower trainer.lr" not in line
