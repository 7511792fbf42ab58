"""gpusim's MAPPO and IPPO side by side with BenchMARL's on simple_spread.

    python -m benchmarks.peers.vs_benchmarl --setup-peer .venv-benchmarl   # once: the peer's venv
    python -m benchmarks.peers.vs_benchmarl --peer .venv-benchmarl         # the table
    python -m benchmarks.peers.vs_benchmarl --peer .venv-benchmarl --seeds 0 1 --steps 336000 \\
        --json vs_benchmarl.json

Both sides train on the CPU on the same scenario: mpe2's / PettingZoo's
simple_spread_v3 with 3 agents and 3 landmarks, 25-step episodes, local_ratio
0.5, discrete actions. gpusim runs `python -m gpusim.train` with the env's
recipe (`policy.critic=central` is MAPPO, `local` IPPO; the runs of
`benchmarks/learning/critics.py`); BenchMARL runs its MAPPO / IPPO with its own default
algorithm, model and experiment configs on its `pettingzoo/simple_spread`
task, changed only where the comparison needs it: `max_cycles` 25 (its task
file says 100), discrete actions (its experiment prefers continuous ones), the
frame budget, and no loggers, evaluation or rendering (nothing written, no
network; evaluation would only add to its wall time).

Env steps are counted the same way on both sides: one step of one replica
with all its agents acting. That is gpusim's `env_steps` and BenchMARL's
"frames" (TorchRL's batch elements; the agents are an inner dimension), so no
conversion is needed. The return is the same too: per agent, the sum of its
rewards over an episode, averaged over the agents (gpusim's logged
`episode_return/agent`; BenchMARL's `collection/reward/episode_reward_mean`),
both under the sampled training policy. gpusim averages it over its last 100
finished episodes, BenchMARL over the episodes that ended in its last
collected batch (6,000 frames, 240 episodes).

Wall time is that of the whole process (imports, compilation, env set-up and
training), timed around each subprocess here. Runs are interleaved seed by
seed, so both libraries see the same machine state.

BenchMARL is never a dependency of gpusim: `--setup-peer DIR` makes a
separate virtualenv (torch==2.13.0 first, a CPU wheel, then benchmarl and
PettingZoo < 1.25 with its MPE, which TorchRL's PettingZoo wrapper imports as
`pettingzoo.mpe`, all constrained to that torch), and the BenchMARL side runs
as `--worker benchmarl` in a subprocess of that venv's Python.
"""
from __future__ import annotations

import time

START = time.perf_counter()  # the worker's own clock starts before its imports

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ALGORITHMS = {"MAPPO": "central", "IPPO": "local"}  # name -> gpusim's policy.critic
FRACTIONS = (0.25, 0.5, 1.0)
EPISODE = 25
TASK = dict(N=3, max_cycles=EPISODE, local_ratio=0.5)  # gpusim's simple_spread defaults
PEER_PACKAGES = ["benchmarl", "pettingzoo[mpe]<1.25"]
PEER_TORCH = "torch==2.13.0"


# ---- the BenchMARL side, run in the peer's venv --------------------------------------------
def benchmarl_worker(algorithm: str, seed: int, steps: int):
    """Train BenchMARL's `algorithm` here; JSON lines on stdout: versions, one point per
    collected batch, and the end."""
    from importlib.metadata import version

    from benchmarl.algorithms import IppoConfig, MappoConfig
    from benchmarl.environments import PettingZooTask
    from benchmarl.experiment import Callback, Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    names = ("benchmarl", "torchrl", "tensordict", "torch", "pettingzoo")
    emit({"versions": ", ".join(f"{n} {version(n)}" for n in names)})

    class Curve(Callback):
        """Each collected batch: the frames so far and the batch's mean episode return."""

        def on_batch_collected(self, batch):
            ex = self.experiment
            emit({"env_steps": ex.total_frames, "return": ex.mean_return,
                  "elapsed_s": time.perf_counter() - START})

        def __getstate__(self):  # BenchMARL pickles its callbacks with its config:
            return {}            # no experiment in there

    Curve.__qualname__ = "Curve"  # ... by reference, so the class must be a module global
    globals()["Curve"] = Curve

    task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    defaults = dict(task.config)
    task.config.update(TASK)
    config = ExperimentConfig.get_from_yaml()
    config.max_n_frames = steps
    config.prefer_continuous_actions = False
    config.loggers = []
    config.create_json = False
    config.evaluation = False
    config.render = False
    config.checkpoint_interval = 0
    config.checkpoint_at_end = False
    algo = {"MAPPO": MappoConfig, "IPPO": IppoConfig}[algorithm].get_from_yaml()
    with tempfile.TemporaryDirectory() as folder:
        config.save_folder = folder
        experiment = Experiment(task=task, algorithm_config=algo,
                                model_config=MlpConfig.get_from_yaml(),
                                critic_model_config=MlpConfig.get_from_yaml(),
                                seed=seed, config=config, callbacks=[Curve()])
        emit({"task": dict(task.config), "task_defaults": defaults,
              "frames_per_batch": config.on_policy_collected_frames_per_batch,
              "envs": config.on_policy_n_envs_per_worker, "lr": config.lr,
              "continuous_actions": experiment.continuous_actions})
        experiment.run()
    emit({"done": True, "env_steps": experiment.total_frames,
          "train_s": experiment.total_time, "elapsed_s": time.perf_counter() - START})


def emit(row: dict):
    print(json.dumps(row), flush=True)


# ---- the orchestrator ------------------------------------------------------------------------
def run_benchmarl(python: str, algorithm: str, seed: int, steps: int) -> dict:
    """One BenchMARL run in the peer's venv: the curve, throughput and whole-process wall."""
    # by its path, not as a module: the worker imports nothing of this repository's
    command = [python, __file__, "--worker", "benchmarl", "--algorithm", algorithm,
               "--seed", str(seed), "--steps", str(steps)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not any(r.get("done") for r in rows):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:] or ["no output"]
        raise SystemExit(f"error: BenchMARL {algorithm} seed {seed} exited "
                         f"{done.returncode}: {' | '.join(tail)}")
    end = next(r for r in rows if r.get("done"))
    setup = next(r for r in rows if "task" in r)
    curve = [(r["env_steps"], r["return"]) for r in rows if "return" in r]
    return {"curve": curve, "steps_per_s": end["env_steps"] / end["train_s"], "wall_s": wall,
            "env_steps": end["env_steps"], "versions": rows[0]["versions"], "setup": setup}


def run_gpusim(critic: str, seed: int, steps: int, results: Path) -> dict:
    """One gpusim run (benchmarks/learning/critics.py's), plus the training clock of each point."""
    from benchmarks.learning.critics import train
    from gpusim.training.trained.learning_curves import read_metrics
    run = train("simple_spread", critic, seed, steps, results)
    rows = read_metrics(next((results / f"{critic}_{seed}").glob("*/metrics.jsonl")).parent)
    run["clock"] = {r["env_steps"]: r["time_s"] for r in rows}
    run["train_s"] = rows[-1]["time_s"]
    run["env_steps"] = rows[-1]["env_steps"]
    return run


def reached(run: dict, target: float):
    """(env steps, wall s) at which a gpusim run's logged return first reached `target`,
    and (env steps, wall s) from which it stayed there to the end (Nones where never).

    The wall time counts the whole process up to that point: its start-up (the
    process wall less its training clock) plus the training clock there.
    """
    startup = run["wall_s"] - run["train_s"]
    first = next((steps for steps, ret in run["curve"] if ret >= target), None)
    below = [steps for steps, ret in run["curve"] if ret < target]
    after = [steps for steps, _ in run["curve"] if not below or steps > below[-1]]
    holds = after[0] if after else None
    return tuple(None if s is None else (s, startup + run["clock"][s]) for s in (first, holds))


def gpusim_versions() -> str:
    from importlib.metadata import version
    return ", ".join(f"{n} {version(n)}" for n in ("gpusim", "torch", "numba"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer", help="BenchMARL's virtualenv (see --setup-peer); without it, "
                                       "gpusim alone")
    parser.add_argument("--setup-peer", metavar="DIR", help="make BenchMARL's virtualenv")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                        choices=list(ALGORITHMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=336_000,
                        help="env steps per run (336,000: whole iterations on both sides, "
                             "210 x 1,600 for gpusim, 56 x 6,000 for BenchMARL)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--worker", choices=["benchmarl"], help=argparse.SUPPRESS)
    parser.add_argument("--algorithm", choices=list(ALGORITHMS), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        benchmarl_worker(args.algorithm, args.seed, args.steps)
        return
    if args.setup_peer:
        setup_peer(args.setup_peer)
        return

    from benchmarks.common import machine
    from benchmarks.learning.critics import at
    print(machine())
    print(f"  gpusim: {gpusim_versions()}", flush=True)
    python = str(Path(args.peer) / "bin" / "python") if args.peer else None
    runs = {}  # (library, algorithm) -> [run per seed]
    with tempfile.TemporaryDirectory() as results:
        for seed in args.seeds:
            for name in args.algorithms:
                todo = [("gpusim", lambda: run_gpusim(ALGORITHMS[name], seed, args.steps,
                                                      Path(results)))]
                if python:
                    todo.append(("BenchMARL",
                                 lambda: run_benchmarl(python, name, seed, args.steps)))
                for library, go in todo:
                    run = go()
                    runs.setdefault((library, name), []).append(run)
                    if "versions" in run and len(runs[(library, name)]) == 1:
                        print(f"  BenchMARL: {run['versions']}; task {run['setup']['task']} "
                              f"(task file: {run['setup']['task_defaults']}), continuous "
                              f"actions {run['setup']['continuous_actions']}", flush=True)
                    print(f"{library} {name} seed {seed}: return "
                          f"{run['curve'][-1][1]:.2f} at {run['curve'][-1][0]:,} env steps, "
                          f"{run['steps_per_s']:,.0f} env steps/s, {run['wall_s']:.0f} s",
                          flush=True)

    rows = []
    for (library, name), done in runs.items():
        for seed, run in zip(args.seeds, done):
            row = {"library": library, "algorithm": name, "seed": seed,
                   "final_return": run["curve"][-1][1], "env_steps": run["env_steps"],
                   "wall_s": run["wall_s"], "env_steps_per_s": run["steps_per_s"],
                   "returns_at": {f: at(run["curve"], f * args.steps) for f in FRACTIONS},
                   "curve": run["curve"]}
            peer = runs.get(("BenchMARL", name))
            if library == "gpusim" and peer:
                target = peer[args.seeds.index(seed)]["curve"][-1][1]
                row["benchmarl_final"] = target
                first, holds = reached(run, target)
                row["reach_env_steps"], row["reach_wall_s"] = first or (None, None)
                row["holds_env_steps"], row["holds_wall_s"] = holds or (None, None)
                row["benchmarl_wall_s"] = peer[args.seeds.index(seed)]["wall_s"]
            rows.append(row)
    print_table(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def print_table(rows: list, args):
    head = " | ".join(f"return at {f:.0%}" for f in FRACTIONS)
    print(f"\nsimple_spread (N=3, 25-step episodes, local_ratio 0.5, discrete), "
          f"{args.steps:,} env steps, seeds {args.seeds}; return: per-agent episode return, "
          f"mean over agents")
    print(f"| library | algorithm | seed | {head} | env steps/s | wall s | "
          f"first reaches BenchMARL's final at (env steps) | ... at wall s | wall x less | "
          f"stays there from (env steps) | ... at wall s |")
    print("|---|---|---:|" + "---:|" * (len(FRACTIONS) + 7))
    order = sorted(rows, key=lambda r: (list(ALGORITHMS).index(r["algorithm"]), r["seed"],
                                        r["library"] != "gpusim"))
    for r in order:
        cells = " | ".join(f"{r['returns_at'][f]:.2f}" for f in FRACTIONS)
        steps, wall = r.get("reach_env_steps"), r.get("reach_wall_s")
        if "benchmarl_final" not in r:
            reach = "- | - | - | - | -"
        elif steps is None:
            reach = "not reached | - | - | - | -"
        else:
            reach = f"{steps:,} | {wall:.1f} | {r['benchmarl_wall_s'] / wall:.1f} | "
            held = r["holds_env_steps"]
            reach += (f"{held:,} | {r['holds_wall_s']:.1f}" if held is not None
                      else "not at the end | -")
        print(f"| {r['library']} | {r['algorithm']} | {r['seed']} | {cells} | "
              f"{r['env_steps_per_s']:,.0f} | {r['wall_s']:.0f} | {reach} |")
    print("\nthe issue's criterion: gpusim reaches BenchMARL's final return in no more env "
          "steps and in at least 10x less wall time")
    for r in order:
        if "benchmarl_final" not in r:
            continue
        steps, wall = r["reach_env_steps"], r["reach_wall_s"]
        peer = next(p for p in order if p["library"] == "BenchMARL"
                    and (p["algorithm"], p["seed"]) == (r["algorithm"], r["seed"]))
        if steps is None:
            print(f"  {r['algorithm']} seed {r['seed']}: BenchMARL's final "
                  f"{r['benchmarl_final']:.2f} not reached by gpusim (its final "
                  f"{r['final_return']:.2f}): not met")
            continue
        met = steps <= peer["env_steps"] and r["benchmarl_wall_s"] >= 10 * wall
        print(f"  {r['algorithm']} seed {r['seed']}: BenchMARL's final {r['benchmarl_final']:.2f} "
              f"after {peer['env_steps']:,} env steps and {r['benchmarl_wall_s']:.0f} s; gpusim "
              f"there after {steps:,} env steps ({steps / peer['env_steps']:.0%}) and "
              f"{wall:.1f} s (x{r['benchmarl_wall_s'] / wall:.1f} less; whole runs "
              f"x{r['benchmarl_wall_s'] / r['wall_s']:.1f}): {'met' if met else 'not met'}; "
              + (f"stays at or above it from {r['holds_env_steps']:,} env steps"
                 if r["holds_env_steps"] is not None else
                 f"but not at the end (gpusim's final {r['final_return']:.2f})"))
    if len(args.seeds) > 1:
        print("\nmean over seeds")
        for key in dict.fromkeys((r["library"], r["algorithm"]) for r in order):
            mine = [r for r in order if (r["library"], r["algorithm"]) == key]
            print(f"  {key[0]} {key[1]}: final return "
                  f"{statistics.mean(r['final_return'] for r in mine):.2f}, "
                  f"{statistics.mean(r['env_steps_per_s'] for r in mine):,.0f} env steps/s, "
                  f"{statistics.mean(r['wall_s'] for r in mine):.0f} s wall")


def setup_peer(directory: str):
    venv = Path(directory)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [PEER_TORCH], check=True)  # first: the CPU wheel, not CUDA's
    constraints = venv / "constraints.txt"  # keep that torch: a newer torchvision would
    constraints.write_text(PEER_TORCH + "\n")  # pull a newer torch with its CUDA wheels
    subprocess.run(pip + ["-c", str(constraints)] + PEER_PACKAGES, check=True)
    print(f"BenchMARL installed in {venv}: run with --peer {venv}")


if __name__ == "__main__":
    main()
