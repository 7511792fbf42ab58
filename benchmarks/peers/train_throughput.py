"""End-to-end training throughput: gpusim and WarpDrive side by side, and the learner's limit.

    python -m benchmarks.peers.train_throughput   # every row this machine can run
    python -m benchmarks.peers.train_throughput --num_envs 1000 4000 --json rows.json

One run, one device, the same env config (tag_continuous, 10 taggers + 100
runners) and the same training config (A2C, [256, 256] ReLU MLPs per policy,
rollout 100) for both systems. Rows:
- gpusim and WarpDrive at each `--num_envs` (default 1000 and 4000 on a GPU,
  16 and 64 on a CPU);
- gpusim's default PPO recipe (`python -m gpusim.train --env tag_continuous`);
- gpusim auto-scaled (`--auto_scale`, objective throughput) from that recipe;
- the learner limit: the same MLP shapes timed alone on the same device (a
  rollout forward and an A2C update per agent-step), as env-steps/s, and each
  gpusim row's share of it; on a GPU also with both replayed as CUDA graphs
  (the share is of the faster);
- `--variant KEY=VALUE,...`: per size, another gpusim A2C row with those config
  settings (`trainer.out_of_play=weigh`, `trainer.max_minibatch_rows=262144`).
Each row trains one warm-up iteration, then times `--iterations` more, and
prints env-steps/s end to end with its time split. `--profile` adds, for each
gpusim row, one more iteration under torch.profiler: per phase (rollout,
update) host launch calls and GPU kernels per env step (per update), and the
top kernels by GPU time (on a CPU: operator calls and the top operators);
see `profile_iteration`.

WarpDrive runs only where it is installed and a CUDA GPU works; install it
for the benchmark only (never as a project dependency):
    pip install --no-deps rl-warp-drive==2.7.1 gym==0.26.2
"""
from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import sys
import time
from dataclasses import replace

# before torch loads: the profiler's library prints stage lines at every level below 6
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
import gpusim  # before torch: gpusim sets OpenMP's wait policy, which torch reads once
import torch
from torch import profiler
from torch.autograd import DeviceType

from gpusim.backends import cuda_works
from gpusim.envs import env_class
from gpusim.scale.device import DeviceContext
from gpusim.training.speed.acceleration import resolve_precision
from gpusim.training.speed.descent import Adam
from gpusim.training.autoscale.auto_scale import auto_scale
from gpusim.training.autoscale.trials import measure_training
from gpusim.training.run_config import load_run_config
from gpusim.training.models import ActorCritic
from gpusim.training.speed.graphs import StepGraph
from gpusim.training.loop import Trainer

from benchmarks.common import machine

ENV = "tag_continuous"
# WarpDrive's game exactly: its observation (the recipe's own-frame option off)
ENV_CONFIG = {"num_taggers": 10, "num_runners": 100, "observe_in_own_frame": False}
HIDDEN = (256, 256)


def a2c_config(num_envs: int, rollout_len: int, backend: str, iterations: int,
               graphs: str = "auto", sets: list | None = None):
    """The side-by-side training config, as gpusim's run config (`sets`: KEY=VALUE more),
    as long as the run measured (warm-up, timed, profiled), so that `trainer.compile: auto`
    decides for that run and not for the recipe's."""
    return load_run_config(ENV, env_class(ENV), sets=sets, overrides={
        "trainer.total_steps": (iterations + 2) * num_envs * rollout_len,
        "trainer.backend": backend, "trainer.algorithm": "a2c", "trainer.update_epochs": 1,
        "trainer.cuda_graphs": graphs,
        "trainer.num_minibatches": 1, "trainer.num_envs": num_envs,
        "trainer.rollout_len": rollout_len, "trainer.gamma": 0.98,
        "policy.hidden_sizes": list(HIDDEN), "policy.activation": "relu",
        **{f"env.{k}": v for k, v in ENV_CONFIG.items()}})


def gpusim_row(name: str, config, context, iterations: int, profile: bool = False) -> dict:
    trainer = Trainer(config, env_class(ENV), context)
    measured = measure_training(trainer, iterations)
    t = config.trainer
    row = {"system": "gpusim", "config": name, "num_envs": t.num_envs,
           "rollout_len": t.rollout_len, "env_steps_per_s": measured["env_steps_per_s"],
           "split": measured["time_share"]}
    if profile:  # after the timed iterations, so it never slows them
        row["profile"] = profile_iteration(trainer)
    return row


# ---- WarpDrive -----------------------------------------------------------------------
def warpdrive_unavailable() -> str | None:
    ok, why = cuda_works()
    if not ok:
        return f"needs a CUDA GPU ({why})"
    try:
        import warp_drive  # noqa: F401
    except ImportError:
        return "not installed (pip install --no-deps rl-warp-drive==2.7.1 gym==0.26.2)"
    return None


def warpdrive_row(num_envs: int, rollout_len: int, iterations: int) -> dict:
    """WarpDrive 2.7.1's own trainer (TrainerA2C) on the same env and training config."""
    import types
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:  # imported at module level by parts WarpDrive's numba path never uses
        for name in ("pycuda", "pycuda.driver", "pycuda.compiler", "pycuda.tools"):
            sys.modules.setdefault(name, types.ModuleType(name))
    import tempfile
    from example_envs.tag_continuous.tag_continuous import TagContinuous
    from warp_drive.env_wrapper import EnvWrapper
    from warp_drive.training.trainers.trainer_a2c import TrainerA2C
    from warp_drive.training.trainers.trainer_base import PerfStats

    env_config = {**warpdrive_env_config(TagContinuous), "seed": 0}
    policy = {"to_train": True, "algorithm": "A2C", "vf_loss_coeff": 0.5,
              "entropy_coeff": 0.01, "clip_grad_norm": True, "max_grad_norm": 0.5,
              "normalize_advantage": False, "normalize_return": False, "gamma": 0.98,
              "lr": 3e-4, "model": {"type": "fully_connected", "fc_dims": list(HIDDEN),
                                    "model_ckpt_filepath": ""}}
    batch = num_envs * rollout_len
    total_iterations = iterations + 1
    config = {
        "name": ENV, "env": env_config,
        "trainer": {"num_envs": num_envs, "train_batch_size": batch, "seed": 0,  # an int:
                    # its default seed, np.int32(time), is refused by random.seed on 3.11+
                    "num_episodes": -(-total_iterations * batch // env_config["episode_length"])},
        "policy": {"tagger": dict(policy), "runner": dict(policy)},
        "saving": {"metrics_log_freq": 10**9, "model_params_save_freq": 10**9,
                   "basedir": tempfile.mkdtemp(prefix="warpdrive-"), "name": ENV,
                   "tag": "benchmark"},
    }
    wrapper = EnvWrapper(TagContinuous(**env_config), num_envs=num_envs, env_backend="numba")
    trainer = TrainerA2C(env_wrapper=wrapper, config=config, verbose=False,
                         policy_tag_to_agent_id_map={"tagger": list(wrapper.env.taggers),
                                                     "runner": list(wrapper.env.runners)})
    trainer.cuda_envs.reset_all_envs()
    seconds = 0.0
    for iteration in range(total_iterations):
        if iteration == 1:  # after the warm-up
            trainer.perf_stats = PerfStats()
        torch.cuda.synchronize()
        start = time.perf_counter()
        trainer._generate_rollout_batch()
        trainer._update_model_params(iteration)
        torch.cuda.synchronize()
        if iteration >= 1:
            seconds += time.perf_counter() - start
    stats = trainer.perf_stats
    parts = {"forward": stats.policy_eval_time, "sampling": stats.action_sample_time,
             "env": stats.env_step_time, "update": stats.training_time}
    trainer.graceful_close()
    return {"system": "warpdrive", "config": "a2c", "num_envs": num_envs,
            "rollout_len": rollout_len, "env_steps_per_s": round(iterations * batch / seconds, 1),
            "split": {k: round(v / seconds, 3) for k, v in parts.items()}}


def warpdrive_env_config(env_cls) -> dict:
    """gpusim's tag_continuous config as the keyword arguments `env_cls` (WarpDrive's
    TagContinuous) takes: the keys both share (the same names). A key WarpDrive lacks is
    left out only at gpusim's default (e.g. continuous_actions off), where both envs agree."""
    import dataclasses
    config_class = env_class(ENV).config_class
    values = dataclasses.asdict(config_class.load(**ENV_CONFIG))
    defaults = dataclasses.asdict(config_class.load())
    accepted = inspect.signature(env_cls).parameters
    differs = [k for k in values if k not in accepted and values[k] != defaults[k]]
    if differs:
        raise SystemExit(f"error: WarpDrive's {env_cls.__name__} takes no "
                         f"{', '.join(differs)}, which this benchmark sets")
    return {k: v for k, v in values.items() if k in accepted}


# ---- the learner's limit ----------------------------------------------------------------
def learner_limit(device: torch.device, precision: str, rows: int, repeats: int = 5,
                  graphs: bool = False) -> dict:
    """Env-steps/s the learner alone allows: per agent-step one rollout forward and one
    A2C update row (forward, backward, Adam) of the same MLP shapes; `graphs`: each of
    the two replayed as a CUDA graph (Adam capturable, as gpusim's graphed update)."""
    env = env_class(ENV)(num_envs=1, backend="cpu", config=env_class(ENV).config_class.load(
        **ENV_CONFIG))
    model = ActorCritic(env.obs_dim, env.action_nvec, HIDDEN, "relu").to(device)
    adam = Adam(list(model.parameters()), 3e-4, eps=1e-5, max_grad_norm=0.5,
                device_lr=graphs)
    autocast = resolve_precision(precision, device).autocast
    obs = torch.randn((rows, env.obs_dim), device=device)
    actions = torch.stack([torch.randint(0, n, (rows,), device=device)
                           for n in env.action_nvec], -1).to(torch.int32)

    def forward():
        with torch.no_grad(), autocast():
            model.log_probs(obs), model.value(obs)

    def update():
        with autocast():
            log_prob, entropy, value = model(obs, actions)
        loss = -log_prob.mean() - 0.01 * entropy.mean() + 0.5 * (value ** 2).mean()
        adam.zero_grad()
        loss.backward()
        adam.step()  # clipped

    steps = {"forward": forward, "update": update}
    if graphs:
        for name, fn in steps.items():
            steps[name] = StepGraph(fn, f"the learner limit's {name}", True)
            steps[name]()  # eagerly (Adam's state), then captured
    per_row = {name: timed(fn, device, repeats) / rows for name, fn in steps.items()}
    seconds_per_env_step = env.num_agents * (per_row["forward"] + per_row["update"])
    return {"system": "learner limit",
            "config": f"a2c {list(HIDDEN)}, {rows:,} rows{', CUDA graphs' if graphs else ''}",
            "num_envs": None, "rollout_len": None,
            "env_steps_per_s": round(1 / seconds_per_env_step, 1),
            "split": {k: round(v / sum(per_row.values()), 3) for k, v in per_row.items()}}


def timed(fn, device, repeats: int) -> float:
    fn()  # warm-up
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


# ---- --profile: where an iteration's launches and device time go, per phase ----------------
# `profile_iteration(trainer)` runs one rollout and one update under `torch.profiler` (CUDA
# activity where the env runs on a GPU, else the CPU's), each phase inside `record_function`
# and ending with a device synchronisation, so everything a phase launched finishes inside
# its own range. Per phase:
# - host launch calls: the runtime and driver calls that start device work
#   (`cudaLaunchKernel`, `cuLaunchKernel`, `cudaGraphLaunch`, ...); a CUDA graph replay is
#   one such call however many kernels it holds;
# - device kernels: the kernels that ran on the GPU, each attributed to the phase of the
#   host call that launched it (by correlation id), else to the phase its own start falls in;
# - on the CPU, where nothing is launched, the torch operators called at the phase's top
#   level stand in for launches, and the phase's time outside any operator (the env's numba
#   kernels, Python) is one row of its own.
# The rollout's counts are per env step (divided by `rollout_len`), the update's per update.
PHASES = ("rollout", "update")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch",
                "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel")
NOT_KERNELS = ("gpu_memcpy", "gpu_memset", "gpu_user_annotation")  # device activity types
OUTSIDE_OPS = "(outside torch operators: env kernels, Python)"


def profile_iteration(trainer, top: int = 5) -> list:
    """One profiled rollout and update of `trainer` (warmed up first): a dict per phase."""
    cuda = trainer.env.device.type == "cuda"
    activities = [profiler.ProfilerActivity.CPU] + (
        [profiler.ProfilerActivity.CUDA] if cuda else [])
    lr = trainer.config.trainer.lr
    runs = {"rollout": lambda: trainer.algorithm.collect(trainer.env_steps),
            "update": lambda: trainer.algorithm.update(lr)}
    # one profiling cycle, so nothing to clear; without acc_events torch (2.11) warns that
    # it clears events when the process prepared a profile before
    taken = inspect.signature(profiler.profile).parameters
    keep = {"acc_events": True} if "acc_events" in taken else {}
    trainer.env.backend.synchronize()
    with profiler.profile(activities=activities, **keep) as prof:
        for phase in PHASES:
            trainer.context.use_threads(phase)  # as Trainer.iterate does
            with profiler.record_function(phase):
                runs[phase]()
                trainer.env.backend.synchronize()
    per = {"rollout": trainer.config.trainer.rollout_len, "update": 1}
    return summarise(list(prof.events()), cuda, per, top)


def summarise(events: list, cuda: bool, per: dict, top: int) -> list:
    """Per phase: launches, kernels and the top kernels (operators on the CPU)."""
    ranges = {e.name: (e.time_range.start, e.time_range.end) for e in events
              if e.name in PHASES and e.device_type == DeviceType.CPU and e.is_user_annotation}

    def phase_at(t: float):
        return next((p for p, (start, end) in ranges.items() if start <= t <= end), None)
    rows = []
    for phase in PHASES:
        if phase not in ranges:
            continue
        steps = per[phase]
        row = {"phase": phase, "per": "env step" if phase == "rollout" else "update",
               "steps": steps, "launches_are": "CUDA launch calls" if cuda
               else "torch operator calls"}
        if cuda:
            launches, kernels = _cuda_counts(events, phase_at)
            row["host_launches"] = len(launches.get(phase, []))
            found = kernels.get(phase, [])
            row["device_kernels"] = len(found)
            row["device_ms"] = round(sum(_us(k) for k in found) / 1000, 3)
            row["top"] = _top([(k.name, _us(k)) for k in found], top)
        else:
            ops, outside_us = _cpu_ops(events, phase)
            row["host_launches"] = len(ops)  # operator calls: the CPU's launches
            row["device_kernels"] = None
            timed = [(e.name, e.self_cpu_time_total) for e in _descendants(events, phase)]
            timed.append((OUTSIDE_OPS, outside_us))
            row["device_ms"] = round(sum(t for _, t in timed) / 1000, 3)
            row["top"] = _top(timed, top)
        row["host_launches_per"] = round(row["host_launches"] / steps, 2)
        row["device_kernels_per"] = None if row["device_kernels"] is None else \
            round(row["device_kernels"] / steps, 2)
        rows.append(row)
    return rows


def _us(event) -> float:
    return event.time_range.end - event.time_range.start


def _cuda_counts(events, phase_at):
    """({phase: host launch calls}, {phase: device kernels})."""
    launches, kernels = collections.defaultdict(list), collections.defaultdict(list)
    launched_at = {}  # correlation id -> host time of the call that launched it
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith(LAUNCH_CALLS):
            launched_at[e.id] = e.time_range.start
            phase = phase_at(e.time_range.start)
            if phase is not None:
                launches[phase].append(e)
    for e in events:
        if e.device_type != DeviceType.CUDA or e.is_user_annotation \
                or getattr(e, "activity_type", None) in NOT_KERNELS \
                or e.name.startswith(("Memcpy", "Memset")):
            continue
        phase = phase_at(launched_at.get(e.id, e.time_range.start))
        if phase is not None:
            kernels[phase].append(e)
    return launches, kernels


def _descendants(events, phase):
    """The CPU operators inside `phase`'s own range (nested ones too)."""
    root = _phase_event(events, phase)
    found, stack = [], list(root.cpu_children)
    while stack:
        e = stack.pop()
        if not e.is_user_annotation:
            found.append(e)
        stack.extend(e.cpu_children)
    return found


def _cpu_ops(events, phase):
    """(the operators called at the phase's top level, the phase's time outside operators,
    in us). Annotations inside the phase (a compiled region, say) are looked through."""
    root = _phase_event(events, phase)
    ops, stack = [], list(root.cpu_children)
    while stack:
        e = stack.pop()
        if e.is_user_annotation:
            stack.extend(e.cpu_children)
        else:
            ops.append(e)
    return ops, root.self_cpu_time_total


def _phase_event(events, phase):
    return next(e for e in events if e.name == phase and e.is_user_annotation
                and e.device_type == DeviceType.CPU)


def _top(timed: list, top: int) -> list:
    """The `top` names by total time: name, calls, ms and share of the phase's total."""
    totals, calls = collections.defaultdict(float), collections.Counter()
    for name, us in timed:
        totals[name] += us
        calls[name] += 1
    whole = sum(totals.values()) or 1.0
    best = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return [{"name": name, "calls": calls[name], "ms": round(us / 1000, 3),
             "share": round(us / whole, 3)} for name, us in best]


def print_profile(label: str, rows: list, cuda: bool):
    """The table: a line per phase, then its top kernels (operators on the CPU)."""
    what = ("host launch calls", "GPU kernels", "GPU ms", "top kernels by GPU time") if cuda \
        else ("operator calls", "", "CPU ms", "top operators by self CPU time")
    print(f"profile of {label}:")
    print(f"  {'phase':<8} {'per':<9} {what[0]:>18} {what[1]:>12} {what[2]:>10}")
    for row in rows:
        kernels = "" if row["device_kernels_per"] is None else f"{row['device_kernels_per']:,.2f}"
        print(f"  {row['phase']:<8} {row['per']:<9} {row['host_launches_per']:>18,.2f} "
              f"{kernels:>12} {row['device_ms']:>10,.3f}")
    if cuda and not any(row["device_kernels"] for row in rows):
        print("  the profiler recorded no GPU kernel (is CUPTI, in torch's CUDA build, "
              "usable here?)")
    for row in rows:
        print(f"  {row['phase']} {what[3]}:")
        for item in row["top"]:
            name = item["name"] if len(item["name"]) <= 70 else item["name"][:67] + "..."
            print(f"    {item['share']:6.1%} {item['ms']:>10,.3f} ms {item['calls']:>7,}x  {name}")
    print(flush=True)


# ---- the table ---------------------------------------------------------------------------
def show(row: dict, limit: float | None, gpu: bool):
    """A gpusim row, then its profile where it has one."""
    print_row(row, limit)
    if "profile" in row:
        print_profile(f"{row['config']} at {row['num_envs']} x {row['rollout_len']}",
                      row["profile"], gpu)


def print_row(row: dict, limit: float | None):
    split = ", ".join(f"{k} {v:.0%}" for k, v in row["split"].items())
    same_shapes = row["system"] == "gpusim" and row["config"].split(",")[0] == "a2c" \
        and "policy." not in row["config"]  # the limit's model
    share = f"{row['env_steps_per_s'] / limit:6.1%}" if limit and same_shapes else "      "
    envs = "" if row["num_envs"] is None else f"{row['num_envs']:>6} x {row['rollout_len']:<4}"
    print(f"{row['system']:<14} {row['config']:<28} {envs:<13} "
          f"{row['env_steps_per_s']:>14,.0f}  {share}  {split}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_envs", type=int, nargs="+")
    parser.add_argument("--rollout_len", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=3, help="timed, after one warm-up")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--limit_rows", type=int, help="rows per learner-limit batch")
    parser.add_argument("--auto_scale_time_limit", type=float, default=600.0)
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["warpdrive", "recipe", "auto_scale", "limit"])
    parser.add_argument("--profile", action="store_true",
                        help="per gpusim row, launches per env step and the top kernels, "
                             "per phase (one more iteration, under torch.profiler)")
    parser.add_argument("--eager_too", action="store_true",
                        help="on a GPU, also each size with trainer.cuda_graphs off")
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE,...",
                        help="also, per size, a gpusim A2C row with these config settings "
                             "(e.g. trainer.out_of_play=weigh); may be given again")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)

    context = DeviceContext()
    context.bind(args.backend, quiet=True)
    device = context.backend.device
    gpu = device.type == "cuda"
    sizes = args.num_envs or ([1000, 4000] if gpu else [16, 64])
    print(f"machine: {machine()}")
    print(f"device: {device} (backend {context.backend.name}); env {ENV} {ENV_CONFIG}; "
          f"A2C {list(HIDDEN)} ReLU, rollout {args.rollout_len}; {args.iterations} timed "
          "iterations per row after one warm-up")
    print(f"{'system':<14} {'config':<28} {'envs x steps':<13} {'env steps/s':>14}  "
          f"{'limit':>6}  time split")
    rows = []
    limit = None
    if "limit" not in args.skip:
        for graphs in (False, True) if gpu else (False,):
            rows.append(learner_limit(device, "auto", args.limit_rows
                                      or (1 << 20 if gpu else 16384), graphs=graphs))
            print_row(rows[-1], None)
        limit = max(r["env_steps_per_s"] for r in rows)  # the best the MLPs reach
    why_no_warpdrive = warpdrive_unavailable()
    for num_envs in sizes:
        rows.append(gpusim_row("a2c", a2c_config(num_envs, args.rollout_len, args.backend,
                                                  args.iterations),
                               context, args.iterations, args.profile))
        show(rows[-1], limit, gpu)
        for variant in args.variant:
            rows.append(gpusim_row(f"a2c, {variant}", a2c_config(
                num_envs, args.rollout_len, args.backend, args.iterations,
                sets=variant.split(",")), context,
                args.iterations))
            show(rows[-1], limit, gpu)
        if args.eager_too and gpu:
            rows.append(gpusim_row("a2c, no CUDA graphs", a2c_config(
                num_envs, args.rollout_len, args.backend, args.iterations, "off"), context,
                args.iterations))
            show(rows[-1], limit, gpu)
        if "warpdrive" not in args.skip and why_no_warpdrive is None:
            rows.append(warpdrive_row(num_envs, args.rollout_len, args.iterations))
            print_row(rows[-1], limit)
    if why_no_warpdrive and "warpdrive" not in args.skip:
        print(f"warpdrive: {why_no_warpdrive}")
    recipe = load_run_config(ENV, env_class(ENV), overrides={"trainer.backend": args.backend})
    if "recipe" not in args.skip:
        rows.append(gpusim_row("ppo recipe", recipe, context, args.iterations, args.profile))
        show(rows[-1], limit, gpu)
    if "auto_scale" not in args.skip:
        scaled = replace(recipe, scale=replace(recipe.scale, objective="throughput",
                                               time_limit_s=args.auto_scale_time_limit))
        print("auto-scale search (its own report follows):", flush=True)
        scaled = auto_scale(scaled, env_class(ENV), context, log=lambda line: print("  " + line))
        rows.append(gpusim_row("ppo recipe, auto-scaled", scaled, context, args.iterations,
                               args.profile))
        show(rows[-1], limit, gpu)
    for row in rows:
        if row["system"] == "warpdrive":
            mine = next(r for r in rows if r["system"] == "gpusim"
                        and r["num_envs"] == row["num_envs"] and r["config"] == "a2c")
            print(f"gpusim / warpdrive at {row['num_envs']} replicas: "
                  f"{mine['env_steps_per_s'] / row['env_steps_per_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"system": r["system"], "config": r["config"], "num_envs": r["num_envs"],
                        "rollout_len": r["rollout_len"],
                        "env_steps_per_s": r["env_steps_per_s"], "device": str(device),
                        "time_split": r["split"],
                        **({"profile": r["profile"]} if "profile" in r else {})}
                       for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
