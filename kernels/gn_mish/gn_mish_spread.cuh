// Tier 3 of the fused GroupNorm+Mish kernel (included by gn_mish.cu): y = mish(group_norm(x) * gamma + beta),
// x, y (B, C, L) fp32/fp16/bf16 in 16-byte vectors, fp32 math, for launches of few groups whose whole x fits in the
// chip's shared memory (B = 1: 8 groups, up to ~26 MB on 132 SMs). Every CTA of a resident grid of P CTAs (one per
// SM) holds piece r of *every* group (vectors [r * piece, (r + 1) * piece) of each), and the groups go through the
// chip one after another like a pipeline: group g's statistics meet while groups g + 1 ... still load, and group g
// stores while they reduce, so DRAM reads and writes overlap as in a copy.
//
// Differs from tier 2 (gn_mish_grid.cuh), where a group lives on S <= 32 CTAs and every CTA loads its one slice,
// then the whole chip exchanges with DRAM idle, then every CTA stores (H200 trace, fp32 b1_c2048_l1024: load 3.0,
// exchange 1.5, stores 2.75 us, one after the other). Here warps have roles:
// - thread 0 requests each group's piece with one bulk copy (cp.async.bulk, group order, one mbarrier per group) at
//   kernel start;
// - W group warps (`reducers`; warp w takes groups w, w + W, ..., so B = 1's 8 groups run side by side): wait for the
//   group's piece, reduce it (two passes over shared memory, a warp butterfly), publish the CTA's (mean, M2) in slot
//   [group][rank] as one 64-bit store whose M2 sign bit marks it written and count it (both relaxed: no fence), spin
//   on the group's count until all P CTAs have counted, read the P slots (again where one is not yet marked), merge
//   them (identical bits in every CTA: fixed order, symmetric butterfly) and hand (mean, rstd) to the storers through
//   shared memory and an mbarrier;
// - the other warps store: first they stage the gamma/beta of every group's piece in shared memory (a piece
//   covers the same channels of every group), then each waits for its group's statistics, normalises its share of
//   the piece from shared memory and writes y (storer warps split over the groups, so the groups store side by
//   side). Reading gamma/beta through L1 put an L2 round trip in front of every group's stores, one group after
//   another (fp32 b1_c256_l1024: 12.1 us against tier 1's 7.0).
// Counts and slots live in the zeroed counters buffer: after their last group, the group warps meet at a named barrier
// and thread 0 counts out on a departure counter; the last CTA out zeroes the slots, the counts and the departures,
// so every launch finds them zero.
#pragma once

#include "gn_mish_grid.cuh"  // tier 1's helpers

namespace gn_mish::detail {

// Tier 1's Tier1Args (one launch-side construction for the tiers; slice_vecs: the piece, stage: the channels staged
// per group, cluster_shift and stash unused) plus tier 3's fields.
struct SpreadArgs {
  Tier1Args t;
  int reducers;                // group warps (0 .. W - 1): reduce, publish, collect; the rest store
  int depth;                   // groups requested ahead: 0..depth-1 at start, g + depth once g has landed
  unsigned long long* slots;   // [num_groups][gridDim.x] published (mean, M2 | sign) of each CTA's piece
  unsigned* counters;          // [num_groups + 1][kSpreadCounterStride]: publications per group, then departures
};

// The mbarriers of tier 3 (kernels/_cuda/async_copy.cuh; the host plans tier 3 only on sm_90+, other targets trap),
// each used for its first phase only: `landed` counts a group's bulk copy, `ready` the arrival of its statistics.
__device__ __forceinline__ void spread_bar_init(unsigned long long* bar) {
  dpk_async::mbar_init(dpk_async::smem_addr(bar));
}

__device__ __forceinline__ void spread_wait(unsigned long long* bar) {
  dpk_async::mbar_wait_first_phase(dpk_async::smem_addr(bar));
}

__device__ __forceinline__ void spread_arrive(unsigned long long* bar) {
  dpk_async::mbar_arrive(dpk_async::smem_addr(bar));
}

// Arm bar for `bytes` and request them from src into dst (bytes: a multiple of 16, possibly 0).
__device__ __forceinline__ void spread_request(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  dpk_async::mbar_arrive_expect_tx(dpk_async::smem_addr(bar), bytes);
  if (bytes > 0) dpk_async::bulk_copy_g2s(dpk_async::smem_addr(dst), src, bytes, dpk_async::smem_addr(bar));
}

// A slot: (mean, M2) of one CTA's piece of one group in 64 bits, the sign bit of M2 (>= 0) set: written.
__device__ __forceinline__ void store_slot(unsigned long long* slot, float mean, float m2) {
  const unsigned long long v = (uint64_t(__float_as_uint(m2) | 0x80000000u) << 32) | __float_as_uint(mean);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(slot), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long load_slot(const unsigned long long* slot) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(slot) : "memory");
  return v;
}

__device__ __forceinline__ unsigned load_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Lane 0 of a group warp: publish the CTA's slot, then count it. Both relaxed: no fence waits for the CTA's memory
// traffic (a release count sat 2.5-5.5 us behind the bulk copies in flight on an H100); a slot counted before it is
// visible is caught by its mark.
__device__ __forceinline__ void spread_publish(const SpreadArgs& a, int group, int ctas, int rank, const Stats& s) {
  store_slot(a.slots + int64_t(group) * ctas + rank, s.mean, s.m2);
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(a.counters + group * kSpreadCounterStride)
               : "memory");
}

// The statistics of `group` from the P published slots, the same bits in every lane and every CTA. The warp spins on
// the group's count (one word in a line of its own) until all P CTAs have counted; polling the slots themselves
// (8 warps x 132 CTAs, 5 loads per warp per sweep on 64 hot lines) took 2-3 us from the last publish to the last read
// on an H100. Then lane l reads slots l, l + 32, ... until each is marked written, merges them in that order, and a
// butterfly over the lanes. `vec`: elements per vector (the slots' counts are pieces of vectors).
__device__ __forceinline__ Stats spread_collect(const SpreadArgs& a, int group, int ctas, int vec) {
  constexpr int kPerLane = kSpreadMaxCtas / kWarp;
  const int lane = threadIdx.x & (kWarp - 1);
  while (load_relaxed(a.counters + group * kSpreadCounterStride) < unsigned(ctas)) {
  }
  const unsigned long long* row = a.slots + int64_t(group) * ctas;
  unsigned long long v[kPerLane];
  unsigned pending = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    v[k] = 0;
    if (lane + k * kWarp < ctas) pending |= 1u << k;
  }
  while (__any_sync(0xffffffffu, pending != 0)) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      if (pending & (1u << k)) v[k] = load_slot(row + lane + k * kWarp);
    }
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      if (v[k] >> 63) pending &= ~(1u << k);
    }
  }
  Stats acc = {0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int r = lane + k * kWarp;
    if (r < ctas) {
      const int lo = min(a.t.nv, r * a.t.slice_vecs), hi = min(a.t.nv, lo + a.t.slice_vecs);
      acc = merge(acc, Stats{float((hi - lo) * vec), __uint_as_float(unsigned(v[k])),
                             __uint_as_float(unsigned(v[k] >> 32) & 0x7fffffffu)});
    }
  }
  return warp_allreduce(acc);
}

// Two-pass statistics of a warp's lane over vectors lane, lane + 32, ... < count of a piece in shared memory, with
// one accumulator per element of a vector: VEC independent chains instead of one (one warp reduces a whole piece).
template <typename T, int VEC>
__device__ __forceinline__ Stats piece_stats(const Pack<T, VEC>* piece, int count, int lane) {
  float acc[VEC] = {};
  int vecs = 0;
#pragma unroll 4
  for (int v = lane; v < count; v += kWarp, ++vecs) {
    const Pack<T, VEC> q = piece[v];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] += q.get(k);
  }
  if (vecs == 0) return {0.f, 0.f, 0.f};
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < VEC; ++k) sum += acc[k], acc[k] = 0.f;
  const float mean = sum * fast_rcp(float(vecs * VEC));
#pragma unroll 4
  for (int v = lane; v < count; v += kWarp) {
    const Pack<T, VEC> q = piece[v];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = q.get(k) - mean;
      acc[k] = fmaf(d, d, acc[k]);
    }
  }
  float m2 = 0.f;
#pragma unroll
  for (int k = 0; k < VEC; ++k) m2 += acc[k];
  return {float(vecs * VEC), mean, m2};
}

template <typename T, int VEC, bool kWhole>
__global__ void __launch_bounds__(kMaxThreads, 1)
    gn_mish_spread_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                          T* __restrict__ y, SpreadArgs a) {
  using P = Pack<T, VEC>;
  extern __shared__ __align__(16) unsigned char smem_raw[];  // 16, as every kernel here: an extern array's
  // alignment pads the static shared memory of all of them (128 put the cluster kernel at 768 B, past kStaticSmemBound)
  P* const pieces = reinterpret_cast<P*>(smem_raw);  // [num_groups][piece_vecs]
  __shared__ unsigned long long landed[kSpreadMaxGroups], ready[kSpreadMaxGroups];
  __shared__ float2 stats[kSpreadMaxGroups];  // (mean, rstd) of each group
  const int ctas = int(gridDim.x), rank = int(blockIdx.x);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) & (kWarp - 1);
  const int v_begin = min(a.t.nv, rank * a.t.slice_vecs);
  const int count = min(a.t.nv, v_begin + a.t.slice_vecs) - v_begin;  // vectors of each group in this CTA
  if (threadIdx.x == 0) {
    for (int g = 0; g < a.t.num_groups; ++g) spread_bar_init(&landed[g]), spread_bar_init(&ready[g]);
    dpk_async::fence_mbar_init();
  }
  __syncthreads();  // the mbarriers are initialised before any request or wait

  if (warp < a.reducers) {  // group warps: warp w takes groups w, w + W, ...
    const auto request = [&](int g) {
      spread_request(pieces + g * a.t.slice_vecs, x + int64_t(g) * a.t.n + int64_t(v_begin) * VEC,
                     unsigned(count) * 16u, &landed[g]);
    };
    if (threadIdx.x == 0) {
      for (int g = 0; g < min(a.depth, a.t.num_groups); ++g) request(g);
    }
    for (int g = warp; g < a.t.num_groups; g += a.reducers) {
      spread_wait(&landed[g]);
      if (lane == 0 && g + a.depth < a.t.num_groups) request(g + a.depth);
      const P* piece = pieces + g * a.t.slice_vecs;
      const Stats mine = warp_allreduce(piece_stats<T, VEC>(piece, count, lane));
      if (lane == 0) spread_publish(a, g, ctas, rank, mine);
      const Stats total = spread_collect(a, g, ctas, VEC);
      if (lane == 0) {
        stats[g] = make_float2(total.mean, fast_rsqrt(total.m2 * a.t.inv_n + a.t.eps));
        spread_arrive(&ready[g]);
      }
    }
    // Every CTA has read every count and slot once the departures reach P: only then may the last one out zero them.
    asm volatile("bar.sync 1, %0;" ::"r"(a.reducers * kWarp) : "memory");
    if (warp == 0) {
      unsigned* departed = a.counters + a.t.num_groups * kSpreadCounterStride;
      unsigned last = 0;
      if (lane == 0) last = atomicAdd(departed, 1u) == unsigned(ctas) - 1;
      if (__shfl_sync(0xffffffffu, last, 0)) {
        const int words = a.t.num_groups * ctas;  // 8-byte slots; the row starts 16-byte aligned
        ulonglong2* pairs = reinterpret_cast<ulonglong2*>(a.slots);
        for (int i = lane; i < words / 2; i += kWarp) pairs[i] = make_ulonglong2(0ull, 0ull);
        if (lane == 0 && (words & 1)) a.slots[words - 1] = 0ull;
        if (lane < a.t.num_groups) a.counters[lane * kSpreadCounterStride] = 0u;
        __syncwarp();
        if (lane == 0) atomicExch(departed, 0u);
      }
    }
    return;
  }

  // storers: stage the pieces' gamma/beta while x is in flight, then store the groups as their statistics arrive
  const int sw = warp - a.reducers, storers = int(blockDim.x) / kWarp - a.reducers;
  const int L = int(a.t.L.d);
  const int c_low = int(a.t.L.div(uint32_t(v_begin * VEC)));  // first channel of the piece, the same in every group
  float* const staged = reinterpret_cast<float*>(pieces + a.t.num_groups * a.t.slice_vecs);  // [group] gamma, beta
  if (a.t.stage > 0) {  // item i: channel c_low + i % stage of group i / stage; one load round trip for all of them
    for (int i = int(threadIdx.x) - a.reducers * kWarp; i < a.t.num_groups * a.t.stage; i += storers * kWarp) {
      const int g = i / a.t.stage, j = i - g * a.t.stage;
      const int c = (g - int(a.t.G.div(g)) * int(a.t.G.d)) * a.t.cg + c_low + j;
      if (c_low + j < a.t.cg) {
        staged[2 * g * a.t.stage + j] = to_float(__ldg(gamma + c));
        staged[(2 * g + 1) * a.t.stage + j] = to_float(__ldg(beta + c));
      }
    }
    asm volatile("bar.sync 2, %0;" ::"r"(storers * kWarp) : "memory");
  }
  // With at least as many storer warps as groups, warp sw stores group sw % groups with the Q warps of that residue
  // (B = 1 on 24 storer warps: 3 per group), so groups whose statistics arrive together store side by side; else
  // warp sw stores groups sw, sw + storers, ... alone.
  const bool wide = storers >= a.t.num_groups;
  const int q = wide ? sw / a.t.num_groups : 0;
  const int Q = wide ? (storers - sw % a.t.num_groups + a.t.num_groups - 1) / a.t.num_groups : 1;
  for (int g = wide ? sw % a.t.num_groups : sw; g < a.t.num_groups; g += wide ? a.t.num_groups : storers) {
    const int c_first = (g - int(a.t.G.div(g)) * int(a.t.G.d)) * a.t.cg;
    const Affine<T> af = {a.t.L, a.t.stage, c_low, staged + 2 * g * a.t.stage, gamma + c_first, beta + c_first};
    spread_wait(&ready[g]);
    spread_wait(&landed[g]);
    const float2 st = stats[g];
    const P* piece = pieces + g * a.t.slice_vecs - v_begin;  // indexed by the group's vector
    P* dst = reinterpret_cast<P*>(y + int64_t(g) * a.t.n);
    const int first = v_begin + lane + q * kWarp, end = v_begin + count, stride = Q * kWarp;
    if constexpr (kWhole) {  // no vector straddles a channel
#pragma unroll 4
      for (int v = first; v < end; v += stride) {
        const int c = int(a.t.L.div(uint32_t(v * VEC)));
        dst[v] = normalize_whole<T, VEC>(piece[v], af.gamma(c), af.beta(c), st.x, st.y);
      }
    } else {
#pragma unroll 2
      for (int v = first; v < end; v += stride) {
        const int c = int(a.t.L.div(uint32_t(v * VEC)));
        dst[v] = normalize_vec<T, VEC>(piece[v], c, v * VEC - c * L, L, af.gamma(c), af.beta(c), af.gamma_g,
                                       af.beta_g, st.x, st.y);
      }
    }
  }
}

}  // namespace gn_mish::detail
