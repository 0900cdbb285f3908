// stream_device.cuh: device helpers of stream.cu and stream_rows.cu: 16-byte vector element access for fp32/bf16/fp16
// (their reduce-scatter is kernels/_cuda/warp_reduce.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace conv1d_stream_device {

__host__ __device__ constexpr int ilog2(int n) { return n <= 1 ? 0 : 1 + ilog2(n / 2); }

// ---- element access inside a 16-byte vector holding 16 / sizeof(T) values (indices are compile-time) ----
__device__ __forceinline__ unsigned word(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}
__device__ __forceinline__ void set_word(uint4& v, int i, unsigned bits) {
    if (i == 0) v.x = bits; else if (i == 1) v.y = bits; else if (i == 2) v.z = bits; else v.w = bits;
}

template <typename T> struct Elem;
template <> struct Elem<float> {
    static __device__ __forceinline__ float get(const uint4& v, int e) { return __uint_as_float(word(v, e)); }
    static __device__ __forceinline__ unsigned load_bits(const float* p) { return __float_as_uint(__ldg(p)); }
    static __device__ __forceinline__ void set(uint4& v, int e, unsigned bits) { set_word(v, e, bits); }
    static __device__ __forceinline__ float to_float(float v) { return v; }
    static __device__ __forceinline__ float from_float(float v) { return v; }
};
template <typename T16, bool BF16> struct Elem16 {
    static __device__ __forceinline__ float get(const uint4& v, int e) {
        const unsigned w = word(v, e / 2);
        const unsigned short h = static_cast<unsigned short>((e & 1) ? (w >> 16) : (w & 0xffffu));
        if constexpr (BF16) return __bfloat162float(__ushort_as_bfloat16(h));
        else return __half2float(__ushort_as_half(h));
    }
    static __device__ __forceinline__ unsigned load_bits(const T16* p) {
        return __ldg(reinterpret_cast<const unsigned short*>(p));
    }
    static __device__ __forceinline__ void set(uint4& v, int e, unsigned bits) {
        set_word(v, e / 2, word(v, e / 2) | (bits << (16 * (e & 1))));
    }
    static __device__ __forceinline__ float to_float(T16 v) {
        if constexpr (BF16) return __bfloat162float(v);
        else return __half2float(v);
    }
    static __device__ __forceinline__ T16 from_float(float v) {
        if constexpr (BF16) return __float2bfloat16_rn(v);
        else return __float2half_rn(v);
    }
};
template <> struct Elem<__nv_bfloat16> : Elem16<__nv_bfloat16, true> {};
template <> struct Elem<__half> : Elem16<__half, false> {};

}  // namespace conv1d_stream_device
