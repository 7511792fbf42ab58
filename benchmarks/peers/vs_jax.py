"""gpusim against PPO compiled end to end by JAX, and against Stable-Baselines3's SAC, on the CPU.

    python -m benchmarks.peers.vs_jax --peers .venv-peers/bin/python
    python -m benchmarks.peers.vs_jax --peers .venv-peers/bin/python --rounds 1 --num_envs 32 \\
        --solve_envs 32 --skip-sac

The peers are never project dependencies: they live in a venv of their own,
made once with

    python -m venv .venv-peers && .venv-peers/bin/pip install torch==2.13.0 && \\
        .venv-peers/bin/pip install jax rejax==0.1.3 gymnax==1.0.1 stable-baselines3 gymnasium

(torch first and pinned, as .ci/run installs it, so that SB3 does not pull
another torch with its CUDA wheels). Their code runs in subprocesses of
that python (`--peers`); SB3 is optional (without it the SAC rows are
skipped, with the command to install it). This script runs under gpusim's
own python (its .venv).

What is compared, with one set of hyperparameters for both sides
(PPO_SETTINGS, SAC_SETTINGS: gpusim gets each of them by --set, the peer by
its own option), each run a fresh process, interleaved: every round runs
every row once (gpusim, then the peer, at each setting), so a slow period of
a shared machine falls on all of them; round r runs seed r on both sides;
tables give the median and the range over `--rounds` (a round of the
defaults takes about ten minutes on 2 cores).

- PPO on cartpole: gpusim (`python -m gpusim.train --env cartpole --backend
  cpu`, with `trainer.compile` off and on) against rejax 0.1.3's PPO on
  gymnax 1.0.1's CartPole-v1 under jax, the whole training loop one jitted
  function. rejax's PPO is configured to gpusim's recipe; two things are
  changed in a subclass: its optimizer (rejax clips each gradient element;
  here clip-by-global-norm and Adam with eps 1e-5 and gpusim's learning-rate
  annealing, as gpusim's torch Adam), and a record of the training
  episodes' returns (rejax logs none). A small wrapper gives gymnax 1.0.1's
  6-value `step` rejax's 5 values (done = terminated or truncated). What
  still differs is printed under the tables.
- Throughput, per num_envs (`--num_envs`): env steps per second of steady
  training over `--iterations` iterations of num_envs x 64 steps (no early
  stop). gpusim: from the run's metrics.jsonl, its iterations after the
  first (the "done:" line's rate counts the first iteration too, which under
  trainer.compile=on holds torch.compile's compile; start-up and the env
  kernels' compile come before it and count in neither), and its update
  alone: those iterations' env steps over their update time (the metrics'
  time shares), the rate a rollout that took no time would give. JAX: the training
  function compiled ahead (`jax.jit(f).lower(state).compile()`, its time
  shown apart), then one call of the compiled function timed.
- Time to solve, per num_envs (`--solve_envs`): a process that stops once
  the mean return of the last 100 finished training episodes reaches 475
  (gpusim's rule, checked after every iteration on both sides), within the
  recipe's 499,712-step budget (which also sets the annealing): the wall
  time of the whole process, from its start to its exit. gpusim "cold": a
  fresh, empty compile cache (GPUSIM_CACHE_DIR, which holds the env kernels
  and torch.compile's code); "warm": the same cache, filled by the cold run.
  JAX: one process whose compiled loop runs until solved; its wall time
  (compile in), and the same less the ahead-of-time compile (compile out;
  jax keeps no compile cache unless one is configured, so every process
  compiles). The env steps
  at the solve are the last iteration's (gpusim's metrics; the JAX state's
  step counter).
- SAC on pendulum: gpusim (`--env pendulum --algorithm sac`, the sac.yaml
  recipe) against SB3's SAC on gymnasium's Pendulum-v1, `--sac_steps` env
  steps each (no early stop), gpusim with `trainer.compile` off and on: env
  steps per second of training (gpusim's learning phase from its metrics,
  leaving out the first iteration that learns, which holds the compile under
  compile=on; SB3's `learn` as a whole, its faster random-action warm-up
  included, which favours it slightly), and the final return: the mean of
  the last (up to) 100 finished episodes.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The environment children start with: taken before anything here imports gpusim, whose
# import sets thread defaults in os.environ.
BASE_ENV = {k: v for k, v in os.environ.items()
            if k not in ("GPUSIM_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}

from benchmarks.common import ROOT, machine  # noqa: E402

TARGET = 475.0                 # cartpole: mean return over the last 100 finished episodes
SOLVE_BUDGET = 499_712         # cartpole recipe's total_steps (also sets the annealing)
ROLLOUT = 64
PEERS_VENV = ("python -m venv .venv-peers && .venv-peers/bin/pip install torch==2.13.0 && "
              ".venv-peers/bin/pip install jax rejax==0.1.3 gymnax==1.0.1 "
              "stable-baselines3 gymnasium")
DONE = re.compile(r"^done.*\(([\d,]+) steps/s\)", re.MULTILINE)

# PPO on cartpole, both sides: gpusim's recipe (envs/cartpole/config.yaml over the defaults
# of training/run_config.py and PPOConfig), spelled out so that neither side falls back to a
# default of its own. Keys are gpusim's; POLICY_KEYS go in the `policy` section.
PPO_SETTINGS = {
    "rollout_len": ROLLOUT, "update_epochs": 4, "num_minibatches": 4,
    "lr": 1e-3, "anneal_lr": True, "gamma": 0.99, "gae_lambda": 0.95,
    "clip_coef": 0.2, "clip_vloss": True, "ent_coef": 0.0, "vf_coef": 0.5,
    "max_grad_norm": 0.5, "norm_adv": True,
    "hidden_sizes": [64, 64], "activation": "tanh",
}
# SAC on pendulum, both sides: envs/pendulum/sac.yaml over the defaults.
SAC_SETTINGS = {
    "num_envs": 8, "rollout_len": 8, "lr": 1e-3, "gamma": 0.99,
    "replay_size": 1_000_000, "batch_size": 256, "replay_ratio": 1.0,
    "learning_starts": 1000, "tau": 0.005, "max_grad_norm": 0.5,
    "hidden_sizes": [256, 256], "activation": "relu",
}
POLICY_KEYS = ("hidden_sizes", "activation")

NOTES = [
    "PPO: rejax updates the actor and the critic with an optimizer each, each clipped by "
    "its own gradient norm; gpusim takes one Adam step on the summed loss, clipped by the "
    "norm over both networks (the per-parameter Adam arithmetic is the same).",
    "PPO: initial weights: gpusim orthogonal (gain sqrt 2, 0.01 on the policy head, 1 on "
    "the value head); rejax flax's default (LeCun normal), not configurable in rejax 0.1.3.",
    "PPO: at the 500-step limit gpusim bootstraps (gamma x V(final state)); rejax treats a "
    "truncation as a termination (the wrapper merges them).",
    "PPO: advantages are normalised per minibatch on both sides (torch's unbiased std, "
    "jax's biased one).",
    "PPO: the envs are gpusim's cartpole kernel and gymnax's CartPole-v1 (the same "
    "dynamics and rules, their own random streams); seeds are the same numbers, not the "
    "same runs.",
    "PPO time to solve: gpusim's process also writes its metrics and a checkpoint every "
    "20 iterations (the recipe); the JAX process writes nothing.",
    "SAC: gpusim clips each network's gradient norm at 0.5; SB3's SAC cannot clip. "
    "Log-std clamp: gpusim [-5, 2], SB3 [-20, 2].",
]


class RunFailed(Exception):
    """A run that did not give its numbers; the message is one line."""


# ---- gpusim ---------------------------------------------------------------------------
def gpusim_sets(settings: dict) -> list:
    """--set arguments for every setting (values in YAML, which JSON is)."""
    out = []
    for key, value in settings.items():
        section = "policy" if key in POLICY_KEYS else "trainer"
        out += ["--set", f"{section}.{key}={json.dumps(value)}"]
    return out


def run_gpusim(args: list, cache: str, seed: int) -> tuple:
    """One `python -m gpusim.train` process: (stdout, wall seconds, metrics rows)."""
    from gpusim.training.trained.learning_curves import read_metrics
    env = dict(BASE_ENV, GPUSIM_CACHE_DIR=cache)
    with tempfile.TemporaryDirectory() as results:
        argv = [sys.executable, "-m", "gpusim.train", *args, "--backend", "cpu", "--quiet",
                "--seed", str(seed), "--results_dir", results]
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=3600)
        wall = time.perf_counter() - start
        if done.returncode != 0 or DONE.search(done.stdout) is None:
            raise RunFailed(f"exit {done.returncode}: "
                            f"{last_line(done.stderr or done.stdout)}")
        (run_dir,) = Path(results).iterdir()
        return done.stdout, wall, read_metrics(run_dir)


def gpusim_ppo_args(num_envs: int, compile_mode: str) -> list:
    return ["--env", "cartpole", "--num_envs", str(num_envs),
            "--set", f"trainer.compile={compile_mode}", *gpusim_sets(PPO_SETTINGS)]


def gpusim_throughput(num_envs: int, compile_mode: str, iterations: int, seed: int,
                      cache: str) -> dict:
    """Env steps/s of the iterations after the first, over a fixed number of them."""
    steps = iterations * num_envs * ROLLOUT
    _, _, rows = run_gpusim(gpusim_ppo_args(num_envs, compile_mode) + [
        "--total_steps", str(steps), "--set", "trainer.target_return=null",
        "--set", "trainer.checkpoint_every=1000000"], cache, seed)
    first, last = rows[0], rows[-1]
    steady = rows[1:]
    # The update alone: the iterations' env steps over their update time (each row's share
    # of its own iteration's time). No rollout, however fast, takes gpusim past this rate.
    update_s = sum(r["time_share/update"] * num_envs * ROLLOUT / r["env_steps_per_s"]
                   for r in steady)
    return {"rate": (last["env_steps"] - first["env_steps"]) / (last["time_s"] - first["time_s"]),
            "update_alone": len(steady) * num_envs * ROLLOUT / update_s}


def gpusim_solve(num_envs: int, compile_mode: str, seed: int, cache: str) -> dict:
    """The whole process until the target return (the recipe stops there)."""
    stdout, wall, rows = run_gpusim(gpusim_ppo_args(num_envs, compile_mode) + [
        "--total_steps", str(SOLVE_BUDGET), "--set", f"trainer.target_return={TARGET}"],
        cache, seed)
    return {"wall": wall, "steps": rows[-1]["env_steps"],
            "solved": "(target reached)" in stdout}


def gpusim_sac(steps: int, compile_mode: str, seed: int, cache: str) -> dict:
    """Env steps/s of the learning phase (from the second iteration that learns: the first
    holds torch.compile's compile under trainer.compile=on), and the final return."""
    _, _, rows = run_gpusim(["--env", "pendulum", "--algorithm", "sac",
                             "--total_steps", str(steps),
                             "--set", "trainer.target_return=null",
                             "--set", f"trainer.compile={compile_mode}",
                             *gpusim_sets(SAC_SETTINGS)], cache, seed)
    per_iteration = SAC_SETTINGS["num_envs"] * SAC_SETTINGS["rollout_len"]
    first = next(r for r in rows
                 if r["env_steps"] >= SAC_SETTINGS["learning_starts"] + 2 * per_iteration)
    last = rows[-1]
    return {"rate": (last["env_steps"] - first["env_steps"]) / (last["time_s"] - first["time_s"]),
            "return": last["episode_return/agent"]}


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


# ---- the peers, each a program for the peers' python -----------------------------------
# rejax's PPO on gymnax's CartPole-v1. argv: mode (throughput | solve), settings (JSON:
# PPO_SETTINGS plus num_envs, iterations, anneal_iterations, target, seed). Prints one line
# "RESULT {json}".
JAX_PPO = r"""
import json, sys, time
START = time.perf_counter()
import gymnax, jax, optax
import jax.numpy as jnp
from flax.training.train_state import TrainState
from rejax import PPO
from rejax.algos.algorithm import register_init

MODE, S = sys.argv[1], json.loads(sys.argv[2])
RECENT = 100  # finished episodes in the running mean


class MergedDone:
    # gymnax 1.0.1's env with the step rejax 0.1.3 unpacks: (obs, state, reward, done, info),
    # done = terminated or truncated; everything else is the env's own.
    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def learning_rate(count):
    # gpusim's: constant within an iteration, falling linearly to 0 at the last one
    if not S["anneal_lr"]:
        return S["lr"]
    iteration = count // (S["update_epochs"] * S["num_minibatches"])
    return S["lr"] * jnp.maximum(0.0, 1.0 - iteration / S["anneal_iterations"])


class BenchPPO(PPO):
    @register_init
    def initialize_network_params(self, rng):
        # rejax's networks, with gpusim's optimizer: clip by global norm, Adam eps 1e-5
        tx = optax.chain(optax.clip_by_global_norm(S["max_grad_norm"]),
                         optax.adam(learning_rate, eps=1e-5))
        nets = super().initialize_network_params(rng)
        return {name: TrainState.create(apply_fn=(), params=ts.params, tx=tx)
                for name, ts in nets.items()}

    @register_init
    def initialize_episode_record(self, rng):
        return {"running_return": jnp.zeros(self.num_envs), "recent": jnp.zeros(RECENT),
                "episodes": jnp.int32(0)}

    def collect_trajectories(self, ts):
        # rejax's rollout, then its finished episodes' returns into a ring of the last 100
        ts, traj = super().collect_trajectories(ts)

        def record(carry, step):
            running, recent, count = carry
            reward, done = step
            running = running + reward
            order = jnp.cumsum(done) - 1
            keep = done & (order >= done.sum() - RECENT)
            slot = jnp.where(keep, (count + order) % RECENT, RECENT)  # RECENT: dropped
            recent = recent.at[slot].set(running, mode="drop")
            return (jnp.where(done, 0.0, running), recent, count + done.sum()), None

        carry = (ts.running_return, ts.recent, ts.episodes)
        (running, recent, count), _ = jax.lax.scan(record, carry, (traj.reward, traj.done))
        return ts.replace(running_return=running, recent=recent, episodes=count), traj


def solved(ts):
    return (ts.episodes >= RECENT) & (ts.recent.mean() >= S["target"])


env, env_params = gymnax.make("CartPole-v1")
algo = BenchPPO.create(
    env=MergedDone(env), env_params=env_params, num_envs=S["num_envs"],
    num_steps=S["rollout_len"], num_epochs=S["update_epochs"],
    num_minibatches=S["num_minibatches"], learning_rate=S["lr"], gamma=S["gamma"],
    gae_lambda=S["gae_lambda"], clip_eps=S["clip_coef"], ent_coef=S["ent_coef"],
    vf_coef=S["vf_coef"], max_grad_norm=S["max_grad_norm"],
    agent_kwargs={"activation": S["activation"], "hidden_layer_sizes": S["hidden_sizes"]},
    normalize_observations=False, normalize_rewards=False, skip_initial_evaluation=True)
last_step = S["iterations"] * S["num_envs"] * S["rollout_len"]


def fixed(ts):
    return jax.lax.fori_loop(0, S["iterations"], lambda _, ts: algo.train_iteration(ts), ts)


def until_solved(ts):
    going = lambda ts: ~solved(ts) & (ts.global_step < last_step)
    return jax.lax.while_loop(going, algo.train_iteration, ts)


ts = algo.init_state(jax.random.PRNGKey(S["seed"]))
ts = ts.replace(global_step=jnp.int32(0))
start = time.perf_counter()
train = jax.jit(fixed if MODE == "throughput" else until_solved).lower(ts).compile()
compile_s = time.perf_counter() - start
start = time.perf_counter()
ts = jax.block_until_ready(train(ts))
seconds = time.perf_counter() - start
print("RESULT " + json.dumps({
    "compile_s": compile_s, "seconds": seconds, "steps": int(ts.global_step),
    "solved": bool(solved(ts)), "episodes": int(ts.episodes),
    "return": float(ts.recent[:min(RECENT, int(ts.episodes))].mean()),
    "since_start_s": time.perf_counter() - START}))
"""

# SB3's SAC on gymnasium's Pendulum-v1. argv: settings (JSON: SAC_SETTINGS plus steps,
# seed). Prints one line "RESULT {json}".
SB3_SAC = r"""
import json, sys, time
import numpy as np
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

S = json.loads(sys.argv[1])


class Returns(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns = []

    def _on_step(self):
        self.returns += [info["episode"]["r"] for info in self.locals["infos"] if "episode" in info]
        return True


env = make_vec_env("Pendulum-v1", n_envs=S["num_envs"], seed=S["seed"])
activation = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}[S["activation"]]
model = SAC("MlpPolicy", env, learning_rate=S["lr"], buffer_size=S["replay_size"],
            batch_size=S["batch_size"], tau=S["tau"], gamma=S["gamma"],
            learning_starts=S["learning_starts"], train_freq=(S["rollout_len"], "step"),
            gradient_steps=round(S["replay_ratio"] * S["num_envs"] * S["rollout_len"]),
            ent_coef="auto", policy_kwargs={"net_arch": S["hidden_sizes"],
                                            "activation_fn": activation},
            seed=S["seed"], device="cpu", verbose=0)
returns = Returns()
start = time.perf_counter()
model.learn(total_timesteps=S["steps"], callback=returns)
seconds = time.perf_counter() - start
print("RESULT " + json.dumps({"rate": model.num_timesteps / seconds,
                              "return": float(np.mean(returns.returns[-100:]))}))
"""

VERSIONS = r"""
import importlib.metadata as m, importlib.util as u
names = ["jax", "jaxlib", "rejax", "gymnax", "flax", "optax", "stable-baselines3",
         "gymnasium", "torch"]
found = []
for name in names:
    try:
        found.append(f"{name} {m.version(name)}")
    except m.PackageNotFoundError:
        pass
print(", ".join(found) or "none of " + ", ".join(names))
modules = ["jax", "rejax", "gymnax", "stable_baselines3", "gymnasium"]
print("missing: " + " ".join(name for name in modules if u.find_spec(name) is None))
"""


def run_peer(python: str, script: str, *args: str) -> tuple:
    """One process of the peers' python: (its RESULT, wall seconds)."""
    start = time.perf_counter()
    done = subprocess.run([python, "-c", script, *args], env=BASE_ENV, capture_output=True,
                          text=True, timeout=3600)
    wall = time.perf_counter() - start
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        raise RunFailed(f"exit {done.returncode}: {last_line(done.stderr or done.stdout)}")
    return json.loads(results[-1][len("RESULT "):]), wall


def jax_settings(num_envs: int, iterations: int, seed: int) -> str:
    """The peer's settings: the run's length in iterations (the annealing's too, as in
    gpusim, whose run ends at total_steps even when it may stop earlier)."""
    return json.dumps({**PPO_SETTINGS, "num_envs": num_envs, "seed": seed, "target": TARGET,
                       "iterations": iterations, "anneal_iterations": iterations})


def jax_throughput(python: str, num_envs: int, iterations: int, seed: int) -> dict:
    result, _ = run_peer(python, JAX_PPO, "throughput", jax_settings(num_envs, iterations, seed))
    return {"rate": result["steps"] / result["seconds"], "compile": result["compile_s"]}


def jax_solve(python: str, num_envs: int, seed: int) -> dict:
    budget = max(1, SOLVE_BUDGET // (num_envs * ROLLOUT))  # gpusim's iterations
    result, wall = run_peer(python, JAX_PPO, "solve", jax_settings(num_envs, budget, seed))
    return {"wall": wall, "wall_out": wall - result["compile_s"], "compile": result["compile_s"],
            "steps": result["steps"], "solved": result["solved"]}


def sb3_sac(python: str, steps: int, seed: int) -> dict:
    result, _ = run_peer(python, SB3_SAC, json.dumps({**SAC_SETTINGS, "steps": steps,
                                                      "seed": seed}))
    return result


def peer_versions(python: str) -> tuple:
    """(the peers' package versions, whether SB3 and gymnasium are there); exits where the
    JAX side is missing."""
    done = subprocess.run([python, "-c", VERSIONS], env=BASE_ENV, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"error: --peers {python} does not run: {last_line(done.stderr)}")
    versions, missing = done.stdout.splitlines()[-2:]
    missing = missing.split()[1:]
    if {"jax", "rejax", "gymnax"} & set(missing):
        raise SystemExit(f"error: --peers {python} lacks {', '.join(missing)}; make a venv "
                         f"for the peers with: {PEERS_VENV}")
    return versions, not missing


# ---- measuring, round by round ----------------------------------------------------------
def plan(args, has_sb3: bool) -> list:
    """One round's runs, in order: (table, row, num_envs, function(seed, cache))."""
    runs = []
    peers, its = args.peers, args.iterations
    for n in args.num_envs:
        for mode in ("off", "on"):
            runs.append(("throughput", f"gpusim compile={mode}", n,
                         lambda seed, cache, n=n, m=mode: gpusim_throughput(n, m, its, seed,
                                                                            cache["shared"])))
        runs.append(("throughput", "JAX", n, lambda seed, cache, n=n: jax_throughput(
            peers, n, its, seed)))
    if not args.skip_solve:
        for n in args.solve_envs:
            for mode in ("off", "on"):
                for state in ("cold", "warm"):
                    runs.append(("solve", f"gpusim compile={mode}, {state}", n,
                                 lambda seed, cache, n=n, m=mode, s=state: gpusim_solve(
                                     n, m, seed, cache.fresh(m) if s == "cold" else cache[m])))
            runs.append(("solve", "JAX", n, lambda seed, cache, n=n: jax_solve(peers, n, seed)))
    if not args.skip_sac:
        steps = args.sac_steps
        for mode in ("off", "on"):
            runs.append(("sac", f"gpusim SAC compile={mode}", SAC_SETTINGS["num_envs"],
                         lambda seed, cache, m=mode: gpusim_sac(steps, m, seed,
                                                                cache["shared"])))
        if has_sb3:
            runs.append(("sac", "SB3 SAC", SAC_SETTINGS["num_envs"],
                         lambda seed, cache: sb3_sac(peers, steps, seed)))
    return runs


class Caches(dict):
    """gpusim compile caches: "shared" for the throughput and SAC runs; per compile mode,
    a fresh one made by each cold run and reused by the warm run after it."""

    def __init__(self, root: str):
        super().__init__(shared=tempfile.mkdtemp(dir=root))
        self.root = root

    def fresh(self, mode: str) -> str:
        self[mode] = tempfile.mkdtemp(dir=self.root)
        return self[mode]


def measure(runs: list, rounds: int) -> dict:
    """(table, row, num_envs) -> per round, the run's numbers, or its error (a str)."""
    results = {}
    with tempfile.TemporaryDirectory() as root:
        caches = Caches(root)
        for r in range(rounds):
            for table, row, n, run in runs:
                try:
                    value = run(r, caches)
                except RunFailed as failure:
                    value = str(failure)
                results.setdefault((table, row, n), []).append(value)
                print(f"round {r + 1}/{rounds} {table} {row} num_envs={n}: {brief(value)} "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return results


def brief(value) -> str:
    if isinstance(value, str):
        return f"FAILED {value}"
    return ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in value.items())


# ---- the tables -------------------------------------------------------------------------
def numbers(values: list, key: str) -> list:
    return [v[key] for v in values if isinstance(v, dict)]


def cell(values: list, key: str, fmt: str = ",.0f") -> str:
    got = numbers(values, key)
    if not got:
        return "failed"
    text = f"{statistics.median(got):{fmt}}"
    if len(got) > 1:
        text += f" ({min(got):{fmt}}-{max(got):{fmt}})"
    failed = len(values) - len(got)
    return text + (f", {failed} failed" if failed else "")


def ratio(a: list, b: list, key: str) -> str:
    return ratio_of(a, key, b, key)


def ratio_of(a: list, a_key: str, b: list, b_key: str) -> str:
    x, y = numbers(a, a_key), numbers(b, b_key)
    return f"{statistics.median(x) / statistics.median(y):.2f}x" if x and y else "-"


def report_throughput(results: dict, envs: list):
    rows = [(n, *(results[("throughput", row, n)]
                  for row in ("gpusim compile=off", "gpusim compile=on", "JAX")))
            for n in envs]
    print("\n## PPO cartpole throughput: env steps/s of steady training, median (range)\n")
    print("| num_envs | gpusim compile=off | gpusim compile=on | JAX (rejax) | JAX compile s "
          "| off / JAX | on / JAX |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, off, on, jax in rows:
        print(f"| {n} | {cell(off, 'rate')} | {cell(on, 'rate')} | {cell(jax, 'rate')} | "
              f"{cell(jax, 'compile', '.1f')} | {ratio(off, jax, 'rate')} | "
              f"{ratio(on, jax, 'rate')} |")
    print("\n## gpusim's update alone: env steps per second of update time (the rate with a "
          "rollout that took no time), against JAX's whole training\n")
    print("| num_envs | compile=off update alone | compile=on update alone | JAX whole "
          "| off update / JAX | on update / JAX |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, off, on, jax in rows:
        print(f"| {n} | {cell(off, 'update_alone')} | {cell(on, 'update_alone')} | "
              f"{cell(jax, 'rate')} | {ratio_of(off, 'update_alone', jax, 'rate')} | "
              f"{ratio_of(on, 'update_alone', jax, 'rate')} |")


def report_solve(results: dict, envs: list):
    print(f"\n## PPO cartpole time to solve (last 100 episodes >= {TARGET:.0f}): the whole "
          "process, median (range)\n")
    print("| num_envs | run | solved | env steps at the solve | wall s (compile in) | "
          "wall s less the compile (compile out) | compile s |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in envs:
        for row in ("gpusim compile=off, cold", "gpusim compile=off, warm",
                    "gpusim compile=on, cold", "gpusim compile=on, warm", "JAX"):
            values = results[("solve", row, n)]
            solved = f"{sum(1 for v in numbers(values, 'solved') if v)}/{len(values)}"
            jax = row == "JAX"
            print(f"| {n} | {row} | {solved} | {cell(values, 'steps')} | "
                  f"{cell(values, 'wall', ',.1f')} | "
                  f"{cell(values, 'wall_out', ',.1f') if jax else '-'} | "
                  f"{cell(values, 'compile', ',.1f') if jax else '-'} |")


def report_sac(results: dict, has_sb3: bool):
    n = SAC_SETTINGS["num_envs"]
    print(f"\n## SAC pendulum, {n} envs: env steps/s of training and final return (last 100 "
          "episodes), median (range)\n")
    print("| run | env steps/s | final return |")
    print("|---|---:|---:|")
    ours = [f"gpusim SAC compile={mode}" for mode in ("off", "on")]
    for row in ours + (["SB3 SAC"] if has_sb3 else []):
        values = results[("sac", row, n)]
        print(f"| {row} | {cell(values, 'rate')} | {cell(values, 'return', ',.1f')} |")
    if has_sb3:
        for row in ours:
            print(f"\n{row} / SB3 SAC: "
                  f"{ratio(results[('sac', row, n)], results[('sac', 'SB3 SAC', n)], 'rate')}")


def report_failures(results: dict):
    failures = [(key, v) for key, values in results.items() for v in values
                if isinstance(v, str)]
    if failures:
        print("\nfailed runs:")
        for (table, row, n), message in failures:
            print(f"- {table}, {row}, num_envs {n}: {message}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", required=True, metavar="PYTHON",
                        help="the python of a venv with jax, rejax, gymnax (and optionally "
                             "stable-baselines3, gymnasium)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num_envs", type=int, nargs="*", default=[5, 32, 64, 256],
                        help="throughput rows (none: no throughput table)")
    parser.add_argument("--solve_envs", type=int, nargs="+", default=[32, 5],
                        help="time-to-solve rows")
    parser.add_argument("--iterations", type=int, default=48,
                        help="throughput: iterations of num_envs x 64 env steps per run")
    parser.add_argument("--sac_steps", type=int, default=12800,
                        help="SAC: env steps per run (a multiple of 64)")
    parser.add_argument("--skip-solve", dest="skip_solve", action="store_true")
    parser.add_argument("--skip-sac", dest="skip_sac", action="store_true")
    args = parser.parse_args(argv)
    if args.iterations < 2:
        parser.error("--iterations must be at least 2 (the first is left out)")

    print(machine())
    versions, has_sb3 = peer_versions(args.peers)
    print(f"peers ({args.peers}): {versions}")
    if not args.skip_sac and not has_sb3:
        print(f"SB3 SAC: skipped, stable-baselines3 or gymnasium is not importable there; "
              f"install them with: {PEERS_VENV}")
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    results = measure(plan(args, has_sb3), args.rounds)
    print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")

    if args.num_envs:
        report_throughput(results, args.num_envs)
    if not args.skip_solve:
        report_solve(results, args.solve_envs)
    if not args.skip_sac:
        report_sac(results, has_sb3)
    report_failures(results)
    print("\nwhere the settings differ:")
    skipped = ("PPO time to solve" if args.skip_solve else None, "SAC" if args.skip_sac else None,
               "PPO:" if not args.num_envs and args.skip_solve else None)
    for note in NOTES:
        if not note.startswith(tuple(s for s in skipped if s)):
            print(f"- {note}")


if __name__ == "__main__":
    main()
