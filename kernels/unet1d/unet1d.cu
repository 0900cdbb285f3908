// unet1d.cu: the U-Net's generic layer kernel (unet1d.h: what an op computes) and its C ABI launcher.
//
// fp32 activations (the weights of SIMT segments fp32 or bf16: UnetSegment::wbf16), fp32-accurate arithmetic (fp32
// FMAs or 3xTF32 tensor-core products, fp32 sums). One CTA of T threads (512 for up to 4 row blocks, else 256) per
// (rc rows of one segment, batch element): it owns rc output
// rows of all l_out columns, so there is no cross-CTA reduction; a forward's ~30 ops are grids of up to ~130 CTAs, each
// under ~110 KB of shared memory where it can, so that two ops' CTAs fit one SM. Per CTA, in order:
//   1. thread 0 requests the first `ring` stages of its weights (TMA bulk copies, one contiguous stage each,
//      completing on one mbarrier per ring slot): weights never depend on the previous op, so they stream
//      while it still runs;
//   2. griddepcontrol.launch_dependents (the next op may start its own step 1 on free SM space), then
//      griddepcontrol.wait (the previous op's grid has finished and its stores are visible);
//   3. prologue: the sources into X (shared memory; cp.async), GroupNorm statistics (two passes, a warp per
//      group), per-channel coefficients (a, b, scale, shift), then X = scale * mish(a x + b) + shift + res in
//      place (a float4 per thread and step where L is a power of two); CTAs store their share of X when the
//      op materialises it. Where the op's one transformed source fits two float4s per thread (512 threads) or
//      four (256), prologue_fast instead loads it into registers beside the partials, one barrier publishes the
//      statistics, and each thread transforms its own float4s onto the residual it copied into X before the wait;
//   4. stages: run_segment_simt for a stride-1 'same' conv of 4 or 8 columns (most of the bytes at B = 1): fp32
//      FMAs, a thread per row pair and channel; else run_segment: per tap, a transposed GEMM on m16n8k8 TF32 MMAs
//      split 3 ways for fp32 accuracy, warps over channel blocks; slot reuse: every thread fences its generic
//      reads of the slot, one barrier, thread 0 re-issues;
//   5. the warps' partial sums meet in shared memory; + bias; store.
// An op whose output is read next under a GroupNorm also stores its GroupNorm partials (per 16 or 32 outputs: mean
// and squared deviations), which the reader combines while its sources load, instead of a statistics pass over X.
// A SIMT segment 0 may carry a rider (simt = 2): the block's 1x1 residual conv of the same X and rows, its weights tap
// k of the packed ones, summed into a second set of accumulators and stored after segment 0's outputs. An op over
// the two-CTA shared-memory budget runs the MINB = 1 instantiation (128 registers: a register prologue of four
// float4s per thread) and requests its ring's later stages after its early loads.
// Versus conv1d's stream_rows.cu (one conv per launch, x copied in raw, FMAs on CUDA cores): the input
// transform of the previous layer (GroupNorm, Mish, FiLM, residual, concatenation) runs in this kernel's
// prologue, segments let one launch hold a conv and its 1x1 residual conv (or both phases of the transposed
// conv), weights are requested before the dependency wait, and the products of the 16- and 32-column, strided
// and transposed convs run on tensor cores.
#include <cuda_runtime.h>
#include <stdint.h>

#include "async_copy.cuh"
#include "fast_math.cuh"
#include "grid_dependency.cuh"
#include "unet1d.h"

namespace {

namespace ca = dpk_async;

__host__ __device__ inline int align128(int bytes) { return (bytes + 127) & ~127; }

// taps per (row, channel) of a segment's packed weights: k, and a carrier's (simt = 2) rider's 1x1 tap
__host__ __device__ inline int taps(const UnetSegment& s) { return s.k + (s.simt == 2 ? 1 : 0); }

// bytes of one stage of a segment's packed weights (rc rows x cb channels x taps, fp32 or bf16)
__host__ __device__ inline int stage_bytes(const UnetSegment& s) { return s.rc * s.cb * taps(s) * (s.wbf16 ? 2 : 4); }

struct Carve {  // byte offsets of the shared-memory regions (dpk_unet1d_smem_bytes: their total)
    int stats, red, coef, ring, stage_bytes, x, total;
};

__host__ __device__ inline Carve carve(const UnetOp& op) {
    Carve c;
    c.stats = 128;  // ring barriers: UNET_MAX_RING x 8 bytes
    c.red = c.stats + align128(UNET_MAX_SRC * UNET_MAX_GROUPS * 8);
    int red = 0;
    for (int s = 0; s < op.nseg; ++s) {
        const int r = op.seg[s].rc * op.seg[s].l_out * (op.seg[s].simt == 2 ? 2 : 1);  // a carrier: its rider's too
        red = r > red ? r : red;
    }
    c.coef = c.red + align128(op.threads / 32 * red * 4);
    c.ring = c.coef + align128(op.coef * 16);
    int stage = 0;
    for (int s = 0; s < op.nseg; ++s) {
        const int b = stage_bytes(op.seg[s]);
        stage = b > stage ? b : stage;
    }
    c.stage_bytes = stage;
    c.x = c.ring + align128(op.ring * stage);
    c.total = c.x + align128(op.cin_pad * op.l_in * 4);
    return c;
}

// phase timestamps of this CTA (thread 0) when the op carries a trace buffer
__device__ __forceinline__ void mark(const UnetOp& op, int point) {
    if (op.trace != nullptr && threadIdx.x == 0) op.trace[blockIdx.x * UNET_TRACE_POINTS + point] = ca::globaltimer_ns();
}

// a / d for a >= 0, d > 0: a shift where d is a power of two (every divisor of blog's and Push-T image's ops), else
// the division (~20 instructions). Every thread of every op runs these, in phases on the op's critical path (ncu: a
// 5 MB op's warps issue ~1600 instructions each, nearly all of them once, at ~1.9 per cycle per SM).
__device__ __forceinline__ int div_pos(int a, int d) { return (d & (d - 1)) == 0 ? a >> (__ffs(d) - 1) : a / d; }

// 1 / d, exact where d is a power of two (its bit pattern), else rounded
__device__ __forceinline__ float inv_pos(int d) {
    return (d & (d - 1)) == 0 ? __int_as_float((127 - (__ffs(d) - 1)) << 23) : 1.0f / static_cast<float>(d);
}

// mish(v) = v tanh(softplus(v)) = v n / (n + 2), n = e^v (e^v + 2). Branch-free: e^v's argument is clamped at 15,
// where n / (n + 2) is already 1 in fp32 (1 - 2e-13), so v > 15 gives v; n + 2 >= 2 needs no range check.
__device__ __forceinline__ float mish(float v) {
    const float e = __expf(fminf(v, 15.0f));
    const float n = e * (e + 2.0f);
    return v * (n * dpk_math::fast_rcp(n + 2.0f));
}

// sum over each aligned group of n lanes (n a power of two up to 32), every lane of the group getting it
__device__ __forceinline__ float group_sum(float v, int n) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, v, o);
        v += o < n ? t : 0.0f;
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return group_sum(v, 32); }

// One round of warp_sum_scatter: a lane keeps half H of its values (the upper one where lane & off) and adds its
// partner's (lane ^ off) copy of that half; then the next round on the kept half (recursion: every index is
// compile-time, so v stays in registers).
template <int N, int H>
__device__ __forceinline__ void scatter_rounds(float (&v)[N], int lane, int& index) {
    constexpr int off = 32 * H / N;
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int k = 0; k < H; ++k) {
        const float send = upper ? v[k] : v[k + H], keep = upper ? v[k + H] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
    index += upper ? H : 0;
    if constexpr (H > 1) scatter_rounds<N, H / 2>(v, lane, index);
}

// N (a power of two, 2 to 32) values per lane, each summed over the warp's lanes with N - 1 + log2(32 / N)
// shuffles (not 5 N): returns the sum of value `index`, which this lane ends up holding (32 / N lanes hold each;
// v is consumed).
template <int N>
__device__ __forceinline__ float warp_sum_scatter(float (&v)[N], int lane, int& index) {
    index = 0;
    scatter_rounds<N, N / 2>(v, lane, index);
#pragma unroll
    for (int off = 16 / N; off >= 1; off /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    return v[0];
}

// value of source element (c, l) before the transform (kind 1: sin/cos embedding of t[l], as SinusoidalPosEmb,
// its argument formed in double so that t * f_i carries no fp32 rounding)
__device__ __noinline__ float sinusoid(const int64_t* t, int channels, int c, int l) {
    const int half = channels / 2, i = c < half ? c : c - half;
    const double f = exp(-static_cast<double>(i) * (9.210340371976184 / (half - 1)));  // ln(10000)
    const double arg = static_cast<double>(t[l]) * f;
    return static_cast<float>(c < half ? sin(arg) : cos(arg));
}

// (out of line, with the other cold paths: the code a CTA runs must stay small, or instruction fetch sets its pace)
__device__ __forceinline__ float source_value(const UnetSource& s, int b, int c, int l) {
    if (s.kind == 1) return sinusoid(s.t, s.channels, c, l);
    return s.raw[b * s.sb + c * s.sc + l * s.sl];
}

// the transform of four elements of one channel: scale * act(a x + b) + shift + r, coefficients k = (a, b, scale,
// shift)
__device__ __forceinline__ float4 transform4(float4 x, float4 k, float4 r, int act) {
    x.x = x.x * k.x + k.y;
    x.y = x.y * k.x + k.y;
    x.z = x.z * k.x + k.y;
    x.w = x.w * k.x + k.y;
    if (act) {
        x.x = mish(x.x);
        x.y = mish(x.y);
        x.z = mish(x.z);
        x.w = mish(x.w);
    }
    return make_float4(x.x * k.z + k.w + r.x, x.y * k.z + k.w + r.y, x.z * k.z + k.w + r.z, x.w * k.z + k.w + r.w);
}

// a channel's coefficients with its group's statistics (mean, rstd) folded in:
// gamma (x - mean) rstd + beta = a x + (beta - mean a), a = gamma rstd
__device__ __forceinline__ float4 fold_stats(float4 k, float2 st) {
    k.x *= st.y;
    k.y -= st.x * k.x;
    return k;
}

constexpr int U = 4;  // loads a thread keeps in flight in the prologue's loops (each is an L2 round trip)

__device__ __forceinline__ bool transformed(const UnetSource& s) {
    return s.gamma != nullptr || s.act || s.film || s.res != nullptr;
}

// 3. the prologue: X (cin_pad x L) from the sources, transformed in place. Every global load of a loop is
// issued before the first is used (cp.async, or U loads per thread at a time): the sources sit in L2, and a
// loop that waits for each load in turn costs an L2 round trip per element it touches.
// a source whose residual can be read a float4 at a time (L a power of two >= 4, 16-byte aligned rows)
__device__ __forceinline__ bool vector_ok(const UnetSource& s, int L, int b) {
    const float* res = s.res != nullptr ? s.res + static_cast<int64_t>(b) * s.channels * L : nullptr;
    return L >= 4 && (L & (L - 1)) == 0 && (res == nullptr || (reinterpret_cast<uintptr_t>(res) & 15) == 0);
}

// one source's raw values into X: 16-byte async copies where the source is contiguous (B, C, L), else U loads per
// thread at a time
template <int T>
__device__ __noinline__ void load_strided(const UnetSource s, int b, int L, float* xs) {
    const int tid = threadIdx.x, n = s.channels * L;
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

template <int T>
__device__ __forceinline__ void load_raw(const UnetSource& s, int b, int L, float* xs) {
    const int tid = threadIdx.x, n = s.channels * L;
    const float* src = s.raw + b * s.sb;
    if (s.kind == 0 && s.sl == 1 && s.sc == L && n % 4 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0 &&
        (reinterpret_cast<uintptr_t>(xs) & 15) == 0) {
        for (int i = 4 * tid; i < n; i += 4 * T) ca::copy16(xs + i, src + i, true, ca::Policy{0, 0});
        return;
    }
    load_strided<T>(s, b, L, xs);
}

// gamma, beta, FiLM scale and shift of one source's channels into coef (the statistics come later)
template <int T>
__device__ __forceinline__ void load_coef(const UnetSource& s, int b, float4* coef) {
    const int tid = threadIdx.x, C = s.channels;
    const int64_t tb = s.film_b != nullptr ? s.t[b] : 0;
    const int64_t base = static_cast<int64_t>(b) * s.film_ld + s.film_off, tbase = tb * s.film_ld + s.film_off;
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
        for (int u = 0; u < U; ++u)
            if (c0u + u * T < C) coef[c0u + u * T] = k[u];
    }
}

constexpr int UR = 2;  // residual float4s per thread loaded early: a 512-thread CTA's residual of up to 1024 x 4

// the transform one element at a time (L not a power of two, or unaligned rows): out of line, it is rare
template <int T>
__device__ __noinline__ void transform_scalar(const UnetSource s, float* xs, const float* res, const float4* coef,
                                              int L) {
    const int tid = threadIdx.x, n = s.channels * L;
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
            const float4 k = coef[i / L];
            float v = xs[i] * k.x + k.y;
            if (s.act) v = mish(v);
            xs[i] = v * k.z + k.w + r[u];
        }
    }
}

// log2 of stat_in_n (a power of two)
__device__ __forceinline__ int stat_in_shift(const UnetOp& op) { return __ffs(op.stat_in_n) - 1; }

// source 0's GroupNorm statistics from its producer's partials of n = stat_in_n outputs each (unet1d.h stat_in; the
// plan guarantees one warp per group and <= 32 partials per group): partials per group, 0 when the op reads none
__device__ __forceinline__ int partials_per_group(const UnetOp& op) {
    return op.stat_in != nullptr ? (div_pos(op.src[0].channels, op.src[0].groups) * op.l_in) >> stat_in_shift(op) : 0;
}

// this lane's partial (warp w takes group w), loaded early in its phase so that its latency hides behind others'
__device__ __forceinline__ float2 load_partial(const UnetOp& op, int b, int pk) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (pk == 0 || warp >= op.src[0].groups || lane >= pk) return make_float2(0.0f, 0.0f);
    const int first = (b * op.src[0].channels * op.l_in) >> stat_in_shift(op);
    return reinterpret_cast<const float2*>(op.stat_in)[first + warp * pk + lane];
}

// warp w's group from its lanes' pk partials of n elements each (mean m_i, squared deviations q_i):
// mean = sum m_i / pk, var = (sum q_i + n sum (m_i - mean)^2) / (pk n) (Chan et al.'s combination, equal counts)
__device__ __forceinline__ void combine_partials(const UnetOp& op, float2 part, int pk, float2* stats) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (pk == 0 || warp >= op.src[0].groups) return;
    const float n = static_cast<float>(op.stat_in_n);
    const float mean = warp_sum(lane < pk ? part.x : 0.0f) * inv_pos(pk);
    const float d = part.x - mean;
    const float q = warp_sum(lane < pk ? part.y + n * d * d : 0.0f);
    if (lane == 0) stats[warp] = make_float2(mean, rsqrtf(q * inv_pos(pk * op.stat_in_n) + 1e-5f));
}

// this CTA's share of X, stored as (B, cin, L) where the op materialises it (a skip or an identity residual)
template <int T>
__device__ __forceinline__ void store_mat(const UnetOp& op, int b, int cta, int ncta_all, const float* X) {
    if (op.mat == nullptr) return;
    const int n = op.cin * op.l_in, share = div_pos(n + ncta_all - 1, ncta_all);
    float* dst = op.mat + static_cast<int64_t>(b) * n;
    for (int i = cta * share + threadIdx.x; i < min(n, (cta + 1) * share); i += T) dst[i] = X[i];
}

// 3a. before the dependency wait: everything written two or more ops back (or before the forward): sources,
// per-channel coefficients, the first residual source's leading float4s (into registers)
// (fast: prologue_fast follows, and the transformed source's residual is copied into X, where its raw values'
// transform will land: the same thread copies and later reads each float4)
template <int T>
__device__ void prologue_early(const UnetOp& op, int b, float* X, float4* coef, float4 (&rpre)[UR], int& rsrc,
                               bool fast) {
    const int tid = threadIdx.x, L = op.l_in;
    int c0 = 0, k0 = 0;
    rsrc = -1;
    for (int si = 0; si < op.nsrc; ++si) {
        const UnetSource s = op.src[si];  // a copy: fields in registers, not indexed constant loads
        if (s.early) load_raw<T>(s, b, L, X + c0 * L);
        if (transformed(s) && s.coef_early) load_coef<T>(s, b, coef + k0);
        if (fast && transformed(s) && s.res != nullptr) {
            const float* res = s.res + static_cast<int64_t>(b) * s.channels * L;
            for (int i = 4 * tid; i < s.channels * L; i += 4 * T)
                ca::copy16(X + c0 * L + i, res + i, true, ca::Policy{0, 0});
        } else if (rsrc < 0 && s.res != nullptr && s.res_early && vector_ok(s, L, b)) {
            rsrc = si;
            const float4* r4 = reinterpret_cast<const float4*>(s.res + static_cast<int64_t>(b) * s.channels * L);
#pragma unroll
            for (int u = 0; u < UR; ++u) {
                const int v = tid + u * T;
                rpre[u] = v < s.channels * L / 4 ? r4[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        c0 += s.channels;
        k0 += transformed(s) ? s.channels : 0;
    }
    for (int i = op.cin * L + tid; i < op.cin_pad * L; i += T) X[i] = 0.0f;  // padded channels
    ca::commit();
}

// 3b. after it: the previous op's outputs, the GroupNorm statistics, the transform in place
template <int T>
__device__ void prologue(const UnetOp& op, int b, int cta, int ncta_all, float* X, float2* stats, float4* coef,
                         float* red, int red_floats, const float4 (&rpre)[UR], int rsrc) {
    constexpr int kWarps = T / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, L = op.l_in;
    const int pk = partials_per_group(op);
    const float2 part = load_partial(op, b, pk);  // its latency hidden behind the sources'
    int c0 = 0;
    for (int si = 0; si < op.nsrc; ++si) {
        const UnetSource s = op.src[si];  // a copy: fields in registers, not indexed constant loads
        if (!s.early) load_raw<T>(s, b, L, X + c0 * L);
        c0 += s.channels;
    }
    ca::commit();
    ca::wait_all();
    __syncthreads();
    mark(op, 3);

    c0 = 0;
    for (int si = 0; si < op.nsrc; ++si) {  // GroupNorm statistics
        const UnetSource s = op.src[si];  // a copy: fields in registers, not indexed constant loads
        if (s.gamma != nullptr && si == 0 && pk > 0) {
            combine_partials(op, part, pk, stats);
        } else if (s.gamma != nullptr) {
            const int cpg = s.channels / s.groups, n = cpg * L;  // n: elements of one group
            const int chunks = s.channels * L / 128;  // 32 float4s: one warp step
            if (n % 128 == 0 && (L & 3) == 0 && 2 * chunks <= red_floats) {
                // every thread: its float4s' sums of (x - shift) and (x - shift)^2 (shift: the group's first
                // element, so no cancellation), one partial per warp step in `red`, then per group in order
                const float4* x4 = reinterpret_cast<const float4*>(X + c0 * L);
                for (int wc = warp; wc < chunks; wc += kWarps) {
                    const int v = wc * 32 + lane;
                    const float sh = X[c0 * L + (4 * v / n) * n];
                    const float4 x = x4[v];
                    const float d0 = x.x - sh, d1 = x.y - sh, d2 = x.z - sh, d3 = x.w - sh;
                    const float s1 = warp_sum((d0 + d1) + (d2 + d3));
                    const float s2 = warp_sum((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3));
                    if (lane == 0) {
                        red[2 * wc] = s1;
                        red[2 * wc + 1] = s2;
                    }
                }
                __syncthreads();
                const int per = n / 128;  // warp steps per group
                for (int g = tid; g < s.groups; g += T) {
                    float s1 = 0.0f, s2 = 0.0f;
                    for (int k = 0; k < per; ++k) {
                        s1 += red[2 * (g * per + k)];
                        s2 += red[2 * (g * per + k) + 1];
                    }
                    const float m = s1 / n, var = fmaxf(s2 / n - m * m, 0.0f);
                    stats[si * UNET_MAX_GROUPS + g] = make_float2(X[c0 * L + g * n] + m, rsqrtf(var + 1e-5f));
                }
                __syncthreads();  // red is reused by the next source
            } else {  // one warp per group, two passes
                for (int g = warp; g < s.groups; g += kWarps) {
                    const float* xg = X + (c0 + g * cpg) * L;
                    float a0 = 0.0f, a1 = 0.0f;
                    for (int i = lane; i < n; i += 32) a0 += xg[i];
                    const float mean = warp_sum(a0) / n;
                    for (int i = lane; i < n; i += 32) a1 += (xg[i] - mean) * (xg[i] - mean);
                    const float var = warp_sum(a1) / n;
                    if (lane == 0) stats[si * UNET_MAX_GROUPS + g] = make_float2(mean, rsqrtf(var + 1e-5f));
                }
            }
        }
        c0 += s.channels;
    }
    __syncthreads();
    mark(op, 4);

    int k0 = 0;  // coefficient index of the source's first channel
    for (int si = 0; si < op.nsrc; ++si) {  // coefficients: loaded now where not early, then the statistics
        const UnetSource s = op.src[si];  // a copy: fields in registers, not indexed constant loads
        if (!transformed(s)) continue;
        if (!s.coef_early) load_coef<T>(s, b, coef + k0);  // a thread finalises the channels it loaded
        if (s.gamma != nullptr) {
            const int cpg = div_pos(s.channels, s.groups);
            for (int c = tid; c < s.channels; c += T) {
                coef[k0 + c] = fold_stats(coef[k0 + c], stats[si * UNET_MAX_GROUPS + div_pos(c, cpg)]);
            }
        }
        k0 += s.channels;
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
        if (L >= 4 && (L & (L - 1)) == 0 && (reinterpret_cast<uintptr_t>(xs) & 15) == 0 && vector_ok(s, L, b)) {
            const int lsh = __ffs(L) - 1, n4 = n / 4;  // a float4 never straddles two channels
            float4* x4 = reinterpret_cast<float4*>(xs);
            const float4* r4 = reinterpret_cast<const float4*>(res);
            for (int v0 = tid; v0 < n4; v0 += U * T) {
                float4 r[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + u * T;
                    r[u] = (si == rsrc && v0 == tid && u < UR) ? rpre[u < UR ? u : 0]
                           : (r4 != nullptr && v < n4) ? r4[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + u * T;
                    if (v >= n4) continue;
                    x4[v] = transform4(x4[v], coef[k0 + ((4 * v) >> lsh)], r[u], s.act);
                }
            }
        } else {
            transform_scalar<T>(s, xs, res, coef + k0, L);
        }
        c0 += s.channels;
        k0 += s.channels;
    }
    __syncthreads();
    mark(op, 5);
    store_mat<T>(op, b, cta, ncta_all, X);
}

// float4s of the transformed source that a thread holds in registers (prologue_fast): 4 spill at 512 threads and
// two CTAs per SM (64 registers), where 2 cover blog's 1024-channel ops at L = 4; with one CTA per SM (MINB = 1: an
// op over the two-CTA shared-memory budget, 128 registers) 4 cover Push-T image's 2048-channel ops at L = 4
template <int T, int MINB>
constexpr int kVmax = T >= 512 && MINB >= 2 ? 2 : 4;

// whether prologue_fast applies (uniform over the CTA): at most one transformed source, written by the previous op
// (not early) as contiguous 16-byte aligned (B, C, L) rows with L a power of two >= 4, at most kVmax float4s of it
// per thread, its coefficients and residual (if any) written two or more ops back (loaded early) and its GroupNorm
// statistics (if any) from its producer's partials
template <int T, int MINB>
__device__ __forceinline__ bool fast_prologue(const UnetOp& op, int b) {
    const int L = op.l_in;
    if (L < 4 || (L & (L - 1)) != 0) return false;
    int n = 0;
    for (int si = 0; si < op.nsrc; ++si) {
        const UnetSource& s = op.src[si];
        if (!transformed(s)) continue;
        if (++n > 1 || s.kind != 0 || s.early || !s.coef_early || (s.res != nullptr && !s.res_early) ||
            s.sl != 1 || s.sc != L || s.channels * L > 4 * kVmax<T, MINB> * T || !vector_ok(s, L, b) ||
            (reinterpret_cast<uintptr_t>(s.raw + static_cast<int64_t>(b) * s.sb) & 15) != 0 ||
            (s.gamma != nullptr && (si != 0 || op.stat_in == nullptr)))
            return false;
    }
    return true;
}

// 3b. (the register path, where fast_prologue holds) the transformed source's raw values go straight into
// registers, beside its producer's GroupNorm partials and the untransformed sources' cp.async copies into X,
// all in flight at once; one barrier publishes the statistics (and X); each thread then transforms its own float4s
// (a thread per float4, as prologue), finishing their coefficients inline, with the residual that it copied into
// their place before the dependency wait; a second barrier. Versus prologue: two barriers instead of four, and the
// previous op's output goes from L2 into registers once, not into X and back.
template <int T, int MINB>
__device__ __forceinline__ void prologue_fast(const UnetOp& op, int b, int cta, int ncta_all, float* X, float2* stats,
                                              const float4* coef) {
    const int tid = threadIdx.x, L = op.l_in;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const int pk = partials_per_group(op);
    const float2 part = load_partial(op, b, pk);
    // sources by compile-time index (fields read from the parameter bank, no copy held in registers)
    float4 x[kVmax<T, MINB>];
    int c0 = 0;
#pragma unroll
    for (int si = 0; si < UNET_MAX_SRC; ++si) {
        if (si >= op.nsrc) break;
        const UnetSource& s = op.src[si];
        if (!transformed(s)) {
            if (!s.early) load_raw<T>(s, b, L, X + c0 * L);
        } else {
            const float4* raw4 = reinterpret_cast<const float4*>(s.raw + static_cast<int64_t>(b) * s.sb);
            const int n4 = s.channels * L / 4;
#pragma unroll
            for (int u = 0; u < kVmax<T, MINB>; ++u) {
                const int v = tid + u * T;
                x[u] = v < n4 ? __ldcg(raw4 + v) : zero;  // from L2: the previous op wrote it
            }
        }
        c0 += s.channels;
    }
    ca::commit();
    combine_partials(op, part, pk, stats);
    ca::wait_all();
    __syncthreads();
    mark(op, 3);  // the sources and the statistics end together here
    mark(op, 4);
    c0 = 0;
    int k0 = 0;
#pragma unroll
    for (int si = 0; si < UNET_MAX_SRC; ++si) {
        if (si >= op.nsrc) break;
        const UnetSource& s = op.src[si];
        if (transformed(s)) {
            const int n4 = s.channels * L / 4, lsh = __ffs(L) - 1, cpg = div_pos(s.channels, s.groups);
            float4* x4 = reinterpret_cast<float4*>(X + c0 * L);
#pragma unroll
            for (int u = 0; u < kVmax<T, MINB>; ++u) {
                const int v = tid + u * T;
                if (v >= n4) continue;
                const int c = (4 * v) >> lsh;  // a float4 never straddles two channels
                const float4 k = s.gamma != nullptr ? fold_stats(coef[k0 + c], stats[div_pos(c, cpg)]) : coef[k0 + c];
                // the residual: copied here before the dependency wait, by this thread
                x4[v] = transform4(x[u], k, s.res != nullptr ? x4[v] : zero, s.act);
            }
            k0 += s.channels;
        }
        c0 += s.channels;
    }
    __syncthreads();
    mark(op, 5);
    store_mat<T>(op, b, cta, ncta_all, X);
}

// this CTA's weight stream: where its packed weights start, bytes per stage, the ring of slots (each of the op's
// largest stage) and their mbarriers; made once per CTA (cta_stream), read by every stage loop
struct Stream {
    const char* w;
    int stage;
    float* ring;
    int slot_floats;
    unsigned bars;
};

__device__ __forceinline__ Stream cta_stream(const UnetSegment& sg, int c, float* ring, int slot_floats,
                                             unsigned bars) {
    const int stage = stage_bytes(sg);
    return {reinterpret_cast<const char*>(sg.w) + static_cast<int64_t>(c) * sg.nstages * stage, stage, ring,
            slot_floats, bars};
}

// request stage `st` of this CTA's weights into ring slot `slot` (see UnetOp::copy). Bulk copies: thread 0 only,
// completing on the slot's mbarrier. cp.async: every thread copies its 16-byte pieces and commits one group.
__device__ __forceinline__ void issue_stage(const UnetOp& op, const Stream& ws, int st, int slot,
                                            const ca::Policy& hint) {
    const int stage = ws.stage;
    const unsigned bars = ws.bars;
    const char* src = ws.w + static_cast<int64_t>(st) * stage;
    char* dst = reinterpret_cast<char*>(ws.ring + slot * ws.slot_floats);
    if (op.copy == 2) {
        for (int i = 16 * threadIdx.x; i < stage; i += 16 * blockDim.x) ca::copy16(dst + i, src + i, true, hint);
        ca::commit();
    } else if (threadIdx.x == 0) {
        ca::mbar_arrive_expect_tx(bars + 8u * slot, static_cast<unsigned>(stage));
        ca::bulk_copy_g2s(ca::smem_addr(dst), src, static_cast<unsigned>(stage), bars + 8u * slot,
                          op.copy == 0 ? hint : ca::Policy{0, 0});
    }
}

// wait until stage `st` (in slot st % ring) has landed and is visible to every thread of the CTA
// (slot = st % ring, parity = (st / ring) & 1, kept by the caller); traced: mark its landing (the marks stay
// off the loop's path unless tracing)
__device__ __forceinline__ void wait_stage(const UnetOp& op, int st, int nstages, unsigned bars, int slot,
                                           unsigned parity, bool traced) {
    if (op.copy == 2) {  // groups of later stages may be in flight: at most min(ring, nstages - st) - 1
        const int later = min(op.ring, nstages - st) - 1;
        ca::wait_pending(later);
        __syncthreads();
    } else {
        ca::mbar_wait_parity(bars + 8u * slot, parity);
    }
    if (traced) {
        if (st == 0) mark(op, 6);
        if (st < 30) mark(op, 8 + st);
    }
}

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

// after stage st's work (traced: mark stage 1's, thread 0's warp): the slot's reads precede the copy engine's next
// write (proxy fence), every warp is done with it (barrier), thread 0 requests stage st + ring into it; then the
// next slot and its barrier's parity
__device__ __forceinline__ void release_slot(const UnetOp& op, const Stream& ws, int st, int nstages, int& slot,
                                             unsigned& parity, const ca::Policy& policy, bool traced) {
    if (traced && st == 1) mark(op, 38);
    if (op.copy != 2) ca::fence_proxy_async_smem();
    __syncthreads();
    if (st + op.ring < nstages) issue_stage(op, ws, st + op.ring, slot, policy);
    if (++slot == op.ring) {
        slot = 0;
        parity ^= 1u;
    }
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
    const float inv_n = inv_pos(n);  // exact: n is a power of two
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
            const float m = group_sum(v, n) * inv_n, d = v - m, q = group_sum(d * d, n);
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
        int idx;
        const float v = warp_sum_scatter<RPT * LO>(part, lane, idx);
        if ((lane & (32 / (RPT * LO) - 1)) == 0) rw[grp * RPT * LO + idx] = v;
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

// MINB: CTAs per SM the registers must allow (2: up to 64 registers at 512 threads; 1 for an op whose shared memory
// leaves its SM to it alone anyway)
template <int COLS, int NBMAX, int T, int MINB>
__global__ void __launch_bounds__(T, MINB) unet1d_op_kernel(const __grid_constant__ UnetOp op) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Carve cv = carve(op);
    const unsigned bars = ca::smem_addr(smem);
    float2* stats = reinterpret_cast<float2*>(smem + cv.stats);
    float* red = reinterpret_cast<float*>(smem + cv.red);
    float4* coef = reinterpret_cast<float4*>(smem + cv.coef);
    float* X = reinterpret_cast<float*>(smem + cv.x);

    const int b = blockIdx.x % op.batch_grid, cta = blockIdx.x / op.batch_grid;
    const int si = (op.nseg > 1 && cta >= op.seg[1].cta0) ? 1 : 0;
    const UnetSegment& sg = op.seg[si];
    const int c = cta - sg.cta0;
    const Stream ws = cta_stream(sg, c, reinterpret_cast<float*>(smem + cv.ring), cv.stage_bytes / 4, bars);

    mark(op, 0);
    // 1. weights first: they do not depend on the previous op
    {
        const ca::Policy policy = ca::make_policy(1);
        if (threadIdx.x == 0 && op.copy != 2) {
            for (int s = 0; s < op.ring; ++s) ca::mbar_init(bars + 8u * s, 1);
            ca::fence_mbar_init();
        }
        // (a CTA alone on its SM starts as its predecessor there leaves, with the dependency mostly met: its early
        // loads are on the critical path, so they go ahead of all but the first stage, not behind ring x 40 KB)
        const int now = MINB == 1 && op.copy != 2 ? 1 : op.ring;
        for (int s = 0; s < now && s < sg.nstages; ++s)
            issue_stage(op, ws, s, s, policy);
    }
    // 2. what older ops wrote; wait for the previous op; then let the next op start streaming its weights
    // (released only now, so that when op j starts, every op before j - 1 has finished: what 3a relies on)
    float4 rpre[UR];
    int rsrc;
    const bool fast = fast_prologue<T, MINB>(op, b);
    prologue_early<T>(op, b, X, coef, rpre, rsrc, fast);
    if (MINB == 1 && op.copy != 2) {
        const ca::Policy policy = ca::make_policy(1);
        for (int s = 1; s < op.ring && s < sg.nstages; ++s)
            issue_stage(op, ws, s, s, policy);
    }
    mark(op, 1);
    ca::grid_dependency_wait();
    ca::launch_dependents();
    mark(op, 2);
    // 3. (its __syncthreads also publishes the barrier initialisation)
    if (fast)
        prologue_fast<T, MINB>(op, b, cta, op.grid / op.batch_grid, X, stats, coef);
    else
        prologue<T>(op, b, cta, op.grid / op.batch_grid, X, stats, coef, red, (cv.coef - cv.red) / 4, rpre, rsrc);
    // 4.-5. (taps are compile-time: the kernel holds one copy of the stage loop per supported K)
    if constexpr (COLS == 8 && T == 512) {
        if (sg.simt) {  // the plan admits l_out 4 or 8, K 1, 3 or 5 (a carrier: 3 or 5) (_plan.simt_fits)
            if (sg.simt == 2 && sg.wbf16) run_simt<T, true, true>(op, sg, c, b, X, ws, red);
            else if (sg.simt == 2) run_simt<T, true, false>(op, sg, c, b, X, ws, red);
            else if (sg.wbf16) run_simt<T, false, true>(op, sg, c, b, X, ws, red);
            else run_simt<T, false, false>(op, sg, c, b, X, ws, red);
            return;
        }
    }
    switch (sg.k) {
        case 1: run_segment<COLS, NBMAX, T, 1>(op, sg, c, b, X, ws, red); break;
        case 2: run_segment<COLS, NBMAX, T, 2>(op, sg, c, b, X, ws, red); break;
        case 3: run_segment<COLS, NBMAX, T, 3>(op, sg, c, b, X, ws, red); break;
        case 5: run_segment<COLS, NBMAX, T, 5>(op, sg, c, b, X, ws, red); break;
        default: __trap();  // the plan admits K in {1, 2, 3, 5}
    }
}

using KernelFn = void (*)(UnetOp);

constexpr int kNbMax[] = {1, 2, 4, 8, 16};

// threads per CTA of an instantiation: 512 while the accumulators fit 64 registers (two CTAs per SM), else 256
constexpr int threads_for(int nb) { return nb <= 4 ? 512 : 256; }

// an op over this much shared memory has its SM to itself (_plan.SMEM_BUDGET: two CTAs per SM fit under it)
constexpr int kTwoCtaSmem = 113 * 1024;

// (256-thread instantiations hold 4 float4s in either case: only the 512-thread ones come in both MINB forms)
template <int COLS, int MINB>
KernelFn kernel_for_nb(int nb) {
    switch (nb) {
        case 1: return unet1d_op_kernel<COLS, 1, threads_for(1), MINB>;
        case 2: return unet1d_op_kernel<COLS, 2, threads_for(2), MINB>;
        case 4:
        case 8:
        case 16:
            if constexpr (COLS <= 16) {  // two 16-column tiles of 4+ row blocks would spill: the plan caps them at 2
                if (nb == 4) return unet1d_op_kernel<COLS, 4, threads_for(4), MINB>;
                if (nb == 8) return unet1d_op_kernel<COLS, 8, threads_for(8), 2>;
                return unet1d_op_kernel<COLS, 16, threads_for(16), 2>;
            }
            return nullptr;
        default: return nullptr;
    }
}

int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p *= 2;
    return p;
}

template <int MINB>
KernelFn kernel_for_cols(int cols, int nb) {
    switch (cols) {
        case 8: return kernel_for_nb<8, MINB>(nb);
        case 16: return kernel_for_nb<16, MINB>(nb);
        case 32: return kernel_for_nb<32, MINB>(nb);
        default: return nullptr;
    }
}

// the instantiation of an op: its output columns (8, 16 or 32), its segments' largest row-block count, and whether
// it has its SM to itself (alone: the 128-register form)
KernelFn kernel_for(int cols, int nbmax, bool alone) {
    const int nb = pow2_at_least(nbmax);
    return alone ? kernel_for_cols<1>(cols, nb) : kernel_for_cols<2>(cols, nb);
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
        for (int i = 0; i < 2 * 5; ++i) {
            const KernelFn fn = kernel_for(cols, kNbMax[i % 5], i >= 5);
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
        const KernelFn fn = kernel_for(op.cols, op_nbmax(op), op.smem_bytes > kTwoCtaSmem);
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
