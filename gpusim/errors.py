"""Errors that users see: each carries a one-line message that says what to fix."""
from __future__ import annotations

import contextlib
import os
import re


class GpusimError(Exception):
    """Base class for every error gpusim raises on bad input or setup."""
    exit_code = 2  # the CLI's: bad input


class DoesNotFit(GpusimError):
    """A run ran out of device memory (or launch resources) while training."""
    exit_code = 1  # not bad input as such: the run failed


class ConfigError(GpusimError, ValueError):
    """A configuration key is unknown or has an invalid value."""


class ArrayError(GpusimError, ValueError):
    """A named env array has the wrong dtype, shape, device or layout."""


class BackendError(GpusimError, RuntimeError):
    """A backend is unknown or cannot run on this machine."""


class StorageError(GpusimError, OSError):
    """A file could not be read or written (a full disk, a read-only directory)."""


class NotEnoughMemory(GpusimError, MemoryError):
    """An allocation that cannot fit the device, refused before it is tried."""


def exit_code(exc: BaseException) -> int:
    """The exit status a process ends with after `exc`: 2 bad input, 130 interrupted, else 1."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return getattr(exc, "exit_code", 1) if isinstance(exc, GpusimError) else 1


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # numba colours its messages where colorama is installed


def describe(exc: BaseException) -> str:
    """One line for an exception: the message for our own errors, else type and first line."""
    if isinstance(exc, GpusimError):
        return str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    lines = _ANSI.sub("", str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


@contextlib.contextmanager
def writing(path, cleanup=None):
    """Turn a failed write inside the block (a full disk, a read-only directory) into one
    line naming `path`; `cleanup()` first removes what the write left behind.

    torch.save reports a failed write as a RuntimeError of its own, with the
    OSError that caused it in its context: that OSError says why.
    """
    yield from _naming(path, "write", cleanup)


@contextlib.contextmanager
def reading(path):
    """Turn a failed read inside the block into one line naming `path`."""
    yield from _naming(path, "read", None)


def _naming(path, verb: str, cleanup):
    try:
        yield
    except Exception as exc:
        cause = None if isinstance(exc, GpusimError) else os_error(exc)  # ours: said already
        if cause is None:
            raise
        if cleanup is not None:
            with contextlib.suppress(OSError):
                cleanup()
        raise StorageError(f"cannot {verb} {path}: {cause.strerror or describe(cause)}") from None


def os_error(exc: BaseException) -> OSError | None:
    """`exc` if it is an OSError, else the first OSError among its causes and contexts."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


DEBUG_VAR = "GPUSIM_DEBUG"


def debug() -> bool:
    """Whether GPUSIM_DEBUG is set: errors then keep the full text of what caused them."""
    return bool(os.environ.get(DEBUG_VAR))


def env_code_failed(env_name: str, where: str, exc: BaseException) -> GpusimError:
    """The error for an exception raised by an env's own code (`where`: "setup()", ...)."""
    return GpusimError(f"env {env_name}: {where} raised {describe(exc)}{_debug_hint()}")


def phase_failed(env_name: str, spec, exc: BaseException) -> GpusimError:
    """The error for an exception raised inside a phase of kernel `spec` at launch.

    numba reports it as a SystemError ("... returned a result with an exception
    set") caused by the phase's own exception: the innermost frame of that
    cause that is one of the kernel's phases names it.
    """
    cause = exc.__cause__ or exc.__context__ or exc
    phases = _phase_code(spec)
    phase = None
    tb = cause.__traceback__
    while tb is not None:  # numba's frames are stand-ins: match by name and file
        code = tb.tb_frame.f_code
        if code.co_name in phases and _same_file(phases[code.co_name].co_filename,
                                                 code.co_filename):
            phase = code.co_name
        tb = tb.tb_next
    where = f"phase {phase!r} of kernel '{spec.name}'" if phase else f"kernel '{spec.name}'"
    return GpusimError(f"env {env_name}: {where} raised {describe(cause)}")


def compile_failed(spec, backend: str, exc: BaseException) -> str:
    """One line for kernel `spec` that does not compile: the compiler's first problem, the
    phase it is in, and a hint; with GPUSIM_DEBUG=1 the full text follows.

    numba's typing errors run to a dozen lines of pipeline stages: the line that
    says what is wrong comes first, and the first source location inside one of
    the kernel's phases says where.
    """
    text = _ANSI.sub("", str(exc))  # numba colours its messages where colorama is installed
    problem = next((line.strip() for line in text.splitlines()
                    if line.strip() and not _PIPELINE_LINE.match(line.strip())), text.strip())
    layout = _LAYOUT_TYPE.search(problem)
    problem = _LAYOUT_TYPE.sub(lambda m: f"of {_LAYOUT_NAMES[m.group(1)]}", problem)
    if layout is not None and "Unknown attribute" in problem:
        problem += f": {_UNKNOWN_HINT[layout.group(1)]}"
    where = ""
    phases = _phase_code(spec)
    for match in _SOURCE_LOCATION.finditer(text):
        path, line = match.group(1) or match.group(3), match.group(2) or match.group(4)
        phase = next((name for name, code in phases.items()
                      if _same_file(code.co_filename, path)
                      and int(line) in {n for _, _, n in code.co_lines() if n}), None)
        if phase is not None:
            where = f" in phase {phase!r} ({os.path.basename(path)}:{line})"
            break
    head = (f"compiling kernel '{spec.name}' for the {backend} backend failed{where}: "
            f"{type(exc).__name__}: {problem}")
    if debug():
        return f"{head}\n{text}"
    return f"{head} (set {DEBUG_VAR}=1 for the compiler's full message)"


def _phase_code(spec) -> dict:
    """{phase function name: its Python code object} of a KernelSpec's phases and guards."""
    found = {}
    for section in spec.sections:
        for fn in [section.guard] + [phase.fn for phase in section.phases]:
            code = getattr(getattr(fn, "py_func", fn), "__code__", None)
            if code is not None:
                found[code.co_name] = code
    return found


def _debug_hint() -> str:
    return "" if debug() else f" (set {DEBUG_VAR}=1 for the traceback)"


def _same_file(a: str, b: str) -> bool:
    """Whether two code paths name the same source file. Kernels loaded from the compile
    cache keep the path they were compiled from (another checkout of the same code, a
    deleted temporary folder): the file's name decides there."""
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return os.path.basename(a) == os.path.basename(b)


_PIPELINE_LINE = re.compile(r"^(Failed in .* pipeline|During: |File \"|<source elided>)")
# numba's locations: `File "path", line N:` and `typing of call at path (N)`
_SOURCE_LOCATION = re.compile(r'File "([^"]+)", line (\d+)|\bat (\S+) \((\d+)\)')
# numba names the env's layout types by their generated class: say what they are instead
_LAYOUT_TYPE = re.compile(r"of type (?:TupleRef\()?(Arrays|Params)_[0-9a-f]{12}\(.*\)")
_LAYOUT_NAMES = {"Arrays": "the env's arrays (s)", "Params": "the env's parameters (p)"}
# what to do about an attribute the layout lacks
_UNKNOWN_HINT = {"Arrays": "declare it in array_specs(), or check its name",
                 "Params": "make it a config field or a derived() value, or check its name"}
