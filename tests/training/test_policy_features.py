"""Recurrent policies, action masks and a centralized critic (MAPPO), on the PPO learner."""
import pytest
import torch

from gpusim.envs import env_class
from gpusim.errors import ConfigError, GpusimError
from gpusim.training.actors import Actors
from gpusim.training.loop import Trainer
from gpusim.training.models import make_model
from gpusim.training.run_config import PolicyConfig, load_run_config

from learning_envs import Legal, Recall


def run_config(cls, name, **overrides):
    base = {"trainer.backend": "cpu", "trainer.torch_threads": 1, "trainer.target_return": None}
    return load_run_config(name, cls, overrides={**base, **overrides})


# ---- recurrent policies -------------------------------------------------------------
RECALL = {"trainer.num_envs": 64, "trainer.rollout_len": 16, "trainer.lr": 3e-3,
          "policy.bptt_len": 8, "policy.recurrent_size": 32}


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize("recurrent", ["gru", "lstm"])
def test_a_recurrent_policy_recalls_the_cue_and_a_feed_forward_one_cannot(recurrent):
    """The cue shows at the first step only; naming it at the last pays +1, else -1."""
    steps = 64 * 16 * 60
    memory = Trainer(run_config(Recall, "recall", **RECALL, **{
        "policy.recurrent": recurrent, "trainer.total_steps": steps,
        "trainer.target_return": 0.9}), Recall).train()
    assert memory["solved"], memory
    forgetful = Trainer(run_config(Recall, "recall", **RECALL, **{
        "trainer.total_steps": steps // 2}), Recall).train()
    assert forgetful["episode_return"]["agent"] < 0.5, forgetful  # chance is 0


@pytest.mark.parametrize("recurrent", ["gru", "lstm"])
def test_the_training_pass_replays_the_rollouts_recurrent_states(recurrent):
    """Sequences from their stored start states, restarted where episodes ended (every 6
    steps here, across sequence boundaries of 8), give the log-probabilities and values
    the rollout acted with: the first epoch's ratio is 1."""
    trainer = Trainer(run_config(Recall, "recall", **RECALL, **{
        "policy.recurrent": recurrent, "env.episode_length": 6,
        "trainer.total_steps": 64 * 16}), Recall)
    algo = trainer.algorithm
    algo.collect(0)
    g = algo.policies[0]
    buf = g.buffer
    assert buf.memory.shape == (2, 64, 1, g.model.state_size)
    assert bool((buf.memory[0] == 0).all())                # a fresh run starts from zero
    assert bool((buf.memory[1].abs().sum(-1) > 0).all())   # step 8 is mid-episode
    per_step = 64
    starts = torch.arange(2 * per_step)
    rows = (starts // per_step)[:, None] * 8 * per_step + starts[:, None] % per_step \
        + torch.arange(8) * per_step
    with torch.no_grad():
        log_prob, _, value = g.model(*algo.inputs(g, rows))
    flat = buf.log_probs.reshape(-1)
    torch.testing.assert_close(log_prob, flat[rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value, buf.values.reshape(-1)[rows], rtol=1e-5, atol=1e-5)
    stats = algo.update(1e-3)["agent"]
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())


def test_actors_restart_the_state_of_finished_episodes():
    env = Recall(num_envs=4, backend="cpu")
    config = PolicyConfig(recurrent="gru", recurrent_size=5)
    actors = Actors(env, {"agent": make_model(env.policy_specs["agent"], config)})
    actors.memory["agent"].fill_(1.0)
    actors.episode_ended(torch.tensor([True, False, True, False]))
    assert actors.memory["agent"][:, 0].sum(-1).tolist() == [0.0, 5.0, 0.0, 5.0]


def test_recurrent_policies_are_refused_where_they_cannot_run():
    with pytest.raises(ConfigError, match="policy.critic"):
        run_config(Recall, "recall", **{"policy.recurrent": "gru", "policy.critic": "central"})
    with pytest.raises(ConfigError, match="'policy.recurrent' does not apply"):
        run_config(env_class("pendulum"), "pendulum",
                   **{"trainer.algorithm": "sac", "policy.recurrent": "gru"})
    with pytest.raises(GpusimError, match="multiple of policy.bptt_len"):
        Trainer(run_config(Recall, "recall", **{"policy.recurrent": "gru",
                                                "trainer.rollout_len": 12,
                                                "policy.bptt_len": 8}), Recall)


# ---- action masks -------------------------------------------------------------------
def draw_and_check(backend: str, num_envs: int, steps: int) -> int:
    """Draw `steps` rounds of actions for every replica with an untrained policy; assert
    none is masked; the number of draws."""
    env = Legal(num_envs=num_envs, backend=backend, seed=3)
    obs = env.reset()
    actors = Actors(env, {"agent": make_model(env.policy_specs["agent"], PolicyConfig())})
    for _ in range(steps):
        legal = env.action_mask()[:, 0].clone()
        with torch.no_grad():
            actors.act(obs)
        drawn = env.arrays["actions"][:, 0, :1].long()
        assert bool(legal.gather(1, drawn).all()), "a masked action was drawn"
        obs, *_ = env.step()
    return num_envs * steps


@pytest.mark.parametrize("backend, num_envs, steps", [("cpu", 4096, 16), ("cudasim", 8, 2)])
def test_a_masked_action_is_never_drawn(backend, num_envs, steps):
    assert draw_and_check(backend, num_envs, steps) == num_envs * steps


# A million draws on the CPU; the simulator runs each GPU thread in Python, about 35
# draws a second here (a million would take 8 hours), so it checks the same kernel
# over thousands.
@pytest.mark.slow
@pytest.mark.parametrize("backend, num_envs, steps, draws", [("cpu", 16384, 64, 10**6),
                                                             ("cudasim", 128, 16, 2048)])
def test_a_masked_action_is_never_drawn_in_many_draws(backend, num_envs, steps, draws):
    assert draw_and_check(backend, num_envs, steps) >= draws


def test_masked_log_probs_and_entropy_cover_the_legal_set_only():
    env = Legal(num_envs=16, backend="cpu", seed=0)
    env.reset()
    model = make_model(env.policy_specs["agent"], PolicyConfig())
    obs, mask = env.arrays["obs"][:, 0], env.action_mask()[:, 0]
    log_probs = model.log_probs(obs, mask)
    assert bool(torch.isinf(log_probs[~mask]).all())
    legal = torch.where(mask, log_probs, torch.zeros(()))
    torch.testing.assert_close(legal.exp().sum(-1) - (~mask).sum(-1) * 1.0,
                               torch.ones(16), rtol=0, atol=1e-5)
    actions = env.arrays["target"][:, 0:1]
    _, entropy, _ = model(obs, actions, mask)
    # the entropy of the distribution over the legal choices alone
    logits = model.actor(obs).masked_fill(~mask, float("-inf"))
    reference = torch.stack([torch.distributions.Categorical(logits=row[m]).entropy()
                             for row, m in zip(logits, mask)])
    torch.testing.assert_close(entropy, reference, rtol=1e-5, atol=1e-6)
    assert bool(torch.isfinite(entropy).all())
    entropy.sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.actor.parameters())


@pytest.mark.slow
@pytest.mark.learning
def test_masks_make_learning_faster():
    """With the legal set as the mask no episode ends early; the same budget gets closer
    to the best return (one target per step: episode_length)."""
    results = {}
    for masked in (True, False):
        summary = Trainer(run_config(Legal, "legal", **{
            "env.masked": masked, "trainer.num_envs": 32, "trainer.rollout_len": 32,
            "trainer.total_steps": 32 * 32 * 15, "trainer.lr": 1e-3}), Legal).train()
        results[masked] = summary["episode_return"]["agent"]
    assert results[True] > 0.8 * 16 and results[True] > results[False] + 2, results


# ---- a centralized critic (MAPPO) ---------------------------------------------------
@pytest.mark.parametrize("name", ["tag_gridworld", "tag_continuous"])
def test_a_central_critic_sees_one_global_state_per_replica(name):
    cls = env_class(name)
    small = {"tag_continuous": {"env.num_taggers": 2, "env.num_runners": 3},
             "tag_gridworld": {}}[name]
    trainer = Trainer(run_config(cls, name, **small, **{
        "policy.critic": "central", "trainer.num_envs": 4, "trainer.rollout_len": 8,
        "trainer.total_steps": 4 * 8 * 2}), cls)
    algo, env = trainer.algorithm, trainer.env
    algo.collect(0)
    width = env.num_agents * env.obs_dim  # every agent's observation in agent order
    for g in algo.policies:
        buf = g.buffer
        assert buf.states.shape == (8, 4, width)
        # the critic's input of a row is its replica's state: the same for every agent
        critic_obs = algo.inputs(g, torch.arange(buf.rewards.numel()))[3]
        per_agent = critic_obs.view(8, 4, g.spec.num_agents, width)
        assert bool((per_agent == per_agent[:, :, :1]).all())
        assert g.model.critic[0].in_features == width
        # and so is its value
        assert bool((buf.values == buf.values[..., :1]).all())
    # the state is every agent's observation, policies' agents side by side in id order
    together = torch.cat([g.buffer.obs for g in algo.policies], dim=2)
    torch.testing.assert_close(algo.policies[0].buffer.states, together.reshape(8, 4, width))
    summary = trainer.train()
    assert summary["iterations"] == 2


def test_ippo_and_mappo_both_run_on_a_multi_agent_env():
    cls = env_class("tag_gridworld")
    for critic in ("local", "central"):
        summary = Trainer(run_config(cls, "tag_gridworld", **{
            "policy.critic": critic, "trainer.num_envs": 4, "trainer.rollout_len": 8,
            "trainer.total_steps": 64}), cls).train()
        assert summary["iterations"] == 2


def test_tag_gridworlds_wall_mask_is_the_set_of_moves_that_stay_on_the_grid():
    import gpusim
    env = gpusim.make("tag_gridworld", num_envs=64, backend="cpu", seed=2, mask_walls=True,
                      grid_size=3)
    env.reset()
    assert gpusim.make("tag_gridworld", num_envs=1, backend="cpu").action_mask() is None
    actors = Actors(env, {})
    for _ in range(20):
        x, y = env.arrays["pos_x"], env.arrays["pos_y"]
        want = torch.stack([torch.ones_like(x), x + 1 < 3, x > 0, y + 1 < 3, y > 0], -1).bool()
        assert torch.equal(env.action_mask(), want)
        actors.act(env.arrays["obs"])
        _, reward, *_ = env.step()
        # every reward is an outcome term alone: no wall penalty was ever added
        outcomes = torch.tensor([-0.01, 0.01, 10.0, -5.0], dtype=torch.float32)
        assert bool(torch.isin(reward, outcomes).all())
