// Tier 0 of the fused GroupNorm+Mish kernel (included by gn_mish.cu): groups of <= 256 vectors, every Push-T
// GroupNorm. A CTA holds `groups_per_cta` groups side by side, each owned by `group_threads` threads (a power
// of two from 32, "a warp per group", up to 1024, "a CTA per group"); thread t of a group holds vectors
// t, t + group_threads, ... (ITEMS of them) in registers, with the gamma/beta of each vector's channel loaded
// alongside x. Statistics are exact two-pass in fp32: the group's sum (warp butterfly, then the warps' partials
// through shared memory, added in the same order by every thread) gives the mean, then the sum of squared
// deviations from it gives the variance. One read of x, one write of y.
//
// Differs from the first version (a warp per group, Chan-merged (count, mean, M2) up a butterfly that diverged
// at every level, integer divisions by L per vector): the group's work spreads over up to 1024 threads, so a
// thread runs ~8 x fewer dependent instructions at B = 1; index math uses multiply-high division.
#pragma once

#include "gn_mish_device.cuh"

namespace gn_mish::detail {

struct Tier0Args {
  int num_groups;   // B * G
  FastDiv G;        // groups per sample (group index -> group within the sample)
  int cg;           // channels per group
  FastDiv L;        // channel length (element offset -> channel)
  int n, nv;        // elements and vectors per group
  int tpg_shift;    // log2(threads per group)
  float inv_n, eps;
};

// Sum over the threads of one group (warps_per_group warps, a power of two, from warp local * warps_per_group);
// every thread of the group gets the same bits. part: shared scratch of >= groups_per_cta * wpg floats.
__device__ __forceinline__ float group_sum(float v, int local, int warps_per_group, float* part) {
  v = dpk_warp::sum(v);
  if (warps_per_group == 1) return v;  // uniform over the CTA
  const float* mine = part + local * warps_per_group;
  if ((threadIdx.x & (kWarp - 1)) == 0) part[threadIdx.x / kWarp] = v;
  __syncthreads();
  if (warps_per_group == 2) {
    const float2 q = *reinterpret_cast<const float2*>(mine);
    return q.x + q.y;
  }
  float total = 0.f;
#pragma unroll 1
  for (int i = 0; i < warps_per_group; i += 4) {
    const float4 q = *reinterpret_cast<const float4*>(mine + i);
    total += (q.x + q.y) + (q.z + q.w);
  }
  return total;
}

template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(tier0_max_cta(ITEMS)) gn_mish_group_kernel(const T* __restrict__ x,
                                                                    const T* __restrict__ gamma,
                                                                    const T* __restrict__ beta, T* __restrict__ y,
                                                                    Tier0Args a) {
  using P = Pack<T, VEC>;
  __shared__ __align__(16) float part_sum[kWarp];  // one partial per warp
  __shared__ __align__(16) float part_sq[kWarp];
  const int tpg = 1 << a.tpg_shift;
  const int local = int(threadIdx.x) >> a.tpg_shift;
  const int t = int(threadIdx.x) & (tpg - 1);
  const int group = int(blockIdx.x) * (int(blockDim.x) >> a.tpg_shift) + local;  // < 2^27 (host-checked)
  // A group past the end holds nothing but still takes part in the CTA's barriers.
  const int nv = group < a.num_groups ? a.nv : 0;
  const int g = min(group, a.num_groups - 1);
  const P* src = reinterpret_cast<const P*>(x + int64_t(g) * a.n);
  P* dst = reinterpret_cast<P*>(y + int64_t(g) * a.n);
  const int c_first = (g - int(a.G.div(g)) * int(a.G.d)) * a.cg;
  const T* gamma_g = gamma + c_first;
  const T* beta_g = beta + c_first;
  const int L = int(a.L.d);

  P raw[ITEMS] = {};
  float g0[ITEMS] = {}, b0[ITEMS] = {};
  int chan[ITEMS];
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int v = t + j * tpg;
    if (v < nv) raw[j] = src[v];
  }
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {  // gamma/beta in flight with x, not after the reduction
    const int v = t + j * tpg;
    chan[j] = int(a.L.div(uint32_t(v * VEC)));
    if (v < nv) {
      g0[j] = to_float(__ldg(gamma_g + chan[j]));
      b0[j] = to_float(__ldg(beta_g + chan[j]));
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    if (t + j * tpg < nv) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum += raw[j].get(k);
    }
  }
  const int wpg = tpg / kWarp;
  const float mean = group_sum(sum, local, wpg, part_sum) * a.inv_n;
  float sq = 0.f;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    if (t + j * tpg < nv) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float d = raw[j].get(k) - mean;
        sq = fmaf(d, d, sq);
      }
    }
  }
  const float rstd = fast_rsqrt(group_sum(sq, local, wpg, part_sq) * a.inv_n + a.eps);
  if (L % VEC == 0) {  // no vector straddles a channel: branch-free bodies the scheduler interleaves
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const int v = t + j * tpg;
      if (v < nv) dst[v] = normalize_whole<T, VEC>(raw[j], g0[j], b0[j], mean, rstd);
    }
  } else {
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const int v = t + j * tpg;
      if (v < nv) {
        const int r = v * VEC - chan[j] * L;
        dst[v] = normalize_vec<T, VEC>(raw[j], chan[j], r, L, g0[j], b0[j], gamma_g, beta_g, mean, rstd);
      }
    }
  }
}

}  // namespace gn_mish::detail
