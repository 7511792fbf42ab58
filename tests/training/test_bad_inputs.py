"""Every bad input is one clear error line and a non-zero exit, never a traceback.

A table: each CLI row is `(argv, extra environment, expected exit code, a phrase
the error line must contain)` for `python -m gpusim.train`, each tool row the
same for `gpusim.evaluate`, `gpusim.render` or `gpusim.plot`, and each API row
is a call and the phrase its exception must carry. Rows run in this process
(the tool's `main`, its output captured), which costs milliseconds; a row that
needs a process of its own (extra environment variables, or several ranks)
runs as a subprocess, two at a time, alongside. No failing row may leave a run
directory behind. The files the rows need (bad configs, damaged run
directories, an open cache directory, a full and a read-only file system
where this machine lets the test mount them) are made once for the module.
"""
import contextlib
import functools
import io
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
from bad_envs import RepeatedNames
from gpusim import doctor, train
from gpusim.config import load_yaml
from gpusim.errors import GpusimError
from gpusim.training.records import checkpoint
from gpusim.training.records.logger import lock_run_dir
from gpusim.training.run_config import load_run_config
from gpusim.training.trained import animation, evaluation, learning_curves, network_export

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ["--env", "cartpole", "--backend", "cpu"]
SMALL = ["--num_envs", "4", "--rollout_len", "8", "--total_steps", "32", "--quiet"]
SAC = ["--env", "pendulum", "--algorithm", "sac", "--backend", "cpu"]
TAG = ["--env", "tag_continuous", "--backend", "cpu"]
RANKS = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}


def custom(name):
    """A custom env with one mistake (tests/bad_envs.py), trained briefly."""
    return ["--env", f"bad_envs:{name}", "--backend", "cpu", "--num_envs", "2",
            "--rollout_len", "4", "--total_steps", "8", "--quiet"]

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
    ("tau zero", SAC + ["--set", "trainer.tau=0"], {}, 2, "'trainer.tau' must lie in"),
    ("negative sac_alpha", SAC + ["--set", "trainer.sac_alpha=-1"], {}, 2,
     "'trainer.sac_alpha' must be >= 0"),
    ("an off-policy key under ppo", CARTPOLE + ["--set", "trainer.tau=0.1"], {}, 2,
     "'trainer.tau' does not apply to algorithm ppo (it is a key of ddpg, td3, sac)"),
    ("a ppo key under sac", SAC + ["--set", "trainer.update_epochs=2"], {}, 2,
     "'trainer.update_epochs' does not apply to algorithm sac (it is a key of ppo, a2c)"),
    ("a gaussian key under sac", SAC + ["--set", "policy.log_std_init=-1"], {}, 2,
     "'policy.log_std_init' does not apply to algorithm sac"),
    ("a gaussian key on discrete actions", CARTPOLE + SMALL
     + ["--set", "policy.state_dependent_std=true"], {}, 2,
     "'policy.state_dependent_std' applies to continuous actions"),
    ("replay_ratio zero", SAC + ["--set", "trainer.replay_ratio=0"], {}, 2,
     "'trainer.replay_ratio' must be positive"),
    ("learning never starts", SAC + ["--total_steps", "500", "--set",
                                     "trainer.learning_starts=1000"], {}, 2,
     "'trainer.learning_starts' must be below total_steps"),
    ("a replay smaller than a batch", SAC + ["--set", "trainer.replay_size=10"], {}, 2,
     "'trainer.replay_size' must be at least batch_size"),
    ("priority_alpha huge", SAC + ["--set", "trainer.priority_alpha=1000"], {}, 2,
     "'trainer.priority_alpha' must lie in [0, 2]"),
    ("recurrent under sac", SAC + ["--set", "policy.recurrent=gru"], {}, 2,
     "'policy.recurrent' does not apply to algorithm sac"),
    ("recurrent and central", CARTPOLE + ["--set", "policy.recurrent=gru", "--set",
                                          "policy.critic=central"], {}, 2,
     "'policy.critic' must be local with a recurrent policy"),
    ("bptt_len not dividing", CARTPOLE + SMALL + ["--set", "policy.recurrent=gru", "--set",
                                                  "policy.bptt_len=3"], {}, 2,
     "multiple of policy.bptt_len"),
    ("networks too large", CARTPOLE + SMALL + ["--set", "policy.hidden_sizes=[10000000000]"],
     {}, 2, "training the policy networks"),
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
    ("a2c with epochs", CARTPOLE + ["--set", "trainer.algorithm=a2c", "--set",
                                    "trainer.update_epochs=4"], {}, 2,
     "a2c takes one gradient step"),
    ("unknown precision", CARTPOLE + ["--set", "trainer.precision=fp8"], {}, 2,
     "'trainer.precision' must be one of"),
    ("tf32 on the CPU", CARTPOLE + SMALL + ["--set", "trainer.precision=tf32"], {}, 2,
     "tf32 needs a CUDA GPU"),
    ("unknown compile mode", CARTPOLE + ["--set", "trainer.compile=maybe"], {}, 2,
     "'trainer.compile' must be one of"),
    ("zero minibatch rows", CARTPOLE + ["--set", "trainer.max_minibatch_rows=0"], {}, 2,
     "'trainer.max_minibatch_rows' must be at least 1"),
    ("unknown out_of_play", CARTPOLE + ["--set", "trainer.out_of_play=drop"], {}, 2,
     "'trainer.out_of_play' must be one of"),
    ("out_of_play auto, gone", CARTPOLE + ["--set", "trainer.out_of_play=auto"], {}, 2,
     "(auto, which meant skip, is gone)"),
    ("out_of_play without per-agent done", CARTPOLE + SMALL + ["--set",
                                                               "trainer.out_of_play=weigh"],
     {}, 2, "'trainer.out_of_play' applies to envs with per-agent done"),
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
    ("a search key without --auto_scale", CARTPOLE + SMALL + ["--set",
                                                              "scale.memory_budget=2GiB"],
     {}, 2, "'scale.memory_budget' sets the --auto_scale search; add --auto_scale"),
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
     {}, 2, "the rollout"),
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
    ("a key given twice", CARTPOLE + ["--config", "{files}/twice.yaml"], {}, 2,
     "twice.yaml: key 'lr' is given twice (line 3)"),
    ("a YAML boolean for a mode", CARTPOLE + ["--config", "{files}/precision_off.yaml"], {}, 2,
     "'trainer.precision' must be one of"),
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
    ("metrics with a text iteration", ["--resume", "{files}/text_iteration", "--total_steps",
                                       "64", "--quiet"], {}, 2, "line 1 is not a metrics record"),
    ("metrics with a null line", ["--resume", "{files}/null_metrics", "--total_steps", "64",
                                  "--quiet"], {}, 2, "line 1 is not a metrics record"),
    ("metrics with a list line", ["--resume", "{files}/list_metrics", "--total_steps", "64",
                                  "--quiet"], {}, 2, "line 1 is not a metrics record"),
    ("metrics a directory", ["--resume", "{files}/metrics_dir", "--total_steps", "64",
                             "--quiet"], {}, 2, "metrics.jsonl is not a file"),
    ("read-only run directory", ["--resume", "{readonly}/run", "--total_steps", "64", "--quiet"],
     {}, 2, "cannot write {readonly}/run/"),
    ("resume on a full disk", ["--resume", "{full}/run", "--total_steps", "64", "--quiet"], {}, 2,
     "No space left on device"),
    ("second checkpoint onto a full disk", CARTPOLE + SMALL + [
        "--total_steps", "64", "--set", "trainer.checkpoint_every=1", "--results_dir",
        "{small}/runs"], {}, 2, "checkpoint_000002.pt: No space left on device"),
    # custom envs: the env, the phase or attribute, and what is wrong
    ("config_class None", custom("NoConfigClass"), {}, 2,
     "env good: config_class must be a config dataclass"),
    ("setup without obs_dim", custom("NoObsDim"), {}, 2, "env good: setup() does not set obs_dim"),
    ("setup raises", custom("SetupRaises"), {}, 2,
     "env good: setup() raised KeyError: 'speed' (set GPUSIM_DEBUG=1"),
    ("phase raises", custom("PhaseRaises"), {}, 2,
     "env good: phase 'count_and_raise' of kernel 'good.step' raised ValueError: x ran past 2"),
    ("numba typing error", custom("TypingError"), {}, 2,
     "in phase 'read_a_missing_array' (bad_envs.py:"),
    ("an array never declared", custom("TypingError"), {}, 2,
     "Unknown attribute 'speed' of the env's arrays (s): declare it in array_specs(), or "
     "check its name"),
    ("a parameter never declared", custom("UnknownParameter"), {}, 2,
     "Unknown attribute 'speed' of the env's parameters (p): make it a config field or a "
     "derived() value, or check its name"),
    ("agent in no policy", custom("AgentInNoPolicy"), {}, 2,
     "env good: agents 1 are in no policy"),
    ("agent in two policies", custom("AgentInTwoPolicies"), {}, 2,
     "env good: agent 1 is in policies 'agent' and 'other'"),
    # the environment
    ("RANK not a number", CARTPOLE + SMALL, {"RANK": "abc", "WORLD_SIZE": "2"}, 2,
     "environment variable RANK must be an integer"),
    ("inconsistent ranks", CARTPOLE + SMALL, {"RANK": "5", "WORLD_SIZE": "2"}, 2,
     "inconsistent rank variables"),
    ("no master address", CARTPOLE + SMALL, RANKS, 2, "needs MASTER_ADDR and MASTER_PORT"),
    ("port not a number", CARTPOLE + SMALL, dict(RANKS, MASTER_ADDR="127.0.0.1",
                                                 MASTER_PORT="notaport"), 2,
     "MASTER_PORT must be a port number 1..65535, got 'notaport'"),
    ("cache others can write", CARTPOLE + SMALL, {"GPUSIM_CACHE_DIR": "{files}/open_cache"}, 2,
     "writable by other users"),
    # several processes: bad input is still exit code 2, once
    ("bad input, two processes", CARTPOLE + SMALL + ["--num_gpus", "2", "--set",
                                                     "trainer.lr=-1"], {}, 2,
     "'trainer.lr' must be positive"),
    ("bad input inside the ranks", CARTPOLE + SMALL + ["--num_gpus", "2", "--set",
                                                       "trainer.torch_threads=2"], {}, 2,
     "exceeds the 1 cores"),
    ("action mask leaves no choice", custom("DeadMask"), {}, 2,
     "env dead_mask: the action mask ('legal') leaves agent agent_1 (id 1) of replica 0 no "
     "legal choice for action component 0 after reset (step 0)"),
]


# Rows whose config is valid: their runs start, so they may leave a run directory
FAILS_WHILE_TRAINING = {"phase raises"}

# (id, tool, argv, exit code, phrase): the other command-line tools
TOOL_ROWS = [
    ("render into a missing folder", "render", ["cartpole", "--out", "{files}/nowhere/e.gif"], 2,
     "the folder {files}/nowhere does not exist"),
    ("render onto a directory", "render", ["cartpole", "--out", "{files}/a_dir.gif"], 2,
     "--out {files}/a_dir.gif is a directory"),
    ("render to an unknown format", "render", ["cartpole", "--out", "{files}/e.png"], 2,
     "--out must end in .gif or .mp4"),
    ("render replica -1", "render", ["cartpole", "--replica", "-1"], 2,
     "argument --replica: must be in 0..1,000,000, got -1"),
    ("render max_steps 1e12", "render", ["cartpole", "--max_steps", "1e12"], 2,
     "argument --max_steps: invalid int value: '1e12'"),
    ("render too many steps", "render", ["cartpole", "--max_steps", "1000000000000"], 2,
     "argument --max_steps: must be in 1..100,000"),
    ("render no source", "render", [], 2, "the following arguments are required: source"),
    ("evaluate negative num_envs", "evaluate", ["{files}/run", "--num_envs", "-4"], 2,
     "argument --num_envs: must be at least 1, got -4"),
    ("evaluate one episode", "evaluate", ["{files}/run", "--episodes", "1"], 2,
     "argument --episodes: must be at least 2"),
    ("evaluate no run", "evaluate", ["{files}/no_such_run"], 2, "is not a run directory"),
    ("evaluate unknown flag", "evaluate", ["{files}/run", "--bogus"], 2,
     "unrecognized arguments: --bogus"),
    ("plot without a run", "plot", [], 2, "the following arguments are required: run_dir"),
    ("plot a null metrics line", "plot", ["{files}/null_metrics"], 2,
     "line 1 is not a metrics record"),
    ("plot metrics a directory", "plot", ["{files}/metrics_dir"], 2, "metrics.jsonl is not a file"),
    ("doctor unknown flag", "doctor", ["--jsn"], 2, "unrecognized arguments: --jsn"),
    ("render unknown flag", "render", ["cartpole", "--bogus"], 2,
     "unrecognized arguments: --bogus"),
    ("plot unknown flag", "plot", ["{files}/run", "--bogus"], 2, "unrecognized arguments: --bogus"),
    # trained policies: evaluated deterministically, exported
    ("evaluate a run without a checkpoint", "evaluate", ["{files}/no_checkpoint",
                                                         "--deterministic"], 2,
     "no checkpoint found"),
    ("export a run without a checkpoint", "export", ["{files}/no_checkpoint", "--out",
                                                     "{files}/exported"], 2,
     "no checkpoint found"),
    ("export a policy that does not exist", "export", ["{files}/run", "--policy", "nope",
                                                       "--out", "{files}/exported"], 2,
     "has no policy 'nope' (its policies: agent)"),
    ("export to an unknown format", "export", ["{files}/run", "--format", "tflite"], 2,
     "argument --format: invalid choice: 'tflite'"),
    ("export onto a file", "export", ["{files}/run", "--out", "{files}/a_file"], 2,
     "--out {files}/a_file is a file: name a folder"),
    ("export without a run", "export", [], 2, "the following arguments are required: run_dir"),
]
TOOLS = {"train": train.main, "evaluate": evaluation.main, "render": animation.main,
         "plot": learning_curves.main, "doctor": doctor.main, "export": network_export.main}


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
    for name, first_line in (("bad_metrics", "not json"), ("null_metrics", "null"),
                             ("list_metrics", "[1, 2]"),
                             ("text_iteration", '{"iteration": "1", "env_steps": 32}')):
        shutil.copytree(run, files / name)
        metrics = files / name / "metrics.jsonl"
        metrics.write_text(first_line + "\n" + metrics.read_text())
    shutil.copytree(run, files / "metrics_dir")
    (files / "metrics_dir" / "metrics.jsonl").unlink()
    (files / "metrics_dir" / "metrics.jsonl").mkdir()
    shutil.copytree(run, files / "no_checkpoint")
    shutil.rmtree(files / "no_checkpoint" / "checkpoints")
    shutil.copytree(run, files / "locked")


@contextlib.contextmanager
def small_file_systems(files: Path):
    """tmpfs mounts, where this machine lets us mount (else fewer, or none): "full" holds
    the run and no space beside it, "small" room for one checkpoint and not two, and
    "readonly" the run, mounted read-only."""
    one_checkpoint = checkpoint.list_checkpoints(files / "run" / "checkpoints")[-1].stat().st_size
    sizes = {"full": 4 << 20, "small": one_checkpoint * 3 // 2 + (64 << 10), "readonly": 4 << 20}
    mounted, found = [], {}
    try:
        for name, size in sizes.items():
            point = files / name
            point.mkdir()
            if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True).returncode != 0:
                break
            mounted.append(point)
            found[name] = point
        for name in ("full", "readonly"):
            if name in found:
                shutil.copytree(files / "run", found[name] / "run")
        if "full" in found:  # fill what is left
            with contextlib.suppress(OSError), open(found["full"] / "filler", "wb") as f:
                while True:
                    f.write(bytes(1 << 16))
        if "readonly" in found and subprocess.run(["mount", "-o", "remount,ro",
                                                   str(found["readonly"])]).returncode != 0:
            del found["readonly"]
        if "readonly" not in found and os.geteuid() != 0:  # no mount: permissions do
            found["readonly"] = files / "readonly_by_mode"
            shutil.copytree(files / "run", found["readonly"] / "run")
            set_modes(found["readonly"] / "run", files=0o444, folders=0o555)
        yield found
    finally:
        for point in mounted:
            subprocess.run(["umount", "-l", str(point)], capture_output=True)
        if (files / "readonly_by_mode").exists():  # so that pytest can remove it
            set_modes(files / "readonly_by_mode" / "run", files=0o644, folders=0o755)


def set_modes(folder: Path, files: int, folders: int):
    for path in sorted(folder.rglob("*"), reverse=True) + [folder]:
        path.chmod(folders if path.is_dir() else files)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    files = tmp_path_factory.mktemp("bad_inputs")
    (files / "invalid.yaml").write_text("trainer: {lr: [\n")
    (files / "trainer5.yaml").write_text("trainer: 5\n")
    (files / "envlist.yaml").write_text("env: [1, 2]\n")
    (files / "list.yaml").write_text("- 1\n- 2\n")
    (files / "latin1.yaml").write_bytes("trainer:\n  lr: 0.001 # caf\xe9\n".encode("latin-1"))
    (files / "section.yaml").write_text("extra: {}\n")
    (files / "twice.yaml").write_text("trainer:\n  lr: 0.001\n  lr: 0.002\n")
    (files / "precision_off.yaml").write_text("trainer:\n  precision: off\n")
    (files / "a_file").write_text("not a directory\n")
    (files / "a_dir.gif").mkdir()
    (files / "open_cache").mkdir()
    (files / "open_cache").chmod(0o777)
    damaged_runs(files)
    with small_file_systems(files) as mounts:
        yield files, mounts


# Rows that start ranks need a process of their own (they run in the background), and so
# do rows with environment variables: a rank under torchrun ends its process (os._exit), and
# this process's compiled kernels would bypass a compile cache given to it.
STARTS_RANKS = {"bad input inside the ranks", "resume with other process count"}


def own_process(row) -> bool:
    return bool(row[2]) or row[0] in STARTS_RANKS


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT")


def filled(args, files, mounts) -> list:
    return [a.format(files=files, **{k: str(v) for k, v in mounts.items()}) for a in args]


def in_this_process(main, argv) -> subprocess.CompletedProcess:
    """`main(argv)` with its output captured, as a process would give it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def in_a_process(argv, extra, files) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env.update({k: v.format(files=files) for k, v in extra.items()},
               PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "gpusim.train", *argv], capture_output=True,
                          text=True, env=env, cwd=files, timeout=300)


@pytest.fixture(scope="module")
def cli_results(files):
    """Every CLI and tool row: {id: (result, its results_dir or None)}."""
    files, mounts = files
    holder = lock_run_dir(files / "locked")  # as a running --resume would
    results, threads = {}, (torch.get_num_threads(), __import__("numba").get_num_threads())

    def argv_of(k, row):
        argv = filled(row[1], files, mounts)
        if "--results_dir" in argv or "--resume" in argv:
            return argv, None
        results_dir = files / "results" / str(k)
        return argv + ["--results_dir", str(results_dir)], results_dir
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            pending = {}
            for k, row in enumerate(CLI_ROWS):
                if own_process(row):
                    argv, results_dir = argv_of(k, row)
                    pending[row[0]] = (pool.submit(in_a_process, argv, row[2], files), results_dir)
            for k, row in enumerate(CLI_ROWS):
                if not own_process(row) and not unmounted(row, mounts):
                    argv, results_dir = argv_of(k, row)
                    results[row[0]] = (in_this_process(train.main, argv), results_dir)
            for name, tool, argv, _, _ in TOOL_ROWS:
                results[name] = (in_this_process(TOOLS[tool], filled(argv, files, mounts)), None)
            results.update({name: (future.result(), d) for name, (future, d) in pending.items()})
        return results
    finally:
        holder.close()
        torch.set_num_threads(threads[0])  # the rows in this process bound them
        __import__("numba").set_num_threads(threads[1])


def unmounted(row, mounts) -> str | None:
    """The file system a row needs that this machine could not mount, or None."""
    return next((name for name in ("full", "small", "readonly")
                 if any(f"{{{name}}}" in a for a in row[1]) and name not in mounts), None)


def test_the_table_is_large_enough():
    assert len(CLI_ROWS) + len(TOOL_ROWS) + len(API_ROWS) >= 100
    names = [row[0] for row in CLI_ROWS + TOOL_ROWS + API_ROWS]
    assert len(set(names)) == len(names)


def check_one_error_line(result, code, phrase):
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == code, result.stderr[-2000:]
    assert len(errors) == 1 and phrase in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("row", CLI_ROWS, ids=[row[0] for row in CLI_ROWS])
def test_cli_bad_input(cli_results, files, row):
    files, mounts = files
    name, _, _, code, phrase = row
    missing = unmounted(row, mounts)
    if missing:
        pytest.skip(f"cannot mount a small {missing} file system here")
    result, results_dir = cli_results[name]
    check_one_error_line(result, code, filled([phrase], files, mounts)[0])
    if results_dir is not None and name not in FAILS_WHILE_TRAINING:
        assert not results_dir.exists() or not any(results_dir.iterdir())  # made too early


@pytest.mark.parametrize("row", TOOL_ROWS, ids=[row[0] for row in TOOL_ROWS])
def test_tool_bad_input(cli_results, files, row):
    files, mounts = files
    name, _, _, code, phrase = row
    check_one_error_line(cli_results[name][0], code, filled([phrase], files, mounts)[0])


def test_a_failed_write_leaves_the_checkpoints_as_they_were(cli_results, files):
    files, mounts = files
    if not {"full", "small"} <= set(mounts):
        pytest.skip("cannot mount small file systems here")
    for checkpoints in (mounts["full"] / "run" / "checkpoints",
                        next((mounts["small"] / "runs").iterdir()) / "checkpoints"):
        assert not [p.name for p in checkpoints.iterdir() if p.name.endswith(".tmp")]
        assert checkpoint.load_latest(checkpoints)["iteration"] == 1


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
    ("config a dict", lambda: gpusim.make("cartpole", config={"tau": 0.01}),
     "config= takes a CartPoleConfig"),
    ("set_state None", lambda: cartpole().set_state(None), "set_state takes a dict"),
    ("set_state a list", lambda: cartpole().set_state([1]), "set_state takes a dict"),
    ("meta actions", lambda: step_with(torch.zeros((2, 1, 1), dtype=torch.int64, device="meta")),
     "actions is on the meta device"),
    ("meta state", lambda: set_state_with(x=torch.zeros(2, device="meta")),
     "state['x'] is on the meta device"),
    ("sampler for Box actions", lambda: gpusim.ActionSampler(gpusim.make("pendulum",
                                                                         backend="cpu")),
     "ActionSampler draws discrete actions"),
    ("agent names repeated", lambda: RepeatedNames(num_envs=1, backend="cpu"),
     "env good: agent_names repeats 'player'"),
    ("a YAML key given twice", lambda: load_yaml(yaml_file("env:\n  tau: 1\n  tau: 2\n")),
     "key 'tau' is given twice (line 3)"),
    ("action mask leaves no choice after reset",
     lambda: gpusim.make("bad_envs:DeadMask", num_envs=2, backend="cpu").reset(),
     "leaves agent agent_1 (id 1) of replica 0 no legal choice for action component 0 after "
     "reset (step 0)"),
    # a trained run's policies (gpusim.load_policies)
    ("policies of a run without a checkpoint",
     lambda: gpusim.load_policies(trained_cartpole() / "no_checkpoint"), "no checkpoint found"),
    ("policies of no run directory", lambda: gpusim.load_policies(None),
     "load_policies: run_dir must be a run directory's path (a str or pathlib.Path), got "
     "NoneType"),
    ("a policy that does not exist", lambda: gpusim.load_policies(trained_cartpole())["nope"],
     "has no policy 'nope' (its policies: agent)"),
    ("an observation of the wrong width",
     lambda: gpusim.load_policies(trained_cartpole())["agent"].act(np.zeros(5)),
     "policy 'agent' observes 4 entries: obs must have shape (..., 4), got (5,)"),
]


@functools.cache
def trained_cartpole() -> Path:
    """A tiny cartpole run (its subfolder no_checkpoint: a copy without checkpoints)."""
    import atexit
    import tempfile
    root = Path(tempfile.mkdtemp(prefix="gpusim-bad-inputs-"))
    atexit.register(shutil.rmtree, root, True)
    threads = torch.get_num_threads(), __import__("numba").get_num_threads()
    assert train.main(CARTPOLE + SMALL + ["--results_dir", str(root)]) == 0
    torch.set_num_threads(threads[0])  # the run bound them
    __import__("numba").set_num_threads(threads[1])
    (run,) = root.iterdir()
    shutil.copytree(run, run / "no_checkpoint", ignore=shutil.ignore_patterns("checkpoints"))
    return run


def yaml_file(text: str) -> Path:
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    return Path(f.name)


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


@pytest.mark.parametrize("text, expected", [("off", "off"), ("on", "on"), ("no", "off"),
                                            ("yes", "on"), ("auto", "auto")])
def test_on_off_words_that_yaml_reads_as_booleans_are_taken_as_words(text, expected, tmp_path):
    """`--set trainer.compile=off` and `compile: off` in a file: YAML 1.1 reads them as
    booleans, and a string key takes the word back."""
    cartpole_class = gpusim.envs.env_class("cartpole")
    by_flag = load_run_config("cartpole", cartpole_class, sets=[f"trainer.compile={text}"])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"trainer:\n  compile: {text}\n")
    in_file = load_run_config("cartpole", cartpole_class, path=recipe)
    assert by_flag.trainer.compile == in_file.trainer.compile == expected


# ---- a population too large to fit: blamed on its size, trainer.population -------------
def population_config(members: int):
    cls = gpusim.envs.env_class("cartpole")
    return cls, load_run_config("cartpole", cls, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 8, "trainer.rollout_len": 16,
        "trainer.torch_threads": 1, "trainer.compile": "off", "trainer.population": members})


class _OnCpu:
    class backend:
        device = "cpu"


@pytest.mark.parametrize("members", [1, 4])
def test_out_of_memory_names_the_population_where_there_is_one(members):
    """Out of memory while training (cli.too_large): one line, naming trainer.population
    first among what to lower where the run is a population."""
    from gpusim.training.train_cli import too_large
    _, config = population_config(members)
    line = str(too_large(config, _OnCpu, MemoryError("out of memory")))
    assert "\n" not in line and "trainer.num_envs" in line
    assert ("trainer.population" in line) == (members > 1), line
    if members > 1:
        assert "a population of 4 (trainer.population) x 8 replicas" in line
        assert "lower trainer.population, trainer.num_envs" in line


def test_a_populations_memory_checks_name_its_size(monkeypatch):
    """The checks before allocating: a population's rollout buffers and networks name
    trainer.population (a refusal reads `{what} needs X, Y available on DEVICE`)."""
    from gpusim.backends.base import Backend
    from gpusim.training.loop import Trainer
    cls, config = population_config(4)
    checked = []
    monkeypatch.setattr(Backend, "check_fits", lambda self, what, n: checked.append(what))
    Trainer(config, cls)
    assert any(what.startswith("the rollout buffers (16 steps x a population of 4 "
                               "(trainer.population) x 8 replicas") for what in checked), checked
    assert any(what.startswith("training the policy networks of a population of 4 "
                               "(trainer.population)") for what in checked), checked


@pytest.mark.parametrize("members", [1, 4])
def test_a_population_whose_replicas_do_not_fit_is_blamed_on_its_size(monkeypatch, members):
    """The env's arrays hold every member's replicas: where they cannot fit, the one line
    names trainer.population (a solo run's refusal is the env's own)."""
    from gpusim.backends.base import Backend
    from gpusim.errors import NotEnoughMemory
    from gpusim.training.loop import Trainer
    cls, config = population_config(members)

    def refuse(self, what, n):
        if what.startswith("the arrays of"):
            raise NotEnoughMemory(f"{what} needs 9 GiB, 1 GiB available on cpu")
    monkeypatch.setattr(Backend, "check_fits", refuse)
    with pytest.raises(NotEnoughMemory) as refused:
        Trainer(config, cls)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"the arrays of {8 * members} cartpole")
    assert ("trainer.population" in line) == (members > 1), line
    if members > 1:
        assert line.endswith("(a population of 4 (trainer.population) x 8 replicas): lower "
                             "trainer.population or trainer.num_envs"), line
