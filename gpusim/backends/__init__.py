"""Backends: the one place that knows how kernels are compiled and launched.

Every backend offers the same small interface (`Backend`, whose kernels are
`Kernel`s), so nothing above this layer branches on the backend name:
- `cpu`: portable kernels compiled with numba `njit(parallel=True)`.
- `numba`: numba CUDA kernels on an NVIDIA GPU.
- `cudasim`: numba's CUDA simulator, running GPU kernel code on the CPU.
- `cuda_c` (alias `pycuda`): hand-written CUDA C kernels, compiled with NVRTC
  or nvcc, run through pycuda or cuda-bindings (the toolchain, which needs
  no GPU, is `cuda_c`).
A backend module is imported only when its backend is chosen.
"""
from __future__ import annotations

import importlib
import sys
import warnings

from gpusim.backends.base import (Backend, Kernel, is_resource_error, kernels_built,
                                  set_build_once, set_compile_reporter)
from gpusim.cpu_threads import usable_cores
from gpusim.errors import BackendError

_BACKEND_CLASSES = {  # name -> "module:class"; each class checks that it can run here
    "cpu": "gpusim.backends.cpu:CPUBackend",
    "numba": "gpusim.backends.numba_cuda:NumbaCUDABackend",
    "cudasim": "gpusim.backends.cudasim:CUDASimBackend",
    "cuda_c": "gpusim.backends.cuda_c_backend:CudaCBackend",
    "pycuda": "gpusim.backends.cuda_c_backend:CudaCBackend",  # the same backend, its old name
}
BACKEND_NAMES = ("auto", *_BACKEND_CLASSES)

# One block per replica: numba-cuda warns at every launch of fewer than 128 blocks (a small
# run, the probe kernel), which tells a user of gpusim nothing to act on.
warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU "
                        "under-utilization")


def cuda_works() -> tuple[bool, str]:
    """Whether numba can compile and launch on a CUDA GPU here, and why not if it cannot
    (one line naming what to install)."""
    from gpusim.backends.probe import numba_problem
    problem = numba_problem()
    return (True, "CUDA GPU found, numba compiles and launches") if problem is None \
        else (False, problem)


def get_backend(name: str = "auto", device_index: int = 0, quiet: bool = False) -> Backend:
    """The backend called `name`; `auto` picks `numba` when a CUDA GPU works, else `cpu`."""
    if name not in BACKEND_NAMES:
        raise BackendError(f"unknown backend '{name}' (choose from {', '.join(BACKEND_NAMES)})")
    if name == "auto":
        ok, why = cuda_works()
        name = "numba" if ok else "cpu"
        if not quiet:
            print(f"gpusim: backend auto -> {name} ({why})", file=sys.stderr)
    module, _, cls = _BACKEND_CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), cls)(device_index)


def check_process_count(name: str, num_procs: int, oversubscribe: bool = False):
    """Refuse to start `num_procs` processes (one per device) where the devices are missing.

    GPU backends need that many GPUs; `cpu` and `cudasim` run one CPU worker
    process per core (more only with `oversubscribe`); `auto` without a GPU
    asks for an explicit choice.
    """
    if num_procs < 1:
        raise BackendError(f"--num_gpus must be at least 1, got {num_procs}")
    if name in ("cpu", "cudasim"):
        cores = usable_cores()
        if num_procs > cores and not oversubscribe:
            raise BackendError(f"--num_gpus {num_procs} CPU worker processes exceed the "
                               f"{cores} cores here; add --oversubscribe to start them anyway")
        return
    if num_procs == 1:
        return
    ok, why = cuda_works()
    if not ok:
        raise BackendError(f"--num_gpus {num_procs} needs {num_procs} CUDA GPUs: {why}; "
                           "for CPU worker processes add --backend cpu")
    import torch
    count = torch.cuda.device_count()
    if num_procs > count:
        raise BackendError(f"--num_gpus {num_procs} asks for more GPUs than this machine has "
                           f"({count})")


__all__ = ["Backend", "Kernel", "BACKEND_NAMES", "get_backend", "cuda_works",
           "check_process_count", "is_resource_error", "kernels_built", "set_build_once",
           "set_compile_reporter", "usable_cores"]
