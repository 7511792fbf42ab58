"""Named env arrays: torch tensors on the run's device, viewed zero-copy by kernels."""
from __future__ import annotations

import collections
import hashlib
import re
from dataclasses import dataclass

import numpy as np
import torch

from gpusim.errors import ArrayError

# scope -> leading dimensions of the array
_SCOPES = ("agent", "env", "global")


@dataclass(frozen=True)
class ArraySpec:
    """One named array: dtype, trailing shape, and what it is indexed by first.

    scope "agent": (num_envs, num_agents, *shape); "env": (num_envs, *shape);
    "global": shape alone (constant tables). `state` arrays are what
    `get_state` / `set_state` read and inject.
    """
    dtype: torch.dtype
    shape: tuple = ()
    scope: str = "agent"
    state: bool = False

    def full_shape(self, num_envs: int, num_agents: int) -> tuple:
        lead = {"agent": (num_envs, num_agents), "env": (num_envs,), "global": ()}[self.scope]
        return lead + tuple(self.shape)


_tuple_types: dict = {}


def namedtuple_type(kind: str, names: tuple):
    """One namedtuple class per field list, so numba compiles a kernel once per layout.

    The class is a global of this module under a name derived from its fields,
    so it pickles by reference: numba's on-disk cache keys kernels by argument
    types, and a class pickled by value would never match in the next process.
    """
    key = (kind, names)
    if key not in _tuple_types:
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
        cls = collections.namedtuple(f"{kind}_{digest}", names, module=__name__)
        globals()[cls.__name__] = cls
        _tuple_types[key] = cls
    return _tuple_types[key]


def __getattr__(name):
    """A stand-in for a layout class another process built, so a numba cache index loads.

    A kernel's on-disk cache index lists every layout it was compiled for
    (another env may share the same phases); unpickling it needs all their
    classes. Entries naming a stand-in never match this process's layouts.
    """
    if re.fullmatch(r"[A-Za-z]\w*_[0-9a-f]{12}", name):
        cls = collections.namedtuple(name, (), module=__name__)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DeviceArrays:
    """The tensors of one env instance, and their kernel views as one namedtuple."""

    @staticmethod
    def nbytes(specs: dict, num_envs: int, num_agents: int) -> int:
        """What allocating `specs` would take, before allocating it."""
        return sum(int(np.prod(spec.full_shape(num_envs, num_agents), dtype=object))
                   * torch.empty((), dtype=spec.dtype).element_size() for spec in specs.values())

    def __init__(self, specs: dict, num_envs: int, num_agents: int, backend,
                 aliases: dict | None = None):
        """`aliases`: extra kernel-view names for arrays of `specs` (alias -> array name),
        so gpusim's own phases can read an env's array under a fixed name."""
        for name, spec in specs.items():
            if spec.scope not in _SCOPES:
                raise ArrayError(f"array '{name}' has unknown scope '{spec.scope}'")
        self.specs = dict(specs)
        self.backend = backend
        self.tensors = {name: torch.zeros(spec.full_shape(num_envs, num_agents),
                                          dtype=spec.dtype, device=backend.device)
                        for name, spec in self.specs.items()}
        aliases = aliases or {}
        self.tensors.update({alias: self.tensors[name] for alias, name in aliases.items()})
        fields = tuple(self.specs) + tuple(aliases)
        self.views = namedtuple_type("Arrays", fields)(
            *(backend.view(self.tensors[aliases.get(n, n)]) for n in fields))

    def __getitem__(self, name) -> torch.Tensor:
        return self.tensors[name]

    def state_names(self) -> tuple:
        return tuple(n for n, s in self.specs.items() if s.state)

    def write(self, name: str, value):
        """Copy `value` into array `name` after checking dtype, shape and layout."""
        self.tensors[name].copy_(self.checked(name, value))

    def checked(self, name: str, value) -> torch.Tensor:
        """`value` as a tensor that fits array `name` (dtype, shape, layout), or ArrayError."""
        if name not in self.tensors:
            raise ArrayError(f"unknown array '{name}' (known: {', '.join(self.specs)})")
        target = self.tensors[name]
        if isinstance(value, np.ndarray):
            if not value.flags.c_contiguous:
                raise ArrayError(f"array '{name}' must be contiguous")
            value = torch.from_numpy(value) if value.flags.writeable else torch.tensor(value)
        if not isinstance(value, torch.Tensor):
            raise ArrayError(f"array '{name}' must be a torch tensor or numpy array, "
                             f"got {type(value).__name__}")
        if value.dtype != target.dtype:
            raise ArrayError(f"array '{name}' must have dtype {target.dtype}, got {value.dtype}")
        if value.shape != target.shape:
            raise ArrayError(f"array '{name}' must have shape {tuple(target.shape)}, "
                             f"got {tuple(value.shape)}")
        if not value.is_contiguous():
            raise ArrayError(f"array '{name}' must be contiguous")
        return value
