// Tier 1 with the slice in shared memory (included by gn_mish.cu): y = mish(group_norm(x) * gamma + beta), x, y
// (B, C, L) fp32/fp16/bf16 in 16-byte vectors, fp32 math. Same cluster, reduction and normalisation as the register
// kernel (gn_mish_tier1.cuh), for one-chunk plans: CTA rank r of the K-CTA cluster of a group copies its slice of
// vectors [r * slice, (r + 1) * slice) straight into shared memory with cp.async (16 bytes per thread-copy, L2 only;
// thread t copies vectors t, t + 256, ... and later reads back only those, so no CTA barrier guards the slice),
// reduces it (two passes over shared memory), exchanges the CTA statistics with its peers (tier 1's one-way
// exchange), then normalises and stores vector by vector (branch-free where L % VEC == 0). CTAs of <= 256 threads.
//
// Differs from the register kernel: x never sits in registers, so a thread needs 40 registers, not 64, and an SM
// holds 6 CTAs of 8 vectors per thread (32 KB of shared memory each) instead of 4: 1.5x the bytes in flight on a
// many-group launch, where CTAs in the load phase are what keeps DRAM busy (H200, cold: fp32 b64_c256_l1024 39.8 ->
// 39.0 us, b64_c512_l1024 80.1 -> 75.4, bf16 b64_c512_l1024 46.4 -> 45.2). kMinCtas = 3 is the instantiation for up to 16 vectors per thread
// (t1_smem = 2: K / 2 CTAs per group, 64 KB each): half the CTAs and per-CTA reductions for the same bytes.
#pragma once

#include "gn_mish_tier1.cuh"

namespace gn_mish::detail {

__device__ __forceinline__ void copy_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}

// This thread's cp.async copies have landed in shared memory.
__device__ __forceinline__ void copy_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

template <typename T, int VEC, int kMinCtas>
__global__ void __launch_bounds__(kSmemSliceThreads, kMinCtas)
    gn_mish_smem_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                        T* __restrict__ y, Tier1Args a) {
  using P = Pack<T, VEC>;
  extern __shared__ __align__(16) float staged[];  // [stage] gamma, then [stage] beta, as fp32; then the slice
  __shared__ Stats warp_part[kSmemSliceThreads / kWarp];
  __shared__ ClusterExchange xchg;
  const int cluster = 1 << a.cluster_shift;
  const int group = int(blockIdx.x) >> a.cluster_shift;
  const int rank = int(blockIdx.x) & (cluster - 1);
  if (cluster > 1) exchange_arm(xchg, cluster);
  const int v_begin = min(a.nv, rank * a.slice_vecs);
  const int v_end = min(a.nv, v_begin + a.slice_vecs);
  const int first = v_begin + int(threadIdx.x), stride = int(blockDim.x);
  const P* src = reinterpret_cast<const P*>(x + int64_t(group) * a.n);
  P* dst = reinterpret_cast<P*>(y + int64_t(group) * a.n);
  const int c_first = (group - int(a.G.div(group)) * int(a.G.d)) * a.cg;
  const Affine<T> af = {a.L, a.stage, int(a.L.div(uint32_t(v_begin * VEC))), staged, gamma + c_first,
                        beta + c_first};
  P* slice = reinterpret_cast<P*>(staged + (2 * a.stage + 3) / 4 * 4) - v_begin;  // indexed by vector

#pragma unroll 4
  for (int v = first; v < v_end; v += stride) copy_async16(slice + v, src + v);
  stage_affine(af, a.cg, staged);
  copy_async_wait_all();
  float sum = 0.f;
  int count = 0;
#pragma unroll 4
  for (int v = first; v < v_end; v += stride) {
    const P p = slice[v];
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum += p.get(k);
    count += VEC;
  }
  Stats mine = {0.f, 0.f, 0.f};
  if (count > 0) {
    const float mean = sum * fast_rcp(float(count));
    float m2 = 0.f;
#pragma unroll 4
    for (int v = first; v < v_end; v += stride) {
      const P p = slice[v];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float d = p.get(k) - mean;
        m2 = fmaf(d, d, m2);
      }
    }
    mine = {float(count), mean, m2};
  }
  const Stats cta = cta_reduce_publish(mine, 1, false, warp_part, nullptr);
  const Stats total = cluster > 1 ? exchange(xchg, cta, cluster, rank) : cta;
  const float mean = total.mean, rstd = fast_rsqrt(total.m2 * a.inv_n + a.eps);
  const int L = int(af.L.d);
  auto affine = [&](int c, float& g0, float& b0) {
    g0 = af.stage ? af.staged[c - af.c_low] : to_float(__ldg(af.gamma_g + c));
    b0 = af.stage ? af.staged[af.stage + c - af.c_low] : to_float(__ldg(af.beta_g + c));
  };
  if (L % VEC == 0) {  // no vector straddles a channel: branch-free bodies the scheduler interleaves
#pragma unroll 4
    for (int v = first; v < v_end; v += stride) {
      float g0, b0;
      affine(int(af.L.div(uint32_t(v * VEC))), g0, b0);
      dst[v] = normalize_whole<T, VEC>(slice[v], g0, b0, mean, rstd);
    }
  } else {
#pragma unroll 2
    for (int v = first; v < v_end; v += stride) {
      const int c = int(af.L.div(uint32_t(v * VEC)));
      float g0, b0;
      affine(c, g0, b0);
      dst[v] = normalize_vec<T, VEC>(slice[v], c, v * VEC - c * L, L, g0, b0, af.gamma_g, af.beta_g, mean, rstd);
    }
  }
}

}  // namespace gn_mish::detail
