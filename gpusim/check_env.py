"""`python -m gpusim.check_env ENV [--steps N] [--set KEY=VALUE ...]`: check an env as gpusim
will use it (`gpusim.check.check_env`), one line per check.

ENV is a registered env or `module:Class` (the module importable from here). Where
the env's folder has a `reference.py` with `check_env_reference(config)`, the NumPy
reference is checked too. Exit code 0 when no check fails (a WARN is a path the
rollout never took, said in its line), 1 when one does, 2 on bad input.
"""
from __future__ import annotations

import importlib
import sys

import yaml

from gpusim.arguments import ArgumentParser
from gpusim.errors import GpusimError


def env_config(cls, sets: list):
    """The env's config from its defaults and `--set key=value` (or `env.key=value`)."""
    overrides = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        key = key.strip().removeprefix("env.")
        if not sep or not key:
            raise GpusimError(f"--set expects KEY=VALUE (an env config key), got '{item}'")
        try:
            overrides[key] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise GpusimError(f"--set {key}: cannot parse value '{raw}'") from None
    return cls.config_class.load(**overrides)


def reference_for(cls, config):
    """`check_env_reference(config)` of the reference.py beside the env's module, or None."""
    package = cls.__module__.rpartition(".")[0]
    if not package:  # a lone module: no folder of its own
        return None
    try:
        module = importlib.import_module(f"{package}.reference")
    except ImportError:
        return None
    build = getattr(module, "check_env_reference", None)
    return build(config) if build is not None else None


def main(argv=None) -> int:
    from gpusim.check import check_env
    from gpusim.envs import env_class
    parser = ArgumentParser(prog="python -m gpusim.check_env",
                            description=__doc__.split("\n")[0])
    parser.add_argument("env", help="a registered env, or module:Class")
    parser.add_argument("--steps", type=int, default=None,
                        help="the rollout's length (default 500)")
    parser.add_argument("--num_envs", type=int, default=4, help="replicas (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an env config key (repeatable)")
    args = parser.parse_args(argv)
    if sys.path[0] != "":  # `module:Class` from the current folder, as python -m finds it
        sys.path.insert(0, "")
    try:
        if args.steps is not None and args.steps < 1:
            raise GpusimError(f"--steps must be at least 1, got {args.steps}")
        if args.num_envs < 1:
            raise GpusimError(f"--num_envs must be at least 1, got {args.num_envs}")
        cls = env_class(args.env)
        config = env_config(cls, args.set)
        env = cls(num_envs=args.num_envs, backend="cpu", seed=args.seed, config=config)
        result = check_env(env, reference_for(cls, config), steps=args.steps, seed=args.seed)
    except (GpusimError, TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    failed = len(result.failed)
    print(f"{env.name}: {'clean' if not failed else f'{failed} check(s) failed'}"
          + (f", {len(result.warnings)} warning(s)" if result.warnings else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
