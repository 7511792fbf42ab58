"""Installs as one package, `gpusim`: the runtime (`gpusim/`) with `envs/`, `training/` and
`cuda_kernels/` mapped in as `gpusim.envs`, `gpusim.training` and `gpusim.cuda_kernels`.

Packages and their data files are found by pattern, so a new env folder under
`envs/` (with its README, recipe and kernels) needs no change here.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

ROOTS = {"gpusim": "gpusim", "gpusim.envs": "envs", "gpusim.training": "training",
         "gpusim.cuda_kernels": "cuda_kernels"}
DATA = ["*.yaml", "*.md", "*.cu", "*.cuh", "templates/new_env/*.tmpl"]
LINUX_X86 = "platform_system == 'Linux' and platform_machine == 'x86_64'"
CUDA13 = ["numba-cuda[cu13]>=0.30", "cuda-bindings>=13,<14", "nvidia-cuda-nvrtc>=13,<14"]


def packages() -> list:
    found = []
    for name, root in ROOTS.items():
        found += [name] + [f"{name}.{sub}" for sub in find_packages(root)]
    return sorted(set(found))


setup(
    name="gpusim",
    version=re.search(r'__version__ = "(.+)"',
                      (Path(__file__).parent / "gpusim" / "version.py").read_text()).group(1),
    description="Massively parallel multi-agent RL environments as GPU (or CPU) kernels, "
                "with PyTorch training on device-resident data.",
    python_requires=">=3.10",
    packages=packages(),
    package_dir=ROOTS,
    package_data={name: DATA for name in packages()},
    install_requires=["torch>=2.1,<3", "numba>=0.59", "numpy>=1.24", "pyyaml>=6.0",
                      "tqdm>=4.60"],
    extras_require={
        # the GPU paths: numba-cuda with the NVVM of its CUDA major, and CUDA C through NVRTC
        # and the driver API (cuda-bindings); choose the major of the "CUDA Version" that
        # nvidia-smi shows (a CUDA 12 driver cannot load what CUDA 13 compilers emit)
        "cuda12": ["numba-cuda[cu12]>=0.30", "cuda-bindings>=12.9,<13",
                   "nvidia-cuda-nvrtc-cu12>=12.9,<13"],
        "cuda13": CUDA13,
        "cuda": CUDA13,  # the newest, as before; an alias of cuda13
        "pycuda": ["pycuda>=2022.1"],
        # adapters to gymnasium, PettingZoo and TorchRL (gpusim.wrappers)
        "interop": ["gymnasium>=0.29", "pettingzoo>=1.24", "torchrl>=0.6"],
        "plot": ["matplotlib>=3.5"],
        # python -m gpusim.export --format onnx (onnx) and running the file (onnxruntime)
        "export": ["onnx>=1.14", "onnxruntime>=1.16"],
        # the docs site: mkdocs build --strict (mkdocs.yml); the lower bounds build it too
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5.20,<10", "mkdocstrings>=0.30,<2",
                 "mkdocstrings-python>=1.18,<3", "pymdown-extensions>=10,<14"],
        # Without a GPU, CI compiles the CUDA C kernels with NVRTC and the numba kernels to
        # PTX with numba-cuda (its NVVM comes from the CUDA toolkit where one is installed);
        # no extra of numba-cuda's, so no CUDA torch or toolkit wheels (Linux x86-64 only)
        "test": ["pytest>=7", "scipy>=1.10", "gymnasium>=0.29", "matplotlib>=3.5",
                 "pettingzoo>=1.24", "torchrl>=0.6", "stable-baselines3>=2", "mpe2==1.1.1",
                 "onnx>=1.14", "onnxruntime>=1.16",
                 f"cuda-bindings>=13; {LINUX_X86}", f"nvidia-cuda-nvrtc>=13; {LINUX_X86}",
                 f"numba-cuda>=0.30; {LINUX_X86}",
                 # NVRTC 12 beside 13: every CUDA C kernel compiles for both driver majors
                 f"nvidia-cuda-nvrtc-cu12>=12.9,<13; {LINUX_X86}"],
    },
)
