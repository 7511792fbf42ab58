"""TorchRL adapter: a gpusim env as a batched `torchrl.envs.EnvBase` (`to_torchrl`).

Layout, as TorchRL's multi-agent envs have it: the batch is the replicas
(`batch_size=[num_envs]`, `device=env.device`), each policy is a group of
agents under its own key (its agents in agent-id order; `group_map` names
them, from `env.agent_names`), the done flags of each agent sit in its group,
and the root done flags are the replica's (its episode, and what `_reset`
masks are about):

    (group, "observation")  float32  (num_envs, n_agents, policy obs_dim)
    (group, "action")       int64    (num_envs, n_agents)         Categorical, one component
                                     (num_envs, n_agents, n_comp) MultiCategorical, several
                            float32  (num_envs, n_agents, dims)   Bounded, continuous (a Box)
    (group, "reward")       float32  (num_envs, n_agents, 1)      under "next"
    (group, "done"), (group, "terminated"), (group, "truncated")
                            bool     (num_envs, n_agents, 1)      under "next"
    (group, "mask")         bool     (num_envs, n_agents)         with per-agent done only
    "done", "terminated", "truncated"  bool  (num_envs, 1)

An agent's flags are its replica's, except in an env with per-agent done
(`env.agent_active()`): there an agent is terminated from the step it leaves
play until its replica's episode ends, and `mask` says which agents are in
play at an observation (TorchRL's PettingZoo wrapper has the same convention).

A single-agent env (cartpole) is flattened by default, as TorchRL's GymEnv
has it: "observation" (num_envs, obs_dim), "action" (num_envs,) or
(num_envs, dims), "reward" (num_envs, 1) at the root, with the root flags
only, so TorchRL's single-agent modules and losses work with their default
keys; `flatten_single_agent=False` keeps the group.

Auto-reset: gpusim resets a finished replica inside `step`. TorchRL wants the
transition's own next observation from `_step` and the new first observation
from a later `_reset` with a `"_reset"` mask. So `_step` returns the final
observation of finished replicas (`info["final_obs"]`), and `_reset` hands out
the first observation gpusim already drew for them: no kernel runs, and no
replica is reset twice. Only a reset without a mask (or one of every replica
that did not all just finish) launches gpusim's reset kernel.

torchrl is imported here, at the top: this module is imported only when
`to_torchrl` is called, so torchrl stays an optional extra.
"""
from __future__ import annotations

import torch

from gpusim.env import Env
from gpusim.errors import ConfigError, GpusimError
from gpusim.spaces import PolicySpec, agent_index
from gpusim.wrappers import check_is_env

try:
    from tensordict import TensorDict
    from torchrl.data import Bounded, Categorical, Composite, MultiCategorical, Unbounded
    from torchrl.envs import EnvBase
except ImportError:
    raise GpusimError("to_torchrl needs torchrl: pip install 'gpusim[interop]'") from None

OPTIONS = ("flatten_single_agent",)
DONE_KEYS = ("done", "terminated", "truncated")


def to_torchrl(env: Env, **options) -> "TorchRLEnv":
    """`env` (a gpusim env) as a TorchRL env batched over its replicas; see `TorchRLEnv`."""
    check_is_env(env, "to_torchrl")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown to_torchrl option {unknown[0]!r} "
                          f"(options: {', '.join(OPTIONS)})")
    return TorchRLEnv(env, **options)


class _Group:
    """One policy's agents: where they sit in gpusim's agent axis and in the TensorDict."""

    def __init__(self, name: str, spec: PolicySpec, flat: bool, device: torch.device):
        self.name = name
        self.spec = spec
        self.n_agents = spec.num_agents
        self.prefix = () if flat else (name,)
        self.agent_shape = () if flat else (self.n_agents,)
        # An int drops the agent axis (flat); a slice is a view; else a gather.
        self.index = spec.agent_ids[0] if flat else agent_index(spec.agent_ids, device)

    def key(self, leaf: str):
        return self.prefix + (leaf,) if self.prefix else leaf


class TorchRLEnv(EnvBase):
    """A gpusim env seen by TorchRL: see the module docstring for layout and auto-reset.

    `.env` is the gpusim env; `.groups` its policies as TensorDict groups;
    `.group_map` maps each group to its agents' names. `set_seed(seed)`
    re-seeds gpusim's RNG streams and resets every replica
    (`env.reset(seed=seed)`); the next full `reset()` hands out that fresh state
    rather than drawing another, so `set_seed(s); reset()` starts exactly where
    gpusim's `env.reset(seed=s)` does.
    """

    def __init__(self, env: Env, flatten_single_agent: bool = True):
        super().__init__(device=env.device, batch_size=[env.num_envs])
        self.env = env
        flat = flatten_single_agent and env.num_agents == 1
        self.groups = [_Group(name, spec, flat, env.device)
                       for name, spec in env.policy_specs.items()]
        self.group_map = {g.name: [env.agent_names[i] for i in g.spec.agent_ids]
                          for g in self.groups}
        self._per_agent_done = not flat
        self._has_mask = not flat and env.agent_active_array is not None
        self._fresh_start = False  # every replica holds a first observation not handed out
        self._make_specs()

    # ---- specs ---------------------------------------------------------------------
    def _make_specs(self):
        batch, device = (self.env.num_envs,), self.device
        observation, action, reward = (Composite(shape=batch, device=device) for _ in range(3))
        done = Composite({key: self._flag_spec(batch) for key in DONE_KEYS}, shape=batch,
                         device=device)
        for group in self.groups:
            shape = batch + group.agent_shape
            if group.prefix:
                for spec in (observation, action, reward):
                    spec[group.name] = Composite(shape=shape, device=device)
            observation[group.key("observation")] = Unbounded(
                shape=shape + (group.spec.obs_dim,), dtype=torch.float32, device=device)
            if self._has_mask:
                observation[group.key("mask")] = Categorical(2, shape=shape, dtype=torch.bool,
                                                             device=device)
            action[group.key("action")] = self._action_spec(group.spec, shape)
            reward[group.key("reward")] = Unbounded(shape=shape + (1,), dtype=torch.float32,
                                                    device=device)
            if self._per_agent_done:
                done[group.name] = Composite({key: self._flag_spec(shape) for key in DONE_KEYS},
                                             shape=shape, device=device)
        self.observation_spec = observation
        self.action_spec = action
        self.reward_spec = reward
        self.done_spec = done

    def _flag_spec(self, shape: tuple):
        return Categorical(2, shape=shape + (1,), dtype=torch.bool, device=self.device)

    def _action_spec(self, spec: PolicySpec, shape: tuple):
        """Categorical for one action component (as for gym's Discrete), MultiCategorical for
        several, Bounded for a Box."""
        if spec.continuous:
            full = shape + (spec.action_width,)
            low, high = (torch.tensor(b, dtype=torch.float32, device=self.device).expand(full)
                         for b in (spec.actions.low, spec.actions.high))
            return Bounded(low=low, high=high, shape=full, dtype=torch.float32,
                           device=self.device)
        nvec = spec.actions
        if len(nvec) == 1:
            return Categorical(int(nvec[0]), shape=shape, device=self.device)
        return MultiCategorical(list(nvec), device=self.device).expand(*shape, len(nvec))

    # ---- EnvBase -----------------------------------------------------------------------
    def _set_seed(self, seed: int | None):
        if seed is None:  # keep the current streams
            return
        self.env.reset(seed=seed)
        self._fresh_start = True

    def _reset(self, tensordict=None, **kwargs):
        mask = tensordict.get("_reset", None) if tensordict is not None else None
        if not self._holds_fresh_start(mask):
            self.env.reset()
        self._fresh_start = False
        # Clone: TorchRL keeps these as the next transition's "observation", and
        # gpusim's next step overwrites its obs buffer in place.
        obs = self.env.arrays["obs"].clone()
        per_agent = {"observation": obs, **{key: self._no((self.env.num_agents, 1))
                                            for key in DONE_KEYS}}
        if self._has_mask:
            per_agent["mask"] = self.env.agent_active().clone()
        return self._tensordict(per_agent, {key: self._no((1,)) for key in DONE_KEYS})

    def _no(self, shape: tuple) -> torch.Tensor:
        """False flags of their own (TorchRL may write into what it gets, in place)."""
        return torch.zeros((self.env.num_envs,) + shape, dtype=torch.bool, device=self.device)

    def _step(self, tensordict):
        before = self.env.agent_active()
        before = before.clone() if before is not None else None  # the step overwrites it
        obs, reward, terminated, truncated, info = self.env.step(self._gpusim_actions(tensordict))
        self._fresh_start = False
        finished = info["reset_mask"]
        # The transition ends in the final observation where gpusim already reset the
        # replica; `where` also writes a new tensor, so TorchRL owns what it keeps.
        next_obs = torch.where(finished[:, None, None], info["final_obs"], obs)
        # Clones for the same reason: these are gpusim's buffers, rewritten next step.
        flags = {"done": finished.unsqueeze(-1).clone(),
                 "terminated": terminated.unsqueeze(-1).clone(),
                 "truncated": truncated.unsqueeze(-1).clone()}
        per_agent = {"observation": next_obs, "reward": reward.unsqueeze(-1).clone()}
        if self._per_agent_done:
            per_agent.update(self._agent_flags(flags, before))
        return self._tensordict(per_agent, flags)

    # ---- internals -----------------------------------------------------------------------
    def _agent_flags(self, flags: dict, before) -> dict:
        """Each agent's (num_envs, num_agents, 1) flags, and its mask with per-agent done.

        Without per-agent done they are its replica's. With it, an agent that is
        out of play after the step (having left in it, or before it) is
        terminated; where the replica's episode ended, each agent that was in
        play ends as the replica did, and one out of play stays terminated.
        """
        shape = (self.env.num_envs, self.env.num_agents, 1)
        ended, terminated, truncated = (flags[k][:, None] for k in DONE_KEYS)
        if before is None:
            agent = {"terminated": terminated.expand(shape).clone(),
                     "truncated": truncated.expand(shape).clone()}
        else:
            playing = before[..., None]
            out = ~self.env.agent_active()[..., None]
            agent = {"terminated": torch.where(ended, terminated | ~playing, out),
                     "truncated": ended & truncated & playing}
        agent["done"] = agent["terminated"] | agent["truncated"]
        if self._has_mask:  # in play at the next observation (the final one: in the last step)
            agent["mask"] = torch.where(ended[..., 0], before, self.env.agent_active())
        return agent

    def _holds_fresh_start(self, mask) -> bool:
        """Whether the replicas `mask` asks to reset (all without one) are already fresh.

        They are when gpusim reset them in its last step (its `reset_mask`), or all are
        after `set_seed`. A partial mask of a replica gpusim has not reset cannot be
        honoured: gpusim resets one replica only when its episode ends.
        """
        if self._fresh_start:
            return True
        if mask is None:
            return False
        mask = mask.reshape(self.env.num_envs)
        if not bool((mask & ~self.env.arrays["reset_mask"]).any()):
            return True
        if bool(mask.all()):
            return False
        raise GpusimError("gpusim resets a replica only when its episode ends: pass '_reset' "
                          "only where done is set, or reset every replica")

    def _gpusim_actions(self, tensordict):
        """What gpusim's step takes: one group of every agent as one tensor (a view, no copy:
        gpusim copies it into its buffer), several as a dict of one tensor per policy."""
        shaped = {g.name: tensordict.get(g.key("action")).reshape(
            self.env.num_envs, g.n_agents, g.spec.action_width) for g in self.groups}
        return shaped.popitem()[1] if len(shaped) == 1 else shaped

    def _tensordict(self, per_agent: dict, flags: dict) -> TensorDict:
        """A root TensorDict from (num_envs, num_agents, ...) tensors, split into the groups."""
        source = dict(flags)
        for group in self.groups:
            fields = {leaf: value[:, group.index] for leaf, value in per_agent.items()
                      if group.prefix or leaf in ("observation", "reward")}
            if "observation" in fields:  # the policy's own entries
                fields["observation"] = fields["observation"][..., :group.spec.obs_dim]
            if group.prefix:
                source[group.name] = TensorDict(
                    fields, batch_size=(self.env.num_envs, group.n_agents), device=self.device)
            else:
                source.update(fields)
        return TensorDict(source, batch_size=self.batch_size, device=self.device)

    def __repr__(self):
        return (f"{type(self).__name__}({self.env.name}, num_envs={self.env.num_envs}, "
                f"groups={[g.name for g in self.groups]}, device={self.device})")
