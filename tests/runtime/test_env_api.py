"""The env API: shapes, determinism, auto-reset, state injection and bad inputs."""
import numpy as np
import pytest
import torch

import gpusim
from conftest import make_tag, random_actions
from gpusim.errors import ArrayError, BackendError, ConfigError, GpusimError

SMALL = dict(num_taggers=2, num_runners=6, num_other_agents_observed=4)


def rollout(env, steps, seed):
    rng = np.random.default_rng(seed)
    trace = [env.reset().clone()]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(random_actions(env, rng))
        trace += [obs.clone(), reward.clone(), terminated.clone(), truncated.clone(),
                  info["final_obs"].clone()]
    return trace


def test_shapes_dtypes_and_attributes():
    env = make_tag(num_envs=3, **SMALL)
    assert (env.num_envs, env.num_agents, env.obs_dim) == (3, 8, 7 * 4 + 1)
    assert env.action_nvec == (21, 21)
    assert env.policies == {"tagger": (0, 1), "runner": (2, 3, 4, 5, 6, 7)}
    assert env.device == torch.device("cpu") and env.backend.name == "cpu"
    obs = env.reset()
    assert obs.shape == (3, 8, 29) and obs.dtype == torch.float32
    obs, reward, terminated, truncated, info = env.step(
        torch.zeros((3, 8, 2), dtype=torch.int64))
    assert reward.shape == (3, 8) and reward.dtype == torch.float32
    assert terminated.shape == truncated.shape == (3,) and terminated.dtype == torch.bool
    assert info["final_obs"].shape == obs.shape and info["reset_mask"].dtype == torch.bool
    for tensor in (obs, reward, terminated, truncated, info["final_obs"]):
        assert tensor.is_contiguous() and tensor.device == env.device


def test_full_observation_size_and_tagger_ids():
    env = make_tag(num_envs=1, num_taggers=2, num_runners=3, use_full_observation=True,
                   tagger_ids=[3, 1])
    assert env.obs_dim == 7 * 4 + 1
    assert env.policies == {"tagger": (1, 3), "runner": (0, 2, 4)}
    env.reset()
    assert env.get_state()["agent_type"][0].tolist() == [0, 1, 0, 1, 0]


def test_same_seed_same_backend_is_bit_identical():
    a = rollout(make_tag(num_envs=4, seed=7, episode_length=15, **SMALL), 60, seed=3)
    b = rollout(make_tag(num_envs=4, seed=7, episode_length=15, **SMALL), 60, seed=3)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_different_seeds_differ():
    a = make_tag(num_envs=2, seed=1, **SMALL).reset()
    b = make_tag(num_envs=2, seed=2, **SMALL).reset()
    assert not torch.equal(a, b)


def test_replicas_start_from_different_states():
    env = make_tag(num_envs=16, **SMALL)
    env.reset()
    x = env.get_state()["loc_x"]
    assert len({tuple(row.tolist()) for row in x}) == 16


def test_auto_reset_gives_fresh_and_different_initial_states():
    env = make_tag(num_envs=6, episode_length=5, **SMALL)
    env.reset()
    first = env.get_state()
    zeros = torch.zeros((6, 8, 2), dtype=torch.int32)
    for t in range(5):
        obs, _, terminated, truncated, info = env.step(zeros)
    assert truncated.all() and not terminated.any() and info["reset_mask"].all()
    assert not torch.equal(info["final_obs"], obs)
    assert (info["final_obs"][..., -1] == 1.0).all()   # terminal obs: t = episode_length
    assert (obs[..., -1] == 0.0).all()                  # fresh episode: t = 0
    after = env.get_state()
    assert (after["timestep"] == 0).all() and (after["still_in_game"] == 1).all()
    assert (after["speed"] == 0).all()
    for e in range(6):  # each replica draws a new state, not its old one again
        assert not torch.equal(after["loc_x"][e], first["loc_x"][e])
    assert len({tuple(row.tolist()) for row in after["loc_x"]}) == 6


def test_only_finished_replicas_reset():
    env = make_tag(num_envs=3, episode_length=50, **SMALL)
    env.reset()
    state = env.get_state()
    state["timestep"][1] = 49
    env.set_state(state)
    _, _, _, truncated, info = env.step(torch.zeros((3, 8, 2), dtype=torch.int32))
    assert truncated.tolist() == [False, True, False]
    assert env.get_state()["timestep"].tolist() == [1, 0, 1]


def test_state_roundtrip_and_rng():
    env = make_tag(num_envs=2, **SMALL)
    env.reset()
    state = env.get_state(include_rng=True)
    assert set(state) >= {"loc_x", "num_runners_left", "timestep", "rng_state"}
    obs1 = env.step(torch.ones((2, 8, 2), dtype=torch.int32))[0].clone()
    env.set_state(state)
    obs2 = env.step(torch.ones((2, 8, 2), dtype=torch.int32))[0].clone()
    assert torch.equal(obs1, obs2)


@pytest.mark.parametrize("bad, message", [
    ({"bogus": torch.zeros(2)}, "'bogus' is not a state array"),
    ({"loc_x": torch.zeros((2, 8), dtype=torch.float64)}, "array 'loc_x' must have dtype"),
    ({"loc_x": torch.zeros((2, 9))}, "array 'loc_x' must have shape (2, 8)"),
    ({"loc_x": torch.zeros((8, 2)).t()}, "array 'loc_x' must be contiguous"),
    ({"timestep": [0, 0]}, "array 'timestep' must be a torch tensor"),
])
def test_set_state_rejects_bad_arrays(bad, message):
    env = make_tag(num_envs=2, **SMALL)
    with pytest.raises(ArrayError) as err:
        env.set_state(bad)
    assert message in str(err.value)


def test_agent_types_are_fixed_by_the_config():
    env = make_tag(num_envs=2, **SMALL)
    state = env.get_state()
    state["agent_type"][1, 5] = 1
    with pytest.raises(ArrayError, match="must match the run's fixed tagger ids"):
        env.set_state({"agent_type": state["agent_type"]})


def test_out_of_range_actions_are_an_error_when_checked():
    env = make_tag(num_envs=2, **SMALL)
    env.reset()
    actions = torch.zeros((2, 8, 2), dtype=torch.int32)
    actions[1, 3, 1] = 21
    with pytest.raises(ArrayError, match=r"actions\[1, 3, 1\] = 21, component 1 takes 0..20"):
        env.step(actions)
    actions[1, 3, 1] = -1
    with pytest.raises(ArrayError, match="out of range"):
        env.step(actions)


def test_out_of_range_actions_are_clamped_when_unchecked():
    wild = torch.randint(-30, 50, (2, 8, 2), dtype=torch.int32)
    clamped = torch.stack([wild[..., 0].clamp(0, 20), wild[..., 1].clamp(0, 20)], -1)
    a = make_tag(num_envs=2, check_actions=False, **SMALL)
    b = make_tag(num_envs=2, **SMALL)
    a.reset(), b.reset()
    assert torch.equal(a.step(wild)[0], b.step(clamped)[0])


@pytest.mark.parametrize("actions, message", [
    (torch.zeros((2, 8, 2)), "integer dtype"),
    (torch.zeros((2, 8), dtype=torch.int32), "must have shape (2, 8, 2)"),
    ([[0, 0]], "must be a torch tensor"),
])
def test_bad_actions(actions, message):
    env = make_tag(num_envs=2, **SMALL)
    env.reset()
    with pytest.raises(ArrayError) as err:
        env.step(actions)
    assert message in str(err.value)


def test_make_errors():
    with pytest.raises(GpusimError, match="unknown env 'nope'"):
        gpusim.make("nope")
    with pytest.raises(GpusimError, match="cannot import env module"):
        gpusim.make("no_such_module:Env")
    with pytest.raises(GpusimError, match="has no env class"):
        gpusim.make("gpusim.envs.tag_continuous.env:Missing")
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        gpusim.make("tag_continuous", num_envs=0, backend="cpu")
    with pytest.raises(ConfigError, match="unknown config key 'env.bogus'"):
        gpusim.make("tag_continuous", backend="cpu", bogus=1)
    with pytest.raises(ConfigError, match="'num_runners' must be at least 1"):
        gpusim.make("tag_continuous", backend="cpu", num_runners=0)
    with pytest.raises(BackendError, match="unknown backend 'tpu'"):
        gpusim.make("tag_continuous", backend="tpu")


def test_make_accepts_module_class_path():
    env = gpusim.make("gpusim.envs.tag_continuous.env:TagContinuous", num_envs=1,
                      backend="cpu", **SMALL)
    assert env.num_agents == 8


def test_block_size_limit_on_gpu_backends():
    with pytest.raises(BackendError, match="1025 agents per replica exceed"):
        make_tag(num_envs=1, backend="cudasim", num_taggers=1, num_runners=1024)


def test_auto_backend_says_what_it_picked(capsys):
    env = make_tag(num_envs=1, backend="auto", **SMALL)
    assert env.backend.name in ("cpu", "numba")
    assert f"backend auto -> {env.backend.name}" in capsys.readouterr().err


def test_numba_backend_without_gpu_is_a_clear_error():
    from gpusim.backends import cuda_works
    if cuda_works()[0]:
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(BackendError, match="backend 'numba' needs a CUDA GPU"):
        make_tag(num_envs=1, backend="numba", **SMALL)
