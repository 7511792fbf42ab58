"""CUDA C kernels for the pycuda backend, shipped as package data (`*.cu`)."""
