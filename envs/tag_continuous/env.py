"""tag_continuous as portable phases: taggers chase runners on a square.

Exact rules: README.md in this folder. Every phase below is a plain
numba function of (env, agent, s, p) or (env, s, p); `s` holds the arrays,
`p` the parameters. Cross-agent results are resolved in their own phases,
each written by exactly one thread, so there are no racy updates.

Actions are discrete (table indices, the default) or, with config key
`continuous_actions`, a Box of (acceleration change, turn). Numba compiles
per array layout and only one of `actions` / `continuous_actions` exists, so
each mode has its own move phase (`move`, `move_continuous`, both calling
`move_by`); `step_kernel_spec` swaps in the continuous one. The observation
phase, with its opt-in variants, is in observe.py.
"""
import dataclasses
import math

import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.errors import ArrayError
from gpusim.env import Env
from gpusim.kernels import KernelSpec, agent_phase, env_phase
from gpusim.outcome import Outcome
from gpusim.score import Score
from gpusim.spaces import Box, per_role_names

from .config import TagContinuousConfig
from .measures import RunnerSurvival, SurvivalScore
from .observe import F32_ZERO, FEATURES, OWN_FEATURES, TWO_PI, observe, squared_distance

HALF_PI = np.float32(np.pi / 2)


# ---- reset ------------------------------------------------------------------------
@numba.jit(nopython=True)
def spawn_agent(env, agent, s, p):
    """Uniform position, one of four headings, at rest, in the game."""
    s.loc_x[env, agent] = rng.uniform(s.rng_state, env, agent) * p.grid_length
    s.loc_y[env, agent] = rng.uniform(s.rng_state, env, agent) * p.grid_length
    s.direction[env, agent] = numba.float32(rng.randint(s.rng_state, env, agent, 4)) * HALF_PI
    s.speed[env, agent] = F32_ZERO
    s.acceleration[env, agent] = F32_ZERO
    s.still_in_game[env, agent] = 1
    s.agent_type[env, agent] = s.is_tagger[agent]


@numba.jit(nopython=True)
def start_clock(env, s, p):
    s.timestep[env] = 0
    s.num_runners_left[env] = p.num_runners


# ---- step -------------------------------------------------------------------------
@numba.jit(nopython=True)
def move(env, agent, s, p):
    """Discrete actions: indices into the acceleration and turn tables."""
    move_by(env, agent, s, p, s.acc_table[s.actions[env, agent, 0]],
            s.turn_table[s.actions[env, agent, 1]])


@numba.jit(nopython=True)
def move_continuous(env, agent, s, p):
    """Continuous actions: the changes themselves (the step kernel clipped them first)."""
    move_by(env, agent, s, p, s.continuous_actions[env, agent, 0],
            s.continuous_actions[env, agent, 1])


@numba.jit(nopython=True)
def move_by(env, agent, s, p, acc_delta, turn_delta):
    """Spec steps 1-4, plus each agent's edge penalty and step reward."""
    s.tagged_by[env, agent] = -1
    s.reward[env, agent] = F32_ZERO
    if s.still_in_game[env, agent] == 0:  # spec steps 1-3 with still_in_game = 0
        s.direction[env, agent] = F32_ZERO
        s.speed[env, agent] = F32_ZERO
        s.acceleration[env, agent] = F32_ZERO
        return
    is_tagger = s.agent_type[env, agent] == 1
    direction = (s.direction[env, agent] + turn_delta) % TWO_PI
    acceleration = s.acceleration[env, agent] + acc_delta
    vmax = p.vmax_tagger if is_tagger else p.vmax_runner
    speed = min(max(s.speed[env, agent] + acceleration, F32_ZERO), vmax)
    if not (F32_ZERO < speed < vmax):
        acceleration = F32_ZERO
    x = s.loc_x[env, agent] + speed * math.cos(direction)
    y = s.loc_y[env, agent] + speed * math.sin(direction)
    reward = p.step_penalty_for_tagger if is_tagger else p.step_reward_for_runner
    if x < F32_ZERO or x > p.grid_length or y < F32_ZERO or y > p.grid_length:
        reward += p.edge_hit_penalty
        x = min(max(x, F32_ZERO), p.grid_length)
        y = min(max(y, F32_ZERO), p.grid_length)
    s.direction[env, agent] = direction
    s.acceleration[env, agent] = acceleration
    s.speed[env, agent] = speed
    s.loc_x[env, agent] = x
    s.loc_y[env, agent] = y
    s.reward[env, agent] = reward


@numba.jit(nopython=True)
def tick(env, s, p):
    s.timestep[env] += 1


@numba.jit(nopython=True)
def distance(s, env, a, b):
    return math.sqrt(squared_distance(s, env, a, b))


@numba.jit(nopython=True)
def tag_runners(env, agent, s, p):
    """Each runner in the game checks its nearest tagger (ties to the lower id)."""
    if s.agent_type[env, agent] == 1 or s.still_in_game[env, agent] == 0:
        return
    nearest = -1
    nearest_d = np.float32(np.inf)
    for k in range(s.tagger_ids.shape[0]):  # increasing ids
        other = s.tagger_ids[k]
        d = distance(s, env, agent, other)
        if d < nearest_d:
            nearest_d = d
            nearest = other
    if nearest >= 0 and nearest_d < p.tag_radius:
        s.reward[env, agent] += p.tag_penalty_for_runner
        s.tagged_by[env, agent] = nearest
        if p.runner_exits_game_after_tagged:
            s.still_in_game[env, agent] = 0


@numba.jit(nopython=True)
def score(env, agent, s, p):
    """Taggers collect every tag they made; runners still in at the end get their bonus."""
    if s.agent_type[env, agent] == 1:
        tags = 0
        for other in range(s.loc_x.shape[1]):
            if s.tagged_by[env, other] == agent:
                tags += 1
        s.reward[env, agent] += numba.float32(tags) * p.tag_reward_for_tagger
    elif s.still_in_game[env, agent] == 1 and s.timestep[env] == p.episode_length:
        s.reward[env, agent] += p.end_of_game_reward_for_runner


@numba.jit(nopython=True)
def finish(env, s, p):
    if p.runner_exits_game_after_tagged:
        for other in range(s.loc_x.shape[1]):
            if s.tagged_by[env, other] >= 0:
                s.num_runners_left[env] -= 1
    terminated = s.num_runners_left[env] == 0
    s.terminated[env] = terminated
    s.truncated[env] = (not terminated) and s.timestep[env] >= p.episode_length


class TagContinuous(Env):
    name = "tag_continuous"
    config_class = TagContinuousConfig
    reset_phases = (agent_phase(spawn_agent), env_phase(start_clock), agent_phase(observe))
    step_phases = (agent_phase(move), env_phase(tick), agent_phase(observe),
                   agent_phase(tag_runners), agent_phase(score), env_phase(finish))
    observe_phases = (agent_phase(observe),)
    cuda_c_reset = "tag_continuous.cu:tag_continuous_reset"
    cuda_c_step = "tag_continuous.cu:tag_continuous_step"
    agent_active_array = "still_in_game"  # a tagged runner is done (per-agent done)
    # the score: how long runners survive, the trained side against random opponents
    # (tagger: falls as taggers learn; runner: rises as runners do)
    score = Score("runner_steps_survived", sides={"tagger": "lower", "runner": "higher"},
                  tracker=SurvivalScore)
    # who won an episode (a league's win statistics, python -m gpusim.league's ratings):
    # the same survival; no fixed threshold, so the runners win above the running mean
    # of their league games (training), above the matrix's median (judging)
    outcome = Outcome("runner_steps_survived", sides={"tagger": "lower", "runner": "higher"},
                      tracker=SurvivalScore)

    def setup(self, config):
        c = config
        self.num_agents = c.num_agents
        self.time_limit = c.episode_length
        observed = c.num_agents - 1 if c.use_full_observation else c.num_other_agents_observed
        own = OWN_FEATURES if c.observe_own_state else 0
        self.obs_dim = FEATURES * observed + own + 1
        if c.continuous_actions:
            self.action_box = Box(low=(c.min_acceleration, c.min_turn),
                                  high=(c.max_acceleration, c.max_turn))
        else:
            self.action_nvec = (c.num_acceleration_levels + 1, c.num_turn_levels + 1)
        taggers = c.tagger_id_list
        self.policies = {"tagger": taggers,
                         "runner": tuple(i for i in range(c.num_agents) if i not in taggers)}
        self.agent_names = per_role_names(self.policies)  # tagger_0.., runner_0..

    def array_specs(self):
        c, f32, i32 = self.config, torch.float32, torch.int32
        k = c.num_other_agents_observed
        state = {name: ArraySpec(f32, state=True)
                 for name in ("loc_x", "loc_y", "speed", "direction", "acceleration")}
        state.update(still_in_game=ArraySpec(i32, state=True),
                     agent_type=ArraySpec(i32, state=True),
                     num_runners_left=ArraySpec(i32, scope="env", state=True),
                     timestep=ArraySpec(i32, scope="env", state=True))
        scratch = dict(nbr_idx=ArraySpec(i32, (k,)), nbr_dist=ArraySpec(f32, (k,)),
                       tagged_by=ArraySpec(i32))
        tables = dict(is_tagger=ArraySpec(i32, (c.num_agents,), scope="global"),
                      tagger_ids=ArraySpec(i32, (c.num_taggers,), scope="global"))
        if not c.continuous_actions:  # discrete actions index these
            tables.update(
                acc_table=ArraySpec(f32, (c.num_acceleration_levels + 1,), scope="global"),
                turn_table=ArraySpec(f32, (c.num_turn_levels + 1,), scope="global"))
        return {**state, **scratch, **tables}

    def initial_values(self):
        c = self.config
        is_tagger = np.zeros(c.num_agents, dtype=np.int32)
        is_tagger[list(c.tagger_id_list)] = 1
        values = {"is_tagger": is_tagger,
                  "agent_type": np.tile(is_tagger, (self.num_envs, 1)),
                  "tagger_ids": np.asarray(c.tagger_id_list, dtype=np.int32),
                  "nbr_idx": np.full((self.num_envs, c.num_agents, c.num_other_agents_observed),
                                     -1, dtype=np.int32)}
        if not c.continuous_actions:
            values.update(acc_table=action_table(c.min_acceleration, c.max_acceleration,
                                                 c.num_acceleration_levels),
                          turn_table=action_table(c.min_turn, c.max_turn, c.num_turn_levels))
        return values

    def step_kernel_spec(self) -> KernelSpec:
        """Discrete mode: the class's phases and CUDA C kernel. Continuous mode: the same
        kernel with `move_continuous` in place of `move`, and no CUDA C kernel."""
        spec = super().step_kernel_spec()
        if not self.config.continuous_actions:
            return spec
        swapped = 0
        sections = []
        for section in spec.sections:
            phases = []
            for phase in section.phases:
                if phase.fn is move:
                    phase = dataclasses.replace(phase, fn=move_continuous)
                    swapped += 1
                phases.append(phase)
            sections.append(dataclasses.replace(section, phases=tuple(phases)))
        assert swapped == 1, "the step kernel must hold the move phase exactly once"
        return dataclasses.replace(spec, sections=tuple(sections), cuda_c=None, cuda_c_dir=None,
                                   no_cuda_c="config key 'continuous_actions' is true, and "
                                             "tag_continuous.cu takes discrete actions")

    render_arrays = ("loc_x", "loc_y", "direction", "still_in_game", "agent_type")

    def draw(self, ax, frame):
        from .render import draw
        draw(ax, frame, self.config)

    def episode_measures(self):
        return RunnerSurvival(self)

    def check_state(self, state):
        if "agent_type" in state:
            given = torch.as_tensor(state["agent_type"]).to("cpu")
            fixed = self.arrays["is_tagger"].to("cpu").expand(self.num_envs, -1)
            if given.shape == fixed.shape and not torch.equal(given.to(fixed.dtype), fixed):
                raise ArrayError("array 'agent_type' must match the run's fixed tagger ids "
                                 f"{self.policies['tagger']} (config key tagger_ids)")

    def derived(self):
        c, f32 = self.config, np.float32
        return dict(
            episode_length_f=f32(c.episode_length),
            vmax_tagger=f32(c.max_speed * c.skill_level_tagger),
            vmax_runner=f32(c.max_speed * c.skill_level_runner),
            position_scale=f32(np.sqrt(2.0) * c.grid_length),
            speed_scale=f32(c.max_speed + 1e-10),
            tag_radius=f32(c.tagging_distance * c.grid_length),
        )


def action_table(low, high, levels):
    """Index 0 is the no-op; indices 1..levels are linspace(low, high, levels)."""
    return np.concatenate([[0.0], np.linspace(low, high, levels)]).astype(np.float32)
