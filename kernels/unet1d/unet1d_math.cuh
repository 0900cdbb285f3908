// unet1d_math.cuh: warp and element helpers shared by the layer kernel (unet1d.cu) and the chain kernel
// (unet1d_chain.cu): Mish, sums over lanes, the warp reduce-scatter of the SIMT forms' partial sums.
#pragma once

namespace dpk_unet1d {

// mish(v) = v tanh(softplus(v)) = v n / (n + 2), n = e^v (e^v + 2); v > 15: tanh(softplus(v)) = 1 in fp32.
__device__ __forceinline__ float mish(float v) {
    if (v > 15.0f) return v;
    const float e = __expf(v);
    const float n = e * (e + 2.0f);
    return v * __fdividef(n, n + 2.0f);
}

// sum over each aligned group of n lanes (n a power of two up to 32), every lane of the group getting it
__device__ __forceinline__ float group_sum(float v, int n) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, v, o);
        v += o < n ? t : 0.0f;
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return group_sum(v, 32); }

// One round of warp_sum_scatter: a lane keeps half H of its values (the upper one where lane & off) and adds its
// partner's (lane ^ off) copy of that half; then the next round on the kept half (recursion: every index is
// compile-time, so v stays in registers).
template <int N, int H>
__device__ __forceinline__ void scatter_rounds(float (&v)[N], int lane, int& index) {
    constexpr int off = 32 * H / N;
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int k = 0; k < H; ++k) {
        const float send = upper ? v[k] : v[k + H], keep = upper ? v[k + H] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
    index += upper ? H : 0;
    if constexpr (H > 1) scatter_rounds<N, H / 2>(v, lane, index);
}

// N (a power of two, 2 to 32) values per lane, each summed over the warp's lanes with N - 1 + log2(32 / N)
// shuffles (not 5 N): returns the sum of value `index`, which this lane ends up holding (32 / N lanes hold each;
// v is consumed).
template <int N>
__device__ __forceinline__ float warp_sum_scatter(float (&v)[N], int lane, int& index) {
    index = 0;
    scatter_rounds<N, N / 2>(v, lane, index);
#pragma unroll
    for (int off = 16 / N; off >= 1; off /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    return v[0];
}

}  // namespace dpk_unet1d
