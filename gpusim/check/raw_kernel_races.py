"""The race check for a raw numba CUDA kernel: `check_kernel_races`.

A raw kernel has no phases to replay one by one: its barriers are wherever it
calls `cuda.syncthreads()`. It runs once under numba's CUDA simulator (a Python
thread per CUDA thread, barriers real), in Python, over recording copies of its
arrays, with a stand-in for `numba.cuda` that counts each thread's barriers,
marks `cuda.atomic.*` accesses atomic and records `cuda.shared.array`s too. Two
accesses race when different threads of one block make them between the same
two barriers (the same count of barriers passed), at least one writes, and not
both are atomic; or when different blocks touch one element of a global array
and one of them writes (blocks run in any order). An index out of bounds is a
problem line as well.
"""
from __future__ import annotations

import dis
import inspect
import sys
import threading
import warnings

import numpy as np
import numba.cuda
import torch
from numba.cuda.simulator import jit as sim_jit
from numba.np import numpy_support
from numba.cuda.simulator.kernel import _get_kernel_context

from gpusim.check.kernel_replay import python_copy
from gpusim.check.recorder import Recorded, Recorder, array_meta, index_text, site, site_text


class ThreadRecorder(Recorder):
    """A Recorder for simulator threads: who runs, and how many barriers it passed, are
    per thread; segments are (block, barriers passed)."""
    LATER = "after a cuda.syncthreads()"

    def __init__(self, limit: int = 20):
        self._local = threading.local()
        self._lock = threading.RLock()
        self._segments = {}
        self._blocks = {}  # (name, flat) -> [writer block, reader block, another reader block]
        super().__init__(limit)

    thread = property(lambda self: _thread_id(), lambda self, value: None)
    atomic = property(lambda self: getattr(self._local, "atomic", False),
                      lambda self, value: setattr(self._local, "atomic", value))

    def barrier(self):  # segments are per thread: see passed_barrier
        pass

    def passed_barrier(self, count=1):
        self._local.barriers = getattr(self._local, "barriers", 0) + count

    @property
    def _seen_in_segment(self):
        key = (_thread_id()[0], getattr(self._local, "barriers", 0))
        return self._segments.setdefault(key, {})

    def read(self, meta, flat):
        with self._lock:
            super().read(meta, flat)
            self._across_blocks(meta, flat, write=False)

    def write(self, meta, flat):
        with self._lock:
            super().write(meta, flat)
            self._across_blocks(meta, flat, write=True)

    def _across_blocks(self, meta, flat, write):
        if meta.scope == "shared" or self.atomic:
            return
        block = _thread_id()[0]
        entry = self._blocks.setdefault((meta.name, flat), [None, None, None])
        others = [b for b in entry if b is not None and b != block]
        if (write and others) or (entry[0] is not None and entry[0] != block):
            other = entry[0] if entry[0] is not None and entry[0] != block else others[0]
            verb = "writes" if write else "reads"
            self._problem("blocks", meta, f"block {block} {verb} {index_text(meta, flat)}, which "
                          f"block {other} also touches", site_text(site(4)),
                          "blocks run in any order and cannot wait for each other; give each "
                          "block its own entries")
        if write and entry[0] is None:
            entry[0] = block
        elif not write:
            if entry[1] is None:
                entry[1] = block
            elif entry[1] != block and entry[2] is None:
                entry[2] = block


def _thread_id():
    current = threading.current_thread()
    block, thread = getattr(current, "blockIdx", None), getattr(current, "threadIdx", None)
    if block is None:
        return (0, 0)
    b = block.x if (block.y, block.z) == (0, 0) else tuple(block)
    t = thread.x if (thread.y, thread.z) == (0, 0) else tuple(thread)
    return (b, t)


class _Atomics:
    """`cuda.atomic` whose accesses the recorder marks atomic."""

    def __init__(self, recorder):
        self._recorder = recorder

    def __getattr__(self, name):
        op = getattr(_get_kernel_context().atomic, name)

        def atomic(*args):
            self._recorder.atomic = True
            try:
                return op(*args)
            finally:
                self._recorder.atomic = False
        return atomic


class _Shared:
    """`cuda.shared.array`: one recorded array per block and line of the kernel."""

    def __init__(self, recorder):
        self._recorder, self._arrays = recorder, {}

    def array(self, shape, dtype, alignment=None):
        frame = sys._getframe(1)
        where = (frame.f_code.co_filename, frame.f_lineno)
        key = (_thread_id()[0], where)
        with self._recorder._lock:
            if key not in self._arrays:
                if isinstance(dtype, numba.types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                data = np.zeros(shape, dtype=dtype)
                meta = array_meta(_shared_name(frame, where), "shared", data.shape)
                self._arrays[key] = Recorded.of(data, meta, self._recorder)
            return self._arrays[key]


def _shared_name(frame, where) -> str:
    """`shared hits`, for `hits = cuda.shared.array(...)` in the kernel: the name the
    call's result is stored under (the bytecode after the call)."""
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset > frame.f_lasti and instruction.opname.startswith("STORE_"):
            return f"shared {instruction.argval}"
    return f"a shared array ({site_text(where)})"


class _RecordingCuda:
    """Stands in for `numba.cuda` inside the kernel and its device functions."""

    def __init__(self, recorder):
        self._recorder = recorder
        self.atomic = _Atomics(recorder)
        self.shared = _Shared(recorder)

    def syncthreads(self):
        self._recorder.passed_barrier()
        _get_kernel_context().syncthreads()

    def _counted(self, name, passes):
        def sync(value):
            self._recorder.passed_barrier(passes)
            return getattr(_get_kernel_context(), name)(value)
        return sync

    def __getattr__(self, name):
        if name in ("syncthreads_count", "syncthreads_and", "syncthreads_or"):
            return self._counted(name, 2)
        context = _get_kernel_context()
        return getattr(numba.cuda if context is None else context, name)


def check_kernel_races(kernel, grid, block, *args, limit: int = 20) -> list:
    """Run raw numba CUDA kernel `kernel` (a `@cuda.jit` function, or a plain one) once on
    `grid` blocks of `block` threads under numba's CUDA simulator, on copies of `args`
    (torch tensors and numpy arrays, named tuples of them such as `env.arrays.views`,
    scalars); the problems found, one line each: races, and indices out of bounds.
    Nothing is written to the arguments."""
    recorder = ThreadRecorder(limit)
    names = list(inspect.signature(getattr(kernel, "py_func", kernel)).parameters)
    copies = _Copies(recorder)
    call = [copies.of(arg, names[k] if k < len(names) else f"arg{k}")
            for k, arg in enumerate(args)]
    fn = python_copy(kernel, {numba.cuda: _RecordingCuda(recorder)})
    name = getattr(getattr(kernel, "py_func", kernel), "__name__", "kernel")
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            sim_jit(fn)[grid, block](*call)
    except IndexError:
        if not recorder.faults:
            raise
        recorder.problems.append(recorder.faults[0])
    return [f"{p.what}, in kernel '{name}' ({p.where}): {p.advice}" for p in recorder.problems]


class _Copies:
    """Recorded copies of a kernel's arguments; views of one memory share one copy."""

    def __init__(self, recorder):
        self.recorder, self.by_memory = recorder, {}

    def of(self, arg, name):
        if isinstance(arg, tuple) and hasattr(arg, "_fields"):
            return type(arg)(*(self.of(v, f) for f, v in zip(arg._fields, arg)))
        if isinstance(arg, torch.Tensor):
            arg = arg.detach().cpu().numpy()
        if not isinstance(arg, np.ndarray) or arg.ndim == 0:
            return arg
        key = (arg.__array_interface__["data"][0], arg.shape, arg.dtype.str)
        if key not in self.by_memory:
            meta = array_meta(name, "global-memory", arg.shape)
            self.by_memory[key] = Recorded.of(arg.copy(), meta, self.recorder)
        return self.by_memory[key]


