// tiled.cu: conv1d as an implicit GEMM, the large-B*L path of `optimized` and `stream`, on CUDA cores (fp32 FMAs)
// or on tensor cores (3xTF32: fp32 accuracy from three TF32 products, tiled_engines.cuh).
//
// Y[co, n] = bias[co] + sum_{j < R} W[co, j] * X^[j, n], with n = b*L + l (N = B*L columns), R = Cin*K,
// W = w viewed as Cout x R (row-major, contiguous), X^[j, n] = x[b, j / K, l + j % K - K/2] (zero outside
// [0, L)): the im2col matrix, never materialised in global memory. fp32 storage, fp32 accumulation.
//
// Mapping: grid (N tiles, Cout tiles, splits); a CTA computes a BM x BN tile of Y over its contiguous share of
// the R/BK k-steps (split-K, so that SMs x ctas_per_sm CTAs run even when the tiles alone are few: 1024->1024
// at B=64 has 8 x 4 tiles of 128 x 64). The math engine (`mma` knob: SimtTile or MmaTile, tiled_engines.cuh)
// owns the thread -> accumulator mapping and sets the CTA size NT ((BM/TM) x (BN/TN), or the tile's
// mma_threads); the loads below are written for any NT.
// Per k-step, `stages`-deep cp.async pipeline (one barrier per step):
//   A: BM x BK of W, 16-byte copies along j (4-byte when R % 4 != 0 or w is misaligned), zero-filled past
//      Cout/R, with the weight-stream L2 policy knob; stored [BM][BK+4].
//   B: BK x BN of X^, gathered with 4-byte zero-filling copies (the zero padding of the conv is the src-size-0
//      case): thread t owns column t % BN and rows t / BN + i*(NT/BN), its (ci, k) advanced without divisions;
//      stored [BK][BN] (SIMT) or [BK][BN+8] (MMA: conflict-free B fragments).
// Epilogue: splits == 1: y = acc + bias. Else the tile's partials go to the workspace (tile-contiguous) and the
// last CTA of the tile to arrive (async_copy.cuh: arrived_last) sums the splits in order with 16-byte loads
// (deterministic), adds the bias and writes y.
// Floors at B=64 (1024->1024 or 2048->512, k=5): 2.7 GFLOP = 1.34 G FMA, 40-45 us on 132 SMs x 128 FP32 lanes
// at 1.75-1.98 GHz (SIMT ran 109-116 us); cuDNN's TF32 path took 89 us. 3xTF32 issues 3 x 2.7 GFLOP of TF32
// mma: 16 us at the H200's dense TF32 peak (495 TFLOP/s, a wgmma figure; mma.sync gets less). At B=8 (N = 32)
// it is the weight stream plus 5.7 us of FMAs.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "async_copy.cuh"
#include "conv1d.h"
#include "tiled_engines.cuh"

namespace {

namespace ca = dpk_async;

struct TileShape {
    int bm, bn, bk, tm, tn, mma_threads;  // tm, tn: SimtTile's register tile; mma_threads: MmaTile's CTA size
};
// 0: N <= 32 (B=8, L=4), 1: N <= 64, 2: larger N (2 CTAs/SM: 128 threads SIMT, 256 MMA), 3: one CTA per SM.
constexpr TileShape kTiles[kConv1dTiledTiles] = {
    {64, 32, 32, 4, 4, 128}, {64, 64, 32, 4, 8, 128}, {128, 64, 32, 8, 8, 256}, {128, 128, 32, 8, 8, 256}};
constexpr int threads_of(const TileShape& t, bool mma) {
    return mma ? t.mma_threads : (t.bm / t.tm) * (t.bn / t.tn);
}
// A [BM][BK+4], then B [BK][SB] with SB = BN (SIMT) or BN + 8 (MMA)
__host__ __device__ constexpr int stage_floats(int bm, int bn, int bk, int sb) { return bm * (bk + 4) + bk * sb; }
constexpr int b_stride(const TileShape& t, bool mma) { return mma ? t.bn + 8 : t.bn; }

struct TiledArgs {
    int B, Cin, Cout, L, K;
    int splits, k_steps, stages, policy;
};

template <class Engine, int BM, int BN, int BK, bool AVEC>
__global__ void __launch_bounds__(Engine::kThreads, Engine::kMinBlocks)
conv1d_tiled_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                    float* __restrict__ y, float* __restrict__ ws, unsigned* __restrict__ counters, TiledArgs a) {
    constexpr int NT = Engine::kThreads, SA = BK + 4, SB = Engine::kBStride;
    constexpr int STAGE = stage_floats(BM, BN, BK, SB);  // floats per stage: A [BM][SA], then B [BK][SB]
    constexpr int A_WIDTH = AVEC ? 4 : 1;                 // floats per A copy (16 or 4 bytes)
    constexpr int A_PER_ROW = BK / A_WIDTH, A_COPIES = BM * A_PER_ROW / NT, A_ROW_STEP = NT / A_PER_ROW;
    constexpr int B_ELEMS = BK * BN / NT, K_STRIDE = NT / BN;  // B: rows K_STRIDE apart per thread
    constexpr int P = BM * BN / 4 / NT;                        // float4 outputs per thread in the split sum
    static_assert(NT % BN == 0 && NT % A_PER_ROW == 0 && A_COPIES * A_ROW_STEP == BM && P >= 1, "tile shape");
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);
    __shared__ unsigned s_last;

    const int tid = threadIdx.x;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, split = blockIdx.z;
    const int R = a.Cin * a.K, N = a.B * a.L, pad = a.K / 2;
    const int ks_begin = static_cast<int>(static_cast<long long>(split) * a.k_steps / a.splits);
    const int nks = static_cast<int>(static_cast<long long>(split + 1) * a.k_steps / a.splits) - ks_begin;
    const ca::Policy policy = ca::make_policy(a.policy);

    // A copies of this thread: rows a_row0 + v * A_ROW_STEP (v < A_COPIES), columns a_col .. a_col + A_WIDTH - 1
    // of every k-step (the same rows for the whole CTA: row pointers advance by BK per step)
    const int a_row0 = tid / A_PER_ROW, a_col = (tid % A_PER_ROW) * A_WIDTH;
    const float* a_src = w + static_cast<size_t>(m0 + a_row0) * R + a_col;
    // B copies: column nn of the tile (fixed: its (b, l) once), rows kk0 + i * K_STRIDE; (ci, k) of the next
    // stage's first row kept incrementally (stages are loaded in k-step order), no division per copy
    const int nn = tid % BN, kk0 = tid / BN, n = n0 + nn;
    const bool n_ok = n < N;
    const int nb = n_ok ? n / a.L : 0, nl = n_ok ? n - nb * a.L : 0;
    const float* x_n = x + static_cast<size_t>(nb) * a.Cin * a.L;
    const int step_ci = K_STRIDE / a.K, step_k = K_STRIDE - step_ci * a.K;
    const int stage_ci = BK / a.K, stage_k = BK - stage_ci * a.K;
    int next_ci = (ks_begin * BK + kk0) / a.K, next_k = ks_begin * BK + kk0 - next_ci * a.K;

    auto load_stage = [&](int ks, int slot) {  // called for ks = ks_begin, ks_begin + 1, ... in order
        float* As = smem + slot * STAGE;
        float* Bs = As + BM * SA;
        const int k0 = ks * BK;
        const bool col_ok = k0 + a_col < R;  // AVEC: R % 4 == 0, so a vector is wholly inside the row or past it
#pragma unroll
        for (int v = 0; v < A_COPIES; ++v) {
            const int row = a_row0 + v * A_ROW_STEP;
            const bool ok = col_ok && m0 + row < a.Cout;
            const float* src = ok ? a_src + static_cast<size_t>(v) * A_ROW_STEP * R + k0 : w;
            if constexpr (AVEC) ca::copy16(As + row * SA + a_col, src, ok, policy);
            else ca::copy4(As + row * SA + a_col, src, ok, policy);
        }
        int ci = next_ci, k = next_k;
#pragma unroll
        for (int i = 0; i < B_ELEMS; ++i) {
            const int pos = nl + k - pad;
            const bool ok = n_ok && ci < a.Cin && pos >= 0 && pos < a.L;  // ci < Cin <=> j < R
            ca::copy4(Bs + (kk0 + i * K_STRIDE) * SB + nn, ok ? x_n + static_cast<size_t>(ci) * a.L + pos : x, ok);
            k += step_k;
            ci += step_ci;
            if (k >= a.K) k -= a.K, ++ci;
        }
        next_k += stage_k;
        next_ci += stage_ci;
        if (next_k >= a.K) next_k -= a.K, ++next_ci;
    };

    Engine engine(tid);
    for (int s = 0; s < a.stages - 1; ++s) {
        if (s < nks) load_stage(ks_begin + s, s);
        ca::commit();
    }
    int read_slot = 0, write_slot = a.stages - 1;  // i % stages, (i + stages - 1) % stages
    for (int i = 0; i < nks; ++i) {
        ca::wait_pending(a.stages - 2);  // this thread's copies of step i have landed
        __syncthreads();                 // everyone's have, and everyone is done with step i - 1's slot
        if (i + a.stages - 1 < nks) load_stage(ks_begin + i + a.stages - 1, write_slot);
        ca::commit();
        const float* As = smem + read_slot * STAGE;
        read_slot = read_slot + 1 == a.stages ? 0 : read_slot + 1;
        write_slot = write_slot + 1 == a.stages ? 0 : write_slot + 1;
        engine.step(As, As + BM * SA);
    }

    if (a.splits == 1) {
        engine.for_each([&](int row, int col, float v) {
            const int co = m0 + row, nc = n0 + col;
            if (co >= a.Cout || nc >= N) return;
            const int b = nc / a.L, l = nc - b * a.L;
            y[(static_cast<size_t>(b) * a.Cout + co) * a.L + l] = v + bias[co];
        });
        return;
    }
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    const size_t split_stride = static_cast<size_t>(gridDim.x) * gridDim.y * BM * BN;
    engine.store_partials(ws + split * split_stride + static_cast<size_t>(tile) * BM * BN);
    if (!ca::arrived_last(counters + tile, a.splits, &s_last)) return;
    const float4* tile_ws = reinterpret_cast<const float4*>(ws + static_cast<size_t>(tile) * BM * BN);
    float4 sum[P];
#pragma unroll
    for (int p = 0; p < P; ++p) sum[p] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int sp = 0; sp < a.splits; ++sp) {  // P independent 16-byte loads in flight per thread
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const float4 v = __ldcg(tile_ws + sp * (split_stride / 4) + tid + p * NT);
            sum[p].x += v.x, sum[p].y += v.y, sum[p].z += v.z, sum[p].w += v.w;
        }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int e = 4 * (tid + p * NT), co = m0 + e / BN, col = n0 + e % BN;
        if (co >= a.Cout) continue;
        const float v[4] = {sum[p].x, sum[p].y, sum[p].z, sum[p].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (col + q >= N) break;
            const int b = (col + q) / a.L, l = col + q - b * a.L;
            y[(static_cast<size_t>(b) * a.Cout + co) * a.L + l] = v[q] + bias[co];
        }
    }
}

template <int T, bool MMA>
cudaError_t launch_tile(const float* x, const float* w, const float* b, float* y, float* ws, unsigned* counters,
                        Conv1dShape s, const Conv1dTiledPlan& p, int policy, cudaStream_t stream) {
    constexpr TileShape t = kTiles[T];
    using Engine = std::conditional_t<MMA, conv1d_tiled::MmaTile<t.bm, t.bn, t.bk, threads_of(t, true)>,
                                      conv1d_tiled::SimtTile<t.bm, t.bn, t.bk, t.tm, t.tn>>;
    static_assert(Engine::kBStride == b_stride(t, MMA), "stage layout");
    constexpr auto kVec = conv1d_tiled_kernel<Engine, t.bm, t.bn, t.bk, true>;
    constexpr auto kScalar = conv1d_tiled_kernel<Engine, t.bm, t.bn, t.bk, false>;
    const bool vec = (static_cast<size_t>(s.Cin) * s.K) % 4 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0;
    const cudaError_t err = vec ? ca::allow_dynamic_smem<kVec>(p.smem_bytes)
                                : ca::allow_dynamic_smem<kScalar>(p.smem_bytes);
    if (err != cudaSuccess) return err;
    const TiledArgs args{s.B, s.Cin, s.Cout, s.L, s.K, p.splits, p.k_steps, p.stages, policy};
    const dim3 grid(p.n_tiles, p.m_tiles, p.splits);
    (vec ? kVec : kScalar)<<<grid, Engine::kThreads, p.smem_bytes, stream>>>(x, w, b, y, ws, counters, args);
    return cudaGetLastError();
}

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

}  // namespace

Conv1dTiledPlan conv1d_tiled_plan(Conv1dShape s, const Conv1dTiledConfig& cfg, int num_sms) {
    Conv1dTiledPlan p{};
    if (cfg.tile < -1 || cfg.tile >= kConv1dTiledTiles || (cfg.stages != -1 && (cfg.stages < 2 || cfg.stages > 8)) ||
        cfg.ctas_per_sm < 1 || cfg.ctas_per_sm > 8 || cfg.cache_policy < -1 || cfg.cache_policy > 3 ||
        cfg.mma < -1 || cfg.mma > 1 || num_sms < 1 ||
        s.B < 1 || s.Cin < 1 || s.Cout < 1 || s.L < 1 || s.K < 1)
        return p;
    const long long n = static_cast<long long>(s.B) * s.L, r = static_cast<long long>(s.Cin) * s.K;
    p.mma = cfg.mma != -1 ? cfg.mma : 1;
    const bool big_gemm = static_cast<double>(n) * s.Cout * r >= static_cast<double>(kConv1dTiledBigTileMacs);
    const int index = cfg.tile >= 0 ? cfg.tile : n <= 32 ? 0 : n <= 64 ? 1 : (p.mma == 1 || big_gemm ? 2 : 1);
    const TileShape& t = kTiles[index];
    p.tile = index;
    p.bm = t.bm, p.bn = t.bn, p.bk = t.bk, p.tm = t.tm, p.tn = t.tn, p.threads = threads_of(t, p.mma == 1);
    p.n_tiles = static_cast<int>(ceil_div(n, t.bn));
    p.m_tiles = static_cast<int>(ceil_div(s.Cout, t.bm));
    p.k_steps = static_cast<int>(ceil_div(r, t.bk));
    if (p.m_tiles > 65535 || static_cast<long long>(p.n_tiles) * p.m_tiles > (1LL << 31) - 1)
        return Conv1dTiledPlan{};
    const long long stage_bytes = 4LL * stage_floats(t.bm, t.bn, t.bk, b_stride(t, p.mma == 1));
    const long long budget = cfg.ctas_per_sm == 1 ? ca::kMaxDynamicSmem
                                                  : ca::kSmemPerSm / cfg.ctas_per_sm - ca::kSmemReservedPerCta;
    p.stages = cfg.stages != -1 ? cfg.stages : (index == 0 || p.mma == 1 ? 4 : 3);
    while (p.stages > 2 && p.stages * stage_bytes > budget) --p.stages;
    const long long tiles = static_cast<long long>(p.n_tiles) * p.m_tiles;
    p.splits = static_cast<int>(std::max(1LL, std::min<long long>(std::min(p.k_steps, 65535),
                                                                 num_sms * cfg.ctas_per_sm / tiles)));
    p.smem_bytes = static_cast<size_t>(p.stages * stage_bytes);
    p.workspace_floats = p.splits > 1 ? static_cast<size_t>(p.splits) * tiles * t.bm * t.bn : 0;
    p.counters = p.splits > 1 ? static_cast<int>(tiles) : 0;
    p.cache_policy = cfg.cache_policy != -1 ? cfg.cache_policy : (p.n_tiles == 1 || p.mma == 1 ? 1 : 0);
    p.ok = true;
    return p;
}

cudaError_t conv1d_tiled_f32(const float* x, const float* w, const float* bias, float* y, float* workspace,
                             unsigned* counters, Conv1dShape s, const Conv1dTiledConfig& cfg, int num_sms,
                             cudaStream_t stream) {
    if (s.K % 2 == 0) return cudaErrorInvalidValue;
    const Conv1dTiledPlan p = conv1d_tiled_plan(s, cfg, num_sms);
    if (!p.ok || (p.splits > 1 && (workspace == nullptr || counters == nullptr))) return cudaErrorInvalidValue;
    const int pol = p.cache_policy;
    switch (p.tile * 2 + p.mma) {
        case 0: return launch_tile<0, false>(x, w, bias, y, workspace, counters, s, p, pol, stream);
        case 1: return launch_tile<0, true>(x, w, bias, y, workspace, counters, s, p, pol, stream);
        case 2: return launch_tile<1, false>(x, w, bias, y, workspace, counters, s, p, pol, stream);
        case 3: return launch_tile<1, true>(x, w, bias, y, workspace, counters, s, p, pol, stream);
        case 4: return launch_tile<2, false>(x, w, bias, y, workspace, counters, s, p, pol, stream);
        case 5: return launch_tile<2, true>(x, w, bias, y, workspace, counters, s, p, pol, stream);
        case 6: return launch_tile<3, false>(x, w, bias, y, workspace, counters, s, p, pol, stream);
        default: return launch_tile<3, true>(x, w, bias, y, workspace, counters, s, p, pol, stream);
    }
}
