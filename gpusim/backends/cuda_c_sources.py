"""The CUDA C kernel sources and the arguments they are launched with; no GPU needed.

- Sources: a spec's `cuda_c = "file.cu:function"` is found beside the module
  of the env that names it (relative paths), as given (absolute paths), or
  in `gpusim.cuda_kernels` (gpusim's own kernels and shared headers); the
  headers a source includes are read for the compile cache's key.
- The argument list is generated, never written by hand: `args_header`
  writes `gpusim_env_args.cuh` from the arrays and scalars actually passed:
  `GPUSIM_ENV_PARAMS` (the kernel's parameter list), `GpusimEnvArgs` (a
  struct with a field per array and scalar) and `GPUSIM_ENV_ARGS` (that
  struct, filled). `gpusim_env.cuh` gives the replica and agent indices, the
  agent's RNG stream and auto-reset.
- The signature check stays as the safety net: `argument_format` checks the
  kernel's parameters (the generated list, or one written out) against the
  arrays `s` and scalars `p` passed, in order, names and C types.

Compiling them is gpusim.backends.cuda_c's part.
"""
from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gpusim.errors import BackendError

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
# ctypes type of each scalar C type (for launchers that pack arguments themselves)
C_CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "bool": ctypes.c_bool,
            "signed char": ctypes.c_byte, "unsigned char": ctypes.c_ubyte,
            "short": ctypes.c_short, "unsigned short": ctypes.c_ushort, "int": ctypes.c_int,
            "unsigned int": ctypes.c_uint, "long long": ctypes.c_longlong,
            "unsigned long long": ctypes.c_ulonglong}
# struct-module format character of each scalar C type ("P" for pointers)
_STRUCT_CHARS = {"float": "f", "double": "d", "bool": "?", "signed char": "b",
                 "unsigned char": "B", "short": "h", "unsigned short": "H", "int": "i",
                 "unsigned int": "I", "long long": "q", "unsigned long long": "Q"}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}
GENERATED_HEADER = "gpusim_env_args.cuh"
PARAMS_MACRO = "GPUSIM_ENV_PARAMS"

# ---- kernel sources -------------------------------------------------------------------
def kernel_dir() -> Path:
    """The directory of the installed `gpusim.cuda_kernels` package (the .cu and .cuh files)."""
    from gpusim import cuda_kernels
    return Path(cuda_kernels.__file__).resolve().parent


def split_cuda_c(spec) -> tuple[str, str]:
    """("file.cu", "function") of a spec's CUDA C kernel; a clear error when it has none."""
    if spec.cuda_c is None:
        env = spec.name.split(".")[0]
        why = f": {spec.no_cuda_c}" if spec.no_cuda_c else ""
        raise BackendError(f"env {env} has no CUDA C kernel (for kernel '{spec.name}'){why}; "
                           "use backend numba or cpu")
    file, sep, function = spec.cuda_c.partition(":")
    if not sep or not file.endswith(".cu") or not function.isidentifier():
        raise BackendError(f"kernel '{spec.name}' names its CUDA C kernel as {spec.cuda_c!r}; "
                           "expected 'file.cu:function'")
    return file, function


def locate(spec) -> tuple[Path, str]:
    """(the .cu file, the function) of a spec's CUDA C kernel.

    A relative path is looked for beside the module of the env that names it
    (`spec.cuda_c_dir`), then in `gpusim.cuda_kernels`; an absolute one is
    taken as it is. A missing file is one error naming every place looked in.
    """
    file, function = split_cuda_c(spec)
    path = Path(file)
    places = [path] if path.is_absolute() else \
        [Path(d) / path for d in (spec.cuda_c_dir, kernel_dir()) if d is not None]
    for place in places:
        if place.is_file():
            return place.resolve(), function
    raise BackendError(f"CUDA C file '{file}' of kernel '{spec.name}' not found (looked in: "
                       f"{', '.join(str(p) for p in places)})")


def kernel_source(file: str) -> str:
    """The text of `file` from the kernel package."""
    path = kernel_dir() / file
    if Path(file).name != file or not path.is_file():
        raise BackendError(f"CUDA C file '{file}' is not in the gpusim.cuda_kernels package "
                           f"({kernel_dir()})")
    return path.read_text()


def include_dirs(source: Path, generated: Path | None = None) -> list:
    """Where a source's `#include "..."` are found: the generated header's directory, the
    source's own directory, then gpusim's shared headers."""
    return [d for d in (generated, source.parent, kernel_dir()) if d is not None]


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def included_headers(source_text: str, dirs: list, _seen=None) -> dict:
    """{path: text} of every header `source_text` includes with quotes, recursively."""
    seen = {} if _seen is None else _seen
    for name in _INCLUDE.findall(_strip_comments(source_text)):
        found = next((Path(d) / name for d in dirs if (Path(d) / name).is_file()), None)
        if found is not None and found not in seen:
            seen[found] = found.read_text()
            included_headers(seen[found], dirs, seen)
    return seen


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


def kernel_signatures(source: str, generated: list | None = None) -> dict:
    """{function: [CParam, ...]} for every `extern "C" __global__ void` kernel in `source`.

    A kernel whose parameter list is `GPUSIM_ENV_PARAMS` gets `generated`, the
    parameters of the generated header (see `header_params`).
    """
    found = {}
    for match in _KERNEL.finditer(_strip_comments(source)):
        name, text = match.group(1), match.group(2).strip()
        if text == PARAMS_MACRO:
            if generated is None:
                raise BackendError(f"CUDA C kernel {name} takes {PARAMS_MACRO}, which only "
                                   "exists for a launch with an env's arrays and parameters")
            found[name] = list(generated)
            continue
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


def kernel_signature(source: str, function: str, file: str = "the source",
                     generated: list | None = None) -> list:
    signatures = kernel_signatures(source, generated)
    if function not in signatures:
        raise BackendError(f"{file} has no kernel `extern \"C\" __global__ void {function}(...)` "
                           f"(kernels found: {', '.join(signatures) or 'none'})")
    return signatures[function]


# ---- the generated argument list ---------------------------------------------------------
def launch_signature(source: Path, function: str, s, p, what: str) -> tuple[str, list, str]:
    """(generated header, the kernel's parameters, their struct format) for launching
    `function` of `source` with arrays `s` and scalars `p`: the signature is checked."""
    header = args_header(s, p, what)
    params = kernel_signature(source.read_text(), function, source.name, header_params(s, p))
    return header, params, argument_format(params, s, p, f"CUDA C kernel {function} "
                                                         f"({source.name})")



def header_params(s, p) -> list:
    """The parameters a kernel takes for arrays `s` and scalars `p`: the argument convention."""
    return ([CParam(name, _c_type_of(value.dtype), True) for name, value in zip(s._fields, s)]
            + [CParam(name, _c_type_of(np.asarray(value).dtype), False)
               for name, value in zip(p._fields, p)])


def env_args_header(env) -> str:
    """The generated header of an env's kernels (to compile one by hand)."""
    return args_header(env.arrays.views, env._params, env.name)  # `what`: for errors only


def args_header(s, p, what: str = "this launch") -> str:
    """The text of `gpusim_env_args.cuh` for arrays `s` and scalars `p` (one text per
    layout, so every kernel of a file compiles once); `what` names them in errors."""
    params = header_params(s, p)
    unknown = [str(x) for x in params if x.ctype not in C_TYPES]
    if unknown:
        raise BackendError(f"{what}: no C type for {', '.join(unknown)}")
    decls = [f"{x.ctype}{'*' if x.pointer else ''} {x.name}" for x in params]
    lines = [f"// {GENERATED_HEADER}: generated by gpusim; do not edit.",
             "// The kernel parameters of the env's arrays (in the order of env.arrays.views),",
             "// then of its scalar parameters (in the order of env.params()).",
             "#pragma once", "",
             f"#define {PARAMS_MACRO} \\",
             ",\\\n".join(f"    {d}" for d in decls), "",
             "struct GpusimEnvArgs {", *(f"    {d};" for d in decls), "};", "",
             "// GpusimEnvArgs filled from the kernel's parameters",
             f"#define GPUSIM_ENV_ARGS (GpusimEnvArgs{{{', '.join(x.name for x in params)}}})",
             "", "// which optional arrays this layout has (gpusim_env.cuh's auto-reset)",
             *(f"#define GPUSIM_HAS_{x.name.upper()} 1" for x in params if x.pointer), ""]
    return "\n".join(lines)


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
