"""Installs as one package, `gpusim`: the runtime (`gpusim/`) with `envs/`, `training/` and
`cuda_kernels/` mapped in as `gpusim.envs`, `gpusim.training` and `gpusim.cuda_kernels`.

Packages and their data files are found by pattern, so a new env folder under
`envs/` (with its README, recipe and kernels) needs no change here.
"""
from setuptools import find_packages, setup

ROOTS = {"gpusim": "gpusim", "gpusim.envs": "envs", "gpusim.training": "training",
         "gpusim.cuda_kernels": "cuda_kernels"}
DATA = ["*.yaml", "*.md", "*.cu", "*.cuh"]


def packages() -> list:
    found = []
    for name, root in ROOTS.items():
        found += [name] + [f"{name}.{sub}" for sub in find_packages(root)]
    return sorted(set(found))


setup(
    name="gpusim",
    version="0.1.0",
    description="Massively parallel multi-agent RL environments as GPU (or CPU) kernels, "
                "with PyTorch training on device-resident data.",
    python_requires=">=3.10",
    packages=packages(),
    package_dir=ROOTS,
    package_data={name: DATA for name in packages()},
    install_requires=["torch>=2.1,<3", "numba>=0.59", "numpy>=1.24", "pyyaml>=6.0"],
    extras_require={
        "pycuda": ["pycuda>=2022.1"],
        "plot": ["matplotlib>=3.5"],
        "test": ["pytest>=7", "scipy>=1.10", "gymnasium>=0.29", "matplotlib>=3.5"],
    },
)
