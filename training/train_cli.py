"""`python -m gpusim.train`: train policies on a gpusim environment.

    python -m gpusim.train --env tag_continuous
    python -m gpusim.train --env tag_continuous --auto_scale
    python -m gpusim.train --env tag_continuous --num_gpus 4
    torchrun --nnodes 2 --nproc_per_node 8 ... -m gpusim.train --env tag_continuous
    python -m gpusim.train --resume runs/cartpole_20261121-120000_seed0

Every process runs `worker`: bind to its device, join the others (when there
are several), optionally auto-scale, then train. `--num_gpus N` starts N such
processes here; torchrun starts them itself.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from gpusim.arguments import ArgumentParser
from gpusim.backends import BACKEND_NAMES, check_process_count, set_compile_reporter
from gpusim.config import load_yaml
from gpusim.envs import env_class, env_names
from gpusim.errors import DoesNotFit, GpusimError, describe, exit_code, writing
from gpusim.scale import distributed
from gpusim.scale.device import DeviceContext
from gpusim.scripted import scripted_policies

from . import replicas
from .algorithms import ALGORITHMS
from .autoscale.auto_scale import auto_scale
from .loop import Trainer
from .population import members as population
from .records import checkpoint, migrations
from .records.logger import CompileReport, RunLogger, new_run_dir
from .run_config import config_reference, load_run_config, load_run_dir_config, recipe_path
from .signals import Stopped
from .speed.acceleration import resolve_precision
from .trained import member_runs as members
from .trained.evaluation import evaluate

# scale keys that apply without --auto_scale (multi-process runs wait this long), and
# those that apply with --num_envs (the replica rule's floor)
SCALE_ALWAYS = ("scale.timeout_s", "scale.collective_timeout_s")
SCALE_WITH_NUM_ENVS = ("scale.min_rollout_len",)
FLAG_KEYS = {"algorithm": "trainer.algorithm", "backend": "trainer.backend", "num_envs": "trainer.num_envs",
             "rollout_len": "trainer.rollout_len", "total_steps": "trainer.total_steps",
             "seed": "trainer.seed", "memory_budget": "scale.memory_budget"}


def parse_args(argv=None):
    parser = ArgumentParser(prog="python -m gpusim.train", description=__doc__.split("\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=config_reference())
    parser.add_argument("--env", help=f"a registered env ({', '.join(env_names())}), or "
                                      "module:Class for your own")
    parser.add_argument("--config", help="YAML with env/trainer/policy/scale sections "
                                         "(default: the env's config.yaml)")
    parser.add_argument("--algorithm", choices=tuple(ALGORITHMS),
                        help="trainer.algorithm; the env's recipe for it is ALGORITHM.yaml "
                             "beside its config.yaml, where it has one")
    parser.add_argument("--backend", choices=BACKEND_NAMES, help="trainer.backend")
    parser.add_argument("--num_envs", type=int, help="trainer.num_envs")
    parser.add_argument("--rollout_len", type=int, help="trainer.rollout_len")
    parser.add_argument("--total_steps", type=int, help="trainer.total_steps")
    parser.add_argument("--seed", type=int, help="trainer.seed")
    parser.add_argument("--num_gpus", type=int, default=1, metavar="N",
                        help="processes to start here, one per GPU (with --backend cpu: "
                             "CPU worker processes); under torchrun leave it out")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="with --backend cpu: allow more worker processes than cores")
    parser.add_argument("--auto_scale", action="store_true",
                        help="before training, size num_envs, rollout_len and minibatch chunks "
                             "for the fastest training that fits (scale.objective)")
    parser.add_argument("--memory_budget", metavar="SIZE",
                        help="with --auto_scale: memory per process to fill, e.g. 2GiB")
    parser.add_argument("--results_dir", default="runs", help="where run directories go")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config field, e.g. trainer.lr=3e-4 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def resolve_config(args):
    """(env class, run config) from the arguments; no side effects, so every rank can call it."""
    overrides = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items()
                 if getattr(args, flag) is not None}
    if args.memory_budget is not None and not args.auto_scale:
        raise GpusimError("--memory_budget bounds the --auto_scale search; add --auto_scale")
    if args.auto_scale:
        fixed = [f"--{f}" for f in ("num_envs", "rollout_len") if getattr(args, f) is not None]
        if fixed or args.resume:
            raise GpusimError(f"--auto_scale picks num_envs and rollout_len for a new run; "
                              f"drop {', '.join(fixed) or '--resume'}")
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").is_file():
            raise GpusimError(f"cannot resume: {run_dir} is not a run directory (no config.yaml)")
        changed = [f"--{f}" for f in ("env", "config") if getattr(args, f)] + \
                  [f"--{f}" for f in FLAG_KEYS if f != "total_steps" and getattr(args, f) is not None]
        if changed or args.set:
            raise GpusimError(f"--resume continues a run as configured; only --total_steps may "
                              f"change (got {', '.join(changed + ['--set'] * bool(args.set))})")
        return load_run_dir_config(run_dir, overrides)
    name = args.env or (load_yaml(args.config).get("env_name") if args.config else None)
    if not name:
        raise GpusimError("--env is required (or --resume RUN_DIR, or --config with env_name, "
                          "as a run directory's config.yaml has)")
    cls = env_class(name)
    path = args.config or recipe_path(cls, args.algorithm)
    num_envs = overrides.pop("trainer.num_envs", None)
    if num_envs is not None and "trainer.num_envs" in given_keys(args, flags=False):
        raise GpusimError("--num_envs resizes the recipe (what follows the replicas comes "
                          "with them) and --set trainer.num_envs sets the key alone: give one")
    config = load_run_config(name, cls, path=path, overrides=overrides, sets=args.set)
    if num_envs is not None:  # what follows the replica count comes with them
        config = with_replicas(config, num_envs, given_keys(args))
    applying = SCALE_ALWAYS + (SCALE_WITH_NUM_ENVS if num_envs is not None else ())
    searched = [item.partition("=")[0].strip() for item in args.set
                if item.strip().startswith("scale.") and not item.strip().startswith(applying)]
    if searched and not args.auto_scale:  # it would do nothing in this run
        raise GpusimError(f"config key '{searched[0]}' sets the --auto_scale search"
                          + (" and the --num_envs rule" if searched[0] in SCALE_WITH_NUM_ENVS
                             else "") + "; add --auto_scale (or drop it)")
    return cls, config


def given_keys(args, flags: bool = True) -> frozenset:
    """The dotted config keys the command line set (its flags, unless `flags` is False,
    and --set)."""
    keys = {item.partition("=")[0].strip() for item in args.set}
    if flags:
        keys |= {key for flag, key in FLAG_KEYS.items() if getattr(args, flag) is not None}
    return frozenset(keys)


def with_replicas(config, num_envs: int, given: frozenset):
    """`--num_envs N`: the config at N replicas, with what follows them (training.replicas),
    kept in the run's config.yaml (`replica_rule`; rank 0 prints its line)."""
    followed = replicas.follow(config, num_envs, given)
    if num_envs == config.trainer.num_envs:
        return followed.config
    return replace(followed.config, replica_rule=followed.record())


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        context = DeviceContext.from_environment()
        if context.world_size > 1:  # started by torchrun (or our launcher): one rank
            if args.num_gpus != 1:
                raise GpusimError("under torchrun the number of processes comes from torchrun; "
                                  "drop --num_gpus")
            return worker(args)
        if args.num_gpus == 1:
            return worker(args)
        _, config = resolve_config(args)  # bad input: one error here, not one per process
        check_process_count(config.trainer.backend, args.num_gpus, args.oversubscribe)
        if population.size(config.trainer) > 1:
            raise GpusimError("config key 'trainer.population' with --num_gpus: a population "
                              "trains in one process (drop --num_gpus)")
        distributed.launch(args.num_gpus, worker, args, timeout_s=config.scale.timeout_s,
                           collective_timeout_s=config.scale.collective_timeout_s)
        return 0
    except distributed.RankFailed as exc:
        if exc.exit_code == 130:  # interrupted: rank 0 printed where to resume
            return 130
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # before a run directory existed, or in the launcher
        print("\ninterrupted", file=sys.stderr)
        return 130


def worker(args) -> int:
    """One process of a run (the only one, or one rank of several)."""
    context = DeviceContext.from_environment()
    if context.world_size == 1:
        return train(args, context)
    try:
        code = train(args, context)
    except distributed.RankFailed:
        raise
    except BaseException as exc:
        if distributed.launched_here():  # the launcher reports it
            raise
        print(f"error: rank {context.rank}: {describe(exc)}", file=sys.stderr)
        code = exit_code(exc)  # torchrun: each rank reports for itself
    finally:
        distributed.shutdown()
    if distributed.launched_here():
        return code
    distributed.exit_now(code)  # torchrun: see exit_now


def open_run_dir(args, config, context) -> tuple:
    """(run directory, its RunLogger): a new directory, or the one resumed, locked first (a
    second process must not touch a run in use), with the resolved config written in it
    (a resumed run's of an older format kept in RUN_DIR/format<N>/)."""
    run_dir = Path(args.resume) if args.resume else \
        new_run_dir(args.results_dir, config.env_name, config.trainer.seed)
    logger = RunLogger(run_dir, config.trainer.num_iterations(context.world_size),
                       quiet=args.quiet)
    try:
        if args.resume:  # an older run's config.yaml is rewritten in today's format: kept
            saved = run_dir / "config.yaml"
            fmt = migrations.config_format(load_yaml(saved), saved)
            if fmt < migrations.FORMAT:
                migrations.keep_original(run_dir, fmt, saved)
        with writing(run_dir / "config.yaml"):
            config.dump(run_dir / "config.yaml")
    except BaseException:
        logger.close()
        raise
    print(f"run directory: {run_dir}", flush=True)
    return run_dir, logger


def resume_hint(run_dir: Path | None) -> str:
    """What to do after an interruption, with the run's own path."""
    if run_dir is None:
        return "interrupted before the run directory was made: start again"
    saved = checkpoint.list_checkpoints(run_dir / "checkpoints")
    if not saved:
        return f"interrupted before the first checkpoint: start again (run directory {run_dir})"
    iteration = int(checkpoint.PATTERN.match(saved[-1].name).group(1))
    return (f"interrupted; the checkpoint of iteration {iteration} is saved: continue with "
            f"--resume {run_dir}")


def print_population(rows: dict):
    """Per policy and setting: the mean return over seeds, its interval, the IQM."""
    print("population, per setting: mean return of the last 100 episodes over seeds "
          "[95% bootstrap interval], interquartile mean")
    for name, settings in rows.items():
        for row in settings:
            print(f"  {name:<10} {row['setting']:<28} {row['mean']:10.3f} "
                  f"[{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]  IQM {row['iqm']:.3f}  "
                  f"({row['seeds']} seeds)")


def too_large(config, context, exc) -> DoesNotFit:
    """A run that does not fit its device, as one line naming its sizes and what to lower
    (a population's size first: its members run side by side, each a solo run's size)."""
    t, algo = config.trainer, config.algo
    knob, size = ("max_minibatch_rows", f"minibatch chunks of {algo.max_minibatch_rows:,} rows") \
        if hasattr(algo, "max_minibatch_rows") else \
        ("batch_size", f"batches of {algo.batch_size:,} and a replay of {algo.replay_size:,}")
    count = population.size(t)
    members = f"a population of {count} (trainer.population) x " if count > 1 else ""
    return DoesNotFit(
        f"the run does not fit {context.backend.device} ({describe(exc)[:160]}): "
        f"{members}{t.num_envs:,} replicas x rollout_len {t.rollout_len}, {size}; lower "
        f"{'trainer.population, ' if count > 1 else ''}trainer.num_envs, trainer.rollout_len "
        f"or trainer.{knob} (--set trainer.KEY=VALUE), or size the run with --auto_scale")


def train(args, context) -> int:
    cls, config = resolve_config(args)
    context.bind(config.trainer.backend, quiet=args.quiet,
                 torch_threads=config.trainer.torch_threads)
    distributed.init(context, config.scale.timeout_s, config.scale.collective_timeout_s)
    # before anything is written: bf16 on a CPU that cannot run it stops here, in one line
    resolve_precision(config.trainer.precision, context.device)
    compiling = CompileReport(config.env_name) if context.is_main and not args.quiet else None
    set_compile_reporter(compiling)
    logger = run_dir = None
    if config.replica_rule is not None and context.is_main:
        print(f"gpusim: {config.replica_rule['line']}", flush=True)
    try:
        if args.auto_scale:
            config = auto_scale(config, cls, context, given=given_keys(args))
        state = checkpoint.load_latest(Path(args.resume) / "checkpoints") if args.resume else None
        # Built before the run directory: a config the env or the device refuses (sac on
        # discrete actions, tf32 on a CPU) leaves no empty run directory behind.
        trainer = Trainer(config, cls, context)
        if compiling is not None:
            compiling.finish()
        if context.is_main:
            run_dir, logger = open_run_dir(args, config, context)
            trainer.attach_logger(logger)
            t = config.trainer
            size = population.size(t)
            team = f"a population of {size}, each " if size > 1 else ""
            print(f"{config.env_name}: {team}{context.world_size} x {t.num_envs} replicas x "
                  f"{trainer.env.num_agents} agents on {trainer.env.backend.name}, "
                  f"{t.algorithm}, {trainer.num_iterations} iterations of "
                  f"{trainer.steps_per_iteration:,} env steps", flush=True)
            planned = trainer.num_iterations * trainer.steps_per_iteration
            if planned != t.total_steps:
                print(f"total_steps {t.total_steps:,} is not a whole number of iterations: "
                      f"running {planned:,} env steps", flush=True)
        if state is not None:
            trainer.load_state_dict(state)
            if logger is not None:
                logger.resume_from(trainer.iteration, trainer.env_steps)
                print(f"resumed at iteration {trainer.iteration}", flush=True)
        summary = trainer.train()
    except (Stopped, KeyboardInterrupt):
        if context.is_main:
            print(resume_hint(run_dir), file=sys.stderr, flush=True)
        return 130
    except Exception as exc:  # out of device memory: one line naming the sizes and knobs
        if isinstance(exc, GpusimError) or not context.backend.is_resource_error(exc):
            raise
        raise too_large(config, context, exc) from None
    finally:
        set_compile_reporter(None)
        if logger is not None:
            logger.close()
    if not context.is_main:
        return 0
    rate = summary["env_steps"] / summary["time_s"] if summary["time_s"] else 0.0
    if config.auto_scale_report is not None:
        config.auto_scale_report["final_env_steps_per_s"] = round(rate, 1)
        with writing(run_dir / "config.yaml"):
            config.dump(run_dir / "config.yaml")
    returns = ", ".join(f"{name} {value:.3f}" if value is not None else f"{name} n/a"
                        for name, value in summary["episode_return"].items())
    solved = " (target reached)" if summary["solved"] else ""
    print(f"done{solved}: {summary['iterations']} iterations, {summary['env_steps']:,} env steps in "
          f"{summary['time_s']:.1f} s ({rate:,.0f} steps/s); mean return over the last "
          f"{min(100, summary['episodes'])} episodes: {returns}; run directory: {run_dir}")
    if len(summary.get("population", ())):
        print_population(summary["population"])
    if config.trainer.final_eval_episodes >= 2 and members.is_population(run_dir):
        members.evaluate_members(run_dir, evaluate, num_episodes=config.trainer.final_eval_episodes)
    elif config.trainer.final_eval_episodes >= 2:
        evaluate(run_dir, config.trainer.final_eval_episodes)
        if scripted_policies(cls):  # and against the env's scripted policies: a yardstick
            evaluate(run_dir, config.trainer.final_eval_episodes, opponents="scripted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
