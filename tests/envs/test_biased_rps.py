"""biased_rps: the env against its NumPy reference (injected states), check_env, the payoffs
by hand, its exact equilibrium and exploitability, and the mixtures of trained networks
(training.judge.mixtures) on a tiny league run."""
import numba
import numpy as np
import pytest
import torch

import gpusim
from gpusim.check import check_env
from gpusim.envs.biased_rps import BiasedRPSConfig, reference
from gpusim.envs.biased_rps.equilibrium import exploitability, nash, payoff_matrix
from gpusim.errors import ArrayError, ConfigError

ROCK, PAPER, SCISSORS = range(3)


def make(num_envs=4, backend="cpu", **config):
    return gpusim.make("biased_rps", num_envs=num_envs, backend=backend, **config)


@pytest.mark.parametrize("backend", ["cpu", "cudasim"])
def test_matches_the_reference_from_injected_states(backend):
    env = make(num_envs=16, backend=backend, rounds=3)
    rng = np.random.default_rng(0)
    env.reset(seed=1)
    for _ in range(6 if backend == "cudasim" else 30):
        state = {"timestep": rng.integers(0, 3, 16).astype(np.int32)}
        actions = rng.integers(0, 3, (16, 2, 1)).astype(np.int32)
        env.set_state({k: torch.from_numpy(v) for k, v in state.items()})
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
        nxt, want_obs, want_reward, want_term, want_trunc = reference.step(env.config, state,
                                                                           actions)
        np.testing.assert_array_equal(reward.numpy(), want_reward)
        np.testing.assert_array_equal(terminated.numpy(), want_term)
        np.testing.assert_array_equal(truncated.numpy(), want_trunc)
        ended = want_term
        np.testing.assert_array_equal(info["final_obs"].numpy()[ended], want_obs[ended])
        np.testing.assert_array_equal(obs.numpy()[~ended], want_obs[~ended])
        np.testing.assert_array_equal(obs.numpy()[ended], reference.reset(env.config, 16)[1][ended])


def test_check_env_passes():
    env = make(num_envs=8, rounds=2)
    # every episode starts alike by the rules (nothing to draw): seeding has nothing to see
    result = check_env(env, reference=reference.check_env_reference(env.config), steps=60,
                       skip=("seeding",), verbose=False)
    assert result.ok, result


@pytest.mark.parametrize("row, column, paid", [
    (PAPER, ROCK, 2.0), (SCISSORS, PAPER, 3.0), (ROCK, SCISSORS, 1.0),
    (ROCK, PAPER, -2.0), (PAPER, SCISSORS, -3.0), (SCISSORS, ROCK, -1.0),
    (ROCK, ROCK, 0.0), (PAPER, PAPER, 0.0), (SCISSORS, SCISSORS, 0.0)])
def test_the_winner_gets_the_win_of_its_action(row, column, paid):
    env = make(num_envs=1)
    env.reset()
    obs, reward, terminated, truncated, info = env.step(torch.tensor([[[row], [column]]]))
    assert reward.tolist() == [[paid, -paid]]
    assert terminated.tolist() == [True] and truncated.tolist() == [False]
    assert info["final_obs"].tolist() == [[[1.0, 1.0], [1.0, 1.0]]]
    assert obs.tolist() == [[[1.0, 0.0], [1.0, 0.0]]]  # the next episode's first


def test_rounds_end_the_episode_after_the_last_play():
    env = make(num_envs=1, rounds=3)
    env.reset()
    ends = [bool(env.step(torch.zeros((1, 2, 1), dtype=torch.int32))[2]) for _ in range(6)]
    assert ends == [False, False, True, False, False, True]


def test_the_equilibrium_is_exact_and_unexploitable():
    config = BiasedRPSConfig()
    x = nash(config)
    np.testing.assert_allclose(x, [1 / 2, 1 / 6, 1 / 3])
    np.testing.assert_allclose(payoff_matrix(config) @ x, 0.0, atol=1e-12)
    assert exploitability(config, x, x) == pytest.approx(0.0, abs=1e-12)
    odd = BiasedRPSConfig(rock_win=0.5, paper_win=4.0, scissors_win=1.5)
    assert exploitability(odd, nash(odd), nash(odd)) == pytest.approx(0.0, abs=1e-12)
    # uniform play: scissors wins (3 - 1) / 3 against it, on each side
    assert exploitability(config, [1 / 3] * 3, [1 / 3] * 3) == pytest.approx(4 / 3)
    # both rock: paper wins 2 on each side
    assert exploitability(config, [1, 0, 0], [1, 0, 0]) == pytest.approx(4.0)
    assert exploitability(config, x, [1, 0, 0]) == pytest.approx(2.0)  # row at Nash: 0


def test_the_reference_pays_from_the_matrix():
    config = BiasedRPSConfig()
    state, _ = reference.reset(config, 9)
    actions = np.array([[r, c] for r in range(3) for c in range(3)])
    _, _, reward, _, _ = reference.step(config, state, actions)
    np.testing.assert_array_equal(reward[:, 0], payoff_matrix(config).reshape(-1))
    np.testing.assert_array_equal(reward[:, 1], -reward[:, 0])


@pytest.mark.parametrize("overrides, key", [
    ({"rock_win": 0.0}, "rock_win"), ({"paper_win": -1.0}, "paper_win"),
    ({"scissors_win": float("inf")}, "scissors_win"), ({"rounds": 0}, "rounds")])
def test_bad_config_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        BiasedRPSConfig.load(**overrides)


def test_a_bad_strategy_is_one_line():
    with pytest.raises(ValueError, match="the column strategy must be 3 probabilities"):
        exploitability(BiasedRPSConfig(), [1, 0, 0], [0.5, 0.6, 0.0])


def test_set_state_rejects_a_timestep_past_the_rounds():
    env = make(num_envs=1, rounds=2)
    with pytest.raises(ArrayError, match=r"'timestep' must hold values in 0..1 \(config key "
                                         r"rounds\), got 2..2"):
        env.set_state({"timestep": torch.tensor([2], dtype=torch.int32)})


# ---- training.judge.mixtures on a tiny league run -------------------------------------------------
def test_pool_mixture_weighs_the_pools_snapshots(tmp_path):
    from gpusim import train
    from gpusim.training.judge import mixtures
    from gpusim.training.judge.players import open_run
    threads = torch.get_num_threads(), numba.get_num_threads()
    try:
        assert train.main(["--env", "biased_rps", "--backend", "cpu", "--num_envs", "8",
                           "--rollout_len", "4", "--total_steps", "256", "--quiet",
                           "--results_dir", str(tmp_path), "--set", "trainer.league=true",
                           "--set", "trainer.league_capacity=4",
                           "--set", "trainer.league_snapshot_every=2",
                           "--set", "trainer.keep_snapshots=4"]) == 0
    finally:  # the trainer binds this process's thread counts
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    (run_dir,) = tmp_path.iterdir()
    run = open_run(run_dir)
    obs = mixtures.first_observations(run)
    assert obs["row"].tolist() == [[1.0, 0.0]]
    kept = mixtures.snapshot_strategies(run, obs)
    assert [it for it, _ in kept] == [2, 4, 6, 8]
    final = mixtures.strategy(run.finals["row"], obs["row"])
    np.testing.assert_allclose(kept[-1][1]["row"], final)  # the last snapshot is the final
    for rule in mixtures.OPPONENT_RULES:
        mixture, each, weights = mixtures.pool_mixture(run, "row", obs["row"], rule)
        assert each.shape == (4, 3) and weights.shape == (4,)  # 0, 2, 4, 6: 8 took 0's slot
        np.testing.assert_allclose(weights.sum(), 1.0)
        np.testing.assert_allclose(mixture, weights @ each)
    _, _, uniform = mixtures.pool_mixture(run, "row", obs["row"], "uniform")
    np.testing.assert_allclose(uniform, 0.25)
    with pytest.raises(gpusim.GpusimError, match="opponents must be one of"):
        mixtures.pool_mixture(run, "row", obs["row"], "best")
