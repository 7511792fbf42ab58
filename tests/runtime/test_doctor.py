"""`python -m gpusim.doctor` on this machine: it runs, exits 0, and its rows make sense
(a CPU-only machine says so; the table and --json say the same)."""
import json
import subprocess
import sys

import pytest

from gpusim import doctor


def run_doctor(*args):
    return subprocess.run([sys.executable, "-m", "gpusim.doctor", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def report():
    run = run_doctor("--json")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_json_has_every_row_a_gpu_user_needs(report):
    for label in ("GPUs", "driver CUDA version", "torch", "numba CUDA target", "NVVM", "NVRTC",
                  "cuda-bindings", "pycuda", "install for this driver", "summary",
                  *(f"backend {name}" for name in doctor.BACKENDS)):
        assert report[label] and "\n" not in report[label], label
    assert report["backend cpu"] == "works"


def test_a_cpu_only_machine_is_reported_as_such(report):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    assert report["summary"].startswith("CPU-only machine")
    assert not report["backend numba"].startswith("works")
    assert "cuda12" in report["install for this driver"]


def test_table_prints_the_same_rows():
    run = run_doctor()
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[0].startswith("python") and any(l.startswith("backend cpu") for l in lines)
    assert "Traceback" not in run.stderr


def test_the_cpu_bf16_probe_is_a_row_and_its_failure_too(monkeypatch):
    from gpusim import cpu_bf16
    rows = dict(doctor.cpu_bf16_rows())
    assert rows["CPU bf16 matmul"].startswith(("works", "faults", "does not work"))

    def broken():
        raise RuntimeError("no child process")
    monkeypatch.setattr(cpu_bf16, "doctor_rows", broken)
    assert doctor.cpu_bf16_rows() == [("CPU bf16", "probe failed (RuntimeError: no child "
                                                    "process)")]


def test_bad_arguments_are_refused():
    """One `error:` line, no usage, exit 2, as `python -m gpusim.train` does."""
    run = run_doctor("--bogus")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines() == ["error: unrecognized arguments: --bogus (see --help)"]


@pytest.mark.parametrize("tool, argv", [("gpusim.training.trained.evaluation", ["run"]),
                                        ("gpusim.training.trained.animation", ["cartpole"]),
                                        ("gpusim.training.trained.learning_curves", ["run"])])
def test_the_other_tools_refuse_a_misspelt_flag_alike(tool, argv, capsys):
    main = __import__(tool, fromlist=["main"]).main
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--jsn"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: unrecognized arguments: --jsn (see --help)"]
