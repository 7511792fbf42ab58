"""GAE and the PPO losses against plain references and hand-computed values."""
import math

import torch

from gpusim.training import losses


def gae_reference(rewards, values, dones, next_value, gamma, lam):
    """Plain loops over one trajectory per column."""
    T, n = len(rewards), len(rewards[0])
    adv = [[0.0] * n for _ in range(T)]
    for j in range(n):
        running = 0.0
        for t in reversed(range(T)):
            following = next_value[j] if t == T - 1 else values[t + 1][j]
            live = 0.0 if dones[t][j] else 1.0
            delta = rewards[t][j] + gamma * following * live - values[t][j]
            running = delta + gamma * lam * live * running
            adv[t][j] = running
    return torch.tensor(adv)


def test_gae_matches_plain_loops():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(12, 5, generator=gen)
    values = torch.randn(12, 5, generator=gen)
    dones = torch.rand(12, 5, generator=gen) < 0.2
    next_value = torch.randn(5, generator=gen)
    adv, ret = losses.gae(rewards, values, dones, next_value, 0.97, 0.9)
    want = gae_reference(rewards.tolist(), values.tolist(), dones.tolist(), next_value.tolist(),
                         0.97, 0.9)
    assert torch.allclose(adv, want, atol=1e-5)
    assert torch.allclose(ret, adv + values)


def test_gae_by_hand():
    # two steps, episode ends after the first: no bootstrap across it
    rewards = torch.tensor([[1.0], [2.0]])
    values = torch.tensor([[0.5], [1.0]])
    dones = torch.tensor([[True], [False]])
    adv, _ = losses.gae(rewards, values, dones, torch.tensor([3.0]), gamma=0.5, lam=0.5)
    # t=1: 2 + 0.5*3 - 1 = 2.5 ; t=0: 1 - 0.5 = 0.5 (done: nothing flows back)
    assert torch.allclose(adv, torch.tensor([[0.5], [2.5]]))


def test_policy_loss_by_hand():
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))  # ratios 1.5 and 0.5
    adv = torch.tensor([1.0, -1.0])
    loss, clip_fraction = losses.policy_loss(new, old, adv, clip_coef=0.2)
    # sample 1: max(-1.5, -1.2) = -1.2 ; sample 2: max(0.5, 0.8) = 0.8 ; mean -0.2
    assert math.isclose(loss.item(), -0.2, abs_tol=1e-6)
    assert clip_fraction.item() == 1.0
    loss, clip_fraction = losses.policy_loss(old, old, adv, clip_coef=0.2)
    assert math.isclose(loss.item(), 0.0, abs_tol=1e-7) and clip_fraction.item() == 0.0


def test_value_loss_by_hand():
    new = torch.tensor([2.0, 0.0])
    old = torch.tensor([1.0, 0.0])
    returns = torch.tensor([3.0, 1.0])
    # unclipped: (2-3)^2=1, (0-1)^2=1 -> 0.5 * 1 = 0.5
    assert math.isclose(losses.value_loss(new, old, returns, None).item(), 0.5)
    # clipped at 0.2: value 1.2 -> (1.2-3)^2 = 3.24 ; max(1, 3.24) and 1 -> 0.5*(3.24+1)/2
    assert math.isclose(losses.value_loss(new, old, returns, 0.2).item(), 0.5 * 4.24 / 2,
                        rel_tol=1e-6)


def test_approx_kl_is_zero_only_at_equal_policies():
    logp = torch.log(torch.tensor([0.2, 0.5]))
    assert losses.approx_kl(logp, logp).item() == 0.0
    assert losses.approx_kl(logp + 0.1, logp).item() > 0.0
