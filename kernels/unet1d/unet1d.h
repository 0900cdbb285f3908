// unet1d.h: one launch of the U-Net's generic layer kernel, described by plain C structs (no torch).
//
// A forward is a program of ~30 ops (kernels/unet1d/_program.py builds it once per model and batch). Op i:
//   X[c, l]   = transform of the op's input sources (1 or 2 channel ranges, concatenated), for one batch
//               element b (or for every b at once when the batch is folded into l: the step encoder and FiLM
//               linears, where l indexes the batch):
//               v = raw (or sin/cos of the timestep); GroupNorm over the source's own groups; Mish; FiLM
//               (scale * v + shift, or v + shift); + res (the residual branch, or the block's input)
//   out_s[co, j] = bias[co] + sum_{ci, k} W_s[co, ci, k] X[ci, j * stride + k - pad]   for each segment s
//               (a Conv1d, a strided Conv1d, one output phase of the ConvTranspose1d, or a Linear with l = batch)
// and optionally X itself is stored (`mat`): a block input needed later as an identity residual or a skip.
// Field meanings are the kernel's contract; _launch.py mirrors this layout with ctypes (a test checks offsets).
#pragma once

#include <stdint.h>

#define UNET_MAX_SRC 2
#define UNET_MAX_SEG 2
#define UNET_MAX_RING 8
#define UNET_MAX_GROUPS 32
#define UNET_MAX_NB 16

typedef struct {
    const float* raw;       // value (b, c, l) at raw[b * sb + c * sc + l * sl]   (kind 0)
    const float* res;       // nullable: + res[(b * channels + c) * L + l] after the FiLM
    const float* gamma;     // nullable: GroupNorm(groups) affine over this source's channels; none when null
    const float* beta;
    const float* film_a;    // nullable: FiLM from film_a[b * film_ld + film_off + c] (+ film_b[t_b * film_ld + ...])
    const float* film_b;    // nullable: the denoising-step form's timestep table (num_t rows of film_ld)
    const int64_t* t;       // timesteps (B): the sinusoid's t (kind 1) and the table's row
    int64_t sb, sc, sl;
    int32_t channels, groups, act, film;  // act: 1 = Mish; film: 0 none, 1 scale and shift, 2 shift only
    int32_t film_off, film_ld, kind, num_t;  // kind: 0 tensor, 1 sin/cos embedding of t[l] (channels = dim)
    int32_t early, res_early, coef_early, pad_;  // written two or more ops back (or before the forward): the
                                                 // raw values, the residual, the FiLM may be read before the
                                                 // dependency wait (each op releases its dependents after it)
} UnetSource;

typedef struct {
    const float* w;         // packed per CTA and stage in mma fragment order (_pack.pack_weight), zero-padded
    const float* bias;      // [ncta * rc]
    float* out;             // out[b * ob + co * oc + (j * ostep + ophase) * ol], co < rows, j < l_out
    int64_t ob, oc, ol;
    int32_t rows, k, pad, stride, ostep, ophase, l_out;
    int32_t rc, cb, nstages, cta0, ncta, nb;  // rows per CTA (nb blocks of 8), channels per stage (blocks of 8),
                                              // CTAs [cta0, cta0 + ncta)
    int32_t simt;           // 1: fp32 FMAs on CUDA cores (a stride-1 'same' conv of 4 or 8 columns, 512 threads),
                            // weights packed per stage [row pair][channel][row][tap]; 0: tensor cores (3xTF32);
                            // 2 (segment 0 only): as 1, and its CTAs also compute segment 1 (a 1x1 conv of the
                            // same X, rows and columns: the rider, its cta0 past the grid, no weights of its own)
                            // from tap k of these weights (k + 1 taps per row and channel)
    int32_t wbf16;          // 1 (SIMT segments only): the packed weights are bf16 (w points at their pairs, the low
                            // half first), widened exactly to fp32 in the stage loop; 0: fp32
} UnetSegment;

typedef struct {
    UnetSource src[UNET_MAX_SRC];
    UnetSegment seg[UNET_MAX_SEG];
    float* mat;             // nullable: X stored as (B, cin, l_in), each CTA its share
    int32_t nsrc, nseg, cin, cin_pad, l_in, cols;  // cols: output columns the MMA tiles cover (8, 16 or 32)
    int32_t batch_grid, ring, coef, smem_bytes, grid, threads;  // grid = batch_grid * sum(ncta)
    uint64_t* trace;        // nullable: %globaltimer at the kernel's phase boundaries, UNET_TRACE_POINTS per CTA
    int32_t copy;           // how stages reach shared memory: 0 TMA bulk copy (L2 evict_first), 1 TMA bulk copy
                            // (no hint), 2 cp.async by every thread (16 bytes each, L2 evict_first)
    int32_t stat_in_n;      // outputs per partial of stat_in (its producer's n)
    float* stat_out;        // nullable: segment 0 also writes, per n = stat_out_n consecutive outputs e = (b * rows
                            // + co) * l_out + j, their mean and sum of squared deviations: stat_out[2 (e / n) + {0, 1}]
    const float* stat_in;   // nullable: source 0's GroupNorm statistics from those partials (its producer's
                            // stat_out), combined instead of summed over X: the statistics pass leaves the op's
                            // critical path (the loads overlap the sources')
    int32_t stat_out_n;     // outputs per partial of stat_out (_plan.partial_outputs: a power of two up to 32
                            // dividing rc * l_out, so that no partial straddles two CTAs)
} UnetOp;

#define UNET_TRACE_POINTS 40  // start, weights requested, dependency met, sources in, statistics, transform done,
                              // first stage landed, stages done, then stage s landed for s < 32 (ns)

#ifdef __cplusplus
extern "C" {
#endif
// Dynamic shared memory of one op: [ring barriers][GroupNorm stats][reduction][coefficients][ring][X].
// The reduction holds one partial per warp, row and output column: threads / 32 * max over segments of rc * l_out.
int dpk_unet1d_smem_bytes(const UnetOp* op);
int dpk_unet1d_struct_sizes(int* source, int* segment, int* op);
// Raise every kernel instantiation's dynamic shared-memory limit; once per device before the first launch.
int dpk_unet1d_prepare(int max_smem_bytes);
// Launch ops[0..n) in order on `stream`, each with programmatic dependent launch when pdl != 0.
int dpk_unet1d_launch(const UnetOp* ops, int n, void* stream, int pdl);
const char* dpk_unet1d_error_string(int code);
#ifdef __cplusplus
}
#endif
