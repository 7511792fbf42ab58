"""Packaging: the layout installs under `gpusim` only, with its data files."""
import importlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_subpackages_import_under_gpusim():
    for name in ("gpusim.envs", "gpusim.envs.tag_continuous", "gpusim.envs.tag_gridworld",
                 "gpusim.training", "gpusim.cuda_kernels", "gpusim.scale", "gpusim.check"):
        importlib.import_module(name)


def test_wheel_holds_nothing_generic_at_top_level(tmp_path):
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
    except ImportError:
        pytest.skip("building a wheel offline needs setuptools and wheel installed")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel_path,) = tmp_path.glob("gpusim-*.whl")
    names = zipfile.ZipFile(wheel_path).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"gpusim", next(t for t in tops if t.endswith(".dist-info"))}
    # every file of every env folder (code, rules, recipe), found by pattern
    for path in (ROOT / "envs").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            assert f"gpusim/envs/{path.relative_to(ROOT / 'envs').as_posix()}" in names, path
    assert "gpusim/training/loop.py" in names
    assert "gpusim/training/algorithms/sac.py" in names
    assert "gpusim/scale/distributed.py" in names
    for kernel in ("sampler.cu", "gpusim_env.cuh", "gpusim_rng.cuh", "gpusim_math.cuh"):
        assert f"gpusim/cuda_kernels/{kernel}" in names
    assert "gpusim/envs/tag_continuous/tag_continuous.cu" in names  # beside its env


def test_readme_example_runs():
    """The README's Python example is real code: run it (on the CPU backend)."""
    text = (ROOT / "README.md").read_text()
    # the first block, the env's (tests/interop/test_real_clients.py runs those of trained policies)
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    env = namespace["env"]
    assert namespace["obs"].shape == (256, env.num_agents, env.obs_dim)
