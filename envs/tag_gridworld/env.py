"""tag_gridworld as portable phases: N taggers chase one runner on a grid.

Rules (README.md in this directory states them too; reference.py is the
independent NumPy oracle the tests compare against):

- Agents 0..N-1 are taggers (N = `num_taggers`), agent N is the runner.
  Policies: {"tagger": (0..N-1), "runner": (N,)}. Positions are integer cells
  (x, y), 0 <= x, y < G (G = `grid_size`).
- Action: one component of 5 values, 0 stay, 1 +x, 2 -x, 3 +y, 4 -y.
- Reset: every tagger at the centre cell (G // 2, G // 2). The runner's
  thread draws k = rng.randint(rng_state, env, N, 4) (one draw from the
  runner's stream, nothing from the taggers' streams) and starts at corner
  k: x = (k % 2) * (G - 1), y = (k // 2) * (G - 1), i.e. 0 (0, 0),
  1 (G-1, 0), 2 (0, G-1), 3 (G-1, G-1). timestep = 0. No tag is checked at
  reset (with G = 2 the centre is corner 3, and a runner starting there is
  tagged only if it is still on a tagger's cell after the first step).
- Step, in order:
  1. All agents move at once. A move that would leave the grid leaves the
     agent where it is and gives it `wall_penalty`; any other move (stay
     included) gives 0. Agents may share cells and may pass through each
     other: two agents swapping cells do not meet.
  2. timestep += 1. The runner is tagged when, after the moves, at least one
     tagger is on its cell.
  3. Tagged: every tagger gets + `tag_reward` (the same whether one or
     several taggers are on the cell), the runner + `tag_penalty`, and the
     replica terminates. Not tagged: taggers + `step_penalty_tagger`, the
     runner + `step_reward_runner`; the replica is truncated (not
     terminated) when timestep >= `episode_length`. A step's reward is the
     wall term plus this term, added in float32 in that order.
  4. Observation (float32, obs_dim = 2N + 6), from the positions after the
     moves and the new timestep, with S = G - 1:
       [0:2]        own (x, y) / S
       [2:4]        (runner - own) (x, y) / S     (zeros for the runner)
       [4:4+2N]     (tagger j - own) (x, y) / S for j = 0..N-1, interleaved
                    x0, y0, x1, y1, ...           (zeros at a tagger's own j)
       [4+2N]       1.0 for a tagger, 0.0 for the runner
       [5+2N]       timestep / episode_length
     Offsets are relative so that a policy sees where the others are from
     where it stands; the own position tells it where the walls are.
  A finished replica keeps that observation in `final_obs` and is reset in
  the same launch (the framework's auto-reset).

Cross-agent results are resolved in their own phase: `resolve` (an env
phase, one thread) reads every position after the move barrier, writes the
replica's `tagged`, `timestep`, `terminated` and `truncated`; each agent then
writes only its own reward and observation. No agent writes another's data,
so trajectories are bit-identical run after run on a backend.
"""
import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.env import Env
from gpusim.errors import ArrayError
from gpusim.kernels import agent_phase, env_phase
from gpusim.measures import StepSums
from gpusim.spaces import per_role_names

from .config import TagGridworldConfig

F32_ZERO = np.float32(0.0)
F32_ONE = np.float32(1.0)
NUM_ACTIONS = 5  # stay, +x, -x, +y, -y


def obs_dim(num_taggers: int) -> int:
    return 2 * num_taggers + 6


# ---- reset ------------------------------------------------------------------------
@numba.jit(nopython=True)
def spawn(env, agent, s, p):
    """Taggers at the centre; the runner at a corner drawn from its own stream."""
    if agent < p.num_taggers:
        s.pos_x[env, agent] = p.centre
        s.pos_y[env, agent] = p.centre
    else:
        corner = rng.randint(s.rng_state, env, agent, 4)
        s.pos_x[env, agent] = p.last if corner % 2 == 1 else 0
        s.pos_y[env, agent] = p.last if corner >= 2 else 0


@numba.jit(nopython=True)
def start_clock(env, s, p):
    s.timestep[env] = 0
    s.tagged[env] = 0


# ---- step -------------------------------------------------------------------------
@numba.jit(nopython=True)
def move(env, agent, s, p):
    """Rule 1: one move; blocked by the walls at a cost. Writes only this agent's data."""
    x = s.pos_x[env, agent]
    y = s.pos_y[env, agent]
    action = s.actions[env, agent, 0]
    if action == 1:
        x += 1
    elif action == 2:
        x -= 1
    elif action == 3:
        y += 1
    elif action == 4:
        y -= 1
    if 0 <= x < p.grid_size and 0 <= y < p.grid_size:
        s.pos_x[env, agent] = x
        s.pos_y[env, agent] = y
        s.reward[env, agent] = F32_ZERO
    else:
        s.reward[env, agent] = p.wall_penalty


@numba.jit(nopython=True)
def resolve(env, s, p):
    """Rule 2 and the replica's flags, by one thread after every move is done."""
    t = s.timestep[env] + 1
    s.timestep[env] = t
    rx = s.pos_x[env, p.num_taggers]
    ry = s.pos_y[env, p.num_taggers]
    tagged = False
    for j in range(p.num_taggers):
        if s.pos_x[env, j] == rx and s.pos_y[env, j] == ry:
            tagged = True
            break
    s.tagged[env] = 1 if tagged else 0
    s.terminated[env] = tagged
    s.truncated[env] = (not tagged) and t >= p.episode_length


@numba.jit(nopython=True)
def score(env, agent, s, p):
    """Rule 3: each agent adds its own outcome term to its wall term."""
    is_tagger = agent < p.num_taggers
    if s.tagged[env] == 1:
        term = p.tag_reward if is_tagger else p.tag_penalty
    else:
        term = p.step_penalty_tagger if is_tagger else p.step_reward_runner
    s.reward[env, agent] += term


@numba.jit(nopython=True)
def observe(env, agent, s, p):
    """Rule 4: this agent's observation row."""
    n = p.num_taggers
    x = s.pos_x[env, agent]
    y = s.pos_y[env, agent]
    s.obs[env, agent, 0] = numba.float32(x) / p.span
    s.obs[env, agent, 1] = numba.float32(y) / p.span
    s.obs[env, agent, 2] = numba.float32(s.pos_x[env, n] - x) / p.span
    s.obs[env, agent, 3] = numba.float32(s.pos_y[env, n] - y) / p.span
    for j in range(n):
        s.obs[env, agent, 4 + 2 * j] = numba.float32(s.pos_x[env, j] - x) / p.span
        s.obs[env, agent, 5 + 2 * j] = numba.float32(s.pos_y[env, j] - y) / p.span
    s.obs[env, agent, 4 + 2 * n] = F32_ONE if agent < n else F32_ZERO
    s.obs[env, agent, 5 + 2 * n] = numba.float32(s.timestep[env]) / p.episode_length_f


@numba.jit(nopython=True)
def mark_legal_moves(env, agent, s, p):
    """The moves that stay on the grid (stay always does): the action mask with
    `mask_walls`, so a masked policy never pays the wall penalty."""
    x = s.pos_x[env, agent]
    y = s.pos_y[env, agent]
    s.legal_moves[env, agent, 0] = 1
    s.legal_moves[env, agent, 1] = 1 if x + 1 < p.grid_size else 0
    s.legal_moves[env, agent, 2] = 1 if x > 0 else 0
    s.legal_moves[env, agent, 3] = 1 if y + 1 < p.grid_size else 0
    s.legal_moves[env, agent, 4] = 1 if y > 0 else 0


class TagGridworld(Env):
    name = "tag_gridworld"
    config_class = TagGridworldConfig
    reset_phases = (agent_phase(spawn), env_phase(start_clock), agent_phase(observe),
                    agent_phase(mark_legal_moves))
    step_phases = (agent_phase(move), env_phase(resolve), agent_phase(score),
                   agent_phase(observe), agent_phase(mark_legal_moves))
    observe_phases = (agent_phase(observe), agent_phase(mark_legal_moves))

    render_arrays = ("pos_x", "pos_y")

    def draw(self, ax, frame):
        from .render import draw
        draw(ax, frame, self.config)

    def episode_measures(self):
        # the runner is tagged exactly when the episode terminates: per episode 1 or 0
        return StepSums(self, runner_tagged=lambda env: env.arrays["terminated"])

    def setup(self, config):
        self.num_agents = config.num_agents
        self.time_limit = config.episode_length
        self.obs_dim = obs_dim(config.num_taggers)
        self.action_nvec = (NUM_ACTIONS,)
        self.policies = {"tagger": tuple(range(config.num_taggers)),
                         "runner": (config.runner_id,)}
        self.action_mask_array = "legal_moves" if config.mask_walls else None
        self.agent_names = per_role_names(self.policies)  # tagger_0.., runner_0

    def array_specs(self):
        i32 = torch.int32
        return {
            "pos_x": ArraySpec(i32, state=True),
            "pos_y": ArraySpec(i32, state=True),
            "timestep": ArraySpec(i32, scope="env", state=True),
            "tagged": ArraySpec(i32, scope="env"),  # scratch: written by `resolve`
            "legal_moves": ArraySpec(i32, (NUM_ACTIONS,)),  # the moves that stay on the grid
        }

    def derived(self):
        c, f32, i32 = self.config, np.float32, np.int32
        return dict(last=i32(c.grid_size - 1), centre=i32(c.grid_size // 2),
                    span=f32(c.grid_size - 1), episode_length_f=f32(c.episode_length))

    def check_state(self, state):
        """Positions must lie on the grid and timesteps inside an episode."""
        c = self.config
        limits = {"pos_x": (0, c.grid_size - 1, "config key grid_size"),
                  "pos_y": (0, c.grid_size - 1, "config key grid_size"),
                  "timestep": (0, c.episode_length - 1, "config key episode_length")}
        for name, (low, high, why) in limits.items():
            if name not in state:
                continue
            value = torch.as_tensor(state[name])
            if value.dtype.is_floating_point or value.numel() == 0:
                continue  # the dtype check when writing reports a wrong dtype
            if int(value.min()) < low or int(value.max()) > high:
                raise ArrayError(f"array '{name}' must hold values in {low}..{high} ({why}), "
                                 f"got {int(value.min())}..{int(value.max())}")
