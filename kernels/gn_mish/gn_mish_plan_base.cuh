// Launch planning of the fused GroupNorm+Mish kernels, part 1: the constants, the division helper the kernels use,
// the device description and the shared-memory arithmetic every tier's planner uses. Pure host logic (no CUDA calls);
// the planner (gn_mish_plan.cuh) is also compiled by the host test (tests/test_gn_mish.py).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gn_mish.cuh"

namespace gn_mish {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;
constexpr int kPortableCluster = 8;
constexpr int kMaxCluster = 16;           // non-portable: used only when the occupancy query says it fits
constexpr int kTier0MaxVecs = 256;        // groups of <= 256 vectors (1024 fp32 / 2048 fp16 elements): tier 0
constexpr int kTier0MaxItems = 8;         // tier 0 vectors per thread are compiled for 1, 2, 4, 8
constexpr int kStageMaxChannels = 2048;   // tier 1 stages gamma/beta of up to this many channels per CTA
constexpr int kStaticSmemBound = 672;     // >= static shared memory of the cluster (656 B), grid and smem-slice kernels
constexpr int kPersistentStaticSmem = 800;  // >= the persistent kernel's (784 B)
constexpr int kRegsPerSm = 65536;
constexpr int kTier1Regs = 64;            // the tier-1 kernels' register cap (__launch_bounds__(1024, 1))
constexpr int kThreadsPerSm = 2048;
// Default plan constants, measured with _tune.py on an H200 (NOTES.md "Default plan"):
constexpr int kTier0CtaThreads = 128;     // tier 0: CTAs of 128 threads (one group of 128, 2 of 64, 4 warps)
constexpr int kFewCtaMaxCluster = 8;      // tier 1, few groups: clusters of <= 8 CTAs (16 x 512/1024 measured slow)
constexpr int kManyCtaThreads = 256;      // tier 1, many groups: 256-thread CTAs in clusters of <= 8 ...
constexpr int kManyStreamThreads = 512;   // ... else streaming through clusters of <= 8 CTAs of 512 threads
constexpr int kGridMaxCtas = 32;          // tier 2: CTAs per group (one warp merges their partials)
constexpr int64_t kGridFewMinVecs = 65536;  // tier 2 by default for few groups from 64K vectors (1 MB) per group
constexpr int kSmemSliceThreads = 256;    // tier 1 with the slice in shared memory: CTAs of <= 256 threads ...
constexpr int kSmemSliceItems = 8;        // ... of <= 8 vectors per thread run 6 CTAs per SM (40 registers), more 3
constexpr int kSpreadMaxGroups = 32;      // tier 3: groups per launch (an mbarrier pair and a slot row each)
constexpr int kSpreadMaxCtas = 256;       // tier 3: CTAs (warp 0 polls <= 8 slots per lane)
constexpr int kSpreadMaxReducers = 16;    // tier 3: group warps (reduce, publish, collect)
constexpr int kSpreadReducers = 8;        // tier 3 default: up to 8 group warps (B = 1: one per group), the rest store
constexpr int kSpreadDepth = 4;           // tier 3 default: 4 groups requested ahead per CTA
constexpr int kSpreadStaticSmem = 1024;   // >= the tier-3 kernel's static shared memory (768 B)
constexpr int kSpreadPieceAlign = 8;      // tier 3 pieces: multiples of 8 vectors (128 bytes)
constexpr int kSpreadCounterStride = 32;  // tier 3: a group's count alone in a 128-byte line (words)
constexpr int kSpreadStageBytes = 16384;  // tier 3 stages gamma/beta in shared memory up to this many bytes

// Tier 0 CTA size cap for a number of vectors per thread: 4 and 8 need more than the 64 registers that a
// 1024-thread CTA leaves per thread.
__host__ __device__ constexpr int tier0_max_cta(int items) { return items >= 4 ? 256 : kMaxThreads; }

// Tier 1 vectors per thread per chunk: 8 (128 bytes: 32 fp32 or 64 fp16/bf16 elements, kept packed in 32
// registers) or 4 (8 on the scalar path). Until the 16-bit packs held pairs per 32-bit word, fp16/bf16 used 4
// vectors (32 elements, half the bytes of fp32 per thread): an H200 tune put bf16 b64_c512_l1024 at 43 % of
// copy bandwidth with those, 53 % with CTAs of twice the elements per thread.
__host__ __device__ constexpr int tier1_items_full(int /*vec*/) { return 8; }
__host__ __device__ constexpr int tier1_items_half(int vec) { return vec == 1 ? 8 : 4; }

// n / d for 0 <= n, d < 2^31 as a multiply-high, add and shift (d fixed per launch, computed on the host):
// the index math (channel of an element, group within a sample) without integer division on the GPU.
struct FastDiv {
  uint32_t d = 1, mul = 1, shift = 0;
  FastDiv() = default;
  __host__ __device__ explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint32_t(1) << shift) < d) ++shift;
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * mul) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

struct DeviceInfo {
  int sms = 0;
  int major = 0;
  int smem_per_sm = 0;    // bytes of shared memory per SM
  int smem_reserved = 0;  // bytes the system reserves per CTA
  int smem_optin = 0;     // largest shared memory per CTA after opting in
  int l2_bytes = 0;       // L2 cache size
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v && p < (1 << 30)) p <<= 1;
  return p;
}

// The largest power of two <= v (1 for v < 2).
inline int pow2_floor(int64_t v) {
  int p = 1;
  while (int64_t(p) * 2 <= v && p < (1 << 30)) p <<= 1;
  return p;
}

inline bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

inline bool limits_ok(const Limits& l) {
  return l.max_threads >= kWarp && l.max_cluster >= 1 &&
         (l.t0_threads == 0 || (is_pow2(l.t0_threads) && l.t0_threads >= kWarp && l.t0_threads <= kMaxThreads)) &&
         l.t0_groups_per_cta >= 0 && l.t0_groups_per_cta <= kMaxThreads / kWarp &&
         (l.t0_threads == 0 || l.t0_threads * l.t0_groups_per_cta <= kMaxThreads) &&
         (l.t1_threads == 0 || (l.t1_threads % kWarp == 0 && l.t1_threads >= kWarp && l.t1_threads <= kMaxThreads)) &&
         l.t1_items >= 0 && l.t1_ctas_per_sm >= 0 && l.t1_ctas_per_sm <= 32 &&
         (l.t1_persistent == 0 || l.t1_persistent == 1) && l.t1_stash >= -1 && l.t2 >= -1 && l.t2 <= 1 &&
         l.t2_ctas >= 0 && l.t2_ctas <= kGridMaxCtas && l.t1_smem >= -1 && l.t1_smem <= 2 && l.t3 >= -1 &&
         l.t3 <= 1 && l.t3_ctas >= 0 && l.t3_ctas <= kSpreadMaxCtas && l.t3_reducers >= 0 &&
         l.t3_reducers <= kSpreadMaxReducers && l.t3_depth >= 0;
}

// Channels of gamma/beta a CTA slice of `slice_vecs` vectors touches (E elements meet <= (E - 1) / L + 2).
inline int64_t slice_channels(const Problem& p, int64_t slice_vecs, int vec) {
  return std::min(p.channels / p.groups, (slice_vecs * vec - 1) / p.length + 2);
}

// Dynamic shared memory: the staged affine, or more when t1_ctas_per_sm caps the CTAs per SM (static_bound: the
// kernel's static shared memory bound, which each CTA also takes).
inline int tier1_smem(const Limits& lim, const DeviceInfo& dev, int staged_bytes, int static_bound = kStaticSmemBound) {
  if (lim.t1_ctas_per_sm > 0 && dev.smem_per_sm > 0) {  // pad so that a further CTA does not fit on the SM
    const int pad = std::min(dev.smem_per_sm / lim.t1_ctas_per_sm - dev.smem_reserved, dev.smem_optin) -
                    static_bound;
    return std::max(staged_bytes, pad);
  }
  return staged_bytes;
}

// The stash starts after the staged gamma/beta, 16-byte aligned.
__host__ __device__ inline int stash_offset(int stage) { return (stage * 2 * int(sizeof(float)) + 15) / 16 * 16; }

// CTAs of `threads` threads per SM that registers and threads allow (or t1_ctas_per_sm).
inline int ctas_per_sm(const Limits& lim, int threads) {
  return lim.t1_ctas_per_sm > 0 ? lim.t1_ctas_per_sm
                                : std::max(1, std::min(kRegsPerSm / (threads * kTier1Regs), kThreadsPerSm / threads));
}

// Stash slots (16-byte vectors per thread) that fit after `stage` staged channels at ctas CTAs per SM.
inline int stash_capacity(const DeviceInfo& dev, int threads, int ctas, int stage) {
  if (dev.smem_per_sm == 0) return 0;
  const int budget = std::min(dev.smem_per_sm / ctas - dev.smem_reserved, dev.smem_optin) - kStaticSmemBound -
                     stash_offset(stage);
  return std::max(0, budget / (threads * 16));
}

}  // namespace gn_mish
