// conv1d.h: host launchers of the conv1d CUDA kernels (naive.cu, optimized.cu, stream.cu, stream_rows.cu,
// tiled.cu).
//
// y[b, co, l] = bias[co] + sum_{ci, k} w[co, ci, k] * x[b, ci, l + k - K/2]   (zero outside [0, L))
// x: B x Cin x L, w: Cout x Cin x K (K odd), bias: Cout, y: B x Cout x L, all contiguous, one dtype.
// No torch headers here: binding.cpp validates and allocates, these functions launch on `stream` and
// return the launch status (cudaErrorInvalidValue for a shape or config the kernel does not support).
// Every tuning knob has a default (the variants' behaviour); a field set to -1 by the binding means "default".
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

struct Conv1dShape {
    int B, Cin, Cout, L, K;
};

// naive.cu: seed Part IV, fp32.
cudaError_t conv1d_naive_f32(const float* x, const float* w, const float* bias, float* y, Conv1dShape s,
                             cudaStream_t stream);

// optimized.cu: seed Part V, fp32. Supports K in {1, 3, 5, 7} and Cin <= 2048. The `optimized` variant runs it
// for B*L <= tiled_min_bl and the tiled kernel (below) above.
struct Conv1dOptimizedConfig {
    int cpt;            // input channels per thread
    int lt;             // output positions per tile
    int threads;        // block size, a multiple of 32
    size_t smem_bytes;  // dynamic shared memory
};
bool conv1d_optimized_config(Conv1dShape s, Conv1dOptimizedConfig* cfg);  // false: shape not supported
cudaError_t conv1d_optimized_f32(const float* x, const float* w, const float* bias, float* y, Conv1dShape s,
                                 cudaStream_t stream);
constexpr int kConv1dOptimizedTiledMinBL = 16;  // default: B*L above this runs tiled.cu

// tiled.cu: im2col-in-shared-memory GEMM, Y[Cout x B*L] = W[Cout x Cin*K] * X^[Cin*K x B*L], on fp32 FMAs or
// 3xTF32 tensor cores (fp32 accuracy), with a cp.async pipeline and split-K; the large-B*L path of both
// `optimized` and `stream`.
constexpr int kConv1dTiledTiles = 4;  // tile shapes (BM, BN, BK, TM, TN) in tiled.cu's table
// -1 = by rule (tuned on the H200, cold L2; NOTES.md): mma 1 (3xTF32 tensor cores: faster than the fp32 FMAs at
// every batch-8/64 Push-T shape); tile 0 for N = B*L <= 32, 1 for N <= 64, else 2 (with mma 0: 2 only when the
// GEMM has >= 2^30 MACs, N*Cout*Cin*K, else 1); stages 4 for tile 0 or mma, else 3; cache_policy 1 (evict_first)
// when one N tile (each weight read once) or mma, else 0 (several N tiles re-read the weights from L2).
constexpr long long kConv1dTiledBigTileMacs = 1LL << 30;
struct Conv1dTiledConfig {
    int tile = -1;          // index into the tile table, or -1 (rule above)
    int stages = -1;        // cp.async pipeline depth, 2..8 (lowered until ctas_per_sm CTAs fit an SM), or -1
    int ctas_per_sm = 2;    // split-K fills SMs x this many CTAs
    int cache_policy = -1;  // weight loads, as async_copy.cuh: 0 plain, 1 evict_first, 2 +256B, 3 256B only; -1
    int mma = -1;           // 1: 3xTF32 tensor cores (mma.sync m16n8k8), 0: fp32 FMAs, -1: the rule above
};
struct Conv1dTiledPlan {
    bool ok;                 // false: config out of range
    int tile;                // index into the tile table, as run
    int bm, bn, bk, tm, tn, threads;
    int n_tiles, m_tiles, splits, k_steps, stages;  // grid (n_tiles, m_tiles, splits)
    size_t smem_bytes;
    size_t workspace_floats;  // splits * tiles * BM * BN (0 when splits == 1)
    int counters;             // one per (n tile, m tile) when splits > 1
    int cache_policy;         // as run
    int mma;                  // as run: 1 tensor cores (3xTF32), 0 fp32 FMAs
};
Conv1dTiledPlan conv1d_tiled_plan(Conv1dShape s, const Conv1dTiledConfig& cfg, int num_sms);
cudaError_t conv1d_tiled_f32(const float* x, const float* w, const float* bias, float* y, float* workspace,
                             unsigned* counters, Conv1dShape s, const Conv1dTiledConfig& cfg, int num_sms,
                             cudaStream_t stream);

// stream.cu: weight-streaming kernel for small B*L, fp32 / bf16 / fp16 storage with fp32 accumulation.
enum Conv1dDtype { kConv1dF32 = 0, kConv1dBF16 = 1, kConv1dF16 = 2 };

// Defaults: the best of the H200 sweep on the 21 MB batch-1 shapes (NOTES.md), rpw8 v1 st3 cta1 pol1.
struct Conv1dStreamConfig {
    int rows_per_warp = 8;  // RPW: output rows per warp (x values read from shared memory feed RPW FMAs)
    int vecs_per_row = 1;   // V: 16-byte weight loads per lane, row and chunk (chunk = V*32*16 bytes per row)
    int stages = 3;         // cp.async ring depth, 2..8: stages - 1 chunks in flight per CTA while one is used
    int ctas_per_sm = 1;    // grid target SMs x this (splits along Cin*K fill it); 0: one chunk per CTA
    int cache_policy = 1;   // weight loads, as async_copy.cuh: 0 plain, 1 evict_first, 2 +256B, 3 256B only
    int tiled_min_bl = 16;  // fp32 with B*L above this runs tiled.cu instead (bf16/fp16 always stream here)
    int bulk = 0;           // 1: the weight ring is filled by TMA bulk copies counted on mbarriers (rows with
                            // Cin*K*sizeof(T) % 16 == 0 and a 16-byte aligned w; else the cp.async ring runs)
    int rows = 1;           // 1: stream_rows.cu (whole rows per CTA, all bulk copies up front) where its plan
                            // fits (conv1d_rows_plan); 0 or a shape it does not fit: the kernel above
    // stream_rows.cu, 0 = the measured rule of conv1d_rows_plan (by the bytes of w per CTA):
    int row_chunks = 0;     // column chunks per row (0, 1..kConv1dRowsMaxChunks), one mbarrier each
    int row_threads = 0;    // threads per CTA (0, 256, 512 or 1024)
    int row_ahead = 0;      // D, chunks in flight (0..kConv1dRowsMaxChunks): 0..D-1 requested at launch, chunk
                            // c + D once chunk c has landed (>= chunks: every copy at launch)
};
struct Conv1dStreamPlan {
    bool ok;                  // false: config out of range
    int rows_per_warp, vecs_per_row;  // as run (combinations not instantiated for this case fall back to 4, 2)
    int outputs_per_pass;     // NO: (b, l) outputs accumulated per CTA, 4, 8 or 16
    int passes;               // ceil(B*L / NO) (grid.z)
    int splits;               // CTAs along the Cin*K reduction (grid.x), each a contiguous range of chunks
    int row_groups;           // CTAs along Cout (grid.y), 8 * rows_per_warp output channels each
    int chunks;               // ceil(Cin*K / chunk columns)
    int chunks_per_cta;       // most chunks one CTA streams (ranges are balanced)
    int stages;               // as run (lowered to fit shared memory)
    size_t smem_bytes;        // ring (+ one 8-byte mbarrier per warp and stage with bulk) + im2col of the CTA's columns
    size_t workspace_floats;  // splits * Cout * B*L partial sums (0 when splits == 1)
    int counters;             // arrival counters (row_groups * passes; 0 when splits == 1)
    int bulk;                 // 1: TMA bulk ring (cfg.bulk and 16-byte rows; the launch also needs an aligned w)
    int rows;                 // 1: stream_rows.cu runs (then splits = passes = 1, row_groups = its CTAs, chunks =
                              // chunks_per_cta = stages = its chunks, no workspace); the launch needs an aligned w
};

// stream_rows.cu: whole rows per CTA for B*L <= 16 (see its header). Pure host logic.
constexpr int kConv1dRowsMaxChunks = 32;
constexpr long long kConv1dRowsLongSlab = 128 * 1024;  // bytes of w per CTA from which the rule streams in chunks
struct Conv1dRowsPlan {
    bool ok;            // false: the shape does not fit (B*L > 16, rows not whole 16-byte vectors, smem) or a
                        // knob is out of range
    int outputs;        // NO: B*L padded to 4, 8 or 16
    int rows_per_cta;   // RC: 1, 2, 4 or 8 (RC * NO <= 32), the least power of two >= Cout / SMs
    int ctas;           // ceil(Cout / RC)
    int chunks;         // column chunks per row: one bulk copy per row each, all on one mbarrier per chunk
    int chunk_cols;     // columns per chunk, whole 16-byte vectors
    int threads;        // per CTA: 256, 512 or 1024 (warp totals: threads / 32 rows of 32 fp32)
    int ahead;          // chunks whose copies are requested at launch (1..chunks); chunk c + ahead once c lands
    size_t smem_bytes;  // mbarriers + warp totals + RC rows of w + x as fp32
};
// chunks, threads, ahead: the config's row_chunks, row_threads, row_ahead (0 = the measured rule); out of range
// (conv1d_rows_knobs_ok): not ok.
bool conv1d_rows_knobs_ok(int chunks, int threads, int ahead);
Conv1dRowsPlan conv1d_rows_plan(Conv1dShape s, int elem_bytes, int chunks, int threads, int ahead, int num_sms);
cudaError_t conv1d_stream_rows(Conv1dDtype dtype, const void* x, const void* w, const void* bias, void* y,
                               Conv1dShape s, const Conv1dRowsPlan& p, int cache_policy, cudaStream_t stream);

Conv1dStreamPlan conv1d_stream_plan(Conv1dShape s, int elem_bytes, const Conv1dStreamConfig& cfg, int num_sms);

// workspace: plan.workspace_floats floats (any content); counters: plan.counters zeros, left zero on exit.
cudaError_t conv1d_stream(Conv1dDtype dtype, const void* x, const void* w, const void* bias, void* y,
                          float* workspace, unsigned* counters, Conv1dShape s, const Conv1dStreamConfig& cfg,
                          int num_sms, cudaStream_t stream);
