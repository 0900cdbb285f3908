// Bisect of the fused tier-1 kernel against the ladder's L6 (gn_mish_ladder.cu): the cluster kernel's body with each of
// three parts either as gn_mish_tier1.cuh has it (kRealAffine: gamma/beta staged by stage_affine and looked up per
// vector through Affine; kRealLoad: load_slice with its chunk loop, guards and counted two-pass stats; kRealNorm:
// normalize_slice) or as the ladder writes it (fixed counts, no guards, gamma/beta per item). fp32, 16-byte vectors,
// 4 vectors per thread, one chunk, whole vectors. No torch headers (gn_mish_bisect.cpp launches it).
#include <cuda_runtime.h>

#include "gn_mish_tier1.cuh"

namespace {
using namespace gn_mish;
using namespace gn_mish::detail;

template <bool kRealAffine, bool kRealLoad, bool kRealNorm>
__global__ void __launch_bounds__(kMaxThreads, 1)
    bisect(const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
           float* __restrict__ y, Tier1Args a) {
  using P = Pack<float, 4>;
  constexpr int ITEMS = 4;
  extern __shared__ __align__(16) float staged[];
  __shared__ Stats warp_part[kMaxThreads / kWarp];
  __shared__ ClusterExchange xchg;
  const ClusterSlice<float, 4> cs = cluster_slice<float, 4>(a, x, gamma, beta, y, staged);
  if (cs.cluster > 1) exchange_arm(xchg, cs.cluster);
  const int chunk = int(blockDim.x) * ITEMS;
  const SliceView s = {cs.v_begin, cs.v_end, int(blockDim.x), (cs.v_end - cs.v_begin + chunk - 1) / chunk, 0};
  const int first = cs.v_begin + int(threadIdx.x);
  P raw[ITEMS];
  Stats acc;
  if constexpr (kRealLoad) {
    acc = load_slice<float, 4, ITEMS, false>(raw, cs.src, s, nullptr, false, [&] {
      if (kRealAffine) {
        stage_affine(cs.af, a.cg, staged);
      } else if (threadIdx.x < 8) {
        staged[threadIdx.x] = __ldg(gamma + (int(blockIdx.x) * 8 + threadIdx.x) % 256);
      }
    });
  } else {
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) raw[j] = cs.src[first + j * int(blockDim.x)];
    if (kRealAffine) {
      stage_affine(cs.af, a.cg, staged);
    } else if (threadIdx.x < 8) {
      staged[threadIdx.x] = __ldg(gamma + (int(blockIdx.x) * 8 + threadIdx.x) % 256);
    }
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) sum += raw[j].get(0) + raw[j].get(1) + raw[j].get(2) + raw[j].get(3);
    const float mean = sum * (1.f / 16.f);
    float m2 = 0.f;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
#pragma unroll
      for (int k = 0; k < 4; ++k) m2 = fmaf(raw[j].get(k) - mean, raw[j].get(k) - mean, m2);
    }
    acc = {16.f, mean, m2};
  }
  const Stats cta = cta_reduce_publish(acc, 1, false, warp_part, nullptr);
  const Stats total = cs.cluster > 1 ? exchange(xchg, cta, cs.cluster, cs.rank) : cta;
  const float rstd = fast_rsqrt(total.m2 * a.inv_n + a.eps);
  if constexpr (kRealNorm) {
    normalize_slice<float, 4, ITEMS, false, true>(raw, cs.src, cs.dst, s, nullptr, cs.af, total.mean, rstd, false);
  } else {
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const int v = first + j * int(blockDim.x);
      float g, b;
      if (kRealAffine) {
        const int c = int(cs.af.L.div(uint32_t(v * 4)));
        g = cs.af.gamma(c);
        b = cs.af.beta(c);
      } else {
        g = staged[j];
        b = staged[4 + j];
      }
      cs.dst[v] = normalize_whole<float, 4>(raw[j], g, b, total.mean, rstd);
    }
  }
}

template <bool A, bool L, bool N>
cudaError_t go(const float* x, const float* gamma, const float* beta, float* y, const Tier1Args& a, int grid,
               int threads, int smem, cudaStream_t stream) {
  const auto kernel = bisect<A, L, N>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1u << a.cluster_shift;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, x, gamma, beta, y, a);
}
}  // namespace

// B = 1, G = 8, C channels of length L (L % 4 == 0), clusters of k CTAs of `threads` threads holding 4 vectors each.
cudaError_t bisect_launch(int variant, const float* x, const float* gamma, const float* beta, float* y, int C, int L,
                          int k, int threads, cudaStream_t stream) {
  const int groups = 8, cg = C / groups, n = cg * L, nv = n / 4, slice = nv / k;
  if (slice != threads * 4 || nv % k != 0) return cudaErrorInvalidValue;
  int shift = 0;
  while ((1 << shift) < k) ++shift;
  const int stage = std::min(cg, (slice * 4 - 1) / L + 2);
  const Tier1Args a = {groups, FastDiv(uint32_t(groups)), cg, FastDiv(uint32_t(L)), n, nv, slice, shift, stage,
                       float(1.0 / n), 1e-5f, 0};
  const int grid = groups * k, smem = stage * 2 * int(sizeof(float));
  switch (variant) {  // bits: 4 real affine, 2 real load, 1 real normalise
    case 7: return go<true, true, true>(x, gamma, beta, y, a, grid, threads, smem, stream);
    case 6: return go<true, true, false>(x, gamma, beta, y, a, grid, threads, smem, stream);
    case 5: return go<true, false, true>(x, gamma, beta, y, a, grid, threads, smem, stream);
    case 4: return go<true, false, false>(x, gamma, beta, y, a, grid, threads, smem, stream);
    case 2: return go<false, true, false>(x, gamma, beta, y, a, grid, threads, smem, stream);
    case 0: return go<false, false, false>(x, gamma, beta, y, a, grid, threads, smem, stream);
    default: return cudaErrorInvalidValue;
  }
}
