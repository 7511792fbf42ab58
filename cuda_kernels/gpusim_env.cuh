// What every gpusim env kernel in CUDA C needs: this thread's replica and
// agent, its RNG stream, and the auto-reset that ends a step kernel.
//
// An env kernel includes this and the generated "gpusim_env_args.cuh", and
// takes GPUSIM_ENV_PARAMS as its parameter list; GPUSIM_ENV_ARGS then gives
// every array and scalar by name (a GpusimEnvArgs):
//
//   extern "C" __global__ void __launch_bounds__(1024) my_step(GPUSIM_ENV_PARAMS)
//   {
//       GPUSIM_SHARED_ENV_ARGS(a);  // or: const GpusimEnvArgs a = GPUSIM_ENV_ARGS;
//       ... step phases, __syncthreads() between them ...
//       gpusim_auto_reset(a, obs_dim, [&] { my_reset_phases(a); });
//   }
//
// Launch: grid = replicas, block = agents.
#pragma once

#include "gpusim_env_args.cuh"  // generated per layout; its GPUSIM_HAS_* defines are read below
#include "gpusim_math.cuh"
#include "gpusim_rng.cuh"

// `GpusimEnvArgs name`: the kernel's arguments, copied once per block into
// shared memory (thread 0 writes, a barrier, every thread reads). Device
// functions that take it by reference read each pointer where they use it,
// instead of keeping every argument in registers for the whole kernel, which
// spills at 1,024 threads (64 registers each).
#define GPUSIM_SHARED_ENV_ARGS(name)    \
    __shared__ GpusimEnvArgs name;      \
    if (gpusim_agent() == 0)            \
        name = GPUSIM_ENV_ARGS;         \
    __syncthreads()

// This thread's replica (its block) and agent (its thread), and the agents per replica.
__device__ __forceinline__ int gpusim_replica() { return (int)blockIdx.x; }
__device__ __forceinline__ int gpusim_agent() { return (int)threadIdx.x; }
__device__ __forceinline__ int gpusim_num_agents() { return (int)blockDim.x; }

// The row of (replica, agent) in arrays shaped (num_envs, num_agents, ...).
__device__ __forceinline__ long long gpusim_row()
{
    return (long long)gpusim_replica() * gpusim_num_agents() + gpusim_agent();
}

// This thread's RNG stream in the env's rng_state (num_envs, num_agents, 2).
__device__ __forceinline__ gpusim_u64* gpusim_my_stream(gpusim_u64* rng_state)
{
    return gpusim_stream(rng_state, gpusim_replica(), gpusim_agent(), gpusim_num_agents());
}

// The end of a step kernel, after the step's last barrier: a replica whose
// step terminated or truncated it is marked in reset_mask, keeps its last
// observation in final_obs (and, with per-agent done, whether each agent was
// still in play in final_active), and is reset by `reset` (the reset phases, with
// their barriers) in the same launch. reset_mask is written by thread 0 and
// read by every thread after a barrier, so the branch is the same in the
// whole block and its barriers are safe.
template <class Args, class Reset>
__device__ void gpusim_auto_reset(const Args& a, int obs_dim, Reset reset)
{
    const int env = gpusim_replica();
    if (gpusim_agent() == 0)
        a.reset_mask[env] = a.terminated[env] || a.truncated[env];
    __syncthreads();
    if (a.reset_mask[env]) {
        const long long row = gpusim_row() * obs_dim;
        for (int k = 0; k < obs_dim; ++k)
            a.final_obs[row + k] = a.obs[row + k];
#ifdef GPUSIM_HAS_FINAL_ACTIVE  // per-agent done: who was still in play at the end
        a.final_active[gpusim_row()] = a.agent_active[gpusim_row()];
#endif
        __syncthreads();
        reset();
    }
}
