"""Errors that users see: each carries a one-line message that says what to fix."""


class GpusimError(Exception):
    """Base class for every error gpusim raises on bad input or setup."""


class ConfigError(GpusimError, ValueError):
    """A configuration key is unknown or has an invalid value."""


class ArrayError(GpusimError, ValueError):
    """A named env array has the wrong dtype, shape, device or layout."""


class BackendError(GpusimError, RuntimeError):
    """A backend is unknown or cannot run on this machine."""
