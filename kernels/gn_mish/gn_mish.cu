// Fused GroupNorm + Mish: y = mish((x - mean_g) * rsqrt(var_g + eps) * gamma[c] + beta[c]), biased variance.
// x, y: (B, C, L) contiguous fp32 / fp16 / bf16; gamma, beta: (C,) same dtype; all math in fp32.
// mish(z) = z * tanh(softplus(z)) = z * m / (m + 2), m = e^z (e^z + 2); z > 20 -> z (PyTorch's softplus cut-off).
//
// Differs from the seed's gnm.cu (batch 1, 8 groups, one thread per element, smem tree sums): any B, C, G, L;
// 16-byte vector loads when x, y are aligned and n % vec == 0 (scalar path otherwise); numerically stable
// two-pass statistics in fp32.
//
// Tier 0 (gn_mish_tier0.cuh), groups of <= 256 vectors (every Push-T GroupNorm): the whole group in the
//   registers of a warp ... a CTA, shuffles plus at most two shared-memory steps; one short kernel whose time is
//   one L2/DRAM round trip plus two small reductions.
// Tier 1 (gn_mish_tier1.cuh), larger groups: a thread-block cluster of K CTAs (K <= 16, sm_90) per group, the
//   group in the cluster's registers, partial statistics pushed into every peer's shared memory (st.async), so x
//   is read from DRAM once; beyond the cluster's register capacity it streams (re-reads from L2, or from shared
//   memory where a stash holds the oldest chunks). Without sm_90, K = 1 (streaming). One-chunk plans of many
//   groups copy the slice to shared memory instead (gn_mish_smem.cuh: 40 registers, more CTAs per SM). Optionally
//   persistent (gn_mish_persistent.cuh): resident clusters loop over groups and load the next group while reducing
//   and storing the current one.
// Tier 2 (gn_mish_grid.cuh): up to 32 CTAs per group, no cluster, partial statistics through global memory; the
//   grid is resident (cooperative launch) and loops over groups; slices live in registers plus a shared-memory stash.
// Tier 3 (gn_mish_spread.cuh): few groups whose x fits in the chip's shared memory: every CTA of a resident grid
//   (at most one per SM) holds a piece of every group, loaded by bulk copies, and the groups are pipelined through
//   the chip (reduce, exchange through global memory, store), so the stores of one group overlap the loads of the
//   next.
//
// This file: device queries, the plan (gn_mish_plan.cuh) and the launch. Knobs (Limits) select the tier-0 CTA
// shape, the tier-1 CTA size, items per thread, cluster cap, residency, persistence, stash and shared-memory slice,
// and tier 2 and its CTAs per group; 0 = the default. The launch then picks the plan's kernel instantiation from
// the shape, not a knob: whole-vector normalise where L % VEC == 0 (tier 1; 16-bit tier 2 with a stash), L2
// evict_first for fp32 tier 2 with a stash over several rounds.
#include "gn_mish.cuh"

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "gn_mish_grid.cuh"
#include "gn_mish_persistent.cuh"
#include "gn_mish_plan.cuh"
#include "gn_mish_smem.cuh"
#include "gn_mish_spread.cuh"
#include "gn_mish_tier0.cuh"
#include "gn_mish_tier1.cuh"

namespace gn_mish {
namespace {

using namespace detail;  // NOLINT: the kernels and their argument structs

cudaError_t device_info(DeviceInfo* info) {
  static DeviceInfo cache[64];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
  if (cache[dev].sms == 0) {
    DeviceInfo d;
    const struct {
      int* out;
      cudaDeviceAttr attr;
    } queries[] = {{&d.sms, cudaDevAttrMultiProcessorCount},
                   {&d.major, cudaDevAttrComputeCapabilityMajor},
                   {&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
                   {&d.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock},
                   {&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin},
                   {&d.l2_bytes, cudaDevAttrL2CacheSize}};
    for (const auto& q : queries) {
      if ((err = cudaDeviceGetAttribute(q.out, q.attr, dev)) != cudaSuccess) return err;
    }
    cache[dev] = d;
  }
  *info = cache[dev];
  return cudaSuccess;
}

cudaLaunchConfig_t launch_config(const Plan& plan, cudaLaunchAttribute* attr, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(plan.grid));
  cfg.blockDim = dim3(unsigned(plan.threads));
  cfg.dynamicSmemBytes = plan.tier > 0 ? size_t(plan.smem_bytes) : 0;
  cfg.stream = stream;
  if (plan.tier >= 2) {  // every CTA of a group must be resident while it waits for the others
    attr->id = cudaLaunchAttributeCooperative;
    attr->val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  } else if (plan.tier == 1 && plan.cluster > 1) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = unsigned(plan.cluster);
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cfg;
}

int log2_exact(int v) {
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

// Answers of slow driver queries (attributes, occupancy), computed once per key; thread-safe.
int memo(const void* kernel, int a, int b, int c, int (*compute)(const void*, int, int, int)) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, int>, int> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, a, b, c);
  auto it = known.find(key);
  if (it == known.end()) it = known.emplace(key, compute(kernel, a, b, c)).first;
  return it->second;
}

// Allow 16-CTA clusters and dynamic shared memory up to the opt-in maximum less the kernel's own static shared
// memory (the planner sizes within the bound of each kernel, kStaticSmemBound and the like, which a CPU test holds
// above ptxas' count; asking for more than optin - static is refused, which left the persistent kernel, 784 B
// against kStaticSmemBound's 672, at the 48 KB default). 1 when non-portable clusters are allowed.
int prepare_kernel(const void* kernel, int, int, int) {
  DeviceInfo dev;
  cudaFuncAttributes attr;
  if (device_info(&dev) == cudaSuccess && dev.smem_optin > 48 * 1024 &&
      cudaFuncGetAttributes(&attr, kernel) == cudaSuccess) {
    (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               dev.smem_optin - int(attr.sharedSizeBytes));
  }
  const bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  (void)cudaGetLastError();  // a refusal must not look like a failed launch later
  return ok ? 1 : 0;
}

bool prepare_launch(const void* kernel) { return memo(kernel, 0, 0, -1, prepare_kernel) == 1; }

template <typename T, int VEC>
const void* spread_kernel(bool whole) {
  if constexpr (VEC > 1) {
    const void* k = whole ? reinterpret_cast<const void*>(gn_mish_spread_kernel<T, VEC, true>)
                          : reinterpret_cast<const void*>(gn_mish_spread_kernel<T, VEC, false>);
    prepare_launch(k);
    return k;
  }
  return nullptr;
}

// CTAs of `kernel` that can be resident at once with `threads` threads, clusters of k and smem bytes of dynamic
// shared memory (whole clusters only).
int resident(const void* kernel, int threads, int k, int smem) {
  DeviceInfo dev;
  if (device_info(&dev) != cudaSuccess) return 0;
  int count = 0;
  if (k == 1) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, kernel, threads, size_t(smem)) != cudaSuccess) count = 0;
    count *= dev.sms;
  } else {
    Plan probe;
    probe.tier = 1;
    probe.threads = threads;
    probe.cluster = k;
    probe.grid = k;
    probe.smem_bytes = smem;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = launch_config(probe, &attr, nullptr);
    if (cudaOccupancyMaxActiveClusters(&count, kernel, &cfg) != cudaSuccess) count = 0;
    count *= k;
  }
  (void)cudaGetLastError();
  return count;
}

int resident_memo(const void* kernel, int threads, int k, int smem) {
  prepare_launch(kernel);
  return memo(kernel, threads, k, smem, resident);
}

// The cluster kernel with full or half register chunks.
template <typename T, int VEC, bool kStash, bool kWhole>
const void* cluster_kernel(int items) {
  constexpr int kFull = tier1_items_full(VEC), kHalf = tier1_items_half(VEC);
  return items == kFull ? reinterpret_cast<const void*>(gn_mish_cluster_kernel<T, VEC, kFull, kStash, kWhole>)
                        : reinterpret_cast<const void*>(gn_mish_cluster_kernel<T, VEC, kHalf, kStash, kWhole>);
}

// The tier-1 kernel of a plan: the cluster kernel with full or half register chunks, with a stash or without
// (the stash needs 16-byte vectors), with whole-vector normalise or not (whole: L % VEC == 0; 16-byte vectors), or
// the persistent one.
template <typename T, int VEC>
const void* tier1_kernel(bool persistent, int items, bool stash, bool whole = false) {
  if (persistent) return reinterpret_cast<const void*>(gn_mish_persistent_kernel<T, VEC, tier1_items_half(VEC)>);
  if constexpr (VEC > 1) {
    if (stash) return whole ? cluster_kernel<T, VEC, true, true>(items) : cluster_kernel<T, VEC, true, false>(items);
    if (whole) return cluster_kernel<T, VEC, false, true>(items);
  }
  return cluster_kernel<T, VEC, false, false>(items);
}

// The shared-memory-slice kernel of a plan (16-byte vectors only): 6 CTAs per SM up to 8 vectors per thread, else 3.
template <typename T, int VEC>
const void* smem_kernel(int items) {
  if constexpr (VEC > 1) {
    return items <= kSmemSliceItems ? reinterpret_cast<const void*>(gn_mish_smem_kernel<T, VEC, 6>)
                                    : reinterpret_cast<const void*>(gn_mish_smem_kernel<T, VEC, 3>);
  }
  return nullptr;
}

// The tier-1 kernel of any tier-1 plan (whole: L % VEC == 0, no vector straddles a channel).
template <typename T, int VEC>
const void* tier1_plan_kernel(const Plan& plan, bool whole = false) {
  return plan.smem_slice ? smem_kernel<T, VEC>(plan.items) : tier1_kernel<T, VEC>(plan.persistent, plan.items,
                                                                                 plan.stash > 0, whole);
}

// A tier-2 kernel with full or half register chunks.
template <typename T, int VEC, bool kStash, bool kEvict, bool kWhole>
const void* grid_items_kernel(int items) {
  constexpr int kFull = tier1_items_full(VEC), kHalf = tier1_items_half(VEC);
  return items == kFull ? reinterpret_cast<const void*>(gn_mish_grid_kernel<T, VEC, kFull, kStash, kEvict, kWhole>)
                        : reinterpret_cast<const void*>(gn_mish_grid_kernel<T, VEC, kHalf, kStash, kEvict, kWhole>);
}

// The tier-2 kernel: full or half chunks, with a stash or without; with a stash (16-byte vectors) also, for fp32,
// with L2 evict_first on what pass 2 does not re-read (evict) and, for 16-bit in half chunks (the 1024-thread
// default; with full chunks that kernel would spill), with whole-vector normalise (whole: L % VEC == 0).
template <typename T, int VEC>
const void* grid_kernel(int items, bool stash, bool evict = false, bool whole = false) {
  if constexpr (VEC > 1 && sizeof(T) == 4) {
    if (stash && evict) return grid_items_kernel<T, VEC, true, true, false>(items);
  } else if constexpr (VEC > 1) {
    constexpr int kHalf = tier1_items_half(VEC);
    if (stash && whole && items == kHalf) {
      return reinterpret_cast<const void*>(gn_mish_grid_kernel<T, VEC, kHalf, true, false, true>);
    }
  }
  return stash ? grid_items_kernel<T, VEC, true, false, false>(items)
               : grid_items_kernel<T, VEC, false, false, false>(items);
}

// The tier-2 kernel of a tier-2 plan (whole: L % VEC == 0): with a stash, fp32 slots that loop over more groups use
// the L2 hints and 16-bit normalises whole vectors, where that kernel is as resident as the plan assumed (the planner
// sized the grid with the plain stash kernel).
template <typename T, int VEC>
const void* grid_plan_kernel(const Plan& plan, bool whole) {
  const void* plain = grid_kernel<T, VEC>(plan.items, plan.stash > 0);
  if (plan.stash == 0) return plain;
  const void* tuned = grid_kernel<T, VEC>(plan.items, true, plan.persistent, whole);
  return tuned == plain || resident_memo(tuned, plan.threads, 1, plan.smem_bytes) >= plan.grid ? tuned : plain;
}

template <typename T, int VEC>
const void* tier0_kernel(int items) {
  switch (items) {
    case 1:
      return reinterpret_cast<const void*>(gn_mish_group_kernel<T, VEC, 1>);
    case 2:
      return reinterpret_cast<const void*>(gn_mish_group_kernel<T, VEC, 2>);
    case 4:
      return reinterpret_cast<const void*>(gn_mish_group_kernel<T, VEC, 4>);
    default:
      return reinterpret_cast<const void*>(gn_mish_group_kernel<T, VEC, kTier0MaxItems>);
  }
}

template <typename T, int VEC>
struct PlanOp {
  static cudaError_t run(const Problem& p, const Limits& limits, Plan* plan) {
    DeviceInfo dev;
    const cudaError_t err = device_info(&dev);
    if (err != cudaSuccess) return err;
    const int full = tier1_items_full(VEC);
    const void* cluster_kernel = tier1_kernel<T, VEC>(false, limits.t1_items > 0 && limits.t1_items < full
                                                                 ? tier1_items_half(VEC) : full, false);
    const void* persistent_kernel = tier1_kernel<T, VEC>(true, 0, false);
    auto fits16 = [cluster_kernel](int threads) {
      return prepare_launch(cluster_kernel) && resident_memo(cluster_kernel, threads, kMaxCluster, 0) > 0;
    };
    auto clusters = [persistent_kernel](int threads, int k, int smem) {
      return resident_memo(persistent_kernel, threads, k, smem) / k;
    };
    // occupancy of the stash instantiation (no more registers than the plain one; the plan's smem decides)
    const void* grid = grid_kernel<T, VEC>(limits.t1_items > 0 && limits.t1_items < full ? tier1_items_half(VEC) : full,
                                           VEC > 1);
    auto grid_resident = [grid, &dev](int threads, int smem) {
      return resident_memo(grid, threads, 1, smem) / std::max(1, dev.sms);
    };
    const bool whole = p.length % VEC == 0;
    auto t1_resident = [whole](const Plan& pl) {
      return resident_memo(tier1_plan_kernel<T, VEC>(pl, whole), pl.threads, pl.cluster, pl.smem_bytes);
    };
    *plan = choose_plan(p, limits, dev, VEC, fits16, clusters, grid_resident, t1_resident);
    return cudaSuccess;
  }
};

template <typename T, int VEC>
struct LaunchOp {
  static cudaError_t run(const Problem& p, const Plan& plan, const void* x, const void* gamma, const void* beta,
                         void* y, const Workspace& ws, cudaStream_t stream) {
    const int cgc = int(p.channels / p.groups);
    const int n = cgc * int(p.length);
    const int groups = int(p.batch * p.groups);
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = launch_config(plan, &attr, stream);
    void* args[5] = {&x, &gamma, &beta, &y, nullptr};  // kernels take (const T*, const T*, const T*, T*, Args)
    if (plan.tier == 0) {
      Tier0Args a = {groups, FastDiv(uint32_t(p.groups)), cgc, FastDiv(uint32_t(p.length)), n, n / VEC,
                     log2_exact(plan.group_threads), float(1.0 / n), p.eps};
      args[4] = &a;
      return cudaLaunchKernelExC(&cfg, tier0_kernel<T, VEC>(plan.items), args);
    }
    const Tier1Args shape = {groups, FastDiv(uint32_t(p.groups)), cgc, FastDiv(uint32_t(p.length)), n, n / VEC,
                             int(plan.slice_vecs), log2_exact(plan.cluster), plan.stage, float(1.0 / n), p.eps,
                             plan.stash};
    if (plan.tier == 3) {
      const void* kernel = spread_kernel<T, VEC>(p.length % VEC == 0);
      if (kernel == nullptr || ws.counters == nullptr || reinterpret_cast<uintptr_t>(ws.counters) % 16 != 0) {
        return cudaErrorInvalidValue;
      }
      unsigned* counters = static_cast<unsigned*>(ws.counters);  // counts, departures, then the slots
      SpreadArgs a = {shape, plan.reducers, plan.depth,
                      reinterpret_cast<unsigned long long*>(counters + (groups + 1) * kSpreadCounterStride),
                      counters};
      args[4] = &a;
      return cudaLaunchKernelExC(&cfg, kernel, args);
    }
    if (plan.tier == 2) {
      if (ws.counters == nullptr || ws.partials == nullptr || reinterpret_cast<uintptr_t>(ws.partials) % 16 != 0) {
        return cudaErrorInvalidValue;
      }
      const void* kernel = grid_plan_kernel<T, VEC>(plan, p.length % VEC == 0);
      prepare_launch(kernel);
      GridArgs a = {shape, plan.cluster, int(plan.grid / plan.cluster), static_cast<float4*>(ws.partials),
                    static_cast<unsigned*>(ws.counters)};
      args[4] = &a;
      return cudaLaunchKernelExC(&cfg, kernel, args);
    }
    const void* kernel = tier1_plan_kernel<T, VEC>(plan, p.length % VEC == 0);
    if (kernel == nullptr) return cudaErrorInvalidValue;
    prepare_launch(kernel);
    Tier1Args a = shape;
    args[4] = &a;
    return cudaLaunchKernelExC(&cfg, kernel, args);
  }
};

template <typename T, int VEC>
struct ResidentOp {  // of the kernel that LaunchOp launches
  static cudaError_t run(const Problem& p, const Plan& plan, int* ctas) {
    if (plan.tier == 3) {
      const void* kernel = spread_kernel<T, VEC>(p.length % VEC == 0);
      *ctas = kernel == nullptr ? 0 : resident_memo(kernel, plan.threads, 1, plan.smem_bytes);
      return cudaSuccess;
    }
    *ctas = plan.tier == 0   ? resident(tier0_kernel<T, VEC>(plan.items), plan.threads, 1, 0)
            : plan.tier == 2 ? resident_memo(grid_plan_kernel<T, VEC>(plan, p.length % VEC == 0), plan.threads, 1,
                                             plan.smem_bytes)
                             : resident_memo(tier1_plan_kernel<T, VEC>(plan, p.length % VEC == 0), plan.threads,
                                             plan.cluster, plan.smem_bytes);
    return cudaSuccess;
  }
};

int element_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

bool vector_ok(const Problem& p, const void* x, const void* y) {
  const int vec = 16 / element_size(p.dtype);
  const int64_t n = p.channels / p.groups * p.length;
  return reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 && n % vec == 0;
}

cudaError_t check(const Problem& p) {
  if (p.batch < 1 || p.channels < 1 || p.length < 1 || p.groups < 1 || p.channels % p.groups != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.channels / p.groups * p.length > kMaxGroupElements || p.batch * p.groups > (int64_t(1) << 31) / kMaxCluster) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

// Op<T, VEC>::run(args...) for the problem's dtype and vector width.
template <template <typename, int> class Op, typename... Args>
cudaError_t dispatch(DType dtype, bool vec, Args&&... args) {
  switch (dtype) {
    case DType::kFloat32:
      return vec ? Op<float, 4>::run(args...) : Op<float, 1>::run(args...);
    case DType::kFloat16:
      return vec ? Op<__half, 8>::run(args...) : Op<__half, 1>::run(args...);
    case DType::kBFloat16:
      return vec ? Op<__nv_bfloat16, 8>::run(args...) : Op<__nv_bfloat16, 1>::run(args...);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t check_limits(const Limits& limits) { return limits_ok(limits) ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t make_plan(const Problem& p, const void* x, const void* y, const Limits& limits, Plan* plan) {
  cudaError_t err = check(p);
  if (err == cudaSuccess) err = check_limits(limits);
  if (err != cudaSuccess) return err;
  return dispatch<PlanOp>(p.dtype, vector_ok(p, x, y), p, limits, plan);
}

cudaError_t resident_ctas(const Problem& p, const Plan& plan, int* ctas) {
  return dispatch<ResidentOp>(p.dtype, plan.vec > 1, p, plan, ctas);
}

cudaError_t launch(const Problem& p, const Plan& plan, const void* x, const void* gamma, const void* beta, void* y,
                   const Workspace& ws, cudaStream_t stream) {
  const cudaError_t err = check(p);
  if (err != cudaSuccess) return err;
  return dispatch<LaunchOp>(p.dtype, plan.vec > 1, p, plan, x, gamma, beta, y, ws, stream);
}

}  // namespace gn_mish
