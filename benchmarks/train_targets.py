"""Training targets, measured: cartpole time-to-solve (with SB3 side by side) and tag learning.

    python benchmarks/train_targets.py cartpole --seeds 0 1 2
    python benchmarks/train_targets.py tag                 # train with the default config, then evaluate
    python benchmarks/train_targets.py tag --run RUN_DIR   # evaluate a finished run

cartpole: each run is a fresh process (`python -m gpusim.train --env cartpole
--backend cpu`), which stops once the mean return over the last 100 finished
episodes reaches 475; the wall time includes start-up and compilation.
Stable-Baselines3's PPO with the rl-zoo CartPole-v1 hyperparameters runs the
same way in its own process when it is installed.

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

SB3_SCRIPT = r"""
import sys, time, numpy as np
start = time.perf_counter()
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.callbacks import BaseCallback
seed = int(sys.argv[1])

class StopAt475(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns = []
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(info["episode"]["r"])
        return not (len(self.returns) >= 100 and np.mean(self.returns[-100:]) >= 475)

linear = lambda v: (lambda progress: progress * v)
env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
            n_epochs=20, ent_coef=0.0, learning_rate=linear(0.001), clip_range=linear(0.2),
            seed=seed, device="cpu", verbose=0)
callback = StopAt475()
model.learn(total_timesteps=100_000, callback=callback)
solved = len(callback.returns) >= 100 and np.mean(callback.returns[-100:]) >= 475
print(f"RESULT {solved} {model.num_timesteps} {time.perf_counter() - start:.2f}")
"""


def cartpole_gpusim(seed):
    with tempfile.TemporaryDirectory() as results:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpusim.train", "--env", "cartpole", "--backend",
                        "cpu", "--seed", str(seed), "--results_dir", results, "--quiet"],
                       check=True, capture_output=True)
        wall = time.perf_counter() - start
        (run_dir,) = Path(results).iterdir()
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    solved = last["episodes"] >= 100 and (last["episode_return/agent"] or 0) >= 475
    return solved, last["env_steps"], wall, last["time_share/env"], last["time_share/forward"], \
        last["time_share/update"], last["env_steps_per_s"]


def cartpole_sb3(seed):
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return None
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", SB3_SCRIPT, str(seed)], check=True,
                         capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    _, solved, steps, _ = next(line for line in out.splitlines() if line.startswith("RESULT")).split()
    return solved == "True", int(steps), wall


def run_cartpole(seeds):
    print(f"{'impl':12} {'seed':>4} {'solved':>6} {'env steps':>10} {'wall s':>7}   split")
    for seed in seeds:
        solved, steps, wall, env_share, fwd_share, upd_share, rate = cartpole_gpusim(seed)
        print(f"{'gpusim PPO':12} {seed:>4} {str(solved):>6} {steps:>10,} {wall:>7.1f}   "
              f"env {env_share:.0%} / forward {fwd_share:.0%} / update {upd_share:.0%}, "
              f"{rate:,.0f} env steps/s (last iteration)")
        sys.stdout.flush()
        sb3 = cartpole_sb3(seed)
        if sb3 is None:
            print(f"{'SB3 PPO':12} {seed:>4}   stable-baselines3 not installed")
        else:
            print(f"{'SB3 PPO':12} {seed:>4} {str(sb3[0]):>6} {sb3[1]:>10,} {sb3[2]:>7.1f}")
        sys.stdout.flush()


def train_tag(results_dir, extra):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpusim.train", "--env", "tag_continuous",
                    "--results_dir", results_dir, "--quiet", *extra], check=True)
    wall = time.perf_counter() - start
    run_dir = max(Path(results_dir).iterdir(), key=os.path.getmtime)
    return run_dir, wall


def run_tag(run_dir, episodes):
    from gpusim.training.config import load_run_dir_config
    from gpusim.training.evaluate import episode_returns, load_policies
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
    parser.add_argument("target", choices=["cartpole", "tag"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--run", help="tag: evaluate this run directory instead of training")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--results_dir", default="runs")
    parser.add_argument("--set", action="append", default=[], help="tag: passed to the trainer")
    args = parser.parse_args(argv)
    print(machine())
    print(f"torch threads: {torch.get_num_threads()}\n")
    if args.target == "cartpole":
        run_cartpole(args.seeds)
        return
    run_dir = args.run
    if run_dir is None:
        extra = [item for s in args.set for item in ("--set", s)]
        run_dir, wall = train_tag(args.results_dir, extra)
        print(f"training wall time, start-up included: {wall:.0f} s")
    run_tag(run_dir, args.episodes)


if __name__ == "__main__":
    main()
