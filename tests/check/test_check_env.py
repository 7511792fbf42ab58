"""gpusim.check.check_env: passes on the bundled envs, and each check catches its bug.

The broken envs are one cartpole subclass whose config field `bug` picks the
defect, so all of them share one pair of compiled kernels.
"""
import dataclasses

import numba
import numpy as np
import pytest
import torch

import gpusim
from gpusim.check import CHECKS, check_env
from gpusim.errors import GpusimError
from gpusim.envs.cartpole.config import CartPoleConfig
from gpusim.envs.cartpole.env import CartPole, physics, spawn
from gpusim.envs.cartpole import reference as cartpole_ref
from gpusim.envs.tag_continuous import reference as tag_ref
from gpusim.kernels import agent_phase

TAG = dict(num_taggers=2, num_runners=6, num_other_agents_observed=4, episode_length=30)

# bug codes
OK, NAN_OBS, NOISE, SEED_IGNORED, SAME_REPLICAS, TIMESTEP_KEPT, REWARD_SKIPPED, \
    BOTH_FLAGS, OBS_NOT_RESET, WIDE_OBS, SHARED_AGENT, STEP_RAISES, OBS_SOMETIMES_KEPT = range(13)


@dataclasses.dataclass(frozen=True)
class BrokenConfig(CartPoleConfig):
    bug: int = OK


@numba.jit(nopython=True)
def broken_spawn(env, agent, s, p):
    timestep = s.timestep[env]
    spawn(env, agent, s, p)
    if p.bug == SEED_IGNORED:  # the initial state comes from the replica index alone
        for k in range(4):
            s.obs[env, agent, k] = numba.float32(((env * 7 + k * 3) % 11) * 0.01 - 0.05)
    elif p.bug == TIMESTEP_KEPT:  # forgets to restart the clock
        s.timestep[env] = timestep
    elif p.bug == OBS_NOT_RESET or (p.bug == OBS_SOMETIMES_KEPT and env == 0):
        for k in range(4):  # leaves the last observation in place (in one replica only)
            s.obs[env, agent, k] = s.final_obs[env, agent, k]
    s.x[env] = s.obs[env, agent, 0]
    s.x_dot[env] = s.obs[env, agent, 1]
    s.theta[env] = s.obs[env, agent, 2]
    s.theta_dot[env] = s.obs[env, agent, 3]


@numba.jit(nopython=True)
def broken_physics(env, agent, s, p):
    before = s.reward[env, agent]
    physics(env, agent, s, p)
    if p.bug == NAN_OBS and s.timestep[env] == 5:
        s.obs[env, agent, 2] = np.float32(np.nan)
    elif p.bug == NOISE:  # numpy's generator is not gpusim's: not reproducible
        s.x_dot[env] += numba.float32(np.random.random() * 1e-3)
    elif p.bug == REWARD_SKIPPED and s.timestep[env] % 7 == 3:
        s.reward[env, agent] = before
    elif p.bug == BOTH_FLAGS and s.terminated[env]:
        s.truncated[env] = True


class Broken(CartPole):
    name = "broken_cartpole"
    config_class = BrokenConfig
    reset_phases = (agent_phase(broken_spawn),)
    step_phases = (agent_phase(broken_physics),)

    def setup(self, config):
        super().setup(config)
        if config.bug == WIDE_OBS:
            self.obs_dim = 5  # one more than the phases write
        if config.bug == SHARED_AGENT:
            self.policies = {"left": (0,), "right": (0,)}

    def params(self):
        return dict(super().params(), bug=np.int32(self.config.bug))

    def reset(self, seed=None):
        obs = super().reset(seed)
        if self.config.bug == SAME_REPLICAS:  # every replica a copy of replica 0
            state = self.get_state()
            self.set_state({k: v[:1].expand_as(v).contiguous() for k, v in state.items()})
            obs.copy_(obs[:1].expand_as(obs))
        self.steps_taken = 0
        return obs

    def step(self, actions):
        self.steps_taken += 1
        if self.config.bug == STEP_RAISES and self.steps_taken == 10:
            raise RuntimeError("launch failed")
        return super().step(actions)


def broken(bug, num_envs=4):
    return Broken(num_envs=num_envs, backend="cpu", seed=0, config=BrokenConfig(bug=bug))


def failing(result):
    return [c.name for c in result.failed]


@pytest.fixture(scope="module")
def cartpole():
    return gpusim.make("cartpole", num_envs=4, backend="cpu", seed=3)


@pytest.fixture(scope="module")
def tag():
    return gpusim.make("tag_continuous", num_envs=3, backend="cpu", seed=1, **TAG)


# ---- the bundled envs pass ------------------------------------------------------------
def test_cartpole_passes_with_its_reference(cartpole, capsys):
    result = check_env(cartpole, reference=cartpole_ref.check_env_reference(cartpole.config),
                       steps=300)
    assert result.ok and bool(result), str(result)
    assert result.names == CHECKS
    assert result["backends"].skipped and not result["reference"].skipped
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(CHECKS)
    assert lines[0].startswith("PASS attributes") and lines[-1].startswith("SKIP backends")


def test_tag_passes_with_its_reference(tag):
    result = check_env(tag, reference=tag_ref.check_env_reference(tag.config), steps=120,
                       verbose=False)
    assert result.ok, str(result)
    assert "agrees with the reference for 120 steps" in result["reference"].message


def test_cartpole_agrees_with_cudasim(cartpole):
    result = check_env(cartpole, compare_backend="cudasim", compare_steps=20, steps=100,
                       skip=("determinism",), verbose=False)
    assert result.ok, str(result)
    assert result["determinism"].skipped
    assert "cpu and cudasim agree over 20 steps" in result["backends"].message


def test_the_env_is_left_as_it_was(cartpole):
    cartpole.reset(seed=11)
    for _ in range(7):
        cartpole.step(torch.ones((4, 1, 1), dtype=torch.int32))
    before = {name: t.clone() for name, t in cartpole.arrays.tensors.items()}
    check_env(cartpole, steps=50, seed=5, skip=("determinism",), verbose=False)
    assert cartpole.seed == 11
    for name, tensor in before.items():
        assert torch.equal(cartpole.arrays[name].view(torch.uint8),
                           tensor.view(torch.uint8)), name


# ---- each check fails on its bug -------------------------------------------------------
def test_an_agent_in_two_policies_is_refused_when_the_env_is_built():
    with pytest.raises(GpusimError, match="agent 0 is in policies 'left' and 'right'"):
        broken(SHARED_AGENT)


@pytest.mark.parametrize("change, message", [
    (dict(policies={"tagger": (0, 1), "runner": (1, 2, 3, 4, 5, 6, 7)}),
     "agent 1 is in policies 'tagger' and 'runner'"),
    (dict(policies={"tagger": (0, 1), "runner": (3, 4, 5, 6, 7)}),
     "agents [2] belong to no policy"),
    (dict(agent_names=("tagger_0",) * 8), "agent_names repeats 'tagger_0'"),
    (dict(agent_names=("a", "b")), "agent_names names 2 agents; the env has 8"),
    (dict(agent_names=("a",) * 7 + ("",)), "agent_names must be non-empty strings"),
])
def test_attributes_fail_on_policies_or_names_that_do_not_cover_each_agent_once(
        tag, monkeypatch, change, message):
    for key, value in change.items():  # as an env that changes them after it was built
        monkeypatch.setattr(tag, key, value)
    result = check_env(tag, skip=CHECKS[1:], verbose=False)
    assert failing(result) == ["attributes"] and message in result["attributes"].message


def test_reset_and_step_fail_on_a_wrong_obs_dim():
    result = check_env(broken(WIDE_OBS), steps=60, verbose=False)
    assert failing(result) == ["reset", "step"]
    assert "obs[0, 0, 4] was not written by the reset phases" in result["reset"].message
    assert "obs[0, 0, 4] was not written by the step phases" in result["step"].message


def test_step_fails_on_an_unwritten_reward():
    result = check_env(broken(REWARD_SKIPPED), steps=60, verbose=False)
    assert failing(result) == ["step"]
    assert "reward[" in result["step"].message and "was not written" in result["step"].message


def test_finite_fails_on_nan():
    result = check_env(broken(NAN_OBS), steps=60, verbose=False)
    assert failing(result) == ["finite"]
    assert result["finite"].message.startswith("at step 4, obs[0, 0, 2] = nan")


def test_determinism_fails_on_numpy_random():
    result = check_env(broken(NOISE), steps=60, verbose=False)
    assert "determinism" in failing(result)
    assert "two fresh instances with seed 0 differ" in result["determinism"].message


def test_seeding_fails_when_the_seed_is_ignored():
    result = check_env(broken(SEED_IGNORED), steps=60, verbose=False)
    assert failing(result) == ["seeding"]
    assert "give the same states and observations" in result["seeding"].message


def test_seeding_fails_when_replicas_start_alike():
    result = check_env(broken(SAME_REPLICAS), steps=60, verbose=False)
    assert "seeding" in failing(result)
    assert "all 4 replicas start from the same state" in result["seeding"].message


def test_auto_reset_fails_when_the_clock_is_not_restarted():
    env = broken(TIMESTEP_KEPT)
    result = check_env(env, steps=100, verbose=False)
    assert failing(result) == ["auto_reset"]
    assert "after its auto-reset timestep[" in result["auto_reset"].message
    assert "where every initial state has 0" in result["auto_reset"].message


def test_auto_reset_fails_when_the_final_obs_is_kept():
    result = check_env(broken(OBS_NOT_RESET), steps=100, verbose=False)
    assert "auto_reset" in failing(result)
    assert "new observation equals its final one" in result["auto_reset"].message


def test_a_fresh_observation_may_equal_the_last_one():
    """Small discrete observations repeat: only resets that never change obs are a bug."""
    result = check_env(broken(OBS_SOMETIMES_KEPT), steps=100, verbose=False)
    assert result["auto_reset"].ok, result["auto_reset"].message


def test_auto_reset_fails_on_both_flags():
    result = check_env(broken(BOTH_FLAGS), steps=100, verbose=False)
    assert failing(result) == ["auto_reset"]
    assert "both terminated and truncated" in result["auto_reset"].message


def test_auto_reset_fails_when_no_episode_ends(cartpole):
    result = check_env(cartpole, steps=3, skip=("determinism",), verbose=False)
    assert failing(result) == ["auto_reset"]
    assert "no replica finished in 3 steps" in result["auto_reset"].message


def test_an_exception_in_step_is_reported_not_raised():
    result = check_env(broken(STEP_RAISES), steps=60, verbose=False)
    assert failing(result) == ["step", "finite", "auto_reset", "coverage", "determinism"]
    assert result["step"].message == \
        "at step 9, the rollout raised RuntimeError: launch failed"
    assert "not run past step 9" in result["finite"].message
    assert result["determinism"].message == "raised RuntimeError: launch failed"


def test_reference_fails_on_a_disagreeing_reference(cartpole):
    heavier = dataclasses.replace(cartpole.config, gravity=10.5)
    result = check_env(cartpole, reference=cartpole_ref.check_env_reference(heavier),
                       steps=50, skip=("determinism",), verbose=False)
    assert failing(result) == ["reference"]
    message = result["reference"].message
    assert message.startswith("at step 0: obs[0, 0, ") and "env " in message \
        and "reference " in message


def test_reference_fails_on_a_tag_reward_mismatch(tag):
    def off_by_one(state, actions):
        next_state, obs, reward, terminated, truncated = tag_ref.step(tag.config, state, actions)
        reward = reward.copy()
        reward[1, 5] += 1.0
        return next_state, obs, reward, terminated, truncated

    result = check_env(tag, reference=off_by_one, steps=40, skip=("determinism",),
                       verbose=False)
    assert failing(result) == ["reference"]
    assert "at step 0: reward[1, 5]: env " in result["reference"].message


def test_reference_that_raises_is_reported(cartpole):
    def broken_reference(state, actions):
        raise KeyError("velocity")

    result = check_env(cartpole, reference=broken_reference, steps=20, skip=("determinism",),
                       verbose=False)
    assert failing(result) == ["reference"]
    assert "the reference raised KeyError" in result["reference"].message


def test_backends_fail_when_cudasim_disagrees():
    result = check_env(broken(NOISE, num_envs=2), compare_backend="cudasim", compare_steps=5,
                       steps=40, verbose=False)
    assert "backends" in failing(result)
    assert result["backends"].message.startswith("cpu and cudasim differ")


# ---- bad arguments raise -----------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(steps=0), ValueError, "steps must be an integer >= 1"),
    (dict(seed=-1), ValueError, "seed must be an integer >= 0"),
    (dict(atol=-1.0), ValueError, "atol must be a number >= 0"),
    (dict(skip=("nope",)), ValueError, "unknown check names in skip: ['nope']"),
    (dict(skip="finite"), TypeError, "skip must be a collection"),
    (dict(reference=42), TypeError, "reference must be a callable"),
])
def test_bad_arguments_raise(cartpole, kwargs, error, message):
    with pytest.raises(error) as err:
        check_env(cartpole, **kwargs)
    assert message in str(err.value)


def test_not_an_env_instance_raises():
    with pytest.raises(TypeError, match="needs an instance of gpusim.Env"):
        check_env("cartpole")
    with pytest.raises(TypeError, match="a class: instantiate it first"):
        check_env(CartPole)


def test_unknown_compare_backend_raises(cartpole):
    with pytest.raises(gpusim.BackendError, match="unknown backend 'tpu'"):
        check_env(cartpole, compare_backend="tpu")


def test_a_mask_that_leaves_an_agent_no_choice_fails_the_step_check_at_its_step():
    """At reset the mask is checked by reset() itself; after every step by check_env."""
    from bad_envs import DeadMask, MaskDiesLater
    env = MaskDiesLater(num_envs=3, backend="cpu")
    result = check_env(env, steps=20, skip=("seeding", "determinism"), verbose=False)
    assert not result["step"].ok
    assert result["step"].message == (
        "after step 2, the action mask ('legal') leaves agent agent_1 (id 1) of replica 0 no "
        "legal choice for action component 0; keep at least one choice legal per action "
        "component")
    result = check_env(DeadMask(num_envs=3, backend="cpu"), steps=5, skip=("determinism",),
                       verbose=False)
    assert "no legal choice for action component 0 after reset (step 0)" in result["reset"].message
    walls = gpusim.make("tag_gridworld", num_envs=4, backend="cpu", mask_walls=True)
    assert check_env(walls, steps=50, skip=("determinism",), verbose=False)["step"].ok


def test_an_observation_alike_in_every_sampled_initial_state_is_no_constant():
    """tag_continuous: a runner's k-th neighbour can be a runner in all 16 initial states
    sampled and a tagger after an auto-reset; only state arrays are held to their constants
    (the reset check sees every obs entry written)."""
    env = gpusim.make("tag_continuous", num_envs=8, backend="cpu", seed=0, episode_length=60)
    result = check_env(env, steps=130, verbose=False, skip=("determinism", "races"))
    assert result["auto_reset"].ok, result["auto_reset"].message


def test_actions_of_the_wrong_shape_raise_naming_the_argument(cartpole):
    from gpusim.check.compare import BadActions
    with pytest.raises(BadActions) as err:
        check_env(cartpole, actions=torch.zeros(10, 4, 2, dtype=torch.int32), verbose=False)
    assert str(err.value) == ("check_env: actions[0] gives actions of shape (4, 2); expected "
                              "(num_envs, num_agents, action width) = (4, 1, 1)")
    assert isinstance(err.value, GpusimError) and isinstance(err.value, ValueError)


def test_a_policy_returning_nan_raises_naming_the_step_and_entry():
    from gpusim.check.compare import BadActions
    env = gpusim.make("pendulum", num_envs=2, backend="cpu", seed=0)

    def policy(obs, step):
        return torch.full((2, 1, 1), float("nan") if step == 3 else 0.0)

    with pytest.raises(BadActions) as err:
        check_env(env, policy=policy, steps=10, verbose=False)
    assert str(err.value) == ("check_env: policy(obs, 3) returned actions[0, 0, 0] = nan; "
                              "expected finite values")
