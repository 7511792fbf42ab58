"""check_env's `static_races` check (gpusim.check.static_races): every agent phase read, not
run, for entries several agents may write at once; on paths no rollout takes too."""
import collections
from pathlib import Path

import numba
import pytest

from gpusim.check import check_env, static_races
from gpusim.envs import env_class, env_names
from gpusim.kernels import KernelSpec, agent_phase, env_phase
from pincer_env import (GUARDED, RACY, Pincer, PincerConfig, PincerOptedOut, pincer,
                        pincer_atomic_specs)
import planted_env

SOURCE = (Path(__file__).parents[1] / "pincer_env.py").read_text().splitlines()


def at(code):
    return f"pincer_env.py:{next(n for n, line in enumerate(SOURCE, 1) if code in line)}"


def declared(cls, config=None):
    """(specs, params, num_agents) of env class `cls`, without building it: AST only."""
    env = cls.declared(config)
    env.continuous_dim = 1  # gpusim's clipping phase is read too
    params = env.params()
    specs = [env.reset_kernel_spec(), env.step_kernel_spec(), env.observe_kernel_spec()]
    return specs, collections.namedtuple("Params", params)(**params), env.num_agents


def arrays_found(specs, params=None, num_agents=None):
    return [f.array for f in static_races.find(specs, params, num_agents)[0]]


# ---- a read-modify-write on a path the rollout never takes --------------------------------
def test_a_racy_count_no_run_reaches_is_reported_in_one_line():
    result = check_env(pincer(RACY), verbose=False)
    assert [c.name for c in result.failed] == ["static_races"]
    assert result["races"].status == "PASS"  # random actions never pincer a runner
    assert result["static_races"].message == (
        "agent phase 'catch_pincers' of kernel 'pincer.step' updates (reads, then writes) "
        f"pincers[env] ({at('s.pincers[env] += 1')}) from every agent that gets there: the "
        "index [env] does not depend on the agent, no single-agent guard (if agent == ...), "
        "not atomic: may race on a GPU (no run showed it); do it in an env phase or from one "
        "agent, or, if it is safe, declare it: agent_phase(catch_pincers, "
        "race_free=(\"pincers\",))")


def test_the_guide_quotes_the_report():
    message = check_env(pincer(RACY), skip=("determinism",), verbose=False)["static_races"]
    guide = (Path(__file__).parents[2] / "docs" / "env_phases.md").read_text()
    assert f"FAIL static_races: {message.message}" in guide


def test_the_count_guarded_to_one_agent_passes():
    result = check_env(pincer(GUARDED), verbose=False)
    assert result.ok, str(result)
    assert result["static_races"].message.startswith("no entry several agents may write at "
                                                     "once, nor read while another writes it")


def test_the_opt_out_silences_that_array_in_that_phase():
    result = check_env(pincer(RACY, PincerOptedOut), skip=("determinism",), verbose=False)
    assert result["static_races"].status == "PASS", result["static_races"].message
    # the opt-out does not change the compiled kernel
    assert PincerOptedOut.step_phases == Pincer.step_phases


def test_the_count_made_atomic_passes():
    specs, params, n = declared(Pincer, PincerConfig(fix=RACY))
    assert arrays_found(specs, params, n) == ["pincers"]
    assert arrays_found(pincer_atomic_specs(), params, n) == []


# ---- the planted mistakes: found statically, not repeated after the races check ----------
@pytest.mark.parametrize("bug, array", [
    (planted_env.OK, None), (planted_env.RACE, "left"), (planted_env.SHARED_WRITE, "leader"),
    (planted_env.OTHERS_ROW, "caught"), (planted_env.GLOBAL_WRITE, "deltas"),
])
def test_planted_mistakes_are_found_in_the_branch_the_config_takes(bug, array):
    specs, params, n = declared(planted_env.Pursuit, planted_env.PursuitConfig(bug=bug))
    assert arrays_found(specs, params, n) == ([array] if array else [])


def test_what_the_races_check_reported_is_not_repeated():
    result = check_env(planted_env.pursuit(planted_env.RACE), skip=("determinism",),
                       verbose=False)
    assert [c.name for c in result.failed] == ["races"]
    assert result["static_races"].message.endswith("what the races check reported is not "
                                                   "repeated")


# ---- the rules, one phase each ---------------------------------------------------------------
@numba.jit(nopython=True)
def bump(count, env, k):
    count[env, k] += 1


@numba.jit(nopython=True)
def guards(env, agent, s, p):
    if agent == p.leader and s.flag[env] > 0:  # one agent: fine
        s.total[env] += 1
    for k in range(3):
        if k == agent:
            s.total[env] += 1  # k is the agent here
    mine = agent * 2 + 1
    s.slots[env, mine] = 0  # an index from the agent: fine
    for j in range(agent, 9, 3):
        s.slots[env, j] = 1  # a range from the agent: fine
    bump(s.counts, env, agent)  # a helper, its index the agent's: fine
    if agent != 0:
        return
    s.total[env] = 0  # after `if agent != 0: return`: agent 0's alone


@numba.jit(nopython=True)
def unguarded(env, agent, s, p):
    if agent > 2:
        s.total[env] = 1  # several agents


@numba.jit(nopython=True)
def through_helper(env, agent, s, p):
    bump(s.counts, env, 0)


@numba.jit(nopython=True)
def reads_a_neighbour(env, agent, s, p):
    s.x[env, agent] = 0.0
    for j in range(4):
        if j != agent:
            s.y[env, agent] += s.x[env, j]


@numba.jit(nopython=True)
def per_env(env, s, p):
    s.total[env] = 0


PARAMS = collections.namedtuple("P", "leader")(1)


@pytest.mark.parametrize("fn, arrays", [
    (guards, []), (unguarded, ["total"]), (through_helper, ["counts"]),
    (reads_a_neighbour, ["x"]),
])
def test_each_rule(fn, arrays):
    spec = KernelSpec.of("rules.step", agent_phase(fn), env_phase(per_env))
    assert arrays_found([spec], PARAMS, 4) == arrays
    spec = KernelSpec.of("rules.step", agent_phase(fn, race_free=tuple(arrays)))
    assert arrays_found([spec], PARAMS, 4) == []


def test_the_report_names_the_line_and_the_helper_line():
    spec = KernelSpec.of("rules.step", agent_phase(reads_a_neighbour))
    (finding,), _, _ = static_races.find([spec], PARAMS, 4)
    assert finding.text.startswith("agent phase 'reads_a_neighbour' of kernel 'rules.step' "
                                   "reads x[env, j] (test_static_races.py:")
    assert "while each agent writes x[env, agent]" in finding.text
    assert arrays_found([spec], PARAMS, 1) == []  # one agent: nothing to race with


# ---- no false report on the bundled envs -----------------------------------------------------
@pytest.mark.parametrize("name", env_names())
def test_builtin_envs_have_no_may_race(name):
    specs, params, n = declared(env_class(name))
    found, read, _ = static_races.find(specs, params, n)
    assert [f.text for f in found] == []
    found, _, _ = static_races.find(specs, None, None)  # no config evaluated, any agent count
    assert n == 1 or [f.text for f in found] == []
