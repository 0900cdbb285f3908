// Device helpers shared by both tiers of the fused GroupNorm+Mish kernels: element packs, mish, statistics
// merges and warp reductions. No torch headers.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fast_math.cuh"  // kernels/_cuda/
#include "warp_reduce.cuh"  // kernels/_cuda/
#include "gn_mish_plan.cuh"

namespace gn_mish::detail {

constexpr float kSoftplusThreshold = 20.f;
constexpr float kLog2e = 1.4426950408889634f;

// Elements travel as raw bits (uint32 for fp32, uint16 for fp16/bf16): trivially copyable packs that the
// compiler keeps in registers and moves with one 16-byte LDG/STG.
template <typename T>
struct Bits {
  using Word = uint16_t;
};
template <>
struct Bits<float> {
  using Word = uint32_t;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ float word_to_float(typename Bits<T>::Word w);
template <>
__device__ __forceinline__ float word_to_float<float>(uint32_t w) { return __uint_as_float(w); }
template <>
__device__ __forceinline__ float word_to_float<__half>(uint16_t w) { return __half2float(__ushort_as_half(w)); }
template <>
__device__ __forceinline__ float word_to_float<__nv_bfloat16>(uint16_t w) {
  return __bfloat162float(__ushort_as_bfloat16(w));
}

template <typename T>
__device__ __forceinline__ typename Bits<T>::Word float_to_word(float v);
template <>
__device__ __forceinline__ uint32_t float_to_word<float>(float v) { return __float_as_uint(v); }
template <>
__device__ __forceinline__ uint16_t float_to_word<__half>(float v) { return __half_as_ushort(__float2half_rn(v)); }
template <>
__device__ __forceinline__ uint16_t float_to_word<__nv_bfloat16>(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  typename Bits<T>::Word w[VEC];
  __device__ __forceinline__ float get(int k) const { return word_to_float<T>(w[k]); }
  __device__ __forceinline__ void set(int k, float v) { w[k] = float_to_word<T>(v); }
  __device__ __forceinline__ void set2(int k, float lo, float hi) { set(k, lo), set(k + 1, hi); }  // k even
};

// 16-bit vectors: pairs of elements in 32-bit words. As an array of uint16 each element took a register of its
// own (bf16 tier 1 with 64 elements per thread spilled 148 B); packed, 8 vectors of 8 take 32 registers.
// set() must be called for k = 0, 1, 2, ... in order (an even k starts its word); set2() writes a whole word with
// one packing conversion (F2FP), and a bf16 element unpacks with one shift or mask (ncu: the 16-bit tier-1 kernel
// issued ~36 instructions per element, ALU the busiest pipe).
template <typename T>
struct alignas(16) Pack16x8 {
  uint32_t u[4];
  __device__ __forceinline__ float get(int k) const {
    const uint32_t word = u[k >> 1];
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float((k & 1) ? word & 0xffff0000u : word << 16);
    return word_to_float<T>(uint16_t((k & 1) ? word >> 16 : word & 0xffffu));
  }
  __device__ __forceinline__ void set(int k, float v) {
    const uint32_t bits = float_to_word<T>(v);
    u[k >> 1] = (k & 1) ? (u[k >> 1] | (bits << 16)) : bits;
  }
  __device__ __forceinline__ void set2(int k, float lo, float hi) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
      u[k >> 1] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(lo, hi);
      u[k >> 1] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
};
template <>
struct Pack<__half, 8> : Pack16x8<__half> {};
template <>
struct Pack<__nv_bfloat16, 8> : Pack16x8<__nv_bfloat16> {};

// one-MUFU rcp, rsqrt and exp2 (kernels/_cuda/fast_math.cuh); exp2 results below 2^-126 flush to 0: mish's factor
// then is 0, y = -0, below any atol
using dpk_math::fast_exp2;
using dpk_math::fast_rcp;
using dpk_math::fast_rsqrt;

// mish(z) = z * tanh(softplus(z)) = z * m / (m + 2), m = e^z (e^z + 2): no cancellation for z << 0, and e^z is
// clamped at e^20 (PyTorch's softplus threshold), where m / (m + 2) = 1 - 2/m rounds to 1 (within rcp's ulp), so
// z > 20 gives z with no select; the factor m / (m + 2) <= 1 is formed first (no overflow). 2 MUFU, 7 FP32 ops.
__device__ __forceinline__ float mish(float z) {
  const float e = fast_exp2(fminf(z, kSoftplusThreshold) * kLog2e);
  const float m = e * (e + 2.f);
  return z * (m * fast_rcp(m + 2.f));
}

// The same from zl = z log2(e), which an affine produces for free (its scale and shift carry the factor): ln 2 rides
// in the reciprocal, 1 / ((m + 2) log2 e) = ln 2 / (m + 2). 2 MUFU, 5 FP32 ops.
__device__ __forceinline__ float mish_log2(float zl) {
  const float e = fast_exp2(fminf(zl, kSoftplusThreshold * kLog2e));
  const float m = e * (e + 2.f);
  return zl * (m * fast_rcp(fmaf(m, kLog2e, 2.f * kLog2e)));
}

// y = mish((x - mean) rstd g + b) for the elements of one channel, per output type. fp32: x - mean first, exact for
// data far from zero (the xoffset = 1000 smoke case), then mish: 9 FP32 ops per element. 16-bit: zl = x * scale +
// shift in the log2 domain, one FFMA, then mish_log2: 6 ops (H200, cold: bf16 / fp16 b64_c512_l1024 2.9 / 4.1 %
// faster; their normalise is bound by issue and MUFU). Folding the mean into the shift rounds mean rstd g once, an
// error of |mean| / std * |g| * 2^-24 that the tolerance's statistics term already budgets; for fp32 the H200 measured
// no gain (its kernels wait on DRAM), so fp32 keeps the exact form and its bits.
template <typename T>
struct AffineMish {
  float scale, shift;
  __device__ __forceinline__ AffineMish(float g, float b, float mean, float rstd)
      : scale(g * (rstd * kLog2e)), shift(fmaf(-g, mean * (rstd * kLog2e), b * kLog2e)) {}
  __device__ __forceinline__ float operator()(float x) const { return mish_log2(fmaf(x, scale, shift)); }
};
template <>
struct AffineMish<float> {
  float scale, shift, mean;
  __device__ __forceinline__ AffineMish(float g, float b, float mean_, float rstd)
      : scale(g * rstd), shift(b), mean(mean_) {}
  __device__ __forceinline__ float operator()(float x) const { return mish(fmaf(x - mean, scale, shift)); }
};

// (count, mean, sum of squared deviations) of a set of values.
struct Stats {
  float n, mean, m2;
};

// Chan et al.: statistics of the union of two disjoint sets; a is the "lower" operand by convention, so the
// two lanes of a butterfly pair, merging (lower, upper), get identical bits. a empty -> exactly b.
__device__ __forceinline__ Stats merge(const Stats& a, const Stats& b) {
  const float n = a.n + b.n;
  const float f = a.n == 0.f ? 1.f : (b.n == 0.f ? 0.f : b.n * fast_rcp(n));
  const float d = b.mean - a.mean;
  return {n, fmaf(d, f, a.mean), a.m2 + b.m2 + d * d * a.n * f};
}

// The union of two disjoint sets' statistics, symmetric in (a, b) to the bit: mean = (na ma + nb mb) / n, M2 = M2a +
// M2b + d^2 na nb / n; every operation is commutative or squares a difference ((-d)^2 == d^2) and the products are
// rounded separately (no contraction into an FMA, which would not be), so both lanes of a butterfly pair get
// identical bits without ordering the operands (no selects, no branch). Both empty -> empty.
__device__ __forceinline__ Stats merge_symmetric(const Stats& a, const Stats& b) {
  const float n = a.n + b.n;
  const float r = n > 0.f ? fast_rcp(n) : 0.f;
  const float d = b.mean - a.mean;
  const float mean = __fmul_rn(__fadd_rn(__fmul_rn(a.n, a.mean), __fmul_rn(b.n, b.mean)), r);
  return {n, mean, fmaf(__fmul_rn(d, d), __fmul_rn(__fmul_rn(a.n, b.n), r), a.m2 + b.m2)};
}

// Butterfly all-reduce of Stats over aligned groups of `width` lanes (a power of two <= 32) that all hold the same
// values: every lane ends with the same bits. ~14 instructions per level where Chan's ordered merge took ~24 (an
// H200 ncu put these reductions, three per thread, at about a third of the bf16 tier-1 kernel's instructions).
__device__ __forceinline__ Stats warp_allreduce(Stats s, int width = kWarp) {
#pragma unroll
  for (int m = kWarp / 2; m > 0; m >>= 1) {
    if (m < width) {
      const Stats o = {__shfl_xor_sync(0xffffffffu, s.n, m), __shfl_xor_sync(0xffffffffu, s.mean, m),
                       __shfl_xor_sync(0xffffffffu, s.m2, m)};
      s = merge_symmetric(s, o);
    }
  }
  return s;
}

// A vector that straddles channels (L < VEC or L % VEC != 0): walk the channels element by element. Out of
// line, so the common path stays short (instruction fetch is part of a cold kernel's time). It keeps the exact (fp32)
// form for every type: the one straddling shape timed with the 16-bit log2 form in this path too, bf16 (5, 1536, 250),
// ran 2.5 % slower on an H200, and this rare path has nothing to gain.
template <typename T, int VEC>
__device__ __noinline__ Pack<T, VEC> normalize_straddling(Pack<T, VEC> in, int c, int r, int L,
                                                          const T* __restrict__ gamma_g,
                                                          const T* __restrict__ beta_g, float mean, float rstd) {
  Pack<T, VEC> out;
  float g = to_float(__ldg(gamma_g + c)), b = to_float(__ldg(beta_g + c));
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    out.set(k, mish(fmaf(in.get(k) - mean, g * rstd, b)));
    if (++r == L && k + 1 < VEC) {
      r = 0;
      ++c;
      g = to_float(__ldg(gamma_g + c));
      b = to_float(__ldg(beta_g + c));
    }
  }
  return out;
}

// Normalise, affine and mish one vector that lies within one channel, whose gamma/beta are g0, b0. Branch-free:
// where the caller knows no vector straddles a channel (L % VEC == 0), a thread's vectors are straight-line code
// that the scheduler interleaves (with normalize_vec's out-of-line straddling call in between, each vector's
// ~270-cycle chain ran after the previous one: H200 trace, B = 1, 0.14 us per vector per thread). Used by tier 0
// (Push-T graph 1-5 % faster), the shared-memory slice (1.5-3 %), tier 1 (kWhole: 1.3-5.8 %) and 16-bit tier 2 with
// a stash (0.6-1.8 %); fp32 tier 2 and tier 2 without a stash keep normalize_vec (H200 A/B, NOTES.md).
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> normalize_whole(const Pack<T, VEC>& in, float g0, float b0, float mean,
                                                        float rstd) {
  Pack<T, VEC> out;
  const AffineMish<T> f(g0, b0, mean, rstd);
  if constexpr (VEC % 2 == 0) {
#pragma unroll
    for (int k = 0; k < VEC; k += 2) out.set2(k, f(in.get(k)), f(in.get(k + 1)));
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.set(k, f(in.get(k)));
  }
  return out;
}

// Normalise, affine and mish one vector whose first element sits at offset r of channel c (of the group);
// g0, b0 are that channel's gamma/beta, fetched early by the caller.
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> normalize_vec(const Pack<T, VEC>& in, int c, int r, int L, float g0,
                                                      float b0, const T* __restrict__ gamma_g,
                                                      const T* __restrict__ beta_g, float mean, float rstd) {
  if (VEC > 1 && r + VEC > L) return normalize_straddling<T, VEC>(in, c, r, L, gamma_g, beta_g, mean, rstd);
  return normalize_whole<T, VEC>(in, g0, b0, mean, rstd);
}

}  // namespace gn_mish::detail
