// unet1d.cu: the U-Net's generic layer kernel (unet1d.h: what an op computes) and its C ABI launcher.
//
// fp32 storage, fp32-accurate arithmetic (3xTF32 tensor-core products, fp32 sums). One CTA of T threads (512
// for up to 4 row blocks, else 256) per (rc rows of one segment, batch element): it owns rc output rows of all
// l_out columns, so there is no cross-CTA reduction; a forward's ~30 ops are grids of up to ~130 CTAs, each
// under ~110 KB of shared memory where it can, so that two ops' CTAs fit one SM. Per CTA, in order:
//   1. thread 0 requests the first `ring` stages of its weights (TMA bulk copies, one contiguous stage each,
//      completing on one mbarrier per ring slot): weights never depend on the previous op, so they stream
//      while it still runs;
//   2. griddepcontrol.launch_dependents (the next op may start its own step 1 on free SM space), then
//      griddepcontrol.wait (the previous op's grid has finished and its stores are visible);
//   3. prologue: the sources into X (shared memory; cp.async), GroupNorm statistics (two passes, a warp per
//      group), per-channel coefficients (a, b, scale, shift), then X = scale * mish(a x + b) + shift + res in
//      place (a float4 per thread and step where L is a power of two); CTAs store their share of X when the
//      op materialises it;
//   4. stages (run_segment): per tap, a transposed GEMM on m16n8k8 TF32 MMAs split 3 ways for fp32 accuracy;
//      warps take (channel block, tap) units into two accumulator chains; slot reuse: every thread fences its
//      generic reads of the slot, one barrier, thread 0 re-issues;
//   5. the warps' partial sums meet in shared memory; + bias; store.
// Versus conv1d's stream_rows.cu (one conv per launch, x copied in raw, FMAs on CUDA cores): the input
// transform of the previous layer (GroupNorm, Mish, FiLM, residual, concatenation) runs in this kernel's
// prologue, segments let one launch hold a conv and its 1x1 residual conv (or both phases of the transposed
// conv), weights are requested before the dependency wait, and the products run on tensor cores (at B = 1
// each weight feeds only L <= 16 products: on CUDA cores the instruction issue, not DRAM, set the pace).
#include <cuda_runtime.h>
#include <stdint.h>

#include "async_copy.cuh"
#include "unet1d.h"

namespace {

namespace ca = dpk_async;

__host__ __device__ inline int align128(int bytes) { return (bytes + 127) & ~127; }

struct Carve {  // byte offsets of the shared-memory regions (dpk_unet1d_smem_bytes: their total)
    int stats, red, coef, ring, stage_bytes, x, total;
};

__host__ __device__ inline Carve carve(const UnetOp& op) {
    Carve c;
    c.stats = 128;  // ring barriers: UNET_MAX_RING x 8 bytes
    c.red = c.stats + align128(UNET_MAX_SRC * UNET_MAX_GROUPS * 8);
    int red = 0;
    for (int s = 0; s < op.nseg; ++s) {
        const int r = op.seg[s].rc * op.seg[s].l_out;
        red = r > red ? r : red;
    }
    c.coef = c.red + align128(op.threads / 32 * red * 4);
    c.ring = c.coef + align128(op.coef * 16);
    int stage = 0;
    for (int s = 0; s < op.nseg; ++s) {
        const int b = op.seg[s].rc * op.seg[s].cb * op.seg[s].k * 4;
        stage = b > stage ? b : stage;
    }
    c.stage_bytes = stage;
    c.x = c.ring + align128(op.ring * stage);
    c.total = c.x + align128(op.cin_pad * op.l_in * 4);
    return c;
}

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// phase timestamps of this CTA (thread 0) when the op carries a trace buffer
__device__ __forceinline__ void mark(const UnetOp& op, int point) {
    if (op.trace != nullptr && threadIdx.x == 0) op.trace[blockIdx.x * UNET_TRACE_POINTS + point] = now_ns();
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// mish(v) = v tanh(softplus(v)) = v n / (n + 2), n = e^v (e^v + 2); v > 15: tanh(softplus(v)) = 1 in fp32.
__device__ __forceinline__ float mish(float v) {
    if (v > 15.0f) return v;
    const float e = __expf(v);
    const float n = e * (e + 2.0f);
    return v * __fdividef(n, n + 2.0f);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// value of source element (c, l) before the transform (kind 1: sin/cos embedding of t[l], as SinusoidalPosEmb,
// its argument formed in double so that t * f_i carries no fp32 rounding)
__device__ __forceinline__ float source_value(const UnetSource& s, int b, int c, int l) {
    if (s.kind == 1) {
        const int half = s.channels / 2, i = c < half ? c : c - half;
        const double f = exp(-static_cast<double>(i) * (9.210340371976184 / (half - 1)));  // ln(10000)
        const double arg = static_cast<double>(s.t[l]) * f;
        return static_cast<float>(c < half ? sin(arg) : cos(arg));
    }
    return s.raw[b * s.sb + c * s.sc + l * s.sl];
}

constexpr int U = 4;  // loads a thread keeps in flight in the prologue's loops (each is an L2 round trip)

__device__ __forceinline__ bool transformed(const UnetSource& s) {
    return s.gamma != nullptr || s.act || s.film || s.res != nullptr;
}

// 3. the prologue: X (cin_pad x L) from the sources, transformed in place. Every global load of a loop is
// issued before the first is used (cp.async, or U loads per thread at a time): the sources sit in L2, and a
// loop that waits for each load in turn costs an L2 round trip per element it touches.
template <int T>
__device__ void prologue(const UnetOp& op, int b, int cta, int ncta_all, float* X, float2* stats, float4* coef) {
    constexpr int kWarps = T / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, L = op.l_in;
    const ca::Policy keep{0, 0};
    int c0 = 0;
    for (int si = 0; si < op.nsrc; ++si) {  // raw values
        const UnetSource s = op.src[si];  // a copy: fields in registers, not indexed constant loads
        float* xs = X + c0 * L;
        const int n = s.channels * L;
        const float* src = s.raw + b * s.sb;
        if (s.kind == 0 && s.sl == 1 && s.sc == L && n % 4 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0 &&
            (reinterpret_cast<uintptr_t>(xs) & 15) == 0) {  // contiguous (B, C, L): 16-byte async copies
            for (int i = 4 * tid; i < n; i += 4 * T) ca::copy16(xs + i, src + i, true, keep);
        } else {
            for (int i0 = tid; i0 < n; i0 += U * T) {
                float v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int i = i0 + u * T;
                    v[u] = i < n ? source_value(s, b, i / L, i % L) : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (i0 + u * T < n) xs[i0 + u * T] = v[u];
            }
        }
        c0 += s.channels;
    }
    ca::commit();
    for (int i = op.cin * L + tid; i < op.cin_pad * L; i += T) X[i] = 0.0f;  // padded channels
    ca::wait_all();
    __syncthreads();
    mark(op, 3);

    c0 = 0;
    for (int si = 0; si < op.nsrc; ++si) {  // GroupNorm statistics: one warp per group, two passes
        const UnetSource s = op.src[si];  // a copy: fields in registers, not indexed constant loads
        if (s.gamma != nullptr) {
            const int cpg = s.channels / s.groups, n = cpg * L;
            for (int g = warp; g < s.groups; g += kWarps) {
                const float* xg = X + (c0 + g * cpg) * L;
                float sum = 0.0f;
                for (int i = lane; i < n; i += 32) sum += xg[i];
                const float mean = warp_sum(sum) / n;
                float m2 = 0.0f;
                for (int i = lane; i < n; i += 32) {
                    const float d = xg[i] - mean;
                    m2 += d * d;
                }
                const float var = warp_sum(m2) / n;
                if (lane == 0) stats[si * UNET_MAX_GROUPS + g] = make_float2(mean, rsqrtf(var + 1e-5f));
            }
        }
        c0 += s.channels;
    }
    __syncthreads();
    mark(op, 4);

    int k0 = 0;  // coefficient index of the source's first channel
    for (int si = 0; si < op.nsrc; ++si) {  // per-channel coefficients (a, b, scale, shift)
        const UnetSource s = op.src[si];  // a copy: fields in registers, not indexed constant loads
        if (!transformed(s)) continue;
        const int64_t tb = s.film_b != nullptr ? s.t[b] : 0;
        const int64_t base = static_cast<int64_t>(b) * s.film_ld + s.film_off, tbase = tb * s.film_ld + s.film_off;
        const int C = s.channels, cpg = s.gamma != nullptr ? C / s.groups : 1;
        for (int c0u = tid; c0u < C; c0u += U * T) {
            float4 k[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = c0u + u * T;
                k[u] = make_float4(1.0f, 0.0f, 1.0f, 0.0f);
                if (c >= C) continue;
                if (s.gamma != nullptr) {
                    k[u].x = s.gamma[c];
                    k[u].y = s.beta[c];
                }
                if (s.film) {
                    const int hc = s.film == 1 ? c + C : c;
                    k[u].w = s.film_a[base + hc] + (s.film_b != nullptr ? s.film_b[tbase + hc] : 0.0f);
                    if (s.film == 1) k[u].z = s.film_a[base + c] + (s.film_b != nullptr ? s.film_b[tbase + c] : 0.0f);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = c0u + u * T;
                if (c >= C) continue;
                if (s.gamma != nullptr) {  // gamma (x - mean) rstd + beta = a x + (beta - mean a)
                    const float2 st = stats[si * UNET_MAX_GROUPS + c / cpg];
                    k[u].x *= st.y;
                    k[u].y -= st.x * k[u].x;
                }
                coef[k0 + c] = k[u];
            }
        }
        k0 += C;
    }
    __syncthreads();

    c0 = 0;
    k0 = 0;
    for (int si = 0; si < op.nsrc; ++si) {  // the transform, in place: v = scale mish(a x + b) + shift + res
        const UnetSource s = op.src[si];  // a copy: fields in registers, not indexed constant loads
        if (!transformed(s)) {
            c0 += s.channels;
            continue;
        }
        float* xs = X + c0 * L;
        const int n = s.channels * L;
        const float* res = s.res != nullptr ? s.res + static_cast<int64_t>(b) * n : nullptr;
        if (L >= 4 && (L & (L - 1)) == 0 && (reinterpret_cast<uintptr_t>(xs) & 15) == 0 &&
            (res == nullptr || (reinterpret_cast<uintptr_t>(res) & 15) == 0)) {
            const int lsh = __ffs(L) - 1, n4 = n / 4;  // a float4 never straddles two channels
            float4* x4 = reinterpret_cast<float4*>(xs);
            const float4* r4 = reinterpret_cast<const float4*>(res);
            for (int v0 = tid; v0 < n4; v0 += U * T) {
                float4 r[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + u * T;
                    r[u] = (r4 != nullptr && v < n4) ? r4[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + u * T;
                    if (v >= n4) continue;
                    const float4 k = coef[k0 + ((4 * v) >> lsh)];
                    float4 x = x4[v];
                    x.x = x.x * k.x + k.y;
                    x.y = x.y * k.x + k.y;
                    x.z = x.z * k.x + k.y;
                    x.w = x.w * k.x + k.y;
                    if (s.act) {
                        x.x = mish(x.x);
                        x.y = mish(x.y);
                        x.z = mish(x.z);
                        x.w = mish(x.w);
                    }
                    x4[v] = make_float4(x.x * k.z + k.w + r[u].x, x.y * k.z + k.w + r[u].y,
                                        x.z * k.z + k.w + r[u].z, x.w * k.z + k.w + r[u].w);
                }
            }
        } else {
            for (int i0 = tid; i0 < n; i0 += U * T) {
                float r[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int i = i0 + u * T;
                    r[u] = (res != nullptr && i < n) ? res[i] : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int i = i0 + u * T;
                    if (i >= n) continue;
                    const float4 k = coef[k0 + i / L];
                    float v = xs[i] * k.x + k.y;
                    if (s.act) v = mish(v);
                    xs[i] = v * k.z + k.w + r[u];
                }
            }
        }
        c0 += s.channels;
        k0 += s.channels;
    }
    __syncthreads();
    mark(op, 5);
    if (op.mat != nullptr) {  // this CTA's share of X, stored as (B, cin, L)
        const int n = op.cin * L, share = (n + ncta_all - 1) / ncta_all;
        float* dst = op.mat + static_cast<int64_t>(b) * n;
        for (int i = cta * share + tid; i < min(n, (cta + 1) * share); i += T) dst[i] = X[i];
    }
}

// request stage `st` of this CTA's weights into ring slot `slot` (see UnetOp::copy). Bulk copies: thread 0 only,
// completing on the slot's mbarrier. cp.async: every thread copies its 16-byte pieces and commits one group.
__device__ __forceinline__ void issue_stage(const UnetOp& op, const float* wseg, int st, int stage, float* ring,
                                            int stage_floats, unsigned bars, int slot, const ca::Policy& hint) {
    const float* src = wseg + static_cast<int64_t>(st) * stage;
    float* dst = ring + slot * stage_floats;
    if (op.copy == 2) {
        for (int i = 4 * threadIdx.x; i < stage; i += 4 * blockDim.x) ca::copy16(dst + i, src + i, true, hint);
        ca::commit();
    } else if (threadIdx.x == 0) {
        ca::mbar_arrive_expect_tx(bars + 8u * slot, static_cast<unsigned>(stage * 4));
        ca::bulk_copy_g2s(ca::smem_addr(dst), src, static_cast<unsigned>(stage * 4), bars + 8u * slot,
                          op.copy == 0 ? hint : ca::Policy{0, 0});
    }
}

// wait until stage `st` (in slot st % ring) has landed and is visible to every thread of the CTA
__device__ __forceinline__ void wait_stage(const UnetOp& op, int st, int nstages, unsigned bars) {
    if (op.copy == 2) {  // groups of later stages may be in flight: at most min(ring, nstages - st) - 1
        const int later = min(op.ring, nstages - st) - 1;
        ca::wait_pending(later);
        __syncthreads();
    } else {
        ca::mbar_wait_parity(bars + 8u * (st % op.ring), static_cast<unsigned>((st / op.ring) & 1));
    }
}

__device__ __forceinline__ uint32_t tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// x = hi + lo, both TF32: three TF32 products (hi hi, hi lo, lo hi) carry x y to about fp32 precision (3xTF32)
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
    hi = tf32(x);
    lo = tf32(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 4.-5. one segment's stages and output. Transposed GEMM per tap t: D[j, r] += X[ci, j S + t - pad] W_t[r, ci]
// on m16n8k8 TF32 tensor-core MMAs: M = output columns j (COLS = 8: only rows 0-7 of the tile, rows 8-15 zero;
// 16; or 32: two tiles), N = 8 output rows per row block, K = 8 input channels per channel block. A stage's work
// units are its (channel block, tap) pairs, for all nb row blocks each; warp w takes units w, w + warps, ...
// into two accumulator chains in turn; the warps' partial sums meet in shared memory at the end. Weights arrive pre-arranged
// (pack_weight): per stage [channel block][tap][row block][lane][2], a lane's B fragment is one 8-byte load.
// The segment's scalars, read once into registers: a UnetSegment picked by a run-time index lives in the
// kernel's parameter bank, and every field read in a loop would be an indexed constant load.
struct Geom {
    int k, stride, pad, l_out, nb;
};

template <int COLS, int NBMAX, int T>
__device__ __forceinline__ void tap(const Geom& sg, int t, int L, const float* x0, const float* ws, int cbk,
                                    float (&acc)[NBMAX][(COLS + 15) / 16][4]) {
    constexpr int MT = (COLS + 15) / 16;
    const int lane = threadIdx.x & 31, g = lane >> 2;
    uint32_t ahi[MT][4], alo[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // a0: (j = g, ci = q), a1: (g + 8, q), a2: (g, q + 4), a3: (g + 8, q + 4)
            const int j = mt * 16 + g + (e & 1) * 8, l = j * sg.stride + t - sg.pad;
            if (COLS == 8 && (e & 1)) {
                ahi[mt][e] = alo[mt][e] = 0u;
                continue;
            }
            const float v = (j < sg.l_out && l >= 0 && l < L) ? x0[(e >> 1) * 4 * L + l] : 0.0f;
            split(v, ahi[mt][e], alo[mt][e]);
        }
    }
    const float2* wb = reinterpret_cast<const float2*>(ws + ((cbk * sg.k + t) * sg.nb) * 64) + lane;
#pragma unroll
    for (int rb = 0; rb < NBMAX; ++rb) {
        if (rb < sg.nb) {
            const float2 w = wb[rb * 32];
            uint32_t bh0, bl0, bh1, bl1;
            split(w.x, bh0, bl0);
            split(w.y, bh1, bl1);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_tf32(acc[rb][mt], alo[mt], bh0, bh1);
                mma_tf32(acc[rb][mt], ahi[mt], bl0, bl1);
                mma_tf32(acc[rb][mt], ahi[mt], bh0, bh1);
            }
        }
    }
}

template <int COLS, int NBMAX, int T>
__device__ void run_segment(const UnetOp& op, const UnetSegment& seg, int c, int b, const float* X, float* ring,
                            int stage_floats, unsigned bars, float* red) {
    const Geom sg{seg.k, seg.stride, seg.pad, seg.l_out, seg.nb};
    const int rc = seg.rc, cbs = seg.cb, nstages = seg.nstages, rows = seg.rows;
    // two accumulator chains (alternate work units) where few row blocks leave the tensor pipe idle between MMAs
    constexpr int MT = (COLS + 15) / 16, kWarps = T / 32, CH = NBMAX >= 4 ? 1 : 2;
    const ca::Policy policy = ca::make_policy(1);  // weights are read once: evict them first, keep activations
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int L = op.l_in, K = sg.k, ncb = cbs / 8;
    const int stage = rc * cbs * K;  // floats
    const float* wseg = seg.w + static_cast<int64_t>(c) * nstages * stage;
    float acc[CH][NBMAX][MT][4];
#pragma unroll
    for (int h = 0; h < CH; ++h)
#pragma unroll
        for (int rb = 0; rb < NBMAX; ++rb)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[h][rb][mt][e] = 0.0f;

    for (int st = 0; st < nstages; ++st) {
        const int slot = st % op.ring;
        wait_stage(op, st, nstages, bars);
        if (st == 0) mark(op, 6);
        if (st < 30) mark(op, 8 + st);
        const float* ws = ring + slot * stage_floats;
        // work units (channel block, tap): warp w takes units w, w + warps, ..., alternating between its chains
        const int units = ncb * K;
        for (int u = warp; u < units; u += 2 * kWarps) {
            const int cb0 = u / K, cb1 = (u + kWarps) / K;
            tap<COLS, NBMAX, T>(sg, u - cb0 * K, L, X + (st * cbs + cb0 * 8 + q) * L, ws, cb0, acc[0]);
            if (u + kWarps < units)
                tap<COLS, NBMAX, T>(sg, u + kWarps - cb1 * K, L, X + (st * cbs + cb1 * 8 + q) * L, ws, cb1,
                                    acc[CH - 1]);
        }
        if (st == 1) mark(op, 38);  // diagnostic: stage 1's work done (thread 0), then after the barrier
        if (op.copy != 2) ca::fence_proxy_async_smem();  // reads of the slot precede the copy engine's next write
        __syncthreads();
        if (st == 1) mark(op, 39);
        if (st + op.ring < nstages) issue_stage(op, wseg, st + op.ring, stage, ring, stage_floats, bars, slot, policy);
    }
    mark(op, 7);

    // the warps' partial sums: red[warp][row][j], then one thread per (row, j) adds them up
    const int lo = sg.l_out;
#pragma unroll
    for (int rb = 0; rb < NBMAX; ++rb) {
        if (rb >= sg.nb) continue;
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
    const int row0 = c * rc;
    const float* bias = seg.bias;
    float* out = seg.out + b * seg.ob + seg.ophase * seg.ol;
    const int64_t oc = seg.oc, oj = static_cast<int64_t>(seg.ostep) * seg.ol;
    for (int i = tid; i < rc * lo; i += T) {
        const int r = i / lo, j = i - r * lo, co = row0 + r;
        if (co >= rows) continue;
        float v = bias[co];
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v += red[(w * rc + r) * lo + j];
        out[co * oc + j * oj] = v;
    }
}

template <int COLS, int NBMAX, int T>
__global__ void __launch_bounds__(T, 2) unet1d_op_kernel(const __grid_constant__ UnetOp op) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Carve cv = carve(op);
    const unsigned bars = ca::smem_addr(smem);
    float2* stats = reinterpret_cast<float2*>(smem + cv.stats);
    float* red = reinterpret_cast<float*>(smem + cv.red);
    float4* coef = reinterpret_cast<float4*>(smem + cv.coef);
    float* ring = reinterpret_cast<float*>(smem + cv.ring);
    float* X = reinterpret_cast<float*>(smem + cv.x);
    const int stage_floats = cv.stage_bytes / 4;

    const int b = blockIdx.x % op.batch_grid, cta = blockIdx.x / op.batch_grid;
    const int si = (op.nseg > 1 && cta >= op.seg[1].cta0) ? 1 : 0;
    const UnetSegment& sg = op.seg[si];
    const int c = cta - sg.cta0;
    const int stage = sg.rc * sg.cb * sg.k;
    const float* wseg = sg.w + static_cast<int64_t>(c) * sg.nstages * stage;

    mark(op, 0);
    // 1. weights first: they do not depend on the previous op
    {
        const ca::Policy policy = ca::make_policy(1);
        if (threadIdx.x == 0 && op.copy != 2) {
            for (int s = 0; s < op.ring; ++s) ca::mbar_init(bars + 8u * s, 1);
            ca::fence_mbar_init();
        }
        for (int s = 0; s < op.ring && s < sg.nstages; ++s)
            issue_stage(op, wseg, s, stage, ring, stage_floats, bars, s, policy);
    }
    // 2. let the next op start streaming its weights; wait for the previous op's outputs
    mark(op, 1);
    pdl_launch_dependents();
    pdl_wait();
    mark(op, 2);
    // 3. (its __syncthreads also publishes the barrier initialisation)
    prologue<T>(op, b, cta, op.grid / op.batch_grid, X, stats, coef);
    // 4.-5.
    run_segment<COLS, NBMAX, T>(op, sg, c, b, X, ring, stage_floats, bars, red);
}

using KernelFn = void (*)(UnetOp);

constexpr int kNbMax[] = {1, 2, 4, 8, 16};

// threads per CTA of an instantiation: 512 while the accumulators fit 64 registers (two CTAs per SM), else 256
constexpr int threads_for(int nb) { return nb <= 4 ? 512 : 256; }

template <int COLS>
KernelFn kernel_for_nb(int nb) {
    switch (nb) {
        case 1: return unet1d_op_kernel<COLS, 1, threads_for(1)>;
        case 2: return unet1d_op_kernel<COLS, 2, threads_for(2)>;
        case 4: return unet1d_op_kernel<COLS, 4, threads_for(4)>;
        case 8: return unet1d_op_kernel<COLS, 8, threads_for(8)>;
        case 16:
            if constexpr (COLS <= 16) return unet1d_op_kernel<COLS, 16, threads_for(16)>;
            return nullptr;  // 2 x 16 column tiles would spill: the plan never asks for them
        default: return nullptr;
    }
}

int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p *= 2;
    return p;
}

// the instantiation of an op: its output columns (8, 16 or 32) and its segments' largest row-block count
KernelFn kernel_for(int cols, int nbmax) {
    const int nb = pow2_at_least(nbmax);
    switch (cols) {
        case 8: return kernel_for_nb<8>(nb);
        case 16: return kernel_for_nb<16>(nb);
        case 32: return kernel_for_nb<32>(nb);
        default: return nullptr;
    }
}

int op_nbmax(const UnetOp& op) {
    int nb = 0;
    for (int s = 0; s < op.nseg; ++s) nb = op.seg[s].nb > nb ? op.seg[s].nb : nb;
    return nb;
}

}  // namespace

extern "C" int dpk_unet1d_smem_bytes(const UnetOp* op) { return carve(*op).total; }

extern "C" int dpk_unet1d_struct_sizes(int* source, int* segment, int* op) {
    *source = static_cast<int>(sizeof(UnetSource));
    *segment = static_cast<int>(sizeof(UnetSegment));
    *op = static_cast<int>(sizeof(UnetOp));
    return 0;
}

extern "C" int dpk_unet1d_prepare(int max_smem_bytes) {
    for (int cols = 8; cols <= 32; cols *= 2) {
        for (int nb : kNbMax) {
            const KernelFn fn = kernel_for(cols, nb);
            if (fn == nullptr) continue;
            cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem_bytes);
            if (e == cudaSuccess)  // one shared-memory carveout for every op: no reconfiguration between them
                e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         static_cast<int>(cudaSharedmemCarveoutMaxShared));
            if (e != cudaSuccess) return static_cast<int>(e);
        }
    }
    return 0;
}

extern "C" int dpk_unet1d_launch(const UnetOp* ops, int n, void* stream, int pdl) {
    for (int i = 0; i < n; ++i) {
        const UnetOp& op = ops[i];
        const KernelFn fn = kernel_for(op.cols, op_nbmax(op));
        if (fn == nullptr || op.grid <= 0 || op.threads != threads_for(pow2_at_least(op_nbmax(op))))
            return static_cast<int>(cudaErrorInvalidValue);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(static_cast<unsigned>(op.grid));
        cfg.blockDim = dim3(static_cast<unsigned>(op.threads));
        cfg.dynamicSmemBytes = static_cast<size_t>(op.smem_bytes);
        cfg.stream = static_cast<cudaStream_t>(stream);
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        const cudaError_t e = cudaLaunchKernelEx(&cfg, fn, op);
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    return 0;
}

extern "C" const char* dpk_unet1d_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
