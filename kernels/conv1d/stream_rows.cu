// stream_rows.cu: conv1d as a weight stream with whole rows per CTA (the `rows` knob of stream.cu's config).
//
// y[b, co, l] = bias[co] + sum_{j < R} w[co, j] * x[b, j / K, l + j % K - K/2], R = Cin*K; x: B x Cin x L,
// w: Cout x R, y: B x Cout x L; fp32, bf16 or fp16 storage, fp32 products and sums. For B*L <= 16, rows of whole
// 16-byte vectors (R * sizeof(T) % 16 == 0), a 16-byte aligned w, and RC rows + x fitting shared memory.
// Mapping: one CTA of THREADS = 256, 512 or 1024 threads per RC consecutive output rows (RC = 1, 2, 4, 8, chosen
// so the grid is about one CTA per SM: 1024->1024 @4 is 128 CTAs of 8 rows = 160 KB each). The CTA's RC rows are
// one contiguous range of w; it copies all of it into shared memory at once with TMA bulk copies (one per row and
// column chunk, every chunk completing on its own mbarrier, `ahead` chunks in flight: see below); no slot of shared
// memory is ever reused. Meanwhile the threads load x into shared memory as fp32.
// Per chunk (in order, as it lands): thread t takes columns j = t, t + THREADS, ... of the chunk, gathers its NO
// x values once and feeds each to RC rows (RC x NO FMAs per column). Then a transposing warp reduction, a sum
// over the THREADS / 32 warps in shared memory, the bias, y. THREADS is the `row_threads` knob (256, 512, 1024).
// `row_ahead` = D: warp 0 requests chunks 0..D-1 at launch and chunk c + D as soon as chunk c has landed, so chunks
// land one after another and the FMAs of each overlap the stream of the next ones (with every copy requested at
// launch, D >= chunks, the chunks complete together: an H200 timeline put the first of 2 chunks at ~5.9 us, about
// when all 160 KB had arrived, so nearly all FMAs ran after the last byte). The knobs' 0 = the plan's rule: >= 128 KB
// of w per CTA in 4 chunks, 2 in flight, 512 threads (more warps hide the x gather's shared-memory latency); less
// in one chunk of 256 threads.
// Differences from stream.cu (per-lane 512-byte pieces of 8 x 8 rows in a ring, split over Cin*K across 8 CTAs,
// the last CTA summing the partials): each CTA owns whole rows, so there is no cross-CTA reduction (no
// workspace, no counters, no second phase after the last byte) and each CTA reads one contiguous 160 KB range;
// there is no im2col (x is 16-32 KB, indexed directly), and no ring: every chunk has its own slot.
// Measured on H200s (kernels/conv1d/NOTES.md), with every copy issued at launch: 2-3 chunks per row beat 1 and
// 4+ (the chunks land together, so little overlaps; `row_ahead` below fixes that); a row-major
// variant (one copy per row, x in registers per channel, taps unrolled) was 1 us slower at 1024->1024.
#include <algorithm>
#include <cstdint>

#include "async_copy.cuh"
#include "conv1d.h"
#include "stream_device.cuh"
#include "warp_reduce.cuh"  // kernels/_cuda/

namespace {

namespace ca = dpk_async;
using conv1d_stream_device::Elem;
using conv1d_stream_device::ilog2;

struct RowsArgs {
    int B, Cin, Cout, L, K;
    int chunks, chunk_cols, policy;
    int ahead;  // chunks whose copies are issued at launch (1..chunks); chunk c + ahead is issued once c lands
};

// Warp 0: the bulk copies of chunk c, one per row (lane r copies row r; RC <= 8 rows).
template <typename T>
__device__ __forceinline__ void issue_chunk(const T* __restrict__ w, T* slab, int c, int rows, int row0, int R,
                                            const RowsArgs& a, unsigned bars, const ca::Policy& policy, int lane) {
    if (lane < rows) {
        const int col = c * a.chunk_cols, cols = min(a.chunk_cols, R - col);
        const size_t off = static_cast<size_t>(lane) * R + col;
        ca::bulk_copy_g2s(ca::smem_addr(slab + off), w + static_cast<size_t>(row0) * R + off,
                          static_cast<unsigned>(cols * sizeof(T)), bars + 8u * c, policy);
    }
}

// Shared memory: [chunks mbarriers, 8 B each, padded to 16 B][warp totals: THREADS / 32 x 32 fp32][RC rows of R
// elements][x: B*Cin*L fp32]; no static shared memory, so the whole opt-in limit is the plan's
template <typename T, int NO, int RC, int THREADS>
__global__ void __launch_bounds__(THREADS)
conv1d_rows_kernel(const T* __restrict__ x,     // B x Cin x L
                   const T* __restrict__ w,     // Cout x R, 16-byte aligned rows
                   const T* __restrict__ bias,  // Cout
                   T* __restrict__ y,           // B x Cout x L
                   RowsArgs a) {
    using El = Elem<T>;
    constexpr int kWarps = THREADS / 32;
    constexpr int NV = RC * NO;
    constexpr int H = NV >= 32 ? 5 : ilog2(NV), KEEP = NV >> H, SHIFT = 5 - H;
    extern __shared__ uint4 smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int R = a.Cin * a.K, BL = a.B * a.L, pad = a.K / 2, row0 = blockIdx.x * RC;
    const int rows = min(RC, a.Cout - row0);
    const unsigned bars = ca::smem_addr(smem);
    float(*red)[32] = reinterpret_cast<float(*)[32]>(smem + (a.chunks + 1) / 2);  // [warp][NV <= 32]
    T* slab = reinterpret_cast<T*>(red + kWarps);                                 // [RC][R]
    float* xs = reinterpret_cast<float*>(slab + static_cast<size_t>(RC) * R);     // [B][Cin][L]

    // 1. warp 0: declare every chunk's bytes, then its lanes issue the copies of the first `ahead` chunks
    // (chunk-major: early chunks first); the rest follow one chunk per landed chunk (step 3)
    const ca::Policy policy = ca::make_policy(a.policy);
    if (warp == 0) {
        if (lane == 0) {
            for (int c = 0; c < a.chunks; ++c) ca::mbar_init(bars + 8u * c, 1);
            ca::fence_mbar_init();
            for (int c = 0; c < a.chunks; ++c) {
                const int cols = min(a.chunk_cols, R - c * a.chunk_cols);
                ca::mbar_arrive_expect_tx(bars + 8u * c, static_cast<unsigned>(rows * cols * sizeof(T)));
            }
        }
        __syncwarp();
        for (int c = 0; c < a.ahead; ++c) issue_chunk(w, slab, c, rows, row0, R, a, bars, policy, lane);
    }
    // 2. x as fp32 (its lines are shared by every CTA: mostly L2 hits after the first)
    const int nx = BL * a.Cin;
    for (int i = tid; i < nx; i += THREADS) xs[i] = El::to_float(x[i]);
    // rows past Cout (last CTA only) read zeros: they are never copied
    for (int i = rows * R + tid; i < RC * R; i += THREADS) slab[i] = El::from_float(0.0f);
    __syncthreads();  // x, the zeroed rows and the barriers' init are visible to every thread

    // this thread's NO outputs: xs offset of (b, l) at column (ci, k) is xo[o] + ci*L + k, valid iff
    // 0 <= l + k - pad < L (and o < BL)
    int xo[NO], xl[NO];
#pragma unroll
    for (int o = 0; o < NO; ++o) {
        const int b = o / a.L, l = o - b * a.L;
        xo[o] = b * a.Cin * a.L + l - pad;
        xl[o] = o < BL ? l - pad : -(1 << 20);  // padded outputs: never in range
    }
    float acc[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) acc[i] = 0.0f;

    // 3. per chunk as it lands: columns j = tid + THREADS i, x gathered once, RC rows
    const int step_ci = THREADS / a.K, step_k = THREADS - step_ci * a.K;
    for (int c = 0; c < a.chunks; ++c) {
        const int j0 = c * a.chunk_cols, j1 = min(R, j0 + a.chunk_cols);
        ca::mbar_wait_parity(bars + 8u * c, 0);
        // one chunk landed: request the next one not yet in flight (its slab region was never read: no hazard)
        if (warp == 0 && c + a.ahead < a.chunks)
            issue_chunk(w, slab, c + a.ahead, rows, row0, R, a, bars, policy, lane);
        int j = j0 + tid, ci = j / a.K, k = j - ci * a.K;
        for (; j < j1; j += THREADS) {
            float xv[NO];
#pragma unroll
            for (int o = 0; o < NO; ++o) {
                const bool ok = static_cast<unsigned>(xl[o] + k) < static_cast<unsigned>(a.L);
                xv[o] = ok ? xs[xo[o] + ci * a.L + k] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < RC; ++r) {
                const float wv = El::to_float(slab[static_cast<size_t>(r) * R + j]);
#pragma unroll
                for (int o = 0; o < NO; ++o) acc[r * NO + o] += wv * xv[o];
            }
            ci += step_ci, k += step_k;
            if (k >= a.K) k -= a.K, ++ci;
        }
    }

    // 4. warp totals (reduce-scatter), the warps' totals in order, bias, y
    dpk_warp::reduce_scatter<NV>(acc, lane);
    if ((lane & ((1 << SHIFT) - 1)) == 0) {
#pragma unroll
        for (int i = 0; i < KEEP; ++i) red[warp][(lane >> SHIFT) * KEEP + i] = acc[i];
    }
    __syncthreads();
    if (tid < NV) {
        const int r = tid / NO, o = tid - r * NO;
        if (r < rows && o < BL) {
            float sum = 0.0f;
#pragma unroll
            for (int wp = 0; wp < kWarps; ++wp) sum += red[wp][tid];
            const int b = o / a.L, l = o - b * a.L, row = row0 + r;
            y[(static_cast<size_t>(b) * a.Cout + row) * a.L + l] = El::from_float(sum + El::to_float(bias[row]));
        }
    }
}

template <typename T, int NO, int RC, int THREADS>
cudaError_t launch(const T* x, const T* w, const T* b, T* y, Conv1dShape s, const Conv1dRowsPlan& p, int policy,
                   cudaStream_t stream) {
    constexpr auto kernel = conv1d_rows_kernel<T, NO, RC, THREADS>;
    const cudaError_t err = ca::allow_dynamic_smem<kernel>(p.smem_bytes);
    if (err != cudaSuccess) return err;
    const RowsArgs args{s.B, s.Cin, s.Cout, s.L, s.K, p.chunks, p.chunk_cols, policy,
                        p.ahead};
    kernel<<<p.ctas, THREADS, p.smem_bytes, stream>>>(x, w, b, y, args);
    return cudaGetLastError();
}

template <typename T, int NO, int RC>
cudaError_t launch_rc(const T* x, const T* w, const T* b, T* y, Conv1dShape s, const Conv1dRowsPlan& p, int policy,
                      cudaStream_t st) {
    switch (p.threads) {
        case 256: return launch<T, NO, RC, 256>(x, w, b, y, s, p, policy, st);
        case 512: return launch<T, NO, RC, 512>(x, w, b, y, s, p, policy, st);
        case 1024: return launch<T, NO, RC, 1024>(x, w, b, y, s, p, policy, st);
        default: return cudaErrorInvalidValue;
    }
}

template <typename T, int NO>
cudaError_t launch_no(const T* x, const T* w, const T* b, T* y, Conv1dShape s, const Conv1dRowsPlan& p, int policy,
                      cudaStream_t st) {
    switch (p.rows_per_cta) {
        case 1: return launch_rc<T, NO, 1>(x, w, b, y, s, p, policy, st);
        case 2: return launch_rc<T, NO, 2>(x, w, b, y, s, p, policy, st);
        case 4: if constexpr (NO <= 8) return launch_rc<T, NO, 4>(x, w, b, y, s, p, policy, st); break;
        case 8: if constexpr (NO <= 4) return launch_rc<T, NO, 8>(x, w, b, y, s, p, policy, st); break;
        default: break;
    }
    return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_typed(const void* x, const void* w, const void* b, void* y, Conv1dShape s,
                         const Conv1dRowsPlan& p, int policy, cudaStream_t st) {
    const T *xt = static_cast<const T*>(x), *wt = static_cast<const T*>(w), *bt = static_cast<const T*>(b);
    T* yt = static_cast<T*>(y);
    switch (p.outputs) {
        case 4: return launch_no<T, 4>(xt, wt, bt, yt, s, p, policy, st);
        case 8: return launch_no<T, 8>(xt, wt, bt, yt, s, p, policy, st);
        case 16: return launch_no<T, 16>(xt, wt, bt, yt, s, p, policy, st);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

bool conv1d_rows_knobs_ok(int chunks, int threads, int ahead) {
    return chunks >= 0 && chunks <= kConv1dRowsMaxChunks && ahead >= 0 && ahead <= kConv1dRowsMaxChunks &&
           (threads == 0 || threads == 256 || threads == 512 || threads == 1024);
}

Conv1dRowsPlan conv1d_rows_plan(Conv1dShape s, int elem_bytes, int chunks, int threads, int ahead, int num_sms) {
    Conv1dRowsPlan p{};
    if ((elem_bytes != 2 && elem_bytes != 4) || !conv1d_rows_knobs_ok(chunks, threads, ahead) || num_sms < 1 ||
        s.B < 1 || s.Cin < 1 || s.Cout < 1 || s.L < 1 || s.K < 1)
        return p;
    const long long bl = static_cast<long long>(s.B) * s.L, r = static_cast<long long>(s.Cin) * s.K;
    if (bl > 16 || (r * elem_bytes) % 16 != 0) return p;
    p.outputs = bl <= 4 ? 4 : (bl <= 8 ? 8 : 16);
    const int rc_max = 32 / p.outputs;  // RC * NO accumulators per thread
    const long long want = (s.Cout + num_sms - 1) / num_sms;  // about one CTA per SM
    p.rows_per_cta = 1;
    while (p.rows_per_cta < want && p.rows_per_cta < rc_max) p.rows_per_cta *= 2;
    p.ctas = static_cast<int>((s.Cout + p.rows_per_cta - 1) / p.rows_per_cta);
    // 0 = the measured rule (NOTES.md): a long stream per CTA (>= kConv1dRowsLongSlab bytes: the 21 MB batch-1
    // convs) in 4 chunks, 2 in flight, 512 threads; shorter ones in one chunk of 256 threads
    const bool longer = static_cast<long long>(p.rows_per_cta) * r * elem_bytes >= kConv1dRowsLongSlab;
    if (chunks == 0) chunks = longer ? 4 : 1;
    if (threads == 0) threads = longer ? 512 : 256;
    if (ahead == 0) ahead = longer ? 2 : chunks;
    const long long vec = 16 / elem_bytes;  // chunk columns: whole 16-byte vectors, so every copy is aligned
    p.chunk_cols = static_cast<int>(((r + chunks - 1) / chunks + vec - 1) / vec * vec);
    p.chunks = static_cast<int>((r + p.chunk_cols - 1) / p.chunk_cols);
    p.threads = threads;
    p.ahead = std::min(ahead, p.chunks);
    const long long bytes = 16LL * ((p.chunks + 1) / 2) + threads / 32 * 32 * 4 +
                            static_cast<long long>(p.rows_per_cta) * r * elem_bytes + bl * s.Cin * 4;
    if (bytes > ca::kMaxDynamicSmem) return Conv1dRowsPlan{};
    p.smem_bytes = static_cast<size_t>(bytes);
    p.ok = true;
    return p;
}

cudaError_t conv1d_stream_rows(Conv1dDtype dtype, const void* x, const void* w, const void* bias, void* y,
                               Conv1dShape s, const Conv1dRowsPlan& p, int cache_policy, cudaStream_t stream) {
    if (!p.ok || (reinterpret_cast<uintptr_t>(w) & 15) != 0 || cache_policy < 0 || cache_policy > 3 || p.ahead < 1 ||
        p.ahead > p.chunks)
        return cudaErrorInvalidValue;
    switch (dtype) {
        case kConv1dF32: return launch_typed<float>(x, w, bias, y, s, p, cache_policy, stream);
        case kConv1dBF16: return launch_typed<__nv_bfloat16>(x, w, bias, y, s, p, cache_policy, stream);
        case kConv1dF16: return launch_typed<__half>(x, w, bias, y, s, p, cache_policy, stream);
        default: return cudaErrorInvalidValue;
    }
}
