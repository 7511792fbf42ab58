"""`pycuda`: hand-written CUDA C kernels from `gpusim.cuda_kernels`, run with pycuda.

A `KernelSpec` names its CUDA C kernel as `cuda_c="file.cu:function"` (for an
env: the class attributes `cuda_c_reset` and `cuda_c_step`). The backend
compiles the file with nvcc to a cubin for the GPU's architecture, keeps the
cubin in the per-user compile cache (`gpusim.cache`), loads it into torch's
CUDA context (the device's primary context) and launches the function with
grid = replicas and block = agents. Sources, signatures, the argument
convention and nvcc live in `gpusim.backends.cuda_c`; the first launch checks
the C signature against the arrays and parameters actually passed.

Streams: pycuda launches only on its own streams or on the legacy default
stream (handle 0), and torch's default stream *is* the legacy default stream.
So a launch goes to the legacy default stream; when torch's current stream
is another one, that stream's pending work is made to precede the launch and
the launch to precede its later work (event waits on the device, no host
synchronisation), so the kernel is ordered exactly as if it ran on torch's
current stream.
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import torch

from gpusim import cache
from gpusim.backends.base import CUDADeviceBackend, Kernel
from gpusim.backends.cuda_c import (NVCC_FLAGS, TensorPointer, argument_format, find_nvcc,
                                    headers_text, kernel_signature, kernel_source,
                                    nvcc_command, nvcc_version, split_cuda_c)
from gpusim.errors import BackendError

INSTALL_HINT = ("install it with `pip install gpusim[pycuda]`; it needs the CUDA toolkit "
                "(nvcc on PATH or in $CUDA_HOME/bin) and an NVIDIA GPU with its driver")


_PRIMARY_CONTEXTS: dict = {}  # device index -> pycuda Context (the retained primary context)


def _unavailable(why: str) -> BackendError:
    return BackendError(f"backend 'pycuda' is unavailable: {why}; {INSTALL_HINT} "
                        "(or use --backend numba or cpu)")


class PyCUDABackend(CUDADeviceBackend):
    name = "pycuda"

    def __init__(self, device_index: int = 0):
        try:
            import pycuda.driver as drv
        except Exception as exc:  # not installed, or no CUDA driver library to load
            raise _unavailable(f"pycuda cannot be imported ({type(exc).__name__}: {exc})") from None
        if not torch.cuda.is_available():
            raise _unavailable("torch sees no CUDA GPU (or was built without CUDA)")
        nvcc = find_nvcc()
        if nvcc is None:
            raise _unavailable("nvcc was not found (not on PATH, nor in $CUDA_HOME/bin)")
        try:
            drv.init()
            count = drv.Device.count()
        except Exception as exc:
            raise _unavailable(f"the CUDA driver cannot be used ({type(exc).__name__}: {exc})") \
                from None
        if not 0 <= device_index < count:
            raise BackendError(f"backend 'pycuda': no CUDA device {device_index} "
                               f"({count} visible)")
        super().__init__(device_index)
        self._drv = drv
        self.nvcc = nvcc
        device = drv.Device(device_index)
        if device_index not in _PRIMARY_CONTEXTS:
            # torch runs in the device's primary context; pycuda retains the same one.
            _PRIMARY_CONTEXTS[device_index] = device.retain_primary_context()
        self._context = _PRIMARY_CONTEXTS[device_index]
        major, minor = device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self._modules = {}  # file -> loaded pycuda module

    def view(self, tensor):
        return TensorPointer(tensor.detach())

    def is_resource_error(self, exc):
        if isinstance(exc, (self._drv.LaunchError, self._drv.MemoryError)):
            return True  # e.g. "too many resources requested for launch"
        return super().is_resource_error(exc)

    # ---- compile and load -------------------------------------------------------------------
    def _compile(self, spec):
        file, function = split_cuda_c(spec)
        source = kernel_source(file)
        params = kernel_signature(source, function, file)
        module = self._module(file, source)
        self._context.push()
        try:
            kernel = module.get_function(function)
            max_threads = kernel.get_attribute(
                self._drv.function_attribute.MAX_THREADS_PER_BLOCK)
        finally:
            self._drv.Context.pop()
        return PyCUDAKernel(self, kernel, params, f"CUDA C kernel {function} ({file})", max_threads)

    def _module(self, file: str, source: str):
        if file not in self._modules:
            cubin = self._cubin(file, source)
            self._context.push()
            try:
                self._modules[file] = self._drv.module_from_buffer(cubin)
            finally:
                self._drv.Context.pop()
        return self._modules[file]

    def _cubin(self, file: str, source: str) -> bytes:
        """The cubin of `source` for this GPU: from the compile cache, else compiled by nvcc."""
        entry = cache.entry_dir("pycuda", source, headers_text(), self.arch,
                                nvcc_version(self.nvcc), " ".join(NVCC_FLAGS))
        path = entry / (Path(file).stem + ".cubin")
        if not path.is_file():
            with tempfile.TemporaryDirectory(prefix="gpusim-nvcc-") as tmp:
                src, out = Path(tmp) / file, Path(tmp) / "kernel.cubin"
                src.write_text(source)  # compile exactly the text that was hashed
                command = nvcc_command(self.nvcc, self.arch, src, out)
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode != 0:
                    raise BackendError(f"nvcc could not compile {file} for {self.arch}:\n"
                                       f"{(result.stderr or result.stdout).strip()}")
                cache.atomic_write(path, out.read_bytes())
        return path.read_bytes()


class PyCUDAKernel(Kernel):
    """One CUDA C kernel, launched in order with torch's current stream."""

    def __init__(self, backend: PyCUDABackend, kernel, params: list, where: str,
                 max_threads: int):
        self._backend = backend
        self._kernel = kernel
        self._params = params
        self._where = where
        self._max_threads = max_threads
        self._layout = None  # (type(s), type(p)) the kernel was last prepared for

    def precompile(self, s, p):
        """Check the kernel's C signature against these arguments (the cubin is already built)."""
        self._kernel.prepare(argument_format(self._params, s, p, self._where))
        self._layout = (type(s), type(p))

    def __call__(self, num_envs, num_agents, s, p):
        if (type(s), type(p)) != self._layout:
            self.precompile(s, p)
        if num_agents > self._max_threads:
            raise BackendError(f"{self._where} runs at most {self._max_threads} agents per "
                               f"replica on this GPU, got {num_agents}")
        backend = self._backend
        current = torch.cuda.current_stream(backend.device)
        # torch's default stream has handle 0: the legacy default stream, where pycuda launches
        elsewhere = current.cuda_stream != 0
        if elsewhere:  # the launch follows the current stream's pending work ...
            default = torch.cuda.default_stream(backend.device)
            default.wait_stream(current)
        backend._context.push()  # launch in torch's context, whichever thread this is
        try:
            self._kernel.prepared_async_call((int(num_envs), 1), (int(num_agents), 1, 1), None,
                                             *s, *p)
        finally:
            backend._drv.Context.pop()
        if elsewhere:  # ... and precedes its later work
            current.wait_stream(default)
