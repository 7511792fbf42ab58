"""What a run prints when its output goes to a file (a cluster's log): compile lines, and a
progress line at least every PROGRESS_EVERY_S."""
import io
import time

from gpusim.training.records import logger as run_logs
from gpusim.training.records.logger import CompileReport, RunLogger


def row(it, total_s):
    return {"iteration": it, "env_steps": 100 * it, "time_s": total_s, "env_steps_per_s": 50.0,
            "episode_return/agent": 1.5}


def test_a_slow_build_is_announced_and_timed_a_fast_one_says_nothing():
    out = io.StringIO()
    report = CompileReport("cartpole", stream=out, notice_after_s=0.05)
    with report("cpu", "cartpole.step"):
        pass  # a load from the compile cache
    report.finish()
    assert out.getvalue() == ""
    report = CompileReport("cartpole", stream=out, notice_after_s=0.05)
    with report("cpu", "cartpole.step"):
        time.sleep(0.3)
    with report("cpu", "cartpole.reset"):  # several builds during set-up: one pair of lines
        time.sleep(0.1)
    assert out.getvalue().count("compiling") == 1 and "compiled in" not in out.getvalue()
    report.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "cartpole" in lines[0] and "cpu backend" in lines[0] and "first run only" in lines[0]
    seconds = float(lines[1].split()[2])
    assert lines[1].startswith("compiled in") and 0.35 <= seconds < 5


def test_a_build_after_set_up_reports_its_own_end():
    out = io.StringIO()
    report = CompileReport("tag", stream=out, notice_after_s=0.05)
    report.finish()
    with report("numba", "tag.step"):
        time.sleep(0.2)
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["compiling", "compiled"]


def test_piped_progress_has_a_line_at_least_every_interval(tmp_path, monkeypatch, capsys):
    clock = [0.0]
    monkeypatch.setattr(run_logs.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(run_logs, "PROGRESS_EVERY_S", 30.0)
    log = RunLogger(tmp_path, total_iterations=1000)
    log._tty = False  # as when stderr is a file
    printed_at = []
    for it in range(1, 200):  # 7 s an iteration: every twentieth (50) alone would leave 350 s
        clock[0] = 7.0 * it
        log.progress(row(it, clock[0]))
        if capsys.readouterr().err:
            printed_at.append(clock[0])
    log.close()
    gaps = [b - a for a, b in zip(printed_at, printed_at[1:])]
    assert printed_at[0] == 7.0 and max(gaps) <= 30.0
    assert len(printed_at) < 199 / 3  # and not a line per iteration


def test_a_piped_line_says_steps_rate_elapsed_eta_and_return(tmp_path, capsys):
    log = RunLogger(tmp_path, total_iterations=10)
    log._tty = False
    log.progress(row(1, 2.0))
    line = capsys.readouterr().err.strip()
    log.close()
    for part in ("1/10", "100 steps", "elapsed 2 s", "ETA 18 s", "50 steps/s", "agent=1.50"):
        assert part in line, (part, line)


def test_quiet_prints_no_progress(tmp_path, capsys):
    log = RunLogger(tmp_path, total_iterations=10, quiet=True)
    log._tty = False
    for it in range(1, 11):
        log.progress(row(it, float(it)))
    log.close()
    assert capsys.readouterr().err == ""
