// Host program of tests/test_gn_mish.py (plan_printer fixture): prints choose_plan's answer on an H200-like device
// (132 SMs, sm_90, 16-CTA clusters fit; argv[1]: the L2 bytes, 60 MB unless given, 50 MB for an H100) for each input
// line "B C L G vec <16 Limits fields>": tier threads group_threads groups_per_cta cluster items chunks grid stash
// smem_slice.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include "gn_mish_plan.cuh"
using namespace gn_mish;
int main(int argc, char** argv) {
  const DeviceInfo dev{132, 9, 233472, 1024, 232448, argc > 1 ? atoi(argv[1]) : 62914560};
  Problem p;
  Limits k;
  int vec = 0;
  while (scanf("%lld %lld %lld %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", (long long*)&p.batch,
               (long long*)&p.channels, (long long*)&p.length, &p.groups, &vec, &k.max_threads, &k.max_cluster,
               &k.t0_threads, &k.t0_groups_per_cta, &k.t1_threads, &k.t1_items, &k.t1_ctas_per_sm, &k.t1_persistent,
               &k.t1_stash, &k.t2, &k.t2_ctas, &k.t1_smem, &k.t3, &k.t3_ctas, &k.t3_reducers, &k.t3_depth) == 21) {
    // tier-1 kernels resident at once: as many CTAs as the SMs hold, except 4- and 8-CTA clusters of 1024-thread CTAs,
    // of which an H200 holds 120
    const auto t1_resident = [](const Plan& pl) {
      return pl.threads == 1024 && pl.cluster >= 4 ? 120 : 132 * std::min(65536 / (pl.threads * 64), 2048 / pl.threads);
    };
    const Plan pl = choose_plan(p, k, dev, vec, [](int) { return true; }, [](int, int, int) { return 8; },
                                [](int threads, int smem) { return std::min({65536 / (threads * 64), 2048 / threads,
                                                                             233472 / (smem + 512 + 1024)}); },
                                t1_resident);
    printf("%d %d %d %d %d %d %d %lld %d %d\n", pl.tier, pl.threads, pl.group_threads, pl.groups_per_cta,
           pl.cluster, pl.items, pl.chunks, (long long)pl.grid, pl.stash, pl.smem_slice);
  }
  return 0;
}
