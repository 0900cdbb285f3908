// unet1d_prologue.cuh: step 3 of unet1d.cu's kernel, X = the op's transformed sources in shared memory.
// prologue_early runs before the dependency wait (what two or more ops back wrote); prologue (general: sources
// staged in X, statistics, coefficients, transform in place, four barriers) or prologue_fast (one transformed
// source in registers, two barriers) after it. All T threads of the CTA.
#pragma once

#include "unet1d_sources.cuh"

namespace {

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
                    const float s1 = dpk_warp::sum((d0 + d1) + (d2 + d3));
                    const float s2 = dpk_warp::sum((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3));
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
                    const float mean = dpk_warp::sum(a0) / n;
                    for (int i = lane; i < n; i += 32) a1 += (xg[i] - mean) * (xg[i] - mean);
                    const float var = dpk_warp::sum(a1) / n;
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

}  // namespace
