"""Policies that observe and act differently, continuous actions, and per-agent done: the env
API (spaces, action dicts, clipping in the kernel), the Gaussian head's log-probability, and
a two-policy env (tests/mixed_team_env.py) that trains, checkpoints and resumes."""
import json
import math

import numpy as np
import pytest
import torch

from gpusim import train
from gpusim.errors import ArrayError, GpusimError
from gpusim.spaces import Box
from gpusim.training.algorithms.ppo import PPO
from gpusim.training.loop import Trainer
from gpusim.training.models import GaussianActorCritic
from gpusim.training.run_config import PolicyConfig, load_run_config

from mixed_team_env import MixedTeam, TwoSets


def mixed_env(num_envs=4, **kwargs):
    return MixedTeam(num_envs=num_envs, backend="cpu", seed=3, **kwargs)


def trainer(**overrides):
    settings = {"trainer.backend": "cpu", "trainer.num_envs": 16, "trainer.rollout_len": 32,
                "trainer.total_steps": 16 * 32 * 16}
    settings.update({f"trainer.{k}": v for k, v in overrides.items()})
    return Trainer(load_run_config("mixed_team", MixedTeam, overrides=settings), MixedTeam)


# ---- the env API --------------------------------------------------------------------
def test_each_policy_has_its_own_spaces():
    env = mixed_env()
    glider, stepper = env.policy_specs["glider"], env.policy_specs["stepper"]
    assert (glider.obs_dim, glider.continuous, glider.action_width) == (2, True, 1)
    assert (stepper.obs_dim, stepper.continuous, stepper.actions) == (3, False, (3,))
    assert env.mixed_actions and env.obs_dim == 3
    pytest.importorskip("gymnasium")
    assert env.observation_space["glider"].shape == (2,)
    assert env.action_space["glider"].low.tolist() == [pytest.approx(-0.2)]
    assert env.action_space["stepper"].nvec.tolist() == [3]


def actions_for(env, glide, step):
    return {"glider": torch.full((env.num_envs, 2, 1), glide),
            "stepper": torch.full((env.num_envs, 1, 1), step, dtype=torch.int32)}


def test_continuous_actions_are_clipped_inside_the_kernel():
    env = mixed_env()
    env.reset()
    state = env.get_state()
    state["x"][:] = 0.0
    state["goal"][:] = 1.0  # far: nobody leaves play
    env.set_state(state)
    env.step(actions_for(env, 5.0, 2))  # beyond the bound of 0.2
    x = env.get_state()["x"]
    torch.testing.assert_close(x, torch.full_like(x, 0.2))
    env.step(actions_for(env, -0.05, 1))
    x = env.get_state()["x"]
    torch.testing.assert_close(x[:, :2], torch.full_like(x[:, :2], 0.15))
    torch.testing.assert_close(x[:, 2], torch.full_like(x[:, 2], 0.2))


@pytest.mark.parametrize("actions, message", [
    ({"glider": torch.zeros(4, 2, 1)}, "one tensor per policy"),
    ({"glider": torch.zeros(4, 2, 1, dtype=torch.int32),
      "stepper": torch.zeros(4, 1, 1, dtype=torch.int32)}, "must have a float dtype"),
    ({"glider": torch.zeros(4, 3, 1), "stepper": torch.zeros(4, 1, 1, dtype=torch.int32)},
     "must have shape (4, 2, 1)"),
    ({"glider": torch.full((4, 2, 1), math.nan),
      "stepper": torch.zeros(4, 1, 1, dtype=torch.int32)}, "action is not finite"),
    ({"glider": torch.zeros(4, 2, 1), "stepper": torch.full((4, 1, 1), 3, dtype=torch.int32)},
     "action out of range"),
    (torch.zeros(4, 3, 1, dtype=torch.int32), "pass actions as a dict"),
])
def test_bad_actions_are_refused(actions, message):
    env = mixed_env()
    env.reset()
    with pytest.raises(ArrayError) as err:
        env.step(actions)
    assert message in str(err.value)


def test_an_agent_leaves_play_while_its_team_goes_on():
    env = mixed_env(num_envs=1)
    env.reset()
    state = env.get_state()
    state["x"][:] = torch.tensor([[0.0, 0.0, 0.0]])
    state["goal"][:] = torch.tensor([[0.15, -1.0, 1.0]])  # agent 0 arrives this step
    env.set_state(state)
    obs, reward, terminated, truncated, _ = env.step(actions_for(env, 0.15, 1))
    assert env.get_state()["in_play"].tolist() == [[0, 1, 1]]
    assert reward[0, 0] == pytest.approx(1.0 - 0.1 * 0.0, abs=1e-6) and not terminated[0]
    assert obs[0, 0].abs().sum() == 0 and env.agent_active().tolist() == [[False, True, True]]
    _, reward, _, _, _ = env.step(actions_for(env, 0.2, 1))
    assert reward[0, 0] == 0 and reward[0, 1] < 0


@pytest.mark.parametrize("bad, message", [
    ({"action_box": Box((-1.0,), (1.0,))}, "not both"),
    ({"policy_obs_dim": {"glider": 4}}, "must be 1..obs_dim"),
    ({"policy_actions": {"nobody": (2,)}}, "are not policies"),
    ({"policy_actions": {"glider": (2, 0), "stepper": (3,)}}, "has no action space"),
])
def test_inconsistent_spaces_are_refused(bad, message):
    class Broken(MixedTeam):
        def setup(self, config):
            super().setup(config)
            if "action_box" in bad:
                self.action_nvec = (3,)
            for key, value in bad.items():
                setattr(self, key, value)
    with pytest.raises(GpusimError) as err:
        Broken(num_envs=1, backend="cpu")
    assert message in str(err.value)


def test_box_bounds_must_be_sane():
    with pytest.raises(GpusimError, match="below high"):
        Box((1.0,), (1.0,))
    with pytest.raises(GpusimError, match="finite"):
        Box((-math.inf,), (1.0,))


# ---- the Gaussian head ----------------------------------------------------------------
@pytest.mark.parametrize("state_dependent", [False, True])
def test_gaussian_log_prob_matches_torch_distributions(state_dependent):
    from torch.distributions import Normal, TransformedDistribution
    from torch.distributions.transforms import AffineTransform, TanhTransform
    torch.manual_seed(0)
    low, high = (-2.0, 0.0, -1.0), (2.0, 1.0, 3.0)
    model = GaussianActorCritic(5, low, high, (16,), "tanh", state_dependent, log_std_init=-0.5)
    obs = torch.randn(64, 5)
    raw, log_prob, _ = model.sample(obs)
    mean, log_std = model.distribution(obs)
    center = (torch.tensor(high) + torch.tensor(low)) / 2
    half = (torch.tensor(high) - torch.tensor(low)) / 2
    squashed = TransformedDistribution(Normal(mean, log_std.exp()),
                                       [TanhTransform(), AffineTransform(center, half)])
    action = model.squash(raw)
    assert bool(((action > torch.tensor(low)) & (action < torch.tensor(high))).all())
    want = squashed.log_prob(action).sum(-1)
    torch.testing.assert_close(log_prob, want, rtol=1e-4, atol=1e-4)
    # evaluate gives the same for the stored raw action; far in the tails it stays finite
    torch.testing.assert_close(model(obs, raw)[0], log_prob)
    assert bool(torch.isfinite(model(obs, torch.full_like(raw, 30.0))[0]).all())
    entropy = model(obs, raw)[1]
    torch.testing.assert_close(entropy, Normal(mean, log_std.exp()).entropy().sum(-1))


def test_policy_config_for_continuous_heads():
    assert PolicyConfig().state_dependent_std is False
    model = GaussianActorCritic(3, (-1.0,), (1.0,), (8,), log_std_init=-1.0)
    assert model.log_std.tolist() == [-1.0]


# ---- training ---------------------------------------------------------------------------
def losses_seen(monkeypatch) -> list:
    """(policy, buffer rows, row weights) of every loss PPO computes from now on."""
    seen = []
    original = PPO.loss

    def spy(self, policy, rows, adv, returns, weights, *args, **kwargs):
        seen.append((policy.name, rows, weights))
        return original(self, policy, rows, adv, returns, weights, *args, **kwargs)
    monkeypatch.setattr(PPO, "loss", spy)
    return seen


def test_rollout_marks_per_agent_done_and_trains_only_on_agents_in_play(monkeypatch):
    t = trainer()
    t.algorithm.collect(0)
    glider, stepper = (g.buffer for g in t.algorithm.policies)
    assert glider.obs.shape[-1] == 2 and stepper.obs.shape[-1] == 3
    assert glider.actions.dtype == torch.float32 and stepper.actions.dtype == torch.int32
    # an agent that left play is done at that step, and inactive until its replica resets
    left = glider.active[:-1] & ~glider.active[1:]
    assert bool(left.any()) and bool(glider.dones[:-1][left].all())
    assert not bool(glider.active.all())
    seen = losses_seen(monkeypatch)
    t.algorithm.update(1e-3)
    for name, rows, weights in seen:  # rows out of play are left out of the loss
        buffer = next(g.buffer for g in t.algorithm.policies if g.name == name)
        assert weights is None and bool(buffer.active.reshape(-1)[rows].all())
    # every row in play is trained on (in each epoch, less a remainder under a minibatch)
    glider_rows = torch.cat([rows for name, rows, _ in seen if name == "glider"]).unique()
    in_play = int(glider.active.sum())
    epoch_rows = in_play - in_play % t.algorithm.cfg.num_minibatches
    assert epoch_rows <= glider_rows.numel() <= in_play


def test_rows_in_play_fewer_than_minibatches_weigh_the_others_zero(monkeypatch):
    t = trainer()
    t.algorithm.collect(0)
    g = t.algorithm.policies[0]
    g.buffer.active.zero_()
    g.buffer.active.view(-1)[0] = True  # one row in play, fewer than the minibatches
    seen = losses_seen(monkeypatch)
    t.algorithm.update(1e-3)
    for name, rows, weights in seen:
        if name != g.name:
            continue
        assert torch.equal(weights, g.buffer.active.reshape(-1)[rows].float())


def test_two_policies_with_different_spaces_learn():
    t = trainer(total_steps=16 * 32 * 14, lr=1e-3)
    t.algorithm.collect(0)
    random_returns = {name: np.mean(r) for name, r in t.algorithm.episodes.finished().items()}
    t.iteration = 0
    summary = t.train()
    for name, start in random_returns.items():  # a random walker rarely finds its goal
        assert start < 0.3 and summary["episode_return"][name] > start + 0.4, (name, summary)


def run(results, *args):
    return train.main(["--env", "mixed_team_env:MixedTeam", "--backend", "cpu",
                       "--num_envs", "8", "--rollout_len", "16", "--results_dir",
                       str(results), "--quiet", "--set", "trainer.checkpoint_every=2", *args])


def test_checkpoint_and_resume_match_an_uninterrupted_run(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert run(full, "--total_steps", str(128 * 6)) == 0
    assert run(part, "--total_steps", str(128 * 4)) == 0
    (part_dir,) = part.iterdir()
    assert train.main(["--resume", str(part_dir), "--total_steps", str(128 * 6), "--quiet"]) == 0
    (full_dir,) = full.iterdir()
    drop = ("time_s", "env_steps_per_s")

    def metrics(run_dir):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in drop and not k.startswith("time_share")}
                for r in rows]
    assert metrics(part_dir) == metrics(full_dir)
    state = torch.load(sorted((full_dir / "checkpoints").iterdir())[-1], weights_only=True)
    models = state["algorithm"]["models"]
    assert "log_std" in models["glider"] and "log_std" not in models["stepper"]


# ---- evaluation, rendering and adapters ---------------------------------------------------
def test_a_mixed_run_is_evaluated_with_trained_and_random_policies(tmp_path):
    from gpusim.training.trained import evaluation
    assert run(tmp_path, "--total_steps", str(128 * 2)) == 0
    (run_dir,) = tmp_path.iterdir()
    assert evaluation.main([str(run_dir), "--episodes", "4"]) == 0
    saved = json.loads((run_dir / "eval.json").read_text())
    assert list(saved["pairings"]) == ["glider trained, stepper trained",
                                       "glider trained, stepper random",
                                       "glider random, stepper trained",
                                       "glider random, stepper random"]


def test_random_continuous_actions_stay_in_bounds_and_greedy_ones_are_the_mean():
    from gpusim.training.actors import Actors
    from gpusim.training.models import make_model
    env = mixed_env(num_envs=64)
    obs = env.reset()
    gliders = env.arrays["continuous_actions"][:, :2, :2]  # the env's own action array
    Actors(env, {}).act(obs)
    assert gliders.abs().max() <= 0.2 and gliders.std() > 0.05
    model = make_model(env.policy_specs["glider"], PolicyConfig())
    Actors(env, {"glider": model}).act(obs, deterministic=True)
    mean, _ = model.distribution(obs[:, :2, :2])
    torch.testing.assert_close(gliders, model.squash(mean))


def test_pendulum_renders_and_adapts_to_gymnasium(tmp_path):
    gymnasium = pytest.importorskip("gymnasium")
    import gpusim
    from gpusim.wrappers import to_gymnasium, to_pettingzoo
    pytest.importorskip("matplotlib")
    from gpusim.training.trained import animation
    assert animation.render("pendulum", tmp_path / "p.gif", max_steps=3, seed=1) == 3
    vec = to_gymnasium(gpusim.make("pendulum", num_envs=4, backend="cpu"))
    assert isinstance(vec.single_action_space, gymnasium.spaces.Box)
    vec.reset(seed=0)
    obs, reward, *_ = vec.step(np.full((4, 1), 3.0, dtype=np.float32))  # clipped to 2
    assert obs.shape == (4, 3) and reward.dtype == np.float32
    pytest.importorskip("pettingzoo")  # takes Box and differing policies since issue 25
    assert to_pettingzoo(mixed_env()).possible_agents == ["glider_0", "glider_1", "stepper_2"]


def test_a2c_runs_on_box_actions_too():
    from gpusim.envs import env_class
    pendulum = env_class("pendulum")
    t = Trainer(load_run_config("pendulum", pendulum, overrides={
        "trainer.backend": "cpu", "trainer.algorithm": "a2c", "trainer.update_epochs": 1,
        "trainer.num_minibatches": 1, "trainer.num_envs": 4, "trainer.rollout_len": 8,
        "trainer.total_steps": 64, "trainer.target_return": None}), pendulum)
    before = [p.clone() for p in t.algorithm.policies[0].model.parameters()]
    assert t.train()["iterations"] == 2
    assert all(not torch.equal(a, b) for a, b in zip(before, t.algorithm.policies[0].model.parameters()))



# ---- discrete policies with different action sets -----------------------------------------
def test_discrete_policies_may_have_different_action_sets():
    from gpusim.check import check_env
    from gpusim.sampler import ActionSampler
    env = TwoSets(num_envs=64, backend="cpu", seed=1)
    assert env.mixed_actions and env.action_nvec == () and env.discrete_width == 2
    assert check_env(env, steps=20, verbose=False, skip=("seeding",)).ok  # starts alike
    sampler = ActionSampler(env)
    assert sampler.width == 7  # the triple's 4 + 3 choices
    actions = sampler.sample(torch.ones(64, 3, 7))
    assert actions[:, :2, 0].max() == 1 and actions[:, :2, 1].eq(0).all()  # no 2nd component
    assert actions[:, 2, 0].max() == 3 and actions[:, 2, 1].max() == 2
    torch.testing.assert_close(sampler.log_prob[:, :2], torch.full((64, 2), -math.log(2)))
    torch.testing.assert_close(sampler.log_prob[:, 2], torch.full((64,), -math.log(12)))
    env.reset()
    with pytest.raises(ArrayError, match=r"actions\['pair'\]\[0, 0, 0\] = 2"):
        env.step({"pair": torch.full((64, 2, 1), 2, dtype=torch.int32),
                  "triple": torch.zeros((64, 1, 2), dtype=torch.int32)})
    cudasim = TwoSets(num_envs=2, backend="cudasim", seed=1)
    probs = torch.rand(2, 3, 7, generator=torch.Generator().manual_seed(0))
    here, there = ActionSampler(TwoSets(num_envs=2, backend="cpu", seed=1)), ActionSampler(cudasim)
    assert torch.equal(here.sample(probs), there.sample(probs))
    assert torch.equal(here.log_prob, there.log_prob)


def test_policies_with_different_action_sets_learn():
    t = Trainer(load_run_config("two_sets", TwoSets, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 16, "trainer.rollout_len": 16,
        "trainer.total_steps": 16 * 16 * 12, "trainer.lr": 3e-3}), TwoSets)
    t.algorithm.collect(0)
    start = {name: np.mean(r) for name, r in t.algorithm.episodes.finished().items()}
    t.iteration = 0
    end = t.train()["episode_return"]
    # random: pair 0.5 x 8 = 4, triple (0.5 + 0.5) x 8 = 8; the best: 8 and 16
    assert end["pair"] > start["pair"] + 1.5 and end["triple"] > start["triple"] + 3, (start, end)


# ---- per-agent done on the truncating step ------------------------------------------------
def record_steps(env):
    """Wrap env.step: per step, who was in play before it, truncation, who was still in play
    when the replica ended (env.final_active), and the env's own rewards."""
    steps, original = [], env.step

    def step(actions=None):
        before = env.agent_active().clone()
        out = original(actions)
        steps.append((before, out[3].clone(), env.final_active().clone(), out[1].clone()))
        return out
    env.step = step
    return steps


def test_ppo_does_not_bootstrap_an_agent_that_finished_on_the_truncating_step():
    t = trainer(num_envs=256, rollout_len=40)
    steps = record_steps(t.env)
    t.algorithm.collect(0)
    finished_seen = kept_seen = 0
    for k, (before, truncated, final, reward) in enumerate(steps):
        for g in t.algorithm.policies:
            agents = g.agents
            stored = g.buffer.rewards[k]
            own = reward[:, agents]
            ended = truncated[:, None]
            finished = ended & before[:, agents] & ~final[:, agents]  # its own episode ended
            kept = ended & before[:, agents] & final[:, agents]       # cut off by the limit
            assert torch.equal(stored[finished], own[finished])        # no bootstrap
            assert bool((stored[kept] != own[kept]).all())             # gamma * V added
            assert bool(g.buffer.dones[k][finished].all())
            finished_seen += int(finished.sum())
            kept_seen += int(kept.sum())
    assert finished_seen > 0 and kept_seen > 0


def test_the_replay_ring_marks_an_agent_that_finished_on_the_truncating_step_terminal():
    from gpusim.envs import env_class
    cls = env_class("tag_continuous")
    config = load_run_config("tag_continuous", cls, overrides={
        "trainer.backend": "cpu", "trainer.algorithm": "sac", "trainer.num_envs": 64,
        "trainer.rollout_len": 12, "trainer.total_steps": 10**4, "trainer.learning_starts": 10,
        "trainer.final_eval_episodes": 0, "env.continuous_actions": True,
        "env.num_taggers": 3, "env.num_runners": 6, "env.episode_length": 6,
        "env.tagging_distance": 0.2, "policy.hidden_sizes": [8]})
    t = Trainer(config, cls)
    steps = record_steps(t.env)
    t.algorithm.collect(0)
    finished_seen = 0
    for g in t.algorithm.policies:
        width = t.env.num_envs * g.spec.num_agents
        for k, (before, truncated, final, _) in enumerate(steps):
            rows = slice(k * width, (k + 1) * width)
            terminated = g.replay.terminated[rows].view(t.env.num_envs, -1)
            valid = g.replay.valid[rows].view(t.env.num_envs, -1)
            finished = truncated[:, None] & before[:, g.agents] & ~final[:, g.agents]
            assert bool(terminated[finished].all()) and bool(valid[finished].all())
            assert torch.equal(valid, before[:, g.agents])  # rows out of play never drawn
            finished_seen += int(finished.sum())
    assert finished_seen > 0
