// tag_continuous in CUDA C: the reset and step kernels of the pycuda backend.
//
// Same semantics as the portable phases in gpusim/envs/tag_continuous/env.py
// (spec: shared/spec/tag_continuous.md): the same RNG draws in the same order,
// the same float32 operations in the same order, the same K-nearest search
// with its tie-breaking, and the same auto-reset at the end of the step.
//
// Launch: grid = replicas (blockIdx.x is the env), block = agents
// (threadIdx.x is the agent). Argument convention: a pointer to every env
// array in the field order of `env.arrays.views`, then every scalar of
// `env.params()` in its order (tests/test_cuda_c.py checks both lists).
//
// Race rules: each element is written by one thread (an agent writes its own
// rows; thread 0 writes per-env values), cross-agent results are gathered in
// their own phase after a barrier (a runner records who tagged it, then each
// tagger counts its tags), and every __syncthreads() is reached by all
// threads of the block (phases return early inside device functions only).
#include "gpusim_math.cuh"
#include "gpusim_rng.cuh"

#define TAG_FEATURES 7  // dx, dy, dspeed, dacceleration, ddirection, is_tagger, still_in_game

// float32 constants of the portable kernels (np.float32(2 pi), np.float32(pi / 2))
#define TAG_TWO_PI 6.28318530717958647692f
#define TAG_HALF_PI 1.57079632679489661923f
// inflation of squared-distance bounds (np.float32(1.000001))
#define TAG_BOUND_SLACK 1.000001f

namespace tag {

struct Tag {
    // arrays
    float* obs;
    float* final_obs;
    float* reward;
    bool* terminated;
    bool* truncated;
    int* actions;
    gpusim_u64* rng_state;
    float* loc_x;
    float* loc_y;
    float* speed;
    float* direction;
    float* acceleration;
    int* still_in_game;
    int* agent_type;
    int* num_runners_left;
    int* timestep;
    int* nbr_idx;
    float* nbr_dist;
    int* tagged_by;
    const float* acc_table;
    const float* turn_table;
    const int* is_tagger;
    const int* tagger_ids;
    // parameters
    float grid_length;
    int num_runners;
    int episode_length;
    float episode_length_f;
    float vmax_tagger;
    float vmax_runner;
    int num_observed;
    bool full_observation;
    bool runner_exits;
    float position_scale;
    float speed_scale;
    float tag_radius;
    float tag_reward_for_tagger;
    float tag_penalty_for_runner;
    float step_reward_tagger;
    float step_reward_runner;
    float edge_hit_penalty;
    float end_of_game_reward_for_runner;
    // this thread and the sizes the portable kernels read off array shapes
    int env;
    int agent;
    int num_agents;
    int num_taggers;  // tagger_ids.shape[0]
    int width;        // neighbour columns per feature block
    int obs_dim;      // obs.shape[2]
    long long base;   // index of (env, agent 0) in per-agent arrays
    long long row;    // index of (env, agent) in per-agent arrays
};

// ---- reset ------------------------------------------------------------------------
// Uniform position, one of four headings, at rest, in the game.
__device__ void spawn_agent(const Tag& t)
{
    gpusim_u64* rng = gpusim_stream(t.rng_state, t.env, t.agent, t.num_agents);
    const float x = gpusim_uniform(rng) * t.grid_length;
    const float y = gpusim_uniform(rng) * t.grid_length;
    const float heading = (float)gpusim_randint(rng, 4) * TAG_HALF_PI;
    t.loc_x[t.row] = x;
    t.loc_y[t.row] = y;
    t.direction[t.row] = heading;
    t.speed[t.row] = 0.0f;
    t.acceleration[t.row] = 0.0f;
    t.still_in_game[t.row] = 1;
    t.agent_type[t.row] = t.is_tagger[t.agent];
}

__device__ void start_clock(const Tag& t)
{
    t.timestep[t.env] = 0;
    t.num_runners_left[t.env] = t.num_runners;
}

// ---- step -------------------------------------------------------------------------
// Spec steps 1-4, plus this agent's edge penalty and step reward.
__device__ void move(const Tag& t)
{
    const long long i = t.row;
    t.tagged_by[i] = -1;
    t.reward[i] = 0.0f;
    if (t.still_in_game[i] == 0) {  // spec steps 1-3 with still_in_game = 0
        t.direction[i] = 0.0f;
        t.speed[i] = 0.0f;
        t.acceleration[i] = 0.0f;
        return;
    }
    const bool is_tagger = t.agent_type[i] == 1;
    const float direction = gpusim_mod(t.direction[i] + t.turn_table[t.actions[2 * i + 1]], TAG_TWO_PI);
    float acceleration = t.acceleration[i] + t.acc_table[t.actions[2 * i]];
    const float vmax = is_tagger ? t.vmax_tagger : t.vmax_runner;
    const float speed = gpusim_min(gpusim_max(t.speed[i] + acceleration, 0.0f), vmax);
    if (!(0.0f < speed && speed < vmax))
        acceleration = 0.0f;
    float x = t.loc_x[i] + speed * cosf(direction);
    float y = t.loc_y[i] + speed * sinf(direction);
    float reward = is_tagger ? t.step_reward_tagger : t.step_reward_runner;
    if (x < 0.0f || x > t.grid_length || y < 0.0f || y > t.grid_length) {
        reward += t.edge_hit_penalty;
        x = gpusim_min(gpusim_max(x, 0.0f), t.grid_length);
        y = gpusim_min(gpusim_max(y, 0.0f), t.grid_length);
    }
    t.direction[i] = direction;
    t.acceleration[i] = acceleration;
    t.speed[i] = speed;
    t.loc_x[i] = x;
    t.loc_y[i] = y;
    t.reward[i] = reward;
}

__device__ void tick(const Tag& t)
{
    t.timestep[t.env] += 1;
}

__device__ float squared_distance(const Tag& t, int a, int b)
{
    const float dx = t.loc_x[t.base + b] - t.loc_x[t.base + a];
    const float dy = t.loc_y[t.base + b] - t.loc_y[t.base + a];
    return dx * dx + dy * dy;
}

// Neighbour `other` as column `column` of the seven feature blocks.
__device__ void write_features(const Tag& t, int other, int column)
{
    float* row = t.obs + t.row * t.obs_dim;
    const long long i = t.row;
    const long long j = t.base + other;
    const int w = t.width;
    row[column] = (t.loc_x[j] - t.loc_x[i]) / t.position_scale;
    row[w + column] = (t.loc_y[j] - t.loc_y[i]) / t.position_scale;
    row[2 * w + column] = (t.speed[j] - t.speed[i]) / t.speed_scale;
    row[3 * w + column] = (t.acceleration[j] - t.acceleration[i]) / t.speed_scale;
    row[4 * w + column] = (t.direction[j] - t.direction[i]) / TAG_TWO_PI;
    row[5 * w + column] = (float)t.agent_type[j];
    row[6 * w + column] = (float)t.still_in_game[j];
}

// An upper bound on the K-th smallest squared distance, or infinity: last
// step's K neighbours, if all are still in the game, are K candidates.
__device__ float previous_bound(const Tag& t)
{
    const int* idx = t.nbr_idx + t.row * t.num_observed;
    float bound = 0.0f;
    for (int k = 0; k < t.num_observed; ++k) {
        const int other = idx[k];
        if (other < 0 || other == t.agent || t.still_in_game[t.base + other] == 0)
            return INFINITY;
        bound = gpusim_max(bound, squared_distance(t, t.agent, other));
    }
    return bound * TAG_BOUND_SLACK;
}

// Sorted list (distance, then id) of the K nearest other agents in the game;
// returns its size. Candidates come in increasing id, so a tie with the
// current K-th never displaces it; the bound screens out most candidates.
__device__ int nearest_in_game(const Tag& t)
{
    const int k_max = t.num_observed;
    int* idx = t.nbr_idx + t.row * k_max;
    float* dist = t.nbr_dist + t.row * k_max;
    float screen = previous_bound(t);
    int count = 0;
    float worst = INFINITY;  // distance of the K-th entry once the list is full
    for (int other = 0; other < t.num_agents; ++other) {
        if (other == t.agent || t.still_in_game[t.base + other] == 0)
            continue;
        const float d_sq = squared_distance(t, t.agent, other);
        if (d_sq > screen)
            continue;
        const float d = sqrtf(d_sq);
        int slot;
        if (count < k_max) {
            slot = count;
            count += 1;
        } else if (d < worst) {
            slot = k_max - 1;
        } else {
            continue;
        }
        while (slot > 0 && dist[slot - 1] > d) {
            dist[slot] = dist[slot - 1];
            idx[slot] = idx[slot - 1];
            slot -= 1;
        }
        dist[slot] = d;
        idx[slot] = other;
        if (count == k_max) {
            worst = dist[k_max - 1];
            screen = gpusim_min(screen, squared_distance(t, t.agent, idx[k_max - 1]) * TAG_BOUND_SLACK);
        }
    }
    for (int k = count; k < k_max; ++k)
        idx[k] = -1;
    return count;
}

// Spec observation, from the state after moves and before tagging.
__device__ void observe(const Tag& t)
{
    float* row = t.obs + t.row * t.obs_dim;
    if (t.still_in_game[t.row] == 0) {
        for (int k = 0; k < t.obs_dim; ++k)
            row[k] = 0.0f;
        return;
    }
    if (t.full_observation) {
        int column = 0;
        for (int other = 0; other < t.num_agents; ++other) {
            if (other != t.agent) {
                write_features(t, other, column);
                column += 1;
            }
        }
    } else {
        const int count = nearest_in_game(t);
        const int* idx = t.nbr_idx + t.row * t.num_observed;
        for (int column = 0; column < count; ++column)
            write_features(t, idx[column], column);
        for (int column = count; column < t.width; ++column)
            for (int f = 0; f < TAG_FEATURES; ++f)
                row[f * t.width + column] = 0.0f;
    }
    row[t.obs_dim - 1] = (float)t.timestep[t.env] / t.episode_length_f;
}

// Each runner in the game checks its nearest tagger (ties to the lower id) and
// records the tag on itself; taggers count their tags in the next phase.
__device__ void tag_runners(const Tag& t)
{
    const long long i = t.row;
    if (t.agent_type[i] == 1 || t.still_in_game[i] == 0)
        return;
    int nearest = -1;
    float nearest_d = INFINITY;
    for (int k = 0; k < t.num_taggers; ++k) {  // increasing ids
        const int other = t.tagger_ids[k];
        const float d = sqrtf(squared_distance(t, t.agent, other));
        if (d < nearest_d) {
            nearest_d = d;
            nearest = other;
        }
    }
    if (nearest >= 0 && nearest_d < t.tag_radius) {
        t.reward[i] += t.tag_penalty_for_runner;
        t.tagged_by[i] = nearest;
        if (t.runner_exits)
            t.still_in_game[i] = 0;
    }
}

// Taggers collect every tag they made; runners still in at the end get their bonus.
__device__ void score(const Tag& t)
{
    const long long i = t.row;
    if (t.agent_type[i] == 1) {
        int tags = 0;
        for (int other = 0; other < t.num_agents; ++other)
            if (t.tagged_by[t.base + other] == t.agent)
                tags += 1;
        t.reward[i] += (float)tags * t.tag_reward_for_tagger;
    } else if (t.still_in_game[i] == 1 && t.timestep[t.env] == t.episode_length) {
        t.reward[i] += t.end_of_game_reward_for_runner;
    }
}

__device__ void finish(const Tag& t)
{
    if (t.runner_exits) {
        for (int other = 0; other < t.num_agents; ++other)
            if (t.tagged_by[t.base + other] >= 0)
                t.num_runners_left[t.env] -= 1;
    }
    const bool terminated = t.num_runners_left[t.env] == 0;
    t.terminated[t.env] = terminated;
    t.truncated[t.env] = !terminated && t.timestep[t.env] >= t.episode_length;
}

__device__ void save_final_obs(const Tag& t)
{
    const float* row = t.obs + t.row * t.obs_dim;
    float* final_row = t.final_obs + t.row * t.obs_dim;
    for (int k = 0; k < t.obs_dim; ++k)
        final_row[k] = row[k];
}

// The reset phases, barrier after each: spawn_agent, start_clock, observe.
__device__ void reset_replica(const Tag& t)
{
    spawn_agent(t);
    __syncthreads();
    if (t.agent == 0)
        start_clock(t);
    __syncthreads();
    observe(t);
    __syncthreads();
}

__device__ Tag bind_arguments(
    float* obs, float* final_obs, float* reward, bool* terminated, bool* truncated,
    int* actions, gpusim_u64* rng_state, float* loc_x, float* loc_y, float* speed,
    float* direction, float* acceleration, int* still_in_game, int* agent_type,
    int* num_runners_left, int* timestep, int* nbr_idx, float* nbr_dist, int* tagged_by,
    const float* acc_table, const float* turn_table, const int* is_tagger,
    const int* tagger_ids, float grid_length, int num_runners, int episode_length,
    float episode_length_f, float vmax_tagger, float vmax_runner, int num_observed,
    bool full_observation, bool runner_exits, float position_scale, float speed_scale,
    float tag_radius, float tag_reward_for_tagger, float tag_penalty_for_runner,
    float step_reward_tagger, float step_reward_runner, float edge_hit_penalty,
    float end_of_game_reward_for_runner)
{
    Tag t;
    t.obs = obs;
    t.final_obs = final_obs;
    t.reward = reward;
    t.terminated = terminated;
    t.truncated = truncated;
    t.actions = actions;
    t.rng_state = rng_state;
    t.loc_x = loc_x;
    t.loc_y = loc_y;
    t.speed = speed;
    t.direction = direction;
    t.acceleration = acceleration;
    t.still_in_game = still_in_game;
    t.agent_type = agent_type;
    t.num_runners_left = num_runners_left;
    t.timestep = timestep;
    t.nbr_idx = nbr_idx;
    t.nbr_dist = nbr_dist;
    t.tagged_by = tagged_by;
    t.acc_table = acc_table;
    t.turn_table = turn_table;
    t.is_tagger = is_tagger;
    t.tagger_ids = tagger_ids;
    t.grid_length = grid_length;
    t.num_runners = num_runners;
    t.episode_length = episode_length;
    t.episode_length_f = episode_length_f;
    t.vmax_tagger = vmax_tagger;
    t.vmax_runner = vmax_runner;
    t.num_observed = num_observed;
    t.full_observation = full_observation;
    t.runner_exits = runner_exits;
    t.position_scale = position_scale;
    t.speed_scale = speed_scale;
    t.tag_radius = tag_radius;
    t.tag_reward_for_tagger = tag_reward_for_tagger;
    t.tag_penalty_for_runner = tag_penalty_for_runner;
    t.step_reward_tagger = step_reward_tagger;
    t.step_reward_runner = step_reward_runner;
    t.edge_hit_penalty = edge_hit_penalty;
    t.end_of_game_reward_for_runner = end_of_game_reward_for_runner;
    t.env = (int)blockIdx.x;
    t.agent = (int)threadIdx.x;
    t.num_agents = (int)blockDim.x;
    t.num_taggers = t.num_agents - num_runners;
    t.width = full_observation ? t.num_agents - 1 : num_observed;
    t.obs_dim = TAG_FEATURES * t.width + 1;
    t.base = (long long)t.env * t.num_agents;
    t.row = t.base + t.agent;
    return t;
}

}  // namespace tag

#define TAG_ARGUMENTS                                                                        \
    obs, final_obs, reward, terminated, truncated, actions, rng_state, loc_x, loc_y, speed,  \
        direction, acceleration, still_in_game, agent_type, num_runners_left, timestep,      \
        nbr_idx, nbr_dist, tagged_by, acc_table, turn_table, is_tagger, tagger_ids,          \
        grid_length, num_runners, episode_length, episode_length_f, vmax_tagger,             \
        vmax_runner, num_observed, full_observation, runner_exits, position_scale,           \
        speed_scale, tag_radius, tag_reward_for_tagger, tag_penalty_for_runner,              \
        step_reward_tagger, step_reward_runner, edge_hit_penalty,                            \
        end_of_game_reward_for_runner

// Draw a fresh initial state in every replica.
extern "C" __global__ void __launch_bounds__(1024) tag_continuous_reset(
    float* obs, float* final_obs, float* reward, bool* terminated, bool* truncated,
    bool* reset_mask, int* actions, unsigned long long* rng_state,
    float* loc_x, float* loc_y, float* speed, float* direction, float* acceleration,
    int* still_in_game, int* agent_type, int* num_runners_left, int* timestep,
    int* nbr_idx, float* nbr_dist, int* tagged_by,
    const float* acc_table, const float* turn_table, const int* is_tagger,
    const int* tagger_ids,
    float grid_length, int num_runners, int episode_length, float episode_length_f,
    float vmax_tagger, float vmax_runner, int num_observed, bool full_observation,
    bool runner_exits, float position_scale, float speed_scale, float tag_radius,
    float tag_reward_for_tagger, float tag_penalty_for_runner, float step_reward_tagger,
    float step_reward_runner, float edge_hit_penalty, float end_of_game_reward_for_runner)
{
    (void)reset_mask;
    const tag::Tag t = tag::bind_arguments(TAG_ARGUMENTS);
    tag::reset_replica(t);
}

// One step in every replica; replicas that finish are reset in the same launch
// (their last observation is kept in final_obs).
extern "C" __global__ void __launch_bounds__(1024) tag_continuous_step(
    float* obs, float* final_obs, float* reward, bool* terminated, bool* truncated,
    bool* reset_mask, int* actions, unsigned long long* rng_state,
    float* loc_x, float* loc_y, float* speed, float* direction, float* acceleration,
    int* still_in_game, int* agent_type, int* num_runners_left, int* timestep,
    int* nbr_idx, float* nbr_dist, int* tagged_by,
    const float* acc_table, const float* turn_table, const int* is_tagger,
    const int* tagger_ids,
    float grid_length, int num_runners, int episode_length, float episode_length_f,
    float vmax_tagger, float vmax_runner, int num_observed, bool full_observation,
    bool runner_exits, float position_scale, float speed_scale, float tag_radius,
    float tag_reward_for_tagger, float tag_penalty_for_runner, float step_reward_tagger,
    float step_reward_runner, float edge_hit_penalty, float end_of_game_reward_for_runner)
{
    (void)reset_mask;
    const tag::Tag t = tag::bind_arguments(TAG_ARGUMENTS);
    tag::move(t);
    __syncthreads();
    if (t.agent == 0)
        tag::tick(t);
    __syncthreads();
    tag::observe(t);
    __syncthreads();
    tag::tag_runners(t);
    __syncthreads();
    tag::score(t);
    __syncthreads();
    if (t.agent == 0)
        tag::finish(t);
    __syncthreads();
    // auto-reset: the guard is the same in every thread of the block
    const bool done = t.terminated[t.env] || t.truncated[t.env];
    __syncthreads();
    if (done) {
        tag::save_final_obs(t);
        __syncthreads();
        tag::reset_replica(t);
    }
}
