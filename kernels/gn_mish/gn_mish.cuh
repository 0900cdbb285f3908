// Host interface of the fused GroupNorm+Mish kernels (gn_mish.cu); no torch headers, so the .cu compiles alone.
//   y = mish((x - mean_g) * rsqrt(var_g + eps) * gamma[c] + beta[c]),  x, y: (B, C, L) contiguous,
//   gamma, beta: (C,); group g of sample b = the contiguous span of n = C/G * L elements at (b*G + g) * n.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace gn_mish {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct Problem {
  int64_t batch = 0, channels = 0, length = 0;
  int groups = 0;
  float eps = 1e-5f;
  DType dtype = DType::kFloat32;
};

// Plan knobs. 0 means "the planner decides"; the defaults are the variant's behaviour. Tests lower
// max_threads / max_cluster to force the cluster and streaming paths on small shapes; _tune.py sweeps the rest.
struct Limits {
  int max_threads = 1024;     // tier 1 CTA size cap (a multiple of 32, >= 32)
  int max_cluster = 16;       // tier 1 CTAs per group cap (clusters need sm_90; rounded down to a power of two)
  int t0_threads = 0;         // tier 0 threads per group: 32 (a warp per group) ... 1024, a power of two;
                              // 0: the measured default (1 vector per thread, 2 with more groups than SMs)
  int t0_groups_per_cta = 0;  // tier 0 groups per CTA (t0_threads * this <= 1024); 0: 128-thread CTAs
  int t1_threads = 0;         // tier 1 CTA size (a multiple of 32, capped by max_threads); 0: the measured
                              // default rule of gn_mish_plan.cuh (by group size and groups vs SMs)
  int t1_items = 0;           // tier 1 vectors per thread per chunk (rounded to 8 or 4); 0: 8 (128 bytes), but 4 on
                              // tier 2 for 16-bit vectors in 1024-thread CTAs
  int t1_ctas_per_sm = 0;     // tier 1: at most this many CTAs per SM (dynamic shared memory padding)
  int t1_persistent = 0;      // tier 1: 1 = persistent clusters that load the next group while reducing and
                              // storing the current one (when the group fits in half the registers)
  int t1_stash = 0;           // tier 1 streaming: at most this many 16-byte vectors per thread kept in shared
                              // memory instead of re-read (as many as fit without losing residency); 0: the
                              // measured rule (only where re-reads outgrow half the L2); -1: none (also tier 2's cap)
  int t2 = 0;                 // tier 2 (S CTAs per group meeting through global memory, resident grid): 1 = use it
                              // wherever it can be resident, -1 = never, 0 = the measured rule
  int t2_ctas = 0;            // tier 2 CTAs per group, 1..32; 0: the rule (few groups: spread over the SMs; else
                              // the fewest whose CTAs in flight re-read at most half the L2)
  int t1_smem = 0;            // tier 1 one-chunk plans of <= 256-thread CTAs: the slice in shared memory, not
                              // registers (gn_mish_smem.cuh): 1 = same CTAs, 2 = half the CTAs per group with twice
                              // the vectors each; -1 = never; 0 = the measured rule
  int t3 = 0;                 // tier 3 (every group spread over the whole resident grid, x on chip, the groups
                              // pipelined: gn_mish_spread.cuh): 1 = wherever it fits, -1 = never, 0 = the rule
  int t3_ctas = 0;            // tier 3 CTAs (<= one per SM); 0: the largest power of two <= SMs
  int t3_reducers = 0;        // tier 3 group warps (reduce, publish, collect; the rest store), 1..16; 0: the default
  int t3_depth = 0;           // tier 3 groups requested ahead per CTA (g + depth once g has landed); 0: 4
};

// How one call maps onto the GPU.
struct Plan {
  int tier = 0;            // 0: one CTA slice per group (whole group in registers); 1: a cluster of CTAs per group;
                           // 2: `cluster` CTAs per group (no hardware cluster) meeting through global memory;
                           // 3: every CTA (grid, <= one per SM) holds a piece of slice_vecs vectors of every group
  int vec = 1;             // elements per load: 16 bytes / element size, or 1 (unaligned or n % vec != 0)
  int threads = 0;         // CTA size
  int group_threads = 0;   // tier 0: threads per group (a power of two >= 32)
  int groups_per_cta = 1;  // tier 0: groups per CTA
  int cluster = 1;         // tiers 1, 2: CTAs per group; tier 1 with > 1 launches a thread-block cluster
  int items = 0;           // vectors per thread held in registers (per chunk on tier 1)
  int64_t grid = 0;        // CTAs launched
  int64_t slice_vecs = 0;  // tier 1: vectors of a group handled by one CTA
  int chunks = 1;          // tier 1: register chunks per slice: 1 = x read once; > 1 = streaming (L2 re-reads)
  int persistent = 0;      // tier 1: 1 = grid of resident clusters looping over groups, double-buffered;
                           // tier 2: 1 = fewer groups in flight (grid / cluster) than groups, each CTA loops
  int stage = 0;           // tier 1: channels of gamma/beta staged per CTA in shared memory (0: read from L1/L2)
  int smem_bytes = 0;      // tier 1: dynamic shared memory per CTA (staging + stash, or padding for t1_ctas_per_sm)
  int stash = 0;           // tiers 1, 2: vectors per thread (the oldest chunks' first) kept in shared memory
  int64_t counter_bytes = 0;  // tier 2: the groups' arrival/departure counters (Workspace::counters)
  int64_t partial_bytes = 0;  // tier 2: the CTAs' partial statistics (Workspace::partials)
  int smem_slice = 0;      // tier 1: 1 = the slice is copied to shared memory (smem_bytes), not held in registers
  int reducers = 0;        // tier 3: group warps (reduce, publish, collect; the others store)
  int depth = 0;           // tier 3: groups requested ahead per CTA
};

// Tiers 2 and 3's global memory. counters: plan.counter_bytes, zero before the first launch (every launch leaves
// them at zero), only ever used for counters and tier 3's marked slots (a buffer that held anything else is not zero
// where a later plan counts) and by one stream at a time; partials: plan.partial_bytes (tier 2), 16-byte aligned, no
// initial value needed.
struct Workspace {
  void* counters = nullptr;
  void* partials = nullptr;
};

// Largest group (C/G * L elements) the kernels index with 32-bit integers.
constexpr int64_t kMaxGroupElements = int64_t(1) << 30;

// Whether the knobs are in range (cudaErrorInvalidValue otherwise).
cudaError_t check_limits(const Limits& limits);

// Plan for the current device; x and y decide whether 16-byte vector access is aligned.
cudaError_t make_plan(const Problem& p, const void* x, const void* y, const Limits& limits, Plan* plan);

// CTAs of `plan` that can be resident at once on the current device (occupancy query; for notes and tuning).
cudaError_t resident_ctas(const Problem& p, const Plan& plan, int* ctas);

// Launch `plan` (from make_plan) on `stream`; returns the launch error (cudaSuccess when queued). `ws`: tiers 2, 3.
cudaError_t launch(const Problem& p, const Plan& plan, const void* x, const void* gamma, const void* beta, void* y,
                   const Workspace& ws, cudaStream_t stream);

}  // namespace gn_mish
