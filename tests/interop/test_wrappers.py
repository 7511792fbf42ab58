"""The gymnasium, Stable-Baselines3 and PettingZoo adapters (gpusim.wrappers).

Library checks used where they exist for the API:
- gymnasium: `check_env` asserts a `gymnasium.Env` and has no vector
  counterpart, so its parts that hold for a VectorEnv run on the adapter
  itself: `check_action_space`/`check_observation_space` (single and
  batched), `env_reset_passive_checker`, `check_reset_return_type`,
  `check_reset_options`, `check_reset_seed_determinism` (its obs comparison
  needs a registered spec, so determinism is tested here too),
  `check_returned_data_not_reused` (with one replica: it tests `if terminated`)
  and `env_data_reuse_passive_checker`, all with warnings as errors. Its
  single-env step checks (`env_step_passive_checker`, `check_step_determinism`)
  expect scalar rewards and flags, so the batched shapes, dtypes, space
  membership, SAME_STEP `final_obs` and seeding are tested here directly, and
  gymnasium's `RecordEpisodeStatistics` must count episodes right.
- PettingZoo: `parallel_api_test`, `parallel_seed_test`, and the AEC
  `api_test` through `parallel_to_aec`, on tag_continuous, tag_gridworld and
  cartpole.
- SB3: a short PPO run in the default suite, and the learning claim (cartpole
  solved) as a slow test.
"""
import contextlib
import importlib
import sys
import time
import warnings

import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.utils import env_checker, passive_env_checker
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import gpusim
from gpusim.errors import ArrayError, ConfigError, GpusimError
from mixed_team_env import MixedTeam
from gpusim.wrappers import to_gymnasium, to_pettingzoo, to_sb3, to_torchrl
from gpusim.wrappers.gymnasium import action_space_of

SMALL_TAG = dict(num_taggers=2, num_runners=3, num_other_agents_observed=2, episode_length=20)
# a small arena and a wide tag radius: runners are tagged (and leave play) within a few steps
TAGGY = dict(SMALL_TAG, episode_length=40, grid_length=2.0, tagging_distance=0.2)
SMALL_CONFIGS = {"tag_continuous": TAGGY, "tag_gridworld": dict(episode_length=20)}
# every registered env (small where it is large), and a few variants
PETTINGZOO_ENVS = {
    **{name: (name, SMALL_CONFIGS.get(name, {})) for name in gpusim.env_names()},
    "tag_continuous, Box actions": ("tag_continuous", dict(TAGGY, continuous_actions=True)),
    "mixed_team": ("mixed_team_env:MixedTeam", {}),  # a Box and a discrete policy, per-agent done
}


def cartpole(num_envs=4, seed=0, **config):
    return gpusim.make("cartpole", num_envs=num_envs, backend="cpu", seed=seed, **config)


def strict(check, *args, **kwargs):
    """Run a library check with its warnings raised as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return check(*args, **kwargs)


def alternating(num_envs, t):
    """Push left, then right: the pole stays up for the first few dozen steps."""
    return np.full(num_envs, t % 2)


# ---- the package and its errors --------------------------------------------------------
LIBRARIES = ("gymnasium", "pettingzoo", "torchrl", "stable_baselines3")


def test_importing_the_package_needs_no_library(monkeypatch):
    monkeypatch.delattr(gpusim, "wrappers", raising=False)  # both restored afterwards
    for name in [m for m in sys.modules if m.startswith("gpusim.wrappers")]:
        monkeypatch.delitem(sys.modules, name)
    for library in LIBRARIES:
        monkeypatch.setitem(sys.modules, library, None)  # `import library` fails
    wrappers = importlib.import_module("gpusim.wrappers")
    assert callable(wrappers.to_gymnasium)


@pytest.mark.parametrize("adapter, library", [
    (to_gymnasium, "gymnasium"), (to_pettingzoo, "pettingzoo"), (to_torchrl, "torchrl"),
    (to_sb3, "stable_baselines3")])
def test_a_missing_library_is_one_clear_error(monkeypatch, adapter, library):
    monkeypatch.setitem(sys.modules, library, None)
    with pytest.raises(GpusimError, match=f"^{adapter.__name__} needs {library}: pip install"):
        adapter(cartpole(num_envs=1))


@pytest.mark.parametrize("adapter", [to_gymnasium, to_pettingzoo, to_sb3])
def test_an_adapter_takes_a_gpusim_env(adapter):
    with pytest.raises(GpusimError, match=f"^{adapter.__name__} takes a gpusim env"):
        adapter(object())


def test_gymnasium_refuses_a_multi_agent_env():
    env = gpusim.make("tag_gridworld", num_envs=2, backend="cpu")
    with pytest.raises(GpusimError, match="has 4 agents: use to_pettingzoo .* or to_torchrl"):
        to_gymnasium(env)


def test_gymnasium_refuses_an_agent_that_can_leave_before_its_replica(monkeypatch):
    env = cartpole(num_envs=2)
    monkeypatch.setattr(env, "agent_active_array", "in_play")  # as an env with per-agent done
    with pytest.raises(GpusimError, match="agent can leave play earlier .* use to_pettingzoo"):
        to_gymnasium(env)


# ---- gymnasium -------------------------------------------------------------------------
def test_gymnasium_spaces():
    venv = to_gymnasium(cartpole(num_envs=4))
    assert venv.num_envs == 4
    assert venv.single_observation_space == spaces.Box(-np.inf, np.inf, (4,), np.float32)
    assert venv.single_action_space == spaces.Discrete(2)  # what SB3 and CartPole-v1 use
    assert venv.observation_space.shape == (4, 4)
    assert venv.action_space == spaces.MultiDiscrete([2, 2, 2, 2])
    assert venv.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    for space in (venv.single_action_space, venv.action_space):
        strict(passive_env_checker.check_action_space, space)
    for space in (venv.single_observation_space, venv.observation_space):
        strict(passive_env_checker.check_observation_space, space)
    several = spaces.MultiDiscrete([3, 4])
    assert action_space_of(several) is several


def test_gymnasium_library_checks():
    venv = to_gymnasium(cartpole(num_envs=4))
    strict(passive_env_checker.env_reset_passive_checker, venv, seed=1)
    strict(env_checker.check_reset_return_type, venv)
    strict(env_checker.check_reset_options, venv)
    strict(env_checker.check_reset_seed_determinism, venv)
    strict(env_checker.check_returned_data_not_reused, to_gymnasium(cartpole(num_envs=1)))
    previous = venv.reset(seed=2)
    for t in range(3):
        obs, _, _, _, infos = venv.step(venv.action_space.sample())
        strict(passive_env_checker.env_data_reuse_passive_checker, previous, (obs, infos),
               "step", "step")
        previous = (obs, infos)


def test_gymnasium_step_returns_and_final_obs():
    """Types, shapes and dtypes of every step, and SAME_STEP's final_obs, over several episodes."""
    venv = to_gymnasium(cartpole(num_envs=6))
    venv.action_space.seed(0)
    obs, infos = venv.reset(seed=5)
    assert obs.dtype == np.float32 and obs in venv.observation_space
    assert list(infos["agent_name"]) == ["agent_0"] * 6 and infos["_agent_name"].all()
    ended = 0
    for _ in range(60):
        obs, rewards, terminations, truncations, infos = venv.step(venv.action_space.sample())
        assert obs.dtype == np.float32 and obs in venv.observation_space
        assert rewards.dtype == np.float32 and rewards.shape == (6,)
        for flags in (terminations, truncations):
            assert flags.dtype == np.bool_ and flags.shape == (6,)
        done = terminations | truncations
        if not done.any():
            assert infos == {}
            continue
        ended += int(done.sum())
        assert set(infos) == {"final_obs", "_final_obs", "final_info", "_final_info"}
        np.testing.assert_array_equal(infos["_final_obs"], done)
        np.testing.assert_array_equal(infos["_final_info"], done)
        for i in range(6):
            final = infos["final_obs"][i]
            if done[i]:  # fell: the final state is out of bounds, the new one near 0
                assert final in venv.single_observation_space
                assert abs(final[0]) > 2.4 or abs(final[2]) > 0.2094
                assert np.abs(obs[i]).max() <= 0.05
            else:
                assert final is None
    assert ended >= 6


def test_gymnasium_matches_the_env():
    """The adapter returns the env's own values: obs, rewards, flags and final_obs."""
    venv = to_gymnasium(cartpole(num_envs=3, max_episode_steps=7))
    env = cartpole(num_envs=3, max_episode_steps=7)
    obs, _ = venv.reset(seed=11)
    np.testing.assert_array_equal(obs, env.reset(seed=11)[:, 0].numpy())
    rng = np.random.default_rng(0)
    for _ in range(30):
        actions = rng.integers(0, 2, 3)
        obs, rewards, terminations, truncations, infos = venv.step(actions)
        e_obs, e_reward, e_term, e_trunc, e_info = env.step(torch.from_numpy(actions)[:, None, None])
        np.testing.assert_array_equal(obs, e_obs[:, 0].numpy())
        np.testing.assert_array_equal(rewards, e_reward[:, 0].numpy())
        np.testing.assert_array_equal(terminations, e_term.numpy())
        np.testing.assert_array_equal(truncations, e_trunc.numpy())
        for i in np.flatnonzero(e_info["reset_mask"].numpy()):
            np.testing.assert_array_equal(infos["final_obs"][i], e_info["final_obs"][i, 0].numpy())


def test_gymnasium_seeding_is_deterministic():
    def rollout(seed, construction_seed):
        venv = to_gymnasium(cartpole(num_envs=4, seed=construction_seed))
        venv.action_space.seed(3)
        trajectory = [venv.reset(seed=seed)]
        trajectory += [venv.step(venv.action_space.sample()) for _ in range(25)]
        trajectory.append(venv.reset())  # unseeded: continues the seeded streams
        return trajectory

    first = rollout(123, construction_seed=0)
    assert env_checker.data_equivalence(first, rollout(123, construction_seed=9), exact=True)
    assert not env_checker.data_equivalence(first[0], rollout(124, construction_seed=0)[0])
    assert not env_checker.data_equivalence(first[0], first[-1])


def test_gymnasium_episode_statistics_follow_same_step_autoreset():
    venv = RecordEpisodeStatistics(to_gymnasium(cartpole(num_envs=4, max_episode_steps=5)))
    venv.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(15):
            _, _, terminations, truncations, infos = venv.step(alternating(4, t))
    assert not terminations.any() and truncations.all()
    assert list(venv.length_queue) == [5] * 12 and list(venv.return_queue) == [5.0] * 12
    np.testing.assert_array_equal(infos["episode"]["l"], [5] * 4)


def test_gymnasium_refusals():
    venv = to_gymnasium(cartpole(num_envs=2))
    with pytest.raises(GpusimError, match="call reset"):
        venv.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(GpusimError, match="reset_mask"):
        venv.reset(options={"reset_mask": np.array([True, False])})
    venv.reset(seed=0)
    with pytest.raises(ArrayError, match=r"shape \(2,\)"):
        venv.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ArrayError, match="out of range"):
        venv.step(np.array([0, 2]))
    with pytest.raises(ConfigError, match="seed"):
        venv.reset(seed=-1)


# ---- Stable-Baselines3 -------------------------------------------------------------------
def test_sb3_vec_env_reports_episode_ends_as_sb3_expects():
    vec_env = to_sb3(cartpole(num_envs=3, max_episode_steps=5))
    vec_env.seed(0)
    assert vec_env.reset().shape == (3, 4)
    for t in range(5):
        obs, rewards, dones, infos = vec_env.step(alternating(3, t))
    assert dones.all() and rewards.dtype == np.float32 and len(infos) == 3
    for i, info in enumerate(infos):
        assert info["TimeLimit.truncated"] is True
        assert info["terminal_observation"].shape == (4,)
        assert not np.array_equal(info["terminal_observation"], obs[i])
    assert vec_env.get_attr("num_envs") == [3, 3, 3]
    assert vec_env.env_is_wrapped(object) == [False] * 3


def test_sb3_takes_same_step_vector_envs_only():
    import gymnasium

    wrapped = RecordEpisodeStatistics(to_gymnasium(cartpole(num_envs=2)))
    assert to_sb3(wrapped).num_envs == 2
    next_step = gymnasium.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(GpusimError, match="SAME_STEP"):
        to_sb3(next_step)


def test_sb3_ppo_runs():
    """A few hundred steps of PPO through the adapter: no learning claim, only that it runs."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor

    vec_env = VecMonitor(to_sb3(cartpole(num_envs=4)))
    model = PPO("MlpPolicy", vec_env, n_steps=32, batch_size=64, n_epochs=2, seed=0,
                device="cpu")
    model.learn(256)
    assert model.num_timesteps == 256 and len(model.ep_info_buffer) > 0


@contextlib.contextmanager
def one_thread_each():
    """torch and numba on one thread each: two OpenMP pools that spin against each other
    (and against other processes) cost several times the run (docs/interop.md)."""
    import numba

    saved = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        numba.set_num_threads(saved[1])


@pytest.mark.slow
@pytest.mark.learning
def test_sb3_ppo_solves_cartpole():
    """rl-zoo's CartPole-v1 PPO recipe until the last 100 episodes average >= 475.

    On a 2-core AMD EPYC VM without a GPU (torch 2.13 CPU, SB3 2.9.2): solved at
    67,864 steps in 10 to 11 s of learning (docs/interop.md).
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecMonitor

    def mean_return(model):
        buffer = model.ep_info_buffer
        return np.mean([e["r"] for e in buffer]) if len(buffer) == 100 else 0.0

    class StopWhenSolved(BaseCallback):
        def _on_step(self):
            return mean_return(self.model) < 475

    def linear(start):
        return lambda progress_remaining: progress_remaining * start

    with one_thread_each():
        vec_env = VecMonitor(to_sb3(cartpole(num_envs=8)))
        model = PPO("MlpPolicy", vec_env, n_steps=32, batch_size=256, gae_lambda=0.8,
                    gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3),
                    clip_range=linear(0.2), seed=0, device="cpu")
        start = time.perf_counter()
        model.learn(300_000, callback=StopWhenSolved())
    print(f"PPO on cartpole: {model.num_timesteps} steps, {time.perf_counter() - start:.1f} s, "
          f"mean return {mean_return(model):.1f} over the last 100 episodes")
    assert mean_return(model) >= 475


# ---- PettingZoo ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(PETTINGZOO_ENVS))
def test_pettingzoo_api_tests(case):
    from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test
    from pettingzoo.utils.conversions import parallel_to_aec

    name, config = PETTINGZOO_ENVS[case]

    def make():
        return to_pettingzoo(gpusim.make(name, num_envs=1, backend="cpu", **config))

    strict(parallel_api_test, make(), num_cycles=60)  # long enough to end an episode
    strict(parallel_seed_test, make, num_cycles=60)
    with warnings.catch_warnings():
        # Advice, not API errors: gpusim's observation Box is unbounded, tag_continuous's
        # action is two components (a MultiDiscrete, not "probably" a Discrete or Box), and
        # mixed_team's policies observe differently by design (and zeros once out of play).
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "Agent's (minimum|maximum) observation space value")
        warnings.filterwarnings("ignore", "Action space for each agent probably should be")
        warnings.filterwarnings("ignore", "Agents have different observation space sizes")
        warnings.filterwarnings("ignore", "Observations are different shapes")
        warnings.filterwarnings("ignore", "Observation numpy array is all zeros")
        api_test(parallel_to_aec(make()), num_cycles=60)


def test_pettingzoo_agents_and_spaces():
    par_env = to_pettingzoo(gpusim.make("tag_continuous", num_envs=1, backend="cpu",
                                        **SMALL_TAG))
    assert par_env.possible_agents == ["tagger_0", "tagger_1", "runner_0", "runner_1",
                                       "runner_2"]
    assert par_env.agents == []
    obs, infos = par_env.reset(seed=0)
    assert par_env.agents == par_env.possible_agents and set(obs) == set(infos)
    assert par_env.action_space("runner_0") == spaces.MultiDiscrete([21, 21])
    assert par_env.action_space("runner_0") is not par_env.action_space("runner_1")
    assert obs["runner_0"] in par_env.observation_space("runner_0")
    gridworld = to_pettingzoo(gpusim.make("tag_gridworld", num_envs=1, backend="cpu"))
    assert gridworld.possible_agents == ["tagger_0", "tagger_1", "tagger_2", "runner_0"]
    assert gridworld.action_space("tagger_0") == spaces.Discrete(5)
    assert gridworld.render() is None


def test_pettingzoo_box_actions_and_policies_that_differ():
    pendulum = to_pettingzoo(gpusim.make("pendulum", num_envs=1, backend="cpu"))
    assert pendulum.possible_agents == ["agent_0"]
    assert pendulum.action_space("agent_0") == spaces.Box(-2.0, 2.0, (1,), np.float32)
    pendulum.reset(seed=0)
    pendulum.step({"agent_0": np.array([9.0], dtype=np.float32)})  # clipped to 2 by the env
    np.testing.assert_array_equal(pendulum.env.arrays["continuous_actions"][0, 0], [2.0])
    mixed = to_pettingzoo(MixedTeam(num_envs=1, backend="cpu"))
    assert mixed.possible_agents == ["glider_0", "glider_1", "stepper_2"]  # declares no names
    assert mixed.observation_space("glider_0").shape == (2,)
    assert mixed.observation_space("stepper_2").shape == (3,)
    assert mixed.action_space("stepper_2") == spaces.Discrete(3)
    obs, _ = mixed.reset(seed=1)
    assert obs["glider_1"].shape == (2,) and obs["stepper_2"].shape == (3,)
    with pytest.raises(ArrayError, match="action of glider_0 must be 1 number"):
        mixed.step({"glider_0": [0.1, 0.2], "glider_1": 0.0, "stepper_2": 1})


def play_alongside(par_env, twin, steps):
    """Step the adapter (its replica 1) and a twin env with the same actions; yield, per step,
    what the adapter returned, the twin's agent_active() before and after, and its step."""
    ids = {agent: i for i, agent in enumerate(twin.agent_names)}
    par_env.reset(seed=5)
    twin.reset(seed=5)
    for _ in range(steps):
        if not par_env.agents:
            par_env.reset()
            twin.reset()
        actions = {a: par_env.action_space(a).sample() for a in par_env.agents}
        full = torch.zeros((2, twin.num_agents, 2), dtype=torch.int64)
        for agent, action in actions.items():
            full[1, ids[agent]] = torch.as_tensor(action)
        before = twin.agent_active().clone()
        live = list(par_env.agents)
        result = par_env.step(actions)
        yield live, result, before[1], twin.step(full), twin.agent_active()[1]


def test_pettingzoo_agents_leave_when_their_own_episode_ends():
    """Against env.agent_active() of a twin env: a tagged runner is terminated once, on the
    step it leaves play, then is gone from agents and from every dict."""
    par_env = to_pettingzoo(gpusim.make("tag_continuous", num_envs=2, backend="cpu", **TAGGY),
                            replica=1)
    twin = gpusim.make("tag_continuous", num_envs=2, backend="cpu", **TAGGY)
    for space in par_env.action_spaces.values():
        space.seed(0)
    names = twin.agent_names
    left = ends = 0
    for live, (obs, rewards, terms, truncs, infos), before, twin_step, after in play_alongside(
            par_env, twin, 200):
        _, reward, terminated, truncated, info = twin_step
        assert live == [a for a, playing in zip(names, before.tolist()) if playing]
        for values in (obs, rewards, terms, truncs, infos):
            assert list(values) == live
        assert rewards == {a: float(reward[1, names.index(a)]) for a in live}
        if bool(info["reset_mask"][1]):  # the replica's end: every agent still in play
            ends += 1
            assert terms == dict.fromkeys(live, bool(terminated[1]))
            assert truncs == dict.fromkeys(live, bool(truncated[1]))
            assert par_env.agents == []
            continue
        leaving = [a for a in live if not after[names.index(a)]]
        left += len(leaving)
        assert terms == {a: a in leaving for a in live} and not any(truncs.values())
        assert par_env.agents == [a for a in live if a not in leaving]
    assert left >= 10 and ends >= 5, (left, ends)


def test_pettingzoo_episode_end_returns_the_final_observation():
    """On the last step the adapter returns final_obs, not the restarted replica's state;
    the other replica steps alongside with action 0."""
    config = dict(episode_length=3)
    par_env = to_pettingzoo(gpusim.make("tag_gridworld", num_envs=2, backend="cpu", **config),
                            replica=1)
    env = gpusim.make("tag_gridworld", num_envs=2, backend="cpu", **config)
    obs, _ = par_env.reset(seed=4)
    e_obs = env.reset(seed=4)
    np.testing.assert_array_equal(np.stack(list(obs.values())), e_obs[1].numpy())
    actions = torch.zeros((2, 4, 1), dtype=torch.int64)
    for t in range(3):
        actions[1, :, 0] = torch.tensor([1, 2, 3, t])
        obs, rewards, terminations, truncations, _ = par_env.step(
            {agent: int(actions[1, i, 0]) for i, agent in enumerate(par_env.possible_agents)})
        e_obs, e_reward, e_term, e_trunc, e_info = env.step(actions)
        np.testing.assert_array_equal(list(rewards.values()), e_reward[1].numpy())
    assert set(truncations.values()) == {bool(e_trunc[1])}  # no per-agent done here
    assert set(terminations.values()) == {bool(e_term[1])}
    assert bool(e_info["reset_mask"][1]) and par_env.agents == []
    final = np.stack(list(obs.values()))
    np.testing.assert_array_equal(final, e_info["final_obs"][1].numpy())
    assert not np.array_equal(final, e_obs[1].numpy())  # the restarted state is not leaked
    with pytest.raises(GpusimError, match="call reset"):
        par_env.step({})
    par_env.reset()
    assert par_env.agents == par_env.possible_agents


def test_pettingzoo_refusals():
    env = gpusim.make("tag_gridworld", num_envs=2, backend="cpu")
    for replica in (2, -1, True, 0.5):
        with pytest.raises(ConfigError, match=r"replica must be an integer in 0\.\.1"):
            to_pettingzoo(env, replica=replica)
    par_env = to_pettingzoo(env)
    par_env.reset(seed=0)
    actions = dict.fromkeys(par_env.agents, 0)
    with pytest.raises(ArrayError, match=r"missing \['runner_0'\]"):
        par_env.step({a: 0 for a in par_env.agents[:-1]})
    with pytest.raises(ArrayError, match=r"unknown or out of play \['runner_9'\]"):
        par_env.step({**actions, "runner_9": 0})
    with pytest.raises(ArrayError, match="must be a dict agent name -> action"):
        par_env.step([0, 0, 0, 0])
    with pytest.raises(ArrayError, match="action of tagger_0 must be 1 integer"):
        par_env.step({**actions, "tagger_0": 0.5})
    with pytest.raises(ArrayError, match="out of range"):
        par_env.step({**actions, "tagger_0": 5})
