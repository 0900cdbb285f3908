// stream.cu: conv1d as a weight stream, for the small-B*L shapes of Diffusion Policy (B = 1, L = 4..16).
//
// y[b, co, l] = bias[co] + sum_{j < Cin*K} w[co, j] * x[b, j / K, l + j % K - K/2]; x: B x Cin x L,
// w: Cout x Cin x K viewed as Cout rows of R = Cin*K contiguous elements, y: B x Cout x L. Storage fp32, bf16
// or fp16; products and sums in fp32. fp32 with B*L > tiled_min_bl goes to tiled.cu instead (binding.cpp).
//
// At B*L <= 16 every weight feeds at most 16 FMAs, so the kernel is bound by reading w once (21 MB for
// 1024->1024, k=5): what decides it is how many bytes are in flight per SM from the first cycle and how
// little happens after the last byte arrives.
// Mapping: grid (splits, row_groups, passes), 256 threads = 8 warps. A CTA owns RPC = 8*RPW output rows (RPW
// per warp) and a contiguous range of column chunks of its rows; a chunk is CW = V*32*(16/sizeof(T)) columns
// (fp32, V=1: 128 columns, 512 B per row, 32 KB per CTA at RPW 8). The grid is sized to the resident capacity
// (SMs x ctas_per_sm, e.g. 1024->1024: 16 row groups x 8 splits of 5 chunks = 128 CTAs, one wave), so no CTA
// waits for another's slot and only `splits` partials per output meet at the end.
// Per CTA, in order:
//  1. cp.async (4-byte, zero-filled outside [0, L)) of the im2col of all its columns for its NO outputs into
//     shared memory, as float4 rows per lane (conflict-free LDS.128 later); bf16/fp16 stage it through
//     registers after step 2 instead (cp.async cannot convert).
//  2. cp.async of chunks 0..stages-2 of its weights into a per-thread ring: each lane copies its own RPW x V
//     16-byte vectors per chunk (a warp reads 512 contiguous bytes per row and vector) into slots only it
//     reads back, so the ring needs no barrier; up to (stages-1) x 32 KB in flight per CTA, not bounded by
//     registers. The L2 policy of these loads is a knob (evict_first: read-once bytes leave L2 first).
//  3. per chunk: issue chunk i+stages-1, wait for chunk i, RPW x CW x NO FMAs (each x value read feeds RPW
//     rows), accumulated in registers across the chunks.
//  4. transposing warp butterfly (reduce-scatter: ~RPW*NO shuffles, not 5 per sum); splits == 1: y with bias;
//     else partials -> workspace [split][Cout][B*L], and the last CTA of the (row group, pass) to arrive sums
//     them in split order (deterministic), adds the bias and writes y (async_copy.cuh: arrived_last; no memset,
//     graph-safe; counters: a persistent zeroed buffer owned by the caller, left zero).
// Differences from the first version (one 32 KB chunk per CTA held in registers, 640 CTAs in 1.6 waves at
// 72 registers, 20 partials per output): the ring decouples bytes in flight from registers, the grid fits
// one wave, x is requested before the weights, the split sum is 4-8 deep instead of 20.
// B*L > 16 (bf16/fp16 always; fp32 only when tiled_min_bl says so): one pass of NO = 16 outputs per grid.z
// index, each re-reading its weights (from L2 after the first pass).
// Rows whose byte length is not a multiple of 16 (e.g. Cin=3, K=3) or a misaligned w take 4-byte copies (fp32)
// or register loads (16-bit) into the same ring layout (VEC = false).
// Bulk ring (knob `bulk`, BULK = true; VEC only, else the cp.async ring runs): step 2's per-lane 16-byte cp.async
// costs one LDGSTS per 16 bytes (~10K per CTA at 1024->1024), about the SM's issue rate at its share of DRAM
// bandwidth, so the copies start slowly and leave no slack; deeper rings did not help. Here the copy engine (TMA,
// sm_90 `cp.async.bulk`) fills the same ring layout: for fixed (slot, r, u) a warp's 32 lanes own 512 contiguous
// ring bytes = one contiguous piece of row row0 + r, so a chunk is RPW*V bulk copies per warp (one per lane
// t < RPW*V, in-range bytes only; lanes past Cout or R zero their own 16 bytes with plain stores). Completion:
// one mbarrier per (slot, warp), count 1; chunk i is phase i / stages of its slot's barrier (lane 0's
// arrive.expect_tx of the warp's byte total, then the copies' complete_tx), waited for by every lane with
// try_wait.parity((i / stages) & 1). A slot is refilled only after the warp's __syncwarp following its reads, so
// no phase is ever two ahead of a waiter; a reused slot also takes a proxy fence (generic reads, then async
// writes). x keeps its 4-byte cp.async (wait_all + the barrier at i == 0). Every issued chunk is consumed, so no
// copy is in flight at exit. Shared memory: + 8 bytes x 8 warps per stage.
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

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct StreamArgs {
    int B, Cin, Cout, L, K;
    int passes, splits, chunks, stages, policy;
};

// bytes of mbarriers per ring stage with BULK: one 8-byte barrier per warp
constexpr int kBarBytesPerStage = kWarps * 8;

template <typename T, int NO, int RPW, int V, bool VEC, bool BULK>
__global__ void __launch_bounds__(kThreads, (NO == 16 && sizeof(T) == 2) ? 1 : 2)
conv1d_stream_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     T* __restrict__ y, float* __restrict__ ws, unsigned* __restrict__ counters, StreamArgs a) {
    static_assert(VEC || !BULK, "bulk copies need 16-byte rows");
    static_assert(RPW * V <= 32, "one bulk copy per lane and chunk");
    using El = Elem<T>;
    constexpr int E = 16 / sizeof(T);        // elements per 16-byte vector
    constexpr int CW = V * 32 * E;           // weight columns per chunk
    constexpr int SLOTS = V * E;             // im2col column slots per lane and chunk
    constexpr int RPC = kWarps * RPW;        // output rows per CTA
    constexpr int NO4 = NO / 4, NV = RPW * NO;
    constexpr int H = NV >= 32 ? 5 : ilog2(NV), KEEP = NV >> H, SHIFT = 5 - H;
    extern __shared__ uint4 smem[];
    __shared__ unsigned s_last;
    uint4* ring = smem;  // [stage][RPW][V][kThreads]: a thread's own 16-byte slots
    uint4* const ring_end = smem + static_cast<size_t>(a.stages) * RPW * V * kThreads;
    // BULK: [stage][warp] mbarriers (8 bytes each) between the ring and the im2col
    const unsigned bars = ca::smem_addr(ring_end);
    float4* xs = reinterpret_cast<float4*>(ring_end + (BULK ? a.stages * kBarBytesPerStage / 16 : 0));
    // xs: im2col [chunk][SLOTS][NO4][32 lanes] float4, chunk relative to the CTA's first

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int split = blockIdx.x, group = blockIdx.y, pass = blockIdx.z;
    const int R = a.Cin * a.K, BL = a.B * a.L, pad = a.K / 2;
    const int c_begin = static_cast<int>(static_cast<long long>(split) * a.chunks / a.splits);
    const int nc = static_cast<int>(static_cast<long long>(split + 1) * a.chunks / a.splits) - c_begin;
    const int row0 = group * RPC + warp * RPW;
    const ca::Policy policy = ca::make_policy(a.policy);

    // im2col slot s (chunk s / SLOTS) of this lane: use(o, ok, src) for its NO outputs, src valid iff ok
    auto for_each_x = [&](int s, auto&& use) {
        const int ch = s / SLOTS, ue = s - ch * SLOTS;
        const int j = (c_begin + ch) * CW + ((ue / E) * 32 + lane) * E + ue % E;
        const bool col_ok = j < R;
        const int ci = col_ok ? j / a.K : 0, k = col_ok ? j - ci * a.K : 0;
        int b = pass * NO / a.L, l = pass * NO - b * a.L;
#pragma unroll
        for (int o = 0; o < NO; ++o) {
            const int pos = l + k - pad;
            const bool ok = col_ok && b < a.B && pos >= 0 && pos < a.L;
            use(o, ok, ok ? x + (static_cast<size_t>(b) * a.Cin + ci) * a.L + pos : x);
            if (++l == a.L) l = 0, ++b;
        }
    };
    auto x_slot = [&](int s, int o) { return reinterpret_cast<float*>(xs + (s * NO4 + o / 4) * 32 + lane) + (o & 3); };

    // weights of chunk c_begin + i -> ring slot i % stages (zeros past Cout or R)
    auto issue_chunk = [&](int i, int slot) {
        const int col0 = (c_begin + i) * CW;
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
            const int row = row0 + r;
#pragma unroll
            for (int u = 0; u < V; ++u) {
                const int col = col0 + (u * 32 + lane) * E;
                uint4* dst = ring + ((slot * RPW + r) * V + u) * kThreads + tid;
                const T* src = w + static_cast<size_t>(row < a.Cout ? row : 0) * R + col;
                if constexpr (VEC) {  // R * sizeof(T) % 16 == 0: a vector is wholly inside the row or wholly past it
                    const bool ok = row < a.Cout && col < R;
                    ca::copy16(dst, ok ? src : w, ok, policy);
                } else if constexpr (sizeof(T) == 4) {
#pragma unroll
                    for (int e = 0; e < E; ++e) {
                        const bool ok = row < a.Cout && col + e < R;
                        ca::copy4(reinterpret_cast<float*>(dst) + e, ok ? src + e : w, ok, policy);
                    }
                } else {
                    uint4 v = make_uint4(0, 0, 0, 0);
#pragma unroll
                    for (int e = 0; e < E; ++e)
                        if (row < a.Cout && col + e < R) El::set(v, e, El::load_bits(src + e));
                    *dst = v;
                }
            }
        }
    };

    // BULK: the same chunk -> slot mapping, filled by the copy engine. For fixed (slot, r, u) the 32 lanes of a
    // warp own 512 contiguous ring bytes = row row0 + r, columns [col0 + u*32*E, +32*E): one bulk copy of its
    // in-range part (a multiple of 16 bytes since R * sizeof(T) % 16 == 0), issued by lane r * V + u after the
    // warp finished reading the slot and lane 0 declared the bytes; lanes past Cout or R zero their own 16 bytes
    // with plain stores (disjoint from the copied bytes). Chunk i completes phase i / stages of the warp's barrier
    // of slot i % stages: one arrival (lane 0's expect_tx, even for 0 bytes) plus the copied bytes.
    auto bar_of = [&](int slot) { return bars + static_cast<unsigned>((slot * kWarps + warp) * 8); };
    auto issue_chunk_bulk = [&](int i, int slot) {
        const int col0 = (c_begin + i) * CW;
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
#pragma unroll
            for (int u = 0; u < V; ++u) {
                if (!(row0 + r < a.Cout && col0 + (u * 32 + lane) * E < R))
                    ring[((slot * RPW + r) * V + u) * kThreads + tid] = make_uint4(0, 0, 0, 0);
            }
        }
        // lane t < RPW * V copies piece (r, u) = (t / V, t % V); lane 0 declares the warp's total bytes first
        const int r = lane / V, u = lane % V, row = row0 + r, col = col0 + u * 32 * E;
        const bool copy = lane < RPW * V && row < a.Cout && col < R;
        const unsigned bytes = copy ? static_cast<unsigned>(min(32 * E, R - col) * sizeof(T)) : 0u;
        const unsigned total = __reduce_add_sync(0xffffffffu, bytes);
        // A reused slot (chunk >= stages): order the lanes' reads of its previous chunk (generic proxy) before the
        // copy engine overwrites it (async proxy). A first use needs none (zeroed bytes are never copied to later:
        // a piece past Cout or R stays past it), and skipping it there keeps the prologue's copies from waiting
        // behind this lane's x cp.asyncs (the fence is a MEMBAR.CTA).
        if (i >= a.stages) ca::fence_proxy_async_smem();
        __syncwarp();
        if (lane == 0) ca::mbar_arrive_expect_tx(bar_of(slot), total);
        __syncwarp();                  // the expect_tx precedes every complete_tx of this phase
        if (copy)
            ca::bulk_copy_g2s(ca::smem_addr(ring + ((slot * RPW + r) * V + u) * kThreads + warp * 32),
                              w + static_cast<size_t>(row) * R + col, bytes, bar_of(slot), policy);
    };

    // 1. x first (its lines are shared by every CTA; they must not queue behind the weight burst)
    if constexpr (sizeof(T) == 4) {
        for (int s = warp; s < nc * SLOTS; s += kWarps)
            for_each_x(s, [&](int o, bool ok, const T* src) { ca::copy4(x_slot(s, o), src, ok); });
    }
    ca::commit();
    // 2. the first stages - 1 chunks of weights
    if constexpr (BULK) {
        if (lane == 0) {  // each warp's own barriers: only its lanes and its copies use them
            for (int st = 0; st < a.stages; ++st) ca::mbar_init(bar_of(st), 1);
            ca::fence_mbar_init();
        }
        __syncwarp();
        for (int i = 0; i < a.stages - 1 && i < nc; ++i) issue_chunk_bulk(i, i);
    } else {
        for (int i = 0; i < a.stages - 1; ++i) {
            if (i < nc) issue_chunk(i, i);
            ca::commit();
        }
    }
    if constexpr (sizeof(T) != 4) {  // 16-bit x: load, widen, store (published by the barrier at i == 0)
        for (int s = warp; s < nc * SLOTS; s += kWarps)
            for_each_x(s, [&](int o, bool ok, const T* src) { *x_slot(s, o) = ok ? El::to_float(*src) : 0.0f; });
    }

    // 3. stream the chunks: issue i + stages - 1, wait for i, FMAs
    float acc[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) acc[i] = 0.0f;
    int slot = 0, ahead_slot = a.stages - 1;  // i % stages, (i + stages - 1) % stages
    unsigned parity = 0;  // BULK: (i / stages) & 1, parity of the phase of slot's barrier that chunk i completes
    for (int i = 0; i < nc; ++i) {
        if constexpr (BULK) {
            if (i + a.stages - 1 < nc) issue_chunk_bulk(i + a.stages - 1, ahead_slot);
            if (i == 0) {
                ca::wait_all();    // this thread's im2col copies have landed
                __syncthreads();   // ... and every other thread's
            }
            ca::mbar_wait_parity(bar_of(slot), parity);  // chunk i's bytes of this warp's slot have landed
        } else {
            if (i + a.stages - 1 < nc) issue_chunk(i + a.stages - 1, ahead_slot);
            ca::commit();
            ca::wait_pending(a.stages - 1);  // im2col and chunks 0..i of this thread have landed
            if (i == 0) __syncthreads();     // ... and every other thread's im2col
        }
        const float4* xc = xs + static_cast<size_t>(i) * SLOTS * NO4 * 32;
#pragma unroll
        for (int u = 0; u < V; ++u) {
            uint4 wq[RPW];
#pragma unroll
            for (int r = 0; r < RPW; ++r) wq[r] = ring[((slot * RPW + r) * V + u) * kThreads + tid];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                float wv[RPW];
#pragma unroll
                for (int r = 0; r < RPW; ++r) wv[r] = El::get(wq[r], e);
#pragma unroll
                for (int o4 = 0; o4 < NO4; ++o4) {
                    const float4 xv = xc[((u * E + e) * NO4 + o4) * 32 + lane];
#pragma unroll
                    for (int r = 0; r < RPW; ++r) {
                        float* s = acc + r * NO + 4 * o4;
                        s[0] += wv[r] * xv.x, s[1] += wv[r] * xv.y, s[2] += wv[r] * xv.z, s[3] += wv[r] * xv.w;
                    }
                }
            }
        }
        if (slot + 1 == a.stages) parity ^= 1u;
        slot = slot + 1 == a.stages ? 0 : slot + 1;
        ahead_slot = ahead_slot + 1 == a.stages ? 0 : ahead_slot + 1;
    }

    // 4. warp totals, then this CTA's share: y directly (one split) or partials to the workspace
    dpk_warp::reduce_scatter<NV>(acc, lane);
    if ((lane & ((1 << SHIFT) - 1)) == 0) {
#pragma unroll
        for (int i = 0; i < KEEP; ++i) {
            const int idx = (lane >> SHIFT) * KEEP + i;
            const int row = row0 + idx / NO, og = pass * NO + idx % NO;
            if (row < a.Cout && og < BL) {
                if (a.splits == 1) {
                    const int b = og / a.L, l = og - b * a.L;
                    y[(static_cast<size_t>(b) * a.Cout + row) * a.L + l] =
                        El::from_float(acc[i] + El::to_float(bias[row]));
                } else {
                    ws[(static_cast<size_t>(split) * a.Cout + row) * BL + og] = acc[i];
                }
            }
        }
    }
    if (a.splits == 1) return;
    if (!ca::arrived_last(counters + static_cast<size_t>(group) * a.passes + pass, a.splits, &s_last)) return;
    const int rows = min(RPC, a.Cout - group * RPC), outs = min(NO, BL - pass * NO);
    for (int i = tid; i < rows * outs; i += kThreads) {
        const int row = group * RPC + i / outs, og = pass * NO + i % outs;
        const float* p = ws + static_cast<size_t>(row) * BL + og;
        float sum = 0.0f;
#pragma unroll 4
        for (int sp = 0; sp < a.splits; ++sp) sum += __ldcg(p + static_cast<size_t>(sp) * a.Cout * BL);
        const int b = og / a.L, l = og - b * a.L;
        y[(static_cast<size_t>(b) * a.Cout + row) * a.L + l] = El::from_float(sum + El::to_float(bias[row]));
    }
}

int outputs_per_pass(long long bl) { return bl <= 4 ? 4 : (bl <= 8 ? 8 : 16); }

// (RPW, V) combinations compiled per case: all of these for fp32 with NO = 4 (the 21 MB batch-1 targets),
// (4, 2) everywhere else.
constexpr int kCombos[][2] = {{2, 2}, {2, 4}, {4, 1}, {4, 2}, {4, 4}, {8, 1}, {8, 2}};
bool combo_compiled(int elem_bytes, int no, int rpw, int v) {
    if (elem_bytes != 4 || no != 4) return rpw == 4 && v == 2;
    for (const auto& c : kCombos)
        if (c[0] == rpw && c[1] == v) return true;
    return false;
}

template <typename T, int NO, int RPW, int V>
cudaError_t launch_combo(const T* x, const T* w, const T* b, T* y, float* ws, unsigned* counters, Conv1dShape s,
                         const Conv1dStreamPlan& p, int policy, cudaStream_t stream) {
    const bool vec = (static_cast<size_t>(s.Cin) * s.K * sizeof(T)) % 16 == 0 &&
                     (reinterpret_cast<uintptr_t>(w) & 15) == 0;
    constexpr auto kBulk = conv1d_stream_kernel<T, NO, RPW, V, true, true>;
    constexpr auto kVec = conv1d_stream_kernel<T, NO, RPW, V, true, false>;
    constexpr auto kScalar = conv1d_stream_kernel<T, NO, RPW, V, false, false>;
    const auto kernel = !vec ? kScalar : (p.bulk ? kBulk : kVec);  // a misaligned w: no bulk (smem has room)
    const cudaError_t err = kernel == kBulk  ? ca::allow_dynamic_smem<kBulk>(p.smem_bytes)
                            : kernel == kVec ? ca::allow_dynamic_smem<kVec>(p.smem_bytes)
                                             : ca::allow_dynamic_smem<kScalar>(p.smem_bytes);
    if (err != cudaSuccess) return err;
    const StreamArgs args{s.B, s.Cin, s.Cout, s.L, s.K, p.passes, p.splits, p.chunks, p.stages, policy};
    const dim3 grid(p.splits, p.row_groups, p.passes);
    kernel<<<grid, kThreads, p.smem_bytes, stream>>>(x, w, b, y, ws, counters, args);
    return cudaGetLastError();
}

template <typename T, int NO>
cudaError_t launch_no(const T* x, const T* w, const T* b, T* y, float* ws, unsigned* counters, Conv1dShape s,
                      const Conv1dStreamPlan& p, int policy, cudaStream_t st) {
    if constexpr (sizeof(T) == 4 && NO == 4) {
        switch (p.rows_per_warp * 16 + p.vecs_per_row) {
            case 2 * 16 + 2: return launch_combo<T, NO, 2, 2>(x, w, b, y, ws, counters, s, p, policy, st);
            case 2 * 16 + 4: return launch_combo<T, NO, 2, 4>(x, w, b, y, ws, counters, s, p, policy, st);
            case 4 * 16 + 1: return launch_combo<T, NO, 4, 1>(x, w, b, y, ws, counters, s, p, policy, st);
            case 4 * 16 + 4: return launch_combo<T, NO, 4, 4>(x, w, b, y, ws, counters, s, p, policy, st);
            case 8 * 16 + 1: return launch_combo<T, NO, 8, 1>(x, w, b, y, ws, counters, s, p, policy, st);
            case 8 * 16 + 2: return launch_combo<T, NO, 8, 2>(x, w, b, y, ws, counters, s, p, policy, st);
            default: break;
        }
    }
    return launch_combo<T, NO, 4, 2>(x, w, b, y, ws, counters, s, p, policy, st);
}

template <typename T>
cudaError_t launch_typed(Conv1dDtype dtype, const void* x, const void* w, const void* b, void* y, float* ws,
                         unsigned* counters, Conv1dShape s, const Conv1dStreamConfig& cfg, int num_sms,
                         cudaStream_t stream) {
    const Conv1dStreamPlan p = conv1d_stream_plan(s, sizeof(T), cfg, num_sms);
    if (!p.ok || (p.splits > 1 && (ws == nullptr || counters == nullptr))) return cudaErrorInvalidValue;
    if (p.rows)
        return conv1d_stream_rows(dtype, x, w, b, y, s,
                                  conv1d_rows_plan(s, sizeof(T), cfg.row_chunks, cfg.row_threads, cfg.row_ahead,
                                                   num_sms),
                                  cfg.cache_policy, stream);
    const T *xt = static_cast<const T*>(x), *wt = static_cast<const T*>(w), *bt = static_cast<const T*>(b);
    T* yt = static_cast<T*>(y);
    switch (p.outputs_per_pass) {
        case 4: return launch_no<T, 4>(xt, wt, bt, yt, ws, counters, s, p, cfg.cache_policy, stream);
        case 8: return launch_no<T, 8>(xt, wt, bt, yt, ws, counters, s, p, cfg.cache_policy, stream);
        default: return launch_no<T, 16>(xt, wt, bt, yt, ws, counters, s, p, cfg.cache_policy, stream);
    }
}

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

}  // namespace

Conv1dStreamPlan conv1d_stream_plan(Conv1dShape s, int elem_bytes, const Conv1dStreamConfig& cfg, int num_sms) {
    Conv1dStreamPlan p{};
    if ((elem_bytes != 2 && elem_bytes != 4) || cfg.stages < 2 || cfg.stages > 8 || cfg.ctas_per_sm < 0 ||
        cfg.ctas_per_sm > 8 || cfg.cache_policy < 0 || cfg.cache_policy > 3 || cfg.bulk < 0 || cfg.bulk > 1 ||
        cfg.rows < 0 || cfg.rows > 1 || !conv1d_rows_knobs_ok(cfg.row_chunks, cfg.row_threads, cfg.row_ahead) ||
        num_sms < 1 || s.B < 1 || s.Cin < 1 || s.Cout < 1 || s.L < 1 || s.K < 1)
        return p;
    if (cfg.rows == 1) {  // stream_rows.cu where it fits
        const Conv1dRowsPlan r =
            conv1d_rows_plan(s, elem_bytes, cfg.row_chunks, cfg.row_threads, cfg.row_ahead, num_sms);
        if (r.ok) {
            p.ok = true, p.rows = 1, p.rows_per_warp = cfg.rows_per_warp, p.vecs_per_row = cfg.vecs_per_row;
            p.outputs_per_pass = r.outputs, p.passes = 1, p.splits = 1, p.row_groups = r.ctas;
            p.chunks = p.chunks_per_cta = p.stages = r.chunks, p.smem_bytes = r.smem_bytes, p.bulk = 1;
            return p;
        }
    }
    const long long bl = static_cast<long long>(s.B) * s.L, r = static_cast<long long>(s.Cin) * s.K;
    p.outputs_per_pass = outputs_per_pass(bl);
    p.passes = static_cast<int>(ceil_div(bl, p.outputs_per_pass));
    const bool compiled = combo_compiled(elem_bytes, p.outputs_per_pass, cfg.rows_per_warp, cfg.vecs_per_row);
    p.rows_per_warp = compiled ? cfg.rows_per_warp : 4;
    p.vecs_per_row = compiled ? cfg.vecs_per_row : 2;
    const long long cw = p.vecs_per_row * 32 * (16 / elem_bytes);
    p.bulk = cfg.bulk == 1 && (r * elem_bytes) % 16 == 0;  // rows of whole 16-byte vectors (VEC); else cp.async
    // one ring stage: the weights, plus its mbarriers with bulk
    const long long stage_bytes = static_cast<long long>(kThreads) * p.rows_per_warp * p.vecs_per_row * 16 +
                                  (p.bulk ? kBarBytesPerStage : 0);
    const long long chunk_x_bytes = cw * p.outputs_per_pass * 4;  // im2col of one chunk, fp32
    p.chunks = static_cast<int>(ceil_div(r, cw));
    p.row_groups = static_cast<int>(ceil_div(s.Cout, kWarps * p.rows_per_warp));
    p.stages = static_cast<int>(std::min<long long>(cfg.stages, (ca::kMaxDynamicSmem - chunk_x_bytes) / stage_bytes));
    if (p.stages < 2) return Conv1dStreamPlan{};
    const long long base = static_cast<long long>(p.row_groups) * p.passes;
    long long splits = cfg.ctas_per_sm == 0 ? p.chunks
                                            : std::max(1LL, std::min<long long>(p.chunks,
                                                                               num_sms * cfg.ctas_per_sm / base));
    auto smem = [&](long long sp) { return p.stages * stage_bytes + ceil_div(p.chunks, sp) * chunk_x_bytes; };
    // no ring slots that would stay idle (a CTA with fewer chunks than stages); first at the target grid, so that
    // idle stages never push splits up (rpw8 v1 with stages 7-8 used to fall back to one chunk per CTA), then again
    // if shared memory forced more splits
    auto cap_stages = [&] {
        p.stages = static_cast<int>(std::min<long long>(p.stages, std::max(2LL, ceil_div(p.chunks, splits))));
    };
    cap_stages();
    while (smem(splits) > ca::kMaxDynamicSmem) ++splits;  // ends at splits == chunks (one chunk fits, above)
    cap_stages();
    if (cfg.ctas_per_sm >= 2) {  // fewer stages until ctas_per_sm CTAs fit one SM's shared memory
        const long long budget = ca::kSmemPerSm / cfg.ctas_per_sm - ca::kSmemReservedPerCta;
        while (p.stages > 2 && smem(splits) > budget) --p.stages;
    }
    if (p.row_groups > 65535 || p.passes > 65535) return Conv1dStreamPlan{};
    p.splits = static_cast<int>(splits);
    p.chunks_per_cta = static_cast<int>(ceil_div(p.chunks, splits));
    p.smem_bytes = static_cast<size_t>(smem(splits));
    p.workspace_floats = p.splits > 1 ? static_cast<size_t>(p.splits) * s.Cout * bl : 0;
    p.counters = p.splits > 1 ? p.row_groups * p.passes : 0;
    p.ok = true;
    return p;
}

cudaError_t conv1d_stream(Conv1dDtype dtype, const void* x, const void* w, const void* bias, void* y,
                          float* workspace, unsigned* counters, Conv1dShape s, const Conv1dStreamConfig& cfg,
                          int num_sms, cudaStream_t stream) {
    if (s.B < 1 || s.Cin < 1 || s.Cout < 1 || s.L < 1 || s.K < 1 || s.K % 2 == 0) return cudaErrorInvalidValue;
    switch (dtype) {
        case kConv1dF32:
            return launch_typed<float>(dtype, x, w, bias, y, workspace, counters, s, cfg, num_sms, stream);
        case kConv1dBF16:
            return launch_typed<__nv_bfloat16>(dtype, x, w, bias, y, workspace, counters, s, cfg, num_sms, stream);
        case kConv1dF16:
            return launch_typed<__half>(dtype, x, w, bias, y, workspace, counters, s, cfg, num_sms, stream);
        default: return cudaErrorInvalidValue;
    }
}
