"""`python -m gpusim.train`: train policies on a gpusim environment.

    python -m gpusim.train --env tag_continuous
    python -m gpusim.train --env cartpole --set trainer.lr=1e-3
    python -m gpusim.train --resume runs/cartpole_20261121-120000_seed0
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpusim.backends import BACKEND_NAMES
from gpusim.errors import GpusimError
from gpusim.registry import env_class

FLAG_KEYS = {"backend": "trainer.backend", "num_envs": "trainer.num_envs",
             "rollout_len": "trainer.rollout_len", "total_steps": "trainer.total_steps",
             "seed": "trainer.seed"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m gpusim.train", description=__doc__.split("\n")[0])
    parser.add_argument("--env", help="registered env name, or module:Class for your own env")
    parser.add_argument("--config", help="YAML with env/trainer/policy sections "
                                         "(default: the env's config.yaml)")
    parser.add_argument("--backend", choices=BACKEND_NAMES)
    parser.add_argument("--num_envs", type=int)
    parser.add_argument("--rollout_len", type=int)
    parser.add_argument("--total_steps", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--results_dir", default="runs", help="where run directories go")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config field, e.g. trainer.lr=3e-4 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def resolve(args):
    """(env class, run config, run dir, checkpoint state or None) from the arguments."""
    from gpusim.training.config import load_run_config, load_run_dir_config

    overrides = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items()
                 if getattr(args, flag) is not None}
    if args.resume:
        from gpusim.training import checkpoint
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").is_file():
            raise GpusimError(f"cannot resume: {run_dir} is not a run directory (no config.yaml)")
        changed = [f"--{f}" for f in ("env", "config") if getattr(args, f)] + \
                  [f"--{f}" for f in FLAG_KEYS if f != "total_steps" and getattr(args, f) is not None]
        if changed or args.set:
            raise GpusimError(f"--resume continues a run as configured; only --total_steps may "
                              f"change (got {', '.join(changed + ['--set'] * bool(args.set))})")
        cls, config = load_run_dir_config(run_dir, overrides)
        state = checkpoint.load_latest(run_dir / "checkpoints")
        return cls, config, run_dir, state
    if not args.env:
        raise GpusimError("--env is required (or --resume RUN_DIR)")
    cls = env_class(args.env)
    config = load_run_config(args.env, cls, path=args.config, overrides=overrides, sets=args.set)
    from gpusim.training.logger import new_run_dir
    return cls, config, new_run_dir(args.results_dir, args.env, config.trainer.seed), None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: continue with --resume RUN_DIR", file=sys.stderr)
        return 130


def run(args) -> int:
    cls, config, run_dir, state = resolve(args)
    from gpusim.training.logger import RunLogger
    from gpusim.training.trainer import Trainer

    config.dump(run_dir / "config.yaml")
    print(f"run directory: {run_dir}", flush=True)
    t = config.trainer
    trainer = Trainer(config, cls)
    print(f"{config.env_name}: {t.num_envs} replicas x {trainer.env.num_agents} agents on "
          f"{trainer.env.backend.name}, {t.algorithm}, {t.num_iterations} iterations of "
          f"{t.steps_per_iteration:,} env steps", flush=True)
    logger = RunLogger(run_dir, t.num_iterations, [g.name for g in trainer.groups],
                       quiet=args.quiet)
    trainer.logger = logger
    if state is not None:
        trainer.load_state_dict(state)
        logger.truncate_metrics(trainer.iteration)
        print(f"resumed at iteration {trainer.iteration}", flush=True)
    try:
        summary = trainer.train()
    finally:
        logger.close()
    returns = ", ".join(f"{name} {value:.3f}" if value is not None else f"{name} n/a"
                        for name, value in summary["episode_return"].items())
    rate = summary["env_steps"] / summary["time_s"] if summary["time_s"] else 0.0
    solved = " (target return reached)" if summary["solved"] else ""
    print(f"done{solved}: {summary['iterations']} iterations, {summary['env_steps']:,} env steps in "
          f"{summary['time_s']:.1f} s ({rate:,.0f} steps/s); mean return over the last "
          f"{min(100, summary['episodes'])} episodes: {returns}; run directory: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
