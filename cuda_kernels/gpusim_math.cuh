// Float helpers with the exact semantics of the portable (numba) kernels, so
// CUDA C kernels round and select exactly as they do.
#pragma once

// NVRTC compiles without the C library's headers: its own infinity.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Python's max(a, b) and min(a, b): the first argument unless the second is
// strictly greater (smaller).
__device__ __forceinline__ float gpusim_max(float a, float b)
{
    return b > a ? b : a;
}

__device__ __forceinline__ float gpusim_min(float a, float b)
{
    return b < a ? b : a;
}

// Python's float modulo a % b: the remainder takes the sign of b (b != 0).
__device__ __forceinline__ float gpusim_mod(float a, float b)
{
    float r = fmodf(a, b);
    if (r != 0.0f) {
        if ((b < 0.0f) != (r < 0.0f))
            r += b;
    } else {
        r = b < 0.0f ? -0.0f : 0.0f;
    }
    return r;
}
