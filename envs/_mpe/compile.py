"""`jit`: numba.jit for the MPE phases and their helpers.

They are called only from compiled kernels, never from Python, so numba
need not build the Python-callable wrappers it otherwise makes for every
function and signature. Those wrappers unpack the whole array namedtuple `s`
and cost about half of a kernel's CPU compile time. The CUDA target ignores
the two options (device functions have no such wrappers), and the simulator
runs `py_func`.
"""
import numba


def jit(fn):
    return numba.jit(nopython=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)(fn)
