"""The race check: portable phases replayed thread by thread (gpusim.check.races), raw numba
CUDA kernels under the simulator (check_kernel_races), and the bounds-checked CPU kernels
that name an index out of bounds (gpusim.check.bounds).

- Every built-in env replays its reset and steps with no race reported.
- Each rule of docs/env_phases.md's "Avoiding races" fails on a mistake planted in
  tests/planted_env.py, in one line naming the agents, the array and its index, the
  phase and the source line.
- A raw kernel without its barrier, or with a lost update, is caught; an atomic
  update and a correct kernel are not; an index past the end is named.
- check_env's bounds-checked kernels are other compiled kernels: the env's own are
  back after it, unchecked.
"""
import numba
import numpy as np
import pytest
import torch
from numba import cuda

import gpusim
from gpusim.check import check_env, check_kernel_races
from gpusim.check.races import RaceWatch, races
from gpusim.check.rollout_facts import record_rollout
from planted_env import (GLOBAL_WRITE, OK, OTHER_REPLICA, OTHERS_ROW, READ_PAST_END,
                         READ_WHILE_WRITTEN, SHARED_WRITE, catch, move, pursuit, tally)


@pytest.mark.parametrize("name", gpusim.env_names())
def test_builtin_envs_replay_without_a_race(name):
    env = gpusim.make(name, num_envs=2, backend="cpu", seed=0)
    watch = RaceWatch(env)
    rollout = record_rollout(env, 40, 0, watch=watch)
    assert rollout.error is None
    message = races(watch)  # raises races.Failure with the problem's line
    assert message.startswith("no race in the reset and ") and watch.steps >= 1


@pytest.mark.parametrize("bug, message", [
    (SHARED_WRITE, "agent 1 writes leader[7], which agent 0 writes between the same two "
                   "barriers, in agent phase 'move' of kernel 'pursuit.step'"),
    (READ_WHILE_WRITTEN, "agent 1 writes x[7, 1], which agent 0 reads between the same two "
                         "barriers, in agent phase 'move' of kernel 'pursuit.step'"),
    (OTHERS_ROW, "agent 4 writes caught[7, 2], agent 2's entry, in agent phase 'catch'"),
    (OTHER_REPLICA, "agent 4 of replica 7 writes caught[0, 4], replica 0's entry, in agent "
                    "phase 'catch'"),
    (GLOBAL_WRITE, "agent 0 writes deltas[0] of a global array, shared by every replica, in "
                   "agent phase 'move'"),
])
def test_each_race_rule_fails_in_one_line(bug, message):
    result = check_env(pursuit(bug), steps=40, skip=("determinism",), verbose=False)
    assert [c.name for c in result.failed] == ["races"]
    line = result["races"].message
    assert line.startswith(message), line
    assert "(planted_env.py:" in line and "\n" not in line


def test_an_index_past_the_end_is_named_on_the_cpu():
    result = check_env(pursuit(READ_PAST_END), steps=20, verbose=False)
    assert result["step"].message.startswith(
        "at step 0, agent 4 of replica 0 reads x[0, 5]: index 5 is out of bounds for axis 1 "
        "of size 5 (x has shape (8, 5)), in agent phase 'move' of kernel 'pursuit.step' "
        "(planted_env.py:")


def test_check_env_leaves_the_env_with_its_own_unchecked_kernels():
    env = pursuit(OK, num_envs=2)
    kernels = env._reset_kernel, env._step_kernel
    check_env(env, steps=10, skip=("determinism",), verbose=False)
    assert (env._reset_kernel, env._step_kernel) == kernels
    assert not env._step_kernel.dispatcher.targetoptions.get("boundscheck")
    assert numba.core.config.BOUNDSCHECK is None
    # a run's kernel does not check: the same mistake goes unseen outside check_env
    broken = pursuit(READ_PAST_END, num_envs=2)
    broken.reset(seed=0)
    broken.step(torch.zeros((2, 5, 1), dtype=torch.int32))


# ---- raw numba CUDA kernels --------------------------------------------------------------
@cuda.jit
def count_on_goal(pos, goal, counts):
    env, agent = cuda.blockIdx.x, cuda.threadIdx.x
    hits = cuda.shared.array(64, numba.int32)
    hits[agent] = 1 if pos[env, agent] == goal[env] else 0
    cuda.syncthreads()
    if agent == 0:
        total = 0
        for k in range(cuda.blockDim.x):
            total += hits[k]
        counts[env] = total


@cuda.jit
def count_without_barrier(pos, goal, counts):
    env, agent = cuda.blockIdx.x, cuda.threadIdx.x
    hits = cuda.shared.array(64, numba.int32)
    hits[agent] = 1 if pos[env, agent] == goal[env] else 0
    if agent == 0:
        total = 0
        for k in range(cuda.blockDim.x):
            total += hits[k]
        counts[env] = total


@cuda.jit
def count_by_increment(pos, goal, counts):
    env, agent = cuda.blockIdx.x, cuda.threadIdx.x
    if pos[env, agent] == goal[env]:
        counts[env] += 1


@cuda.jit
def count_atomically(pos, goal, counts):
    env, agent = cuda.blockIdx.x, cuda.threadIdx.x
    if pos[env, agent] == goal[env]:
        cuda.atomic.add(counts, env, 1)


@cuda.jit
def count_into_the_next_replica(pos, goal, counts):
    env, agent = cuda.blockIdx.x, cuda.threadIdx.x
    if agent == 0:
        counts[env + 1] = pos[env, agent]


GOALS = (np.array([[1, 1, 2, 1], [0, 0, 0, 3]], dtype=np.int32), np.array([1, 0], np.int32))


@pytest.mark.parametrize("kernel, found", [
    (count_on_goal, None),
    (count_atomically, None),
    (count_without_barrier, "thread 1 of block 0 writes shared hits[1], which thread 0 of "
                            "block 0 reads between the same two barriers, in kernel "
                            "'count_without_barrier'"),
    (count_by_increment, "thread 1 of block 0 reads counts[0], which thread 0 of block 0 "
                         "writes between the same two barriers, in kernel "
                         "'count_by_increment'"),
    (count_into_the_next_replica, "thread 0 of block 1 writes counts[2]: index 2 is out of "
                                  "bounds for axis 0 of size 2 (counts has shape (2,))"),
])
def test_raw_kernels(kernel, found):
    counts = torch.zeros(2, dtype=torch.int32)
    problems = check_kernel_races(kernel, 2, 4, *GOALS, counts)
    if found is None:
        assert problems == []
    else:
        assert any(p.startswith(found) for p in problems), problems
        assert all("(test_check_races.py:" in p for p in problems)
    assert counts.tolist() == [0, 0]  # copies: nothing is written to the arguments


@cuda.jit
def pursuit_step(s, p, barrier):
    """Portable phases called from a raw kernel, as device functions."""
    env, agent = cuda.blockIdx.x, cuda.threadIdx.x
    move(env, agent, s, p)
    if barrier:
        cuda.syncthreads()
    catch(env, agent, s, p)
    cuda.syncthreads()
    if agent == 0:
        tally(env, s, p)


@pytest.mark.parametrize("barrier", [True, False])
def test_a_raw_kernel_over_an_envs_arrays(barrier):
    env = pursuit(OK, num_envs=2, catch_radius=0.5)  # runners are caught at once
    env.reset(seed=1)
    before = env.get_state()
    problems = check_kernel_races(pursuit_step, env.num_envs, env.num_agents, env.arrays.views,
                                  env._params, barrier)
    if barrier:
        assert problems == []
    else:  # a runner reads a chaser's position while the chaser moves
        assert problems and "which thread" in problems[0] and "x[" in problems[0], problems
    for name, value in env.get_state().items():
        assert torch.equal(value, before[name]), name


def test_the_cuda_simulators_index_error_is_named_too():
    from planted_env import NARROW_OBS, Pursuit, PursuitConfig
    env = Pursuit(num_envs=2, backend="cudasim", seed=0, config=PursuitConfig(bug=NARROW_OBS))
    result = check_env(env, steps=5, verbose=False)
    assert result["reset"].message.startswith(
        "agent 0 of replica 0 writes obs[0, 0, 13]: index 13 is out of bounds for axis 2 of "
        "size 13 (obs has shape (2, 5, 13)), in agent phase 'observe' of kernel "
        "'pursuit.reset'")
    assert "tid=" not in str(result)


@pytest.mark.slow
@pytest.mark.parametrize("name", gpusim.env_names())
def test_builtin_envs_pass_the_races_check_with_its_defaults(name):
    """check_env as a user first runs it: 500 steps of 8 replicas, bounds-checked kernels."""
    env = gpusim.make(name, num_envs=8, backend="cpu", seed=0)
    result = check_env(env, skip=("determinism",), verbose=False)
    assert result["races"].status == "PASS", result["races"].message
