"""docs/custom_env.md, the tutorial, done as a newcomer does it: in an empty folder, every
command of its `bash` blocks and every edit of its `replace ... with` blocks, in order
(its other python blocks are excerpts of the env written, checked to stand there).
Each command must succeed and print the lines its `text` block shows (their words up to
the first figure: timings and paths differ from run to run); the run trains to its
target; the first training command is within the page's first 300 lines."""
import contextlib
import io
import re
import runpy
import shlex
import sys
import warnings
from pathlib import Path

import numba
import pytest
import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "custom_env.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
EDIT = re.compile(r"^# ([\w/.]+): replace\n(.*?)^# with\n(.*)", re.S | re.M)


def steps() -> list:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(DOC.read_text())]


def run(command: list, folder: Path) -> tuple:
    """(exit code, what it printed) of `python -m gpusim.TOOL ARGS`, run in this process."""
    assert command[:2] == ["python", "-m"] and command[2].startswith("gpusim."), command
    tool, args = command[2], [a.replace("RUN_DIR", _run_dir(folder)) for a in command[3:]]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", [tool, *args])
        try:  # (runpy: as `python -m` runs it; a module imported before is run anew)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "'gpusim.* found in sys.modules",
                                        RuntimeWarning)
                runpy.run_module(tool, run_name="__main__")
            code = 0
        except SystemExit as exited:
            code = exited.code or 0
    return code, out.getvalue()


def _run_dir(folder: Path) -> str:
    runs = sorted((folder / "runs").glob("*")) if (folder / "runs").is_dir() else []
    return runs[-1].name if runs else "RUN_DIR"


def test_the_tutorial_from_its_first_line(tmp_path, monkeypatch):
    text = DOC.read_text()
    first_train = next(k for k, line in enumerate(text.splitlines(), 1)
                       if "python -m gpusim.train" in line)
    assert first_train <= 300, first_train
    for page in ("env_phases.md", "env_numba.md", "env_cuda_c.md"):
        assert f"]({page}" in text, page
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    threads = torch.get_num_threads(), numba.get_num_threads()
    printed, counts = "", {"commands": 0, "edits": 0, "excerpts": 0}
    try:
        for lang, code in steps():
            if lang == "bash":
                for line in code.strip().splitlines():
                    command = shlex.split(line.split("#")[0])
                    code_, printed = run(command, tmp_path)
                    assert code_ == 0, (line, printed[-2000:])
                    counts["commands"] += 1
            elif lang == "text":
                for expected in code.strip().splitlines():
                    words = re.split(r"\d", expected, maxsplit=1)[0].strip()
                    assert any(line.strip().startswith(words) for line in printed.splitlines()), \
                        (expected, printed[-2000:])
            elif lang == "python" and EDIT.match(code):
                path, old, new = EDIT.match(code).groups()
                source = (tmp_path / path).read_text()
                assert source.count(old) == 1, (path, old)
                (tmp_path / path).write_text(source.replace(old, new))
                counts["edits"] += 1
            elif lang == "python":  # an excerpt of the env written: as it stands there
                assert code.strip() in (tmp_path / "my_game" / "env.py").read_text(), code
                counts["excerpts"] += 1
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
        for name in [m for m in sys.modules if m == "my_game" or m.startswith("my_game.")]:
            del sys.modules[name]
    assert counts == {"commands": 5, "edits": 3, "excerpts": 1}, counts
