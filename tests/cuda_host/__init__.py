"""Test helpers that run gpusim's CUDA C kernels on the CPU (see host_shim.h)."""
