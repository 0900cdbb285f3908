// Launch planning of the fused GroupNorm+Mish kernels: tier 0 and tier 1 (clusters) and choose_plan, which picks
// the tier. Pure host logic (no CUDA calls), shared by gn_mish.cu and the host-compiled planner test
// (tests/test_gn_mish.py); constants and shared arithmetic in gn_mish_plan_base.cuh, tiers 2 and 3 and the slice in
// shared memory in gn_mish_plan_wide.cuh.
#pragma once

#include <initializer_list>

#include "gn_mish_plan_base.cuh"
#include "gn_mish_plan_wide.cuh"

namespace gn_mish {

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
// most one CTA per SM (groups * K <= SMs); half register chunks (4 vectors per thread) in the smaller of 256/512-thread
// CTAs whose cluster holds the group, else full chunks in the smallest of 256/512/1024-thread CTAs whose cluster holds
// it, else streaming through 1024-thread CTAs; then split (down to 2 vectors per thread) up to that cap. Half chunks
// (H100s, cold, same process: results/nvidia-h100-80gb-hbm3/tune/gn_mish-b1-*-20261125.txt): fp32 b1_c256_l1024
// 8 x 256 with 4 vectors per thread in the half-chunk kernel instead of 4 of the full kernel's 8, 0.962-0.975;
// b1_c512_l1024 8 x 512 instead of 8 x 256 full, 0.951-0.973; bf16 b1_c1024_l1024 8 x 512, 0.949-0.955; where
// 1024-thread CTAs would be needed, full chunks stay (fp32 b1_c1024_l1024 8 x 1024 half 1.010-1.079 of 8 x 512 full;
// b8_c256_l1024 2 x 1024 half 1.041-1.076 of 2 x 512 full). H200:
// b1_c2048_l1024 8 x 1024 (14.5 us, 16 x 512 17.3); B = 8 (64 groups) 2-CTA clusters on 128 SMs: b8_c256_l1024
// 2 x 512 (11.0 us; 1 x 1024 11.7), b8_c512_l1024 2 x 1024 (14.9; 1 x 1024 streaming 2 chunks 18.3),
// b8_c2048_l1024 2 x 1024 streaming 4 chunks (48.4 us; 1 x 1024 streaming 8 55.3, 8 x 256 57.1, 16 x 128 56.5),
// b8_c2048_l4096 2 x 1024 streaming 16 chunks (194 us; the earlier rule's 4 x 1024 streaming 8 on two waves of
// 256 CTAs, which raised K to keep <= 8 chunks per CTA: 220 us; bf16 105-109 vs 155 us).
inline void pick_tier1_few(const DeviceInfo& dev, int64_t nv, int64_t groups, int max_k, int thread_cap, int vec,
                           bool free_items, Plan* out) {
  const int big = std::min(kMaxThreads, thread_cap);
  const int cap = std::min({max_k, kFewCtaMaxCluster, pow2_floor(dev.sms / groups)});
  // The first CTA size in `sizes` whose cluster of <= cap CTAs holds the group in chunks of `items` vectors.
  auto fit = [&](int items, std::initializer_list<int> sizes) {
    for (int threads : sizes) {
      threads = std::min(threads, thread_cap);
      const int k = pow2_ceil(ceil_div(nv, int64_t(threads) * items));
      if (k <= cap) {
        out->items = items;
        out->threads = threads;
        out->cluster = k;
        return true;
      }
    }
    return false;
  };
  if (!(free_items && fit(tier1_items_half(vec), {256, 512})) && !fit(out->items, {256, 512, 1024})) {
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
    pick_tier1_few(dev, nv, groups, max_k, thread_cap, vec, lim.t1_items == 0, out);
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
