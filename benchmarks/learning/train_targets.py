"""Training targets, measured: cartpole and pendulum time-to-solve (with SB3 side by side)
and tag learning.

    python -m benchmarks.learning.train_targets cartpole --seeds 0 1 2
    python -m benchmarks.learning.train_targets cartpole --seeds 0 1 2 3 4 --compile off on --no_sb3
    python -m benchmarks.learning.train_targets pendulum --seeds 0 1 2
    python -m benchmarks.learning.train_targets tag                 # train with the default config, then evaluate
    python -m benchmarks.learning.train_targets tag --run RUN_DIR   # evaluate a finished run

cartpole: each run is a fresh process (`python -m gpusim.train --env cartpole
--backend cpu`), which stops once the mean return over the last 100 finished
episodes reaches 475; the wall time includes start-up and compilation.
Stable-Baselines3's PPO with the rl-zoo CartPole-v1 hyperparameters runs the
same way in its own process when it is installed. `--compile off on` runs
gpusim once per `trainer.compile` mode and seed, interleaved (the compiled
learner must solve in no more env steps than the eager one, within noise);
the first compiled run of a machine also pays for compiling, later ones load
the cached code.

pendulum: the same for gpusim's PPO recipe (envs/pendulum/config.yaml), SAC
(sac.yaml) and TD3 (td3.yaml), all stopping at a mean return of -200 over the
last 100 episodes, next to Stable-Baselines3's SAC (rl-zoo's Pendulum-v1
setting: learning rate 1e-3, the rest SB3's defaults) on gymnasium's own
Pendulum-v1 with the same stopping rule, in its own process.

tag: the taggers' tags per episode (= taggers' total return / tag reward,
exact while the tagger step penalty is 0) of the trained policies against a
uniform-random policy for both teams, on the run's own env config; plus the
run's throughput and time split.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import machine

# Stable-Baselines3 in its own process: argv is seed, target, step budget; the model is
# built by one of the MODELS lines, and the run stops once the mean return over the last
# 100 finished episodes reaches the target (gpusim's rule).
SB3_SCRIPT = r"""
import sys, time, numpy as np
start = time.perf_counter()
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.callbacks import BaseCallback
seed, target, budget = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])

class StopAtTarget(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns = []
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(info["episode"]["r"])
        return not self.solved()
    def solved(self):
        return len(self.returns) >= 100 and np.mean(self.returns[-100:]) >= target

linear = lambda v: (lambda progress: progress * v)
MODEL
callback = StopAtTarget()
model.learn(total_timesteps=budget, callback=callback)
print(f"RESULT {callback.solved()} {model.num_timesteps} {time.perf_counter() - start:.2f}")
"""

MODELS = {  # rl-zoo's settings for these envs
    "cartpole": 'env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)\n'
                'model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, '
                'gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=linear(0.001), '
                'clip_range=linear(0.2), seed=seed, device="cpu", verbose=0)',
    "pendulum": 'env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)\n'
                'model = SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, device="cpu", '
                'verbose=0)',
}

TARGETS = {"cartpole": 475, "pendulum": -200}


def gpusim_run(env, seed, *extra):
    """One `python -m gpusim.train` process on the CPU: (solved, env steps, wall s, split,
    last iteration's env steps/s)."""
    with tempfile.TemporaryDirectory() as results:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpusim.train", "--env", env, "--backend",
                        "cpu", "--seed", str(seed), "--results_dir", results, "--quiet", *extra],
                       check=True, capture_output=True)
        wall = time.perf_counter() - start
        (run_dir,) = Path(results).iterdir()
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    solved = last["episodes"] >= 100 and (last["episode_return/agent"] or -1e9) >= TARGETS[env]
    return solved, last["env_steps"], wall, last["time_share/env"], last["time_share/forward"], \
        last["time_share/update"], last["env_steps_per_s"]


def sb3_run(env, seed, budget):
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return None
    start = time.perf_counter()
    script = SB3_SCRIPT.replace("MODEL", MODELS[env])
    out = subprocess.run([sys.executable, "-c", script, str(seed), str(TARGETS[env]),
                          str(budget)], check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    _, solved, steps, _ = next(line for line in out.splitlines() if line.startswith("RESULT")).split()
    return solved == "True", int(steps), wall


def print_gpusim(label, seed, result):
    solved, steps, wall, env_share, fwd_share, upd_share, rate = result
    print(f"{label:14} {seed:>4} {str(solved):>6} {steps:>10,} {wall:>7.1f}   "
          f"env {env_share:.0%} / forward {fwd_share:.0%} / update {upd_share:.0%}, "
          f"{rate:,.0f} env steps/s (last iteration)", flush=True)


def print_sb3(label, seed, result):
    if result is None:
        print(f"{label:14} {seed:>4}   stable-baselines3 not installed", flush=True)
    else:
        print(f"{label:14} {seed:>4} {str(result[0]):>6} {result[1]:>10,} {result[2]:>7.1f}",
              flush=True)


def compile_label(mode):
    return "" if mode == "auto" else f" ({mode})"


def run_cartpole(seeds, compile_modes, sb3=True):
    print(f"{'impl':14} {'seed':>4} {'solved':>6} {'env steps':>10} {'wall s':>7}   split")
    for seed in seeds:
        for mode in compile_modes:
            print_gpusim(f"gpusim PPO{compile_label(mode)}", seed,
                         gpusim_run("cartpole", seed, "--set", f"trainer.compile={mode}"))
        if sb3:
            print_sb3("SB3 PPO", seed, sb3_run("cartpole", seed, 100_000))


def run_pendulum(seeds, algorithms, compile_modes, sb3=True):
    print(f"{'impl':14} {'seed':>4} {'solved':>6} {'env steps':>10} {'wall s':>7}   split")
    for seed in seeds:
        for algorithm in algorithms:
            for mode in compile_modes:
                print_gpusim(f"gpusim {algorithm.upper()}{compile_label(mode)}", seed,
                             gpusim_run("pendulum", seed, "--algorithm", algorithm, "--set",
                                        f"trainer.compile={mode}"))
        if sb3:
            print_sb3("SB3 SAC", seed, sb3_run("pendulum", seed, 60_000))


def train_tag(results_dir, extra):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpusim.train", "--env", "tag_continuous",
                    "--results_dir", results_dir, "--quiet", *extra], check=True)
    wall = time.perf_counter() - start
    run_dir = max(Path(results_dir).iterdir(), key=os.path.getmtime)
    return run_dir, wall


def run_tag(run_dir, episodes):
    from gpusim.training.run_config import load_run_dir_config
    from gpusim.training.trained.evaluation import episode_returns, load_policies
    cls, config = load_run_dir_config(run_dir)
    env = cls(num_envs=config.trainer.num_envs, backend=config.trainer.backend, seed=12345,
              config=config.env)
    per_tag = config.env.tag_reward_for_tagger / config.env.num_taggers

    def tags(returns):
        return returns["tagger"] / per_tag

    random_tags = tags(episode_returns(env, None, episodes))
    trained_tags = tags(episode_returns(env, load_policies(run_dir, env), episodes))
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    print(f"run: {Path(run_dir).name}: {last['env_steps']:,} env steps in {last['time_s']:.0f} s "
          f"of training")
    print(f"tags per episode over {episodes} episodes: trained {trained_tags:.2f}, "
          f"uniform random {random_tags:.2f}, ratio {trained_tags / random_tags:.2f}")
    shares = {k: sum(r[f"time_share/{k}"] for r in rows) / len(rows)
              for k in ("env", "forward", "update")}
    rate = last["env_steps"] / last["time_s"]
    print(f"throughput: {rate:,.0f} env steps/s end to end; time split (mean over iterations): "
          f"env {shares['env']:.0%}, policy forward {shares['forward']:.0%}, "
          f"update {shares['update']:.0%}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=["cartpole", "pendulum", "tag"])
    parser.add_argument("--algorithms", nargs="+", default=["ppo", "sac", "td3"],
                        help="pendulum: gpusim's algorithms to time")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--compile", nargs="+", default=["auto"],
                        choices=["auto", "on", "off"],
                        help="cartpole, pendulum: trainer.compile modes, each run per seed")
    parser.add_argument("--no_sb3", action="store_true", help="skip the SB3 rows")
    parser.add_argument("--run", help="tag: evaluate this run directory instead of training")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--results_dir", default="runs")
    parser.add_argument("--set", action="append", default=[], help="tag: passed to the trainer")
    args = parser.parse_args(argv)
    print(machine())
    print(f"torch threads: {torch.get_num_threads()}\n")
    if args.target == "cartpole":
        run_cartpole(args.seeds, args.compile, not args.no_sb3)
        return
    if args.target == "pendulum":
        run_pendulum(args.seeds, args.algorithms, args.compile, not args.no_sb3)
        return
    run_dir = args.run
    if run_dir is None:
        extra = [item for s in args.set for item in ("--set", s)]
        run_dir, wall = train_tag(args.results_dir, extra)
        print(f"training wall time, start-up included: {wall:.0f} s")
    run_tag(run_dir, args.episodes)


if __name__ == "__main__":
    main()
