"""One meaning per module file name: no two modules of gpusim/, training/ and envs/ share a
file name, so a name (`replay_buffer.py`, `kernel_replay.py`) says which module it is.

Allowed, and only these: `__init__.py`, and the files of an env's own folder
(`envs/<env>/config.py`, `env.py`, `reference.py`, `render.py`, ...), which every env
folder repeats by design (docs/architecture.md, "Environments").
"""
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("gpusim", "training", "envs")
ALLOWED_NAMES = {"__init__.py"}


def in_an_env_folder(path: Path) -> bool:
    """A file of `envs/<env>/` (or a folder below it), the per-env files."""
    parts = path.relative_to(ROOT / "envs").parts if (ROOT / "envs") in path.parents else ()
    return len(parts) > 1


def modules() -> list:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
            if "__pycache__" not in p.parts]


def test_no_two_modules_share_a_file_name():
    by_name = defaultdict(list)
    for path in modules():
        if path.name in ALLOWED_NAMES or in_an_env_folder(path):
            continue
        by_name[path.name].append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, shared


def test_the_check_sees_every_package():
    """The walk finds modules in all three folders and leaves out only env folders' files."""
    paths = modules()
    assert {p.relative_to(ROOT).parts[0] for p in paths} == set(FOLDERS)
    assert in_an_env_folder(ROOT / "envs" / "cartpole" / "config.py")
    assert not in_an_env_folder(ROOT / "envs" / "gymnasium_reference.py")
    assert not in_an_env_folder(ROOT / "training" / "run_config.py")
