"""How many threads torch (the learner) and numba (the env kernels) run on a CPU.

A run alternates numba-parallel env steps with torch forwards, and then
trains: each pool idles while the other works. An extra thread pays only
when one parallel region holds enough work to hide waking it, and on a
shared CPU it can cost more than it gains: a region waits for its slowest
thread, and a thread whose core another process holds is slow. So a pool
gets one thread unless its work is large (the thresholds below, measured
with `benchmarks/calibrations/threads.py`), and never more than the cores the process
may use (affinity, cgroup quota, shared by the processes of this machine).

What the user sets wins over the work: `trainer.torch_threads` (the
learner's count, checked against the cores), then `OMP_NUM_THREADS` for
torch and `NUMBA_NUM_THREADS` for numba (capped at the cores).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

# torch gains from a second thread (x1.6 to x1.9 measured) only from about 2**30
# multiply-adds in one layer call (256 wide x 16,384 rows, 512 x 4,096, 1024 x 1,024);
# below 2**26 it never did (x0.4 to x1.0), and in between it depends on the shapes.
TORCH_PARALLEL_MACS = 2 ** 30
# A population's update multiplies every member's layer at once (one batched product,
# which torch splits between threads by member) and runs each elementwise step over every
# member's rows: a second thread gained x1.7 on the products and x1.8 on tanh from 2
# members x 512 rows x 64x64 (2**22 multiply-adds), and x1.1-1.15 on a whole run of 8
# cartpole members (one-off timings, docs/benchmarks.md "Populations").
POPULATION_PARALLEL_MACS = 2 ** 22
# numba's env step gains from a second thread (x1.9) at 64 tag_continuous replicas
# (500k observation values written per step, 7 ms a step on one thread); 16 replicas
# (125k) and cartpole's steps (up to 65k at 16,384 replicas) did not gain.
NUMBA_PARALLEL_OBS_VALUES = 2 ** 18


@dataclass(frozen=True)
class Work:
    """What a run asks of the CPU per call, the thread choice's input."""
    rollout_macs: int = 0      # multiply-adds of the largest layer call in a rollout step
    update_macs: int = 0       # ... in a training chunk
    env_obs_values: int = 0    # observation values one env step writes (replicas x agents
                               # x obs size): the env kernel's work, roughly
    members: int = 1           # a population's members: its update's products are batched


@dataclass(frozen=True)
class ThreadPlan:
    """Thread counts per phase: the rollout (env steps and acting) and the update."""
    rollout_torch: int = 1
    update_torch: int = 1
    numba: int = 1
    why: str = ""

    @property
    def most(self) -> int:
        return max(self.rollout_torch, self.update_torch, self.numba)


def plan(cores: int, work: Work | None = None, torch_threads: int = 0,
         environ=os.environ) -> ThreadPlan:
    """The counts for `work` (None: not known yet, one thread each) on `cores` cores.

    `torch_threads` (trainer.torch_threads, 0: decide) must not exceed `cores`.
    """
    from gpusim.cpu_threads import user_count
    work = work or Work()
    omp, numba_env = user_count("OMP_NUM_THREADS", environ), \
        user_count("NUMBA_NUM_THREADS", environ)

    def for_torch(macs: int, least: int = TORCH_PARALLEL_MACS) -> int:
        if torch_threads:
            return torch_threads
        if omp is not None:
            return min(omp, cores)
        return cores if macs >= least else 1

    numba = min(numba_env, cores) if numba_env is not None else \
        cores if work.env_obs_values >= NUMBA_PARALLEL_OBS_VALUES else 1
    torch_why = "trainer.torch_threads" if torch_threads else \
        "OMP_NUM_THREADS" if omp is not None else "the work"
    return ThreadPlan(rollout_torch=for_torch(work.rollout_macs),
                      update_torch=for_torch(work.update_macs, POPULATION_PARALLEL_MACS
                                             if work.members > 1 else TORCH_PARALLEL_MACS),
                      numba=numba,
                      why=f"{cores} cores; torch from {torch_why}, numba from "
                          f"{'NUMBA_NUM_THREADS' if numba_env is not None else 'the work'}")
