"""The nine MPE scenarios against mpe2 itself, by state injection: every step loads
gpusim's state into mpe2's world objects, steps both with the same random actions and
compares observations, rewards, terminations, truncations and the next state (1e-4), in
both action modes; on random states, along whole episodes through gpusim's auto-reset,
and on the cudasim backend; and the initial-state distributions against mpe2's resets."""
import numpy as np
import pytest

from mpe_cases import (MPE2_MODULES, SCENARIOS, VARIANTS, Envs, as_numpy, random_actions,
                       random_state, reference, step_both)

mpe2 = pytest.importorskip("mpe2")

MODES = (False, True)  # continuous_actions
# Every scenario in both action modes; in the default suite the Box mode of the two whose
# Box actions the docs train with, the rest behind `slow` (each mode's first CPU compile of
# a scenario costs 10-25 s on 2 cores).
DEFAULT_BOX = ("simple_spread", "simple_tag")
CASES = [pytest.param(name, continuous, id=f"{name}-{'continuous' if continuous else 'discrete'}",
                      marks=pytest.mark.slow if continuous and name not in DEFAULT_BOX else ())
         for name in SCENARIOS for continuous in MODES]


@pytest.fixture(scope="module")
def envs():
    return Envs()


def configs(name):
    return ({},) + VARIANTS.get(name, ())


@pytest.mark.parametrize("name, continuous", CASES)
def test_random_states_step_as_in_mpe2(envs, name, continuous):
    rng = np.random.default_rng(1)
    for config in configs(name):
        env = envs.get(name, continuous, **config)
        env.reset()
        oracle = reference(name, env.config)
        truncations = 0
        for _ in range(4):
            state = random_state(env, rng)
            env.set_state(state)
            _, done, _ = step_both(env, oracle, state, random_actions(env, rng))
            truncations += int(done.sum())
        assert truncations > 0, config


@pytest.mark.parametrize("name, continuous", CASES)
def test_whole_episodes_follow_mpe2_through_auto_reset(envs, name, continuous):
    """From gpusim's own reset, two and a half episodes: each step mpe2 starts from
    gpusim's current state; finished replicas compare their final observation and
    restart at timestep 0."""
    env = envs.get(name, continuous, num_envs=4)
    oracle = reference(name, env.config)
    rng = np.random.default_rng(2)
    env.reset(seed=11)
    state = as_numpy(env.get_state())
    episodes = 0
    rewards = []
    for _ in range(int(2.5 * env.config.max_cycles)):
        state, done, reward = step_both(env, oracle, state, random_actions(env, rng))
        episodes += int(done.sum())
        rewards.append(reward)
    assert episodes == 2 * env.num_envs
    assert np.abs(np.array(rewards)).max() > 0  # the rewards are not trivially zero


@pytest.mark.parametrize("name, continuous", CASES)
def test_cudasim_steps_as_in_mpe2(envs, name, continuous):
    """The generated CUDA kernel, interpreted by numba's simulator (tiny grid)."""
    env = envs.get(name, continuous, backend="cudasim", num_envs=2)
    oracle = reference(name, env.config)
    rng = np.random.default_rng(3)
    env.reset()
    for _ in range(2):
        state = random_state(env, rng)
        state["timestep"][0] = env.config.max_cycles - 1  # one auto-reset inside the kernel
        env.set_state(state)
        step_both(env, oracle, state, random_actions(env, rng))


def mpe2_initial_states(name, config, resets):
    oracle = reference(name, config)
    pos, landmark_pos = [], []
    for seed in range(resets):
        oracle.env.reset(seed=seed)
        world = oracle.world
        pos.append([a.state.p_pos for a in world.agents])
        landmark_pos.append([lm.state.p_pos for lm in world.landmarks])
        assert all(not a.state.p_vel.any() for a in world.agents)
    return np.array(pos), np.array(landmark_pos)


@pytest.mark.parametrize("name", SCENARIOS)
def test_initial_states_are_distributed_as_in_mpe2(envs, name):
    """Same supports and moments as mpe2's resets (uniform squares of half-width 1 for
    agents, 1 or 0.9 for landmarks), at rest, silent, at timestep 0; goals uniform."""
    env = envs.get(name)
    pos, landmark_pos, goals = [], [], {k: [] for k in env.index_ranges()}
    for seed in range(40):
        env.reset(seed=seed)
        state = as_numpy(env.get_state())
        assert not state["vel"].any() and not state["timestep"].any()
        assert not env.arrays["comm"].any()
        pos.append(state["pos"])
        landmark_pos.append(state["landmark_pos"])
        for k in goals:
            goals[k].append(state[k].ravel())
    ours = np.concatenate(pos), np.concatenate(landmark_pos)
    theirs = mpe2_initial_states(name, env.config, 300)
    for got, want in zip(ours, theirs):
        got, want = got.reshape(-1, got.shape[-2], 2), want.reshape(-1, want.shape[-2], 2)
        half = np.abs(want).max(axis=(0, 2))  # mpe2's half-width per entity (up to sampling)
        np.testing.assert_allclose(np.abs(got).max(axis=(0, 2)), half, atol=0.05)
        assert np.all(np.abs(got).max(axis=(0, 2)) <= np.where(half > 0.95, 1.0, 0.9))
        np.testing.assert_allclose(got.mean(axis=0), 0, atol=0.1)
        np.testing.assert_allclose(got.std(axis=0), want.std(axis=0), atol=0.08)
    for k, values in goals.items():
        counts = np.bincount(np.concatenate(values), minlength=env.index_ranges()[k])
        share = counts / counts.sum()
        np.testing.assert_allclose(share, 1 / len(share), atol=0.07)


@pytest.mark.parametrize("name", SCENARIOS)
def test_agent_names_and_spaces_are_mpe2s(envs, name):
    """mpe2's agent names in mpe2's order, and each agent's observation size and action
    space (Discrete n, or Box(0, 1) of the same width)."""
    module = getattr(mpe2, MPE2_MODULES[name])
    for config in configs(name):
        for continuous in MODES:
            env = envs.get(name, continuous, **config)
            theirs = module.parallel_env(continuous_actions=continuous, **config)
            assert env.agent_names == tuple(theirs.possible_agents)
            for i, agent in enumerate(theirs.possible_agents):
                policy = next(p for p, spec in env.policy_specs.items() if i in spec.agent_ids)
                spec = env.policy_specs[policy]
                assert spec.obs_dim == theirs.observation_space(agent).shape[0]
                space = theirs.action_space(agent)
                if continuous:
                    assert spec.continuous and spec.action_width == space.shape[0]
                    assert set(spec.actions.low) == {0.0} and set(spec.actions.high) == {1.0}
                else:
                    assert spec.actions == (space.n,)

