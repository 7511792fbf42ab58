"""python -m benchmarks.release.gpu_proof --dry-run: how CI checks the GPU proof without a GPU. Every step
exists and parses its arguments (training commands resolve their configs, scripts know their
flags, pytest collects the gpu tests, the env steps run tiny on the simulator)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.release.gpu_proof"


@pytest.mark.slow
def test_dry_run_checks_every_step(tmp_path):
    run = subprocess.run([sys.executable, "-m", MODULE, "--dry-run", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    proof = json.loads((tmp_path / "proof.json").read_text())
    assert proof["dry_run"] and len(proof["results"]) == len(proof["steps"]) >= 10
    assert all(r["status"] == "ok" for r in proof["results"])
    envs = next(r for r in proof["results"] if r["step"] == "env throughput")["rows"]
    from gpusim.envs import env_names
    assert {row["env"] for row in envs} == set(env_names())
    table = (tmp_path / "proof.md").read_text()
    assert "| gpu tests, all | ok |" in table and "| mission: tag_continuous --auto_scale | ok |" \
        in table


def test_a_broken_step_fails_the_dry_run(monkeypatch):
    monkeypatch.chdir(ROOT)  # run_step works from the repository root
    from benchmarks.release import gpu_proof
    from gpusim.errors import GpusimError
    with pytest.raises(GpusimError, match="unknown env 'no_such_env'"):
        gpu_proof.run_step(gpu_proof.Step("bad", "train", ["--env", "no_such_env"]), dry=True)
    with pytest.raises(SystemExit, match="does not take --no_such_flag"):
        gpu_proof.run_step(gpu_proof.Step("bad", "script", [gpu_proof.TRAIN_THROUGHPUT,
                                                            "--no_such_flag"]), dry=True)


def test_without_a_gpu_the_real_run_is_refused(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: gpu_proof would run for real")
    run = subprocess.run([sys.executable, "-m", MODULE, "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.startswith("error: gpu_proof needs a CUDA GPU")
