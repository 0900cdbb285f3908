// Tier 2 of the fused GroupNorm+Mish kernel (included by gn_mish.cu): y = mish(group_norm(x) * gamma + beta),
// x, y (B, C, L) fp32/fp16/bf16 with fp32 math, a group spread over S CTAs (S <= 32, no thread-block cluster) that
// combine their partial statistics through global memory. Two things tier 1 cannot do: a group may use more SMs than
// a portable cluster (B = 1: 8 groups x 16 CTAs on 128 SMs, where 8-CTA clusters leave half the SMs idle and 16-CTA
// clusters do not all fit in the GPCs at once), and a CTA's slice may live on chip in registers plus a shared-memory
// stash of up to 14 x 16 KB per 1024-thread CTA, so x is read from DRAM about once where tier 1 re-reads it (B = 8,
// C = 2048, L = 4096: 4 MB groups over 8 CTAs, 22 of each thread's 32 vectors on chip, the rest re-read from L2).
//
// The grid is resident (cooperative launch): grid / S slots, slot i handling groups i, i + slots, ... Per group,
// every CTA loads its slice (tier 1's load_slice: chunks of blockDim x ITEMS vectors, all but the last stashed,
// slots beyond the stash re-read later) and merges (count, mean, M2) warp -> CTA; thread 0 stores the CTA's partial
// in partials[group][rank], fences, arrives on the group's counter and spins until S have arrived (acquire); every
// warp then merges the S partials in one butterfly (identical bits in every CTA), and the CTA normalises and stores
// (tier 1's normalize_slice: registers, stash, re-reads). After its stores are issued, thread 0 counts out on the
// departure counter: the last CTA out resets both counters, so every launch, of any S, finds them at zero. Global
// memory from the host: 2 counters per group (zero before the first launch) and S 16-byte partials per group.
// GridArgs carries tier 1's Tier1Args (one launch-side construction for both tiers) plus the barrier's fields.
// fp32 plans with a stash whose slots loop over more groups than fit at once take the kEvict instantiation (L2
// evict_first on everything pass 2 does not re-read through L2), 16-bit plans with a stash the kWhole one.
#pragma once

#include "grid_dependency.cuh"  // kernels/_cuda/: load_acquire
#include "gn_mish_tier1.cuh"

namespace gn_mish::detail {

struct GridArgs {
  Tier1Args t;           // shape, slice, staging, eps and stash as tier 1 takes them (cluster_shift unused)
  int ctas;              // S: CTAs per group (<= 32)
  int slots;             // grid / S: groups in flight
  float4* partials;      // [num_groups][ctas]: (count, mean, M2, 0) of each CTA's slice
  unsigned* counters;    // [num_groups][2]: arrivals, departures; zero between launches
};

// One thread per CTA: publish the CTA's partial, then wait until all S CTAs of the group have.
__device__ __forceinline__ void group_arrive_wait(const GridArgs& a, int group, int rank, const Stats& cta) {
  unsigned* arrived = a.counters + 2 * group;
  a.partials[group * a.ctas + rank] = make_float4(cta.n, cta.mean, cta.m2, 0.f);
  __threadfence();  // the partial before the arrival
  atomicAdd(arrived, 1u);
  while (dpk_async::load_acquire(arrived) < unsigned(a.ctas)) {
  }
}

// Later (off the path from the barrier to the stores), the same thread counts out. Every CTA has passed the spin
// once the departures reach S: only then may the counters go back to zero.
__device__ __forceinline__ void group_depart(const GridArgs& a, int group) {
  unsigned* arrived = a.counters + 2 * group;
  if (atomicAdd(arrived + 1, 1u) == unsigned(a.ctas) - 1) {
    atomicExch(arrived, 0u);
    atomicExch(arrived + 1, 0u);
  }
}

// kStash: slices of more than one chunk (a separate instantiation, as for tier 1: one-chunk plans run no stash code).
// kEvict (fp32 with kStash, plans whose slots loop over more groups than fit at once): what pass 2 does not re-read
// through L2 (the stashed slots, the last chunk, kept in registers, and y) goes with L2 evict_first, as in tier 1's
// fp32 streaming CTAs, so the L2 keeps the slots that pass 2 re-reads instead of losing them to the y writes of the
// round. H200, fp32 b8_c2048_l4096 (4 rounds): DRAM reads 330 -> 284 MB (x: 268 MB), 172.6 -> 160.3 us (y and the
// last chunk alone 0.968x, the stash alone 1.008x); 16-bit (2 rounds) 0.985-1.003x, so 16-bit keeps plain loads
// and stores as in tier 1; one round (B = 1) 1.05x slower, so those plans keep the plain kernel
// (tune/gn_mish-t2-l2-hints-ab-20261122.txt).
// kWhole (16-bit with kStash, launched where L % VEC == 0): whole-vector normalise, as in tier 1; H200, two A/B runs
// (tune/gn_mish-t1-whole-ab-20261122.txt): bf16 / fp16 b1_c2048_l4096 0.982-0.986 / 0.984-0.989, b8_c2048_l4096
// 0.993-0.999 / 0.987-0.988. fp32 (1.001-1.012) and the kernels without a stash (1.004-1.014) keep normalize_vec.
template <typename T, int VEC, int ITEMS, bool kStash, bool kEvict = false, bool kWhole = false>
__global__ void __launch_bounds__(kMaxThreads, 1)
    gn_mish_grid_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                        T* __restrict__ y, GridArgs a) {
  using P = Pack<T, VEC>;
  static_assert(!kEvict || (kStash && sizeof(T) == 4), "L2 hints: fp32 plans with a stash");
  const Tier1Args& t = a.t;
  extern __shared__ __align__(16) float staged[];  // [stage] gamma, then [stage] beta, as fp32; then the stash
  __shared__ Stats warp_part[kMaxThreads / kWarp];
  const int slot = int(blockIdx.x) / a.ctas;
  const int rank = int(blockIdx.x) - slot * a.ctas;
  const int lane = threadIdx.x & (kWarp - 1);
  const int v_begin = min(t.nv, rank * t.slice_vecs);
  const int v_end = min(t.nv, v_begin + t.slice_vecs);
  const int chunk = int(blockDim.x) * ITEMS;
  const SliceView s = {v_begin, v_end, int(blockDim.x), (v_end - v_begin + chunk - 1) / chunk, t.stash};
  const int c_low = int(t.L.div(uint32_t(v_begin * VEC)));
  P* stash = after_staged<P>(staged, t.stage) + threadIdx.x;

  for (int group = slot; group < t.num_groups; group += a.slots) {  // uniform over the CTA
    const P* src = reinterpret_cast<const P*>(x + int64_t(group) * t.n);
    P* dst = reinterpret_cast<P*>(y + int64_t(group) * t.n);
    const int c_first = (group - int(t.G.div(group)) * int(t.G.d)) * t.cg;
    const Affine<T> af = {t.L, t.stage, c_low, staged, gamma + c_first, beta + c_first};
    P raw[ITEMS];
    const Stats mine = load_slice<T, VEC, ITEMS, kStash>(raw, src, s, stash, kEvict,
                                                       [&] { stage_affine(af, t.cg, staged); }, kEvict);
    const Stats cta = cta_reduce_publish(mine, 1, false, warp_part, nullptr);
    if (threadIdx.x == 0) group_arrive_wait(a, group, rank, cta);
    __syncthreads();  // thread 0 has acquired the S partials for the CTA
    const bool pow2 = (a.ctas & (a.ctas - 1)) == 0;  // then every aligned group of S lanes holds all S partials
    Stats part = {0.f, 0.f, 0.f};
    if (pow2 || lane < a.ctas) {
      const float4 q = __ldcg(a.partials + group * a.ctas + (pow2 ? lane & (a.ctas - 1) : lane));
      part = {q.x, q.y, q.z};
    }
    const Stats total = warp_allreduce(part, pow2 ? a.ctas : kWarp);
    normalize_slice<T, VEC, ITEMS, kStash, kWhole>(raw, src, dst, s, stash, af, total.mean,
                                                   fast_rsqrt(total.m2 * t.inv_n + t.eps), kEvict);
    if (threadIdx.x == 0) group_depart(a, group);
    if (group + a.slots < t.num_groups) __syncthreads();  // staged gamma/beta and warp_part are reused
  }
}

}  // namespace gn_mish::detail
