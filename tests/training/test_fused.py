"""The compiled learner (training.speed.descent.CompiledDescent) keeps the eager learner's
semantics: a compiled minibatch or gradient step equal to the eager one, the rollout's
log-probabilities equal to the learner's, identical reruns; and the forms of tanh."""
import copy

import pytest
import torch

from gpusim.envs import env_class
from gpusim.training import losses, models
from gpusim.training.loop import Trainer
from gpusim.training.run_config import load_run_config


def trainer_for(name, **trainer):
    overrides = {"trainer.backend": "cpu", "trainer.num_envs": 8, "trainer.rollout_len": 32,
                 "trainer.target_return": None}
    overrides.update({f"trainer.{k}": v for k, v in trainer.items()})
    cls = env_class(name)
    return Trainer(load_run_config(name, cls, overrides=overrides), cls)


def test_compiled_tanh_form_agrees_with_tanh(monkeypatch):
    x = torch.cat([torch.linspace(-30, 30, 10001), torch.tensor([0.0, 1e-8, -1e-8, 100, -100])])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    fast = models.tanh(x)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, torch.tanh(x), rtol=0, atol=2e-7)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_eager_sigmoid_tanh_agrees_with_tanh(requires_grad):
    """Eager CPU tanh on large inputs is 2 sigmoid(2x) - 1: the values within 2e-7 and, with
    autograd, tanh's own gradient."""
    x = torch.cat([torch.linspace(-30, 30, 100001), torch.tensor([0.0, 1e-8, -1e-8, 100, -100])])
    assert x.numel() >= max(models.SIGMOID_TANH_MIN_ELEMENTS,
                            models.SIGMOID_TANH_MIN_ELEMENTS_GRAD)  # the sigmoid form runs
    x.requires_grad_(requires_grad)
    fast = models.tanh(x)
    if requires_grad:
        assert "SigmoidTanh" in type(fast.grad_fn).__name__
    reference = torch.tanh(x)
    torch.testing.assert_close(fast, reference, rtol=0, atol=2e-7)
    if requires_grad:
        upstream = torch.randn_like(x)
        mine, = torch.autograd.grad(fast, x, upstream)
        theirs, = torch.autograd.grad(reference, x, upstream)
        # d/dx = upstream (1 - y^2): the outputs' 2e-7 apart moves it by 2 |y upstream| 2e-7
        bound = 4e-7 * (fast.detach().abs() * upstream.abs()).max() + 1e-7
        torch.testing.assert_close(mine, theirs, rtol=0, atol=float(bound))


def test_rollout_values_are_the_per_step_critic():
    trainer = trainer_for("cartpole")
    algorithm = trainer.algorithm
    algorithm.collect(0)
    group = algorithm.policies[0]
    buf = group.buffer
    with torch.no_grad():
        algorithm.rollout_values(group, None)
        for t in range(buf.obs.shape[0]):
            torch.testing.assert_close(buf.values[t], group.model.value(buf.obs[t]),
                                       rtol=1e-6, atol=1e-6)


def test_values_of_rows_in_play_only_leave_their_advantages_unchanged():
    """With per-agent done, the update computes the values of the rows in play only: the
    advantages and returns of those rows, all the update reads, are those of every row's."""
    cls = env_class("tag_continuous")
    config = load_run_config("tag_continuous", cls, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 32,
        "trainer.target_return": None, "env.num_taggers": 2, "env.num_runners": 6})
    algorithm = Trainer(config, cls).algorithm
    for _ in range(4):  # runners get caught: rows out of play
        algorithm.collect(0)
        algorithm.update(1e-3)
    algorithm.collect(0)
    group = algorithm.policies[1]  # the runners
    buf = group.buffer
    in_play = buf.active.reshape(-1).nonzero()[:, 0]
    assert 0 < in_play.numel() < buf.active.numel()
    next_value = algorithm.values(group, algorithm.next_obs, None)
    results = []
    with torch.no_grad():
        for rows in (None, in_play):
            algorithm.rollout_values(group, rows)
            results.append([x.reshape(-1)[in_play] for x in losses.gae(
                buf.rewards, buf.values, buf.dones, next_value.float(),
                config.trainer.gamma, config.algo.gae_lambda)])
    for every_row, only_in_play in zip(*results):
        torch.testing.assert_close(only_in_play, every_row, rtol=1e-5, atol=1e-5)


def run_steps(trainer, fused: bool, steps: int):
    """`steps` minibatch steps on fixed rows, compiled whole (`fused`: `policy.fused`) or
    eagerly as `PPO.update_policy` takes them; the statistics and the parameters after."""
    algorithm = trainer.algorithm
    policy = algorithm.policies[0]
    rows = torch.arange(policy.buffer.rewards.numel())
    generator = torch.Generator().manual_seed(1)
    advantages = torch.randn(rows.numel(), generator=generator)
    returns = torch.randn(rows.numel(), generator=generator)
    stats = []
    for k in range(steps):
        mb = rows[k::2]
        adv = losses.normalized(losses.take(advantages, mb), None, mb.numel())
        ret = losses.take(returns, mb)
        if fused:
            out = policy.fused(mb, adv, ret, None)
            assert out is not None  # it ran compiled, no fallback
        else:
            out, loss = algorithm.loss(policy, mb, adv, ret, None)
            loss.backward()
            policy.adam.step()
            policy.adam.zero_grad()
        stats.append(out.clone())
    return stats, [p.detach().clone() for p in policy.model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cartpole", "pendulum"])  # discrete, and a Gaussian head
def test_fused_minibatch_steps_equal_eager_ones(name):
    trainer = trainer_for(name, compile="on")
    algorithm = trainer.algorithm
    algorithm.collect(0)
    policy = algorithm.policies[0]
    assert policy.fused is not None
    start = (copy.deepcopy(policy.model.state_dict()), copy.deepcopy(policy.adam.state_dict()))
    fused_stats, fused_params = run_steps(trainer, True, 3)
    assert policy.fused.compiled is not None
    policy.model.load_state_dict(start[0])
    policy.adam.load_state_dict(start[1])
    eager_stats, eager_params = run_steps(trainer, False, 3)
    for a, b in zip(fused_stats, eager_stats):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(fused_params, eager_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_learner_log_probs_agree_with_the_rollout():
    """The first epoch's ratio is 1: the compiled training pass gives the rollout's
    log-probabilities (the rollout acts eagerly)."""
    trainer = trainer_for("cartpole", compile="on")
    algorithm = trainer.algorithm
    algorithm.collect(0)
    group = algorithm.policies[0]
    buf = group.buffer
    compiled = torch.compile(group.model)
    with torch.no_grad():
        log_prob, _, _ = compiled(buf.obs.reshape(-1, buf.obs.shape[-1]),
                                  buf.actions.reshape(-1, buf.actions.shape[-1]))
    torch.testing.assert_close(log_prob, buf.log_probs.reshape(-1), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_compiled_reruns_are_identical():
    runs = []
    for _ in range(2):
        trainer = trainer_for("cartpole", compile="on", total_steps=8 * 32 * 2)
        trainer.train()
        runs.append([p.detach().clone() for p in trainer.algorithm.policies[0].model.parameters()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ddpg", "td3", "sac"])
def test_fused_gradient_steps_equal_eager_ones(algorithm):
    """Critic, actor, alpha and target steps in one compiled call give the eager steps'
    statistics and weights (the step's random draws made before it, from torch's
    generator, in both)."""
    trainer = trainer_for("pendulum", algorithm=algorithm, compile="on", num_envs=4,
                          rollout_len=8, learning_starts=32, batch_size=16)
    algorithm = trainer.algorithm
    algorithm.collect(10**6)  # past learning_starts
    group = algorithm.policies[0]
    assert group.step.compiled is not None
    start = (copy.deepcopy(group.model.state_dict()), copy.deepcopy(group.optimizer.state_dict()),
             copy.deepcopy(group.replay.state_dict()))

    def steps():
        torch.manual_seed(3)
        stats = [group.step().clone() for _ in range(4)]
        return stats, copy.deepcopy(group.model.state_dict())
    fused_stats, fused_state = steps()
    assert group.step.compiled.compiled is not None  # it ran compiled, no fallback
    group.model.load_state_dict(start[0])
    group.optimizer.load_state_dict(start[1])
    group.replay.load_state_dict(start[2])
    group.updates, group.step.compiled = 0, None
    eager_stats, eager_state = steps()
    for a, b in zip(fused_stats, eager_stats):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for name in eager_state:
        torch.testing.assert_close(fused_state[name], eager_state[name], rtol=1e-4, atol=1e-5)
