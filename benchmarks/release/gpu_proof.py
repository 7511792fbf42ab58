"""One command that proves the GPU path, writing a Markdown table and JSON.

    python -m benchmarks.release.gpu_proof --out proof/              # on a GPU: about 8 minutes on an H100
    python -m benchmarks.release.gpu_proof --only mission cartpole   # the steps whose names contain these
    python -m benchmarks.release.gpu_proof --dry-run                 # anywhere: every step exists and parses

Steps, each in its own process under its own timeout (a hang or a crash is
its row, not the end of the proof; a training step that runs past its time
reports the last throughput it logged), each row with its wall time and the
peak GPU memory torch allocated in it; proof.md and proof.json are rewritten
after every step, so a run cut short keeps what it measured:
- the `gpu`-marked tests (CUDA graphs captured and matching the eager steps among them);
- benchmarks/peers/train_throughput.py at 1,000 and 4,000 replicas (A2C [256, 256], rollout 100):
  gpusim with CUDA graphs vs WarpDrive 2.7.1 where it is installed, and the learner limit;
  `--profile`: launches per env step; beside the defaults, rows out of play weighed 0 (the
  update one graph) and 262,144-row chunks;
- the mission's command, `--env tag_continuous --auto_scale`, whole: search, training and
  evaluation; and the recipe at a fixed sweep of replicas (1k to 16k), to hold the pick against;
- cartpole's recipe on the GPU and on 2 CPU cores;
- A2C at 16,000 replicas x rollout 100: it trains, or stops with one error line;
- (with --only) env throughput of every env, tag_continuous with 1,024 agents per replica,
  PPO and SAC with bf16 and fp32, and populations (`--only population cartpole`): 64
  cartpole seeds in one process beside one, 16 simple_spread MAPPO seeds beside one; and a
  league's training throughput beside plain A2C at 1,000 replicas (`--only league`).
`--dry-run` checks, without a GPU, that every step's script, env and backend
exists and that its arguments parse (training commands resolve their whole
config; scripts are asked for --help and must know every flag given;
pytest collects the gpu tests; the env steps run tiny on the simulator).
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml

from benchmarks.common import ROOT, machine

GPU_TEST_FILES = ("tests/gpu/test_gpu.py", "tests/gpu/test_cuda_c_gpu.py")
ENV_REPLICAS = (1000, 16000)
GPU_BACKENDS = ("numba", "cuda_c")
TAG_1024 = dict(num_taggers=24, num_runners=1000)
VARIANTS = ["--variant", "trainer.out_of_play=weigh",
            "--variant", "trainer.max_minibatch_rows=262144"]


@dataclass
class Step:
    name: str
    kind: str  # pytest | script (args: a benchmark's module, then its flags) | train | sweep
    #            | env_throughput | tag_1024
    args: list = field(default_factory=list)
    timeout_s: int = 60
    cores: int | None = None  # pin to this many CPU cores (the 2-core comparison)
    default: bool = True  # in a run without --only


TRAIN_THROUGHPUT = "benchmarks.peers.train_throughput"


def train(*args, steps: int | None = None) -> list:
    return ["--quiet", *args, *([] if steps is None else ["--total_steps", str(steps)])]


STEPS = [
    Step("gpu tests, CUDA graphs", "pytest", ["-q", "-x", "-m", "gpu", "tests/gpu/test_gpu.py",
                                             "-k", "graph"], 90),
    # 5 timed iterations of rollout 100: one whole 500-step episode of every replica (they
    # run in step), so the rows out of play, which the update leaves out, are a cycle's;
    # beside the default: rows out of play weighed 0 (one update graph), and larger chunks
    Step("train throughput vs WarpDrive, 1,000", "script",
         [TRAIN_THROUGHPUT, "--num_envs", "1000", "--iterations", "5", "--profile",
          "--eager_too", "--skip", "recipe", "auto_scale", *VARIANTS], 180),
    Step("train throughput, 4,000", "script",
         [TRAIN_THROUGHPUT, "--num_envs", "4000", "--iterations", "5",
          "--skip", "warpdrive", "recipe", "auto_scale", "limit", *VARIANTS], 120),
    Step("mission: tag_continuous --auto_scale", "train",
         ["--env", "tag_continuous", "--auto_scale"], 200),
    Step("tag_continuous recipe, fixed sweep", "sweep", [], 60),
    Step("cartpole, GPU", "train", train("--env", "cartpole", "--backend", "numba"), 45),
    Step("cartpole, 2 CPU cores", "train", train("--env", "cartpole", "--backend", "cpu"), 45,
         cores=2),
    Step("A2C 16,000 x 100", "script",
         [TRAIN_THROUGHPUT, "--num_envs", "16000", "--iterations", "1",
          "--skip", "warpdrive", "recipe", "auto_scale", "limit"], 60),
    # a league (--only league): its rollout graph with snapshot opponents, against plain A2C
    Step("league throughput, 1,000", "script",
         [TRAIN_THROUGHPUT, "--num_envs", "1000", "--iterations", "5",
          "--skip", "warpdrive", "recipe", "auto_scale", "limit",
          "--variant", "trainer.league=true"], 120, default=False),
    Step("gpu tests, all", "pytest", ["-q", "-m", "gpu", *GPU_TEST_FILES], 180, default=False),
    Step("env throughput", "env_throughput", [], 90, default=False),
    Step("tag_continuous 1,024 agents", "tag_1024", [], 40, default=False),
    *(Step(f"PPO tag_continuous {p}", "train",
           train("--env", "tag_continuous", "--set", f"trainer.precision={p}", steps=200_000), 45,
           default=False) for p in ("bf16", "fp32")),
    *(Step(f"SAC pendulum {p}", "train",
           train("--env", "pendulum", "--algorithm", "sac", "--set", f"trainer.precision={p}",
                 steps=20_000), 45, default=False) for p in ("bf16", "fp32")),
    # populations (--only population): 64 cartpole seeds against "cartpole, GPU" (one), and
    # 16 simple_spread MAPPO seeds against one, the same budget per member
    Step("population: cartpole x64, GPU", "train",
         train("--env", "cartpole", "--backend", "numba", "--set", "trainer.population=64"),
         120, default=False),
    *(Step(f"population: simple_spread MAPPO x{n}, GPU", "train",
           train("--env", "simple_spread", "--backend", "numba", "--set", "policy.critic=central",
                 "--set", f"trainer.population={n}", steps=320_000), 120 if n > 1 else 60,
           default=False) for n in (16, 1)),
]
SWEEP = (1000, 4000, 16000)
SWEEP_SECONDS = 2.0


# ---- what one step does, in its own process ---------------------------------------------------
def env_rows(name: str, backend: str, replicas: int, seconds: float, **config) -> dict:
    """Env-steps/s of env `name` stepping zero actions (auto-reset on)."""
    import gpusim
    env = gpusim.make(name, replicas, backend=backend, **config)
    env.reset()
    actions = {policy: torch.zeros((replicas, spec.num_agents, spec.action_width),
                                   dtype=torch.float32 if spec.continuous else torch.int32,
                                   device=env.device)
               for policy, spec in env.policy_specs.items()}
    env.step(actions)
    env.backend.synchronize()
    steps, start = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - start < seconds:
        env.step(actions)
        steps += 1
        if steps % 50 == 0:
            env.backend.synchronize()
    env.backend.synchronize()
    return dict(env=name, backend=backend, replicas=replicas, agents=env.num_agents,
                env_steps_per_s=steps * replicas / (time.perf_counter() - start))


def has_cuda_c(name: str) -> bool:
    from gpusim.envs import env_class
    cls = env_class(name)
    return cls.cuda_c_step is not None and cls.cuda_c_reset is not None


def run_env_throughput(dry: bool) -> list:
    from gpusim.envs import env_names
    if dry:  # every env's code path, tiny, on the simulator
        return [env_rows(name, "cudasim", 1, 0.0) for name in env_names()]
    return [env_rows(name, backend, replicas, 1.0) for name in env_names()
            for backend in GPU_BACKENDS if backend == "numba" or has_cuda_c(name)
            for replicas in ENV_REPLICAS]


def run_tag_1024(dry: bool) -> list:
    if dry:
        return [env_rows("tag_continuous", "cudasim", 1, 0.0, num_taggers=1, num_runners=3)]
    return [env_rows("tag_continuous", backend, 64, 1.0, **TAG_1024) for backend in GPU_BACKENDS]


def run_script(args: list, dry: bool) -> list:
    """`python -m MODULE ARGS --json FILE` (args: MODULE, then ARGS) in this process: its rows."""
    module = args[0]
    if dry:
        help_text = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                                   capture_output=True, text=True, check=True).stdout
        unknown = [a for a in args[1:] if a.startswith("--") and a not in help_text]
        if unknown:
            raise SystemExit(f"{module} does not take {', '.join(unknown)}")
        return []
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        sys.argv = [module, *args[1:], "--json", out.name]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            if exc.code:
                raise
        return json.loads(Path(out.name).read_text())


def run_train(args: list, dry: bool) -> list:
    """`python -m gpusim.train ARGS` into the step's run folder: its last metrics, what
    auto-scale picked and why, and the evaluation's pairings."""
    from gpusim.training import train_cli as cli
    runs = Path(os.environ.get("GPU_PROOF_RUNS") or tempfile.mkdtemp(prefix="gpu-proof-"))
    argv = [*args, "--results_dir", str(runs)]
    if dry:
        cli.resolve_config(cli.parse_args(argv))
        return []
    start = time.perf_counter()
    code = cli.main(argv)
    if code:
        raise SystemExit(f"gpusim.train exited {code}")
    rows = [dict(last_metrics(runs), command_s=round(time.perf_counter() - start, 1))]
    for run_dir in runs.iterdir():
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        report = config.get("auto_scale_report")
        if report:
            rows.append({k: report.get(k) for k in (
                "search_s", "num_envs", "rollout_len", "num_minibatches", "total_steps",
                "baseline_env_steps_per_s", "trial_env_steps_per_s", "speedup_over_config",
                "final_env_steps_per_s", "compiles", "stopped_because")})
            rows.append({"trials": [(t["value"], t["seconds"], t["peak_bytes"],
                                     t["info"].get("env_steps_per_s"))
                                    for key in ("baseline", "num_envs", "max_minibatch_rows")
                                    for t in report["trials"].get(key, [])]})
        if (run_dir / "eval.json").is_file():
            rows.append({"eval": json.loads((run_dir / "eval.json").read_text())["pairings"]})
    return rows


def last_metrics(runs: Path) -> dict:
    """The last metrics line any run under `runs` logged (what a step cut short reached)."""
    metrics = sorted(runs.rglob("metrics.jsonl"))
    lines = metrics[-1].read_text().splitlines() if metrics else []
    last = json.loads(lines[-1]) if lines else {}
    return {key: value for key, value in last.items()
            if key in ("iteration", "env_steps", "time_s", "env_steps_per_s")
            or key.startswith("episode_return/") or key.startswith("time_share/")}


def run_sweep(dry: bool) -> list:
    """The tag_continuous recipe at fixed replica counts, as auto-scale's trials measure them
    (resized by the replica rule, training.replicas), each for SWEEP_SECONDS."""
    from dataclasses import replace
    from gpusim.envs import env_class
    from gpusim.scale.device import DeviceContext
    from gpusim.training.autoscale.trials import measure_training
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    from gpusim.training.replicas import follow
    cls = env_class("tag_continuous")
    backend = "cudasim" if dry else "auto"
    config = load_run_config("tag_continuous", cls, overrides={"trainer.backend": backend})
    if dry:
        return []
    context = DeviceContext()
    context.bind(backend, quiet=True)
    rows = []
    for num_envs in SWEEP:
        sized = follow(config, num_envs).config
        sized = replace(sized, trainer=replace(sized.trainer, compile="off"))
        try:
            measured = measure_training(Trainer(sized, cls, context), seconds=SWEEP_SECONDS)
        except Exception as exc:  # noqa: BLE001 - a size that does not fit is a row
            if not context.backend.is_resource_error(exc):
                raise
            measured = {"error": str(exc)[:120]}
        rows.append(dict(num_envs=num_envs, num_minibatches=sized.algo.num_minibatches,
                         **measured))
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    return rows


def run_pytest(args: list, dry: bool) -> list:
    import pytest
    code = pytest.main(["--co", *args] if dry else args)
    if code not in (0, 5 if dry else 0):
        raise SystemExit(f"pytest exited {code}")
    return []


RUNNERS = {"pytest": run_pytest, "script": run_script, "train": run_train,
           "sweep": lambda args, dry: run_sweep(dry),
           "env_throughput": lambda args, dry: run_env_throughput(dry),
           "tag_1024": lambda args, dry: run_tag_1024(dry)}


def run_step(step: Step, dry: bool) -> dict:
    """Run one step here; its rows, wall time and peak GPU memory."""
    if step.cores and not dry and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:step.cores])
    os.chdir(ROOT)
    start = time.perf_counter()
    rows = RUNNERS[step.kind](step.args, dry)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return dict(rows=rows, wall_s=time.perf_counter() - start, peak_gpu_bytes=peak)


# ---- the proof: every step in its own process ----------------------------------------------------
def launch(step: Step, dry: bool, logs: Path) -> dict:
    index = STEPS.index(step)
    result = logs / f"step{index}.json"
    runs = logs / f"step{index}-runs"
    command = [sys.executable, "-m", __spec__.name, "--step", str(index),
               "--result", str(result)] + (["--dry-run"] if dry else [])
    env = dict(os.environ, GPU_PROOF_RUNS=str(runs), PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    with open(logs / f"step{index}.log", "w") as log:
        try:
            run = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                 timeout=step.timeout_s, cwd=ROOT, env=env)
            status = "ok" if run.returncode == 0 else f"failed (exit {run.returncode})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {step.timeout_s} s"
    outcome = json.loads(result.read_text()) if result.is_file() else {}
    if not outcome and runs.is_dir():  # cut short: what its training had reached
        outcome = {"rows": [dict(last_metrics(runs), reached="before the timeout")],
                   "wall_s": time.perf_counter() - start}
    return dict(step=step.name, status=status, **outcome, log=str(logs / f"step{index}.log"))


def markdown(results: list, dry: bool) -> str:
    lines = [f"machine: {machine()}", "", "| step | status | wall s | peak GPU memory | result |",
             "|---|---|---|---|---|"]
    for r in results:
        peak = r.get("peak_gpu_bytes")
        memory = f"{peak / 2**30:.2f} GiB" if peak else "-"
        wall = f"{r['wall_s']:.1f}" if "wall_s" in r else "-"
        summary = "; ".join(", ".join(f"{k}={v:,.0f}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in row.items()) for row in r.get("rows", [])[:8])
        lines.append(f"| {r['step']} | {r['status']} | {wall} | {memory} | {summary or '-'} |")
    if dry:
        lines.append("\n(dry run: arguments parsed, env code paths run tiny on the simulator)")
    return "\n".join(lines)


def write_proof(out: Path, results: list, chosen: list, dry: bool) -> str:
    """proof.md and proof.json of the steps run so far; the table."""
    table = markdown(results, dry)
    (out / "proof.md").write_text(table + "\n")
    (out / "proof.json").write_text(json.dumps(
        dict(machine=machine(), dry_run=dry, steps=[asdict(s) for s in chosen],
             results=results), indent=1))
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="check every step exists and parses its arguments (no GPU needed)")
    parser.add_argument("--out", default="gpu_proof", help="directory for proof.md, proof.json "
                                                            "and each step's log")
    parser.add_argument("--only", nargs="+", metavar="WORD",
                        help="run the steps whose names contain one of these words (any step, "
                             "also those a plain run leaves out)")
    parser.add_argument("--step", type=int, help=argparse.SUPPRESS)  # run one step (internal)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step is not None:
        Path(args.result).write_text(json.dumps(run_step(STEPS[args.step], args.dry_run)))
        return 0
    if not args.dry_run and not torch.cuda.is_available():
        print("error: gpu_proof needs a CUDA GPU (torch sees none); use --dry-run to check the "
              "steps here", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    chosen = [step for step in STEPS if (any(word in step.name for word in args.only)
                                         if args.only else step.default or args.dry_run)]
    for step in chosen:
        results.append(launch(step, args.dry_run, out))
        print(f"{step.name}: {results[-1]['status']}", flush=True)
        table = write_proof(out, results, chosen, args.dry_run)  # after each step: a run cut
    print(table)                                                # short keeps what it measured
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
