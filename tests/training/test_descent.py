"""The learners' one Adam (training.optim) against torch.optim.Adam with clip_grad_norm_."""
import pytest
import torch

from gpusim.training.speed.descent import Adam, adam_update

SHAPES = [(16, 5), (16,), (16, 16), (16,), (3, 16), (3,)]


def reference(params, grads_per_step, lr, eps, max_grad_norm):
    """torch's own: clip_grad_norm_, then Adam (fused, as the learners ran it before)."""
    params = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
    return [p.detach() for p in params]


def draws(steps, seed=0, members=0):
    generator = torch.Generator().manual_seed(seed)
    lead = (members,) if members else ()
    return [[torch.randn(lead + s, generator=generator) * 3 for s in SHAPES]
            for _ in range(steps)]


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.5])
def test_a_plain_adam_is_torchs_to_the_bit(max_grad_norm):
    params = draws(1, seed=1)[0]
    steps = draws(12)
    want = reference(params, steps, 3e-4, 1e-5, max_grad_norm)
    mine = [p.clone() for p in params]
    adam = Adam(mine, 3e-4, eps=1e-5, max_grad_norm=max_grad_norm)
    for grads in steps:
        adam.step([g.clone() for g in grads])
    for a, b in zip(mine, want):
        assert torch.equal(a, b)


def test_each_member_steps_as_its_own_adam_with_its_rate_and_clip():
    members = 3
    params = draws(1, seed=1, members=members)[0]
    steps = draws(8, members=members)
    rates, clips = [1e-3, 3e-4, 0.0], [0.5, 0.0, 1.0]
    mine = [p.clone() for p in params]
    adam = Adam(mine, rates, eps=1e-8, max_grad_norm=clips, members=members)
    for grads in steps:
        adam.step([g.clone() for g in grads])
    for k in range(members):
        want = reference([p[k] for p in params], [[g[k] for g in grads] for grads in steps],
                         rates[k], 1e-8, clips[k])
        for a, b in zip(mine, want):
            torch.testing.assert_close(a[k], b, rtol=1e-6, atol=1e-7)
    assert all(torch.equal(a[2], p[2]) for a, p in zip(mine, params))  # rate 0: unmoved


def test_members_left_out_do_not_move():
    params = draws(1, seed=1, members=2)[0]
    mine = [p.clone() for p in params]
    adam = Adam(mine, 1e-2, members=2)
    adam.step([g.clone() for g in draws(1, members=2)[0]], members=[1])
    assert all(torch.equal(a[0], p[0]) for a, p in zip(mine, params))
    assert not any(torch.equal(a[1], p[1]) for a, p in zip(mine, params))


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.5])
def test_the_update_as_tensor_operations_agrees_with_the_kernel(max_grad_norm):
    params = draws(1, seed=1)[0]
    steps = draws(10)
    want = reference(params, steps, 1e-3, 1e-8, max_grad_norm)
    mine = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in mine]
    v = [torch.zeros_like(p) for p in mine]
    step = torch.zeros(())
    for grads in steps:
        adam_update(mine, grads, m, v, step, torch.tensor(1e-3), max_grad_norm, 1e-8)
    for a, b in zip(mine, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert float(step) == len(steps)
