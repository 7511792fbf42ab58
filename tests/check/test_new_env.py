"""`python -m gpusim.new_env NAME`: the package it writes checks clean, passes its own tests
and trains to its recipe's target, in each of its shapes; bad input is one line."""
import subprocess
import sys

import numba
import pytest
import torch

from gpusim import new_env, train
from gpusim.check import check_env
from gpusim.envs import env_class

SHAPES = {"one agent, discrete": [], "many agents, discrete": ["--agents", "4"],
          "one agent, box": ["--actions", "box"],
          "many agents, box": ["--agents", "3", "--actions", "box"]}


@pytest.fixture
def written(tmp_path, monkeypatch, request, capsys):
    """The package `game` written in tmp_path with the shape's options, importable; and
    what the command printed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert new_env.main(["game", *SHAPES[request.param]]) == 0
    yield tmp_path / "game", capsys.readouterr().out
    for name in [m for m in sys.modules if m == "game" or m.startswith("game.")]:
        del sys.modules[name]


@pytest.mark.parametrize("written", list(SHAPES), indirect=True)
def test_the_env_written_checks_clean_and_trains_to_its_target(written, capsys):
    package, printed = written
    assert len((package / "env.py").read_text().splitlines()) <= 150
    assert "python -m gpusim.train --env game.env:Game" in printed
    cls = env_class("game.env:Game")
    from game.reference import check_env_reference
    env = cls(num_envs=4, backend="cpu", seed=0)
    result = check_env(env, check_env_reference(env.config), verbose=False)
    assert result.ok and not [c for c in result if c.status == "SKIP" and c.name == "reference"]
    threads = torch.get_num_threads(), numba.get_num_threads()
    try:
        assert train.main(["--env", "game.env:Game", "--quiet", "--results_dir", "runs"]) == 0
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    done = capsys.readouterr().out.strip().splitlines()[-1]
    assert done.startswith("done (target reached)"), done


@pytest.mark.parametrize("written", ["many agents, box"], indirect=True)
def test_the_env_written_passes_its_own_tests(written):
    package, _ = written
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(package)], capture_output=True, text=True, cwd=package.parent)
    assert out.returncode == 0, out.stdout[-2000:]
    assert "2 passed" in out.stdout


@pytest.mark.parametrize("argv, message", [
    (["my-game"], "'my-game' is not a Python identifier"),
    (["class"], "'class' is not a Python identifier"),
    (["math"], "a Python module named 'math' exists already"),
    (["game", "--agents", "0"], "--agents must be at least 1"),
    (["game", "--actions", "joystick"], "invalid choice: 'joystick'"),
    (["game", "--dir", "nowhere"], "--dir nowhere is not a folder"),
])
def test_bad_input_is_one_line_and_writes_nothing(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) if argv[-1] == "joystick" else _nothing() as raised:
        code = new_env.main(argv)
    code = raised.value.code if argv[-1] == "joystick" else code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not any(tmp_path.iterdir())


def test_an_existing_folder_is_never_overwritten(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "game").mkdir()
    (tmp_path / "game" / "mine.txt").write_text("kept")
    assert new_env.main(["game"]) == 2
    assert "exists already" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "game").iterdir()] == ["mine.txt"]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
