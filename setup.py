from setuptools import setup

setup(
    name="gpusim",
    version="0.1.0",
    description="Massively parallel multi-agent RL environments as GPU (or CPU) kernels, "
                "with PyTorch training on device-resident data.",
    python_requires=">=3.10",
    packages=["gpusim", "gpusim.backends", "gpusim.envs", "gpusim.envs.tag_continuous",
              "gpusim.envs.cartpole", "gpusim.envs.tag_gridworld",
              "gpusim.training", "gpusim.cuda_kernels"],
    package_dir={"gpusim": "gpusim", "gpusim.envs": "envs", "gpusim.training": "training",
                 "gpusim.cuda_kernels": "cuda_kernels"},
    package_data={"gpusim.envs.tag_continuous": ["config.yaml"],
                  "gpusim.envs.cartpole": ["config.yaml"],
                  "gpusim.envs.tag_gridworld": ["config.yaml", "README.md"],
                  "gpusim.cuda_kernels": ["*.cu", "*.cuh"]},
    install_requires=["torch>=2.1,<3", "numba>=0.59", "numpy>=1.24", "pyyaml>=6.0"],
    extras_require={
        "pycuda": ["pycuda>=2022.1"],
        "plot": ["matplotlib>=3.5"],
        "test": ["pytest>=7", "scipy>=1.10", "gymnasium>=0.29", "matplotlib>=3.5"],
    },
)
