// gpusim's RNG streams for CUDA C kernels: the same xoroshiro128+ streams as
// gpusim/rng.py, so a CUDA C kernel draws exactly the numbers that the
// portable kernels draw from the same `rng_state`.
//
// `rng_state` is the env's (num_envs, num_agents, 2) uint64 array; the state
// of stream (env, agent) is the pair at gpusim_stream(rng_state, env, agent,
// num_agents). Each stream belongs to one thread (its agent), so drawing needs
// no atomics. Seeding happens on the host (gpusim.rng.seed_streams).
#pragma once

typedef unsigned long long gpusim_u64;

// The two-word state of stream (env, agent).
__device__ __forceinline__ gpusim_u64* gpusim_stream(gpusim_u64* rng_state, int env, int agent,
                                                    int num_agents)
{
    return rng_state + 2 * ((long long)env * num_agents + agent);
}

__device__ __forceinline__ gpusim_u64 gpusim_rotl(gpusim_u64 x, int k)
{
    return (x << k) | (x >> (64 - k));
}

// Advance the stream by one xoroshiro128+ step; return 64 bits.
__device__ __forceinline__ gpusim_u64 gpusim_next_u64(gpusim_u64* state)
{
    const gpusim_u64 s0 = state[0];
    gpusim_u64 s1 = state[1];
    const gpusim_u64 result = s0 + s1;
    s1 ^= s0;
    state[0] = gpusim_rotl(s0, 24) ^ s1 ^ (s1 << 16);
    state[1] = gpusim_rotl(s1, 37);
    return result;
}

// A float uniform in [0, 1) from the top 24 bits of the next output.
__device__ __forceinline__ float gpusim_uniform(gpusim_u64* state)
{
    const unsigned int bits = (unsigned int)(gpusim_next_u64(state) >> 40);
    return (float)bits * (1.0f / 16777216.0f);
}

// An integer uniform in [0, n) (n > 0), by multiply-shift on 32 bits.
__device__ __forceinline__ int gpusim_randint(gpusim_u64* state, int n)
{
    const gpusim_u64 bits = gpusim_next_u64(state) >> 32;
    return (int)((bits * (gpusim_u64)n) >> 32);
}
