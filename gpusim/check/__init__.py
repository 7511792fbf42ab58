"""`check_env`: validate an environment the way gpusim will use it.

    from gpusim.check import check_env
    result = check_env(env)                        # prints one PASS/FAIL/WARN line per check
    assert result.ok, result

Each check, the rollout behind them and the reference protocol: gpusim.check.run_checks.
Also here: `check_kernel_races` (a raw numba CUDA kernel under numba's simulator),
`check_cuda_c_races` (an env's CUDA C kernels under ThreadSanitizer), and
`first_nonfinite` / `env_nonfinite_message`, which name the first NaN or Inf of a
rollout's tensors.

The parts beneath, one module each:

- `run_checks`: `check_env`, the checks run in order, the env restored after;
  `report`: `Check`, `CheckResult` and `CHECKS`, their order; `argument_checks`:
  check_env's own arguments, refused at once;
- `rollout_facts`: one rollout and the initial states, kept as compact facts;
  `checks`: each check of those facts or of the env, one function each; `compare`:
  actions, values as reported, two envs stepped in lockstep; `coverage`: the ways
  an episode ends that the rollout never reached;
- `bounds`: the `cpu` backend's kernels compiled with bounds checks, an index out
  of bounds replayed and named;
- `races` (the reset and steps replayed thread by thread), over `recorder`
  (recording arrays and the race rules) and `kernel_replay` (a portable kernel run
  in Python, phase by phase, agent by agent);
- `static_races`, over `static_walk`: every agent phase's source read, not run,
  for writes several agents may reach at once;
- `raw_kernel_races`: a raw numba CUDA kernel; `cuda_c_races`, over `host_shim`
  (CUDA C on the CPU, one thread per GPU thread): CUDA C kernels;
- `nonfinite`: the first NaN or Inf among named tensors.
"""
from __future__ import annotations

from gpusim.check.nonfinite import env_nonfinite_message, first_nonfinite
from gpusim.check.report import CHECKS, Check, CheckResult
from gpusim.check.run_checks import check_env

__all__ = ["CHECKS", "Check", "CheckResult", "check_cuda_c_races", "check_env",
           "check_kernel_races", "env_nonfinite_message", "first_nonfinite"]


def __getattr__(name):
    """The checks that import heavier modules, imported when first asked for (numba's
    CUDA simulator; the CUDA C toolchain)."""
    if name == "check_kernel_races":
        from gpusim.check.raw_kernel_races import check_kernel_races
        return check_kernel_races
    if name == "check_cuda_c_races":
        from gpusim.check.cuda_c_races import check_cuda_c_races
        return check_cuda_c_races
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
