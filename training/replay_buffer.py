"""A device-resident replay buffer for off-policy learners (SAC, TD3, DDPG), uniform or
prioritized, that samples correctly when every process keeps its own shard.

Storage. Each field is one preallocated tensor on the buffer's device, used as a
ring: `add` writes a chunk with one indexed copy per field (no host copy, no loop
over rows), the oldest rows are overwritten, and a chunk longer than the capacity
keeps its last `capacity` rows, at the positions that writing row by row would
have given them. Writing starts at position 0, so the held rows are always
positions [0, size).

Sharding. With N processes, each holds the rows its own environments produced.
A global batch must be distributed as if one buffer held the union, so sampling
has two stages, which together give every row of the union its union probability:
  1. How many rows each shard contributes: counts ~ Multinomial(global_batch,
     mass_r / total), where mass_r is shard r's size (uniform) or its sum of
     p^alpha (prioritized). Every rank learns every shard's mass from one all-reduce
     (own mass in slot `rank` of a zero vector, summed), then draws the counts with
     a CPU generator seeded from (seed, number of sample calls so far): every rank
     draws the same counts without communicating further.
  2. Which rows within the shard: uniform over the held rows, or proportional to
     p^alpha, drawn with this rank's own generator on the device, seeded from
     (seed, rank).
Prioritized sampling draws rows by inverse CDF (a float64 cumulative sum and
`searchsorted`) rather than `torch.multinomial`, which refuses more than 2^24
categories and accumulates in the priorities' own precision.

Importance weights (Schaul et al., proportional variant): w_i = (N P(i))^-beta / max_w
with N the union's size, P(i) = p_i^alpha / union mass, and max_w the weight of the
union's smallest priority. N and the mass cancel, so w_i = (p_i^alpha / min p^alpha)^-beta,
which needs only the global minimum: a second all-reduce (min), to which an empty
shard contributes +inf. That all-reduce also carries (negated) each shard's largest
priority, so new rows get the largest priority set on any rank. Each rank learns the
others' largest priorities at the next `sample`, not immediately: a row added between
another rank's `update_priorities` and the next `sample` may get a smaller initial
priority than a single buffer would give it.

`sample` is a collective: every rank calls it with the same arguments, in the same
order. With several ranks it synchronises with the host once, to read the masses (the
counts fix the shapes of the batch). A lone process never waits for the device: its
shard is the union, its size is a host number, and a prioritized draw stays on the
device. `add` and `update_priorities` are local and never synchronise.

Rows out of play. A learner with per-agent done adds every agent's row with a `valid`
flag (no data-dependent shapes, so no host sync per step); rows with valid False
have zero mass and are never drawn (uniform sampling then draws in proportion to
`valid`, on the device, as prioritized sampling does).
"""
from __future__ import annotations

import hashlib
from typing import NamedTuple

import torch

from .collectives import LOCAL, Collectives

MIX_BITS = 63  # seeds derived for torch generators stay non-negative int64


class Batch(NamedTuple):
    """This rank's share of a global batch; `index` are positions in this shard."""
    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor
    index: torch.Tensor
    weights: torch.Tensor  # importance weights; ones for a uniform buffer


def derived_seed(*parts) -> int:
    """A seed for one purpose (its parts name it), independent of the seeds for others."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - MIX_BITS)


class ReplayBuffer:
    """A ring of transitions on `device`; one shard of the union when `collectives` spans
    several processes. See the module docstring for how sampling stays union-correct."""

    STORED = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity: int, obs_dim: int, action_shape: tuple,
                 action_dtype: torch.dtype, device, prioritized: bool = False,
                 alpha: float = 0.6, eps: float = 1e-6, collectives: Collectives = LOCAL,
                 seed: int = 0):
        if capacity < 1 or obs_dim < 1:
            raise ValueError(f"capacity and obs_dim must be at least 1, "
                             f"got capacity={capacity}, obs_dim={obs_dim}")
        if alpha < 0 or eps < 0:
            raise ValueError(f"alpha and eps must be >= 0, got alpha={alpha}, eps={eps}")
        self.capacity = int(capacity)
        self.obs_dim = int(obs_dim)
        self.action_shape = tuple(int(d) for d in action_shape)
        self.action_dtype = action_dtype
        self.device = torch.device(device)
        self.prioritized = bool(prioritized)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.collectives = collectives
        self.seed = int(seed)

        self.obs = torch.zeros(capacity, obs_dim, device=self.device)
        self.actions = torch.zeros(capacity, *self.action_shape, dtype=action_dtype,
                                   device=self.device)
        self.rewards = torch.zeros(capacity, device=self.device)
        self.next_obs = torch.zeros(capacity, obs_dim, device=self.device)
        self.terminated = torch.zeros(capacity, dtype=torch.bool, device=self.device)
        self.priorities = (torch.zeros(capacity, device=self.device) if prioritized else None)
        self.valid = None  # made by the first add with a `valid` flag (see the module doc)
        # A device tensor, so that neither `add` nor `update_priorities` waits for the device.
        self.max_priority = torch.ones((), device=self.device)

        self.position = 0      # where the next row goes
        self.size = 0          # rows held: positions [0, size)
        # the same two on the device, so that a captured step (a CUDA graph) writes and
        # samples where the ring stands at each replay
        self.write_at = torch.zeros((), dtype=torch.long, device=self.device)
        self.held = torch.zeros((), dtype=torch.long, device=self.device)
        self.draws = None      # a static sample's draws (draw_static)
        self.sample_calls = 0  # seeds the shard counts, identically on every rank
        self.row_generator = torch.Generator(device=self.device)
        self.row_generator.manual_seed(derived_seed("rows", self.seed, collectives.rank))
        self.last_counts = None  # rows each shard gave the last batch (the same on every rank)
        self.last_shard_probs = None  # each shard's probability in the last sample

    def __len__(self) -> int:
        return self.size

    # ---- writing --------------------------------------------------------------------
    def add(self, obs, actions, rewards, next_obs, terminated, valid=None):
        """Append n transitions (flat rows), overwriting the oldest when full; `valid` (n,)
        bool marks the rows that may be drawn (default: all)."""
        n = obs.shape[0]
        expected = {"obs": (n, self.obs_dim), "actions": (n, *self.action_shape),
                    "rewards": (n,), "next_obs": (n, self.obs_dim), "terminated": (n,)}
        given = dict(zip(self.STORED, (obs, actions, rewards, next_obs, terminated)))
        for name, shape in expected.items():
            if tuple(given[name].shape) != shape:
                raise ValueError(f"add: {name} has shape {tuple(given[name].shape)}, "
                                 f"expected {shape}")
        if n == 0:
            return
        self.write(obs, actions, rewards, next_obs, terminated, valid)
        self.advance(n)

    def write(self, obs, actions, rewards, next_obs, terminated, valid=None):
        """`add`'s device side (no check, no host counter): what a captured step replays,
        followed by `advance` on the host."""
        n = obs.shape[0]
        given = (obs, actions, rewards, next_obs, terminated)
        kept = min(n, self.capacity)  # of a chunk longer than the ring, only its tail survives
        positions = (self.write_at + (n - kept)
                     + torch.arange(kept, device=self.device)) % self.capacity
        for name, value in zip(self.STORED, given):
            store = getattr(self, name)
            store[positions] = value[n - kept:].to(self.device, store.dtype)
        if self.prioritized:
            self.priorities[positions] = self.max_priority
        if valid is not None and self.valid is None:
            self.valid = torch.ones(self.capacity, dtype=torch.bool, device=self.device)
        if self.valid is not None:
            self.valid[positions] = True if valid is None else valid[n - kept:]
        self.write_at.add_(n).remainder_(self.capacity)
        self.held.add_(n).clamp_(max=self.capacity)

    def advance(self, n: int):
        """The host's counters after `write` of n rows."""
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def update_priorities(self, index: torch.Tensor, priorities: torch.Tensor):
        """Set the priorities (|TD error|-like, >= 0; not checked, which would wait for the
        device) of rows `index` of this shard, stored as p + eps."""
        if not self.prioritized:
            raise ValueError("update_priorities needs a buffer made with prioritized=True")
        if index.shape != priorities.shape or index.dim() != 1:
            raise ValueError(f"update_priorities: index {tuple(index.shape)} and priorities "
                             f"{tuple(priorities.shape)} must be 1-D of the same length")
        if index.numel() == 0:
            return
        stored = priorities.detach().to(self.device, self.priorities.dtype) + self.eps
        self.priorities[index.to(self.device)] = stored
        self.max_priority = torch.maximum(self.max_priority, stored.max())

    # ---- sampling -------------------------------------------------------------------
    def sample(self, global_batch: int, beta: float = 0.4) -> Batch:
        """This rank's share of one global batch drawn from the union of all shards.

        A collective: every rank calls it with the same arguments.
        """
        if global_batch < 1:
            raise ValueError(f"global_batch must be at least 1, got {global_batch}")
        world, rank = self.collectives.world_size, self.collectives.rank
        held = self.size
        if held == 0 and world == 1:
            raise ValueError("sample: the replay buffer is empty on every rank")
        if world == 1:
            return self._sample_alone(global_batch, beta)
        if self.prioritized or self.valid is not None:
            powered = self._powered()
            cdf = torch.cumsum(powered, 0)
            stats = torch.zeros(2 * world, dtype=torch.float64, device=self.device)
            stats[rank] = held
            if held:
                stats[world + rank] = cdf[-1]
            stats = self.collectives.sum(stats).cpu()  # the one wait for the device
            sizes, masses = stats[:world], stats[world:]
        else:
            stats = torch.zeros(world, dtype=torch.float64, device=self.device)
            stats[rank] = held
            sizes = masses = self.collectives.sum(stats).cpu()
        if sizes.sum() == 0:
            raise ValueError("sample: the replay buffer is empty on every rank")
        if masses.sum() <= 0:
            raise ValueError("sample: every priority is zero (use eps > 0)")

        counts = self._shard_counts(masses, global_batch)
        count = int(counts[rank])
        if self.valid is not None and not self.prioritized:  # uniform over valid rows
            if not count:
                return self._batch(self._no_rows(), torch.ones(0, device=self.device))
            return self._batch(self._draw(cdf, count), torch.ones(count, device=self.device))
        if not self.prioritized:
            index = torch.randint(held, (count,), generator=self.row_generator,
                                  device=self.device) if count else self._no_rows()
            return self._batch(index, torch.ones(count, device=self.device))

        # The global minimum of p^alpha (for max_w) and the global largest priority (for
        # new rows) travel together; an empty shard offers +inf and nothing.
        own_min = torch.where(powered > 0, powered, torch.inf).min() if held else \
            torch.tensor(torch.inf, dtype=torch.float64, device=self.device)
        extremes = self.collectives.min(torch.stack([own_min, -self.max_priority.double()]))
        min_powered = extremes[0]
        self.max_priority = (-extremes[1]).to(self.max_priority.dtype)
        if not count:
            return self._batch(self._no_rows(), torch.ones(0, device=self.device))
        index = self._draw(cdf, count)
        weights = (powered[index] / min_powered).pow(-beta).float()
        return self._batch(index, weights)

    # ---- a static sample (a step replayed as a CUDA graph) --------------------------------
    def draw_static(self, batch: int):
        """Before a static step: `batch` draws for `sample_static` into a fixed tensor, from
        the row generator (a graph replays only torch's default generator). A lone process's
        uniform buffer with every row valid only."""
        if self.draws is None or self.draws.shape[0] != batch:
            self.draws = torch.empty(batch, dtype=torch.long, device=self.device)
        torch.randint(1 << 62, (batch,), generator=self.row_generator, device=self.device,
                      out=self.draws)
        self.sample_calls += 1

    def sample_static(self) -> Batch:
        """Inside a static step: the rows of the last draws, uniform over the held rows read
        on the device (`held`), so a replay samples what is held then (the modulo's bias is
        below 2^-40)."""
        index = self.draws % self.held
        return self._batch(index, torch.ones(index.shape[0], device=self.device))

    def _powered(self) -> torch.Tensor:
        """Each held row's sampling mass: p^alpha (prioritized) or 1, and 0 out of play."""
        held = self.size
        powered = self.priorities[:held].double().pow(self.alpha) if self.prioritized \
            else torch.ones(held, dtype=torch.float64, device=self.device)
        return powered if self.valid is None else powered * self.valid[:held]

    def _draw(self, cdf: torch.Tensor, count: int) -> torch.Tensor:
        """`count` rows in proportion to their mass (inverse CDF, on the device)."""
        draws = torch.rand(count, dtype=torch.float64, generator=self.row_generator,
                           device=self.device) * cdf[-1]
        # The first row whose cumulative mass exceeds the draw; rows of zero mass never are.
        return torch.searchsorted(cdf, draws, right=True).clamp_(max=self.size - 1)

    def _sample_alone(self, batch: int, beta: float) -> Batch:
        """A lone process: its shard is the union; no host read of device values."""
        self.last_counts = torch.tensor([batch])
        self.last_shard_probs = torch.ones(1, dtype=torch.float64)
        self.sample_calls += 1
        if not self.prioritized and self.valid is None:
            index = torch.randint(self.size, (batch,), generator=self.row_generator,
                                  device=self.device)
            return self._batch(index, torch.ones(batch, device=self.device))
        powered = self._powered()
        cdf = torch.cumsum(powered, 0)
        index = self._draw(cdf, batch)
        if not self.prioritized:
            return self._batch(index, torch.ones(batch, device=self.device))
        # the smallest mass of a row that can be drawn (rows out of play have none)
        min_powered = torch.where(powered > 0, powered, torch.inf).min()
        weights = (powered[index] / min_powered).pow(-beta).float()
        return self._batch(index, weights)

    def _shard_counts(self, masses: torch.Tensor, global_batch: int) -> torch.Tensor:
        """Rows per shard, drawn identically on every rank from (seed, sample call)."""
        generator = torch.Generator().manual_seed(
            derived_seed("shards", self.seed, self.sample_calls))
        self.sample_calls += 1
        probs = masses / masses.sum()
        shard_of_row = torch.multinomial(probs, global_batch, replacement=True,
                                         generator=generator)
        self.last_counts = torch.bincount(shard_of_row, minlength=len(masses))
        self.last_shard_probs = probs
        return self.last_counts

    def _no_rows(self) -> torch.Tensor:
        return torch.zeros(0, dtype=torch.int64, device=self.device)

    def _batch(self, index: torch.Tensor, weights: torch.Tensor) -> Batch:
        return Batch(self.obs[index], self.actions[index], self.rewards[index],
                     self.next_obs[index], self.terminated[index], index, weights)

    # ---- checkpoints ----------------------------------------------------------------
    def _layout(self) -> dict:
        """What a state must agree on to be loaded into this buffer."""
        return {"capacity": self.capacity, "obs_dim": self.obs_dim,
                "action_shape": self.action_shape, "action_dtype": str(self.action_dtype),
                "prioritized": self.prioritized, "alpha": self.alpha, "eps": self.eps,
                "seed": self.seed}

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: held rows, ring position, priorities,
        the largest priority, the sample counter and the row generator (CPU tensors)."""
        state = dict(self._layout(), position=self.position, size=self.size,
                     sample_calls=self.sample_calls, max_priority=float(self.max_priority),
                     row_generator=self.row_generator.get_state())
        for name in self.STORED:
            state[name] = getattr(self, name)[:self.size].cpu()
        if self.prioritized:
            state["priorities"] = self.priorities[:self.size].cpu()
        if self.valid is not None:
            state["valid"] = self.valid[:self.size].cpu()
        return state

    def load_state_dict(self, state: dict):
        """Restore a `state_dict` onto this buffer's device; ValueError if it does not fit."""
        if not isinstance(state, dict):
            raise ValueError(f"replay state must be a dict, got {type(state).__name__}")
        stored = self.STORED + (("priorities",) if self.prioritized else ())
        required = (*self._layout(), "position", "size", "sample_calls", "max_priority",
                    "row_generator", *stored)
        missing = [key for key in required if key not in state]
        if missing:
            raise ValueError(f"replay state lacks {', '.join(missing)}")
        for key, value in self._layout().items():
            theirs = tuple(state[key]) if key == "action_shape" else state[key]
            if theirs != value:
                raise ValueError(f"replay state has {key}={state[key]!r}, "
                                 f"this buffer {key}={value!r}")
        size, position = state["size"], state["position"]
        if not (0 <= size <= self.capacity and 0 <= position < self.capacity):
            raise ValueError(f"replay state has size={size}, position={position} "
                             f"outside a capacity of {self.capacity}")
        if size < self.capacity and position != size:
            raise ValueError(f"replay state is not full (size={size}) yet its next write "
                             f"is at {position}, not {size}")
        for name in stored:
            store, value = getattr(self, name), state[name]
            if (not isinstance(value, torch.Tensor) or value.dtype != store.dtype
                    or tuple(value.shape) != (size, *store.shape[1:])):
                described = (f"{value.dtype} {tuple(value.shape)}"
                             if isinstance(value, torch.Tensor) else type(value).__name__)
                raise ValueError(f"replay state's {name} is {described}, expected "
                                 f"{store.dtype} {(size, *store.shape[1:])}")
        generator = state["row_generator"]
        if not isinstance(generator, torch.Tensor) or generator.dtype != torch.uint8:
            raise ValueError("replay state's row_generator must be a uint8 tensor")
        try:
            self.row_generator.set_state(generator)
        except RuntimeError as error:
            raise ValueError(f"replay state's row_generator does not fit: {error}") from None

        for name in stored:
            getattr(self, name)[:size] = state[name].to(self.device)
        self.size, self.position = int(size), int(position)
        self.held.fill_(self.size)
        self.write_at.fill_(self.position)
        self.sample_calls = int(state["sample_calls"])
        self.max_priority = torch.tensor(float(state["max_priority"]), device=self.device)
        if isinstance(state.get("valid"), torch.Tensor) and state["valid"].shape == (size,):
            self.valid = torch.ones(self.capacity, dtype=torch.bool, device=self.device)
            self.valid[:size] = state["valid"].to(self.device, torch.bool)
