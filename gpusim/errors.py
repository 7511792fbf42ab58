"""Errors that users see: each carries a one-line message that says what to fix."""


class GpusimError(Exception):
    """Base class for every error gpusim raises on bad input or setup."""
    exit_code = 2  # the CLI's: bad input


class ConfigError(GpusimError, ValueError):
    """A configuration key is unknown or has an invalid value."""


class ArrayError(GpusimError, ValueError):
    """A named env array has the wrong dtype, shape, device or layout."""


class BackendError(GpusimError, RuntimeError):
    """A backend is unknown or cannot run on this machine."""


class NotEnoughMemory(GpusimError, MemoryError):
    """An allocation that cannot fit the device, refused before it is tried."""


def exit_code(exc: BaseException) -> int:
    """The exit status a process ends with after `exc`: 2 bad input, 130 interrupted, else 1."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return getattr(exc, "exit_code", 1) if isinstance(exc, GpusimError) else 1


def describe(exc: BaseException) -> str:
    """One line for an exception: the message for our own errors, else type and first line."""
    if isinstance(exc, GpusimError):
        return str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()
