"""tag_continuous's opt-in observations: `observe_own_state` and `observe_in_own_frame`.

The kernels against the NumPy reference by state injection for every combination
(and with full observation and continuous actions), a case worked out by hand, the
default observation unchanged, and the cuda_c kernels kept.

Tolerance: numba's float32 cos/sin and NumPy's may differ by an ulp, so the own-state
heading floats and the rotated offsets match the reference to test_tag_vs_reference's
ATOL (2e-5), not bit for bit; everything else in them is exact.
"""
import math

import numpy as np
import pytest

from conftest import make_tag, random_tag_state
from gpusim.backends.cuda_c_sources import split_cuda_c
from gpusim.config import from_dict
from gpusim.envs.tag_continuous import reference as ref
from gpusim.envs.tag_continuous.config import TagContinuousConfig
from gpusim.errors import BackendError, ConfigError
from test_tag_continuous_actions import box_actions
from test_tag_vs_reference import run_against_reference

SMALL = dict(num_taggers=2, num_runners=6, num_other_agents_observed=3, tagging_distance=0.1,
             grid_length=5.0, episode_length=40)
OPTIONS = [dict(observe_own_state=own, observe_in_own_frame=frame)
           for own in (False, True) for frame in (False, True)]
BOTH = dict(observe_own_state=True, observe_in_own_frame=True)
K = 3  # SMALL's neighbour slots per block


def option_id(options):
    return "+".join(k for k, v in options.items() if v) or "default"


def observed(state, **config):
    """(env, the kernel's observation of `state`, injected into an env of its replicas)."""
    env = make_tag(num_envs=len(state["timestep"]), **config)
    env.reset()
    env.set_state(state)
    return env, env.observe().numpy()


# ---- against the reference ------------------------------------------------------------------
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_cpu_matches_reference(options):
    counts = run_against_reference("cpu", num_envs=3, steps=60, refresh_every=15,
                                   **SMALL, **options)
    assert counts["resets"] > 0 and counts["tags"] > 0


def test_cpu_matches_reference_with_full_observation():
    counts = run_against_reference("cpu", num_envs=3, steps=40, refresh_every=10,
                                   use_full_observation=True, **SMALL, **BOTH)
    assert counts["resets"] > 0 and counts["tags"] > 0


def test_cpu_matches_reference_with_continuous_actions():
    counts = run_against_reference("cpu", num_envs=3, steps=40, refresh_every=10,
                                   draw_actions=box_actions, continuous_actions=True,
                                   **SMALL, **BOTH)
    assert counts["resets"] > 0 and counts["tags"] > 0


def test_cudasim_matches_reference():
    counts = run_against_reference("cudasim", num_envs=1, steps=20, refresh_every=10,
                                   num_taggers=1, num_runners=3, num_other_agents_observed=2,
                                   tagging_distance=0.3, grid_length=3.0, episode_length=12,
                                   **BOTH)
    assert counts["resets"] > 0


# ---- by hand ----------------------------------------------------------------------------------
def two_agents_state():
    """Agent 0 at (2, 3) heading north (π/2) at speed 0.5; agent 1 at (2, 7) heading west
    (π) at rest: each is 4 from the other, straight ahead of 0 and on 1's left."""
    f32 = np.float32
    return {"loc_x": f32([[2.0, 2.0]]), "loc_y": f32([[3.0, 7.0]]),
            "speed": f32([[0.5, 0.0]]), "direction": f32([[math.pi / 2, math.pi]]),
            "acceleration": f32([[0.0, 0.0]]), "still_in_game": np.int32([[1, 1]]),
            "agent_type": np.int32([[1, 0]]), "num_runners_left": np.int32([1]),
            "timestep": np.int32([5])}


HAND = dict(num_taggers=1, num_runners=1, num_other_agents_observed=1, grid_length=10.0,
            episode_length=20)
D = 4 / (math.sqrt(2) * 10)  # the distance 4 over √2·L


def test_own_frame_and_own_state_by_hand():
    env, obs = observed(two_agents_state(), **HAND, **BOTH)
    assert env.obs_dim == 7 + 5 + 1
    # 0: forward, left, dspeed, dacc, ddirection, tagger, in game | x/L, y/L, cos, sin, v | t
    want0 = [D, 0.0, -0.5, 0.0, 0.25, 0.0, 1.0, 0.2, 0.3, 0.0, 1.0, 0.5, 0.25]
    want1 = [0.0, D, 0.5, 0.0, -0.25, 1.0, 1.0, 0.2, 0.7, -1.0, 0.0, 0.0, 0.25]
    np.testing.assert_allclose(obs[0], [want0, want1], rtol=0, atol=1e-6)


def test_world_frame_with_own_state_by_hand():
    _, obs = observed(two_agents_state(), **HAND, observe_own_state=True)
    np.testing.assert_allclose(obs[0, :, :2], [[0.0, D], [0.0, -D]], rtol=0, atol=1e-6)
    np.testing.assert_allclose(obs[0, :, 7:12], [[0.2, 0.3, 0.0, 1.0, 0.5],
                                                 [0.2, 0.7, -1.0, 0.0, 0.0]], rtol=0, atol=1e-6)


def test_own_frame_by_hand_keeps_the_size():
    env, obs = observed(two_agents_state(), **HAND, observe_in_own_frame=True)
    assert env.obs_dim == 8
    np.testing.assert_allclose(obs[0, :, :2], [[D, 0.0], [0.0, D]], rtol=0, atol=1e-6)
    assert obs[0, 0, -1] == np.float32(0.25)


def test_out_of_game_observes_zeros():
    state = two_agents_state()
    state["still_in_game"][0, 1] = 0
    state["num_runners_left"][0] = 0
    _, obs = observed(state, **HAND, **BOTH)
    assert not obs[0, 1].any()
    np.testing.assert_array_equal(obs[0, 0, :7], 0.0)  # its only neighbour left: padding
    np.testing.assert_allclose(obs[0, 0, 7:], [0.2, 0.3, 0.0, 1.0, 0.5, 0.25], atol=1e-6)


# ---- the default, and what each option leaves alone ----------------------------------------------
def test_default_observation_is_unchanged():
    cfg = TagContinuousConfig()
    assert not cfg.observe_own_state and not cfg.observe_in_own_frame
    state = random_tag_state(cfg, 1, np.random.default_rng(3))
    env, obs = observed(state)
    assert env.obs_dim == ref.obs_dim(env.config) == 71
    assert not env._params.observe_own_state and not env._params.observe_in_own_frame
    np.testing.assert_array_equal(obs, ref.observe(env.config, state))  # bit for bit


def test_each_option_changes_only_its_own_floats():
    state = random_tag_state(TagContinuousConfig(**SMALL), 2, np.random.default_rng(4))
    _, default = observed(state, **SMALL)
    _, own = observed(state, **SMALL, observe_own_state=True)
    _, frame = observed(state, **SMALL, observe_in_own_frame=True)
    np.testing.assert_array_equal(own[..., :7 * K], default[..., :7 * K])
    np.testing.assert_array_equal(own[..., -1], default[..., -1])
    np.testing.assert_array_equal(frame[..., 2 * K:], default[..., 2 * K:])
    assert not np.allclose(frame[..., :2 * K], default[..., :2 * K])
    # a rotation: each neighbour's offset keeps its length
    length = lambda o: np.hypot(o[..., :K], o[..., K:2 * K])  # noqa: E731
    np.testing.assert_allclose(length(frame), length(default), rtol=0, atol=1e-6)


# ---- cuda_c refusal and config --------------------------------------------------------------
@pytest.mark.parametrize("key", ["observe_own_state", "observe_in_own_frame"])
def test_cuda_c_keeps_its_kernels_with_an_option_on(key):
    """tag_continuous.cu writes both options too (tests/runtime/test_cuda_c.py: bit for bit against
    the portable kernels); only continuous actions rule its step kernel out."""
    env = make_tag(num_envs=1, **SMALL, **{key: True})
    for spec in (env.reset_kernel_spec(), env.step_kernel_spec()):
        assert split_cuda_c(spec)[0] == "tag_continuous.cu"
    continuous = make_tag(num_envs=1, continuous_actions=True, **SMALL, **{key: True})
    with pytest.raises(BackendError, match="'continuous_actions' is true"):
        split_cuda_c(continuous.step_kernel_spec())


def test_options_must_be_booleans():
    with pytest.raises(ConfigError, match="'env.observe_own_state' must be true or false"):
        from_dict(TagContinuousConfig, {"observe_own_state": 1}, section="env")
