"""acrobot against gymnasium's own Acrobot-v1, step by step, by state injection."""
import math

import gymnasium
import numpy as np
import pytest
import torch

import gpusim
from conftest import draw_one_frame, step_matches_reference
from gpusim.check import check_env
from gpusim.envs.acrobot.config import AcrobotConfig
from gpusim.envs.acrobot.reference import check_env_reference
from gpusim.errors import ConfigError

PHYSICS = ("theta1", "theta2", "dtheta1", "dtheta2")
MAX_STEPS = 500


def random_acrobot_state(rng, num_envs, max_steps):
    """States over every angle (a few beyond +-pi, for the wrap), velocities over and
    beyond their bounds (for the clip), timesteps over the episode and at its last step."""
    state = {
        "theta1": rng.uniform(-math.pi - 0.3, math.pi + 0.3, num_envs),
        "theta2": rng.uniform(-math.pi - 0.3, math.pi + 0.3, num_envs),
        "dtheta1": rng.uniform(-1.2, 1.2, num_envs) * 4 * math.pi,
        "dtheta2": rng.uniform(-1.2, 1.2, num_envs) * 9 * math.pi,
    }
    timestep = rng.integers(0, max_steps, num_envs)
    timestep[rng.random(num_envs) < 0.2] = max_steps - 1
    state["timestep"] = timestep.astype(np.int32)
    return state


@pytest.mark.parametrize("backend, num_envs, steps, refresh_every",
                         [("cpu", 16, 300, 20), ("cudasim", 2, 40, 4)])
def test_matches_gymnasium(backend, num_envs, steps, refresh_every):
    env = gpusim.make("acrobot", num_envs=num_envs, backend=backend, seed=1)
    env.reset()
    gym_env = gymnasium.make("Acrobot-v1").unwrapped
    gym_env.reset(seed=0)
    rng = np.random.default_rng(5)
    state = random_acrobot_state(rng, num_envs, MAX_STEPS)
    seen = {"terminated": 0, "truncated": 0, "running": 0}
    for t in range(steps):
        if t % refresh_every == 0:
            state = random_acrobot_state(rng, num_envs, MAX_STEPS)
        env.set_state(state)
        actions = rng.integers(0, 3, (num_envs, 1, 1)).astype(np.int32)
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
        after = env.get_state()
        for e in range(num_envs):
            gym_env.state = np.array([state[k][e] for k in PHYSICS], dtype=np.float64)
            want_obs, want_reward, want_term, _, _ = gym_env.step(int(actions[e, 0, 0]))
            want_trunc = (not want_term) and state["timestep"][e] + 1 >= MAX_STEPS
            assert bool(terminated[e]) == want_term, (t, e)
            assert bool(truncated[e]) == want_trunc, (t, e)
            assert reward[e, 0] == want_reward, (t, e)
            done = want_term or want_trunc
            got = info["final_obs"][e, 0] if done else obs[e, 0]
            np.testing.assert_allclose(got.numpy(), want_obs, rtol=0, atol=1e-5)
            if not done:  # a finished replica has been reset already
                got_state = [float(after[k][e]) for k in PHYSICS]
                np.testing.assert_allclose(got_state, gym_env.state, rtol=0, atol=1e-5)
                assert after["timestep"][e] == state["timestep"][e] + 1
            seen["terminated"] += want_term
            seen["truncated"] += want_trunc
            seen["running"] += not done
        state = {k: v.numpy() for k, v in after.items()}
    assert seen["terminated"] > 0 and seen["truncated"] > 0 and seen["running"] > 0, seen


def test_nips_dynamics_and_other_constants_match_gymnasium():
    config = dict(book_or_nips="nips", dt=0.1, link_mass_2=0.7, link_com_pos_1=0.4,
                  link_moi=0.8, max_vel_1=5.0, avail_torque=(-2.0, 0.5, 1.5))
    env = gpusim.make("acrobot", num_envs=16, backend="cpu", seed=3, **config)
    env.reset()
    reference = check_env_reference(env.config)
    rng = np.random.default_rng(8)
    for _ in range(5):
        state = random_acrobot_state(rng, 16, MAX_STEPS)
        actions = rng.integers(0, 3, (16, 1, 1)).astype(np.int32)
        step_matches_reference(env, reference, state, actions, PHYSICS)


def test_reset_state_matches_the_spec():
    env = gpusim.make("acrobot", num_envs=500, backend="cpu", seed=2)
    obs = env.reset()
    assert obs.shape == (500, 1, 6) and obs.dtype == torch.float32
    assert env.policies == {"agent": (0,)} and env.action_nvec == (3,)
    assert env.time_limit == 500
    state = env.get_state()
    assert (state["timestep"] == 0).all()
    for k in PHYSICS:
        values = state[k]
        assert values.dtype == torch.float64
        assert values.abs().max() <= 0.1 and values.std() > 0.04
        assert torch.equal(values, values.float().double())  # float32 values, as gymnasium's
    theta1, theta2 = state["theta1"].numpy(), state["theta2"].numpy()
    want = np.stack([np.cos(theta1), np.sin(theta1), np.cos(theta2), np.sin(theta2),
                     state["dtheta1"].numpy(), state["dtheta2"].numpy()], axis=1)
    np.testing.assert_allclose(obs[:, 0].numpy(), want.astype(np.float32), rtol=0, atol=1e-7)


def test_check_env_passes_with_the_gymnasium_reference():
    env = gpusim.make("acrobot", num_envs=8, backend="cpu", seed=0)
    result = check_env(env, reference=check_env_reference(env.config), steps=520,
                       reference_steps=520, compare_backend="cudasim", compare_steps=5,
                       verbose=False)
    assert result.ok, str(result)
    assert not result["reference"].skipped and not result["backends"].skipped


@pytest.mark.parametrize("data, message", [
    ({"book_or_nips": "paper"}, "'book_or_nips' must be book or nips"),
    ({"avail_torque": [-1.0, 1.0]}, "'avail_torque' must list exactly 3 torques"),
    ({"dt": 0.0}, "'dt' must be positive"),
    ({"max_episode_steps": 0}, "'max_episode_steps' must be at least 1"),
])
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        AcrobotConfig.load(**data)


def test_draw_a_frame():
    draw_one_frame("acrobot")


def test_training_runs(tmp_path):
    from gpusim.train import main
    assert main(["--env", "acrobot", "--backend", "cpu", "--num_envs", "4", "--rollout_len", "16",
                 "--total_steps", "128", "--results_dir", str(tmp_path), "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "metrics.jsonl").is_file()
