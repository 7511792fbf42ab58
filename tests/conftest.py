"""Shared test helpers: random tag_continuous states, env construction, and tests that
run in a child process."""
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

import gpusim
from gpusim.backends import cuda_works


_own_basetemp = None


def pytest_configure(config):
    """A temporary root of the session's own (unless --basetemp is given): suites run side by
    side on one machine never share pytest's numbered directories, nor write the same files."""
    global _own_basetemp
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        _own_basetemp = config.option.basetemp = tempfile.mkdtemp(prefix="gpusim-tests-")


def pytest_unconfigure(config):
    if _own_basetemp is not None:
        shutil.rmtree(_own_basetemp, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    ok, why = cuda_works()
    if ok:
        return
    skip_gpu = pytest.mark.skip(reason=f"needs a CUDA GPU: {why}")
    for item in items:  # the marker, not a keyword: a checkout in a folder named gpu
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)


def random_tag_state(config, num_envs, rng, p_in_game=0.8):
    """A random but consistent tag_continuous state, biased towards tags and edges.

    Some runners sit close to a tagger (tags happen), some agents sit near the
    walls (edge hits happen), speeds span [0, vmax] including both ends, and
    timesteps span the whole episode (truncation happens).
    """
    c = config
    n = c.num_agents
    length = c.grid_length
    taggers = np.array(c.tagger_id_list)
    is_tagger = np.zeros(n, dtype=np.int32)
    is_tagger[taggers] = 1
    loc_x = rng.uniform(0, length, (num_envs, n)).astype(np.float32)
    loc_y = rng.uniform(0, length, (num_envs, n)).astype(np.float32)
    radius = max(c.tagging_distance * length, 1e-3)
    near = rng.random((num_envs, n)) < 0.25  # runners placed next to a random tagger
    partner = rng.choice(taggers, (num_envs, n))
    offset = rng.uniform(-3 * radius, 3 * radius, (num_envs, n, 2)).astype(np.float32)
    envs = np.arange(num_envs)[:, None]
    for coord, loc in ((0, loc_x), (1, loc_y)):
        moved = np.clip(loc[envs, partner] + offset[..., coord], 0, length)
        loc[:] = np.where(near & (is_tagger == 0), moved, loc)
    edge = rng.random((num_envs, n)) < 0.1
    loc_x[edge] = rng.choice([0.0, length], edge.sum()).astype(np.float32)
    vmax = np.where(is_tagger == 1, c.max_speed * c.skill_level_tagger,
                    c.max_speed * c.skill_level_runner).astype(np.float32)
    speed = (rng.uniform(0, 1, (num_envs, n)) * vmax).astype(np.float32)
    pick = rng.random((num_envs, n))
    speed = np.where(pick < 0.1, 0, np.where(pick > 0.9, vmax, speed)).astype(np.float32)
    in_game = (rng.random((num_envs, n)) < p_in_game).astype(np.int32)
    in_game[:, taggers] = 1
    runners_left = (in_game * (1 - is_tagger)).sum(axis=1).astype(np.int32)
    timestep = rng.integers(0, c.episode_length, num_envs).astype(np.int32)
    timestep[rng.random(num_envs) < 0.3] = c.episode_length - 1
    return {
        "loc_x": loc_x, "loc_y": loc_y,
        "speed": (speed * in_game).astype(np.float32),
        "direction": rng.uniform(0, 2 * np.pi, (num_envs, n)).astype(np.float32),
        "acceleration": rng.uniform(-0.3, 0.3, (num_envs, n)).astype(np.float32),
        "still_in_game": in_game,
        "agent_type": np.broadcast_to(is_tagger, (num_envs, n)).copy(),
        "num_runners_left": runners_left,
        "timestep": timestep,
    }


def random_actions(env, rng):
    return torch.from_numpy(np.stack(
        [rng.integers(0, n, (env.num_envs, env.num_agents)) for n in env.action_nvec],
        axis=-1).astype(np.int32)).to(env.device)


@pytest.fixture
def np_rng():
    return np.random.default_rng(1234)


def make_tag(num_envs=4, backend="cpu", seed=0, **config):
    return gpusim.make("tag_continuous", num_envs=num_envs, backend=backend, seed=seed, **config)


def step_matches_reference(env, reference, state, actions, physics, reward_atol=0.0):
    """Inject `state`, take one step of `actions` on `env` and on `reference` (check_env's
    protocol), and assert they agree: flags exactly, rewards within `reward_atol`, the
    observation (a finished replica's final one) and the `physics` state within 1e-5.
    Returns the reference's terminated flags."""
    env.set_state(state)
    want_state, want_obs, want_reward, want_term, want_trunc = reference(state, actions)
    obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
    done = want_term | want_trunc
    assert np.array_equal(terminated.numpy(), want_term)
    assert np.array_equal(truncated.numpy(), want_trunc)
    np.testing.assert_allclose(reward.numpy(), want_reward, rtol=0, atol=reward_atol)
    got = torch.where(torch.from_numpy(done)[:, None, None], info["final_obs"], obs)
    np.testing.assert_allclose(got.numpy(), want_obs, rtol=0, atol=1e-5)
    after = env.get_state()
    for k in physics:
        np.testing.assert_allclose(after[k].numpy()[~done], want_state[k][~done],
                                   rtol=0, atol=1e-5)
    return want_term


def draw_one_frame(name):
    """Draw a fresh replica of env `name` headless; returns the matplotlib axis."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    env = gpusim.make(name, num_envs=1, backend="cpu")
    env.reset()
    frame = {k: env.arrays[k][0].numpy() for k in env.render_arrays}
    fig, ax = plt.subplots()
    env.draw(ax, frame)
    plt.close(fig)
    return ax


IN_CHILD = "GPUSIM_TEST_IN_CHILD"


def in_child_process(test):
    """Run `test` in a fresh pytest process of its own.

    For tests whose outcome depends on the CPU's instruction set (bf16): a
    hardware fault (SIGILL, exit 132) then fails this one test with a clear
    message instead of ending the whole suite. A skip in the child is a skip here.
    """
    @functools.wraps(test)
    def run(*args, **kwargs):
        if os.environ.get(IN_CHILD):
            return test(*args, **kwargs)
        node = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
        # `-m "slow or not slow"`: the node runs whatever its marks (addopts deselects slow)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
             "-m", "slow or not slow", node],
            env={**os.environ, IN_CHILD: "1"}, capture_output=True, text=True, timeout=600)
        if done.returncode in (-signal.SIGILL, 128 + signal.SIGILL):
            pytest.fail(f"{node} died by SIGILL (an illegal instruction: this CPU faults "
                        "on a path torch took)", pytrace=False)
        output = done.stdout + done.stderr
        skipped = re.search(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", output)
        if done.returncode == 0 and skipped:
            pytest.skip(skipped.group(1))
        assert done.returncode == 0, f"{node} failed in its child process:\n{output[-3000:]}"
    return run


def needs_cpu_bf16():
    """Skip, with the probe's findings, where no bf16 path runs on this CPU at all."""
    from gpusim import cpu_bf16
    result = cpu_bf16.probe(os.environ.get(cpu_bf16.ISA_VAR) or None)
    if not result.any_works:
        pytest.skip(f"no bf16 path runs on this CPU: {result.outcomes}")
