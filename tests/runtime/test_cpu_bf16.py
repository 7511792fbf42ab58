"""bf16 on the CPU: a child-process probe decides, a faulting CPU never kills a run (exit 132).

The faulting CPU is simulated: GPUSIM_TEST_BF16_FAULT makes the probe's child
kill itself by SIGILL under the listed ONEDNN_MAX_CPU_ISA settings, as an
AMX-advertising VM does on oneDNN's default path.
"""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusim import cpu_bf16

ISA, FAKE = cpu_bf16.ISA_VAR, cpu_bf16.FAKE_FAULT_VAR


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No ISA set, an empty cache, and nothing remembered from earlier calls."""
    monkeypatch.delenv(ISA, raising=False)
    monkeypatch.delenv(FAKE, raising=False)
    monkeypatch.setenv("GPUSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_bf16, "_memo", {})
    monkeypatch.setattr(cpu_bf16, "_prepared", {})
    yield monkeypatch
    os.environ.pop(ISA, None)  # what prepare() set (monkeypatch then restores the user's own)


def test_the_probe_answers_on_this_cpu(fresh):
    result = cpu_bf16.probe(use_cache=False)
    assert set(result.outcomes) <= {"default", *cpu_bf16.LOWER_ISAS}
    first = result.outcomes["default"]
    assert first == "ok" or first == "SIGILL" or first.startswith(("exit", "killed", "no answer"))
    rows = dict(cpu_bf16.doctor_rows())
    assert rows["CPU bf16 matmul"].startswith(("works", "faults", "does not work"))


def test_a_faulting_default_path_gets_the_highest_isa_that_works(fresh):
    fresh.setenv(FAKE, "default")
    lines = []
    cpu_bf16.prepare(announce=lines.append)
    assert os.environ[ISA] == "AVX512_CORE_BF16"
    assert len(lines) == 1 and "SIGILL" in lines[0] and "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16" \
        in lines[0]
    fresh.setenv(FAKE, "default,AVX512_CORE_BF16")  # the next one down, from a fresh memo
    fresh.setattr(cpu_bf16, "_prepared", {})
    fresh.delenv(ISA)
    cpu_bf16.prepare(announce=None)
    assert os.environ[ISA] == "AVX512_CORE"


def test_no_working_isa_is_one_line_and_no_silent_fp32(fresh):
    fresh.setenv(FAKE, "*")
    with pytest.raises(cpu_bf16.Bf16Unavailable) as err:
        cpu_bf16.prepare(announce=None)
    message = str(err.value)
    assert "\n" not in message and "trainer.precision=fp32" in message
    assert ISA not in os.environ


def test_onednn_already_in_use_names_both_ways_out(fresh):
    fresh.setenv(FAKE, "default,in-process")
    with pytest.raises(cpu_bf16.Bf16Unavailable) as err:
        cpu_bf16.prepare(announce=None)
    message = str(err.value)
    assert "already in use" in message and "\n" not in message
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16" in message and "trainer.precision=fp32" in message
    assert ISA not in os.environ  # left as it was


def test_the_users_isa_is_respected(fresh):
    fresh.setenv(ISA, "AVX512_CORE")
    fresh.setenv(FAKE, "default")  # would fault without the user's setting
    lines = []
    cpu_bf16.prepare(announce=lines.append)
    assert os.environ[ISA] == "AVX512_CORE" and "your setting" in lines[0]
    fresh.setattr(cpu_bf16, "_prepared", {})
    fresh.setenv(FAKE, "AVX512_CORE")  # the user's own setting faults: say so, set nothing
    with pytest.raises(cpu_bf16.Bf16Unavailable, match="ONEDNN_MAX_CPU_ISA=AVX512_CORE"):
        cpu_bf16.prepare(announce=None)
    assert os.environ[ISA] == "AVX512_CORE"


def test_the_answer_is_cached_per_machine(fresh):
    fresh.setenv(FAKE, "default")
    first = cpu_bf16.probe()
    fresh.setattr(cpu_bf16, "_memo", {})

    def no_child(isa):
        raise AssertionError("probed again despite the cache")
    fresh.setattr(cpu_bf16, "run_probe", no_child)
    assert cpu_bf16.probe() == first  # read back from the cache file
    fresh.setenv(FAKE, "")  # another key (as another CPU or torch version would be)
    with pytest.raises(AssertionError, match="probed again"):
        cpu_bf16.probe()


def _train(argv, env):
    return subprocess.run([sys.executable, "-m", "gpusim.train", *argv], capture_output=True,
                          text=True, env=env, timeout=600)


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.mark.slow
def test_a_faulting_cpu_stops_a_bf16_run_in_one_line_with_its_files_intact(tmp_path):
    env = dict(os.environ)
    env.pop(ISA, None)
    env.pop(FAKE, None)
    argv = ["--env", "cartpole", "--backend", "cpu", "--num_envs", "8", "--rollout_len", "16",
            "--total_steps", "256", "--results_dir", str(tmp_path / "runs"), "--quiet",
            "--set", "trainer.precision=bf16", "--set", "trainer.checkpoint_every=1"]
    first = _train(argv, env)  # bf16 where it runs: a run directory with checkpoints
    if first.returncode == 2 and "no bf16 path works" in first.stderr:
        pytest.skip(first.stderr.strip().splitlines()[-1])
    assert first.returncode == 0, first.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    before = _digest(run_dir)
    assert any(name.startswith("checkpoints") for name in before)

    faulting = {**env, FAKE: "*"}  # the same run resumed where no bf16 path works
    resumed = _train(["--resume", str(run_dir), "--total_steps", "512"], faulting)
    assert resumed.returncode == 2, resumed.stderr
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "trainer.precision=fp32" in errors[0], resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert _digest(run_dir) == before  # nothing written, nothing lost
    assert len(list((tmp_path / "runs").iterdir())) == 1

    # oneDNN's own choice faults and a lower ISA works: it trains, and says which ISA
    lowered = _train(argv, {**env, FAKE: "default"})
    assert lowered.returncode == 0, lowered.stderr
    assert "using ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16" in lowered.stderr
