"""Validated configuration dataclasses loaded from YAML.

A config class is a plain dataclass whose fields carry their types; `from_dict`
checks every key and value and raises `ConfigError` naming the key.
A class may add a `check(self)` method for cross-field rules, raising
`ConfigError` itself.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import math
import re
import textwrap
import types
import typing
from pathlib import Path

import numpy as np
import yaml

from gpusim.errors import ConfigError

# A string key that takes on/off: YAML reads `off` (and no, false) as False, so a boolean
# given for a string key is the word its user wrote; the class's check() then validates it.
ON_OFF = {True: "on", False: "off"}


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key, mark):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.problem_mark = key, mark


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (the safe loader
    keeps the last value, silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, collections.abc.Hashable) and key in seen:
                raise DuplicateKey(key, key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(path) -> dict:
    """Read a YAML mapping (safe, no key given twice); errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except DuplicateKey as exc:
        raise ConfigError(f"{path}: key '{exc.key}' is given twice "
                          f"(line {exc.problem_mark.line + 1}); keep one") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def from_dict(cls, data: dict | None, section: str = ""):
    """Build config dataclass `cls` from a mapping, validating every key."""
    data = {} if data is None else data
    prefix = f"{section}." if section else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{section or cls.__name__}: expected a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise ConfigError(f"unknown config key '{prefix}{key}' "
                              f"(known: {', '.join(sorted(fields))})")
    hints = typing.get_type_hints(cls)
    values = {k: _coerce(f"{prefix}{k}", hints[k], v) for k, v in data.items()}
    config = cls(**values)
    if hasattr(config, "check"):
        config.check()
    return config


class EnvConfig:
    """Base of env config dataclasses: the dataclass's defaults are the env's defaults."""

    @classmethod
    def load(cls, path=None, **overrides):
        """The defaults, then the `env` section of YAML file `path` (if given), then keywords."""
        data = dict(load_yaml(path).get("env") or {}) if path is not None else {}
        data.update(overrides)
        return from_dict(cls, data, section="env")


def scalar_params(config, float_type) -> dict:
    """Every int, float and bool field of config dataclass instance `config`, by its own
    name, as a numpy scalar (int32, `float_type`, bool): what an env's kernels read as `p`
    (gpusim.env.Env.params). Fields of other types (tuples, optional values, text) are
    left out."""
    hints = typing.get_type_hints(type(config))
    out = {}
    for field in dataclasses.fields(config):
        kind, value = hints[field.name], getattr(config, field.name)
        if kind is bool:
            out[field.name] = np.bool_(value)
        elif kind is int:
            out[field.name] = np.int32(value)
        elif kind is float:
            out[field.name] = float_type(value)
    return out


def field_help(cls) -> dict:
    """{field: its description}: the comment written after the field in the class's source
    (continued on comment-only lines below it), for `--help`; "" where there is none."""
    fields = {f.name for f in dataclasses.fields(cls)}
    found = {}
    for owner in reversed(cls.__mro__):  # a subclass's comment on a field it redefines wins
        if owner is object or not dataclasses.is_dataclass(owner):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(owner))
        except (OSError, TypeError):
            continue
        current = None
        for line in source.splitlines():
            code, _, comment = line.partition("#")
            match = re.match(r"\s+(\w+)\s*:", code)
            if match and match.group(1) in fields:
                current = match.group(1)
                found[current] = comment.strip()
            elif current and not code.strip() and comment:  # a comment line continues it
                found[current] = f"{found[current]} {comment.strip()}".strip()
            else:
                current = None
    return {name: found.get(name, "") for name in (f.name for f in dataclasses.fields(cls))}


def to_dict(config) -> dict:
    return dataclasses.asdict(config)


def require(ok: bool, key: str, message: str):
    """Raise a ConfigError naming `key` unless `ok`."""
    if not ok:
        raise ConfigError(f"config key '{key}' {message}")


def _coerce(key, hint, value):
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        if isinstance(value, dict) and dict in args:  # a mapping its dataclass checks
            return dict(value)
        (hint,) = [a for a in args if a not in (type(None), dict)]
        return _coerce(key, hint, value)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        return tuple(_coerce(f"{key}[{n}]", args[0], v) for n, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        if not -2**63 <= value < 2**63:  # kernels and seeds take 64-bit integers
            raise ConfigError(f"config key '{key}' must fit in 64 bits, got {value}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        if not math.isfinite(value):  # 1e400 in YAML is inf: it would train on NaN
            raise ConfigError(f"config key '{key}' must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, bool):  # YAML 1.1 reads on/off/yes/no as booleans
            return ON_OFF[value]
        if not isinstance(value, str):
            raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {hint} for '{key}'")
