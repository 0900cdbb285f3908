// Host test of gn_mish_plan.cuh, run by tests/test_gn_mish.py (test_planner_covers_every_vector_once): for every
// shape x knobs x device read from stdin, the plan's mapping (the kernels' loops, repeated here) handles every vector
// of every group exactly once and respects the kernels' limits. Exit status 1 on any failure.
#include <cstdio>
#include <vector>
#include "gn_mish_plan.cuh"
using namespace gn_mish;
static int failures = 0;
static long checked = 0, persistent = 0, streaming = 0, stashed = 0, grid = 0, in_smem = 0, spread = 0;
#define EXPECT(cond, ...) do { if (!(cond)) { if (failures++ < 40) { printf("FAIL %s: ", #cond); \
  printf(__VA_ARGS__); printf("\n"); } return; } } while (0)

// CTAs per SM of the tier-2 kernel (registers, threads, shared memory), 0 when `none`.
static int grid_ctas_per_sm(const DeviceInfo& dev, int threads, int smem, bool none) {
  if (none) return 0;
  return std::min({kRegsPerSm / (threads * kTier1Regs), kThreadsPerSm / threads,
                   dev.smem_per_sm / (smem + kStaticSmemBound + dev.smem_reserved)});
}

static void check_plan(const Problem& p, const Limits& lim, const DeviceInfo& dev, int vec, bool fits16,
                       int resident_clusters, const char* what) {
  auto clusters = [&](int, int k, int) { return k <= kPortableCluster || fits16 ? resident_clusters : 0; };
  const bool few = resident_clusters < 8;  // the "few resident" variant: tier 2 cannot be resident at all
  auto grid_resident = [&](int threads, int smem) { return grid_ctas_per_sm(dev, threads, smem, few); };
  auto t1_resident = [&](const Plan& q) {
    return int(std::min<int64_t>(1 << 30, int64_t(resident_clusters) * q.cluster));
  };
  const Plan pl = choose_plan(p, lim, dev, vec, [fits16](int) { return fits16; }, clusters, grid_resident,
                              t1_resident);
  const int64_t nv = p.channels / p.groups * p.length / vec, groups = p.batch * p.groups;
  ++checked;
  persistent += pl.persistent;
  streaming += pl.chunks > 1;
  stashed += pl.stash > 0;
  grid += pl.tier == 2;
  in_smem += pl.smem_slice;
  spread += pl.tier == 3;
  EXPECT(pl.vec == vec && pl.threads >= kWarp && pl.threads <= kMaxThreads && pl.threads % kWarp == 0, "%s", what);
  std::vector<unsigned char> hits(size_t(nv), 0);
  if (pl.tier == 3) {  // gn_mish_spread.cuh: CTA r holds vectors [r * piece, (r + 1) * piece) of every group
    const int warps = pl.threads / kWarp;
    EXPECT((lim.t3 > 0 || (lim.t3 == 0 && lim.t2 == 0)) && vec > 1 && dev.major >= 9 && groups <= kSpreadMaxGroups &&
           pl.grid >= 1 &&
           pl.grid <= std::min(dev.sms, kSpreadMaxCtas) && (!lim.t3_ctas || pl.grid == std::min(lim.t3_ctas, dev.sms))
           && pl.reducers >= 1 && pl.reducers <= kSpreadMaxReducers && pl.reducers + 1 <= warps &&
           (!lim.t3_reducers || pl.reducers == lim.t3_reducers) && pl.threads <= lim.max_threads &&
           pl.slice_vecs % kSpreadPieceAlign == 0 && pl.slice_vecs * pl.grid >= nv &&
           (pl.slice_vecs - kSpreadPieceAlign) * pl.grid < nv &&
           pl.smem_bytes == groups * (pl.slice_vecs * 16 + pl.stage * 8) &&
           pl.stage * 8 * groups <= kSpreadStageBytes && pl.smem_bytes + kSpreadStaticSmem <= dev.smem_optin &&
           pl.counter_bytes == (groups + 1) * kSpreadCounterStride * 4 + groups * pl.grid * 8 &&
           pl.partial_bytes == 0 && pl.depth >= 1 && pl.depth <= groups &&
           pl.items == ceil_div(pl.slice_vecs, std::max<int64_t>(1, (warps - pl.reducers) / groups) * kWarp) &&
           pl.depth == std::min<int64_t>(lim.t3_depth ? lim.t3_depth : kSpreadDepth, groups), "%s: tier-3 plan", what);
    const FastDiv Ld(uint32_t(p.length));
    std::vector<unsigned char> reduced(size_t(nv), 0);
    for (int64_t r = 0; r < pl.grid; ++r) {  // a group warp's and the storers' loops over a piece
      const int64_t lo = std::min(nv, r * pl.slice_vecs), count = std::min(nv, lo + pl.slice_vecs) - lo;
      for (int t = 0; t < kWarp; ++t)
        for (int64_t v = t; v < count; v += kWarp) ++reduced[size_t(lo + v)];
      const int sws = warps - pl.reducers;  // storer warps, split over the groups as the kernel does
      const bool wide = sws >= groups;
      std::vector<int> stored(size_t(groups * count), 0);
      for (int sw = 0; sw < sws; ++sw) {
        const int q = wide ? sw / int(groups) : 0;
        const int Q = wide ? (sws - sw % int(groups) + int(groups) - 1) / int(groups) : 1;
        for (int64_t g = wide ? sw % groups : sw; g < groups; g += wide ? groups : sws)
          for (int lane = 0; lane < kWarp; ++lane)
            for (int64_t v = lane + q * kWarp; v < count; v += Q * kWarp) ++stored[size_t(g * count + v)];
      }
      for (int64_t i = 0; i < groups * count; ++i)
        EXPECT(stored[size_t(i)] == 1, "%s: stored %lld", what, (long long)i);
      for (int64_t v = 0; v < count; ++v) ++hits[size_t(lo + v)];
      if (pl.stage > 0 && count > 0) {  // the staged channels cover the piece's
        const int first = int(Ld.div(uint32_t(lo * vec))), last = int(Ld.div(uint32_t((lo + count) * vec - 1)));
        EXPECT(last - first < pl.stage, "%s: staged %d channels, piece spans %d", what, pl.stage, last - first + 1);
      }
    }
    for (int64_t v = 0; v < nv; ++v) EXPECT(reduced[size_t(v)] == 1, "%s: reduced vector %lld", what, (long long)v);
  } else if (pl.tier == 0) {
    const int tpg = pl.group_threads, gpc = pl.groups_per_cta, wpg = tpg / kWarp;
    EXPECT(nv <= kTier0MaxVecs && is_pow2(tpg) && tpg >= kWarp && pl.threads == tpg * gpc, "%s", what);
    EXPECT(is_pow2(pl.items) && pl.items <= kTier0MaxItems && pl.threads <= tier0_max_cta(pl.items), "%s", what);
    EXPECT(pl.threads / kWarp <= kWarp && (wpg <= 2 || wpg % 4 == 0), "%s: shared partials", what);
    EXPECT(pl.grid * gpc >= groups && (pl.grid - 1) * gpc < groups, "%s: grid", what);
    EXPECT(!lim.t0_threads || tpg == lim.t0_threads, "%s: t0_threads ignored", what);
    for (int t = 0; t < tpg; ++t)
      for (int j = 0; j < pl.items; ++j)
        if (t + int64_t(j) * tpg < nv) ++hits[size_t(t + j * tpg)];
  } else {
    const int k = pl.cluster, chunk = pl.threads * pl.items, cg = int(p.channels / p.groups);
    const bool t2 = pl.tier == 2;
    EXPECT(pl.tier == 1 || (t2 && lim.t2 >= 0 && !few), "%s: tier %d", what, pl.tier);
    if (t2) {  // S CTAs per group, the grid resident, grid / S slots; 2 counters per group, S partials per group
      const int ctas_sm = grid_ctas_per_sm(dev, pl.threads, pl.smem_bytes, false);
      EXPECT(k >= 1 && k <= kGridMaxCtas && (!lim.t2_ctas || k == lim.t2_ctas) && pl.grid % k == 0 &&
             pl.grid / k >= 1 && pl.grid / k <= groups && pl.grid <= int64_t(ctas_sm) * dev.sms &&
             pl.persistent == (pl.grid / k < groups) && pl.chunks == int(ceil_div(pl.slice_vecs, chunk)) &&
             pl.counter_bytes == groups * 8 && pl.partial_bytes == groups * k * 16 && (pl.stash == 0 || vec > 1) &&
             (lim.t1_stash >= 0 || pl.stash == 0), "%s: tier-2 plan", what);
      std::vector<int> owner(size_t(groups), 0);  // slot s takes groups s, s + slots, ...: each exactly once
      for (int64_t s = 0; s < pl.grid / k; ++s)
        for (int64_t g = s; g < groups; g += pl.grid / k) ++owner[size_t(g)];
      for (int64_t g = 0; g < groups; ++g) EXPECT(owner[size_t(g)] == 1, "%s: group %lld", what, (long long)g);
    } else {
      EXPECT(is_pow2(k) && k <= kMaxCluster && (k <= kPortableCluster || fits16) && (dev.major >= 9 || k == 1) &&
             k <= lim.max_cluster, "%s: cluster %d", what, k);
    }
    EXPECT(pl.threads <= lim.max_threads && (!lim.t1_threads || pl.threads == std::min(lim.t1_threads,
           lim.max_threads / kWarp * kWarp)), "%s: threads %d", what, pl.threads);
    if (pl.smem_slice) {  // gn_mish_smem.cuh: one pass of blockDim-strided vectors, the slice in shared memory
      EXPECT(pl.tier == 1 && lim.t1_smem >= 0 && !pl.persistent && pl.stash == 0 && pl.chunks == 1 && vec > 1 &&
             pl.threads <= kSmemSliceThreads && pl.items == int(ceil_div(pl.slice_vecs, pl.threads)) &&
             pl.items <= 2 * kSmemSliceItems && pl.smem_bytes == stash_offset(pl.stage) + pl.slice_vecs * 16 &&
             pl.smem_bytes + kStaticSmemBound <= dev.smem_optin, "%s: smem-slice plan", what);
    } else {
      EXPECT(pl.items == tier1_items_full(vec) || pl.items == tier1_items_half(vec), "%s: items", what);
    }
    EXPECT(pl.slice_vecs * k >= nv && pl.stage <= kStageMaxChannels, "%s", what);
    if (pl.persistent && !t2) {  // clusters loop over groups c, c + C, ...; one register chunk, one staged chan/thread
      EXPECT(lim.t1_persistent && pl.items == tier1_items_half(vec) && pl.chunks == 1 &&
             pl.slice_vecs <= int64_t(pl.threads) * pl.items && pl.stage <= pl.threads &&
             pl.smem_bytes >= 4 * pl.stage * 4 && pl.grid % k == 0 && pl.grid / k <= resident_clusters &&
             pl.grid / k >= 1 && pl.grid <= groups * k, "%s: persistent plan", what);
      // its own static bound: the padding to t1_ctas_per_sm CTAs must leave room for them, static part included
      EXPECT(pl.smem_bytes + kPersistentStaticSmem <= dev.smem_optin && (lim.t1_ctas_per_sm == 0 ||
             int64_t(pl.smem_bytes + kPersistentStaticSmem + dev.smem_reserved) * lim.t1_ctas_per_sm <=
             dev.smem_per_sm), "%s: persistent smem %d", what, pl.smem_bytes);
    } else if (!t2) {
      EXPECT(pl.grid == groups * k, "%s: grid", what);
    }
    EXPECT(pl.smem_bytes >= pl.stage * 8 && pl.smem_bytes <= std::max(pl.stage * 8, dev.smem_optin -
           kStaticSmemBound), "%s: smem %d", what, pl.smem_bytes);
    if (lim.t1_ctas_per_sm > 0 && pl.smem_bytes > pl.stage * 8 && !pl.smem_slice)  // one more CTA must not fit
      EXPECT(int64_t(pl.smem_bytes + kStaticSmemBound / 2 + dev.smem_reserved) * (lim.t1_ctas_per_sm + 1) >
             dev.smem_per_sm, "%s: residency cap", what);
    EXPECT(pl.stash >= 0 && pl.stash <= std::max(0, (pl.chunks - 1) * pl.items) && (pl.stash == 0 ||
           (vec > 1 && (t2 || !pl.persistent) && lim.t1_stash >= 0 && (lim.t1_stash == 0 ||
                                                                       pl.stash <= lim.t1_stash))),
           "%s: stash %d", what, pl.stash);
    if (pl.stash > 0) {  // the stash fits after the staged affine and costs no residency
      EXPECT(pl.smem_bytes >= stash_offset(pl.stage) + pl.stash * pl.threads * 16, "%s: stash smem", what);
      const int ctas = lim.t1_ctas_per_sm ? lim.t1_ctas_per_sm : std::max(1, std::min(
          kRegsPerSm / (pl.threads * kTier1Regs), kThreadsPerSm / pl.threads));
      EXPECT(int64_t(pl.smem_bytes + kStaticSmemBound + dev.smem_reserved) * ctas <= dev.smem_per_sm,
             "%s: stash of %d costs residency", what, pl.stash);
    }
    if (pl.persistent && !t2) {  // gn_mish_persistent_kernel: cluster c takes groups c, c + C, ...: each once
      std::vector<int> owner(size_t(groups), 0);
      const int64_t clusters = pl.grid / k;
      for (int64_t c = 0; c < clusters; ++c)
        for (int64_t g = c; g < groups; g += clusters) ++owner[size_t(g)];
      for (int64_t g = 0; g < groups; ++g) EXPECT(owner[size_t(g)] == 1, "%s: group %lld", what, (long long)g);
    }
    const FastDiv Ld(uint32_t(p.length));
    for (int r = 0; r < k; ++r) {  // the cluster and grid kernels' loops (the persistent kernel's: chunks == 1)
      const int v_begin = int(std::min<int64_t>(nv, r * pl.slice_vecs));
      const int v_end = int(std::min<int64_t>(nv, v_begin + pl.slice_vecs));
      const int chunks = (v_end - v_begin + chunk - 1) / chunk;
      EXPECT(chunks <= pl.chunks, "%s: chunks", what);
      if (pl.stage > 0 && v_end > v_begin) {
        const int lo = int(Ld.div(uint32_t(v_begin * vec))), hi = int(Ld.div(uint32_t(v_end * vec - 1)));
        EXPECT(hi - lo < pl.stage && hi < cg, "%s: staged %d channels, slice spans %d", what, pl.stage, hi - lo + 1);
      }
      if (pl.smem_slice) {
        for (int v = v_begin; v < v_end; ++v) ++hits[size_t(v)];  // thread (v - v_begin) % threads, any order
        continue;
      }
      for (int ci = 0; ci < chunks; ++ci)
        for (int t = 0; t < pl.threads; ++t)
          for (int j = 0; j < pl.items; ++j) {
            const int v = v_begin + ci * chunk + t + j * pl.threads;
            if (v < v_end) ++hits[size_t(v)];
          }
    }
  }
  for (int64_t v = 0; v < nv; ++v) EXPECT(hits[size_t(v)] == 1, "%s: vector %lld x%d", what, (long long)v, hits[v]);
}

int main() {
  for (uint32_t d : {1u, 2u, 3u, 5u, 7u, 8u, 12u, 16u, 31u, 600u, 1000u, 1023u, 1025u, 65537u, (1u << 30) - 1u}) {
    const FastDiv f(d);
    for (uint64_t n = 0; n < (1ull << 31); n = n < 70000 ? n + 1 : n * 3 / 2 + 7)
      if (f.div(uint32_t(n)) != uint32_t(n) / d) { printf("FAIL FastDiv %llu / %u\n", (unsigned long long)n, d);
                                                    ++failures; break; }
  }
  const DeviceInfo devices[] = {{132, 9, 233472, 1024, 232448, 62914560}, {114, 9, 233472, 1024, 232448, 52428800},
                                {108, 8, 167936, 1024, 166912, 41943040}};  // H200, H100 PCIe, A100
  int nshapes = 0, nknobs = 0;
  if (scanf("%d %d", &nshapes, &nknobs) != 2) return 2;
  std::vector<Problem> shapes(nshapes);
  for (auto& s : shapes)
    if (scanf("%lld %lld %lld %d", (long long*)&s.batch, (long long*)&s.channels, (long long*)&s.length,
              &s.groups) != 4) return 2;
  std::vector<Limits> knobs(nknobs);
  for (auto& k : knobs) {
    if (scanf("%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", &k.max_threads, &k.max_cluster, &k.t0_threads,
              &k.t0_groups_per_cta, &k.t1_threads, &k.t1_items, &k.t1_ctas_per_sm, &k.t1_persistent, &k.t1_stash,
              &k.t2, &k.t2_ctas, &k.t1_smem, &k.t3, &k.t3_ctas, &k.t3_reducers, &k.t3_depth) != 16) return 2;
    if (!limits_ok(k)) { printf("FAIL limits_ok rejects knob set %d\n", int(&k - knobs.data())); ++failures; }
  }
  for (const Problem& s : shapes)
    for (int vec : {1, 4, 8}) {
      if ((s.channels / s.groups * s.length) % vec) continue;
      for (size_t ki = 0; ki < knobs.size(); ++ki)
        for (const DeviceInfo& dev : devices)
          for (int variant = 0; variant < 3; ++variant) {  // 16-CTA clusters refused; few resident clusters
            if (variant > 0 && &dev != devices) continue;  // on one device is enough
            const bool fits16 = variant != 1;
            const int resident_clusters = variant == 2 ? 3 : dev.sms / 2;
            char what[160];
            snprintf(what, sizeof what, "B=%lld C=%lld L=%lld G=%d vec=%d knobs#%zu sms=%d fits16=%d res=%d",
                     (long long)s.batch, (long long)s.channels, (long long)s.length, s.groups, vec, ki, dev.sms,
                     int(fits16), resident_clusters);
            check_plan(s, knobs[ki], dev, vec, fits16, resident_clusters, what);
          }
    }
  printf("checked %ld plans (%ld persistent, %ld streaming, %ld stashed, %ld tier 2, %ld in shared memory, "
         "%ld tier 3), %d failures\n", checked, persistent, streaming, stashed, grid, in_smem, spread, failures);
  return failures ? 1 : 0;
}
