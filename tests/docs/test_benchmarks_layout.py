"""benchmarks/: scripts in folders by kind, run as modules (`python -m benchmarks.KIND.NAME`),
no `sys.path` edits, and benchmarks/README.md listing every script and only scripts that
exist. Helpers (`common.py`) lie in benchmarks/ itself, scripts one folder down."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
README = BENCHMARKS / "README.md"


def scripts() -> set:
    """Every script, as its path under benchmarks/ (`peers/vs_jax.py`)."""
    return {p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.glob("*/*.py")
            if p.name != "__init__.py"}


def listed() -> set:
    """The scripts README.md lists: a table row's `NAME.py` under a `benchmarks/KIND/` heading."""
    found, folder = set(), None
    for line in README.read_text().splitlines():
        heading = re.match(r"#+ .*`benchmarks/(\w+)/`", line)
        if heading:
            folder = heading.group(1)
        row = re.match(r"\| `(\w+\.py)` \|", line)
        if row:
            assert folder, f"{row.group(1)} listed before any benchmarks/KIND/ heading"
            found.add(f"{folder}/{row.group(1)}")
    return found


def test_no_benchmark_edits_sys_path():
    offenders = [p.relative_to(ROOT).as_posix() for p in BENCHMARKS.rglob("*.py")
                 if "sys.path" in p.read_text()]
    assert not offenders, offenders


def test_every_folder_is_a_package():
    folders = [BENCHMARKS, *(p for p in BENCHMARKS.iterdir()
                             if p.is_dir() and p.name != "__pycache__")]
    assert all((folder / "__init__.py").is_file() for folder in folders), folders
    assert not list(BENCHMARKS.glob("*/*/*.py")), "scripts lie one folder down, no deeper"


def test_the_readme_lists_every_script_and_only_scripts_that_exist():
    assert scripts() - listed() == set(), "scripts README.md does not list"
    assert listed() - scripts() == set(), "README.md lists scripts that do not exist"


def test_the_readme_commands_are_module_runs_of_listed_scripts():
    text = README.read_text()
    commands = set(re.findall(r"python -m benchmarks\.([a-z_]+)\.([a-z_]+)", text))
    assert {f"{kind}/{name}.py" for kind, name in commands} == scripts()
    assert "python benchmarks/" not in text
