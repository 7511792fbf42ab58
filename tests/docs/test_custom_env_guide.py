"""The env reference pages stay true: the code of their sections is run, (a) portable phases
(docs/env_phases.md), (b) a raw numba kernel (docs/env_numba.md) and (c) a CUDA C kernel
(docs/env_cuda_c.md), in that order.

Code blocks whose first line is a comment naming a file (`# ring_gather/env.py`,
`// ring_gather/ring_gather.cu`) are written to that file in a temporary
directory put on sys.path; every other python block is executed, in order
(section (c)'s CUDA C kernels run on the CPU, through the host shim). A `text` block right after a python block
is that block's expected output: each of its lines must be printed. Lines of
`bash` blocks that run `python -m gpusim.train` run in-process, shortened.
"""
import contextlib
import io
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = {"a": DOCS / "env_phases.md", "b": DOCS / "env_numba.md", "c": DOCS / "env_cuda_c.md"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
FILE_COMMENT = re.compile(r"^(?:#|//) (ring_gather/[\w.]+)\n")
PACKAGE = "ring_gather"


def section(letter: str) -> str:
    text = PAGES[letter].read_text()
    start = text.index(f"\n## ({letter})")
    end = text.find("\n## (", start + 1)
    return text[start:] if end < 0 else text[start:end]


def blocks(letter: str) -> list:
    """(language, code) of every fenced block of a section, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(section(letter))]


@pytest.fixture(scope="module")
def guide_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("guide")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    written = []
    for letter in "abc":
        for _, code in blocks(letter):
            match = FILE_COMMENT.match(code)
            if match:
                (root / match.group(1)).write_text(code)
                written.append(match.group(1))
    assert sorted(written) == [f"{PACKAGE}/{name}" for name in
                               ("config.py", "config.yaml", "cuda.py", "env.py",
                                "mistakes.py", "pincer_fix.py", "raw.py", "reference.py",
                                "ring_gather.cu")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUSIM_CACHE_DIR", str(root / "cache"))  # compile cache of this test only
        mp.syspath_prepend(str(root))
        mp.chdir(root)
        yield root
    for name in list(sys.modules):
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            del sys.modules[name]


def run_section(letter: str, root: Path) -> dict:
    """Execute a section's blocks; returns counts of what ran."""
    ran = {"python": 0, "checked_output": 0, "train": 0}
    items = blocks(letter)
    for k, (lang, code) in enumerate(items):
        if lang == "python" and not FILE_COMMENT.match(code):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{PAGES[letter].name} ({letter}) block {k}", "exec"),
                     {"__name__": f"guide_{letter}_{k}"})
            ran["python"] += 1
            following = items[k + 1] if k + 1 < len(items) else None
            if following and following[0] == "text":
                printed = out.getvalue().splitlines()
                for line in following[1].splitlines():
                    assert line in printed, f"guide output line not printed: {line!r}\n" \
                                            f"printed:\n{out.getvalue()}"
                ran["checked_output"] += 1
        elif lang == "bash":
            for line in code.splitlines():
                if line.startswith("python -m gpusim.train"):
                    run_training(shlex.split(line)[3:], root)
                    ran["train"] += 1
    return ran


def run_training(args, root: Path):
    from gpusim.train import main

    results = root / "runs"
    short = ["--backend", "cpu", "--num_envs", "8", "--rollout_len", "16",
             "--total_steps", "256", "--results_dir", str(results), "--quiet"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args + short) == 0
    run_dir = max(results.iterdir(), key=lambda p: p.stat().st_mtime)  # this run's
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and metrics[-1]["env_steps"] == 256


@pytest.mark.slow
def test_section_a_runs(guide_dir):
    ran = run_section("a", guide_dir)
    assert ran == {"python": 4, "checked_output": 3, "train": 1}


@pytest.mark.slow
def test_section_b_runs(guide_dir):
    ran = run_section("b", guide_dir)
    assert ran == {"python": 3, "checked_output": 0, "train": 0}


@pytest.mark.slow
def test_section_c_runs(guide_dir):
    """The CUDA C env passes check_env against its NumPy reference and the portable phases."""
    from cuda_host.host_backend import compiler_problem, tsan_problem
    problem = compiler_problem(guide_dir) or tsan_problem(guide_dir)
    if problem:
        pytest.skip(f"the CUDA C kernels run on the CPU through the C++20 host shim, and "
                    f"their race check under ThreadSanitizer: {problem}")
    ran = run_section("c", guide_dir)
    assert ran == {"python": 3, "checked_output": 0, "train": 1}
    assert "GPUSIM_ENV_PARAMS" in (guide_dir / "gpusim_env_args.cuh").read_text()
