// The action sampler in CUDA C (gpusim/sampler.py): for each action
// component, an inverse-CDF draw (or the argmax) over its slice of `probs`,
// from the agent's own RNG stream. Same draws as the portable sampler.
//
// Launch: grid = replicas, block = agents. Arguments: the sampler's arrays
// (rng_state, actions, nvec, offsets, probs), then its parameters (argmax,
// num_components, width). Each thread writes only its own agent's actions.
#include "gpusim_rng.cuh"

extern "C" __global__ void __launch_bounds__(1024) sample_actions(
    unsigned long long* rng_state, int* actions, const int* nvec, const int* offsets,
    const float* probs, bool argmax, int num_components, int width)
{
    const int env = (int)blockIdx.x;
    const int agent = (int)threadIdx.x;
    const long long row = (long long)env * blockDim.x + agent;
    const float* p = probs + row * width;
    gpusim_u64* rng = gpusim_stream(rng_state, env, agent, (int)blockDim.x);
    for (int c = 0; c < num_components; ++c) {
        const int start = offsets[c];
        const int n = nvec[c];
        int choice = 0;
        if (argmax) {
            float best = p[start];
            for (int k = 1; k < n; ++k) {
                if (p[start + k] > best) {
                    best = p[start + k];
                    choice = k;
                }
            }
        } else {
            const float u = gpusim_uniform(rng);
            float total = 0.0f;
            for (int k = 0; k < n; ++k)
                total += p[start + k];
            const float target = u * total;  // probabilities need not sum exactly to 1
            float cumulative = 0.0f;
            choice = -1;
            for (int k = 0; k < n; ++k) {
                const float weight = p[start + k];
                cumulative += weight;
                if (weight > 0.0f) {
                    choice = k;  // last positive-weight index: a rounding-proof fallback
                    if (target < cumulative)
                        break;
                }
            }
            if (choice < 0)
                choice = 0;
        }
        actions[row * num_components + c] = choice;
    }
}
