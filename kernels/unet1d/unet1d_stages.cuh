// unet1d_stages.cuh: steps 4-5 of unet1d.cu: a segment's stages (run_segment: 3xTF32 tensor-core MMAs, warps
// over channel blocks; run_segment_simt: fp32 FMAs, a thread per row pair and channel) and its store (+ bias, the
// warps' partial sums added, the reader's GroupNorm partials).
#pragma once

#include "unet1d_stream.cuh"

namespace {

// x = hi + lo with hi = x rounded to TF32 (10 mantissa bits; integer rounding of the bit pattern: every value
// here is finite) and lo = x - hi exactly; the tensor core reads lo's top 19 bits. Three products hi hi, hi lo,
// lo hi then carry x y to ~2^-19 relative (3xTF32): fp32-level accuracy for the sums of ~10^3-10^4 terms here.
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 5. + bias, the warps' partial sums added up, stored (and the reader's GroupNorm partials)
template <int T>
__device__ void store_segment(const UnetOp& op, const UnetSegment& seg, int c, int b, const float* red,
                              bool rider = false) {
    constexpr int kWarps = T / 32;
    const int tid = threadIdx.x, lane = tid & 31, rc = seg.rc, rows = seg.rows, lo = seg.l_out;
    const int row0 = c * rc;
    const float* bias = seg.bias;
    float* out = seg.out + b * seg.ob + seg.ophase * seg.ol;
    const int64_t oc = seg.oc, oj = static_cast<int64_t>(seg.ostep) * seg.ol;
    // the reader's GroupNorm partials: segment 0 (its CTAs come first), n = stat_out_n consecutive outputs each (a
    // power of two up to 32 dividing rc * l_out), summed by aligned groups of n lanes; the loop runs whole warps
    // (lanes past rc * l_out form groups of their own and store nothing)
    const bool partials = !rider && op.stat_out != nullptr &&
                          (op.nseg == 1 || div_pos(static_cast<int>(blockIdx.x), op.batch_grid) < op.seg[1].cta0);
    const int n = partials ? op.stat_out_n : 1, nsh = __ffs(n) - 1;
    // 1 / n from its exponent alone (n a power of two). Not inv_pos: its division path for other n, unused here,
    // costs registers, and with it every 64-register instantiation spills (up to 1.5 KB; 9-11 % slower forwards)
    const float inv_n = __int_as_float((127 - nsh) << 23);
    const int end = partials ? (rc * lo + 31) & ~31 : rc * lo;
    for (int i = tid; i < end; i += T) {
        const int r = div_pos(i, lo), j = i - r * lo, co = row0 + r;
        float v = 0.0f;
        if (i < rc * lo && co < rows) {
            v = bias[co];
#pragma unroll
            for (int w = 0; w < kWarps; ++w) v += red[(w * rc + r) * lo + j];
            out[co * oc + j * oj] = v;
        }
        if (partials) {
            const float m = dpk_warp::group_sum(v, n) * inv_n, d = v - m, q = dpk_warp::group_sum(d * d, n);
            const int e = row0 * lo + i;  // this lane's output: its group's first where lane % n = 0
            if ((lane & (n - 1)) == 0 && i < rc * lo && e < rows * lo)
                reinterpret_cast<float2*>(op.stat_out)[(b * rows * lo + e) >> nsh] = make_float2(m, q);
        }
    }
    mark(op, 39);
}

// 4.-5. one segment's stages and output. Transposed GEMM per tap t: D[j, r] += X[ci, j S + t - pad] W_t[r, ci]
// on m16n8k8 TF32 tensor-core MMAs: M = output columns j (COLS = 8: rows 0-7 of the tile, 8-15 zero; 16; or 32:
// two tiles), N = 8 output rows per row block, K = 8 input channels per channel block. Warp w takes the stage's
// channel blocks w, w + warps, ... and runs all K taps (compile-time) of each for all nb row blocks, even taps
// into one accumulator chain and odd ones into another. Where each lane's A elements sit in X, and whether they
// exist (padding, stride, l_out), depends on the tap alone: worked out once, before the stages. The warps'
// partial sums meet in shared memory at the end. Weights arrive pre-arranged (pack_weight): per stage [channel
// block][tap][row block][lane][2], so a lane's B fragment is one 8-byte load.
template <int COLS, int NBMAX, int T, int K>
__device__ void run_segment(const UnetOp& op, const UnetSegment& seg, int c, int b, const float* X,
                            const Stream& wstream, float* red) {
    constexpr int MT = (COLS + 15) / 16, kWarps = T / 32, NE = COLS == 8 ? 2 : 4;  // A elements per tile used
    constexpr int CH = NBMAX >= 4 ? 1 : 2;  // accumulator chains: with 4+ row blocks the MMAs interleave already
    const int rc = seg.rc, cbs = seg.cb, nstages = seg.nstages, nb = seg.nb, lo = seg.l_out;
    const ca::Policy policy = ca::make_policy(1);  // weights are read once: evict them first, keep activations
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int L = op.l_in, ncb = cbs >> 3;
    // per A element: its offset in the channel block's rows at tap 0 (tap t adds t) and, bit t, whether tap t
    // reads a real column (else a zero): two registers per element, not one per tap (the compiler rebuilt those
    // from constant loads at every tap)
    int base[MT][NE];
    unsigned valid[MT][NE];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < NE; ++e) {  // e: (j = g, ci = q), (g + 8, q), (g, q + 4), (g + 8, q + 4); NE = 2: 0, 2
            const int ee = NE == 2 ? 2 * e : e;
            const int j = mt * 16 + g + (ee & 1) * 8, l0 = j * seg.stride - seg.pad;
            base[mt][e] = (ee >> 1) * 4 * L + l0;
            valid[mt][e] = 0u;
#pragma unroll
            for (int t = 0; t < K; ++t)
                valid[mt][e] |= (j < lo && l0 + t >= 0 && l0 + t < L) ? 1u << t : 0u;
        }
    float acc[CH][NBMAX][MT][4];
#pragma unroll
    for (int h = 0; h < CH; ++h)
#pragma unroll
        for (int rb = 0; rb < NBMAX; ++rb)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[h][rb][mt][e] = 0.0f;

    const bool traced = op.trace != nullptr;
    int slot = 0;  // ring slot of stage st and the parity its barrier completes (no division per stage)
    unsigned parity = 0u;
    for (int st = 0; st < nstages; ++st) {
        wait_stage(op, st, nstages, wstream.bars, slot, parity, traced);
        const float* ws = wstream.ring + slot * wstream.slot_floats;
        for (int cbk = warp; cbk < ncb; cbk += kWarps) {
            const float* x0 = X + (st * cbs + cbk * 8 + q) * L;  // rows ci = q and q + 4 of the channel block
            const float2* wb = reinterpret_cast<const float2*>(ws + cbk * K * nb * 64) + lane;
#pragma unroll
            for (int t = 0; t < K; ++t) {
                uint32_t ahi[MT][4], alo[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) ahi[mt][e] = alo[mt][e] = 0u;
#pragma unroll
                    for (int e = 0; e < NE; ++e) {
                        const int ee = NE == 2 ? 2 * e : e;
                        split((valid[mt][e] >> t) & 1u ? x0[base[mt][e] + t] : 0.0f, ahi[mt][ee], alo[mt][ee]);
                    }
                }
#pragma unroll
                for (int rb = 0; rb < NBMAX; ++rb) {
                    if (NBMAX == 1 || rb < nb) {
                        const float2 w = wb[(t * nb + rb) * 32];
                        uint32_t bh0, bl0, bh1, bl1;
                        split(w.x, bh0, bl0);
                        split(w.y, bh1, bl1);
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            mma_tf32(acc[t & (CH - 1)][rb][mt], alo[mt], bh0, bh1);
                            mma_tf32(acc[t & (CH - 1)][rb][mt], ahi[mt], bl0, bl1);
                            mma_tf32(acc[t & (CH - 1)][rb][mt], ahi[mt], bh0, bh1);
                        }
                    }
                }
            }
        }
        release_slot(op, wstream, st, nstages, slot, parity, policy, traced);
    }
    mark(op, 7);

    // the warps' partial sums: red[warp][row][j], then one thread per (row, j) adds them up
#pragma unroll
    for (int rb = 0; rb < NBMAX; ++rb) {
        if (rb >= nb) continue;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // d0: (j = g, r = 2q), d1: (g, 2q + 1), d2: (g + 8, 2q), d3: (g + 8, 2q + 1)
                const int j = mt * 16 + g + (e >> 1) * 8, r = rb * 8 + 2 * q + (e & 1);
                if (j < lo) red[(warp * rc + r) * lo + j] = acc[0][rb][mt][e] + (CH > 1 ? acc[CH - 1][rb][mt][e] : 0.0f);
            }
        }
    }
    __syncthreads();
    store_segment<T>(op, seg, c, b, red);
}

// 4. (SIMT form, unet1d.h UnetSegment::simt) one segment's stages as fp32 FMAs on CUDA cores, for a 'same' conv
// (stride 1, pad K / 2) of LO = L = 4 or 8 columns, where a tensor-core tile would be at most half used and the
// 3xTF32 split costs more instructions than the products. The CTA's rows in pairs, each pair taken by TG =
// 2 T / rc threads (whole warps); thread i of a pair takes channels i, i + TG, ... of every stage: the channel's
// X row (LO / 4 float4 loads), its 2 KW weights (KW 8-byte loads: packed [pair][channel][row][tap]) and the
// (tap, column) products that read real columns (compile-time), into 2 LO accumulators. Exact fp32 products.
// RIDE (simt = 2): tap K of the packed weights is segment 1's 1x1 conv (the block's residual conv) of the same rows,
// summed into 2 LO more accumulators from the X row already in registers: one group of CTAs streams both.
// WB (wbf16): the weights arrive as bf16 pairs (half the bytes per stage), each widened exactly to fp32 (a shift or a
// mask of its 32-bit word), so the products and sums are the fp32 form's.
// Versus run_segment: ~4x fewer instructions per weight at LO = 4 (no fragment assembly, no splits, no padded
// tile rows); the warps' sums meet in the same reduction buffer (a rider's after the carrier's).
template <int T, int LO, int K, bool RIDE, bool WB>
__device__ void run_segment_simt(const UnetOp& op, const UnetSegment& seg, int c, int b, const float* X,
                                 const Stream& wstream, float* red) {
    constexpr int RPT = 2, PAD = K / 2, KW = K + (RIDE ? 1 : 0), NACC = RPT * LO * (RIDE ? 2 : 1);
    const int rc = seg.rc, cbs = seg.cb, nstages = seg.nstages, tg = div_pos(T * RPT, rc);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, grp = div_pos(tid, tg), i = tid - grp * tg;
    const ca::Policy policy = ca::make_policy(1);
    float acc[NACC];  // [segment][row][column]
#pragma unroll
    for (int e = 0; e < NACC; ++e) acc[e] = 0.0f;
    const bool traced = op.trace != nullptr;
    int slot = 0;
    unsigned parity = 0u;
    for (int st = 0; st < nstages; ++st) {
        wait_stage(op, st, nstages, wstream.bars, slot, parity, traced);
        const float* wst = wstream.ring + slot * wstream.slot_floats;
        const float2* wg = reinterpret_cast<const float2*>(wst + grp * cbs * RPT * KW);
        const uint32_t* wh = reinterpret_cast<const uint32_t*>(wst) + grp * cbs * RPT * KW / 2;  // WB: bf16 pairs
        const float4* xs = reinterpret_cast<const float4*>(X + st * cbs * LO);
        for (int ch = i; ch < cbs; ch += tg) {
            float x[LO], w[RPT * KW];
#pragma unroll
            for (int v = 0; v < LO / 4; ++v) {
                const float4 q = xs[ch * (LO / 4) + v];
                x[4 * v] = q.x;
                x[4 * v + 1] = q.y;
                x[4 * v + 2] = q.z;
                x[4 * v + 3] = q.w;
            }
#pragma unroll
            for (int u = 0; u < RPT * KW / 2; ++u) {
                if constexpr (WB) {  // element 2u in the low half (little-endian pairs)
                    const uint32_t p = wh[ch * (RPT * KW / 2) + u];
                    w[2 * u] = __uint_as_float(p << 16);
                    w[2 * u + 1] = __uint_as_float(p & 0xffff0000u);
                } else {
                    const float2 p = wg[ch * (RPT * KW / 2) + u];
                    w[2 * u] = p.x;
                    w[2 * u + 1] = p.y;
                }
            }
#pragma unroll
            for (int r = 0; r < RPT; ++r) {
#pragma unroll
                for (int t = 0; t < K; ++t)
#pragma unroll
                    for (int j = 0; j < LO; ++j)
                        if (j + t - PAD >= 0 && j + t - PAD < LO)
                            acc[r * LO + j] = fmaf(w[r * KW + t], x[j + t - PAD], acc[r * LO + j]);
                if constexpr (RIDE) {
#pragma unroll
                    for (int j = 0; j < LO; ++j)
                        acc[(RPT + r) * LO + j] = fmaf(w[r * KW + K], x[j], acc[(RPT + r) * LO + j]);
                }
            }
        }
        release_slot(op, wstream, st, nstages, slot, parity, policy, traced);
    }
    mark(op, 7);
    // the warp's sums over its lanes, as one partial per warp, row and column in red (rows of other pairs zero)
    constexpr int kWarps = T / 32;
#pragma unroll
    for (int h = 0; h < (RIDE ? 2 : 1); ++h) {
        float* rw = red + (h * kWarps + warp) * rc * LO;
        for (int e = lane; e < rc * LO; e += 32) rw[e] = 0.0f;
        __syncwarp();
        float part[RPT * LO];
#pragma unroll
        for (int e = 0; e < RPT * LO; ++e) part[e] = acc[h * RPT * LO + e];
        int idx = 0;  // RPT * LO <= 32: each lane ends with one total, that of value idx (32 / (RPT * LO) lanes each)
        dpk_warp::reduce_scatter<RPT * LO>(part, lane, idx);
        if ((lane & (32 / (RPT * LO) - 1)) == 0) rw[grp * RPT * LO + idx] = part[0];
    }
    __syncthreads();
    store_segment<T>(op, seg, c, b, red);
    if constexpr (RIDE) store_segment<T>(op, op.seg[1], c, b, red + kWarps * rc * LO, true);
}

// the SIMT stage loop of a segment's (columns, taps): compile-time, one copy per supported pair (a carrier's RIDE:
// taps 3 or 5 only, the plan admits no 1x1 carrier)
template <int T, bool RIDE, bool WB>
__device__ __forceinline__ void run_simt(const UnetOp& op, const UnetSegment& sg, int c, int b, const float* X,
                                         const Stream& ws, float* red) {
    const int key = sg.l_out * 8 + sg.k;
    if constexpr (!RIDE) {
        if (key == 33) return run_segment_simt<T, 4, 1, RIDE, WB>(op, sg, c, b, X, ws, red);
        if (key == 65) return run_segment_simt<T, 8, 1, RIDE, WB>(op, sg, c, b, X, ws, red);
    }
    if (key == 35) return run_segment_simt<T, 4, 3, RIDE, WB>(op, sg, c, b, X, ws, red);
    if (key == 37) return run_segment_simt<T, 4, 5, RIDE, WB>(op, sg, c, b, X, ws, red);
    if (key == 67) return run_segment_simt<T, 8, 3, RIDE, WB>(op, sg, c, b, X, ws, red);
    if (key == 69) return run_segment_simt<T, 8, 5, RIDE, WB>(op, sg, c, b, X, ws, red);
    __trap();
}

}  // namespace
