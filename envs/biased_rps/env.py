"""biased_rps as portable phases: two players, one matrix play per round.

Rules (README.md in this directory states them too; reference.py is the
independent NumPy oracle the tests compare against):

- Agent 0 is the row player, agent 1 the column player. Policies:
  {"row": (0,), "column": (1,)}. Action: one component of 3 values,
  0 rock, 1 paper, 2 scissors.
- Reset: timestep = 0. Nothing is drawn: every episode starts alike.
- Step: both play at once. Action k beats action (k + 2) % 3 (paper rock,
  scissors paper, rock scissors). The winner gets win[k] of its own action
  k (win = rock_win, paper_win, scissors_win), the loser -win[k]; a tie pays
  both 0. timestep += 1; the replica terminates when timestep >= rounds
  (never truncated).
- Observation (float32, obs_dim = 2): [1.0, timestep / rounds]. Before every
  play it is [1, t / rounds] whatever was played, so a policy is a mixed
  strategy per round (with rounds = 1, one mixed strategy).

Each agent writes only its own reward from both actions (the actions are
inputs, written by no phase); the env phase alone writes the clock and flags.
"""
import numba
import numpy as np
import torch

from gpusim.arrays import ArraySpec
from gpusim.env import Env
from gpusim.errors import ArrayError
from gpusim.kernels import agent_phase, env_phase
from gpusim.outcome import Outcome
from gpusim.spaces import per_role_names

from .config import BiasedRPSConfig

F32_ZERO = np.float32(0.0)
F32_ONE = np.float32(1.0)
NUM_ACTIONS = 3  # rock, paper, scissors


# ---- reset ------------------------------------------------------------------------
@numba.jit(nopython=True)
def start_clock(env, s, p):
    s.timestep[env] = 0


# ---- step -------------------------------------------------------------------------
@numba.jit(nopython=True)
def win_of(p, action):
    if action == 0:
        return p.rock_win
    if action == 1:
        return p.paper_win
    return p.scissors_win


@numba.jit(nopython=True)
def pay(env, agent, s, p):
    """This agent's payoff: + the win of its action if it beats the other's, - the
    other's if that one beats it, 0 on a tie."""
    mine = s.actions[env, agent, 0]
    theirs = s.actions[env, 1 - agent, 0]
    if mine == (theirs + 1) % 3:
        s.reward[env, agent] = win_of(p, mine)
    elif theirs == (mine + 1) % 3:
        s.reward[env, agent] = -win_of(p, theirs)
    else:
        s.reward[env, agent] = F32_ZERO


@numba.jit(nopython=True)
def tick(env, s, p):
    t = s.timestep[env] + 1
    s.timestep[env] = t
    s.terminated[env] = t >= p.rounds
    s.truncated[env] = False


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    s.obs[env, agent, 0] = F32_ONE
    s.obs[env, agent, 1] = numba.float32(s.timestep[env]) / p.rounds_f


class RowPayoff:
    """The outcome's tracker: per replica, the row player's payoff summed over the episode
    (the column's is its negative), on the device."""

    def __init__(self, env):
        self.env = env
        self.running = torch.zeros(env.num_envs, device=env.device)

    def after_step(self, done: torch.Tensor) -> torch.Tensor:
        self.running += self.env.arrays["reward"][:, 0]
        ended = self.running.clone()
        self.running.masked_fill_(done, 0.0)
        return ended

    def state_dict(self) -> dict:
        return {"running": self.running.clone()}

    def load_state_dict(self, state: dict):
        self.running.copy_(state["running"])


class BiasedRPS(Env):
    name = "biased_rps"
    config_class = BiasedRPSConfig
    reset_phases = (env_phase(start_clock), agent_phase(observe))
    step_phases = (agent_phase(pay), env_phase(tick), agent_phase(observe))
    observe_phases = (agent_phase(observe),)
    # who won an episode: the sign of the row player's payoff (a tie is half a win)
    outcome = Outcome("row_payoff", sides={"row": "higher", "column": "lower"},
                      tracker=RowPayoff, threshold=0.0)

    def setup(self, config):
        self.num_agents = 2
        self.obs_dim = 2
        self.action_nvec = (NUM_ACTIONS,)
        self.policies = {"row": (0,), "column": (1,)}
        self.agent_names = per_role_names(self.policies)  # row_0, column_0

    def array_specs(self):
        return {"timestep": ArraySpec(torch.int32, scope="env", state=True)}

    def derived(self):
        return dict(rounds_f=np.float32(self.config.rounds))

    def check_state(self, state):
        """A timestep inside an episode: 0..rounds-1."""
        if "timestep" not in state:
            return
        value = torch.as_tensor(state["timestep"])
        if value.dtype.is_floating_point or value.numel() == 0:
            return  # the dtype check when writing reports a wrong dtype
        low, high = int(value.min()), int(value.max())
        if low < 0 or high > self.config.rounds - 1:
            raise ArrayError(f"array 'timestep' must hold values in 0..{self.config.rounds - 1} "
                             f"(config key rounds), got {low}..{high}")
