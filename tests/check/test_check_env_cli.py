"""`python -m gpusim.check_env ENV`: one line per check, exit 0 clean, 1 with a failure, 2 on
bad input; and `Env.episode_ends`, how an env says its episodes end."""
import runpy
import sys

import pytest

from gpusim.envs.cartpole.env import CartPole


def check(argv, monkeypatch) -> int:
    """The command run in this process (runpy: no module attribute replaces the
    `gpusim.check_env` function)."""
    monkeypatch.setattr(sys, "argv", ["python -m gpusim.check_env", *argv])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("gpusim.check_env", run_name="__main__")
    return exited.value.code


def test_a_clean_env_exits_0_with_a_line_per_check(monkeypatch, capsys):
    assert check(["cartpole", "--steps", "60"], monkeypatch) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("PASS attributes") and out[-1].startswith("cartpole: clean")
    assert any(line.startswith("PASS reference") for line in out)  # its reference.py's
    assert not any(line.startswith("FAIL") for line in out)


class NeverTerminates(CartPole):
    """Cartpole's episodes end by termination too, and it says they do not."""
    episode_ends = ("truncation",)


def test_a_way_of_ending_the_env_does_not_declare_fails(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "said_envs", sys.modules[__name__])
    assert check(["said_envs:NeverTerminates", "--steps", "60"], monkeypatch) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("FAIL coverage"))
    assert "ended by termination" in line and "Env.episode_ends" in line
    assert out.strip().splitlines()[-1].startswith("cartpole: 1 check(s) failed")


def test_a_declared_way_of_ending_is_all_coverage_asks(monkeypatch, capsys):
    """Pendulum's episodes end by truncation alone, as it says: nothing to warn about."""
    assert check(["pendulum", "--steps", "210"], monkeypatch) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "coverage" in x)
    assert line.startswith("PASS coverage"), line


@pytest.mark.parametrize("argv, message", [
    (["no_such_env"], "unknown env 'no_such_env'"),
    (["bad_envs:Good", "--set", "num_agents=0x"], "num_agents"),
    (["bad_envs:Good", "--set", "bogus=1"], "unknown config key 'env.bogus'"),
    (["bad_envs:Good", "--steps", "0"], "--steps must be at least 1"),
    (["bad_envs:Good", "--set", "novalue"], "--set expects KEY=VALUE"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, monkeypatch, capsys):
    assert check(argv, monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
