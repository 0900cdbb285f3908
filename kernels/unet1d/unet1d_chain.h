// unet1d_chain.h: a run of small consecutive ops of the program (unet1d.h says what an op computes) as one launch
// on one cluster of CTAs (no torch).
//
// At B = 1 the ops of a few hundred channels (blog's 256-channel head and tail: up to 1.3 MB of weights each) are
// latency, not bandwidth: as grids they wait for each other's completion and every CTA re-reads, re-normalises
// and re-transforms the whole input. A chain runs them in order on `ctas` CTAs of one cluster: CTA r owns rows
// [r rc, (r + 1) rc) of every segment, pushes its outputs into the matching slot of every CTA's shared memory
// (distributed shared memory), and one cluster barrier per op replaces the grid boundary. Each CTA's weights of the
// whole chain are one stream of stages through a ring, so the next op's weights land during this op.
// _chain.py mirrors this layout with ctypes (a test checks the sizes).
#pragma once

#include <stdint.h>

#include "unet1d.h"

#define UNET_CHAIN_MAX_LINKS 8
#define UNET_CHAIN_MAX_RING 8
#define UNET_CHAIN_HALO 4  // zero columns each side of X's rows (pad <= 2, and a stride-2 conv's last tap)

typedef struct {
    const float* w;     // [ctas][nstages][rc][k][cb]: a CTA's rows, a stage's channels (zero-padded)
    const float* bias;  // [rows]
    float* out;         // nullable: out[co * oc + (j * ostep + ophase) * ol] (b = 0): read outside the chain
    int64_t ob, oc, ol;
    int32_t rows, k, pad, stride, ostep, ophase, l_out;
    int32_t rc, cb, nstages;  // rows per CTA (<= 16, or 32), channels per stage, stages
    int32_t out_slot;         // >= 0: the output also lands in this slot of every CTA, at the same element offsets
    int32_t pad_;
} UnetLinkSeg;

typedef struct {
    UnetSource src[UNET_MAX_SRC];  // as unet1d.h; raw / res are read from slots where src_slot / res_slot >= 0
    UnetLinkSeg seg[UNET_MAX_SEG];
    float* mat;                    // nullable: X stored as (cin, l_in) (each CTA its share of the channels)
    int32_t src_slot[UNET_MAX_SRC], res_slot[UNET_MAX_SRC];
    int32_t mat_slot, nsrc, nseg, cin, l_in, pad_;
} UnetLink;

typedef struct {
    UnetLink link[UNET_CHAIN_MAX_LINKS];
    int32_t n, ctas, nslots, slot_floats;  // links; CTAs (the cluster); slots of slot_floats each
    int32_t stage_floats, ring, cin_max, l_max;  // ring slots of stage_floats; X of cin_max x (l_max + 2 halo)
    int32_t smem_bytes, pad_;
    uint64_t* trace;  // nullable: %globaltimer per CTA and link at UNET_CHAIN_TRACE_POINTS phase ends
} UnetChain;

#define UNET_CHAIN_TRACE_POINTS 8  // link start (barrier passed), sources, statistics, coefficients, transform,
                                   // segment 0 done, segment 1 done, pushed

#ifdef __cplusplus
extern "C" {
#endif
// Dynamic shared memory of a chain: [ring barriers][GroupNorm stats][links][coefficients][X][slots][ring].
int dpk_unet1d_chain_smem_bytes(const UnetChain* chain);
int dpk_unet1d_chain_struct_sizes(int* seg, int* link, int* chain);
// Raise the chain kernel's shared-memory limit and allow clusters of up to 16; once per device.
int dpk_unet1d_chain_prepare(int max_smem_bytes);
// Launch one chain as one cluster on `stream` (programmatic dependent launch when pdl != 0).
int dpk_unet1d_chain_launch(const UnetChain* chain, void* stream, int pdl);
#ifdef __cplusplus
}
#endif
