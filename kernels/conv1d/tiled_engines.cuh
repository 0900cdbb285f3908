// tiled_engines.cuh: the two math engines of tiled.cu. Each accumulates a BM x BN tile of Y from one k-step's
// shared-memory stage (A: BM x BK of W, row stride SA = BK + 4 floats; B: BK x BN of X^, row stride kBStride),
// then hands its accumulators to the epilogue (element by element, or as a tile-contiguous BM x BN partial).
//
// SimtTile (fp32 FMAs, the first engine): thread (im, in) of the MG x NG grid (MG = BM/TM, NG = BN/TN) owns rows
//   im + r*MG (r < TM) and columns in*4 + c*4*NG + q (c < TN/4, q < 4): interleaved, so that a warp's LDS.128 of
//   A reads 4 (or 2) rows SA floats apart (distinct banks) and its LDS.128 of B reads 128 contiguous bytes.
//   Per 4 k: TM LDS.128 of A and 4 x TN/4 LDS.128 of B for 4*TM*TN FMAs.
// MmaTile (3xTF32 tensor cores, mma.sync m16n8k8; what SimtTile lacked: the fp32 pipes cap it at ~37% of what
//   cuDNN's TF32 tensor cores reach at batch 64): warps in a (BM/32) x (NT/BM) grid, each a 32 x (BN*BM/NT) tile
//   of 16 x 8 mma tiles (2 x 4 at the 128 x 64 tile of 256 threads: 8 warps, and 2 CTAs per SM when the
//   accumulators leave room under 128 registers; ncu of 4 warps of 64 x 32 found 1.85 warps per scheduler, 0.56
//   eligible: latency, not issue or the tensor pipe (32 %), was the limit). Every operand v is split into big = v with its low 13 bits cleared (a TF32 value) and
//   small = v - big (exact; the tensor core reads its top 10 mantissa bits), and a*b is taken as
//   a_s*b_b + a_b*b_s + a_b*b_b (a_s*b_s is below fp32 rounding): ~2^-20 relative per product against TF32's
//   2^-11, inside the fp32 parity bound that plain TF32 fails. The tensor core adds with truncation, which biases
//   a long sum (measured: -1e-4 relative after 160 k-steps in one accumulator, 2.5x the fp32 bound), so each
//   k-step's 12 mma go to a fresh fragment that is then added to the fp32 accumulator (round to nearest).
//   Lane (g = lane/4, t = lane%4) reads A at rows g, g+8 and columns t, t+4 (banks 4g + t: SA = 36 puts the 8
//   rows 4 banks apart) and B at rows t, t+4 and column g (banks 8t + g: kBStride = BN + 8); its accumulators
//   sit at rows g, g+8 and columns 2t, 2t+1 of each mma tile.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace conv1d_tiled {

template <int BM, int BN, int BK, int TM, int TN>
struct SimtTile {
    static constexpr int MG = BM / TM, NG = BN / TN, kThreads = MG * NG, SA = BK + 4, kBStride = BN;
    static constexpr int kMinBlocks = 1;
    static_assert(BK % 4 == 0 && TN % 4 == 0, "SimtTile shape");
    float acc[TM][TN];
    int im, in;

    __device__ explicit SimtTile(int tid) : acc{}, im(tid / NG), in(tid % NG) {}

    __device__ void step(const float* As, const float* Bs) {
#pragma unroll
        for (int k4 = 0; k4 < BK; k4 += 4) {
            float4 av[TM];
#pragma unroll
            for (int r = 0; r < TM; ++r) av[r] = *reinterpret_cast<const float4*>(As + (im + r * MG) * SA + k4);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float bv[TN];
#pragma unroll
                for (int c = 0; c < TN / 4; ++c) {
                    const float4 t = *reinterpret_cast<const float4*>(Bs + (k4 + q) * BN + in * 4 + c * NG * 4);
                    bv[4 * c] = t.x, bv[4 * c + 1] = t.y, bv[4 * c + 2] = t.z, bv[4 * c + 3] = t.w;
                }
#pragma unroll
                for (int r = 0; r < TM; ++r) {
                    const float ar = q == 0 ? av[r].x : (q == 1 ? av[r].y : (q == 2 ? av[r].z : av[r].w));
#pragma unroll
                    for (int c = 0; c < TN; ++c) acc[r][c] += ar * bv[c];
                }
            }
        }
    }

    // f(row, col, value) for every accumulator (tile coordinates)
    template <class F>
    __device__ void for_each(F f) const {
#pragma unroll
        for (int c = 0; c < TN; ++c)
#pragma unroll
            for (int r = 0; r < TM; ++r) f(im + r * MG, in * 4 + (c / 4) * NG * 4 + c % 4, acc[r][c]);
    }

    __device__ void store_partials(float* part) const {  // part: BM x BN, row-major
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
            for (int c = 0; c < TN / 4; ++c)
                *reinterpret_cast<float4*>(part + (im + r * MG) * BN + in * 4 + c * NG * 4) =
                    make_float4(acc[r][4 * c], acc[r][4 * c + 1], acc[r][4 * c + 2], acc[r][4 * c + 3]);
    }
};

// v = big + small exactly: big = v truncated to TF32, |small| < 2^-10 |v| (2 instructions; the tensor core
// truncates small's mantissa to 10 bits itself).
__device__ __forceinline__ void split_tf32(float v, uint32_t& big, uint32_t& small) {
    big = __float_as_uint(v) & 0xffffe000u;
    small = __float_as_uint(v - __uint_as_float(big));
}

// d += a (16 x 8, row-major fragment) * b (8 x 8, column-major fragment), TF32 inputs, fp32 accumulation.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int BM, int BN, int BK, int NT>
struct MmaTile {
    static constexpr int kThreads = NT, WM = 32, kWarpsN = NT / 32 / (BM / WM), WN = BN / kWarpsN;
    static constexpr int MT = WM / 16, NT8 = WN / 8, SA = BK + 4, kBStride = BN + 8;
    static constexpr int kMinBlocks = MT * NT8 * 8 <= 64 ? 2 : 1;  // accumulators + k-step sums, registers
    static_assert(BM % WM == 0 && NT % (32 * (BM / WM)) == 0 && WN % 8 == 0 && BK % 8 == 0, "MmaTile shape");
    float acc[MT][NT8][4];
    int m0, n0, g, t;  // the warp's origin in the tile; the lane's group and rank in it

    __device__ explicit MmaTile(int tid)
        : acc{}, m0((tid / 32 / kWarpsN) * WM), n0((tid / 32 % kWarpsN) * WN), g(tid % 32 / 4), t(tid % 4) {}

    __device__ void step(const float* As, const float* Bs) {
        float d[MT][NT8][4] = {};  // this k-step's sums (see the header: the tensor core's truncating adds)
#pragma unroll
        for (int k8 = 0; k8 < BK; k8 += 8) {
            uint32_t a_big[MT][4], a_small[MT][4], b_big[NT8][2], b_small[NT8][2];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const float* a = As + (m0 + i * 16 + g) * SA + k8 + t;
#pragma unroll
                for (int e = 0; e < 4; ++e)  // e: +8 rows when odd, +4 columns from 2 on
                    split_tf32(a[(e & 1) * 8 * SA + (e >> 1) * 4], a_big[i][e], a_small[i][e]);
            }
#pragma unroll
            for (int j = 0; j < NT8; ++j) {
                const float* b = Bs + (k8 + t) * kBStride + n0 + j * 8 + g;
                split_tf32(b[0], b_big[j][0], b_small[j][0]);
                split_tf32(b[4 * kBStride], b_big[j][1], b_small[j][1]);
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT8; ++j) {  // the two correction terms, then the main one
                    mma_tf32(d[i][j], a_small[i], b_big[j]);
                    mma_tf32(d[i][j], a_big[i], b_small[j]);
                    mma_tf32(d[i][j], a_big[i], b_big[j]);
                }
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] += d[i][j][e];
    }

    template <class F>
    __device__ void for_each(F f) const {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    f(m0 + i * 16 + g + (e >> 1) * 8, n0 + j * 8 + 2 * t + (e & 1), acc[i][j][e]);
    }

    __device__ void store_partials(float* part) const {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<float2*>(part + (m0 + i * 16 + g + h * 8) * BN + n0 + j * 8 + 2 * t) =
                        make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
    }
};

}  // namespace conv1d_tiled
