"""TorchRL adapter: a gpusim env as a batched `torchrl.envs.EnvBase` (`to_torchrl`).

Layout, as TorchRL's own vectorized multi-agent env (VmasEnv) has it: the
batch is the replicas (`batch_size=[num_envs]`, `device=env.device`), each
policy is a group of agents under its own key, and the done flags sit at the
root only, once per replica, since all agents of a replica finish together:

    (group, "observation")  float32  (num_envs, n_agents, obs_dim)
    (group, "action")       int64    (num_envs, n_agents)         Categorical, one component
                                     (num_envs, n_agents, n_comp) MultiCategorical, several
    (group, "reward")       float32  (num_envs, n_agents, 1)      under "next"
    "done", "terminated", "truncated"  bool  (num_envs, 1)

A single-agent env (cartpole) is flattened by default, as TorchRL's GymEnv
has it: "observation" (num_envs, obs_dim), "action" (num_envs,), "reward"
(num_envs, 1) at the root, so TorchRL's single-agent modules and losses work
with their default keys; `flatten_single_agent=False` keeps the group.

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
from gpusim.wrappers import check_is_env

try:
    from tensordict import TensorDict
    from torchrl.data import Categorical, Composite, MultiCategorical, Unbounded
    from torchrl.envs import EnvBase
except ImportError:
    raise GpusimError("to_torchrl needs torchrl: pip install 'gpusim[interop]'") from None

OPTIONS = ("flatten_single_agent",)
DONE_KEYS = ("done", "terminated", "truncated")


def to_torchrl(env: Env, **options) -> "TorchRLEnv":
    """`env` (a gpusim env) as a TorchRL env batched over its replicas; see `TorchRLEnv`."""
    check_is_env(env, "to_torchrl", continuous=False)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown to_torchrl option {unknown[0]!r} "
                          f"(options: {', '.join(OPTIONS)})")
    return TorchRLEnv(env, **options)


class _Group:
    """One policy's agents: where they sit in gpusim's agent axis and in the TensorDict."""

    def __init__(self, name: str, agent_ids: tuple, flat: bool, device: torch.device):
        self.name = name
        self.agent_ids = tuple(agent_ids)
        self.n_agents = len(agent_ids)
        self.prefix = () if flat else (name,)
        self.agent_shape = () if flat else (self.n_agents,)
        # An int drops the agent axis (flat); a slice is a view; else a gather.
        first = agent_ids[0]
        if flat:
            self.index = first
        elif self.agent_ids == tuple(range(first, first + self.n_agents)):
            self.index = slice(first, first + self.n_agents)
        else:
            self.index = torch.tensor(agent_ids, dtype=torch.long, device=device)

    def key(self, leaf: str):
        return self.prefix + (leaf,) if self.prefix else leaf


class TorchRLEnv(EnvBase):
    """A gpusim env seen by TorchRL: see the module docstring for layout and auto-reset.

    `.env` is the gpusim env; `.groups` its policies as TensorDict groups.
    `set_seed(seed)` re-seeds gpusim's RNG streams and resets every replica
    (`env.reset(seed=seed)`); the next full `reset()` hands out that fresh state
    rather than drawing another, so `set_seed(s); reset()` starts exactly where
    gpusim's `env.reset(seed=s)` does.
    """

    def __init__(self, env: Env, flatten_single_agent: bool = True):
        super().__init__(device=env.device, batch_size=[env.num_envs])
        self.env = env
        flat = flatten_single_agent and env.num_agents == 1
        self.groups = [_Group(name, ids, flat, env.device) for name, ids in env.policies.items()]
        # One group of every agent in gpusim's order: its actions go to gpusim as they are.
        self._one_group_in_order = (len(self.groups) == 1
                                    and self.groups[0].agent_ids == tuple(range(env.num_agents)))
        self._actions = torch.zeros(env.num_envs, env.num_agents, len(env.action_nvec),
                                    dtype=torch.int64, device=env.device)
        self._fresh_start = False  # every replica holds a first observation not handed out
        self._make_specs()

    # ---- specs ---------------------------------------------------------------------
    def _make_specs(self):
        env, batch = self.env, (self.env.num_envs,)
        observation, action, reward = (Composite(shape=batch, device=self.device)
                                       for _ in range(3))
        for group in self.groups:
            shape = batch + group.agent_shape
            if group.prefix:
                for spec in (observation, action, reward):
                    spec[group.name] = Composite(shape=shape, device=self.device)
            observation[group.key("observation")] = Unbounded(
                shape=shape + (env.obs_dim,), dtype=torch.float32, device=self.device)
            action[group.key("action")] = self._action_spec(shape)
            reward[group.key("reward")] = Unbounded(shape=shape + (1,), dtype=torch.float32,
                                                    device=self.device)
        self.observation_spec = observation
        self.action_spec = action
        self.reward_spec = reward
        self.done_spec = Composite(
            {key: Categorical(2, shape=batch + (1,), dtype=torch.bool, device=self.device)
             for key in DONE_KEYS}, shape=batch, device=self.device)

    def _action_spec(self, shape: tuple):
        """Categorical for one action component (as for gym's Discrete), else MultiCategorical."""
        nvec = self.env.action_nvec
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
        flags = {key: torch.zeros(self.env.num_envs, 1, dtype=torch.bool, device=self.device)
                 for key in DONE_KEYS}
        return self._tensordict({"observation": obs}, flags)

    def _step(self, tensordict):
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
        return self._tensordict({"observation": next_obs, "reward": reward.unsqueeze(-1).clone()},
                                flags)

    # ---- internals -----------------------------------------------------------------------
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

    def _gpusim_actions(self, tensordict) -> torch.Tensor:
        """The (num_envs, num_agents, n_components) actions gpusim takes, from each group's."""
        components = len(self.env.action_nvec)
        shape = (self.env.num_envs, self.env.num_agents, components)
        if self._one_group_in_order:  # a view, no copy: gpusim copies it into its buffer
            return tensordict.get(self.groups[0].key("action")).reshape(shape)
        for group in self.groups:
            action = tensordict.get(group.key("action"))
            self._actions[:, group.index] = action.reshape(
                (self.env.num_envs,) + group.agent_shape + (components,))
        return self._actions

    def _tensordict(self, per_agent: dict, flags: dict) -> TensorDict:
        """A root TensorDict from (num_envs, num_agents, ...) tensors, split into the groups."""
        source = dict(flags)
        for group in self.groups:
            fields = {leaf: value[:, group.index] for leaf, value in per_agent.items()}
            if group.prefix:
                source[group.name] = TensorDict(
                    fields, batch_size=(self.env.num_envs, group.n_agents), device=self.device)
            else:
                source.update(fields)
        return TensorDict(source, batch_size=self.batch_size, device=self.device)

    def __repr__(self):
        return (f"{type(self).__name__}({self.env.name}, num_envs={self.env.num_envs}, "
                f"groups={[g.name for g in self.groups]}, device={self.device})")
