"""GPU tests (`gpu` marker): the numba backend against cpu and the NumPy reference.

Skipped cleanly where no CUDA GPU works (see conftest.py).
"""
import contextlib

import numpy as np
import pytest
import torch

from conftest import make_tag, random_actions, random_tag_state
from gpusim import ActionSampler, get_backend
from gpusim.envs.tag_continuous import reference as ref
from gpusim.errors import BackendError
from test_kernels import raw_mean_kernel

pytestmark = pytest.mark.gpu
ATOL = 2e-5


def test_numba_matches_reference_and_cpu():
    rng = np.random.default_rng(0)
    gpu = make_tag(num_envs=4, backend="numba", num_taggers=5)
    cpu = make_tag(num_envs=4, backend="cpu", num_taggers=5)
    gpu.reset()
    cpu.reset()
    for t in range(100):
        state = random_tag_state(gpu.config, 4, rng)
        gpu.set_state(state)
        cpu.set_state(state)
        actions = random_actions(cpu, rng)
        got = gpu.step(actions.to(gpu.device))
        want = ref.step(gpu.config, state, actions.numpy())
        done = want[3] | want[4]
        np.testing.assert_array_equal(got[2].cpu().numpy(), want[3])
        np.testing.assert_array_equal(got[3].cpu().numpy(), want[4])
        np.testing.assert_allclose(got[1].cpu().numpy(), want[2], atol=ATOL)
        np.testing.assert_allclose(got[0].cpu().numpy()[~done], want[1][~done], atol=ATOL)
        cpu_obs = cpu.step(actions)[0]
        np.testing.assert_allclose(got[0].cpu().numpy()[~done], cpu_obs.numpy()[~done], atol=ATOL)


def test_rollout_has_no_host_sync():
    env = make_tag(num_envs=64, backend="numba", num_taggers=5)
    env.reset()
    sampler = ActionSampler(env)
    probs = torch.full((64, env.num_agents, sum(env.action_nvec)), 1.0, device=env.device)
    sampler.sample(probs)
    env.step(sampler.actions)  # compile and warm up outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            obs, reward, terminated, truncated, info = env.step(sampler.sample(probs))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert obs.is_cuda and reward.is_cuda


def test_same_seed_bit_identical_on_gpu():
    runs = []
    for _ in range(2):
        env = make_tag(num_envs=8, backend="numba", seed=3, episode_length=20, num_taggers=5)
        env.reset()
        sampler = ActionSampler(env)
        probs = torch.rand((8, env.num_agents, sum(env.action_nvec)),
                           generator=torch.Generator().manual_seed(0)).to(env.device)
        trace = []
        for _ in range(50):
            out = env.step(sampler.sample(probs))
            trace.append(out[0].clone())
        runs.append(torch.stack(trace))
    assert torch.equal(runs[0], runs[1])


def test_raw_kernel_on_gpu():
    backend = get_backend("numba")
    values = torch.arange(12, dtype=torch.float32, device=backend.device).reshape(3, 4)
    means = torch.zeros(3, dtype=torch.float32, device=backend.device)
    backend.raw_kernel(raw_mean_kernel)[3, 4](values, means)
    torch.cuda.synchronize()
    assert torch.allclose(means, values.mean(1))


def test_block_size_limit_on_gpu():
    with pytest.raises(BackendError, match="block-size limit"):
        make_tag(num_envs=1, backend="numba", num_taggers=1, num_runners=1024)


# ---- CUDA graphs (training.speed.graphs): the rollout and the update replayed ------------------
def graph_trainer(env, graphs, backend="numba", **overrides):
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    cls = env_class(env)
    config = load_run_config(env, cls, overrides={
        "trainer.backend": backend, "trainer.cuda_graphs": graphs, "trainer.compile": "off",
        "trainer.precision": "fp32", "trainer.num_envs": 64, "trainer.total_steps": 10**6,
        "trainer.target_return": None, **overrides})
    return Trainer(config, cls)


TAG_SMALL = {"env.num_taggers": 2, "env.num_runners": 5, "env.num_other_agents_observed": 4}


@pytest.mark.parametrize("env,overrides", [
    ("cartpole", {}),
    ("tag_continuous", {**TAG_SMALL, "trainer.out_of_play": "weigh"}),  # one update graph
    ("tag_continuous", TAG_SMALL),  # rows out of play left out: graphed minibatch chunks
    # a league: snapshots every update, copied in place between replays of the rollout graph
    ("tag_continuous", {**TAG_SMALL, "trainer.league": True,
                        "trainer.league_snapshot_every": 1}),
    ("cartpole", {"policy.recurrent": "gru", "policy.bptt_len": 8})])
def test_graphed_training_captures_and_matches_eager(env, overrides):
    """The graphs capture (no fallback), and replaying them trains as the same static steps
    run eagerly."""
    stats = []
    for capture in (True, False):
        with uncaptured(not capture):
            trainer = graph_trainer(env, "on", **overrides)
            algorithm = trainer.algorithm
            torch.manual_seed(0)
            stats.append([trainer.iterate(1e-3) for _ in range(4)])
        if capture:
            assert algorithm.speed.rollout.graph is not None
            if algorithm.speed.whole:
                assert algorithm.speed.update.graph is not None
            else:
                assert all(graph.graph is not None for p in algorithm.policies
                           for graph in algorithm.speed.policy_graphs(p))
    # with per-agent done the rows out of play are left out (chunks) unless weighed 0
    chunked = env == "tag_continuous" and overrides.get("trainer.out_of_play") != "weigh"
    assert algorithm.speed.whole == (not chunked)
    for on, off in zip(*stats):
        for name in off:
            for key in ("value_loss", "entropy", "approx_kl"):
                assert on[name][key] == pytest.approx(off[name][key], rel=1e-3, abs=1e-5), \
                    (name, key)


@pytest.mark.parametrize("algorithm", ["ddpg", "td3", "sac"])
def test_graphed_gradient_steps_capture_and_match_eager(algorithm):
    """Off-policy rollouts and gradient steps replayed as graphs train as the same static
    steps run eagerly (their draws are made before each replay, eagerly, in both)."""
    stats = []
    for capture in (True, False):
        with uncaptured(not capture):
            trainer = graph_trainer("pendulum", "on", **{
                "trainer.algorithm": algorithm, "trainer.learning_starts": 0,
                "trainer.batch_size": 64, "trainer.num_envs": 16, "trainer.rollout_len": 4,
                "trainer.replay_size": 10_000})
            torch.manual_seed(0)
            stats.append([trainer.iterate(1e-3)["agent"] for _ in range(4)])
        if capture:
            graphed = [*trainer.algorithm.policies[0].graphs.values(),
                       *trainer.algorithm.rollout_graphs.values()]
            assert len(graphed) >= 2 and all(graph.graph is not None for graph in graphed)
    for on, off in zip(*stats):
        for key in ("value_loss", "policy_loss"):
            assert on[key] == pytest.approx(off[key], rel=1e-3, abs=1e-5), key


def uncaptured(eager: bool):
    """Where `eager`, every StepGraph runs its step eagerly (the static form, uncaptured)."""
    from unittest import mock
    from gpusim.training.speed.graphs import StepGraph
    if not eager:
        return contextlib.nullcontext()
    return mock.patch.object(StepGraph, "_capture",
                             lambda self, inputs: setattr(self, "enabled", False))


def test_graphed_rollout_launches_once():
    """After warm-up a rollout is one graph launch: no kernel launched from Python."""
    trainer = graph_trainer("cartpole", "on")
    for _ in range(2):
        trainer.iterate(1e-3)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # and no sync inside the rollout
    try:
        trainer.algorithm.collect(0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        trainer.algorithm.collect(0)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]  # CUPTI may add a version suffix (_v10000)
    launches = [n for n in names if n.startswith(("cudaLaunchKernel", "cuLaunchKernel"))]
    assert any(n.startswith(("cudaGraphLaunch", "cuGraphLaunch")) for n in names)
    assert not launches, launches[:5]
