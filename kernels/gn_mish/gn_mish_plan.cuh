// Launch planning of the fused GroupNorm+Mish kernels: pure host logic (no CUDA calls), shared by gn_mish.cu
// and the host-compiled planner test (tests/test_gn_mish.py), plus the division helper the kernels use.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gn_mish.cuh"

namespace gn_mish {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;
constexpr int kPortableCluster = 8;
constexpr int kMaxCluster = 16;           // non-portable: used only when the occupancy query says it fits
constexpr int kTier0MaxVecs = 256;        // groups of <= 256 vectors (1024 fp32 / 2048 fp16 elements): tier 0
constexpr int kTier0MaxItems = 8;         // tier 0 vectors per thread are compiled for 1, 2, 4, 8
constexpr int kStageMaxChannels = 2048;   // tier 1 stages gamma/beta of up to this many channels per CTA
constexpr int kStaticSmemBound = 672;     // >= static shared memory of the cluster (656 B), grid and smem-slice kernels
constexpr int kPersistentStaticSmem = 800;  // >= the persistent kernel's (784 B)
constexpr int kRegsPerSm = 65536;
constexpr int kTier1Regs = 64;            // the tier-1 kernels' register cap (__launch_bounds__(1024, 1))
constexpr int kThreadsPerSm = 2048;
// Default plan constants, measured with _tune.py on an H200 (NOTES.md "Default plan"):
constexpr int kTier0CtaThreads = 128;     // tier 0: CTAs of 128 threads (one group of 128, 2 of 64, 4 warps)
constexpr int kFewCtaMaxCluster = 8;      // tier 1, few groups: clusters of <= 8 CTAs (16 x 512/1024 measured slow)
constexpr int kManyCtaThreads = 256;      // tier 1, many groups: 256-thread CTAs in clusters of <= 8 ...
constexpr int kManyStreamThreads = 512;   // ... else streaming through clusters of <= 8 CTAs of 512 threads
constexpr int kGridMaxCtas = 32;          // tier 2: CTAs per group (one warp merges their partials)
constexpr int64_t kGridFewMinVecs = 65536;  // tier 2 by default for few groups from 64K vectors (1 MB) per group
constexpr int kSmemSliceThreads = 256;    // tier 1 with the slice in shared memory: CTAs of <= 256 threads ...
constexpr int kSmemSliceItems = 8;        // ... of <= 8 vectors per thread run 6 CTAs per SM (40 registers), more 3
constexpr int kSpreadMaxGroups = 32;      // tier 3: groups per launch (an mbarrier pair and a slot row each)
constexpr int kSpreadMaxCtas = 256;       // tier 3: CTAs (warp 0 polls <= 8 slots per lane)
constexpr int kSpreadMaxReducers = 16;    // tier 3: group warps (reduce, publish, collect)
constexpr int kSpreadReducers = 8;        // tier 3 default: up to 8 group warps (B = 1: one per group), the rest store
constexpr int kSpreadDepth = 4;           // tier 3 default: 4 groups requested ahead per CTA
constexpr int kSpreadStaticSmem = 1024;   // >= the tier-3 kernel's static shared memory (768 B)
constexpr int kSpreadPieceAlign = 8;      // tier 3 pieces: multiples of 8 vectors (128 bytes)
constexpr int kSpreadCounterStride = 32;  // tier 3: a group's count alone in a 128-byte line (words)
constexpr int kSpreadStageBytes = 16384;  // tier 3 stages gamma/beta in shared memory up to this many bytes

// Tier 0 CTA size cap for a number of vectors per thread: 4 and 8 need more than the 64 registers that a
// 1024-thread CTA leaves per thread.
__host__ __device__ constexpr int tier0_max_cta(int items) { return items >= 4 ? 256 : kMaxThreads; }

// Tier 1 vectors per thread per chunk: 8 (128 bytes: 32 fp32 or 64 fp16/bf16 elements, kept packed in 32
// registers) or 4 (8 on the scalar path). Until the 16-bit packs held pairs per 32-bit word, fp16/bf16 used 4
// vectors (32 elements, half the bytes of fp32 per thread): an H200 tune put bf16 b64_c512_l1024 at 43 % of
// copy bandwidth with those, 53 % with CTAs of twice the elements per thread.
__host__ __device__ constexpr int tier1_items_full(int /*vec*/) { return 8; }
__host__ __device__ constexpr int tier1_items_half(int vec) { return vec == 1 ? 8 : 4; }

// n / d for 0 <= n, d < 2^31 as a multiply-high, add and shift (d fixed per launch, computed on the host):
// the index math (channel of an element, group within a sample) without integer division on the GPU.
struct FastDiv {
  uint32_t d = 1, mul = 1, shift = 0;
  FastDiv() = default;
  __host__ __device__ explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint32_t(1) << shift) < d) ++shift;
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * mul) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

struct DeviceInfo {
  int sms = 0;
  int major = 0;
  int smem_per_sm = 0;    // bytes of shared memory per SM
  int smem_reserved = 0;  // bytes the system reserves per CTA
  int smem_optin = 0;     // largest shared memory per CTA after opting in
  int l2_bytes = 0;       // L2 cache size
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v && p < (1 << 30)) p <<= 1;
  return p;
}

// The largest power of two <= v (1 for v < 2).
inline int pow2_floor(int64_t v) {
  int p = 1;
  while (int64_t(p) * 2 <= v && p < (1 << 30)) p <<= 1;
  return p;
}

inline bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

inline bool limits_ok(const Limits& l) {
  return l.max_threads >= kWarp && l.max_cluster >= 1 &&
         (l.t0_threads == 0 || (is_pow2(l.t0_threads) && l.t0_threads >= kWarp && l.t0_threads <= kMaxThreads)) &&
         l.t0_groups_per_cta >= 0 && l.t0_groups_per_cta <= kMaxThreads / kWarp &&
         (l.t0_threads == 0 || l.t0_threads * l.t0_groups_per_cta <= kMaxThreads) &&
         (l.t1_threads == 0 || (l.t1_threads % kWarp == 0 && l.t1_threads >= kWarp && l.t1_threads <= kMaxThreads)) &&
         l.t1_items >= 0 && l.t1_ctas_per_sm >= 0 && l.t1_ctas_per_sm <= 32 &&
         (l.t1_persistent == 0 || l.t1_persistent == 1) && l.t1_stash >= -1 && l.t2 >= -1 && l.t2 <= 1 &&
         l.t2_ctas >= 0 && l.t2_ctas <= kGridMaxCtas && l.t1_smem >= -1 && l.t1_smem <= 2 && l.t3 >= -1 &&
         l.t3 <= 1 && l.t3_ctas >= 0 && l.t3_ctas <= kSpreadMaxCtas && l.t3_reducers >= 0 &&
         l.t3_reducers <= kSpreadMaxReducers && l.t3_depth >= 0;
}

// Tier 0: `group_threads` threads per group (power of two), each holding `items` vectors (power of two <= 8),
// `groups_per_cta` groups side by side in one CTA. Default (t0_threads = 0), measured on an H200: one vector per
// thread while the groups fit on the SMs (latency-bound: the shortest dependent chain per thread), two when
// there are more groups than SMs (fewer, fuller CTAs), and CTAs of 128 threads (n = 512 fp32: 128 x 1 at B = 1,
// 64 x 2 at B = 64; n = 256: 64 x 2, then 32 x 4). An explicit t0_threads keeps the first design's CTA default:
// 4 warps per CTA for a warp per group with more groups than SMs, else one group per CTA.
inline void plan_tier0(const Limits& lim, const DeviceInfo& dev, int64_t nv, int64_t groups, Plan* out) {
  const bool many = groups > dev.sms;
  int tpg = lim.t0_threads > 0 ? lim.t0_threads
                               : std::min(kMaxThreads, std::max(kWarp, pow2_ceil(ceil_div(nv, many ? 2 : 1))));
  while (int64_t(tpg) * kTier0MaxItems < nv) tpg *= 2;
  int items = 1;
  while (int64_t(tpg) * items < nv) items *= 2;
  int gpc = lim.t0_groups_per_cta > 0 ? lim.t0_groups_per_cta
            : lim.t0_threads > 0      ? (tpg == kWarp && many ? 4 : 1)
                                      : std::max(1, kTier0CtaThreads / tpg);
  gpc = int(std::max<int64_t>(1, std::min<int64_t>({gpc, tier0_max_cta(items) / tpg, groups})));
  out->tier = 0;
  out->group_threads = tpg;
  out->groups_per_cta = gpc;
  out->items = items;
  out->threads = tpg * gpc;
  out->grid = ceil_div(groups, gpc);
}

// Channels of gamma/beta a CTA slice of `slice_vecs` vectors touches (E elements meet <= (E - 1) / L + 2).
inline int64_t slice_channels(const Problem& p, int64_t slice_vecs, int vec) {
  return std::min(p.channels / p.groups, (slice_vecs * vec - 1) / p.length + 2);
}

// Dynamic shared memory: the staged affine, or more when t1_ctas_per_sm caps the CTAs per SM (static_bound: the
// kernel's static shared memory bound, which each CTA also takes).
inline int tier1_smem(const Limits& lim, const DeviceInfo& dev, int staged_bytes, int static_bound = kStaticSmemBound) {
  if (lim.t1_ctas_per_sm > 0 && dev.smem_per_sm > 0) {  // pad so that a further CTA does not fit on the SM
    const int pad = std::min(dev.smem_per_sm / lim.t1_ctas_per_sm - dev.smem_reserved, dev.smem_optin) -
                    static_bound;
    return std::max(staged_bytes, pad);
  }
  return staged_bytes;
}

// The stash starts after the staged gamma/beta, 16-byte aligned.
__host__ __device__ inline int stash_offset(int stage) { return (stage * 2 * int(sizeof(float)) + 15) / 16 * 16; }

// CTAs of `threads` threads per SM that registers and threads allow (or t1_ctas_per_sm).
inline int ctas_per_sm(const Limits& lim, int threads) {
  return lim.t1_ctas_per_sm > 0 ? lim.t1_ctas_per_sm
                                : std::max(1, std::min(kRegsPerSm / (threads * kTier1Regs), kThreadsPerSm / threads));
}

// Stash slots (16-byte vectors per thread) that fit after `stage` staged channels at ctas CTAs per SM.
inline int stash_capacity(const DeviceInfo& dev, int threads, int ctas, int stage) {
  if (dev.smem_per_sm == 0) return 0;
  const int budget = std::min(dev.smem_per_sm / ctas - dev.smem_reserved, dev.smem_optin) - kStaticSmemBound -
                     stash_offset(stage);
  return std::max(0, budget / (threads * 16));
}

// Tier 1 stash: 16-byte vectors per thread that a streaming CTA keeps in shared memory instead of re-reading
// them after the reduction. Vector j of chunk ci is slot ci * items + j, so the oldest chunks, the ones least
// likely still in L2, go first; the last chunk stays in registers. As many slots as fit without lowering the
// CTAs per SM that registers and threads allow (or t1_ctas_per_sm), capped by t1_stash; 16-byte vectors only.
// By default only where it pays (H200, _tune.py --only stash): the stash kernel runs 6-18 % slower than the
// plain one at the same traffic, so it is used when the CTAs in flight would re-read more than half the L2
// (two partitions; lines read from both sides are cached in both) and the stash brings that under half:
// b8_c2048_l1024 and b8_c512_l4096 (50 -> 21 MB; 47.7 -> 41.5 us), not b1_c2048_l4096 (25 MB: 31.7 -> 37.8 us),
// the 512-thread many-group plans (16 MB) or b8_c2048_l4096 (251 -> 222 MB: 194 -> 203 us).
inline int tier1_stash(const Limits& lim, const DeviceInfo& dev, const Plan& pl) {
  if (lim.t1_stash < 0 || pl.vec == 1 || pl.chunks < 2 || pl.persistent || dev.smem_per_sm == 0) return 0;
  const int ctas = ctas_per_sm(lim, pl.threads);
  int slots = std::min(stash_capacity(dev, pl.threads, ctas, pl.stage), (pl.chunks - 1) * pl.items);
  if (lim.t1_stash > 0) return std::min(slots, lim.t1_stash);
  const int64_t in_flight = std::min<int64_t>(pl.grid, int64_t(ctas) * dev.sms) * pl.threads * 16;  // per slot
  const int64_t reread = in_flight * (pl.chunks - 1) * pl.items, half_l2 = dev.l2_bytes / 2;
  return reread > half_l2 && reread - in_flight * slots <= half_l2 ? slots : 0;
}

// Persistent tier 1 (t1_persistent): clusters of `cluster` CTAs, each CTA holding its slice of one group in
// one half-size register chunk while the next group's slice loads into the other; the grid is as many
// clusters as can be resident (clusters(threads, k, smem_bytes), an occupancy query that also says whether
// 16-CTA clusters fit), each looping over groups cluster_id, cluster_id + clusters, ... Returns false (plan
// unchanged) when the group does not fit or no cluster can be resident.
template <typename Clusters>
bool plan_persistent(const Problem& p, const Limits& lim, const DeviceInfo& dev, int vec, int64_t nv,
                     int64_t groups, int max_k, int thread_cap, Clusters&& clusters, Plan* out) {
  const int threads = std::min(lim.t1_threads > 0 ? lim.t1_threads : kMaxThreads, thread_cap);
  const int items = tier1_items_half(vec);
  const int k = pow2_ceil(ceil_div(nv, int64_t(threads) * items));
  if (k > max_k) return false;
  const int64_t slice = ceil_div(nv, k);
  const int64_t span = slice_channels(p, slice, vec);
  const int stage = span <= std::min(kStageMaxChannels, threads) ? int(span) : 0;  // one channel per thread
  const int smem = tier1_smem(lim, dev, 2 * stage * 2 * int(sizeof(float)), kPersistentStaticSmem);  // two groups'
  if (smem + kPersistentStaticSmem > dev.smem_optin) return false;  // t1_ctas_per_sm = 1 pads for the others
  const int resident = clusters(threads, k, smem);
  if (resident < 1) return false;
  out->tier = 1;
  out->persistent = 1;
  out->items = items;
  out->threads = threads;
  out->cluster = k;
  out->slice_vecs = slice;
  out->chunks = 1;
  out->stage = stage;
  out->smem_bytes = smem;
  out->grid = std::min<int64_t>(groups, resident) * k;
  return true;
}

// Tier 1 CTA size and cluster of an explicit t1_threads (the first version's rule): the smallest cluster of such
// CTAs that holds the group in registers, else stream through the largest usable one; split while few.
template <typename Usable>
void pick_tier1_explicit(const Limits& lim, const DeviceInfo& dev, int64_t nv, int64_t groups, int max_k,
                         int thread_cap, Usable&& usable, Plan* out) {
  out->threads = std::min(lim.t1_threads, thread_cap);
  out->cluster = pow2_ceil(ceil_div(nv, int64_t(out->threads) * out->items));
  if (out->cluster > max_k || !usable(out->cluster, out->threads)) {
    out->cluster = max_k;
    while (out->cluster > 1 && !usable(out->cluster, out->threads)) out->cluster /= 2;
  }
  // Few groups: split each over more CTAs (down to 2 vectors per thread) so more SMs pull from DRAM.
  while (out->cluster * 2 <= max_k && groups * out->cluster < dev.sms &&
         ceil_div(nv, out->cluster * 2) >= 2 * out->threads && usable(out->cluster * 2, out->threads)) {
    out->cluster *= 2;
  }
}

// Default, few groups (2 * groups <= SMs; measured at B = 1 and 8, 8 and 64 groups): clusters of <= 8 CTAs, at
// most one CTA per SM (groups * K <= SMs), the smallest of 256/512/1024-thread CTAs whose cluster holds the group,
// else streaming through 1024-thread CTAs; then split (down to 2 vectors per thread) up to that cap. H200:
// b1_c2048_l1024 8 x 1024 (14.5 us, 16 x 512 17.3); B = 8 (64 groups) 2-CTA clusters on 128 SMs: b8_c256_l1024
// 2 x 512 (11.0 us; 1 x 1024 11.7), b8_c512_l1024 2 x 1024 (14.9; 1 x 1024 streaming 2 chunks 18.3),
// b8_c2048_l1024 2 x 1024 streaming 4 chunks (48.4 us; 1 x 1024 streaming 8 55.3, 8 x 256 57.1, 16 x 128 56.5),
// b8_c2048_l4096 2 x 1024 streaming 16 chunks (194 us; the earlier rule's 4 x 1024 streaming 8 on two waves of
// 256 CTAs, which raised K to keep <= 8 chunks per CTA: 220 us; bf16 105-109 vs 155 us).
inline void pick_tier1_few(const DeviceInfo& dev, int64_t nv, int64_t groups, int max_k, int thread_cap,
                           Plan* out) {
  const int big = std::min(kMaxThreads, thread_cap);
  const int cap = std::min({max_k, kFewCtaMaxCluster, pow2_floor(dev.sms / groups)});
  out->threads = 0;
  for (int threads : {256, 512, 1024}) {
    threads = std::min(threads, thread_cap);
    const int k = pow2_ceil(ceil_div(nv, int64_t(threads) * out->items));
    if (k <= cap) {
      out->threads = threads;
      out->cluster = k;
      break;
    }
  }
  if (out->threads == 0) {
    out->threads = big;
    out->cluster = cap;
  }
  while (out->cluster * 2 <= cap && ceil_div(nv, out->cluster * 2) >= 2 * out->threads) out->cluster *= 2;
}

// Default, many groups (2 * groups > SMs; measured at B = 64 and 16, 512 and 128 groups): CTAs of 256 threads in
// clusters of <= 8 holding the group in registers; larger groups stream through clusters of <= 8 CTAs of 512
// threads, 2 chunks per CTA where 8 CTAs suffice. H200: b64_c512_l1024 8 x 256 (86.9-87.8 us), b64_c1024_l1024
// 4 x 512, 2 chunks (167.0; 8 x 256, 2 chunks 168.0; the earlier rule's 16-CTA clusters, 16 x 128: 174.8),
// b64_c2048_l1024 8 x 512, 2 chunks (329.7; 16 x 256: 352.0, 16 x 512, 1 chunk: 480.7), b16_c1024_l2048 8 x 512,
// 2 chunks (92.9; 16 x 256: 98.3-99.1).
inline void pick_tier1_many(const DeviceInfo& dev, int64_t nv, int64_t groups, int max_k, int thread_cap,
                            Plan* out) {
  out->threads = std::min(kManyCtaThreads, thread_cap);
  out->cluster = pow2_ceil(ceil_div(nv, int64_t(out->threads) * out->items));
  const int cap = std::min(max_k, kPortableCluster);
  if (out->cluster > cap) {
    out->threads = std::min(kManyStreamThreads, thread_cap);
    out->cluster = std::min(cap, pow2_ceil(ceil_div(nv, int64_t(out->threads) * out->items * 2)));
  }
  // Fewer groups than SMs and a group in one CTA: split it in two (down to 2 vectors per thread).
  while (out->cluster * 2 <= cap && groups * out->cluster < dev.sms &&
         ceil_div(nv, out->cluster * 2) >= 2 * out->threads) {
    out->cluster *= 2;
  }
}

// Tier 1: a cluster of `cluster` CTAs per group; CTA rank r owns vectors [r * slice, (r+1) * slice) and holds
// them in `chunks` register chunks of threads * items vectors. fits16(threads) says whether 16-CTA clusters of
// that CTA size can be co-scheduled; clusters(threads, k, smem) how many such clusters can be resident.
template <typename Fits16, typename Clusters>
void plan_tier1(const Problem& p, const Limits& lim, const DeviceInfo& dev, int vec, int64_t nv, int64_t groups,
                Fits16&& fits16, Clusters&& clusters, Plan* out) {
  out->tier = 1;
  const int full = tier1_items_full(vec);
  out->items = lim.t1_items > 0 && lim.t1_items < full ? tier1_items_half(vec) : full;
  const int thread_cap = std::max(kWarp, std::min(kMaxThreads, lim.max_threads / kWarp * kWarp));
  int max_k = 1;  // the largest power of two <= max_cluster and kMaxCluster; clusters need sm_90
  while (dev.major >= 9 && max_k * 2 <= std::min(kMaxCluster, lim.max_cluster)) max_k *= 2;
  auto usable = [&](int k, int threads) { return k <= kPortableCluster || fits16(threads); };
  if (lim.t1_persistent &&
      plan_persistent(p, lim, dev, vec, nv, groups, max_k, thread_cap, clusters, out)) {
    return;
  }
  if (lim.t1_threads > 0) {
    pick_tier1_explicit(lim, dev, nv, groups, max_k, thread_cap, usable, out);
  } else if (2 * groups <= dev.sms) {
    pick_tier1_few(dev, nv, groups, max_k, thread_cap, out);
  } else {
    pick_tier1_many(dev, nv, groups, max_k, thread_cap, out);
  }
  out->slice_vecs = ceil_div(nv, out->cluster);
  out->chunks = int(ceil_div(out->slice_vecs, int64_t(out->threads) * out->items));
  out->grid = groups * out->cluster;
  const int64_t span = slice_channels(p, out->slice_vecs, vec);
  out->stage = span <= kStageMaxChannels ? int(span) : 0;
  out->stash = tier1_stash(lim, dev, *out);
  out->smem_bytes = tier1_smem(lim, dev, out->stash ? stash_offset(out->stage) + out->stash * out->threads * 16
                                                    : out->stage * 2 * int(sizeof(float)));
}

// Tier 2's CTAs per group when the groups take more than one round: a CTA handles ceil(groups / slots) groups of
// 1 / S of a group each (slots = resident CTAs / S), a path of rounds / S groups; the L2 rule's S can leave the last
// round to a few slots while the other SMs idle. Among S .. 2 S (<= 32): the shortest rounds / S, ties to the fewest
// CTAs (the fewest rounds). H100 (50 MB L2), cold (results/nvidia-h100-80gb-hbm3/tune/gn_mish-t2-round-balance-*.txt,
// gn_mish-round-balance-rule-*.txt): bf16 b8_c2048_l4096, the L2 rule's S = 5 (26 slots, 3 rounds: 0.6) 132.3 us,
// S = 6 (22 slots, 3 rounds: 0.5) 121.2, S = 7 (0.571) 132.2, S = 8 (0.5) 116.2, S = 4 (0.5, below the L2 rule there)
// 116.9; on 13 of the 14 shapes of B 1..64, C 256..2048, L 256..4096 whose plan it changes there, 0.80-0.97x (fp32
// b5_c1024_l4096 84.3 -> 68.6, b64_c2048_l4096 1773 -> 1649) except fp32 b5_c2048_l4096 (S = 8 -> 13, 1.014x). On the
// H200 (60 MB L2) no suite plan changes (the L2 rule's S = 4 for bf16 and S = 8 for fp32 b8 already have the shortest
// path).
inline int64_t balance_rounds(int64_t groups, int64_t ctas, int64_t resident) {
  const auto rounds = [&](int64_t s) { return ceil_div(groups, std::max<int64_t>(1, resident / s)); };
  if (ctas >= kGridMaxCtas || rounds(ctas) <= 1) return ctas;
  int64_t best = ctas;
  for (int64_t s = ctas + 1; s <= std::min<int64_t>(kGridMaxCtas, 2 * ctas); ++s) {
    if (rounds(s) * best < rounds(best) * s) best = s;
  }
  return best;
}

// Tier 2 (gn_mish_grid.cuh): S CTAs of T threads per group, not a hardware cluster: their partial statistics meet
// in global memory, the grid is resident (cooperative launch) and its grid / S slots loop over the groups. Each
// CTA holds its slice in registers (items per thread per chunk) and, beyond one chunk, in a stash of as many
// slots as fit at the CTAs per SM that registers allow (capped by t1_stash; -1: none), re-reading the rest.
// spread = SMs / groups (<= 32): few groups still use every SM. T = t1_threads, else the smallest of 256/512/1024
// whose `spread` CTAs hold the group in one register chunk (S = spread, at least 2 vectors per thread), else 1024
// with the stash and S = the fewest CTAs (at least spread) whose CTAs in flight re-read at most half the L2 beyond
// registers and stash (H200, b8_c2048_l4096 fp32: S = 8, 10 of 32 vectors per thread re-read, 177.5 us; S = 12 or
// 16, all on chip but 6 or 8 rounds of groups, 187.5 / 185.4; S = 4, 192.8), then balanced over the rounds
// (`balance_rounds`). S = t2_ctas when given. 16-bit CTAs of
// 1024 threads take half chunks (4 vectors of 8 per thread; the first chunks stashed), so a chunk's statistics overlap
// the next one's loads (H200: bf16 b1_c2048_l4096, 2 chunks, 19.0-19.2 -> 17.7-18.2 us, trace load phase 5.2 -> 4.4;
// bf16 b8_c2048_l4096 at S = 4, 97.0 -> 95.8; fp32 with half chunks: equal or 6-10 % slower).
// ctas_resident(threads, smem): CTAs of the grid kernel per SM (occupancy). Returns false (plan unchanged) when
// t2 = -1, the group needs more than 32 CTAs, or S CTAs cannot be resident at once.
template <typename CtasResident>
bool plan_grid(const Problem& p, const Limits& lim, const DeviceInfo& dev, int vec, int64_t nv, int64_t groups,
               int thread_cap, CtasResident&& ctas_resident, Plan* out) {
  if (lim.t2 < 0) return false;
  const int full = tier1_items_full(vec);
  int items = lim.t1_items > 0 && lim.t1_items < full ? tier1_items_half(vec) : full;
  const int spread = int(std::max<int64_t>(1, std::min<int64_t>(kGridMaxCtas, dev.sms / groups)));
  int threads = lim.t1_threads > 0 ? std::min(lim.t1_threads, thread_cap) : 0;
  int64_t ctas = lim.t2_ctas;
  if (threads == 0) {
    for (int t : {256, 512, 1024}) {
      t = std::min(t, thread_cap);
      if (ceil_div(nv, int64_t(t) * items) <= spread) {
        threads = t;
        if (ctas == 0) ctas = std::max<int64_t>(1, std::min<int64_t>(spread, ceil_div(nv, 2 * int64_t(t))));
        break;
      }
    }
    if (threads == 0) threads = std::min(kMaxThreads, thread_cap);
  }
  if (lim.t1_items == 0 && vec == 8 && threads == kMaxThreads) items = tier1_items_half(vec);  // 16-bit: half chunks
  const int stage_bound = int(std::min<int64_t>(kStageMaxChannels, p.channels / p.groups));
  const int slots_max = lim.t1_stash < 0 || vec == 1 ? 0 : stash_capacity(dev, threads, ctas_per_sm(lim, threads),
                                                                          stage_bound);
  const int per_thread = items + (lim.t1_stash > 0 ? std::min(slots_max, lim.t1_stash) : slots_max);
  if (ctas == 0) {  // the fewest (>= spread) whose CTAs in flight re-read at most half the L2, else 32
    const int64_t per_sm = ctas_per_sm(lim, threads);
    for (ctas = spread; ctas < kGridMaxCtas; ++ctas) {
      const int64_t reread = std::max<int64_t>(0, ceil_div(nv, ctas) - int64_t(threads) * per_thread) * 16;
      if (reread * std::min(groups * ctas, per_sm * dev.sms) <= dev.l2_bytes / 2) break;
    }
    ctas = balance_rounds(groups, ctas, per_sm * dev.sms);
  }
  if (ctas > kGridMaxCtas || groups * ctas >= (int64_t(1) << 31)) return false;  // 32-bit partial index
  Plan pl;
  pl.vec = vec;
  pl.tier = 2;
  pl.threads = threads;
  pl.items = items;
  pl.cluster = int(ctas);
  pl.slice_vecs = ceil_div(nv, ctas);
  pl.chunks = int(ceil_div(pl.slice_vecs, int64_t(threads) * items));
  const int64_t span = slice_channels(p, pl.slice_vecs, vec);
  pl.stage = span <= kStageMaxChannels ? int(span) : 0;
  const int cap = lim.t1_stash > 0 ? std::min(slots_max, lim.t1_stash) : slots_max;
  pl.stash = std::min(cap, (pl.chunks - 1) * items);
  pl.smem_bytes = tier1_smem(lim, dev, pl.stash ? stash_offset(pl.stage) + pl.stash * threads * 16
                                                  : pl.stage * 2 * int(sizeof(float)));
  const int64_t resident = int64_t(ctas_resident(threads, pl.smem_bytes)) * dev.sms;
  if (resident < ctas) return false;
  const int64_t slots = std::min(groups, resident / ctas);
  pl.grid = slots * ctas;
  pl.persistent = slots < groups;
  pl.counter_bytes = groups * 2 * int64_t(sizeof(uint32_t));
  pl.partial_bytes = groups * ctas * 16;
  *out = pl;
  return true;
}

// Tier 2 by default (t2 = 0), measured on an H200 (_tune.py --only grid; NOTES.md "Tier 2"): (a) few groups
// (SMs / groups >= 8, B = 1 at G = 8) of >= 64K vectors (1 MB of 16-byte vectors), where tier 1's clusters of <= 8
// CTAs leave half the SMs idle: b1_c2048_l1024 14.6 -> 12.2 us, b1_c512_l4096 14.8 -> 12.1, b1_c2048_l4096 31.7 ->
// 23.5 (bf16 25.2 -> 19.3); smaller groups stay on tier 1, whose cluster barrier is cheaper than a trip through L2
// (b1_c256_l1024 7.8 vs 7.8-8.5, b1_c512_l1024 8.8 vs 9.0, b1_c1024_l1024 9.8-10.4 vs 10.0-10.1 us at 32K vectors);
// (b) groups that tier 1 (plan t1) streams with more than half the L2 re-read in flight even with its stash: fp32
// b8_c2048_l4096 193.4 -> 174.9-177.5 us, bf16 (117 MB) 100.8 -> 95.8 at S = 4 (until the cheaper 16-bit normalise
// of 8884435, 16-bit stayed on tier 1: 102.3 vs 106.6 at 55c48d4); bf16 b16_c1024_l2048 (17 MB) is not re-read enough
// for this rule (at 55c48d4 tier 1 won, 52.6 vs 57.6; rule (c) of grid_one_round_by_default now moves it). Many fp32
// groups stay on tier 1 (b16_c1024_l2048 87.3 vs 87.3, b64_c1024_l1024 156.6 vs 175.4), as do B = 8 groups that fit
// (b8_c2048_l1024, stash: 41.4 vs 42.2).
inline bool grid_by_default(const Limits& lim, const DeviceInfo& dev, int vec, int64_t nv, int64_t groups,
                            const Plan& t1) {
  if (groups * 8 <= dev.sms && nv >= kGridFewMinVecs) return true;
  if (vec == 1 || t1.chunks < 2) return false;
  const int64_t in_flight = std::min<int64_t>(t1.grid, int64_t(ctas_per_sm(lim, t1.threads)) * dev.sms);
  return in_flight * t1.threads * 16 * ((t1.chunks - 1) * t1.items - t1.stash) > dev.l2_bytes / 2;
}

// Tier 2 by default where its one round holds every group and fills >= 90 % of the SMs (the caller checks that), in
// two cases the rules above keep on tier 1, measured on an H200 (NOTES.md "Tier 2 in one round"):
// (c) 16-bit plans that tier 1 streams (>= 2 chunks), where tier 2's half chunks, stash and whole-vector normalise
//     win: bf16 b16_c1024_l2048 52.2 -> 46.8 us, b8_c2048_l1024 28.0 -> 26.2, b5_c1024_l4096 40.4 -> 34.4,
//     b3_c2048_l4096 44.5 -> 39.2 (0.85-0.97 on 21 bf16 / fp16 shapes; B = 6 and 12, whose one round fills 96 SMs,
//     lost up to 3 % or tied: hence the 90 %);
// (d) one-wave tier-1 plans (grid <= SMs) whose clusters do not all fit at once (t1_resident(plan): CTAs of its
//     kernel resident together; 4- and 8-CTA clusters of 1024 threads: 120 of 128 on an H200), where the last
//     clusters ran as a second wave: fp32 b4_c1024_l4096 62.3 -> 41.9 us, b4_c512_l2048 20.6 -> 15.6, bf16
//     b4_c2048_l4096 80.7 -> 47.1 (0.58-0.76 on 17 shapes).
template <typename T1Resident>
bool grid_one_round_by_default(const DeviceInfo& dev, int vec, const Plan& t1, T1Resident&& t1_resident) {
  if (vec == 1) return false;  // scalar plans were not measured
  return (vec == 8 && t1.chunks >= 2) || (t1.grid <= dev.sms && t1_resident(t1) < t1.grid);
}

// Tier 1 with the slice in shared memory (gn_mish_smem.cuh) for a one-chunk plan of <= 256-thread CTAs and 16-byte
// vectors: t1_smem = 1 keeps the clusters (8 vectors per thread: 6 CTAs of 40 registers per SM instead of 4 of 64),
// 2 halves the CTAs per group (16 vectors per thread, 64 KB per 256-thread CTA: 3 per SM, half the reductions).
// The rule (t1_smem = 0): same CTAs when the launch is more than one wave of the register kernel (more CTAs per SM
// is what the shared-memory slice buys), measured on an H200 (NOTES.md "The slice in shared memory"): b64_c256_l1024
// 39.8 -> 39.0 us, b64_c512_l1024 80.1 -> 75.4, b64_c1024_l256 40.3 -> 38.4, bf16 b64_c512_l1024 46.4 -> 45.2, fp16
// 45.6 -> 43.8; one wave stays in registers (b64_c256_l256, 512 CTAs of one per group: 13.0 vs 14.1; B = 1, 64 CTAs:
// 7.3 vs 7.3). Unchanged when the slice does not fit the CTA's shared memory.
inline void plan_smem_slice(const Problem& p, const Limits& lim, const DeviceInfo& dev, Plan* pl) {
  if (lim.t1_smem < 0 || pl->tier != 1 || pl->persistent || pl->chunks != 1 || pl->vec == 1 ||
      pl->threads > kSmemSliceThreads || dev.smem_optin == 0) {
    return;
  }
  const bool waves = lim.t1_ctas_per_sm == 0 && pl->grid > int64_t(ctas_per_sm(lim, pl->threads)) * dev.sms;
  const int mode = lim.t1_smem > 0 ? lim.t1_smem : waves ? 1 : 0;
  if (mode == 0) return;
  Plan q = *pl;
  if (mode == 2 && q.cluster > 1) {
    const int64_t nv = p.channels / p.groups * p.length / q.vec;
    q.grid /= q.cluster;
    q.cluster /= 2;
    q.grid *= q.cluster;
    q.slice_vecs = ceil_div(nv, q.cluster);
  }
  q.items = int(ceil_div(q.slice_vecs, q.threads));
  const int64_t span = slice_channels(p, q.slice_vecs, q.vec);
  q.stage = span <= kStageMaxChannels ? int(span) : 0;
  q.stash = 0;
  const int64_t bytes = stash_offset(q.stage) + q.slice_vecs * 16;
  if (bytes + kStaticSmemBound > dev.smem_optin) return;
  q.smem_bytes = int(bytes);
  q.smem_slice = 1;
  *pl = q;
}

// Tier 3 (gn_mish_spread.cuh): a resident grid of P CTAs (t3_ctas, else one per SM), CTA r holding vectors
// [r * piece, (r + 1) * piece) of every group in shared memory (piece: ceil(nv / P) rounded up to 8 vectors), the
// groups pipelined through the chip. CTAs of t1_threads (else 1024) threads: t3_reducers group warps (else one per
// group, up to 8) reduce, publish and collect, the rest store; t3_depth (else 4) groups requested ahead per CTA
// (H100, cold, against all 8 at once: bf16 / fp16 b1_c2048_l4096 0.948 / 0.945, fp32 b1_c2048_l1024 0.982,
// b1_c512_l4096 0.969; depth 2 lost 2-3 % on fp32: results/nvidia-h100-80gb-hbm3/tune/gn_mish-spread-ab-depth-*.txt).
// Needs sm_90 (bulk copies), 16-byte vectors, <= 32 groups and every piece of every group in one CTA's shared
// memory, after them the gamma/beta of the channels a piece spans in every group (`stage`, when <= 16 KB; else read
// through L1); returns false (plan unchanged) otherwise. A count per group and a departure counter (128 bytes each),
// then the slots (8 bytes per group and CTA) live in the counters buffer.
inline bool plan_spread(const Problem& p, const Limits& lim, const DeviceInfo& dev, int vec, int64_t nv,
                        int64_t groups, int thread_cap, Plan* out) {
  if (lim.t3 < 0 || vec == 1 || dev.major < 9 || groups > kSpreadMaxGroups || dev.sms < 1) return false;
  const int ctas = std::min({lim.t3_ctas > 0 ? lim.t3_ctas : dev.sms, dev.sms, kSpreadMaxCtas});
  const int threads = lim.t1_threads > 0 ? std::min(lim.t1_threads, thread_cap) : std::min(kMaxThreads, thread_cap);
  const int reducers = lim.t3_reducers > 0 ? lim.t3_reducers
                                            : int(std::min<int64_t>({kSpreadReducers, groups, threads / kWarp / 2}));
  if (reducers < 1 || reducers + 1 > threads / kWarp) return false;  // >= 1 group warp, >= 1 storer
  const int64_t piece = ceil_div(ceil_div(nv, ctas), kSpreadPieceAlign) * kSpreadPieceAlign;
  const int64_t span = slice_channels(p, piece, vec);
  const int stage = groups * span * 2 * int(sizeof(float)) <= kSpreadStageBytes ? int(span) : 0;
  const int64_t smem = groups * (piece * 16 + stage * 2 * int(sizeof(float)));
  if (smem + kSpreadStaticSmem > dev.smem_optin) return false;
  Plan pl;
  pl.vec = vec;
  pl.tier = 3;
  pl.threads = threads;
  pl.reducers = reducers;
  pl.grid = ctas;
  pl.cluster = 1;
  pl.slice_vecs = piece;
  const int64_t per_group = std::max<int64_t>(1, (threads / kWarp - reducers) / groups);  // storer warps, fewest
  pl.items = int(ceil_div(piece, per_group * kWarp));  // vectors per storer thread of a group
  pl.stage = stage;
  pl.depth = int(std::min<int64_t>(lim.t3_depth > 0 ? lim.t3_depth : kSpreadDepth, groups));
  pl.smem_bytes = int(smem);
  pl.counter_bytes = (groups + 1) * kSpreadCounterStride * int(sizeof(uint32_t)) + groups * ctas * 8;
  *out = pl;
  return true;
}

// Tier 3 by default (t3 = 0, t2 = 0): where rule (a) of grid_by_default would take tier 2 for the measured B = 1
// (SMs / groups >= 16: 8 groups on 132 SMs, of >= 64K vectors each) and x fits on chip (plan_spread). H100, cold, same
// process against the default of the time (results/nvidia-h100-80gb-hbm3/tune/gn_mish-spread-ab-*.txt): fp32
// b1_c2048_l1024 12.43 -> 11.78 us, b1_c512_l4096 12.30 -> 11.74, bf16 b1_c2048_l4096 19.33 -> 18.35, fp16 19.34 ->
// 18.70. Smaller B = 1 groups stay on tier 1, whose cluster exchange is cheaper than the trip through L2
// (b1_c1024_l1024 9.22 vs 9.66, b1_c256_l1024 6.82 vs 8.96), as do more groups (b2_c1024_l1024 12.40 vs 13.82,
// b4_c512_l1024 12.77 vs 18.34).
inline bool spread_by_default(const Limits& lim, const DeviceInfo& dev, int64_t nv, int64_t groups) {
  return lim.t3 == 0 && lim.t2 == 0 && groups * 16 <= dev.sms && nv >= kGridFewMinVecs;
}

template <typename Fits16, typename Clusters, typename GridResident, typename T1Resident>
Plan choose_plan(const Problem& p, const Limits& lim, const DeviceInfo& dev, int vec, Fits16&& fits16,
                 Clusters&& clusters, GridResident&& grid_resident, T1Resident&& t1_resident) {
  const int64_t nv = p.channels / p.groups * p.length / vec;
  const int64_t groups = p.batch * p.groups;
  Plan out;
  out.vec = vec;
  const int thread_cap = std::max(kWarp, std::min(kMaxThreads, lim.max_threads / kWarp * kWarp));
  if (nv <= kTier0MaxVecs) {
    plan_tier0(lim, dev, nv, groups, &out);
  } else if ((lim.t3 > 0 || spread_by_default(lim, dev, nv, groups)) &&
             plan_spread(p, lim, dev, vec, nv, groups, thread_cap, &out)) {
    return out;
  } else if (!(lim.t2 > 0 && plan_grid(p, lim, dev, vec, nv, groups, thread_cap, grid_resident, &out))) {
    plan_tier1(p, lim, dev, vec, nv, groups, fits16, clusters, &out);
    if (lim.t2 == 0 && grid_by_default(lim, dev, vec, nv, groups, out)) {
      plan_grid(p, lim, dev, vec, nv, groups, thread_cap, grid_resident, &out);  // unchanged if it cannot be resident
    } else if (lim.t2 == 0 && grid_one_round_by_default(dev, vec, out, t1_resident)) {
      Plan q = out;
      if (plan_grid(p, lim, dev, vec, nv, groups, thread_cap, grid_resident, &q) && !q.persistent &&
          q.grid * 10 >= int64_t(dev.sms) * 9) {
        out = q;
      }
    }
    plan_smem_slice(p, lim, dev, &out);
  }
  return out;
}

}  // namespace gn_mish
