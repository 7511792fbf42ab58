"""The layers import downward only: runtime <- scale <- training, envs on the runtime alone.

Parsed from the source (no imports run), so an upward import anywhere fails
here, including one inside a function.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# source folder -> the name it is installed under (setup.py's package_dir)
ROOTS = {"gpusim": "gpusim", "envs": "gpusim.envs", "training": "gpusim.training",
         "cuda_kernels": "gpusim.cuda_kernels"}
# The public namespace and the `python -m` entry points sit above every layer.
FACADE = {"gpusim", "gpusim.train", "gpusim.plot", "gpusim.evaluate", "gpusim.render",
          "gpusim.doctor", "gpusim.export", "gpusim.league", "gpusim.upgrade",
          "gpusim.check_env", "gpusim.new_env"}
ALLOWED = {
    "runtime": {"runtime"},
    "envs": {"runtime", "envs"},
    "scale": {"runtime", "scale"},
    "training": {"runtime", "envs", "scale", "training"},
    "facade": {"runtime", "envs", "scale", "training", "facade"},
}


def layer(module: str) -> str:
    if module in FACADE:
        return "facade"
    for prefix, name in (("gpusim.envs", "envs"), ("gpusim.training", "training"),
                         ("gpusim.scale", "scale")):
        if module == prefix or module.startswith(prefix + "."):
            return name
    return "runtime"


def source_files():
    for folder, package in ROOTS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            yield path, ".".join([package] + parts), is_package


def is_module(name: str) -> bool:
    """Whether `name` (under gpusim) is a module or package of this repository."""
    for folder, package in sorted(ROOTS.items(), key=lambda kv: -len(kv[1])):
        if name == package or name.startswith(package + "."):
            rest = name[len(package):].lstrip(".").split(".") if name != package else []
            base = ROOT / folder / Path(*rest) if rest else ROOT / folder
            return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
    return False


def imported_modules(path: Path, module: str, is_package: bool):
    """(line, module) for every gpusim module `path` imports."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gpusim":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "gpusim":
                continue
            for alias in node.names:  # `from gpusim import rng` names a module
                name = f"{source}.{alias.name}"
                yield node.lineno, name if is_module(name) else source


def test_source_files_are_found():
    modules = {module for _, module, _ in source_files()}
    assert {"gpusim.env", "gpusim.scale.distributed", "gpusim.training.loop", "gpusim.training.algorithms.ppo",
            "gpusim.envs.tag_continuous.env"} <= modules


@pytest.mark.parametrize("path, module, is_package", list(source_files()),
                         ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else "")
def test_imports_point_down(path, module, is_package):
    own = layer(module)
    upward = [f"line {line}: {target} ({layer(target)})"
              for line, target in imported_modules(path, module, is_package)
              if layer(target) not in ALLOWED[own]]
    assert not upward, f"{module} ({own}) imports upward: {'; '.join(upward)}"
