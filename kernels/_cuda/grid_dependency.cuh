// grid_dependency.cuh: programmatic dependent launch (sm_90), GPU-scope acquire / release flags, and the GPU-wide
// nanosecond timer.
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it
// in the stream still runs: `grid_dependency_wait` returns once that grid has finished and its stores are
// visible; `launch_dependents` lets the next such kernel start (every CTA executes it, or exits). Work that does
// not read the previous kernel's output (a weight stream) goes before the wait. Elsewhere both are no-ops, so
// the same code runs launched plainly or below sm_90.
#pragma once

#include <stdint.h>

namespace dpk_async {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A flag another CTA publishes: the acquire load sees everything its writer stored before the release store (or
// before a fence and an atomic). GPU scope: the CTAs may sit on any SM.
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// %globaltimer: nanoseconds, one clock for every SM (phase traces across CTAs and kernels)
__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

}  // namespace dpk_async
