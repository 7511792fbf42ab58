"""Every bad input is one clear error line and a non-zero exit, never a traceback.

A table: each CLI row is `(argv, extra environment, expected exit code, a phrase
the error line must contain)`, run as its own `python -m gpusim.train` process
(several at once); each API row is a call and the phrase its exception must
carry. The files the rows need (bad configs, damaged run directories, an open
cache directory) are made once for the module.
"""
import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import gpusim
from gpusim import train
from gpusim.errors import GpusimError
from gpusim.training import checkpoint
from gpusim.training.logger import lock_run_dir

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = ["--env", "cartpole", "--backend", "cpu"]
SMALL = ["--num_envs", "4", "--rollout_len", "8", "--total_steps", "32", "--quiet"]
TAG = ["--env", "tag_continuous", "--backend", "cpu"]

# (id, argv, extra environment, exit code, phrase); {files} is the fixture's directory
CLI_ROWS = [
    # the env and the command line
    ("unknown env", ["--env", "nope"], {}, 2, "unknown env 'nope'"),
    ("not an env class", ["--env", "os:getcwd"], {}, 2, "is not an env class"),
    ("module missing", ["--env", "no_such_module_x:Env"], {}, 2, "cannot import env module"),
    ("class missing", ["--env", "gpusim.envs.cartpole.env:Nope"], {}, 2, "has no env class"),
    ("no env", [], {}, 2, "--env is required"),
    # continuous actions and off-policy training
    ("unknown --algorithm flag", CARTPOLE + ["--algorithm", "dqn"], {}, 2, "invalid choice: 'dqn'"),
    ("sac on discrete actions", CARTPOLE + ["--algorithm", "sac"], {}, 2,
     "needs continuous actions"),
    ("auto_scale with sac", ["--env", "pendulum", "--backend", "cpu", "--algorithm", "sac",
                             "--auto_scale"], {}, 2, "--auto_scale sizes on-policy rollouts"),
    ("tau zero", CARTPOLE + ["--set", "trainer.tau=0"], {}, 2, "'trainer.tau' must lie in"),
    ("negative sac_alpha", CARTPOLE + ["--set", "trainer.sac_alpha=-1"], {}, 2,
     "'trainer.sac_alpha' must be >= 0"),
    ("log_std_init out of range", CARTPOLE + ["--set", "policy.log_std_init=9"], {}, 2,
     "'policy.log_std_init' must lie in [-5, 2]"),
    ("zero reward_scale", CARTPOLE + ["--set", "trainer.reward_scale=0"], {}, 2,
     "'trainer.reward_scale' must be positive"),
    ("replay too large", ["--env", "pendulum", "--backend", "cpu", "--algorithm", "sac",
                          "--set", "trainer.replay_size=100000000000"], {}, 2,
     "the replay buffers (100,000,000,000 transitions per policy) needs"),
    ("empty continuous range", ["--env", "tag_continuous", "--backend", "cpu",
                                "--set", "env.continuous_actions=true",
                                "--set", "env.min_turn=1", "--set", "env.max_turn=1"], {}, 2,
     "must be below max_turn with continuous_actions"),
    ("negative num_envs", CARTPOLE + ["--num_envs", "-1"], {}, 2,
     "'trainer.num_envs' must be at least 1"),
    ("zero rollout", CARTPOLE + ["--rollout_len", "0"], {}, 2,
     "'trainer.rollout_len' must be at least 1"),
    ("zero total_steps", CARTPOLE + ["--total_steps", "0"], {}, 2,
     "'trainer.total_steps' must be at least 1"),
    ("negative seed", CARTPOLE + ["--seed", "-3"], {}, 2, "'trainer.seed' must be >= 0"),
    ("float seed", CARTPOLE + ["--seed", "1e23"], {}, 2, "invalid int value"),
    ("huge seed", CARTPOLE + ["--set", "trainer.seed=100000000000000000000000"], {}, 2,
     "'trainer.seed' must fit in 64 bits"),
    ("bad backend", CARTPOLE[:2] + ["--backend", "nope"], {}, 2, "invalid choice"),
    ("numba without GPU", ["--env", "cartpole", "--backend", "numba"], {}, 2,
     "needs a CUDA GPU"),
    ("cuda_c unavailable", ["--env", "cartpole", "--backend", "cuda_c"], {}, 2,
     "backend 'cuda_c' is unavailable"),
    ("pycuda, its old name", ["--env", "cartpole", "--backend", "pycuda"], {}, 2,
     "backend 'cuda_c' is unavailable"),
    ("zero processes", CARTPOLE + ["--num_gpus", "0"], {}, 2, "--num_gpus must be at least 1"),
    ("too many CPU workers", CARTPOLE + ["--num_gpus", "1000"], {}, 2, "--oversubscribe"),
    ("more GPUs than exist", ["--env", "cartpole", "--backend", "auto", "--num_gpus", "2"], {},
     2, "GPU"),
    # --set and config values
    ("inf lr", CARTPOLE + ["--set", "trainer.lr=1e400"], {}, 2,
     "'trainer.lr' must be a finite number"),
    ("nan lr", CARTPOLE + ["--set", "trainer.lr=nan"], {}, 2,
     "'trainer.lr' must be a finite number"),
    ("inf vf_coef", CARTPOLE + ["--set", "trainer.vf_coef=inf"], {}, 2,
     "'trainer.vf_coef' must be a finite number"),
    ("inf env tau", CARTPOLE + ["--set", "env.tau=inf"], {}, 2,
     "'env.tau' must be a finite number"),
    ("inf target_return", CARTPOLE + ["--set", "trainer.target_return=inf"], {}, 2,
     "'trainer.target_return' must be a finite number"),
    ("negative lr", CARTPOLE + ["--set", "trainer.lr=-1"], {}, 2, "'trainer.lr' must be positive"),
    ("gamma above 1", CARTPOLE + ["--set", "trainer.gamma=1.5"], {}, 2, "must lie in [0, 1]"),
    ("unknown algorithm", CARTPOLE + ["--set", "trainer.algorithm=dqn"], {}, 2,
     "'trainer.algorithm' must be one of"),
    ("a2c with epochs", CARTPOLE + ["--set", "trainer.algorithm=a2c"], {}, 2,
     "a2c takes one gradient step"),
    ("unknown precision", CARTPOLE + ["--set", "trainer.precision=fp8"], {}, 2,
     "'trainer.precision' must be one of"),
    ("tf32 on the CPU", CARTPOLE + SMALL + ["--set", "trainer.precision=tf32"], {}, 2,
     "tf32 needs a CUDA GPU"),
    ("unknown compile mode", CARTPOLE + ["--set", "trainer.compile=maybe"], {}, 2,
     "'trainer.compile' must be one of"),
    ("zero minibatch rows", CARTPOLE + ["--set", "trainer.max_minibatch_rows=0"], {}, 2,
     "'trainer.max_minibatch_rows' must be at least 1"),
    ("too many minibatches", CARTPOLE + SMALL + ["--set", "trainer.num_minibatches=1000"], {},
     2, "must not exceed num_envs x rollout_len"),
    ("unknown trainer key", CARTPOLE + ["--set", "trainer.bogus=1"], {}, 2,
     "unknown config key 'trainer.bogus'"),
    ("unknown section", CARTPOLE + ["--set", "nosection.key=1"], {}, 2,
     "unknown config key 'nosection.key'"),
    ("--set without value", CARTPOLE + ["--set", "trainer.lr"], {}, 2,
     "--set expects section.key=value"),
    ("empty hidden sizes", CARTPOLE + ["--set", "policy.hidden_sizes=[]"], {}, 2,
     "'policy.hidden_sizes' must be a non-empty list"),
    ("unknown activation", CARTPOLE + ["--set", "policy.activation=gelu"], {}, 2,
     "'policy.activation' must be one of"),
    ("huge timeout", CARTPOLE + ["--set", "scale.timeout_s=1e300"], {}, 2, "'scale.timeout_s'"),
    ("saturation above 1", CARTPOLE + ["--set", "scale.saturation=2"], {}, 2,
     "'scale.saturation' must lie in (0, 1)"),
    ("unknown objective", CARTPOLE + ["--set", "scale.objective=speed"], {}, 2,
     "'scale.objective' must be one of"),
    ("headroom above 1", CARTPOLE + ["--set", "scale.headroom=1.5"], {}, 2,
     "'scale.headroom' must lie in [0, 1)"),
    ("too many torch threads", CARTPOLE + SMALL + ["--set", "trainer.torch_threads=100000"],
     {}, 2, "trainer.torch_threads=100000 exceeds the"),
    ("zero taggers", TAG + ["--set", "env.num_taggers=0"], {}, 2,
     "'num_taggers' must be at least 1"),
    ("repeated tagger ids", TAG + ["--set", "env.tagger_ids=[0,0,1,2,3,4,5,6,7,8]"], {}, 2,
     "'tagger_ids' must not repeat"),
    ("replicas that cannot fit", TAG + ["--num_envs", "10000000000"], {}, 2,
     "needs"),
    ("a buffer that cannot fit", CARTPOLE + ["--num_envs", "4", "--rollout_len", "3000000000"],
     {}, 2, "the rollout buffer"),
    # --auto_scale flags
    ("budget without auto-scale", CARTPOLE + ["--memory_budget", "1GiB"], {}, 2,
     "add --auto_scale"),
    ("auto-scale with num_envs", CARTPOLE + ["--auto_scale", "--num_envs", "8"], {}, 2,
     "drop --num_envs"),
    ("unreadable budget", CARTPOLE + ["--auto_scale", "--memory_budget", "lots"], {}, 2,
     "cannot read memory size"),
    # config files
    ("missing config", CARTPOLE + ["--config", "{files}/missing.yaml"], {}, 2,
     "config file not found"),
    ("invalid yaml", CARTPOLE + ["--config", "{files}/invalid.yaml"], {}, 2, "not valid YAML"),
    ("section not a mapping", CARTPOLE + ["--config", "{files}/trainer5.yaml"], {}, 2,
     "config section 'trainer' must be a mapping"),
    ("env section a list", CARTPOLE + ["--config", "{files}/envlist.yaml"], {}, 2,
     "config section 'env' must be a mapping"),
    ("top level a list", CARTPOLE + ["--config", "{files}/list.yaml"], {}, 2,
     "expected a mapping at the top level"),
    ("not UTF-8", CARTPOLE + ["--config", "{files}/latin1.yaml"], {}, 2,
     "not a UTF-8 text file"),
    ("unknown config section", CARTPOLE + ["--config", "{files}/section.yaml"], {}, 2,
     "unknown config section 'extra'"),
    ("results_dir a file", CARTPOLE + SMALL + ["--results_dir", "{files}/a_file"], {}, 2,
     "is a file, not a directory"),
    # --resume
    ("resume nothing", ["--resume", "{files}/no_such_run"], {}, 2, "is not a run directory"),
    ("resume and change", ["--resume", "{files}/run", "--num_envs", "4"], {}, 2,
     "only --total_steps may change"),
    ("checkpoint lacks ranks", ["--resume", "{files}/no_ranks", "--quiet"], {}, 2,
     "the checkpoint lacks ranks"),
    ("checkpoint lacks a policy", ["--resume", "{files}/no_policy", "--quiet"], {}, 2,
     "have no policy 'agent'"),
    ("corrupt metrics", ["--resume", "{files}/bad_metrics", "--total_steps", "64", "--quiet"],
     {}, 2, "line 1 is not a metrics record"),
    ("no checkpoint", ["--resume", "{files}/no_checkpoint", "--quiet"], {}, 2,
     "no checkpoint found"),
    ("run in use", ["--resume", "{files}/locked", "--total_steps", "64", "--quiet"], {}, 2,
     "is in use by pid"),
    ("resume with other process count", ["--resume", "{files}/run", "--num_gpus", "2",
                                         "--quiet"], {}, 2, "resume it with 1 processes"),
    # the environment
    ("RANK not a number", CARTPOLE + SMALL, {"RANK": "abc", "WORLD_SIZE": "2"}, 2,
     "environment variable RANK must be an integer"),
    ("inconsistent ranks", CARTPOLE + SMALL, {"RANK": "5", "WORLD_SIZE": "2"}, 2,
     "inconsistent rank variables"),
    ("no master address", CARTPOLE + SMALL, {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
     2, "needs MASTER_ADDR and MASTER_PORT"),
    ("cache others can write", CARTPOLE + SMALL, {"GPUSIM_CACHE_DIR": "{files}/open_cache"}, 2,
     "writable by other users"),
    # several processes: bad input is still exit code 2, once
    ("bad input, two processes", CARTPOLE + SMALL + ["--num_gpus", "2", "--set",
                                                     "trainer.lr=-1"], {}, 2,
     "'trainer.lr' must be positive"),
    ("bad input inside the ranks", CARTPOLE + SMALL + ["--num_gpus", "2", "--set",
                                                       "trainer.torch_threads=2"], {}, 2,
     "exceeds the 1 cores"),
]


def damaged_runs(files: Path):
    """A finished tiny run, and copies of it damaged in the ways the rows need."""
    assert train.main(CARTPOLE + SMALL + ["--results_dir", str(files / "runs")]) == 0
    (made,) = (files / "runs").iterdir()
    run = files / "run"
    shutil.copytree(made, run)
    (latest,) = checkpoint.list_checkpoints(run / "checkpoints")[-1:]
    state = torch.load(latest, weights_only=True)
    for name, change in (("no_ranks", lambda s: s.pop("ranks")),
                         ("no_policy", lambda s: s["algorithm"]["models"].update(
                             other=s["algorithm"]["models"].pop("agent")))):
        shutil.copytree(run, files / name)
        damaged = dict(state, algorithm=dict(state["algorithm"],
                                             models=dict(state["algorithm"]["models"])))
        change(damaged)
        torch.save(damaged, files / name / "checkpoints" / latest.name)
    shutil.copytree(run, files / "bad_metrics")
    metrics = files / "bad_metrics" / "metrics.jsonl"
    metrics.write_text("not json\n" + metrics.read_text())
    shutil.copytree(run, files / "no_checkpoint")
    shutil.rmtree(files / "no_checkpoint" / "checkpoints")
    shutil.copytree(run, files / "locked")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    files = tmp_path_factory.mktemp("bad_inputs")
    (files / "invalid.yaml").write_text("trainer: {lr: [\n")
    (files / "trainer5.yaml").write_text("trainer: 5\n")
    (files / "envlist.yaml").write_text("env: [1, 2]\n")
    (files / "list.yaml").write_text("- 1\n- 2\n")
    (files / "latin1.yaml").write_bytes("trainer:\n  lr: 0.001 # caf\xe9\n".encode("latin-1"))
    (files / "section.yaml").write_text("extra: {}\n")
    (files / "a_file").write_text("not a directory\n")
    (files / "open_cache").mkdir()
    (files / "open_cache").chmod(0o777)
    damaged_runs(files)
    return files


@pytest.fixture(scope="module")
def cli_results(files):
    """Every CLI row, run as its own process, four at a time."""
    holder = lock_run_dir(files / "locked")  # as a running --resume would

    def run(row):
        _, argv, extra, _, _ = row
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                            "MASTER_ADDR", "MASTER_PORT")}
        env.update({k: v.format(files=files) for k, v in extra.items()},
                   PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
        argv = [a.format(files=files) for a in argv]
        if "--results_dir" not in argv:
            argv += ["--results_dir", str(files / "results")]
        return subprocess.run([sys.executable, "-m", "gpusim.train", *argv], capture_output=True,
                              text=True, env=env, cwd=files, timeout=300)
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            return dict(zip((row[0] for row in CLI_ROWS), pool.map(run, CLI_ROWS)))
    finally:
        holder.close()


def test_the_table_is_large_enough():
    assert len(CLI_ROWS) + len(API_ROWS) >= 60
    assert len({row[0] for row in CLI_ROWS}) == len(CLI_ROWS)


@pytest.mark.parametrize("row", CLI_ROWS, ids=[row[0] for row in CLI_ROWS])
def test_cli_bad_input(cli_results, files, row):
    name, _, _, code, phrase = row
    result = cli_results[name]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == code, result.stderr[-2000:]
    assert len(errors) == 1 and phrase.format(files=files) in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


# ---- the Python API ------------------------------------------------------------------
def cartpole(**kwargs):
    return gpusim.make("cartpole", num_envs=2, backend="cpu", **kwargs)


def step_with(actions):
    env = cartpole()
    env.reset()
    env.step(actions)


def set_state_with(**state):
    env = cartpole()
    env.reset()
    env.set_state(state)


API_ROWS = [
    ("seed text", lambda: cartpole(seed="abc"), "seed must be an integer"),
    ("seed nan", lambda: cartpole(seed=float("nan")), "seed must be an integer"),
    ("seed negative", lambda: cartpole(seed=-1), "seed must be an integer"),
    ("reset seed text", lambda: cartpole().reset(seed="x"), "seed must be an integer"),
    ("inf env value", lambda: cartpole(tau=float("inf")), "'env.tau' must be a finite number"),
    ("unknown env key", lambda: cartpole(bogus=1), "unknown config key 'env.bogus'"),
    ("config and keys", lambda: cartpole(config=object(), tau=0.1), "give either config="),
    ("zero replicas", lambda: gpusim.make("cartpole", num_envs=0, backend="cpu"),
     "num_envs must be a positive integer"),
    ("unknown backend", lambda: gpusim.make("cartpole", backend="nope"), "unknown backend"),
    ("action wraps in int32", lambda: step_with(torch.full((2, 1, 1), 2**32 + 1)),
     "action out of range: actions[0, 0, 0] = 4294967297"),
    ("negative action", lambda: step_with(torch.full((2, 1, 1), -1)), "action out of range"),
    ("float actions", lambda: step_with(torch.zeros((2, 1, 1))), "integer dtype"),
    ("actions shape", lambda: step_with(torch.zeros((2, 1), dtype=torch.int32)),
     "must have shape (2, 1, 1)"),
    ("actions a list", lambda: step_with([[[0]], [[1]]]), "must be a torch tensor"),
    ("all-zero rng", lambda: set_state_with(rng_state=torch.zeros((2, 1, 2), dtype=torch.uint64)),
     "rng_state[0, 0] is all zero"),
    ("nan state", lambda: set_state_with(x=torch.tensor([0.0, math.nan])), "x[1] is NaN"),
    ("negative timestep", lambda: set_state_with(timestep=torch.tensor([3, -1], dtype=torch.int32)),
     "timestep[1] is negative"),
    ("unknown state", lambda: set_state_with(speed=torch.zeros(2)), "is not a state array"),
    ("state dtype", lambda: set_state_with(x=np.zeros(2)), "must have dtype torch.float32"),
]


@pytest.mark.parametrize("row", API_ROWS, ids=[row[0] for row in API_ROWS])
def test_api_bad_input(row):
    _, call, phrase = row
    with pytest.raises((GpusimError, ValueError)) as err:
        call()
    assert phrase in str(err.value) and "\n" not in str(err.value)


def test_a_refused_set_state_changes_nothing():
    env = cartpole()
    env.reset()
    before = env.get_state()
    with pytest.raises(GpusimError):
        env.set_state({"x": torch.ones(2), "timestep": torch.tensor([0, -1], dtype=torch.int32)})
    after = env.get_state()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert json.dumps(sorted(before)) == json.dumps(sorted(after))
