// unet1d_device.cuh: small device helpers of the layer kernel (included by unet1d.cu only, one translation unit):
// the shared-memory carve of an op, trace marks, power-of-two divisions, Mish. No torch headers.
#pragma once

#include <stdint.h>

#include "async_copy.cuh"  // kernels/_cuda/
#include "fast_math.cuh"
#include "grid_dependency.cuh"  // globaltimer_ns (trace marks)
#include "warp_reduce.cuh"
#include "unet1d.h"

namespace {

namespace ca = dpk_async;

__host__ __device__ inline int align128(int bytes) { return (bytes + 127) & ~127; }

// taps per (row, channel) of a segment's packed weights: k, and a carrier's (simt = 2) rider's 1x1 tap
__host__ __device__ inline int taps(const UnetSegment& s) { return s.k + (s.simt == 2 ? 1 : 0); }

// bytes of one stage of a segment's packed weights (rc rows x cb channels x taps, fp32 or bf16)
__host__ __device__ inline int stage_bytes(const UnetSegment& s) { return s.rc * s.cb * taps(s) * (s.wbf16 ? 2 : 4); }

struct Carve {  // byte offsets of the shared-memory regions (dpk_unet1d_smem_bytes: their total)
    int stats, red, coef, ring, stage_bytes, x, total;
};

__host__ __device__ inline Carve carve(const UnetOp& op) {
    Carve c;
    c.stats = 128;  // ring barriers: UNET_MAX_RING x 8 bytes
    c.red = c.stats + align128(UNET_MAX_SRC * UNET_MAX_GROUPS * 8);
    int red = 0;
    for (int s = 0; s < op.nseg; ++s) {
        const int r = op.seg[s].rc * op.seg[s].l_out * (op.seg[s].simt == 2 ? 2 : 1);  // a carrier: its rider's too
        red = r > red ? r : red;
    }
    c.coef = c.red + align128(op.threads / 32 * red * 4);
    c.ring = c.coef + align128(op.coef * 16);
    int stage = 0;
    for (int s = 0; s < op.nseg; ++s) {
        const int b = stage_bytes(op.seg[s]);
        stage = b > stage ? b : stage;
    }
    c.stage_bytes = stage;
    c.x = c.ring + align128(op.ring * stage);
    c.total = c.x + align128(op.cin_pad * op.l_in * 4);
    return c;
}

// phase timestamps of this CTA (thread 0) when the op carries a trace buffer
__device__ __forceinline__ void mark(const UnetOp& op, int point) {
    if (op.trace != nullptr && threadIdx.x == 0) op.trace[blockIdx.x * UNET_TRACE_POINTS + point] = ca::globaltimer_ns();
}

// a / d for a >= 0, d > 0: a shift where d is a power of two (every divisor of blog's and Push-T image's ops), else
// the division (~20 instructions). Every thread of every op runs these, in phases on the op's critical path (ncu: a
// 5 MB op's warps issue ~1600 instructions each, nearly all of them once, at ~1.9 per cycle per SM).
__device__ __forceinline__ int div_pos(int a, int d) { return (d & (d - 1)) == 0 ? a >> (__ffs(d) - 1) : a / d; }

// 1 / d, exact where d is a power of two (its bit pattern), else rounded
__device__ __forceinline__ float inv_pos(int d) {
    return (d & (d - 1)) == 0 ? __int_as_float((127 - (__ffs(d) - 1)) << 23) : 1.0f / static_cast<float>(d);
}

// mish(v) = v tanh(softplus(v)) = v n / (n + 2), n = e^v (e^v + 2). Branch-free: e^v's argument is clamped at 15,
// where n / (n + 2) is already 1 in fp32 (1 - 2e-13), so v > 15 gives v; n + 2 >= 2 needs no range check.
__device__ __forceinline__ float mish(float v) {
    const float e = __expf(fminf(v, 15.0f));
    const float n = e * (e + 2.0f);
    return v * (n * dpk_math::fast_rcp(n + 2.0f));
}

}  // namespace
