"""Static steps: what a CUDA graph replays (training.speed.graphs) must run the same operations on
tensors of the same shapes at every call, and never read a device value on the host.

Checked on the CPU, with the learners built in the static form they take on a CUDA device
(`static`; there the same methods run eagerly): a TorchDispatchMode records every tensor
operation (its name, and its tensor arguments' shapes and dtypes) of two consecutive
rollouts and of two consecutive updates, which a captured graph replays whole, and of
consecutive rollout steps and minibatch steps inside them. gpusim's own kernels (env,
sampler) are not torch operations; they read and write the env's fixed arrays.
"""
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gpusim.envs import env_class
from gpusim.training.loop import Trainer
from gpusim.training.run_config import load_run_config, recipe_path
from gpusim.training.speed.descent import Adam

from learning_envs import Legal
from test_host_syncs import counting_host_reads

# what reads a device value on the host, or makes a shape out of one
HOST_READS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "masked_scatter",
              "repeat_interleave", "equal", "is_nonzero")


class Recorder(TorchDispatchMode):
    """Every operation as (name, (shape, dtype) of each tensor argument); `mark()` starts a
    new segment."""

    def __init__(self):
        super().__init__()
        self.segments = [[]]

    def mark(self):
        self.segments.append([])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        tensors = tuple((tuple(a.shape), a.dtype) for a in leaves if isinstance(a, torch.Tensor))
        bool_index = func.__name__.startswith("index") and any(  # its indices (not values)
            isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in tree_leaves(args[1:2]))
        self.segments[-1].append((func.__name__ + (" (bool index)" if bool_index else ""),
                                  tensors))
        return func(*args, **kwargs)

    @property
    def ops(self):
        return [op for segment in self.segments for op in segment]


def host_reads(ops):
    return [name for name, _ in ops if name.split(".")[0].lstrip("_") in
            tuple(r.lstrip("_") for r in HOST_READS) or "bool index" in name]


def built(config, cls, static=True):
    """A trainer whose algorithm takes the static form a CUDA device's takes (`static`),
    or the CPU's own."""
    with mock.patch("gpusim.training.algorithms.algorithm.graphs_enabled", lambda *a: static):
        return Trainer(config, cls)


def static_trainer(env, overrides, cls=None, static=True):
    cls = cls or env_class(env)
    config = load_run_config(env, cls, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 6,
        "trainer.total_steps": 10**6, "trainer.target_return": None,
        "trainer.torch_threads": 1, "trainer.update_epochs": 2, "trainer.num_minibatches": 2,
        "trainer.compile": "off", **overrides})
    trainer = built(config, cls, static)
    trainer.iterate(config.trainer.lr)     # warm-up: what the first call makes once
    return trainer


TAG = {"env.num_taggers": 2, "env.num_runners": 3, "env.num_other_agents_observed": 3}
CASES = {
    "ppo": ("cartpole", {}),
    "a2c": ("cartpole", {"trainer.algorithm": "a2c", "trainer.update_epochs": 1,
                         "trainer.num_minibatches": 1}),
    "ppo, recurrent": ("cartpole", {"policy.recurrent": "gru", "policy.bptt_len": 3}),
    "ppo, masked": ("legal", {"env.masked": True}),
    "ppo, central critic": ("tag_gridworld", {"policy.critic": "central"}),
    "ppo, per-agent done, continuous, two policies": ("tag_continuous", {
        **TAG, "trainer.out_of_play": "weigh"}),
    "ppo, continuous": ("pendulum", {"trainer.algorithm": "ppo"}),
    "ppo, league": ("tag_continuous", {**TAG, "trainer.out_of_play": "weigh",
                                       "trainer.league": True, "env.episode_length": 4}),
}


def make(case, overrides=None, static=True):
    env, base = CASES[case]
    cls = Legal if env == "legal" else None
    return static_trainer(env, {**base, **(overrides or {})}, cls, static)


@pytest.mark.parametrize("case", list(CASES))
def test_consecutive_rollouts_and_updates_are_the_same_steps_with_no_host_read(case):
    trainer = make(case)
    algorithm, lr = trainer.algorithm, trainer.config.trainer.lr
    recorded = {}
    for call in ("collect", "update"):
        runs = []
        for _ in range(2):
            orders = algorithm.orders()  # (drawn before the update)
            with Recorder() as recorder, counting_host_reads() as python_reads:
                algorithm.collect(0) if call == "collect" else algorithm.update_all(orders)
            runs.append(recorder.ops)
            assert python_reads["reads"] == 0, f"{call} reads the device from Python"
        assert runs[0] == runs[1], f"{call}: the second call ran other operations or shapes"
        assert not host_reads(runs[0]), f"{call} reads the device: {host_reads(runs[0])}"
        recorded[call] = runs[0]
    assert len(recorded["collect"]) > 10 and len(recorded["update"]) > 10
    algorithm.update(lr)  # the update as the loop calls it: orders drawn, then the step


@pytest.mark.parametrize("case", ["ppo", "ppo, per-agent done, continuous, two policies",
                                  "ppo, recurrent"])
def test_rollout_steps_and_minibatch_steps_repeat(case, monkeypatch):
    """Inside a rollout, steps 0 and 1 (no truncation bootstrap due) run the same operations;
    inside an update, every minibatch step of a policy does."""
    trainer = make(case)
    algorithm, env = trainer.algorithm, trainer.env
    recorder = Recorder()
    step = env.step

    def marked_step(*args, **kwargs):
        out = step(*args, **kwargs)
        recorder.mark()
        return out
    monkeypatch.setattr(env, "step", marked_step)
    with recorder:
        algorithm.collect(0)
    first, second = recorder.segments[1:3]  # after step 0's env.step, after step 1's
    assert first == second and first

    # an update's segments, each ending with a policy's optimizer step: a minibatch step
    # (a policy's first also holds its values and GAE, an epoch's first its shuffle; each
    # starts with the sum of the statistics before it)
    steps = []
    zero_grad = Adam.zero_grad

    def marked(adam):
        zero_grad(adam)
        name = next(p.name for p in algorithm.policies if p.adam is adam)
        steps.append((name, recorder.segments[-1]))
        recorder.mark()
    monkeypatch.setattr(Adam, "zero_grad", marked)
    recorder = Recorder()
    with recorder:
        algorithm.update_all(algorithm.orders())
    for name in {name for name, _ in steps}:
        ops = [o for n, o in steps if n == name]
        step = ops[1][1:]
        assert len(ops) == 4 and ops[3][1:] == step, name  # 2 epochs x 2
        assert ops[2][-len(step):] == step and ops[0][-len(step):] == step, name
        assert not host_reads(step)


TAG_CASE = "ppo, per-agent done, continuous, two policies"
SKIP = {"trainer.out_of_play": "skip"}


def test_weighing_rows_out_of_play_takes_the_step_leaving_them_out_takes():
    """Per-agent done: one step on the whole rollout (one epoch, one minibatch) gives the
    same parameters whether rows out of play weigh 0 (`weigh`, the whole-update graph's
    form) or are left out (`skip`): the same advantages on rows in play, the same means."""
    params = []
    for choice in ("weigh", "skip"):
        trainer = make(TAG_CASE, {"trainer.out_of_play": choice, "trainer.update_epochs": 1,
                                  "trainer.num_minibatches": 1})
        algorithm = trainer.algorithm
        buf = algorithm.policies[1].buffer
        for _ in range(50):  # until a runner is caught
            algorithm.collect(0)
            if not buf.active.all():
                break
        assert not buf.active.all()
        algorithm.update(1e-3)
        params.append(torch.cat([q.detach().reshape(-1) for p in algorithm.policies
                                 for q in p.model.parameters()]))
    torch.testing.assert_close(params[0], params[1], rtol=1e-5, atol=1e-6)


# ---- per-agent done on a CUDA device: the update eager, its fixed-size parts graphed -----
def test_chunked_update_trains_as_the_compacted_eager_update():
    """Rows out of play left out either way; the static form pads each minibatch's last
    chunk with rows weighing 0 (chunks of 7 rows: most minibatches end in a partial chunk),
    and computes the values of rows in play in padded chunks. Three updates give the same
    statistics and parameters as the CPU's eager chunks."""
    results = []
    for static in (False, True):
        trainer = make(TAG_CASE, {**SKIP, "trainer.max_minibatch_rows": 7}, static=static)
        assert trainer.algorithm.speed.padded == static
        torch.manual_seed(0)
        stats = [trainer.iterate(1e-3) for _ in range(3)]
        params = {n: torch.cat([p.detach().reshape(-1) for p in m.parameters()])
                  for n, m in trainer.algorithm.models().items()}
        results.append((stats, params))
    (eager_stats, eager), (chunk_stats, chunks) = results
    for name in eager:
        torch.testing.assert_close(eager[name], chunks[name], rtol=1e-5, atol=1e-6)
    for before, after in zip(eager_stats, chunk_stats):
        for name in ("tagger", "runner"):
            for key in ("policy_loss", "value_loss", "entropy", "approx_kl"):
                assert before[name][key] == pytest.approx(after[name][key], rel=1e-5,
                                                          abs=1e-7), (name, key)


def test_chunk_steps_and_optimizer_steps_repeat_with_no_host_read():
    """What the chunked update replays (a value chunk, GAE, a minibatch chunk, an optimizer
    step) runs the same operations on the same shapes at every call, reading nothing on
    the host."""
    trainer = make(TAG_CASE, {**SKIP, "trainer.max_minibatch_rows": 5})
    calls = []
    for p in trainer.algorithm.policies:
        for graph in trainer.algorithm.speed.policy_graphs(p):
            def recorded(*inputs, step=graph.step, key=(p.name, graph.what)):
                with Recorder() as recorder, counting_host_reads() as python_reads:
                    out = step(*inputs)
                calls.append((key, recorder.ops, python_reads["reads"]))
                return out
            graph.step = recorded
    for _ in range(2):  # (GAE runs once per update)
        trainer.iterate(trainer.config.trainer.lr)
    keys = {key for key, _, _ in calls}
    assert len(keys) == 8  # per policy: value chunk, GAE, minibatch chunk, optimizer step
    for key in keys:
        runs = [(ops, reads) for k, ops, reads in calls if k == key]
        assert len(runs) >= 2 and all(run == runs[0] for run in runs), key
        assert runs[0][1] == 0 and not host_reads(runs[0][0]), key


def test_out_of_play_weigh_trains_every_row():
    """`trainer.out_of_play: weigh` keeps the rows out of play in the update (weight 0);
    `skip` leaves them out."""
    counts = {}
    for choice in ("skip", "weigh"):
        trainer = make(TAG_CASE, {"trainer.out_of_play": choice}, static=False)
        buf = trainer.algorithm.policies[1].buffer
        for _ in range(50):  # until a runner is caught
            trainer.algorithm.collect(0)
            if not buf.active.all():
                break
        rows = trainer.algorithm.rows(trainer.algorithm.policies[1])
        counts[choice] = (rows.units.shape[0], rows.weights is None)
        in_play = int(buf.active.sum())
    assert counts["skip"] == (in_play, True)
    assert counts["weigh"] == (buf.active.numel(), False) and in_play < buf.active.numel()


# ---- off-policy: the rollout and the gradient step (what CUDA graphs replay) -------------
def offpolicy_trainer(algorithm):
    cls = env_class("pendulum")
    config = load_run_config("pendulum", cls, path=recipe_path(cls, algorithm), overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 6,
        "trainer.total_steps": 10**6, "trainer.torch_threads": 1, "trainer.compile": "off",
        "trainer.algorithm": algorithm, "trainer.learning_starts": 0,
        "trainer.batch_size": 16, "trainer.replay_size": 1000})
    return built(config, cls)


@pytest.mark.parametrize("algorithm", ["sac", "td3", "ddpg"])
def test_offpolicy_rollouts_repeat_with_no_host_read(algorithm):
    """Consecutive rollouts (acting, the env, the replay rings' writes) run the same
    operations and read nothing on the host; the rings' device-side position and size
    follow their host counters, which advance after each rollout."""
    trainer = offpolicy_trainer(algorithm)
    algo, replay = trainer.algorithm, trainer.algorithm.policies[0].replay
    algo.collect(0)  # (the first call makes what later ones reuse)
    runs = []
    for k in (1, 2):
        with Recorder() as recorder, counting_host_reads() as python_reads:
            algo.collect(24 * k)
        assert python_reads["reads"] == 0
        runs.append(recorder.ops)
    assert runs[0] == runs[1] and not host_reads(runs[0])
    assert replay.size == 3 * 24 == int(replay.held) and replay.position == int(replay.write_at)
    assert not replay.obs[:replay.size].eq(0).all(-1).any()  # every row written


@pytest.mark.parametrize("algorithm", ["sac", "td3", "ddpg"])
def test_offpolicy_gradient_steps_repeat_with_no_host_read(algorithm):
    """Consecutive gradient steps (per actor-due value: TD3 delays its actor) run the same
    operations on the same shapes and read nothing on the host; the buffer's rows are
    drawn into a fixed tensor before each, and each step trains."""
    trainer = offpolicy_trainer(algorithm)
    algo = trainer.algorithm
    group = algo.policies[0]
    calls = []
    trainer.iterate(1e-3)  # the first static steps make their graphs
    for due, graph in group.graphs.items():
        def recorded(*noise, step=graph.step, due=due):
            with Recorder() as recorder, counting_host_reads() as python_reads:
                out = step(*noise)
            calls.append((due, recorder.ops, python_reads["reads"]))
            return out
        graph.step = recorded
    before = [p.detach().clone() for p in group.model.critics.parameters()]
    stats = trainer.iterate(1e-3)["agent"]
    assert stats["value_loss"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, group.model.critics.parameters()))
    assert set(group.graphs) == ({True, False} if algorithm == "td3" else {True})
    for due in group.graphs:
        runs = [(ops, reads) for d, ops, reads in calls if d == due]
        assert len(runs) >= 2 and all(run == runs[0] for run in runs), due
        assert runs[0][1] == 0 and not host_reads(runs[0][0]), due
