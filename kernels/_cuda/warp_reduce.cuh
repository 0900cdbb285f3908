// warp_reduce.cuh: sums across a warp's lanes, shared by the families' kernels (GroupNorm statistics, the
// products' partial sums): a butterfly all-reduce over aligned lane groups, and the transposing reduce-scatter that
// sums many values per lane with about one shuffle per value. Shuffle order 16, 8, ..., 1 throughout, so every
// lane of a group gets the same bits (a + b == b + a in IEEE arithmetic).
#pragma once

namespace dpk_warp {

// sum over each aligned group of n lanes (n a power of two up to 32), every lane of the group getting it
__device__ __forceinline__ float group_sum(float v, int n) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, v, o);
        v += o < n ? t : 0.0f;
    }
    return v;
}

__device__ __forceinline__ float sum(float v) { return group_sum(v, 32); }

// Reduce-scatter of N sums per lane (N a power of two). Step with lane bit D: the lane keeps half of its values (the
// upper half where the bit is set) and adds its partner's (lane ^ D) copy of that half, received in exchange for the
// other half; after the halvings (D = 16, 8, ...) the remaining D steps (N < 32) are plain butterflies. The lane's
// v[i] (i < max(1, N / 32)) ends as the warp total of value `index + i`, index = (lane >> (5 - H)) * (N >> H),
// H = min(5, log2 N) (accumulated here; unused, it costs nothing). About N shuffles instead of 5 N.
template <int N, int D = 16>
__device__ __forceinline__ void reduce_scatter(float* v, int lane, int& index) {
    if constexpr (D > 0) {
        if constexpr (N > 1) {
            constexpr int H = N / 2;
            const bool upper = (lane & D) != 0;
#pragma unroll
            for (int i = 0; i < H; ++i) {
                const float send = upper ? v[i] : v[i + H];
                const float keep = upper ? v[i + H] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, D);
            }
            index += upper ? H : 0;
            reduce_scatter<H, D / 2>(v, lane, index);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], D);
            reduce_scatter<1, D / 2>(v, lane, index);
        }
    }
}

// the same, for a caller that knows each lane's index (conv1d: lane * N / 32 for N >= 32)
template <int N>
__device__ __forceinline__ void reduce_scatter(float* v, int lane) {
    int index = 0;
    reduce_scatter<N>(v, lane, index);
}

}  // namespace dpk_warp
