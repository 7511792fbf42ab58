// The action sampler in CUDA C (gpusim/sampler.py): for each action
// component, an inverse-CDF draw (or the argmax) over its slice of `probs`,
// from the agent's own RNG stream, and the log-probability of the drawn
// actions summed over components. Same draws as the portable sampler.
//
// Launch: grid = replicas, block = agents. Arguments: the sampler's arrays
// (rng_state, actions, log_prob, nvec, offsets, probs), then its parameters
// (argmax, log_space, num_components, width). `nvec` and `offsets` are
// per-agent tables (num_agents x num_components; 0 choices: a component the
// agent lacks). With log_space, `probs` holds log-probabilities. Each thread
// writes only its own agent's entries.
#include "gpusim_rng.cuh"

// exp in double, rounded to float: the same weight as the portable sampler's.
__device__ __forceinline__ float sampler_weight(const float* p, int k, bool log_space)
{
    return log_space ? (float)exp((double)p[k]) : p[k];
}

extern "C" __global__ void __launch_bounds__(1024) sample_actions(
    unsigned long long* rng_state, int* actions, float* log_prob, const int* nvec,
    const int* offsets, const float* probs, bool argmax, bool log_space, int num_components,
    int width)
{
    const int env = (int)blockIdx.x;
    const int agent = (int)threadIdx.x;
    const long long row = (long long)env * blockDim.x + agent;
    const float* p = probs + row * width;
    gpusim_u64* rng = gpusim_stream(rng_state, env, agent, (int)blockDim.x);
    float drawn_log_prob = 0.0f;  // summed in float32, as torch sums the components
    for (int c = 0; c < num_components; ++c) {
        const int start = offsets[agent * num_components + c];
        const int n = nvec[agent * num_components + c];
        if (n == 0) {  // a component this agent does not have
            actions[row * num_components + c] = 0;
            continue;
        }
        float total = 0.0f;
        for (int k = 0; k < n; ++k)
            total += sampler_weight(p, start + k, log_space);
        int choice = 0;
        if (argmax) {  // exp is monotonic: the raw values give the same argmax
            float best = p[start];
            for (int k = 1; k < n; ++k) {
                if (p[start + k] > best) {
                    best = p[start + k];
                    choice = k;
                }
            }
        } else {
            const float target = gpusim_uniform(rng) * total;  // weights need not sum to 1
            float cumulative = 0.0f;
            choice = -1;
            for (int k = 0; k < n; ++k) {
                const float weight = sampler_weight(p, start + k, log_space);
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
        drawn_log_prob += log_space ? p[start + choice]
                                    : (float)(log((double)p[start + choice]) - log((double)total));
    }
    log_prob[row] = drawn_log_prob;
}
