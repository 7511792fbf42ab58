"""The CUDA C toolchain of the `pycuda` backend; it needs neither pycuda nor a GPU.

Kernel sources (`gpusim.cuda_kernels`), their C signatures and C types, the
check of launch arguments against a signature, and nvcc (finding it, its
command line). The CPU tests of the CUDA C kernels use them too.

Argument convention: a kernel takes a pointer for every array of `s` (the
env's arrays, in the field order of `env.arrays.views`), then every scalar of
`p` (the env's `params()`, in order), with C types matching the dtypes (see
`C_TYPES`). Names must match too: `argument_format` checks the C signature
against the arrays and parameters actually passed and names any difference.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gpusim.errors import BackendError

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
