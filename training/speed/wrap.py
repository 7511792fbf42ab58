"""How a PPO run's steps run, chosen once, around its plain methods (LeanRL's shape).

`wrap_ppo(ppo)` takes the solo PPO's own functions (training.algorithms.ppo: the
rollout, the update, GAE, each policy's critic and training pass) and returns how each
runs: the run's in one record (`Speed`), each policy's set on it; nothing else in the
learner asks:

- on a CUDA device the rollout and the whole update are captured once as CUDA graphs and
  replayed (training.speed.graphs), where their shapes are fixed: no rows out of play
  left out (`trainer.out_of_play: skip` with per-agent done makes the update's shapes
  change with the rollout), one process;
- where they are not fixed, the update's fixed-size parts are graphs instead: the critic
  over the rows in play and each minibatch in chunks padded to one size, GAE, the
  optimizer step (`padded`);
- a minibatch runs in chunks of `max_minibatch_rows` rows where it has more
  (`chunked_step`, gradients accumulated; under DDP only the last all-reduces);
- `trainer.compile` compiles a minibatch step whole (training.speed.descent), or else the
  training pass, and on a GPU the acting and critic passes (training.speed.acceleration).

On the CPU, by default, every one of these is the plain function itself.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .acceleration import MaybeCompiled
from .descent import CompiledDescent
from .graphs import FixedChunks, StepGraph, graphs_of, step_graph


@dataclass
class Speed:
    """How a PPO run's steps run (see the module)."""
    rollout: object     # the rollout, or its StepGraph (replayed once captured)
    update: object      # the update of every learning policy, or its StepGraph
    whole: bool         # the update one captured graph
    chunk: int          # units (rows, or a recurrent policy's sequences) per minibatch chunk
    padded: bool        # the update's fixed-size parts graphs: every chunk `chunk` units
    compile_acting: bool
    timer: object

    def collect(self, timer):
        """A rollout (its CUDA graph replayed, once captured: one section, "rollout")."""
        captured = isinstance(self.rollout, StepGraph) and self.rollout.graph is not None
        with timer("rollout") if captured else contextlib.nullcontext():
            self.rollout()

    def acting(self, fn, what: str):
        """A policy's acting function, compiled where asked (training.actors wraps it)."""
        return MaybeCompiled(fn, what, self.compile_acting)

    def graphs(self, policies: list) -> list:
        return graphs_of([self.rollout, self.update]) + [
            g for p in policies for g in self.policy_graphs(p)]

    @staticmethod
    def policy_graphs(p) -> list:
        """Policy `p`'s fixed-size parts' StepGraphs (where `padded`)."""
        return graphs_of([p.gae, p.value_rows.graph, p.chunk_step, p.optimizer_step])

    def warming_up(self, policies: list) -> bool:
        return any(graph.warming_up() for graph in self.graphs(policies))

    def drop(self, policies: list):
        """Forget every captured graph (their tensors were loaded anew): captured again."""
        for graph in self.graphs(policies):
            graph.drop()

    def probe(self, ppo):
        """Compile each policy's training pass forward and backward now, so a compiler
        failure falls back before training (a backward compiled lazily could not)."""
        for p in ppo.policies:
            if not p.train_pass.active:
                continue
            rows = torch.arange(min(8, p.buffer.rewards.numel()), device=ppo.env.device)
            inputs = ppo.inputs(p, rows[:, None] if ppo.bptt_len else rows)
            no_sync = p.train_model.no_sync() if ppo.distributed else contextlib.nullcontext()
            try:
                with no_sync, ppo.precision.autocast():
                    out = p.train_pass.compiled(*inputs)
                with no_sync:
                    sum(o.float().sum() for o in out).backward()
            except Exception as exc:  # noqa: BLE001 - any compiler failure: run eagerly
                p.train_pass.fall_back(exc)
            p.adam.zero_grad()


def wrap_ppo(ppo) -> Speed:
    """How PPO run `ppo`'s steps run on its device (see the module); each policy's passes
    set on it."""
    cfg, timer = ppo.cfg, ppo.timer
    static, capture = ppo.static, ppo.use_graphs
    fixed = not ppo.per_agent_done or cfg.out_of_play == "weigh" or ppo.bptt_len
    whole = static and fixed and not ppo.distributed  # (DDP all-reduces inside it)
    padded = static and not whole and not ppo.distributed
    speed = Speed(step_graph(ppo.rollout, "the rollout", capture, capture, timer),
                  step_graph(ppo.update_all, "the update", capture and whole, capture and whole,
                             timer),
                  whole=capture and whole,
                  chunk=max(1, cfg.max_minibatch_rows // max(1, ppo.bptt_len)), padded=padded,
                  compile_acting=ppo.compile_acting, timer=timer)
    fused = ppo.use_compile and not ppo.distributed and not ppo.bptt_len
    for p in ppo.policies:
        what = f"policy {p.name!r}"
        p.value = MaybeCompiled(p.model.value, f"{what} (value)", ppo.compile_acting)
        p.train_pass = MaybeCompiled(p.train_model, f"{what} (update)",
                                     ppo.use_compile and not fused)
        p.gae = step_graph(ppo.gae, f"{what}'s GAE", padded, capture and padded, timer)
        p.value_rows = FixedChunks(lambda rows, p=p: ppo.row_values(p, rows),
                                   cfg.max_minibatch_rows, f"{what}'s value chunk", padded,
                                   capture, timer)
        p.chunk_step = step_graph(lambda *part, p=p: _chunk(ppo, p, *part),
                                  f"{what}'s minibatch chunk", padded, capture and padded, timer)
        p.optimizer_step = step_graph(lambda p=p: _optimizer_step(p),
                                      f"{what}'s optimizer step", padded, capture and padded,
                                      timer)
        p.fused = compiled_step(ppo, p) if fused else None
    return speed


def chunked_step(ppo, p, rows, adv, returns, weights, total):
    """One minibatch step on `rows` in chunks of `ppo.speed.chunk` units, their gradients
    accumulated (each chunk's loss weighed by its share of the minibatch), then Adam's
    step; where `padded`, every chunk that size (the last padded with rows weighing 0).
    Under DDP the chunks before the last skip the all-reduce. The statistics."""
    speed, count = ppo.speed, rows.shape[0]
    if speed.padded and weights is None:  # (one form for every chunk: weighted)
        weights = torch.ones(rows.shape, device=adv.device)
        total = weights.sum()
    stats = 0.0
    for start in range(0, count, speed.chunk):
        n = min(speed.chunk, count - start)
        part = [x if x is None else x.narrow(0, start, n) for x in (rows, adv, returns, weights)]
        if weights is None:  # the chunk's share of the minibatch: of its units
            share = torch.full((), n / count, device=adv.device)
        else:  # of its rows' weights
            share = part[3].sum() / total
        if speed.padded and n < speed.chunk:
            part = _padded(part, speed.chunk - n)
        last = start + n >= count
        sync = p.train_model.no_sync() if ppo.distributed and not last \
            else contextlib.nullcontext()
        with sync:
            stats = stats + p.chunk_step(*part, share)
    p.optimizer_step()
    return stats


def _chunk(ppo, p, rows, adv, returns, weights, share):
    """A chunk's loss, weighed by its share, differentiated into the gradients."""
    stats, loss = ppo.loss(p, rows, adv, returns, weights)
    (loss * share).backward()
    return stats * share


def _optimizer_step(p):
    p.adam.step()
    p.adam.zero_grad()


def _padded(part: list, extra: int) -> list:
    """A chunk's inputs padded with `extra` copies of its first unit, weighing 0 (finite
    terms, so 0 times them is 0)."""
    def grow(x, fill=None):
        more = x.narrow(0, 0, 1).expand(extra, *x.shape[1:])
        return torch.cat([x, more if fill is None else torch.full_like(more, fill)])
    rows, adv, returns, weights = part  # (weights: every padded step has them)
    return [grow(rows), grow(adv), grow(returns), grow(weights, 0.0)]


def compiled_step(ppo, p) -> CompiledDescent:
    """A minibatch step as one compiled call: PPO's loss on the parameters, differentiated
    and stepped inside (training.speed.descent)."""
    def loss(params, rows, adv, returns, weights):
        def forward(*inputs):
            return torch.func.functional_call(p.model, params, inputs)
        stats, value = ppo.loss(p, rows, adv, returns, weights, forward=forward)
        return value, stats
    return CompiledDescent({"model": (dict(p.model.named_parameters()), p.adam)},
                           lambda descent, *batch: descent.step("model", loss, *batch),
                           f"policy {p.name!r} (update)",
                           dynamic=ppo.per_agent_done)  # (rows in play vary)


def ddp(model, device):
    """DDP under several ranks (gradients averaged); its constant buffers (a Gaussian's
    bounds) need no broadcast on every forward."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel
    device_ids = [device.index] if device.type == "cuda" else None
    # "no buffer broadcast": `forward_sync_buffers` where torch has it (it deprecates
    # `broadcast_buffers` with a warning), else `broadcast_buffers`
    keyword = "forward_sync_buffers" \
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters \
        else "broadcast_buffers"
    return DistributedDataParallel(model, device_ids=device_ids, **{keyword: False})
