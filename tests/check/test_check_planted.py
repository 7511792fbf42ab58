"""Five mistakes an env author makes, planted in `Pursuit` (tests/planted_env.py), each caught
by check_env with its defaults in one line that names it; the correct env passes.

Every variant is a config value of one env class, so they share their kernels (and
check_env's bounds-checked copies of them).
"""
from pathlib import Path

import pytest

from gpusim.check import check_env
from planted_env import (NAN_REWARD, NARROW_OBS, OK, RACE, WIDE_OBS, ZERO_BY_ZERO, chase,
                         pursuit)

SOURCE = (Path(__file__).parents[1] / "planted_env.py").read_text().splitlines()


def at(code: str) -> str:
    """`planted_env.py:N`, N the line holding `code`."""
    return f"planted_env.py:{next(n for n, line in enumerate(SOURCE, 1) if code in line)}"


def failing(result):
    return [c.name for c in result.failed]


@pytest.fixture(scope="module")
def correct():
    return check_env(pursuit(OK), verbose=False)


def test_the_correct_env_passes_every_check(correct):
    assert correct.ok, str(correct)
    assert correct["races"].status == "PASS"
    assert correct["races"].message.startswith("no race in the reset and ")
    # random actions catch runners, but never both of a replica's: a warning, not a failure
    assert correct["coverage"].status == "WARN"


def test_a_read_modify_write_of_a_replica_entry_from_an_agent_phase():
    result = check_env(pursuit(RACE), verbose=False)
    assert failing(result) == ["races"]
    assert result["races"].message == (
        "agents 4 and 3 both update left[0], a per-replica entry (read it, then write it), in "
        f"agent phase 'catch' of kernel 'pursuit.step' ({at('s.left[env] -= 1')}) at step 8: "
        "a shared count: when two agents update it in one step on a GPU, one update is lost; "
        "update it in an env phase, from per-agent entries written before")


def test_obs_dim_one_too_large():
    result = check_env(pursuit(WIDE_OBS), verbose=False)
    assert failing(result) == ["reset", "step"]
    assert result["reset"].message.startswith(
        "obs[0, 0, 14] was not written by the reset phases (obs_dim is 15: is it declared "
        "larger than the phases fill?")


def test_obs_dim_one_too_small_is_an_index_out_of_bounds_named_on_the_cpu():
    result = check_env(pursuit(NARROW_OBS), verbose=False)
    assert result["reset"].message == (
        "agent 0 of replica 0 writes obs[0, 0, 13]: index 13 is out of bounds for axis 2 of "
        "size 13 (obs has shape (8, 5, 13)), in agent phase 'observe' of kernel "
        f"'pursuit.reset' ({at('s.obs[env, agent, k + 2] = ')}) (is obs_dim declared smaller than the phases "
        "write?)")
    # the checks that would only echo it say where to look instead
    assert result["determinism"].message == \
        "not run: a phase indexes an array out of bounds (see the reset check)"


def test_a_nan_reward_is_named_with_the_phase_that_wrote_it():
    result = check_env(pursuit(NAN_REWARD), verbose=False)
    assert failing(result) == ["finite"]
    assert result["finite"].message == (
        "at step 0, reward[0, 3] = nan: agent 3 writes reward[0, 3] = nan in agent phase 'pay' "
        f"of kernel 'pursuit.step' ({at('math.sqrt(s.x')}) at step 0 (first agent to leave "
        "play)")


def test_zero_by_zero_on_the_termination_path_is_a_coverage_warning():
    result = check_env(pursuit(ZERO_BY_ZERO), verbose=False)
    assert result.ok and result["finite"].status == "PASS"  # random actions never get there
    assert result["coverage"].status == "WARN"
    assert result["coverage"].message.startswith(
        "no episode ended by termination in 500 steps of random actions (128 episodes "
        "ended: 0 by termination, 128 by truncation; 37 agents left play): the termination "
        "path is untested; if the env has one, drive it there with policy= or actions=")


def test_a_scripted_policy_reaches_the_zero_by_zero():
    result = check_env(pursuit(ZERO_BY_ZERO), policy=chase, verbose=False)
    assert failing(result) == ["finite"]
    message = result["finite"].message
    assert message.startswith("at step 7, reward[5, 0] = nan: agent 0 writes reward[5, 0] = "
                              "nan in agent phase 'pay' of kernel 'pursuit.step' "
                              f"({at('numba.float32(caught) - ')}) at step 7 (first termination)")
    assert result["coverage"].message.startswith("in 500 steps of the policy, 217 episodes "
                                                 "ended: 193 by termination, 24 by truncation")
