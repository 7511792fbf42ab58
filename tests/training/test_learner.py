"""The learner's speed features keep its semantics: chunked minibatches, bf16 autocast,
torch.compile's fallback, and the batched truncation bootstrap."""
import pytest
import torch

from gpusim.envs import env_class
from gpusim.errors import ConfigError
from gpusim.training.algorithms.ppo import PPO
from gpusim.training.loop import Trainer
from gpusim.training.run_config import load_run_config
from gpusim.training.speed import acceleration
from gpusim.training.speed.wrap import chunked_step

from conftest import in_child_process, needs_cpu_bf16

CARTPOLE = env_class("cartpole")


def cartpole_trainer(env=None, **trainer):
    overrides = {"trainer.backend": "cpu", "trainer.num_envs": 8, "trainer.rollout_len": 32,
                 "trainer.target_return": None}
    overrides.update({f"trainer.{k}": v for k, v in trainer.items()})
    overrides.update({f"env.{k}": v for k, v in (env or {}).items()})
    return Trainer(load_run_config("cartpole", CARTPOLE, overrides=overrides), CARTPOLE)


def gradients_of_one_step(trainer, buffer=None):
    """The gradient of a minibatch step on every row of the rollout (the parameters are not
    stepped), and its statistics: in one pass, or in chunks where the minibatch has more
    rows than `max_minibatch_rows` (training.speed.wrap.chunked_step)."""
    algorithm, policy = trainer.algorithm, trainer.algorithm.policies[0]
    if buffer is not None:
        policy.buffer.__dict__.update(buffer.__dict__)  # (the tensors the step reads)
    rows = torch.arange(policy.buffer.rewards.numel())
    advantages = torch.linspace(-1, 1, rows.numel())
    returns = torch.linspace(0, 2, rows.numel())
    if rows.numel() <= algorithm.speed.chunk:
        stats, loss = algorithm.loss(policy, rows, advantages, returns, None)
        loss.backward()
        return [q.grad.clone() for q in policy.model.parameters()], stats
    seen = []
    step = policy.adam.step
    policy.adam.step = lambda: seen.append([q.grad.clone() for q in policy.model.parameters()])
    try:
        stats = chunked_step(algorithm, policy, rows, advantages, returns, None, rows.numel())
    finally:
        policy.adam.step = step
    return seen[0], stats


def test_chunked_minibatch_gives_the_unchunked_gradient():
    whole = cartpole_trainer(algorithm="a2c", update_epochs=1, num_minibatches=1)
    whole.algorithm.collect(0)
    chunked = cartpole_trainer(algorithm="a2c", update_epochs=1, num_minibatches=1,
                               max_minibatch_rows=37)  # 7 chunks, the last short
    grads, stats = gradients_of_one_step(whole)  # 256 rows in one pass
    chunk_grads, chunk_stats = gradients_of_one_step(chunked, whole.algorithm.policies[0].buffer)
    for a, b in zip(grads, chunk_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(stats, chunk_stats, rtol=1e-5, atol=1e-7)


def test_minibatch_rows_are_capped(monkeypatch):
    trainer = cartpole_trainer(num_minibatches=2, update_epochs=1, max_minibatch_rows=50)
    trainer.algorithm.collect(0)
    seen = []
    original = PPO.loss

    def spy(self, policy, rows, *args, **kwargs):
        seen.append(rows.numel())
        return original(self, policy, rows, *args, **kwargs)
    monkeypatch.setattr(PPO, "loss", spy)
    trainer.algorithm.update(1e-3)
    # 256 rows, 2 minibatches of 128, each in chunks of at most 50
    assert seen == [50, 50, 28, 50, 50, 28]


@pytest.mark.slow
@in_child_process
def test_bf16_autocast_gradients_agree_with_fp32():
    """bf16 matmuls, fp32 weights and reductions: the gradient's direction is the fp32 one."""
    needs_cpu_bf16()
    fp32 = cartpole_trainer(precision="fp32", algorithm="a2c", update_epochs=1,
                            num_minibatches=1)
    fp32.algorithm.collect(0)
    bf16 = cartpole_trainer(precision="bf16", algorithm="a2c", update_epochs=1,
                            num_minibatches=1)
    for a, b in zip(fp32.algorithm.policies[0].model.parameters(),
                    bf16.algorithm.policies[0].model.parameters()):
        assert torch.equal(a, b)  # the models start from the same seed
    want, _ = gradients_of_one_step(fp32)
    got, _ = gradients_of_one_step(bf16, fp32.algorithm.policies[0].buffer)  # the same rollout
    for a, b in zip(want, got):
        assert a.dtype == b.dtype == torch.float32
        cosine = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)
        relative = (a - b).norm() / a.norm().clamp_min(1e-12)
        assert cosine > 0.99 and relative < 0.1, (float(cosine), float(relative))


@in_child_process
def test_precision_resolution():
    needs_cpu_bf16()
    cpu = torch.device("cpu")
    assert acceleration.resolve_precision("auto", cpu).name == "fp32"
    assert acceleration.resolve_precision("bf16", cpu).name == "bf16"
    with pytest.raises(ConfigError, match="tf32 needs a CUDA GPU"):
        acceleration.resolve_precision("tf32", cpu)
    assert not acceleration.compile_enabled("auto", cpu)
    assert acceleration.compile_enabled("auto", cpu, pays_on_cpu=True)
    assert not acceleration.compile_enabled("off", cpu, pays_on_cpu=True)
    assert acceleration.compile_enabled("on", cpu)
    with pytest.raises(ConfigError, match="'trainer.precision' must be one of"):
        load_run_config("cartpole", CARTPOLE, overrides={"trainer.precision": "fp8"})


def test_a_failing_compile_falls_back_with_one_line(monkeypatch, capsys):
    def broken_compile(fn, **kwargs):
        def compiled(*args):
            raise RuntimeError("inductor exploded\nwith a long traceback")
        return compiled
    monkeypatch.setattr(acceleration.torch, "compile", broken_compile)
    trainer = cartpole_trainer(compile="on", total_steps=8 * 32 * 2)
    summary = trainer.train()
    assert summary["iterations"] == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "torch.compile" in line]
    # on the CPU only the update compiles (one fused step): announced, then its failure once
    assert len(lines) == 2 and "compiling policy 'agent' (update)" in lines[0]
    assert "inductor exploded" in lines[1] and "(update)" in lines[1]
    assert "traceback" not in lines[1]
    assert all(p.fused.compiled is None for p in trainer.algorithm.policies)


@pytest.mark.slow
def test_torch_compile_on_the_cpu_trains():
    trainer = cartpole_trainer(compile="on", total_steps=8 * 32 * 2)
    trainer.train()
    policy = trainer.algorithm.policies[0]
    assert policy.fused.compiled is not None  # trained through the fused step
    assert not policy.value.active  # rollouts act eagerly (and the training pass compiles
    # only inside the fused step: `train_pass` is compiled where it is not fused)


@pytest.mark.parametrize("name, env", [
    ("cartpole", {"max_episode_steps": 12}),
    ("tag_gridworld", {"episode_length": 7}),
])
def test_batched_truncation_bootstrap_equals_a_per_step_one(name, env):
    """Flushing the slots every time_limit steps adds exactly what a critic call on
    every step's final observations would (interval 1)."""
    cls = env_class(name)
    overrides = {"trainer.backend": "cpu", "trainer.num_envs": 6, "trainer.rollout_len": 40,
                 **{f"env.{k}": v for k, v in env.items()}}
    trainers = [Trainer(load_run_config(name, cls, overrides={**overrides, **extra}), cls)
                for extra in ({}, {}, {"trainer.gamma": 0.0})]
    assert trainers[0].algorithm.bootstrap.interval == next(iter(env.values()))
    trainers[1].algorithm.bootstrap.interval = 1
    for trainer in trainers:
        trainer.algorithm.collect(0)
    batched, per_step, raw = (torch.cat([g.buffer.rewards for g in t.algorithm.policies], -1)
                              for t in trainers)
    torch.testing.assert_close(batched, per_step, rtol=1e-6, atol=1e-6)
    # with gamma 0 nothing is added: the env's own rewards, so truncations did happen
    bootstrapped = (batched != raw).any(-1)
    assert 3 <= int(bootstrapped.sum()) and not bootstrapped[:min(env.values()) - 1].any()


def test_section_timer_accumulates_per_section_and_keeps_errors():
    """The rollout's section timer (one object per section, reused at every step) adds
    each entry's wall time to its own section, and a section that raises is still timed
    and lets the error through."""
    import time

    from gpusim.training.timing import SectionTimer
    timer = SectionTimer(torch.device("cpu"))
    for _ in range(3):
        with timer("env"):
            time.sleep(0.002)
    with timer("update"):
        pass
    with pytest.raises(KeyError):
        with timer("forward"):
            raise KeyError("inside")
    totals = timer.totals()
    assert set(totals) == {"env", "update", "forward"}
    assert totals["env"] >= 0.006 and totals["update"] < totals["env"]
    timer.reset()
    assert timer.totals() == {}


def test_compile_auto_compiles_long_ppo_runs_on_the_cpu():
    """`trainer.compile: auto` on the CPU compiles PPO's minibatch step from
    CPU_COMPILE_MIN_STEPS minibatch steps in a run (iterations x epochs x minibatches), for
    feed-forward policies; a shorter run, a recurrent policy or `off` stays eager."""
    from gpusim.training.algorithms.ppo import CPU_COMPILE_MIN_STEPS
    per_iteration = 8 * 32  # the helper's num_envs x rollout_len
    steps_each = 4 * 4      # update_epochs x num_minibatches
    enough = -(-CPU_COMPILE_MIN_STEPS // steps_each) * per_iteration
    assert cartpole_trainer(total_steps=enough).algorithm.use_compile
    assert not cartpole_trainer(total_steps=enough - per_iteration).algorithm.use_compile
    assert not cartpole_trainer(total_steps=enough, compile="off").algorithm.use_compile
    recurrent = load_run_config("cartpole", CARTPOLE, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 8, "trainer.rollout_len": 32,
        "trainer.total_steps": enough, "policy.recurrent": "gru", "policy.bptt_len": 8})
    assert not Trainer(recurrent, CARTPOLE).algorithm.use_compile
