"""`cuda_c` (alias `pycuda`): an env's hand-written CUDA C kernels on an NVIDIA GPU.

A `KernelSpec` names its CUDA C kernel as `cuda_c="file.cu:function"` (for an
env: the class attributes `cuda_c_reset` and `cuda_c_step`, paths relative to
the env's module). For each argument layout the backend writes the kernel's
generated parameter header, compiles the file with NVRTC (or nvcc) into the
compile cache for the GPU's architecture, loads the image into torch's CUDA
context (the device's primary context) and launches the function with grid
= replicas and block = agents. The toolchain is `gpusim.backends.cuda_c_sources`
(sources, headers, signatures) and `gpusim.backends.cuda_c` (compilers, the
compile step); the first launch of a layout checks the C signature against
the arrays and parameters actually passed.

Two drivers load and launch, behind the same backend: pycuda where it is
installed, else NVIDIA's `cuda-bindings` driver API (a wheel, no toolkit).
- cuda-bindings launches on torch's current stream.
- pycuda launches only on its own streams or on the legacy default stream
  (handle 0), which is torch's default stream; when torch's current stream
  is another one, that stream's pending work is made to precede the launch
  and the launch to precede its later work (event waits on the device, no
  host synchronisation).
"""
from __future__ import annotations

import ctypes

import torch

from gpusim.backends.base import CUDADeviceBackend, Kernel
from gpusim.backends.cuda_c import build, find_compiler
from gpusim.backends.cuda_c_sources import C_CTYPES, TensorPointer, launch_signature, locate
from gpusim.errors import BackendError

INSTALL_HINT = ("install `pip install gpusim[cuda12]` or `gpusim[cuda13]` (the driver's CUDA major) (NVRTC and the CUDA driver API from "
                "wheels) or `pip install gpusim[pycuda]`")


def _unavailable(why: str) -> BackendError:
    return BackendError(f"backend 'cuda_c' is unavailable: {why}; {INSTALL_HINT} "
                        "(or use --backend numba or cpu)")


class PyCUDADriver:
    """Loading and launching through pycuda, in torch's primary context."""
    name = "pycuda"
    _contexts: dict = {}  # device index -> the retained primary context

    def __init__(self, device_index: int):
        import pycuda.driver as drv
        drv.init()
        if device_index not in self._contexts:
            self._contexts[device_index] = drv.Device(device_index).retain_primary_context()
        self.drv = drv
        self.context = self._contexts[device_index]
        self.device = torch.device("cuda", device_index)

    def load(self, image: bytes, function: str):
        self.context.push()
        try:
            kernel = self.drv.module_from_buffer(image).get_function(function)
            return kernel, kernel.get_attribute(self.drv.function_attribute.MAX_THREADS_PER_BLOCK)
        finally:
            self.drv.Context.pop()

    def prepare(self, kernel, params, struct_format: str):
        kernel.prepare(struct_format)  # pycuda packs the arguments from then on

    def launch(self, kernel, grid: int, block: int, prepared, args):
        current = torch.cuda.current_stream(self.device)
        elsewhere = current.cuda_stream != 0  # 0: the legacy default stream pycuda uses
        if elsewhere:
            default = torch.cuda.default_stream(self.device)
            default.wait_stream(current)
        self.context.push()  # launch in torch's context, whichever thread this is
        try:
            kernel.prepared_async_call((grid, 1), (block, 1, 1), None, *args)
        finally:
            self.drv.Context.pop()
        if elsewhere:
            current.wait_stream(default)


class CudaBindingsDriver:
    """Loading and launching through the CUDA driver API of `cuda-bindings`."""
    name = "cuda-bindings"

    def __init__(self, device_index: int):
        from cuda.bindings import driver
        self.driver = driver
        self._call(driver.cuInit(0), "cuInit")
        (device,) = self._call(driver.cuDeviceGet(device_index), "cuDeviceGet")
        # torch works in the device's primary context: retain and use the same one
        (self.context,) = self._call(driver.cuDevicePrimaryCtxRetain(device), "retain context")
        self.device = torch.device("cuda", device_index)
        self._streams = {}

    def _call(self, result, what: str):
        error, *values = result if isinstance(result, tuple) else (result,)
        if error != self.driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"CUDA driver call {what} failed ({error.name})")
        return values

    def load(self, image: bytes, function: str):
        driver = self.driver
        self._call(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        (module,) = self._call(driver.cuModuleLoadData(image), "cuModuleLoadData")
        (kernel,) = self._call(driver.cuModuleGetFunction(module, function.encode()),
                               f"cuModuleGetFunction({function})")
        (max_threads,) = self._call(driver.cuFuncGetAttribute(
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel),
            "cuFuncGetAttribute")
        return (module, kernel), max_threads

    def prepare(self, kernel, params, struct_format: str):
        """The argument types of a layout, worked out once (not per launch)."""
        return tuple(ctypes.c_void_p if p.pointer else C_CTYPES[p.ctype] for p in params)

    def launch(self, kernel, grid: int, block: int, types, args):
        driver = self.driver
        self._call(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        values = tuple(int(a) if t is ctypes.c_void_p else a for t, a in zip(types, args))
        handle = torch.cuda.current_stream(self.device).cuda_stream
        if handle not in self._streams:  # one driver stream object per torch stream
            self._streams[handle] = driver.CUstream(handle)
        self._call(driver.cuLaunchKernel(kernel[1], grid, 1, 1, block, 1, 1, 0,
                                         self._streams[handle], (values, types), 0),
                   "cuLaunchKernel")


def find_driver(device_index: int):
    """pycuda where it imports, else cuda-bindings; one error naming what to install."""
    problems = []
    for driver in (PyCUDADriver, CudaBindingsDriver):
        try:
            return driver(device_index)
        except ImportError as exc:
            problems.append(f"{driver.name} is not installed ({exc.name})")
        except Exception as exc:  # installed, but the CUDA driver cannot be used
            problems.append(f"{driver.name} cannot use the CUDA driver "
                            f"({type(exc).__name__}: {exc})")
    raise _unavailable("; ".join(problems))


class CudaCBackend(CUDADeviceBackend):
    name = "cuda_c"

    def __init__(self, device_index: int = 0):
        if not torch.cuda.is_available():
            raise _unavailable("torch sees no CUDA GPU (or was built without CUDA)")
        count = torch.cuda.device_count()
        if not 0 <= device_index < count:
            raise BackendError(f"backend 'cuda_c': no CUDA device {device_index} "
                               f"({count} visible)")
        try:
            self.compiler = find_compiler()
        except BackendError as exc:
            raise _unavailable(str(exc)) from None
        super().__init__(device_index)
        self.driver = find_driver(device_index)
        major, minor = torch.cuda.get_device_capability(self.device)
        self.arch = f"sm_{major}{minor}"

    def view(self, tensor):
        return TensorPointer(tensor.detach())

    def _compile(self, spec):
        return CudaCKernel(self, *locate(spec), spec.name)


class CudaCKernel(Kernel):
    """One CUDA C kernel: compiled, loaded and checked per argument layout."""

    def __init__(self, backend: CudaCBackend, source, function: str, what: str):
        self.backend = backend
        self.source = source
        self.function = function
        self.what = what
        self.loaded = {}  # (type(s), type(p)) -> (kernel, its driver's prepared arguments, max_threads)

    def precompile(self, s, p):
        backend = self.backend
        header, params, struct_format = launch_signature(self.source, self.function, s, p,
                                                         self.what)
        image = build(backend.compiler, self.source, header, backend.arch)
        kernel, max_threads = backend.driver.load(image, self.function)
        prepared = backend.driver.prepare(kernel, params, struct_format)
        self.loaded[(type(s), type(p))] = (kernel, prepared, max_threads)

    def __call__(self, num_envs, num_agents, s, p):
        if (type(s), type(p)) not in self.loaded:
            self.precompile(s, p)
        kernel, prepared, max_threads = self.loaded[(type(s), type(p))]
        if num_agents > max_threads:
            raise BackendError(f"CUDA C kernel {self.function} ({self.source.name}) runs at "
                               f"most {max_threads} agents per replica on this GPU, "
                               f"got {num_agents}")
        self.backend.driver.launch(kernel, int(num_envs), int(num_agents), prepared, (*s, *p))
