// A host shim that lets gpusim's CUDA C kernels compile with a C++20 compiler
// and run on the CPU, one std::thread per GPU thread, for testing.
//
// Include it before the kernel source (g++ -std=c++20 -pthread -x c++):
// __global__ / __device__ / __forceinline__ / __launch_bounds__ compile away,
// __shared__ variables are statics (the blocks run one after another),
// threadIdx / blockIdx / blockDim / gridDim are thread-local, and
// __syncthreads() is a std::barrier over the threads of the running block.
// gpusim_host::launch() runs the blocks one after another, each with one
// thread per block thread, and reports a kernel whose threads did not all
// reach the same number of barriers (a barrier in divergent code, which is
// undefined on a GPU).
#pragma once

#include <barrier>
#include <cmath>
#include <cstddef>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// blocks run one after another, so one static per kernel is the block's shared memory
#define __shared__ static

struct gpusim_host_dim3 {
    unsigned int x, y, z;
};

inline thread_local gpusim_host_dim3 threadIdx{0, 0, 0};
inline thread_local gpusim_host_dim3 blockIdx{0, 0, 0};
inline thread_local gpusim_host_dim3 blockDim{1, 1, 1};
inline thread_local gpusim_host_dim3 gridDim{1, 1, 1};

namespace gpusim_host {
inline thread_local std::barrier<>* block_barrier = nullptr;
inline thread_local long barriers_passed = 0;
}  // namespace gpusim_host

inline void __syncthreads()
{
    ++gpusim_host::barriers_passed;
    gpusim_host::block_barrier->arrive_and_wait();
}

namespace gpusim_host {

// Run `kernel(args...)` on a grid of `grid` blocks of `block` threads.
// Returns 0, or 1 + the index of the first block whose threads passed
// different numbers of barriers.
template <class... Params, class... Args>
int launch(unsigned int grid, unsigned int block, void (*kernel)(Params...), Args... args)
{
    for (unsigned int b = 0; b < grid; ++b) {
        std::barrier<> barrier((std::ptrdiff_t)block);
        std::vector<long> passed(block, 0);
        std::vector<std::thread> threads;
        threads.reserve(block);
        for (unsigned int t = 0; t < block; ++t) {
            threads.emplace_back([&, t]() {
                threadIdx = {t, 0, 0};
                blockIdx = {b, 0, 0};
                blockDim = {block, 1, 1};
                gridDim = {grid, 1, 1};
                block_barrier = &barrier;
                barriers_passed = 0;
                kernel(args...);
                passed[t] = barriers_passed;
                // A thread that has finished no longer takes part in barriers,
                // so a divergent barrier is reported instead of hanging.
                barrier.arrive_and_drop();
            });
        }
        for (auto& thread : threads)
            thread.join();
        for (unsigned int t = 1; t < block; ++t)
            if (passed[t] != passed[0])
                return 1 + (int)b;
    }
    return 0;
}

}  // namespace gpusim_host
