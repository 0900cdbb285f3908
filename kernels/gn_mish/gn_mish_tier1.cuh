// Tier 1 of the fused GroupNorm+Mish kernel (included by gn_mish.cu): groups larger than tier 0's. A
// thread-block cluster of K CTAs (K <= 16, sm_90) per group; CTA rank r holds slice r of the group in
// registers in chunks of blockDim * ITEMS vectors (thread t: chunk vectors t, t + blockDim, ...). Per-thread
// two-pass (count, mean, M2) are merged up warp -> CTA -> cluster (symmetric merges in butterflies; the K CTA
// partials pushed into every peer's shared memory with st.async), so x is read from DRAM once; beyond the
// cluster's register capacity the slice streams: chunks are merged as they are read, the last stays in registers
// and the others are re-read newest first (mostly L2 hits).
//
// Differs from the first version: gamma/beta of the slice's channels are staged in shared memory while x is in
// flight (no dependent L2 round trip between the cluster barrier and the stores); the CTA partials travel one way
// (st.async into each peer's slot, counted on the peer's mbarrier; the cluster barrier only publishes the mbarriers
// at kernel start), so no release fence, no remote read and no barrier before exit sit between loads and stores
// (the persistent kernel keeps the split barrier: cta_reduce_publish / cluster_collect);
// no integer division in the index math; the butterfly no longer diverges; a streaming fp32 CTA loads its last
// chunk and stores y with L2 evict_first, so the chunks it re-reads stay in L2; with a stash (`kStash`: plans whose
// re-reads outgrow the L2), a streaming CTA keeps the first `stash` vectors per thread of its oldest chunks in
// shared memory (dynamic, after the staged gamma/beta) and re-reads only the rest; where no vector straddles a
// channel (L % VEC == 0) the kWhole kernels normalise whole vectors without a branch between them.
#pragma once

#include <cooperative_groups.h>

#include "async_copy.cuh"  // kernels/_cuda/: mbarrier, cp.async, bulk copies
#include "gn_mish_device.cuh"

namespace gn_mish::detail {

namespace cg = cooperative_groups;

struct Tier1Args {
  int num_groups;     // B * G
  FastDiv G;          // groups per sample
  int cg;             // channels per group
  FastDiv L;          // channel length
  int n, nv;          // elements and vectors per group
  int slice_vecs;     // vectors per CTA
  int cluster_shift;  // log2(CTAs per group)
  int stage;          // channels staged in shared memory per CTA (0: gamma/beta read through L1)
  float inv_n, eps;
  int stash;          // streaming: vectors per thread (slot ci * ITEMS + j) kept in shared memory, not re-read
};

// Cluster barrier halves (sm_90). arrive(release): this thread's earlier writes become visible to the cluster
// threads that then pass wait(acquire); arrive(relaxed) only counts.
template <bool kRelease>
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kRelease) {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  } else {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Two-pass statistics of a thread's vectors: for_each(f) calls f(pack) on each of them (it is run twice).
template <int VEC, typename ForEach>
__device__ __forceinline__ Stats two_pass_stats(ForEach&& for_each) {
  float sum = 0.f;
  int count = 0;
  for_each([&](const auto& p) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum += p.get(k);
    count += VEC;
  });
  if (count == 0) return {0.f, 0.f, 0.f};
  const float mean = sum * fast_rcp(float(count));
  float m2 = 0.f;
  for_each([&](const auto& p) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = p.get(k) - mean;
      m2 = fmaf(d, d, m2);
    }
  });
  return {float(count), mean, m2};
}

// Two-pass statistics of this thread's valid vectors first + j*stride < end held in registers.
template <typename T, int VEC, int ITEMS>
__device__ __forceinline__ Stats thread_stats(const Pack<T, VEC> (&raw)[ITEMS], int first, int stride, int end) {
  return two_pass_stats<VEC>([&](auto&& f) {
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      if (first + j * stride < end) f(raw[j]);
    }
  });
}

// 16-byte packs with an L2 eviction hint (ld/st .cs: evict first); other sizes plainly.
template <typename P>
__device__ __forceinline__ P load_evict_first(const P* p) {
  if constexpr (sizeof(P) == 16) {
    const uint4 bits = __ldcs(reinterpret_cast<const uint4*>(p));
    P out;
    __builtin_memcpy(&out, &bits, 16);
    return out;
  } else {
    return *p;
  }
}

template <typename P>
__device__ __forceinline__ void store_evict_first(P* p, const P& v) {
  if constexpr (sizeof(P) == 16) {
    uint4 bits;
    __builtin_memcpy(&bits, &v, 16);
    __stcs(reinterpret_cast<uint4*>(p), bits);
  } else {
    *p = v;
  }
}

// evict_first: the chunk is never read again (a streaming CTA's last chunk stays in registers), so its lines
// should leave L2 before the earlier chunks that the store phase re-reads.
// evict_below: vectors j < evict_below likewise (the slots a tier-2 CTA stashes in shared memory).
template <typename T, int VEC, int ITEMS>
__device__ __forceinline__ void load_chunk(Pack<T, VEC> (&raw)[ITEMS], const Pack<T, VEC>* __restrict__ src,
                                           int first, int stride, int end, bool evict_first = false,
                                           int evict_below = 0) {
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int v = first + j * stride;
    if (v < end) raw[j] = evict_first || j < evict_below ? load_evict_first(src + v) : src[v];
  }
}

// Reduction of the group's statistics, in two halves so that a persistent CTA can issue its next loads between
// them. Half 1: the CTA's statistics in every thread (warp butterflies, then every warp merges the warps'
// partials: identical bits everywhere); with a cluster (K > 1) thread 0 publishes them in cta_part and every
// thread arrives on the cluster barrier (warp 0 with release: it wrote). wait_previous: first wait on the
// previous group's second phase, so that no peer still reads cta_part. warp_part: >= 32 shared Stats.
__device__ __forceinline__ Stats cta_reduce_publish(Stats s, int cluster, bool wait_previous, Stats* warp_part,
                                                    Stats* cta_part) {
  const int lane = threadIdx.x & (kWarp - 1);
  s = warp_allreduce(s);
  if (lane == 0) warp_part[threadIdx.x / kWarp] = s;
  __syncthreads();  // also publishes the staged gamma/beta
  const int warps = int(blockDim.x / kWarp);
  Stats t;
  if ((warps & (warps - 1)) == 0) {  // every aligned group of `warps` lanes holds all the warps' partials
    t = warp_allreduce(warp_part[lane & (warps - 1)], warps);
  } else {
    t = warp_allreduce(lane < warps ? warp_part[lane] : Stats{0.f, 0.f, 0.f});
  }
  if (cluster > 1) {
    if (wait_previous) cluster_wait();
    if (threadIdx.x == 0) *cta_part = t;
    if (threadIdx.x < kWarp) {
      cluster_arrive<true>();
    } else {
      cluster_arrive<false>();  // no writes to publish: do not wait for this thread's stores or loads
    }
  }
  return t;
}

// One-shot exchange of the K CTAs' statistics in a cluster (sm_90), for kernels that handle one group per CTA:
// no release fence and no distributed-shared-memory round trip after the barrier (H200 trace, B = 1: the CTA
// reduction with its release arrive took 0.8 us, the remote reads and merge after the wait 0.45 us). At kernel
// start thread 0 arms a local mbarrier for K x 16 bytes and every thread arrives on the cluster barrier; only after
// the slice has loaded and the CTA has reduced does it wait there (every peer's mbarrier is now initialised), then
// lane r of warp 0 pushes the CTA's (n, mean, M2) into slot `rank` of CTA r with st.async, which counts the bytes
// on r's mbarrier; every thread waits on its own mbarrier and merges the K slots from local shared memory. A CTA
// exits only after all K pushes into it have landed, and no CTA reads another's memory: no barrier before exit.
struct ClusterExchange {
  unsigned long long bar;       // mbarrier: one arrival (the arming) plus K x 16 bytes
  float4 parts[kMaxCluster];    // slot r: (n, mean, M2, 0) of rank r
};

__device__ __forceinline__ void exchange_arm(ClusterExchange& x, int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    const unsigned bar = dpk_async::smem_addr(&x.bar);
    dpk_async::mbar_init(bar);
    dpk_async::mbar_arrive_expect_tx(bar, cluster * 16);
    dpk_async::fence_mbar_init();
  }
  cluster_arrive<false>();
#endif
}

__device__ __forceinline__ Stats exchange(ClusterExchange& x, const Stats& cta, int cluster, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cluster_wait();
  if (int(threadIdx.x) < cluster) {
    unsigned slot, bar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(slot) : "r"(dpk_async::smem_addr(&x.parts[rank])),
                 "r"(threadIdx.x));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(dpk_async::smem_addr(&x.bar)),
                 "r"(threadIdx.x));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(slot), "f"(cta.n), "f"(cta.mean), "f"(cta.m2), "f"(0.f), "r"(bar) : "memory");
  }
  dpk_async::mbar_wait_first_phase<true>(dpk_async::smem_addr(&x.bar));
  const float4 q = x.parts[threadIdx.x & (cluster - 1)];  // K: a power of two
  return warp_allreduce(Stats{q.x, q.y, q.z}, cluster);
#else
  __trap();  // the host launches clusters only on sm_90+
  return cta;
#endif
}

// Half 2: the group's statistics from the CTA's (cta, from half 1). With a cluster: wait for every CTA's
// cta_part, merge the K of them in rank order through distributed shared memory (every warp: identical bits),
// then arrive once more; the caller waits on that second phase (cluster_wait) before exiting or before its next
// half 1 (wait_previous), so no CTA's shared memory is reused or gone while a peer still reads it.
__device__ __forceinline__ Stats cluster_collect(Stats cta, int cluster, Stats* cta_part) {
  if (cluster == 1) return cta;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & (kWarp - 1);
  cluster_wait();
  cg::cluster_group cl = cg::this_cluster();
  const Stats u = warp_allreduce(*cl.map_shared_rank(cta_part, lane & (cluster - 1)), cluster);  // K: a power of 2
  cluster_arrive<false>();  // the remote reads are done: their values are in u
  return u;
#else
  __trap();  // the host launches clusters only on sm_90+
  return cta;
#endif
}

// A CTA's slice of its group: vectors [v_begin, v_end) in `chunks` register chunks of stride * ITEMS vectors
// (thread t: vectors first + j * stride of chunk ci, first = v_begin + ci * stride * ITEMS + t); with a stash,
// slot ci * ITEMS + j < stash of every chunk but the last is also kept in shared memory, each thread's own slots
// at stash[slot * stride] (16-byte rows, conflict-free; a thread reads back only what it wrote: no barrier).
struct SliceView {
  int v_begin, v_end, stride, chunks, stash;
};

// Where a vector's gamma/beta come from: the `stage` channels from c_low staged in shared memory as fp32
// (gamma, then beta), or read through L1 when stage = 0.
template <typename T>
struct Affine {
  FastDiv L;
  int stage, c_low;
  const float* staged;
  const T* gamma_g;
  const T* beta_g;
  __device__ __forceinline__ float gamma(int c) const {
    return stage ? staged[c - c_low] : to_float(__ldg(gamma_g + c));
  }
  __device__ __forceinline__ float beta(int c) const {
    return stage ? staged[stage + c - c_low] : to_float(__ldg(beta_g + c));
  }
};

// The 16-byte vectors after the staged gamma/beta in dynamic shared memory (the stash, or the whole slice).
template <typename P>
__device__ __forceinline__ P* after_staged(float* staged, int stage) {
  return reinterpret_cast<P*>(staged + stash_offset(stage) / int(sizeof(float)));
}

// A cluster kernel's CTA: its group, rank, slice [v_begin, v_end) and the group's x, y and affine.
template <typename T, int VEC>
struct ClusterSlice {
  int cluster, group, rank, v_begin, v_end;
  const Pack<T, VEC>* src;
  Pack<T, VEC>* dst;
  Affine<T> af;
};

template <typename T, int VEC>
__device__ __forceinline__ ClusterSlice<T, VEC> cluster_slice(const Tier1Args& a, const T* x, const T* gamma,
                                                              const T* beta, T* y, float* staged) {
  ClusterSlice<T, VEC> c;
  c.cluster = 1 << a.cluster_shift;
  c.group = int(blockIdx.x) >> a.cluster_shift;
  c.rank = int(blockIdx.x) & (c.cluster - 1);  // == cluster block rank for (K, 1, 1) clusters
  c.v_begin = min(a.nv, c.rank * a.slice_vecs);
  c.v_end = min(a.nv, c.v_begin + a.slice_vecs);
  c.src = reinterpret_cast<const Pack<T, VEC>*>(x + int64_t(c.group) * a.n);
  c.dst = reinterpret_cast<Pack<T, VEC>*>(y + int64_t(c.group) * a.n);
  const int c_first = (c.group - int(a.G.div(c.group)) * int(a.G.d)) * a.cg;
  c.af = {a.L, a.stage, int(a.L.div(uint32_t(c.v_begin * VEC))), staged, gamma + c_first, beta + c_first};
  return c;
}

// Pass 1: load the slice chunk by chunk, merging the thread's statistics; the last chunk stays in raw.
// stage_affine() runs while the first chunk is in flight; evict_last: load the last chunk with evict_first;
// evict_stashed: load the stashed slots with evict_first.
template <typename T, int VEC, int ITEMS, bool kStash, typename StageAffine>
__device__ __forceinline__ Stats load_slice(Pack<T, VEC> (&raw)[ITEMS], const Pack<T, VEC>* __restrict__ src,
                                            const SliceView& s, Pack<T, VEC>* stash, bool evict_last,
                                            StageAffine&& stage_affine, bool evict_stashed = false) {
  Stats acc = {0.f, 0.f, 0.f};
  const int chunk = s.stride * ITEMS;
  for (int ci = 0; ci < s.chunks; ++ci) {
    const int first = s.v_begin + ci * chunk + int(threadIdx.x);
    load_chunk(raw, src, first, s.stride, s.v_end, evict_last && ci == s.chunks - 1,
               evict_stashed ? s.stash - ci * ITEMS : 0);
    if (ci == 0) stage_affine();
    acc = merge(acc, thread_stats(raw, first, s.stride, s.v_end));
    if (kStash && ci < s.chunks - 1) {
#pragma unroll
      for (int j = 0; j < ITEMS; ++j) {
        if (ci * ITEMS + j < s.stash && first + j * s.stride < s.v_end) stash[(ci * ITEMS + j) * s.stride] = raw[j];
      }
    }
  }
  return acc;
}

// Pass 2: normalise, affine, mish and store the slice, newest chunk first: the last is still in raw, stashed
// slots come from shared memory, the rest is re-read (mostly from L2). evict: store y with evict_first.
// kWhole: no vector straddles a channel (L % VEC == 0): normalize_whole, no branch between a thread's vectors.
template <typename T, int VEC, int ITEMS, bool kStash, bool kWhole = false>
__device__ __forceinline__ void normalize_slice(Pack<T, VEC> (&raw)[ITEMS], const Pack<T, VEC>* __restrict__ src,
                                                Pack<T, VEC>* __restrict__ dst, const SliceView& s,
                                                const Pack<T, VEC>* stash, const Affine<T>& af, float mean,
                                                float rstd, bool evict) {
  using P = Pack<T, VEC>;
  const int chunk = s.stride * ITEMS;
  const int L = int(af.L.d);
  for (int ci = s.chunks - 1; ci >= 0; --ci) {
    const int first = s.v_begin + ci * chunk + int(threadIdx.x);
    if (kStash && ci != s.chunks - 1) {
#pragma unroll
      for (int j = 0; j < ITEMS; ++j) {
        const int v = first + j * s.stride;
        if (v < s.v_end) raw[j] = ci * ITEMS + j < s.stash ? stash[(ci * ITEMS + j) * s.stride] : src[v];
      }
    } else if (ci != s.chunks - 1) {
      load_chunk(raw, src, first, s.stride, s.v_end);
    }
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const int v = first + j * s.stride;
      if (v < s.v_end) {
        const int c = int(af.L.div(uint32_t(v * VEC)));
        P out;
        if constexpr (kWhole) {
          out = normalize_whole<T, VEC>(raw[j], af.gamma(c), af.beta(c), mean, rstd);
        } else {
          out = normalize_vec<T, VEC>(raw[j], c, v * VEC - c * L, L, af.gamma(c), af.beta(c), af.gamma_g, af.beta_g,
                                      mean, rstd);
        }
        if (evict) {
          store_evict_first(dst + v, out);
        } else {
          dst[v] = out;
        }
      }
    }
  }
}

// Stage gamma/beta of channels c_low .. c_low + stage - 1 (those of the group) as fp32 in shared memory.
template <typename T>
__device__ __forceinline__ void stage_affine(const Affine<T>& af, int cg, float* staged) {
  for (int i = threadIdx.x; i < af.stage && af.c_low + i < cg; i += blockDim.x) {
    staged[i] = to_float(__ldg(af.gamma_g + af.c_low + i));
    staged[af.stage + i] = to_float(__ldg(af.beta_g + af.c_low + i));
  }
}

// kStash: a separate instantiation for plans with a stash; without it the kernel is the code before the stash
// existed (an H200 measured the fp32 one-chunk kernel 40 % slower with the stash paths compiled in but unused,
// b64_c512_l1024 117 vs 83 us, at the same occupancy and an equivalent load sequence).
// kWhole (launched where L % VEC == 0): whole-vector normalise. H200, same process against the straddle-checking
// one (tune/gn_mish-t1-whole-ab-20261122.txt): without a stash b1_c256_l1024 0.962-0.966, b1_c512_l1024 0.971,
// b1_c1024_l1024 0.955, b8_c256_l1024 0.962, b64_c256_l256 0.964, b16_c1024_l2048 0.973, b64_c1024_l1024 0.984,
// bf16 b16_c1024_l2048 0.987; with the stash b8_c2048_l1024 0.942, b8_c512_l4096 0.951. (At 4552632, before the
// one-way exchange and the symmetric merges cut registers, the same change spilled the 16-bit kernels and lost on
// streaming plans. Tier 2: gn_mish_grid.cuh.)
template <typename T, int VEC, int ITEMS, bool kStash, bool kWhole = false>
__global__ void __launch_bounds__(kMaxThreads, 1)
    gn_mish_cluster_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                           T* __restrict__ y, Tier1Args a) {
  using P = Pack<T, VEC>;
  extern __shared__ __align__(16) float staged[];  // [stage] gamma, then [stage] beta, as fp32; then the stash
  __shared__ Stats warp_part[kMaxThreads / kWarp];
  __shared__ ClusterExchange xchg;
  const ClusterSlice<T, VEC> cs = cluster_slice<T, VEC>(a, x, gamma, beta, y, staged);
  if (cs.cluster > 1) exchange_arm(xchg, cs.cluster);
  const int chunk = int(blockDim.x) * ITEMS;
  const SliceView s = {cs.v_begin, cs.v_end, int(blockDim.x), (cs.v_end - cs.v_begin + chunk - 1) / chunk, a.stash};
  P* stash = after_staged<P>(staged, a.stage) + threadIdx.x;

  P raw[ITEMS];
  // Streaming (chunks > 1): the chunks re-read after the reduction should still be in L2, so the chunk kept in
  // registers and y go through L2 with evict_first; y of a one-chunk CTA keeps the default policy (the next layer
  // reads it). fp32 only: an H200 A/B/A run measured fp32 streaming shapes 2-8 % faster with the hints, while the
  // 16-bit kernels (64 elements per thread, at the 64-register cap) ran 8-10 % slower even where no hint applies.
  const bool streaming = sizeof(T) == 4 && s.chunks > 1;
  const Stats acc = load_slice<T, VEC, ITEMS, kStash>(raw, cs.src, s, stash, streaming,
                                                      [&] { stage_affine(cs.af, a.cg, staged); });
  const Stats cta = cta_reduce_publish(acc, 1, false, warp_part, nullptr);
  const Stats total = cs.cluster > 1 ? exchange(xchg, cta, cs.cluster, cs.rank) : cta;
  normalize_slice<T, VEC, ITEMS, kStash, kWhole>(raw, cs.src, cs.dst, s, stash, cs.af, total.mean,
                                                 fast_rsqrt(total.m2 * a.inv_n + a.eps), streaming);
}

}  // namespace gn_mish::detail
