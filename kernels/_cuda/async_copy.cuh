// async_copy.cuh: cp.async (sm_80+), TMA bulk-copy and mbarrier (sm_90) and L2 cache-policy helpers shared by
// every family (kernels/_cuda/ is on the include path of every build, and in every build's source hash).
//
// cp.async copies global memory straight into shared memory without passing through registers, so a thread
// can keep many loads in flight (the bytes in flight per SM are bounded by shared memory, not by the register
// file), and a zero-filled copy (src-size 0) pads out-of-range elements without a branch around the copy.
// A thread waits only for its own copies (wait_group); data copied by other threads also needs a barrier.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace dpk_async {

constexpr int kMaxDynamicSmem = 227 * 1024 - 256;  // per CTA on sm_90 (227 KB), less room for static words
constexpr int kSmemPerSm = 228 * 1024, kSmemReservedPerCta = 1024;

// Raise one kernel's dynamic shared-memory limit and prefer the largest shared-memory carveout (so that
// ctas_per_sm CTAs of ~100 KB fit one SM), once per device (a host call on every launch costs ~1 us).
template <auto Kernel>
cudaError_t allow_dynamic_smem(size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    static std::atomic<unsigned long long> done{0};  // one bit per device index
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const unsigned long long bit = 1ull << (device & 63);
    if (done.load(std::memory_order_acquire) & bit) return cudaSuccess;
    err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynamicSmem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
    return err;
}

// How the weight stream passes through L2 (the `cache_policy` knob of the stream and tiled configs):
//   0: plain cp.async;  1: L2::evict_first (bytes read once may leave L2 before anything else);
//   2: evict_first + L2::256B prefetch;  3: L2::256B prefetch only.
struct Policy {
    uint64_t hint;
    int mode;
};

__device__ __forceinline__ Policy make_policy(int mode) {
    Policy p{0, mode};
    if (mode == 1 || mode == 2) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p.hint));
    return p;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared (L2 only), zeros when !valid; src must be 16-byte aligned even then.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid, const Policy& p) {
    const unsigned d = smem_addr(dst);
    const int n = valid ? 16 : 0;
    switch (p.mode) {
        case 1:
            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;"
                         :: "r"(d), "l"(src), "r"(n), "l"(p.hint) : "memory");
            break;
        case 2:
            asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;"
                         :: "r"(d), "l"(src), "r"(n), "l"(p.hint) : "memory");
            break;
        case 3:
            asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" :: "r"(d), "l"(src), "r"(n)
                         : "memory");
            break;
        default:
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(src), "r"(n) : "memory");
    }
}

// 16 bytes global -> shared (L2 only), always valid (no src-size operand). Before sm_80: a plain 16-byte copy
// through registers, complete on return.
__device__ __forceinline__ void copy16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#else
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
}

// 4 bytes global -> shared (through L1: neighbours reuse the line), zero when !valid.
__device__ __forceinline__ void copy4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}

// 4 bytes of the weight stream (unaligned rows), with the stream's L2 policy.
__device__ __forceinline__ void copy4(void* dst, const void* src, bool valid, const Policy& p) {
    if (p.mode == 1 || p.mode == 2) {
        asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;"
                     :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0), "l"(p.hint) : "memory");
    } else {
        copy4(dst, src, valid);
    }
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Wait until at most `pending` (0..7, uniform across the block) of this thread's newest groups are in flight.
__device__ __forceinline__ void wait_pending(int pending) {
    switch (pending) {
        case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    }
}

// ---- sm_90 TMA bulk copies completed through an mbarrier ----
// One `cp.async.bulk` moves a contiguous, 16-byte aligned run of global memory (size a multiple of 16) into shared
// memory through the async proxy; the copy engine adds the bytes it wrote to the transaction count of an mbarrier
// in shared memory. A phase of such a barrier (count 1 in every user) completes when its one arrival (which also
// declares the expected bytes, expect_tx) has happened and all expected bytes have landed; waiters spin on the
// phase parity. The PTX is sm_90-only; other targets get a trap (callers take these paths on sm_90 only).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DPK_ASYNC_SM90 1
#define DPK_SM90_ONLY(...) __VA_ARGS__
#else
#define DPK_ASYNC_SM90 0
#define DPK_SM90_ONLY(...) __trap()
#endif

// Initialise the mbarrier at shared address `bar` to expect `count` arrivals per phase (phase parity 0 first).
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    DPK_SM90_ONLY(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory"));
}

// The same for one arrival per phase, the count an immediate operand.
__device__ __forceinline__ void mbar_init(unsigned bar) {
    DPK_SM90_ONLY(asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory"));
}

// Make this thread's mbarrier.init visible to the async proxy (the copy engine's complete_tx) and to the other
// threads of the CTA; they must still be ordered after it by a barrier (__syncwarp / __syncthreads).
__device__ __forceinline__ void fence_mbar_init() {
    DPK_SM90_ONLY(asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"));
}

// Order this thread's earlier generic-proxy shared-memory accesses (plain loads/stores) before later async-proxy
// accesses (bulk copies) issued after a barrier: a ring slot is read (and zero-filled) by the lanes, then
// overwritten by the copy engine.
__device__ __forceinline__ void fence_proxy_async_smem() {
    DPK_SM90_ONLY(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));
}

// Arrive once on `bar` and add `bytes` to the transaction count its current phase waits for (0: plain arrive).
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    DPK_SM90_ONLY(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                                  :: "r"(bar), "r"(bytes) : "memory"));
}

// Arrive once on `bar` (release: this thread's earlier writes are visible to whoever then waits on the phase).
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    DPK_SM90_ONLY(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"));
}

// true once the phase of `bar` with parity `parity` has completed (acquire: the bytes its bulk copies wrote are
// visible to this thread afterwards). A single try: callers loop.
__device__ __forceinline__ bool mbar_try_wait_parity(unsigned bar, unsigned parity) {
#if DPK_ASYNC_SM90
    unsigned done;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done != 0;
#else
    __trap();
    return true;
#endif
}

__device__ __forceinline__ void mbar_wait_parity(unsigned bar, unsigned parity) {
    while (!mbar_try_wait_parity(bar, parity)) {
    }
}

// Wait until the first phase (parity 0) of `bar` has completed: barriers used once per launch. Acquire at CTA scope
// (the bytes of its bulk copies, or what the arriving thread wrote before mbar_arrive), or with kCluster at cluster
// scope (what other CTAs of the cluster stored into this CTA with st.async, counted on `bar`).
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait_first_phase(unsigned bar) {
#if DPK_ASYNC_SM90
    unsigned done = 0;
    do {
        if constexpr (kCluster) {
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
                         " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar) : "memory");
        } else {
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
                         " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar) : "memory");
        }
    } while (!done);
#else
    __trap();
#endif
}

// `bytes` (multiple of 16, both addresses 16-byte aligned) global -> shared, completion counted on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    DPK_SM90_ONLY(asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory"));
}

// The same with the L2 policy of `p`: modes 1 and 2 carry the evict_first hint (bulk copies have no L2::256B
// prefetch qualifier, so mode 2 acts as 1 and mode 3 as 0 here).
__device__ __forceinline__ void bulk_copy_g2s(unsigned dst, const void* src, unsigned bytes, unsigned bar,
                                              const Policy& p) {
#if DPK_ASYNC_SM90
    if (p.mode == 1 || p.mode == 2) {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
            :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(p.hint) : "memory");
    } else {
        bulk_copy_g2s(dst, src, bytes, bar);
    }
#else
    __trap();
#endif
}

// Wait until every cp.async (non-bulk) of this thread has landed (before sm_80 copy16 has already completed).
__device__ __forceinline__ void wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Split reduction without a memset (graph-safe): every CTA of a split group stores its partials, then calls
// this; it returns true (block-uniform) in the CTA that arrived last, which may then read all partials, and
// which resets the counter to zero for the next launch. `flag` is a __shared__ word.
__device__ __forceinline__ bool arrived_last(unsigned* counter, unsigned expected, unsigned* flag) {
    __threadfence();  // this thread's partial stores are visible GPU-wide before the arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(counter, 1u) == expected - 1;
        if (last) *counter = 0u;  // every CTA of the group has arrived: nobody touches it again this launch
        *flag = last;
    }
    __syncthreads();
    const bool last = *flag != 0u;
    if (last) __threadfence();  // acquire side: the other CTAs' partials are read after their arrival
    return last;
}

}  // namespace dpk_async
