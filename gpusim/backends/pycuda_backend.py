"""`pycuda`: hand-written CUDA C kernels from `gpusim.cuda_kernels`, run with pycuda.

A `KernelSpec` names its CUDA C kernel as `cuda_c="file.cu:function"` (for an
env: the class attributes `cuda_c_reset` and `cuda_c_step`). The backend
compiles the file with nvcc to a cubin for the GPU's architecture, keeps the
cubin in the per-user compile cache (`gpusim.cache`), loads it into torch's
CUDA context (the device's primary context) and launches the function with
grid = replicas and block = agents.

Argument convention: the kernel takes a pointer for every array of `s` (the
env's arrays, in the field order of `env.arrays.views`), then every scalar of
`p` (the env's `params()`, in order), with C types matching the dtypes (see
`C_TYPES`). Names must match too: the first launch checks the C signature
against the arrays and parameters actually passed and names any difference.

Streams: pycuda launches only on its own streams or on the legacy default
stream (handle 0), and torch's default stream *is* the legacy default stream.
So a launch goes to the legacy default stream; when torch's current stream
is another one, that stream's pending work is made to precede the launch and
the launch to precede its later work (event waits on the device, no host
synchronisation), so the kernel is ordered exactly as if it ran on torch's
current stream.

The helpers above the backend class (kernel sources, signature parsing,
argument checks, finding nvcc) need neither pycuda nor a GPU; the CPU tests
of the CUDA C kernels use them too.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gpusim import cache
from gpusim.backends.base import Backend
from gpusim.errors import BackendError

INSTALL_HINT = ("install it with `pip install gpusim[pycuda]`; it needs the CUDA toolkit "
                "(nvcc on PATH or in $CUDA_HOME/bin) and an NVIDIA GPU with its driver")

# nvcc options of every cubin: no contraction of a * b + c into one fused
# multiply-add, so float32 results round as in the portable kernels.
NVCC_FLAGS = ("--fmad=false",)

# C type of a kernel argument -> numpy dtype of the array element or scalar.
C_TYPES = {
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "bool": np.dtype(np.bool_),
    "signed char": np.dtype(np.int8),
    "unsigned char": np.dtype(np.uint8),
    "short": np.dtype(np.int16),
    "unsigned short": np.dtype(np.uint16),
    "int": np.dtype(np.int32),
    "unsigned int": np.dtype(np.uint32),
    "long long": np.dtype(np.int64),
    "unsigned long long": np.dtype(np.uint64),
}
_C_ALIASES = {"gpusim_u64": "unsigned long long", "unsigned": "unsigned int",
              "long long int": "long long", "unsigned long long int": "unsigned long long",
              "short int": "short", "unsigned short int": "unsigned short"}
# struct-module format character of each scalar C type ("P" for pointers)
_STRUCT_CHARS = {"float": "f", "double": "d", "bool": "?", "signed char": "b",
                 "unsigned char": "B", "short": "h", "unsigned short": "H", "int": "i",
                 "unsigned int": "I", "long long": "q", "unsigned long long": "Q"}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}


# ---- kernel sources -------------------------------------------------------------------
def kernel_dir() -> Path:
    """The directory of the installed `gpusim.cuda_kernels` package (the .cu and .cuh files)."""
    from gpusim import cuda_kernels
    return Path(cuda_kernels.__file__).resolve().parent


def split_cuda_c(spec) -> tuple[str, str]:
    """("file.cu", "function") of a spec's CUDA C kernel; a clear error when it has none."""
    if spec.cuda_c is None:
        env = spec.name.split(".")[0]
        raise BackendError(f"env {env} has no CUDA C kernel (for kernel '{spec.name}'); "
                           "use backend numba or cpu")
    file, sep, function = spec.cuda_c.partition(":")
    if not sep or not file.endswith(".cu") or not function.isidentifier():
        raise BackendError(f"kernel '{spec.name}' names its CUDA C kernel as {spec.cuda_c!r}; "
                           "expected 'file.cu:function'")
    return file, function


def kernel_source(file: str) -> str:
    """The text of `file` from the kernel package."""
    path = kernel_dir() / file
    if Path(file).name != file or not path.is_file():
        raise BackendError(f"CUDA C file '{file}' is not in the gpusim.cuda_kernels package "
                           f"({kernel_dir()})")
    return path.read_text()


def headers_text() -> str:
    """All headers of the kernel package, named and concatenated (part of the cache key)."""
    return "".join(f"// {p.name}\n{p.read_text()}" for p in sorted(kernel_dir().glob("*.cuh")))


# ---- the C signature ---------------------------------------------------------------------
class CParam(NamedTuple):
    """One kernel parameter: its name, its C type (qualifiers dropped), whether it is a pointer."""
    name: str
    ctype: str
    pointer: bool

    def __str__(self):
        return f"{self.ctype}{'*' if self.pointer else ''} {self.name}"


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
                     r'(\w+)\s*\(([^)]*)\)')


def kernel_signatures(source: str) -> dict:
    """{function: [CParam, ...]} for every `extern "C" __global__ void` kernel in `source`."""
    found = {}
    for match in _KERNEL.finditer(_strip_comments(source)):
        name, text = match.group(1), match.group(2).strip()
        params = []
        for raw in ([] if text in ("", "void") else text.split(",")):
            pointer = raw.count("*")
            words = [w for w in raw.replace("*", " ").split() if w not in _QUALIFIERS]
            if pointer > 1 or len(words) < 2:
                raise BackendError(f"CUDA C kernel {name}: cannot read parameter '{raw.strip()}' "
                                   "(expected 'type name' or 'type* name')")
            ctype = " ".join(words[:-1])
            params.append(CParam(words[-1], _C_ALIASES.get(ctype, ctype), bool(pointer)))
        found[name] = params
    return found


def kernel_signature(source: str, function: str, file: str = "the source") -> list:
    signatures = kernel_signatures(source)
    if function not in signatures:
        raise BackendError(f"{file} has no kernel `extern \"C\" __global__ void {function}(...)` "
                           f"(kernels found: {', '.join(signatures) or 'none'})")
    return signatures[function]


# ---- arguments ------------------------------------------------------------------------------
class TensorPointer(int):
    """A tensor's data address, as a kernel receives it, remembering the tensor's dtype.

    It holds a reference to the tensor, so the memory outlives every launch
    that is given this pointer.
    """

    def __new__(cls, tensor: torch.Tensor):
        if not tensor.is_contiguous():
            raise BackendError("CUDA C kernels take contiguous tensors only")
        obj = super().__new__(cls, tensor.data_ptr())
        obj.tensor = tensor
        obj.dtype = np.dtype(str(tensor.dtype).removeprefix("torch."))
        return obj


def argument_format(params: list, s, p, where: str) -> str:
    """Check the arrays `s` and scalars `p` against a kernel's parameters; their struct format.

    The kernel must take a pointer for every field of `s` in order, then
    every field of `p` in order, with matching names and C types; a
    `BackendError` names the first difference.
    """
    given = [(name, value, True) for name, value in zip(s._fields, s)]
    given += [(name, value, False) for name, value in zip(p._fields, p)]
    rule = ("the kernel takes a pointer for every array (in the order of env.arrays.views), "
            "then every scalar parameter (in the order of env.params())")
    if len(given) != len(params):
        names = ", ".join(name for name, _, _ in given)
        raise BackendError(f"{where} has {len(params)} parameters but is launched with "
                           f"{len(given)} ({names}); {rule}")
    chars = []
    for k, (param, (name, value, is_array)) in enumerate(zip(params, given)):
        dtype = value.dtype if is_array else np.asarray(value).dtype
        if param.ctype not in C_TYPES:
            raise BackendError(f"{where}: parameter {k} '{param}' has an unsupported C type "
                               f"(supported: {', '.join(C_TYPES)})")
        expected = f"{_c_type_of(dtype)}{'*' if is_array else ''} {name}"
        if param.name != name or param.pointer != is_array or C_TYPES[param.ctype] != dtype:
            raise BackendError(f"{where}: parameter {k} is '{param}' but the env passes "
                               f"'{expected}' there; {rule}")
        chars.append("P" if is_array else _STRUCT_CHARS[param.ctype])
    return "".join(chars)


def _c_type_of(dtype) -> str:
    return next((c for c, d in C_TYPES.items() if d == dtype), f"<no C type for {dtype}>")


# ---- nvcc -------------------------------------------------------------------------------------
def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or $CUDA_PATH, else in the toolkit's default prefix."""
    found = shutil.which("nvcc")
    if found:
        return found
    prefixes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                os.path.join(os.sep, "usr", "local", "cuda")]
    for prefix in filter(None, prefixes):
        candidate = Path(prefix) / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    result = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    if result.returncode != 0:
        raise BackendError(f"'{nvcc} --version' failed: {result.stderr.strip()}")
    return result.stdout.strip()


def nvcc_command(nvcc: str, arch: str, source: Path, output: Path, kind: str = "-cubin") -> list:
    """The nvcc command line that compiles `source` to a cubin (or `--ptx`) for `arch`."""
    return [nvcc, kind, f"-arch={arch}", *NVCC_FLAGS, "-I", str(kernel_dir()),
            "-o", str(output), str(source)]


# ---- the backend --------------------------------------------------------------------------------
_PRIMARY_CONTEXTS: dict = {}  # device index -> pycuda Context (the retained primary context)


def _unavailable(why: str) -> BackendError:
    return BackendError(f"backend 'pycuda' is unavailable: {why}; {INSTALL_HINT} "
                        "(or use --backend numba or cpu)")


class PyCUDABackend(Backend):
    name = "pycuda"
    max_agents_per_env = 1024

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
        self._drv = drv
        self.nvcc = nvcc
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
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

    def synchronize(self):
        torch.cuda.synchronize(self.device)

    def is_resource_error(self, exc):
        if isinstance(exc, (self._drv.LaunchError, self._drv.MemoryError)):
            return True  # e.g. "too many resources requested for launch"
        return super().is_resource_error(exc)

    def free_memory(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

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
        return _Launch(self, kernel, params, f"CUDA C kernel {function} ({file})", max_threads)

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


class _Launch:
    """`launch(num_envs, num_agents, s, p)` of one CUDA C kernel, on torch's current stream."""

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
