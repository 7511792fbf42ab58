"""benchmarks/peers/train_throughput.py: `--profile` on the CPU, the CUDA counting against
recorded stand-in events (CI has no GPU), and WarpDrive's env keywords."""
import inspect
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

ROOT = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.peers.train_throughput"


def test_profile_runs_tiny_on_the_cpu(tmp_path):
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, "-m", MODULE, "--num_envs", "2", "--rollout_len", "10",
                          "--iterations", "1", "--backend", "cpu", "--profile", "--skip",
                          "warpdrive", "recipe", "auto_scale", "limit", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr == "", run.stderr[-2000:]  # no library chatter, no warning
    lines = run.stdout.splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("profile of a2c"))):]
    assert any(x.split()[:2] == ["rollout", "env"] for x in table), run.stdout
    assert any(x.split()[:2] == ["update", "update"] for x in table), run.stdout
    assert any("top operators by self CPU time" in x for x in table), run.stdout
    (row,) = json.loads(out.read_text())
    rollout, update = row["profile"]
    assert (rollout["phase"], rollout["steps"], update["phase"]) == ("rollout", 10, "update")
    assert rollout["host_launches_per"] == pytest.approx(rollout["host_launches"] / 10, abs=0.01)
    assert rollout["top"] and update["top"] and rollout["device_kernels"] is None


def event(name, start, end, device=DeviceType.CPU, id=0, annotation=False, kind=None):
    return SimpleNamespace(name=name, id=id, device_type=device, is_user_annotation=annotation,
                           activity_type=kind, time_range=SimpleNamespace(start=start, end=end))


def test_cuda_launches_and_kernels_are_counted_per_phase():
    """Kernels belong to the phase of the host call that launched them (a kernel may run
    after its phase's host range); a graph replay is one host call and all its kernels."""
    from benchmarks.peers.train_throughput import summarise
    cuda = DeviceType.CUDA
    events = [
        event("rollout", 0, 100, annotation=True), event("update", 200, 300, annotation=True),
        event("rollout", 0, 110, device=cuda, annotation=True, kind="gpu_user_annotation"),
        event("cudaLaunchKernel", 10, 11, id=1), event("cuLaunchKernel", 20, 21, id=2),
        event("kernel_a", 15, 25, device=cuda, id=1, kind="kernel"),
        event("env_step", 150, 160, device=cuda, id=2, kind="kernel"),  # ran late: still rollout
        event("Memcpy HtoD", 30, 31, device=cuda, id=9, kind="gpu_memcpy"),
        event("cudaGraphLaunch", 210, 215, id=3),
        *(event(f"graph_{k}", 220 + k, 221 + k, device=cuda, id=3, kind="kernel")
          for k in range(3)),
        event("unlinked", 250, 270, device=cuda, id=77, kind="kernel"),  # by its own start
    ]
    rollout, update = summarise(events, cuda=True, per={"rollout": 2, "update": 1}, top=2)
    assert (rollout["host_launches"], rollout["device_kernels"]) == (2, 2)
    assert (rollout["host_launches_per"], rollout["device_kernels_per"]) == (1.0, 1.0)
    assert (update["host_launches"], update["device_kernels"]) == (1, 4)
    assert update["top"][0] == {"name": "unlinked", "calls": 1, "ms": 0.02, "share": 0.87}
    assert rollout["device_ms"] == 0.02


def test_warpdrive_gets_only_the_keys_its_env_takes():
    from benchmarks.peers.train_throughput import ENV_CONFIG, warpdrive_env_config

    class TagContinuous:  # WarpDrive 2.7.1's signature, in part: no continuous_actions
        def __init__(self, num_taggers=1, num_runners=10, grid_length=10.0, seed=None,
                     use_full_observation=True, env_backend="cpu"):
            pass
    config = warpdrive_env_config(TagContinuous)
    taken = inspect.signature(TagContinuous).parameters
    assert config == {**{k: v for k, v in ENV_CONFIG.items() if k in taken}, "grid_length": 20.0,
                      "use_full_observation": False}
