"""`python -m gpusim.new_env NAME [--agents N] [--actions discrete|box]`: write a small env
package that trains as written, to start your own from.

NAME/ holds `env.py` (its config dataclass, its phases, its Env class), `config.yaml`
(its training recipe), `reference.py` (its rules in NumPy, which check_env compares
with the env) and `test_NAME.py`. The env: each agent moves on a plane to a target of
its own; `--agents` sets how many per replica, `--actions` whether they choose one of
five moves or give two floats. The command prints what to run next.
"""
from __future__ import annotations

import importlib.util
import keyword
import sys
from pathlib import Path
from string import Template

from gpusim.arguments import ArgumentParser
from gpusim.errors import GpusimError

TEMPLATES = Path(__file__).parent / "templates" / "new_env"
ACTIONS = {  # what differs between the two kinds of action, in env.py, reference.py, the test
    "discrete": dict(
        imports="",
        actions="self.action_nvec = (5,)  # one choice of 5 per agent",
        step_of='''@numba.jit(nopython=True)
def step_of(env, agent, s, p):
    """The agent's move for its action: stay, right, left, up or down."""
    a = s.actions[env, agent, 0]
    dx = p.speed if a == 1 else -p.speed if a == 2 else 0.0
    dy = p.speed if a == 3 else -p.speed if a == 4 else 0.0
    return dx, dy''',
        move='''    a, speed = actions[..., 0], f32(config.speed)  # stay, right, left, up or down
    dx = np.where(a == 1, speed, np.where(a == 2, -speed, 0)).astype(f32)
    dy = np.where(a == 3, speed, np.where(a == 4, -speed, 0)).astype(f32)''',
        toward_target="torch.ones((1, agents, 1), dtype=torch.int32)  # 1: right"),
    "box": dict(
        imports="\nfrom gpusim.spaces import Box",
        actions="self.action_box = Box(low=(-1.0, -1.0), high=(1.0, 1.0))  # 2 floats each",
        step_of='''@numba.jit(nopython=True)
def step_of(env, agent, s, p):
    """The agent's move for its action: two floats in [-1, 1], times the speed."""
    return (p.speed * s.continuous_actions[env, agent, 0],
            p.speed * s.continuous_actions[env, agent, 1])''',
        move='''    moved = np.clip(actions, -1, 1) * f32(config.speed)  # (the env clips to its Box)
    dx, dy = moved[..., 0], moved[..., 1]''',
        toward_target="torch.tensor([[[1.0, 0.0]]]).repeat(1, agents, 1)  # right"),
}
FILES = {"__init__.py": "__init__.py.tmpl", "env.py": "env.py.tmpl",
         "config.yaml": "config.yaml.tmpl", "reference.py": "reference.py.tmpl",
         "test_{name}.py": "test.py.tmpl"}


def class_name(name: str) -> str:
    """my_game -> MyGame."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Env"


def check_name(name: str, folder: Path):
    """One line for a NAME that cannot be a new package here."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise GpusimError(f"'{name}' is not a Python identifier: the env is a package, "
                          "imported by its name (use letters, digits and _, e.g. my_game)")
    if importlib.util.find_spec(name) is not None:
        raise GpusimError(f"a Python module named '{name}' exists already: the new package "
                          "would shadow it, or be shadowed; choose another name")
    if (folder / name).exists():
        raise GpusimError(f"{folder / name} exists already: choose another name or folder "
                          "(nothing is overwritten)")


def write(name: str, folder: Path, agents: int, actions: str) -> Path:
    """The env package `folder/name`, written from the templates."""
    check_name(name, folder)
    values = {"name": name, "Name": class_name(name), "agents": agents, **ACTIONS[actions]}
    package = folder / name
    package.mkdir(parents=True)
    for target, source in FILES.items():
        text = Template((TEMPLATES / source).read_text()).substitute(values)
        (package / target.format(name=name)).write_text(text)
    return package


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.new_env", description=__doc__.split("\n")[0])
    parser.add_argument("name", help="the env's name: a Python identifier, e.g. my_game")
    parser.add_argument("--agents", type=int, default=1, help="agents per replica (default 1)")
    parser.add_argument("--actions", choices=tuple(ACTIONS), default="discrete",
                        help="one of five moves (discrete, the default) or two floats (box)")
    parser.add_argument("--dir", default=".", help="the folder to write it in (default: here)")
    args = parser.parse_args(argv)
    try:
        if args.agents < 1:
            raise GpusimError(f"--agents must be at least 1, got {args.agents}")
        folder = Path(args.dir)
        if not folder.is_dir():
            raise GpusimError(f"--dir {folder} is not a folder")
        package = write(args.name, folder, args.agents, args.actions)
    except (GpusimError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = f"{args.name}.env:{class_name(args.name)}"
    steps = [(f"python -m gpusim.check_env {env}", "its checks"),
             (f"python -m gpusim.render {env} --out random.gif", "watch random play"),
             (f"python -m gpusim.train --env {env}", "train it to its recipe's target"),
             (f"python -m pytest {args.name}", "its tests")]
    width = max(len(command) for command, _ in steps)
    print(f"wrote {package}/: env.py, config.yaml, reference.py, test_{args.name}.py\n"
          f"next, from {folder.resolve() if args.dir != '.' else 'here'}:")
    for command, what in steps:
        print(f"  {command.ljust(width)}  # {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
