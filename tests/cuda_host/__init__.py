"""Test helpers that run gpusim's CUDA C kernels on the CPU (gpusim/check/host_shim.cuh)."""
