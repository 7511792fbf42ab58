"""The per-user compile cache: compiled kernels live here, never in the package.

Location: `$GPUSIM_CACHE_DIR`, else `$XDG_CACHE_HOME/gpusim`, else
`~/.cache/gpusim`. Its directories are created with mode 0700, and one that
another user owns or can write to is refused: the cache holds code that
runs. An entry is a directory named by a hash of everything the compiled
code depends on (source, layout, architecture, compiler version), so a
change anywhere gives a new entry and stale code is never loaded. Files are
written to a temporary name and renamed into place, so two runs compiling the
same entry at once never see each other's half-written files.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import stat
import sys
import tempfile
import types
from pathlib import Path

from gpusim.errors import GpusimError

ENV_VAR = "GPUSIM_CACHE_DIR"
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """The cache directory (created); refuses to sit inside the installed package."""
    if os.environ.get(ENV_VAR):
        root = Path(os.environ[ENV_VAR]).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        root = Path(base) / "gpusim"
    root = root.resolve()
    if root == PACKAGE_DIR or PACKAGE_DIR in root.parents:
        raise GpusimError(f"the compile cache must not live inside the gpusim package "
                          f"({root}); set {ENV_VAR} to another directory")
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        return private_dir(root)
    except OSError as exc:
        raise GpusimError(f"cannot create the compile cache {root} ({exc.strerror}); "
                          f"set {ENV_VAR} to a writable directory") from None


def private_dir(path: Path) -> Path:
    """`path`, created with mode 0700, or refused unless it is ours and no one else can write it.

    The cache holds code this process imports and runs: a directory another
    user can write to lets them replace it.
    """
    path.mkdir(mode=0o700, exist_ok=True)
    if not hasattr(os, "getuid"):  # no POSIX ownership to check
        return path
    info = path.stat()
    if info.st_uid != os.getuid():
        raise GpusimError(f"the compile cache directory {path} belongs to another user "
                          f"(uid {info.st_uid}); set {ENV_VAR} to a directory of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise GpusimError(f"the compile cache directory {path} is writable by other users "
                          f"(mode {stat.filemode(info.st_mode)}); run `chmod go-w {path}` or "
                          f"set {ENV_VAR} to a private directory")
    return path


def key_hash(*parts) -> str:
    """A short stable hash of `parts` (strings, bytes, or anything with a stable repr)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:24]


def entry_dir(kind: str, *key_parts) -> Path:
    """The directory of one cache entry, e.g. `entry_dir("cpu", source, layout)` (created)."""
    return private_dir(private_dir(cache_root() / kind) / key_hash(*key_parts))


def atomic_write(path: Path, data: bytes | str):
    """Write `path` via a temporary file in the same directory and an atomic rename."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def source_fingerprint(fn, _seen=None) -> str:
    """The source of `fn` and of every jit function it reaches through its globals.

    numba's own cache checks only the file of the function it compiles; a
    phase edited in another module would otherwise load stale machine code.
    """
    seen = set() if _seen is None else _seen
    py = getattr(fn, "py_func", fn)
    if not isinstance(py, types.FunctionType) or py in seen:
        return ""
    seen.add(py)
    try:
        text = inspect.getsource(py)
    except (OSError, TypeError):
        text = repr(py.__code__.co_code) + repr(py.__code__.co_consts)
    parts = [f"{py.__module__}.{py.__qualname__}\n{text}"]
    for value in py.__globals__.values():
        if hasattr(value, "py_func"):
            parts.append(source_fingerprint(value, seen))
    return "\n".join(p for p in parts if p)


def importable_name(fn) -> tuple[str, str] | None:
    """(module, name) under which `fn` can be imported again, or None (e.g. a local function)."""
    py = getattr(fn, "py_func", fn)
    module_name, name = getattr(py, "__module__", None), getattr(py, "__qualname__", "")
    module = sys.modules.get(module_name)
    if module is None or module_name == "__main__" or "." in name or "<" in name:
        return None
    return (module_name, name) if getattr(module, name, None) is fn else None


def generated_module(kind: str, source: str, callables: dict, header: str, footer: str,
                     key_parts: tuple):
    """Import generated kernel source from the cache, so numba can cache what it compiles.

    The module imports each callable by name, defines the generated source,
    then runs `footer` (which decorates the kernel). Returns None when some
    callable cannot be imported by name (a function defined inside another
    function, or in `__main__`): such kernels are compiled in memory instead.
    """
    imports = []
    for alias, fn in callables.items():
        where = importable_name(fn)
        if where is None:
            return None
        imports.append(f"from {where[0]} import {where[1]} as {alias}")
    text = "\n".join(["# Generated by gpusim; safe to delete.", header, *imports, "",
                      source, footer, ""])
    fingerprints = [source_fingerprint(fn) for fn in callables.values()]
    directory = entry_dir(kind, text, *fingerprints, *key_parts)
    module_name = f"gpusim_kernel_{kind}_{directory.name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = directory / "kernel.py"
    if not path.is_file() or path.read_text() != text:
        atomic_write(path, text)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # numba's cache finds the module again by name
    spec.loader.exec_module(module)
    return module
