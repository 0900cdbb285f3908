// Phase ladder of the B = 1 tier-1 plan (8-CTA clusters of 256 threads, 4 fp32 vectors per thread, 1 MB): the
// same load/store pattern with one more of the fused kernel's phases per level, to see where its time over a copy
// goes. L0 copy; L1 copy launched as clusters; L2 + the thread's two-pass stats on the stored values; L3 + the
// CTA reduction (gn_mish cta_reduce_publish); L4 + the cluster exchange (exchange_arm / exchange); L5 + affine and
// mish (the fused kernel without staged gamma/beta); L6 + gamma/beta of the CTA's channels staged in shared memory
// from global memory (cold) while x is in flight, as the fused kernel does. VARIANT (launch setup, per instantiation,
// since function attributes stick): 0 none; 1 MaxDynamicSharedMemorySize = the opt-in maximum and 64 B of dynamic
// shared memory per launch (what gn_mish.cu does); 2 the attribute, no dynamic shared memory; 3 64 B without the
// attribute; 4 as 1 plus a preferred carveout of 0 %. No torch headers (the binding launches it).
#include <cuda_runtime.h>

#include "gn_mish_tier1.cuh"

namespace {
using namespace gn_mish;
using namespace gn_mish::detail;

template <int LEVEL, int VARIANT>
__global__ void __launch_bounds__(1024, 1) ladder(const float4* __restrict__ x, float4* __restrict__ y, int kshift,
                                                  int slice, const float* __restrict__ gb) {
  extern __shared__ float staged[];
  __shared__ Stats warp_part[kMaxThreads / kWarp];
  __shared__ ClusterExchange xchg;
  const int K = 1 << kshift;
  if (LEVEL >= 4) exchange_arm(xchg, K);
  const int base = int(blockIdx.x) * slice + int(threadIdx.x);
  float4 r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = x[base + j * int(blockDim.x)];
  if (LEVEL >= 6 && threadIdx.x < 8) staged[threadIdx.x] = __ldg(gb + (int(blockIdx.x) * 8 + threadIdx.x) % 512);
  float shift = 0.f, scale = 1.f;
  if (LEVEL >= 2) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) s += r[j].x + r[j].y + r[j].z + r[j].w;
    const float mean = s * (1.f / 16.f);
    float m2 = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      m2 = fmaf(r[j].x - mean, r[j].x - mean, m2);
      m2 = fmaf(r[j].y - mean, r[j].y - mean, m2);
      m2 = fmaf(r[j].z - mean, r[j].z - mean, m2);
      m2 = fmaf(r[j].w - mean, r[j].w - mean, m2);
    }
    Stats st = {16.f, mean, m2};
    if (LEVEL >= 3) st = cta_reduce_publish(st, 1, false, warp_part, nullptr);
    if (LEVEL >= 4) st = exchange(xchg, st, K, int(blockIdx.x) & (K - 1));
    shift = st.mean;
    scale = fast_rsqrt(st.m2 / st.n + 1e-5f);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float4 o;
    if (LEVEL >= 5) {
      const float g = LEVEL >= 6 ? staged[j] * scale : scale, b = LEVEL >= 6 ? staged[4 + j] : 0.1f;
      o.x = mish(fmaf(r[j].x - shift, g, b));
      o.y = mish(fmaf(r[j].y - shift, g, b));
      o.z = mish(fmaf(r[j].z - shift, g, b));
      o.w = mish(fmaf(r[j].w - shift, g, b));
    } else {
      o = make_float4((r[j].x - shift) * scale, (r[j].y - shift) * scale, (r[j].z - shift) * scale,
                      (r[j].w - shift) * scale);
    }
    y[base + j * int(blockDim.x)] = o;
  }
}

template <int LEVEL, int VARIANT>
cudaError_t go(int cluster, const void* x, void* y, const float* gb, int blocks, int threads, int slice,
               cudaStream_t stream) {
  const auto kernel = ladder<LEVEL, VARIANT>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (VARIANT == 1 || VARIANT == 2 || VARIANT == 4) {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaFuncAttributes fa;
    cudaFuncGetAttributes(&fa, kernel);
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - int(fa.sharedSizeBytes));
  }
  if (VARIANT == 4) cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 0);
  cudaLaunchConfig_t cfg = {};
  cfg.dynamicSmemBytes = (VARIANT == 1 || VARIANT == 3 || VARIANT == 4 || LEVEL >= 6) ? 64 : 0;
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  if (cluster > 1) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = unsigned(cluster);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  int kshift = 0;
  while ((1 << kshift) < cluster) ++kshift;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<const float4*>(x), static_cast<float4*>(y), kshift, slice, gb);
}
}  // namespace

cudaError_t ladder_launch(int level, int variant, int cluster, const void* x, void* y, const float* gb, int blocks,
                          int threads, int slice, cudaStream_t stream) {
#define LADDER_CASE(L, V) \
  if (level == L && variant == V) return go<L, V>(cluster, x, y, gb, blocks, threads, slice, stream);
  LADDER_CASE(0, 0) LADDER_CASE(2, 0) LADDER_CASE(3, 0) LADDER_CASE(4, 0) LADDER_CASE(5, 0)
  LADDER_CASE(0, 1) LADDER_CASE(5, 1) LADDER_CASE(5, 2) LADDER_CASE(5, 3) LADDER_CASE(5, 4)
  LADDER_CASE(6, 0) LADDER_CASE(6, 1) LADDER_CASE(6, 4)
#undef LADDER_CASE
  return cudaErrorInvalidValue;
}
