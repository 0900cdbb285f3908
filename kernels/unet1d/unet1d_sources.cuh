// unet1d_sources.cuh: the prologue's building blocks (step 3 in unet1d.cu): a source's raw values into X, the
// per-channel coefficients (a, b, scale, shift) of its transform x -> scale act(a x + b) + shift + res, the
// transform itself, GroupNorm statistics combined from the producer's partials, and the CTA's share of X stored
// where the op materialises it. Every thread of the CTA takes elements in turn (T-strided).
#pragma once

#include "unet1d_device.cuh"

namespace {

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
    const float mean = dpk_warp::sum(lane < pk ? part.x : 0.0f) * inv_pos(pk);
    const float d = part.x - mean;
    const float q = dpk_warp::sum(lane < pk ? part.y + n * d * d : 0.0f);
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

}  // namespace
