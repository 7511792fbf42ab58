"""The replay buffer: its ring, checkpoints, prioritized sampling, and shards that sample
as one buffer holding their union (ranks as threads, then as gloo processes)."""
import io
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from scipy.stats import chisquare

from gpusim.scale import distributed
from gpusim.training.collectives import LOCAL, TorchCollectives
from gpusim.training.replay_buffer import ReplayBuffer

OBS_DIM = 3
EPS = 1e-6
ALPHA = 0.6
# Two shards of different sizes and priorities; in the union, shard 1's rows follow shard 0's.
SHARD_PRIORITIES = [[0.3, 2.0, 0.05, 1.0, 0.7], [4.0, 0.2, 0.9, 1.5, 0.01, 3.0, 0.6]]
UNION_SIZE = sum(len(p) for p in SHARD_PRIORITIES)
P_VALUE = 1e-3


def transitions(ids, action_shape=(2,)):
    """Rows that all carry their id, so a sampled row shows whether its fields belong together."""
    ids = torch.as_tensor(list(ids), dtype=torch.float32)
    obs = ids[:, None] * 10 + torch.arange(OBS_DIM)
    actions = torch.stack([ids, -ids], 1) if action_shape == (2,) else ids.long()
    return obs, actions, ids.clone(), obs + 0.5, ids.long() % 2 == 1


def assert_rows_belong_together(batch, action_shape=(2,)):
    ids = batch.rewards
    obs, actions, _, next_obs, terminated = transitions(ids.tolist(), action_shape)
    for got, expected in [(batch.obs, obs), (batch.actions, actions),
                          (batch.next_obs, next_obs), (batch.terminated, terminated)]:
        assert torch.equal(got, expected)


def buffer(capacity=5, prioritized=False, action_shape=(2,), **kwargs):
    action_dtype = torch.float32 if action_shape == (2,) else torch.int64
    return ReplayBuffer(capacity, OBS_DIM, action_shape, action_dtype, "cpu",
                        prioritized=prioritized, alpha=ALPHA, eps=EPS, **kwargs)


def held_ids(replay):
    """The ids held, in ring-position order."""
    return replay.rewards[:len(replay)].long().tolist()


def powered(priorities):
    return (torch.tensor(priorities, dtype=torch.float32) + EPS).double() ** ALPHA


def id_histogram(replay, calls, batch, beta=0.4):
    return torch.bincount(torch.cat([replay.sample(batch, beta).rewards.long()
                                     for _ in range(calls)]), minlength=replay.capacity)


def chi_square_p(histogram, probabilities):
    expected = probabilities.double() * histogram.sum()
    return chisquare(histogram.double().numpy(), expected.numpy()).pvalue


# ---- the ring ----------------------------------------------------------------------
@pytest.mark.parametrize("action_shape", [(2,), ()], ids=["continuous", "discrete"])
def test_ring_overwrites_the_oldest_rows_and_keeps_each_row_together(action_shape):
    replay = buffer(action_shape=action_shape)
    replay.add(*transitions(range(3), action_shape))
    assert (len(replay), replay.position, held_ids(replay)) == (3, 3, [0, 1, 2])
    replay.add(*transitions(range(3, 7), action_shape))  # crosses the end: 5, 6 replace 0, 1
    assert (len(replay), replay.position, held_ids(replay)) == (5, 2, [5, 6, 2, 3, 4])
    # 12 rows into 5: only the last 5 stay, where writing one by one would put them.
    replay.add(*transitions(range(7, 19), action_shape))
    assert (len(replay), replay.position, held_ids(replay)) == (5, 4, [15, 16, 17, 18, 14])
    batch = replay.sample(500)
    assert_rows_belong_together(batch, action_shape)
    assert set(batch.rewards.long().tolist()) == {14, 15, 16, 17, 18}
    assert torch.equal(replay.rewards[batch.index], batch.rewards)
    assert torch.equal(batch.weights, torch.ones(500))


def test_add_rejects_rows_of_the_wrong_shape():
    replay = buffer()
    obs, actions, rewards, next_obs, terminated = transitions(range(4))
    with pytest.raises(ValueError, match=r"actions has shape \(3, 2\), expected \(4, 2\)"):
        replay.add(obs, actions[:3], rewards, next_obs, terminated)
    with pytest.raises(ValueError, match="next_obs has shape"):
        replay.add(obs, actions, rewards, next_obs[:, :2], terminated)


def test_sample_refuses_an_empty_buffer_and_an_empty_batch():
    replay = buffer(prioritized=True)
    with pytest.raises(ValueError, match="empty on every rank"):
        replay.sample(4)
    replay.add(*transitions(range(2)))
    with pytest.raises(ValueError, match="global_batch must be at least 1"):
        replay.sample(0)
    with pytest.raises(ValueError, match="prioritized=True"):
        buffer().update_priorities(torch.tensor([0]), torch.tensor([1.0]))


# ---- checkpoints -------------------------------------------------------------------
def assert_same_batch(a, b):
    for name, x, y in zip(a._fields, a, b):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_a_reloaded_buffer_continues_identically(prioritized):
    original = buffer(prioritized=prioritized, seed=3)
    original.add(*transitions(range(7)))
    if prioritized:
        original.update_priorities(torch.tensor([0, 2, 4]), torch.tensor([3.0, 0.1, 0.5]))
    original.sample(8)
    state = original.state_dict()
    assert all(v.device.type == "cpu" for v in state.values() if isinstance(v, torch.Tensor))
    saved = io.BytesIO()
    torch.save(state, saved)
    saved.seek(0)
    state = torch.load(saved, weights_only=True)

    reloaded = buffer(prioritized=prioritized, seed=3)
    reloaded.add(*transitions(range(100, 102)))  # other rows and generators, all replaced
    reloaded.sample(3)
    reloaded.load_state_dict(state)
    for _ in range(3):
        assert_same_batch(original.sample(16, beta=0.5), reloaded.sample(16, beta=0.5))
    for replay in (original, reloaded):
        replay.add(*transitions(range(7, 9)))
    assert reloaded.position == original.position == 4
    assert held_ids(reloaded) == held_ids(original) == [5, 6, 7, 8, 4]
    if prioritized:
        assert torch.equal(reloaded.priorities, original.priorities)
    assert_same_batch(original.sample(16), reloaded.sample(16))


def test_a_state_that_does_not_fit_is_a_clear_error():
    replay = buffer(prioritized=True)
    replay.add(*transitions(range(3)))
    state = replay.state_dict()
    with pytest.raises(ValueError, match="capacity=5, this buffer capacity=6"):
        buffer(capacity=6, prioritized=True).load_state_dict(state)
    with pytest.raises(ValueError, match="prioritized=True, this buffer prioritized=False"):
        buffer().load_state_dict(state)
    with pytest.raises(ValueError, match="lacks priorities"):
        buffer(prioritized=True).load_state_dict(
            {k: v for k, v in state.items() if k != "priorities"})
    with pytest.raises(ValueError, match=r"obs is torch.float32 \(2, 3\), expected"):
        buffer(prioritized=True).load_state_dict(dict(state, obs=state["obs"][:2]))
    with pytest.raises(ValueError, match="size=9, position=3 outside"):
        buffer(prioritized=True).load_state_dict(dict(state, size=9))
    with pytest.raises(ValueError, match="must be a dict"):
        buffer().load_state_dict([])


# ---- prioritized sampling, one process ---------------------------------------------
def test_prioritized_frequencies_and_weights_follow_the_priorities():
    replay = buffer(capacity=len(SHARD_PRIORITIES[1]), prioritized=True, seed=1)
    replay.add(*transitions(range(replay.capacity)))
    priorities = SHARD_PRIORITIES[1]
    replay.update_priorities(torch.arange(replay.capacity), torch.tensor(priorities))
    probabilities = powered(priorities) / powered(priorities).sum()
    assert chi_square_p(id_histogram(replay, 20, 2000), probabilities) > P_VALUE

    batch = replay.sample(256, beta=0.4)
    assert_rows_belong_together(batch)
    n = replay.capacity
    expected = (n * probabilities[batch.index]) ** -0.4 / (n * probabilities.min()) ** -0.4
    assert torch.allclose(batch.weights.double(), expected, rtol=1e-6)
    assert batch.weights.max() <= 1

    # New priorities: the old distribution is now rejected, the new one fits.
    changed = list(reversed(priorities))
    replay.update_priorities(torch.arange(n), torch.tensor(changed))
    histogram = id_histogram(replay, 20, 2000)
    assert chi_square_p(histogram, probabilities) < 1e-12
    assert chi_square_p(histogram, powered(changed) / powered(changed).sum()) > P_VALUE


def test_new_rows_get_the_largest_priority_ever_set():
    replay = buffer(capacity=4, prioritized=True)
    replay.add(*transitions(range(2)))
    assert torch.equal(replay.priorities[:2], torch.ones(2))  # 1.0 before any update
    replay.update_priorities(torch.tensor([0, 1]), torch.tensor([5.0, 0.5]))
    replay.update_priorities(torch.tensor([0]), torch.tensor([0.2]))  # ever set, not held
    replay.add(*transitions(range(2, 4)))
    assert torch.equal(replay.priorities, torch.tensor([0.2, 0.5, 5.0, 5.0]) + EPS)


# ---- shards as threads of one process ----------------------------------------------
class ThreadGroup:
    """Ranks as threads: a reduction waits for every rank's tensor, as an all-reduce does."""

    def __init__(self, world_size):
        self.barrier = threading.Barrier(world_size, timeout=10)
        self.contributions = [None] * world_size

    def reduce(self, rank, tensor, reduction):
        self.contributions[rank] = tensor
        self.barrier.wait()
        result = reduction(torch.stack(self.contributions))
        self.barrier.wait()  # no rank replaces its contribution before all have read them
        return result


class ThreadRank:
    def __init__(self, group, rank, world_size):
        self.group, self.rank, self.world_size = group, rank, world_size

    def sum(self, t):
        return self.group.reduce(self.rank, t, lambda ts: ts.sum(0))

    def min(self, t):
        return self.group.reduce(self.rank, t, lambda ts: ts.min(0).values)


def on_every_rank(shards, call):
    with ThreadPoolExecutor(len(shards)) as pool:
        return list(pool.map(call, shards))


def fill(replay, shard, offset, prioritized):
    """Shard `shard`'s rows (union ids from `offset`), and their priorities, into `replay`."""
    priorities = SHARD_PRIORITIES[shard]
    ids = torch.arange(offset, offset + len(priorities))
    replay.add(*transitions(ids.tolist()))
    if prioritized:  # the rows just added are the last held (these rings never wrap)
        positions = torch.arange(len(replay) - len(priorities), len(replay))
        replay.update_priorities(positions, torch.tensor(priorities))


def shards_and_union(prioritized, seed=5):
    group = ThreadGroup(2)
    shards = [buffer(capacity=8, prioritized=prioritized, seed=seed,
                     collectives=ThreadRank(group, rank, 2)) for rank in range(2)]
    union = buffer(capacity=16, prioritized=prioritized, seed=seed, collectives=LOCAL)
    offsets = [0, len(SHARD_PRIORITIES[0])]
    for shard, offset in enumerate(offsets):
        fill(shards[shard], shard, offset, prioritized)
        fill(union, shard, offset, prioritized)
    return shards, union


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_shards_draw_their_union_share_and_the_union_weights(prioritized):
    shards, union = shards_and_union(prioritized)
    if prioritized:
        masses = torch.stack([powered(p).sum() for p in SHARD_PRIORITIES])
    else:
        masses = torch.tensor([len(p) for p in SHARD_PRIORITIES], dtype=torch.float64)
    # Each row's weight in one buffer holding the union (a large batch meets every row).
    union_batch = union.sample(4000, beta=0.7)
    union_weight = dict(zip(union_batch.rewards.long().tolist(), union_batch.weights.tolist()))
    assert len(union_weight) == UNION_SIZE

    for _ in range(5):
        batches = on_every_rank(shards, lambda shard: shard.sample(64, beta=0.7))
        for rank, (shard, batch) in enumerate(zip(shards, batches)):
            assert torch.allclose(shard.last_shard_probs, masses / masses.sum(), rtol=1e-12)
            assert torch.equal(shard.last_counts, shards[0].last_counts)
            assert len(batch.index) == shard.last_counts[rank]
            assert_rows_belong_together(batch)
            ids = batch.rewards.long().tolist()
            assert batch.weights.tolist() == [union_weight[i] for i in ids]
        assert shards[0].last_counts.sum() == 64


def test_an_empty_shard_gets_no_rows_and_an_empty_union_is_refused():
    group = ThreadGroup(2)
    shards = [buffer(capacity=8, prioritized=True, collectives=ThreadRank(group, rank, 2))
              for rank in range(2)]
    with pytest.raises(ValueError, match="empty on every rank"):
        on_every_rank(shards, lambda shard: shard.sample(4))
    fill(shards[1], 1, 0, prioritized=True)
    empty, full = on_every_rank(shards, lambda shard: shard.sample(32))
    assert shards[0].last_counts.tolist() == [0, 32]
    assert empty.obs.shape == (0, OBS_DIM) and empty.actions.shape == (0, 2)
    assert empty.index.dtype == torch.int64 and empty.weights.shape == (0,)
    assert len(full.index) == 32
    # The minimum priority is the full shard's: the empty one offered +inf.
    assert full.weights.max() <= 1 and torch.isfinite(full.weights).all()


def test_new_rows_get_the_largest_priority_of_any_rank_after_a_sample():
    shards, _ = shards_and_union(prioritized=True)
    shards[1].update_priorities(torch.tensor([0]), torch.tensor([9.0]))
    on_every_rank(shards, lambda shard: shard.sample(8))
    shards[0].add(*transitions([50]))
    assert shards[0].priorities[len(SHARD_PRIORITIES[0])] == torch.tensor(9.0) + EPS


# ---- shards as gloo processes ------------------------------------------------------
CALLS, GLOBAL_BATCH, BETA = 300, 50, 0.5


def sharded_worker(out_dir):
    """One rank: hold its shard, sample many global batches, save what the parent checks."""
    from gpusim.scale.device import DeviceContext
    context = DeviceContext.from_environment()
    context.bind("cpu", quiet=True)
    distributed.init(context, timeout_s=30, collective_timeout_s=30)
    rank = context.rank
    offset = sum(len(p) for p in SHARD_PRIORITIES[:rank])
    results = {}
    for prioritized in (False, True):
        replay = buffer(capacity=8, prioritized=prioritized, seed=11,
                        collectives=TorchCollectives())
        fill(replay, rank, offset, prioritized)
        histogram = torch.zeros(UNION_SIZE, dtype=torch.int64)
        weights = torch.full((UNION_SIZE,), float("nan"))
        counts = []
        for _ in range(CALLS):
            batch = replay.sample(GLOBAL_BATCH, beta=BETA)
            ids = batch.rewards.long()
            assert len(ids) == replay.last_counts[rank]
            histogram += torch.bincount(ids, minlength=UNION_SIZE)
            weights[ids] = batch.weights
            counts.append(replay.last_counts)
        results[prioritized] = {"histogram": histogram, "weights": weights,
                                "counts": torch.stack(counts)}
    torch.save(results, out_dir / f"rank{rank}.pt")
    distributed.shutdown()
    return 0


def test_two_gloo_ranks_sample_as_one_buffer_holding_their_union(tmp_path):
    distributed.launch(2, sharded_worker, tmp_path, timeout_s=60)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    union_powered = torch.cat([powered(p) for p in SHARD_PRIORITIES])
    for prioritized in (False, True):
        first, second = ranks[0][prioritized], ranks[1][prioritized]
        assert torch.equal(first["counts"], second["counts"])  # no rank drew its own
        assert (first["counts"].sum(1) == GLOBAL_BATCH).all()
        histogram = first["histogram"] + second["histogram"]
        assert histogram.sum() == CALLS * GLOBAL_BATCH
        # Each rank's rows lie in its own shard: rank 0 holds union ids 0..4.
        size_0 = len(SHARD_PRIORITIES[0])
        assert first["histogram"][size_0:].sum() == 0 == second["histogram"][:size_0].sum()
        if prioritized:
            probabilities = union_powered / union_powered.sum()
            expected_weights = (union_powered / union_powered.min()) ** -BETA
        else:
            probabilities = torch.full((UNION_SIZE,), 1 / UNION_SIZE, dtype=torch.float64)
            expected_weights = torch.ones(UNION_SIZE, dtype=torch.float64)
        assert chi_square_p(histogram, probabilities) > P_VALUE
        weights = torch.where(first["weights"].isnan(), second["weights"], first["weights"])
        assert torch.allclose(weights.double(), expected_weights, rtol=1e-6)


# ---- rows out of play ----------------------------------------------------------------
@pytest.mark.parametrize("prioritized", [False, True])
def test_rows_flagged_out_of_play_are_never_drawn_and_survive_a_checkpoint(prioritized):
    replay = buffer(capacity=8, prioritized=prioritized)
    valid = torch.tensor([True, False, True, False, True, True])
    replay.add(*transitions(range(6)), valid=valid)
    drawn = id_histogram(replay, 20, 100)
    assert drawn[1] == drawn[3] == 0 and all(drawn[k] > 0 for k in (0, 2, 4, 5))
    if not prioritized:  # uniform over the rows in play
        assert chi_square_p(drawn[[0, 2, 4, 5]], torch.full((4,), 0.25)) > P_VALUE
    replay.add(*transitions(range(6, 8)))  # later rows without a flag are in play
    restored = buffer(capacity=8, prioritized=prioritized)
    restored.load_state_dict(io_round_trip(replay.state_dict()))
    assert torch.equal(restored.valid, replay.valid)
    assert_rows_belong_together(restored.sample(64))


def io_round_trip(state):
    data = io.BytesIO()
    torch.save(state, data)
    data.seek(0)
    return torch.load(data, weights_only=True)


# ---- a static sample (a gradient step replayed as a CUDA graph) ---------------------------
def test_a_static_sample_is_uniform_over_the_rows_held_when_it_runs():
    """`sample_static` reads the held count on the device, so the same step samples a
    buffer that grew since it was written; each `draw_static` draws anew."""
    replay = buffer(capacity=20)
    replay.add(*transitions(range(4)))
    replay.draw_static(2000)
    first = replay.sample_static()
    assert_rows_belong_together(first)
    assert set(first.rewards.long().tolist()) == set(range(4))
    assert torch.equal(first.weights, torch.ones(2000))
    replay.add(*transitions(range(4, 10)))
    grown = replay.sample_static()  # the same draws, over 10 rows now
    assert set(grown.rewards.long().tolist()) == set(range(10))
    histogram = torch.zeros(10)
    for _ in range(20):
        replay.draw_static(1000)
        histogram += torch.bincount(replay.sample_static().rewards.long(), minlength=10)
    assert chi_square_p(histogram, torch.full((10,), 0.1)) > P_VALUE
    assert replay.sample_calls == 21
