// Tier 2 of the fused GroupNorm+Mish kernel (included by gn_mish.cu): a group spread over S CTAs (S <= 32, no
// thread-block cluster) that combine their partial statistics through global memory. Two things tier 1 cannot do:
// a group may use more SMs than a portable cluster (B = 1: 8 groups x 16 CTAs on 128 SMs, where 8-CTA clusters
// leave half the SMs idle and 16-CTA clusters do not all fit in the GPCs at once), and a CTA's slice may live on
// chip in registers plus a shared-memory stash of up to 14 x 16 KB per 1024-thread CTA, so x is read from DRAM
// (nearly) once where tier 1 re-reads it (B = 8, C = 2048, L = 4096: 4 MB groups, 8 CTAs each).
//
// The grid is resident (cooperative launch): grid / S slots, slot i handling groups i, i + slots, ... Per group,
// every CTA loads its slice (tier 1's load_slice: chunks of blockDim x ITEMS vectors, all but the last stashed,
// slots beyond the stash re-read later) and merges (mean, M2) warp -> CTA; thread 0 stores them as one 64-bit word
// in partials[group][rank], which holds a sentinel (a NaN that arithmetic never produces) until then; lane r of warp
// 0 polls partials[group][r] until it is not the sentinel, and the warp merges the S of them with their counts
// (known from the slice bounds) in a fixed butterfly: identical bits in every CTA. So the path from the last
// arrival to the stores is one store and one L2 read, with no fence and no counter. After its stores are issued,
// thread 0 counts out on the group's departure counter; the last CTA out puts the S sentinels back and the counter
// to zero, so every launch, of any S, finds them so. Then normalise and store (tier 1's normalize_slice: registers,
// stash, re-reads). Global memory from the host: one counter per group, S 64-bit partials per group.
#pragma once

#include "gn_mish_tier1.cuh"

namespace gn_mish::detail {

struct GridArgs {
  int num_groups;           // B * G
  FastDiv G;                // groups per sample
  int cg;                   // channels per group
  FastDiv L;                // channel length
  int n, nv;                // elements and vectors per group
  int slice_vecs;           // vectors per CTA
  int ctas;                 // S: CTAs per group (<= 32)
  int slots;                // grid / S: groups in flight
  int stage;                // channels staged in shared memory per CTA (0: gamma/beta read through L1)
  float inv_n, eps;
  int stash;                // vectors per thread kept in shared memory
  uint64_t* partials;       // [num_groups][ctas]: (mean, M2) of each CTA's slice as two floats; kSentinel between
  unsigned* departures;     // [num_groups]: CTAs done with the group's partials; zero between launches
};

// All-ones: a NaN with the sign bit set, which fp32 arithmetic never returns (its NaNs are 0x7fffffff) and
// published values never are (pack_partial canonicalises NaN).
constexpr uint64_t kSentinel = ~uint64_t(0);

__device__ __forceinline__ uint64_t pack_partial(float mean, float m2) {
  const uint32_t lo = mean != mean ? 0x7fffffffu : __float_as_uint(mean);
  const uint32_t hi = m2 != m2 ? 0x7fffffffu : __float_as_uint(m2);
  return (uint64_t(hi) << 32) | lo;
}

__device__ __forceinline__ void store_relaxed(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t load_relaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Warp 0: wait for the S partials of the group (lane r polls rank r's word) and merge them; every lane gets the
// group's statistics. The count of rank r is its slice's element count, so only (mean, M2) travel.
__device__ __forceinline__ Stats group_collect(const GridArgs& a, int group) {
  const int lane = threadIdx.x & (kWarp - 1);
  Stats part = {0.f, 0.f, 0.f};
  if (lane < a.ctas) {
    const uint64_t* word = a.partials + group * a.ctas + lane;
    uint64_t v;
    while ((v = load_relaxed(word)) == kSentinel) {
    }
    const int begin = min(a.nv, lane * a.slice_vecs), end = min(a.nv, begin + a.slice_vecs);
    part = {float((end - begin) * (a.n / a.nv)), __uint_as_float(uint32_t(v)), __uint_as_float(uint32_t(v >> 32))};
  }
  return warp_allreduce(part);
}

// Thread 0, after its CTA's stores are issued: count out; the last CTA out (every CTA has read every partial)
// puts the sentinels back and the counter to zero for the next launch.
__device__ __forceinline__ void group_depart(const GridArgs& a, int group) {
  if (atomicAdd(a.departures + group, 1u) == unsigned(a.ctas) - 1) {
    for (int r = 0; r < a.ctas; ++r) store_relaxed(a.partials + group * a.ctas + r, kSentinel);
    atomicExch(a.departures + group, 0u);
  }
}

// kStash: slices of more than one chunk (a separate instantiation, as for tier 1: one-chunk plans run no stash code).
template <typename T, int VEC, int ITEMS, bool kStash>
__global__ void __launch_bounds__(kMaxThreads, 1)
    gn_mish_grid_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                        T* __restrict__ y, GridArgs a) {
  using P = Pack<T, VEC>;
  extern __shared__ __align__(16) float staged[];  // [stage] gamma, then [stage] beta, as fp32; then the stash
  __shared__ Stats warp_part[kMaxThreads / kWarp];
  __shared__ Stats group_stats[1];
  const int slot = int(blockIdx.x) / a.ctas;
  const int rank = int(blockIdx.x) - slot * a.ctas;
  const int v_begin = min(a.nv, rank * a.slice_vecs);
  const int v_end = min(a.nv, v_begin + a.slice_vecs);
  const int chunk = int(blockDim.x) * ITEMS;
  const SliceView s = {v_begin, v_end, int(blockDim.x), (v_end - v_begin + chunk - 1) / chunk, a.stash};
  const int c_low = int(a.L.div(uint32_t(v_begin * VEC)));
  P* stash = reinterpret_cast<P*>(staged + (2 * a.stage + 3) / 4 * 4) + threadIdx.x;

  for (int group = slot; group < a.num_groups; group += a.slots) {  // uniform over the CTA
    const P* src = reinterpret_cast<const P*>(x + int64_t(group) * a.n);
    P* dst = reinterpret_cast<P*>(y + int64_t(group) * a.n);
    const int c_first = (group - int(a.G.div(group)) * int(a.G.d)) * a.cg;
    const Affine<T> af = {a.L, a.stage, c_low, staged, gamma + c_first, beta + c_first};
    P raw[ITEMS];
    const Stats mine = load_slice<T, VEC, ITEMS, kStash>(raw, src, s, stash, false,
                                                       [&] { stage_affine(af, a.cg, staged); });
    const Stats cta = cta_reduce_publish(mine, 1, false, warp_part, nullptr);
    if (threadIdx.x == 0) store_relaxed(a.partials + group * a.ctas + rank, pack_partial(cta.mean, cta.m2));
    if (threadIdx.x < kWarp) {
      const Stats g = group_collect(a, group);
      if (threadIdx.x == 0) *group_stats = g;
    }
    __syncthreads();  // warp 0 has the group's statistics
    const Stats total = *group_stats;
    normalize_slice<T, VEC, ITEMS, kStash>(raw, src, dst, s, stash, af, total.mean,
                                           fast_rsqrt(total.m2 * a.inv_n + a.eps), false);
    if (threadIdx.x == 0) group_depart(a, group);
    if (group + a.slots < a.num_groups) __syncthreads();  // staged gamma/beta, warp_part, group_stats are reused
  }
}

}  // namespace gn_mish::detail
