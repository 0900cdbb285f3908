// Host program of tests/test_conv1d.py (test_compiled_host_logic_matches_models): the real conv1d planners (host
// code of stream.cu, stream_rows.cu, tiled.cu and optimized.cu, linked in) on the shapes and knobs read from stdin.
// Prints the compiled default knobs first, then per input line "B Cin Cout L K sms <10 stream knobs> <5 tiled
// knobs>": the stream and rows plans for 4- and 2-byte elements, the tiled plan and the optimized config, which the
// test compares with the NumPy models (kernels/conv1d/_models*.py).
#include <cstdio>
#include "conv1d.h"
int main() {
    const Conv1dStreamConfig ds;
    const Conv1dTiledConfig dt;
    printf("%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d\n", ds.rows_per_warp, ds.vecs_per_row, ds.stages,
           ds.ctas_per_sm, ds.cache_policy, ds.tiled_min_bl, ds.bulk, ds.rows, ds.row_chunks, ds.row_threads,
           ds.row_ahead, dt.tile, dt.stages, dt.ctas_per_sm, dt.cache_policy, dt.mma, kConv1dOptimizedTiledMinBL,
           kConv1dRowsMaxChunks);
    int B, Cin, Cout, L, K, sms;
    Conv1dStreamConfig s;
    Conv1dTiledConfig t;
    while (scanf("%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", &B, &Cin, &Cout, &L, &K, &sms,
                 &s.rows_per_warp, &s.vecs_per_row, &s.stages, &s.ctas_per_sm, &s.cache_policy, &s.bulk, &s.rows,
                 &s.row_chunks, &s.row_threads, &s.row_ahead, &t.tile, &t.stages, &t.ctas_per_sm,
                 &t.cache_policy, &t.mma) == 21) {
        const Conv1dShape shape{B, Cin, Cout, L, K};
        for (int elem : {4, 2}) {
            const Conv1dStreamPlan p = conv1d_stream_plan(shape, elem, s, sms);
            printf("%d %d %d %d %d %d %d %d %d %d %zu %zu %d %d %d ", p.ok, p.rows_per_warp, p.vecs_per_row,
                   p.outputs_per_pass, p.passes, p.splits, p.row_groups, p.chunks, p.chunks_per_cta, p.stages,
                   p.smem_bytes, p.workspace_floats, p.counters, p.bulk, p.rows);
            const Conv1dRowsPlan r = conv1d_rows_plan(shape, elem, s.row_chunks, s.row_threads, s.row_ahead, sms);
            printf("%d %d %d %d %d %d %d %d %zu ", r.ok, r.outputs, r.rows_per_cta, r.ctas, r.chunks, r.chunk_cols,
                   r.threads, r.ahead, r.smem_bytes);
        }
        const Conv1dTiledPlan q = conv1d_tiled_plan(shape, t, sms);
        printf("%d %d %d %d %d %d %d %d %d %d %d %d %d %zu %zu %d %d %d ", q.ok, q.tile, q.bm, q.bn, q.bk, q.tm,
               q.tn, q.threads, q.n_tiles, q.m_tiles, q.splits, q.k_steps, q.stages, q.smem_bytes,
               q.workspace_floats, q.counters, q.cache_policy, q.mma);
        Conv1dOptimizedConfig c{};
        const bool ok = conv1d_optimized_config(shape, &c);
        printf("%d %d %d %d %zu\n", ok, c.cpt, c.lt, c.threads, c.smem_bytes);
    }
}
