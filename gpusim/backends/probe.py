"""What this machine's GPU stack can do, each answer one line: the driver's CUDA
version, whether numba can compile and launch a kernel, and which install fits.

`cuda_works` (backend `auto`) and `python -m gpusim.doctor` ask here; nothing
here raises. The driver is read through libcuda itself (no binding needed),
and numba is asked to compile and launch a one-line kernel, because a GPU
that numba sees is not yet one it can use: numba-cuda needs NVVM, and a CUDA
12 driver cannot load PTX from a CUDA 13 compiler.
"""
from __future__ import annotations

import ctypes
import functools

from gpusim.errors import describe

CUDA_EXTRAS = {12: "cuda12", 13: "cuda13"}  # driver's CUDA major -> gpusim's extra


@functools.lru_cache(maxsize=None)
def driver_cuda_version() -> tuple[int, int] | None:
    """(major, minor) of the newest CUDA the installed driver runs (nvidia-smi's "CUDA
    Version"), or None where no NVIDIA driver library loads."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int()
        if library.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
            return version.value // 1000, version.value % 1000 // 10
    return None


def install_hint(driver: tuple[int, int] | None = None) -> str:
    """The install that matches this driver (or how to choose one), as a command."""
    driver = driver_cuda_version() if driver is None else driver
    extra = CUDA_EXTRAS.get(driver[0]) if driver else None
    if extra is not None:
        return f"pip install 'gpusim[{extra}]' (this driver runs CUDA {driver[0]}.{driver[1]})"
    return ("pip install 'gpusim[cuda12]' or 'gpusim[cuda13]', whichever matches the "
            "\"CUDA Version\" nvidia-smi shows")


def numba_cuda_target() -> tuple[str | None, str]:
    """(the CUDA target numba uses, or None, and why not): numba-cuda's, or numba's built-in
    one, which is deprecated and cannot compile gpusim's kernels."""
    try:
        from numba import cuda
    except Exception as exc:  # numba's CUDA target fails to import: a broken install
        return None, f"numba's CUDA target does not import ({describe(exc)})"
    if getattr(cuda, "implementation", "") != "NVIDIA":
        return None, "numba-cuda is not installed (numba's own CUDA target is deprecated)"
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"numba-cuda {version('numba-cuda')}", ""
    except PackageNotFoundError:
        return "numba-cuda", ""


def nvvm_library() -> tuple[str | None, str]:
    """(NVVM's version and the library numba-cuda loads, or None, and why not)."""
    try:
        from numba.cuda.cudadrv import nvvm
        major, minor = nvvm.NVVM().get_version()
    except Exception as exc:  # not found, or fails to load
        return None, describe(exc)
    try:
        from numba.cuda.cuda_paths import get_cuda_paths
        where = f" ({get_cuda_paths()['nvvm'].info})"
    except Exception:  # an internal of numba's that moved: the version is enough
        where = ""
    return f"NVVM {major}.{minor}{where}", ""


def _probe_kernel(out):
    out[0] = 1


@functools.lru_cache(maxsize=None)
def numba_problem() -> str | None:
    """None where numba compiles and launches a kernel on a CUDA GPU here, else why not,
    in one line that names what to install."""
    try:
        from numba import cuda
        if not cuda.is_available():
            return "no CUDA GPU or driver found"
    except Exception as exc:  # a broken driver install is still "no GPU"
        return f"CUDA unusable ({describe(exc)})"
    import torch
    if not torch.cuda.is_available():
        return "torch was built without CUDA or sees no GPU"
    target, why = numba_cuda_target()
    if target is None:
        return f"{why}; {install_hint()}"
    try:
        kernel = cuda.jit("void(int32[:])")(_probe_kernel)
        out = cuda.device_array(1, dtype="int32")
        kernel[1, 1](out)
        if int(out.copy_to_host()[0]) != 1:
            return "numba's probe kernel ran but did not write its result"
    except Exception as exc:  # no NVVM, a PTX version the driver rejects, ...
        return f"numba cannot compile and launch a kernel ({describe(exc)}); {install_hint()}"
    return None
