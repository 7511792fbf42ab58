"""The on-device action sampler: statistics, argmax, and bad inputs."""
import numpy as np
import pytest
import torch
from scipy import stats

from conftest import make_tag
from gpusim import ActionSampler
from gpusim.errors import ArrayError

# A tiny env whose action components have 3 and 4 choices.
TINY = dict(num_taggers=1, num_runners=1, num_acceleration_levels=2, num_turn_levels=3,
            num_other_agents_observed=1)


def probs_for(env, per_agent):
    """Broadcast per-agent probabilities (num_agents, width) over all replicas."""
    return torch.as_tensor(per_agent, dtype=torch.float32).expand(
        env.num_envs, -1, -1).contiguous()


def test_samples_follow_the_given_probabilities():
    env = make_tag(num_envs=4000, **TINY)
    sampler = ActionSampler(env)
    per_agent = np.array([[0.2, 0.5, 0.3, 0.1, 0.0, 0.6, 0.3],
                          [0.7, 0.1, 0.2, 0.25, 0.25, 0.25, 0.25]], dtype=np.float32)
    probs = probs_for(env, per_agent)
    counts = np.zeros((2, 7))
    for _ in range(5):
        actions = sampler.sample(probs).numpy()
        for agent in range(2):
            counts[agent, :3] += np.bincount(actions[:, agent, 0], minlength=3)
            counts[agent, 3:] += np.bincount(actions[:, agent, 1], minlength=4)
    for agent in range(2):
        for lo, hi in ((0, 3), (3, 7)):
            p = per_agent[agent, lo:hi]
            observed = counts[agent, lo:hi]
            assert observed[p == 0].sum() == 0  # zero-probability choices never drawn
            keep = p > 0
            p64 = p[keep].astype(np.float64)
            expected = p64 / p64.sum() * observed[keep].sum()
            assert stats.chisquare(observed[keep], expected).pvalue > 1e-4


def test_unnormalised_weights_are_normalised():
    env = make_tag(num_envs=3000, **TINY)
    probs = probs_for(env, [[2.0, 0.0, 2.0, 1.0, 1.0, 1.0, 5.0]] * 2)
    actions = ActionSampler(env).sample(probs).numpy()
    counts = np.bincount(actions[:, :, 0].ravel(), minlength=3)
    assert counts[1] == 0 and abs(counts[0] - counts[2]) < 0.1 * counts.sum()


def test_log_space_draws_follow_the_softmax_and_report_their_log_prob():
    env = make_tag(num_envs=4000, **TINY)
    sampler = ActionSampler(env)
    logits = torch.tensor([[1.0, -2.0, 0.5, 0.0, 3.0, -1.0, 0.2],
                           [0.0, 0.0, 0.0, -0.5, 0.5, 1.5, -3.0]])
    log_probs = torch.cat([torch.log_softmax(logits[:, :3], -1),
                           torch.log_softmax(logits[:, 3:], -1)], -1)
    given = probs_for(env, log_probs)
    actions = sampler.sample(given, log_space=True).long()
    # the reported log-prob is the sum of the given entries at the drawn actions
    chosen = given[..., :3].gather(-1, actions[..., :1]) + \
        given[..., 3:].gather(-1, actions[..., 1:])
    assert torch.equal(sampler.log_prob, chosen.squeeze(-1))
    for agent in range(2):
        for lo, hi, c in ((0, 3, 0), (3, 7, 1)):
            observed = np.bincount(actions[:, agent, c].numpy(), minlength=hi - lo)
            expected = log_probs[agent, lo:hi].double().exp().numpy() * env.num_envs
            assert stats.chisquare(observed, expected / expected.sum() * observed.sum()
                                   ).pvalue > 1e-4


def test_probability_space_log_prob_is_of_the_normalised_weights():
    env = make_tag(num_envs=50, **TINY)
    sampler = ActionSampler(env)
    probs = probs_for(env, [[2.0, 1.0, 1.0, 1.0, 3.0, 0.0, 4.0]] * 2)
    actions = sampler.sample(probs).long()
    p = probs / torch.cat([probs[..., :3].sum(-1, keepdim=True).expand(-1, -1, 3),
                           probs[..., 3:].sum(-1, keepdim=True).expand(-1, -1, 4)], -1)
    want = p[..., :3].gather(-1, actions[..., :1]).log() + \
        p[..., 3:].gather(-1, actions[..., 1:]).log()
    assert torch.allclose(sampler.log_prob, want.squeeze(-1), atol=1e-6)


def test_argmax_mode_picks_the_first_largest():
    env = make_tag(num_envs=5, **TINY)
    probs = torch.rand((5, 2, 7))
    probs[0, 0, :3] = torch.tensor([0.4, 0.4, 0.2])  # tie: lower index wins
    actions = ActionSampler(env).sample(probs, argmax=True)
    assert torch.equal(actions[..., 0], probs[..., :3].argmax(-1).int())
    assert torch.equal(actions[..., 1], probs[..., 3:].argmax(-1).int())
    assert actions[0, 0, 0] == 0


def test_sampling_is_reproducible_and_same_on_cudasim():
    draws = []
    for backend in ("cpu", "cpu", "cudasim"):
        env = make_tag(num_envs=2, backend=backend, seed=5, **TINY)
        sampler = ActionSampler(env)
        probs = probs_for(env, np.full((2, 7), 0.25, dtype=np.float32))
        log_probs = probs_for(env, np.log(np.arange(1, 15, dtype=np.float32).reshape(2, 7) / 8))
        draws.append((sampler.sample(probs).clone(),
                      sampler.sample(log_probs, log_space=True).clone(), sampler.log_prob.clone()))
    for other in draws[1:]:
        assert all(torch.equal(a, b) for a, b in zip(draws[0], other))


def test_sampled_actions_step_the_env():
    env = make_tag(num_envs=3, **TINY)
    env.reset()
    sampler = ActionSampler(env)
    actions = sampler.sample(probs_for(env, np.ones((2, 7), dtype=np.float32)))
    env.step(actions)  # in range by construction, so the check passes


@pytest.mark.parametrize("probs, message", [
    (torch.ones((3, 2, 6)), "must have shape (3, 2, 7)"),
    (torch.ones((3, 2, 7), dtype=torch.float64), "must have dtype torch.float32"),
    (torch.ones((3, 7, 2)).transpose(1, 2), "must be contiguous"),
])
def test_bad_probs(probs, message):
    env = make_tag(num_envs=3, **TINY)
    with pytest.raises(ArrayError) as err:
        ActionSampler(env).sample(probs)
    assert message in str(err.value)


def test_actors_draw_with_the_policys_own_log_probabilities():
    """Training rollouts draw from the policy's log-softmax (exponentiated by torch, drawn by
    the kernel): the reported log-probability is the policy's own at the drawn action, within
    1e-6, so PPO's first ratio is 1; the draws follow the softmax."""
    from gpusim.training.actors import Actors
    from gpusim.training.models import ActorCritic
    env = make_tag(num_envs=4000, **TINY)
    torch.manual_seed(0)
    models = {name: ActorCritic(spec.obs_dim, spec.actions, (16,))
              for name, spec in env.policy_specs.items()}
    actors = Actors(env, models)
    obs = env.arrays["obs"]
    acted = actors.act(obs)
    for name, spec in env.policy_specs.items():
        own = obs[:, actors.agents[name], :spec.obs_dim]
        with torch.no_grad():
            theirs, _, _ = models[name](own, acted.stored[name])
        torch.testing.assert_close(acted.log_prob[name], theirs, rtol=0, atol=1e-6)
        # first component of the first agent, every replica: its draws follow the softmax
        with torch.no_grad():
            probs = models[name].component_log_probs(own[:, :1])[0].exp().double()
        observed = np.bincount(acted.stored[name][:, 0, 0].long().numpy(),
                               minlength=probs.shape[-1])
        expected = probs[:, 0].sum(0).numpy()
        assert stats.chisquare(observed, expected / expected.sum() * observed.sum()).pvalue > 1e-4
