// Launch planning of the fused GroupNorm+Mish kernels, part 2: the plans that spread groups over the chip, tier 2
// (CTAs meeting through global memory), tier 1's slice in shared memory and tier 3 (every CTA a piece of every
// group), and their default rules. Pure host logic; choose_plan (gn_mish_plan.cuh) calls them.
#pragma once

#include "gn_mish_plan_base.cuh"

namespace gn_mish {

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

// Tier 3 (gn_mish_spread.cuh): a resident grid of P CTAs (t3_ctas, else the largest power of two <= SMs: on H100s
// 128 CTAs on 132 SMs measured 0.976-0.987 of one per SM for bf16 b1_c2048_l4096, 0.980 fp16, 0.985-0.994 fp32
// b1_c512_l4096, 0.994-1.000 b1_c2048_l1024: results/nvidia-h100-80gb-hbm3/tune/gn_mish-b1-*-20261125.txt), CTA r
// holding vectors [r * piece, (r + 1) * piece) of every group in shared memory (piece: ceil(nv / P) rounded up to 8
// vectors), the groups pipelined through the chip. CTAs of t1_threads (else 1024) threads: t3_reducers group warps
// (else one per group, up to 8) reduce, publish and collect, the rest store; t3_depth (else 4) groups requested
// ahead per CTA (H100, cold, against all 8 at once: bf16 / fp16 b1_c2048_l4096 0.948 / 0.945, fp32
// b1_c2048_l1024 0.982, b1_c512_l4096 0.969; depth 2 lost 2-3 % on fp32:
// results/nvidia-h100-80gb-hbm3/tune/gn_mish-spread-ab-depth-*.txt).
// Needs sm_90 (bulk copies), 16-byte vectors, <= 32 groups and every piece of every group in one CTA's shared
// memory, after them the gamma/beta of the channels a piece spans in every group (`stage`, when <= 16 KB; else read
// through L1); returns false (plan unchanged) otherwise. A count per group and a departure counter (128 bytes each),
// then the slots (8 bytes per group and CTA) live in the counters buffer.
inline bool plan_spread(const Problem& p, const Limits& lim, const DeviceInfo& dev, int vec, int64_t nv,
                        int64_t groups, int thread_cap, Plan* out) {
  if (lim.t3 < 0 || vec == 1 || dev.major < 9 || groups > kSpreadMaxGroups || dev.sms < 1) return false;
  const int ctas = std::min({lim.t3_ctas > 0 ? lim.t3_ctas : pow2_floor(dev.sms), dev.sms, kSpreadMaxCtas});
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

}  // namespace gn_mish
