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
// 39.0 us, b64_c512_l1024 80.1 -> 75.4, bf16 b64_c512_l1024 46.4 -> 45.2). kMinCtas = 3 is the instantiation for up
// to 16 vectors per thread (t1_smem = 2: K / 2 CTAs per group, 64 KB each): half the CTAs and per-CTA reductions for
// the same bytes.
#pragma once

#include "gn_mish_tier1.cuh"

namespace gn_mish::detail {

template <typename T, int VEC, int kMinCtas>
__global__ void __launch_bounds__(kSmemSliceThreads, kMinCtas)
    gn_mish_smem_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                        T* __restrict__ y, Tier1Args a) {
  using P = Pack<T, VEC>;
  extern __shared__ __align__(16) float staged[];  // [stage] gamma, then [stage] beta, as fp32; then the slice
  __shared__ Stats warp_part[kSmemSliceThreads / kWarp];
  __shared__ ClusterExchange xchg;
  const ClusterSlice<T, VEC> cs = cluster_slice<T, VEC>(a, x, gamma, beta, y, staged);
  if (cs.cluster > 1) exchange_arm(xchg, cs.cluster);
  const Affine<T>& af = cs.af;
  const int first = cs.v_begin + int(threadIdx.x), stride = int(blockDim.x), v_end = cs.v_end;
  P* slice = after_staged<P>(staged, a.stage) - cs.v_begin;  // indexed by vector

#pragma unroll 4
  for (int v = first; v < v_end; v += stride) dpk_async::copy16(slice + v, cs.src + v);
  stage_affine(af, a.cg, staged);
  dpk_async::wait_all();
  const Stats mine = two_pass_stats<VEC>([&](auto&& f) {
#pragma unroll 4
    for (int v = first; v < v_end; v += stride) f(slice[v]);
  });
  const Stats cta = cta_reduce_publish(mine, 1, false, warp_part, nullptr);
  const Stats total = cs.cluster > 1 ? exchange(xchg, cta, cs.cluster, cs.rank) : cta;
  const float mean = total.mean, rstd = fast_rsqrt(total.m2 * a.inv_n + a.eps);
  const int L = int(af.L.d);
  if (L % VEC == 0) {  // no vector straddles a channel: branch-free bodies the scheduler interleaves
#pragma unroll 4
    for (int v = first; v < v_end; v += stride) {
      const int c = int(af.L.div(uint32_t(v * VEC)));
      cs.dst[v] = normalize_whole<T, VEC>(slice[v], af.gamma(c), af.beta(c), mean, rstd);
    }
  } else {
#pragma unroll 2
    for (int v = first; v < v_end; v += stride) {
      const int c = int(af.L.div(uint32_t(v * VEC)));
      cs.dst[v] = normalize_vec<T, VEC>(slice[v], c, v * VEC - c * L, L, af.gamma(c), af.beta(c), af.gamma_g,
                                        af.beta_g, mean, rstd);
    }
  }
}

}  // namespace gn_mish::detail
