// Tier 1, prefetching (Limits::t1_prefetch; included by gn_mish.cu): a streaming CTA of the cluster design
// (gn_mish_tier1.cuh) with two chunks in flight instead of one. Even chunks load into registers as there; odd
// chunks go into a one-chunk shared-memory buffer with cp.async (16 bytes per vector, no registers), issued before
// the previous chunk is reduced; a buffered chunk's statistics are read from shared memory. Each thread reads back
// only the buffer rows it copied (buf[j * blockDim + thread]), so no CTA barrier guards the buffer.
//   x, y: (B, C, L) 16-byte vectors of T (fp32 x4, fp16/bf16 x8); slice and cluster as the cluster kernel.
//
// Differs from gn_mish_cluster_kernel: the next chunk's loads are already in flight while a chunk is reduced (a
// cluster CTA issues them only after), so a CTA alone keeps ~2 chunks of DRAM reads outstanding; after the
// reduction the last even chunk (registers) and the last odd one (buffer) are still on chip, and only the others
// are re-read, newest first.
#pragma once

#include "gn_mish_tier1.cuh"

namespace gn_mish::detail {

// Asynchronous 16-byte global -> shared copies of this thread's vectors of one chunk, one commit group.
template <typename P, int ITEMS>
__device__ __forceinline__ void copy_chunk_async(P* buf, const P* __restrict__ src, int first, int stride, int end) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int v = first + j * stride;
    if (v < end) {
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(buf + j * stride));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src + v) : "memory");
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
#else
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    if (first + j * stride < end) buf[j * stride] = src[first + j * stride];
  }
#endif
}

__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// Two-pass statistics of this thread's buffered vectors (thread_stats, reading shared memory twice instead of
// holding the chunk in registers: the registers hold the next chunk in flight).
template <typename T, int VEC, int ITEMS>
__device__ __forceinline__ Stats buffer_stats(const Pack<T, VEC>* buf, int first, int stride, int end) {
  float sum = 0.f;
  int count = 0;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    if (first + j * stride < end) {
      const Pack<T, VEC> p = buf[j * stride];
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum += p.get(k);
      count += VEC;
    }
  }
  if (count == 0) return {0.f, 0.f, 0.f};
  const float mean = sum * fast_rcp(float(count));
  float m2 = 0.f;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    if (first + j * stride < end) {
      const Pack<T, VEC> p = buf[j * stride];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float d = p.get(k) - mean;
        m2 = fmaf(d, d, m2);
      }
    }
  }
  return {float(count), mean, m2};
}

template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads, 1)
    gn_mish_prefetch_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                            T* __restrict__ y, Tier1Args a) {
  using P = Pack<T, VEC>;
  extern __shared__ __align__(16) float staged[];  // [stage] gamma, [stage] beta (fp32), then the chunk buffer
  __shared__ Stats warp_part[kMaxThreads / kWarp];
  __shared__ Stats cta_part;
  const int cluster = 1 << a.cluster_shift;
  const int group = int(blockIdx.x) >> a.cluster_shift;
  const int rank = int(blockIdx.x) & (cluster - 1);
  const int v_begin = min(a.nv, rank * a.slice_vecs);
  const int v_end = min(a.nv, v_begin + a.slice_vecs);
  const int stride = blockDim.x;
  const int chunk = stride * ITEMS;
  const int chunks = (v_end - v_begin + chunk - 1) / chunk;
  const P* src = reinterpret_cast<const P*>(x + int64_t(group) * a.n);
  P* dst = reinterpret_cast<P*>(y + int64_t(group) * a.n);
  const int c_first = (group - int(a.G.div(group)) * int(a.G.d)) * a.cg;
  const int c_low = int(a.L.div(uint32_t(v_begin * VEC)));
  P* buf = reinterpret_cast<P*>(staged + (2 * a.stage + 3) / 4 * 4) + threadIdx.x;
  const int first0 = v_begin + int(threadIdx.x);

  P raw[ITEMS];
  load_chunk(raw, src, first0, stride, v_end);
  if (chunks > 1) copy_chunk_async<P, ITEMS>(buf, src, first0 + chunk, stride, v_end);
  for (int i = threadIdx.x; i < a.stage && c_low + i < a.cg; i += stride) {  // while both are in flight
    staged[i] = to_float(__ldg(gamma + c_first + c_low + i));
    staged[a.stage + i] = to_float(__ldg(beta + c_first + c_low + i));
  }
  Stats acc = {0.f, 0.f, 0.f};
  for (int ci = 0; ci < chunks; ++ci) {
    const int first = first0 + ci * chunk;
    if ((ci & 1) == 0) {
      acc = merge(acc, thread_stats(raw, first, stride, v_end));
      if (ci + 2 < chunks) load_chunk(raw, src, first + 2 * chunk, stride, v_end);
    } else {
      copy_async_wait();
      acc = merge(acc, buffer_stats<T, VEC, ITEMS>(buf, first, stride, v_end));
      if (ci + 2 < chunks) copy_chunk_async<P, ITEMS>(buf, src, first + 2 * chunk, stride, v_end);
    }
  }
  const Stats total = cluster_collect(cta_reduce_publish(acc, cluster, false, warp_part, &cta_part), cluster,
                                     &cta_part);
  const StoreCtx<T> ctx = {a.L, c_low, a.stage, staged, gamma + c_first, beta + c_first, total.mean,
                           fast_rsqrt(total.m2 * a.inv_n + a.eps), sizeof(T) == 4 && chunks > 1};
  const int even_last = (chunks - 1) & ~1, odd_last = chunks < 2 ? -1 : ((chunks - 1) & 1 ? chunks - 1 : chunks - 2);
  if (chunks > 0) normalize_store<T, VEC, ITEMS>(raw, dst, first0 + even_last * chunk, stride, v_end, ctx);
  for (int ci = chunks - 1; ci >= 0; --ci) {  // the buffered chunk, then the re-reads, newest first
    if (ci == even_last) continue;
    const int first = first0 + ci * chunk;
    if (ci == odd_last) {
#pragma unroll
      for (int j = 0; j < ITEMS; ++j) {
        if (first + j * stride < v_end) raw[j] = buf[j * stride];
      }
    } else {
      load_chunk(raw, src, first, stride, v_end);
    }
    normalize_store<T, VEC, ITEMS>(raw, dst, first, stride, v_end, ctx);
  }
  if (cluster > 1) cluster_wait();  // peers have finished reading this CTA's partial
}

}  // namespace gn_mish::detail
