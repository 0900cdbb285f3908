// fast_math.cuh: single-MUFU approximations (no range fix-ups, denormals flushed) shared by the families' epilogues
// (Mish's m / (m + 2), GroupNorm's 1 / count and 1 / sqrt(var + eps)). Each is one PTX instruction.
#pragma once

namespace dpk_math {

// 1/x to ~1 ulp with one MUFU.RCP: for counts and for m + 2 >= 2 in Mish
__device__ __forceinline__ float fast_rcp(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// 1/sqrt(x) with one MUFU.RSQ (x = var + eps >= eps: never denormal)
__device__ __forceinline__ float fast_rsqrt(float x) {
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// 2^x with one MUFU.EX2; results below 2^-126 flush to 0
__device__ __forceinline__ float fast_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

}  // namespace dpk_math
