"""cartpole against gymnasium's own CartPole-v1, step by step, by state injection."""
import gymnasium
import numpy as np
import pytest
import torch

import gpusim


def random_cartpole_state(rng, num_envs, max_steps):
    """States spread over and beyond the termination limits, timesteps over the episode."""
    state = {
        "x": rng.uniform(-2.6, 2.6, num_envs),
        "x_dot": rng.uniform(-3, 3, num_envs),
        "theta": rng.uniform(-0.25, 0.25, num_envs),
        "theta_dot": rng.uniform(-3, 3, num_envs),
    }
    state = {k: v.astype(np.float32) for k, v in state.items()}
    timestep = rng.integers(0, max_steps, num_envs)
    timestep[rng.random(num_envs) < 0.2] = max_steps - 1
    state["timestep"] = timestep.astype(np.int32)
    return state


@pytest.mark.parametrize("backend, num_envs, steps", [("cpu", 16, 300), ("cudasim", 2, 200)])
def test_matches_gymnasium(backend, num_envs, steps):
    env = gpusim.make("cartpole", num_envs=num_envs, backend=backend, seed=1)
    env.reset()
    gym_env = gymnasium.make("CartPole-v1").unwrapped
    gym_env.reset(seed=0)
    rng = np.random.default_rng(5)
    state = random_cartpole_state(rng, num_envs, 500)
    seen = {"terminated": 0, "truncated": 0}
    for t in range(steps):
        if t % 20 == 0:
            state = random_cartpole_state(rng, num_envs, 500)
        env.set_state(state)
        actions = rng.integers(0, 2, (num_envs, 1, 1)).astype(np.int32)
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
        for e in range(num_envs):
            gym_env.state = np.array([state[k][e] for k in ("x", "x_dot", "theta", "theta_dot")],
                                     dtype=np.float64)
            gym_env.steps_beyond_terminated = None
            want_obs, want_reward, want_term, _, _ = gym_env.step(int(actions[e, 0, 0]))
            want_trunc = (not want_term) and state["timestep"][e] + 1 >= 500
            assert bool(terminated[e]) == want_term, (t, e)
            assert bool(truncated[e]) == want_trunc, (t, e)
            assert reward[e, 0] == want_reward
            got = info["final_obs"][e, 0] if (want_term or want_trunc) else obs[e, 0]
            np.testing.assert_allclose(got.numpy(), want_obs, rtol=1e-6, atol=1e-7)
            seen["terminated"] += want_term
            seen["truncated"] += want_trunc
        state = {k: v.numpy() for k, v in env.get_state().items()}
    assert seen["terminated"] > 0 and seen["truncated"] > 0


def test_reset_state_matches_the_spec():
    env = gpusim.make("cartpole", num_envs=500, backend="cpu", seed=2)
    obs = env.reset()
    assert obs.shape == (500, 1, 4) and env.policies == {"agent": (0,)}
    assert obs.abs().max() <= 0.05 and obs.std() > 0.02
    state = env.get_state()
    assert (state["timestep"] == 0).all()
    assert torch.equal(state["theta"], obs[:, 0, 2])
