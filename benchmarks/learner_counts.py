"""How much deciding PPO's learner does, and how deep a minibatch goes, in numbers.

    python benchmarks/learner_counts.py                 # the work tree against 13fa2d4
    python benchmarks/learner_counts.py --rev HEAD~3    # a commit against 13fa2d4
    python benchmarks/learner_counts.py --baseline REV  # against another baseline

Prints a table: for the revision (default: the work tree) and the baseline, the branch
sites and the lines of training/algorithms/ppo.py. A branch site, by one AST rule: each
`ast.If`, `ast.IfExp` and `ast.While`; each `if` clause of a comprehension; each case
of an `ast.Match`; and each extra operand of an `and`/`or` (an `ast.BoolOp`'s values
less one). Nothing else counts (a `for`, a `try`, a call that decides inside).

Then the minibatch's walk, traced at run time on this checkout's code (the work tree,
whatever `--rev` says): one PPO update of a tiny cartpole run (cpu backend, 8 replicas
x 32 steps) under `sys.setprofile`, Python frames only. At the first call of the loss
function (`losses.ppo_objective`) the stack is read from there up to `PPO.update`: its
depth is the calls between them (`update` at depth 0, the loss at the last), and its
files the distinct gpusim files on that path. The files a minibatch's rows pass through
beside that path (made in training/algorithms/units.py, returned before the loss) are
listed apart.
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PPO_FILE = "training/algorithms/ppo.py"
BASELINE = "13fa2d4"
LOSS = "ppo_objective"


def branch_sites(source: str) -> int:
    """The branch sites of `source`, by the rule in the module's docstring."""
    sites = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            sites += 1
        elif isinstance(node, ast.comprehension):
            sites += len(node.ifs)
        elif isinstance(node, ast.Match):
            sites += len(node.cases)
        elif isinstance(node, ast.BoolOp):
            sites += len(node.values) - 1
    return sites


def source_at(rev: str | None) -> str:
    """ppo.py at git revision `rev` (None: the work tree)."""
    if rev is None:
        return (ROOT / PPO_FILE).read_text()
    return subprocess.run(["git", "show", f"{rev}:{PPO_FILE}"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def minibatch_walk() -> dict:
    """The stack from PPO.update down to the loss at its first call, traced (see the
    module): its frames as (file, function), and the files beside it."""
    sys.path.insert(0, str(ROOT))
    import torch
    from gpusim.envs import env_class
    from gpusim.training.config import load_run_config
    from gpusim.training.loop import Trainer
    torch.manual_seed(0)
    env = env_class("cartpole")
    overrides = {"trainer.backend": "cpu", "trainer.num_envs": 8, "trainer.rollout_len": 32,
                 "trainer.target_return": None, "trainer.compile": "off"}
    trainer = Trainer(load_run_config("cartpole", env, overrides=overrides), env)
    algorithm = trainer.algorithm
    algorithm.collect(0)
    found, beside = {}, set()

    def profile(frame, event, arg):
        if event != "call" or "stack" in found:
            return
        name = frame.f_code.co_name
        if "units.py" in frame.f_code.co_filename:
            beside.add(relative(frame.f_code.co_filename))
        if name != LOSS:
            return
        stack, f = [], frame
        while f is not None:
            stack.append((relative(f.f_code.co_filename), f.f_code.co_name))
            if f.f_code.co_name == "update" and f.f_code.co_filename.endswith(PPO_FILE):
                break
            f = f.f_back
        found["stack"] = stack[::-1]

    sys.setprofile(profile)
    try:
        algorithm.update(algorithm.config.trainer.lr)
    finally:
        sys.setprofile(None)
    stack = found["stack"]
    files = list(dict.fromkeys(f for f, _ in stack))
    return {"stack": stack, "depth": len(stack) - 1, "files": files,
            "beside": sorted(beside - set(files))}


def relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default=None, help="a git revision (default: the work tree)")
    parser.add_argument("--baseline", default=BASELINE, help="the revision compared against")
    parser.add_argument("--no-walk", action="store_true", help="the static counts only")
    args = parser.parse_args(argv)
    rows = [(args.rev or "work tree", source_at(args.rev)),
            (args.baseline, source_at(args.baseline))]
    print(f"{'revision':<12} {'branch sites':>12} {'lines':>6}   ({PPO_FILE})")
    counts = []
    for label, source in rows:
        counts.append(branch_sites(source))
        print(f"{label:<12} {counts[-1]:>12} {len(source.splitlines()):>6}")
    print(f"ratio {counts[0] / counts[1]:.2f} of the baseline's branch sites")
    if args.no_walk:
        return
    walk = minibatch_walk()
    print(f"\nthe minibatch's walk (this checkout, traced): PPO.update to {LOSS}, "
          f"{walk['depth']} calls deep, {len(walk['files'])} files")
    for depth, (path, name) in enumerate(walk["stack"]):
        print(f"  {depth:>2}  {name:<24} {path}")
    print(f"files on the path: {', '.join(walk['files'])}")
    print(f"files beside it (the minibatch's rows made, returned before the loss): "
          f"{', '.join(walk['beside']) or 'none'}")


if __name__ == "__main__":
    main()
