// chain.cu: the dependency skeleton of one unet1d forward: `ops` dependent all-to-all exchanges, nothing else.
//
// Op k reads x (n floats, fp32: op 0 the input, later ops the previous op's output) and writes
//   y[i] = 0.5 x[(5 i + 1) mod n] + 0.5 mean(x),  i < n,
// so every output depends on every input, as every output of a unet1d op depends on every channel of its
// predecessor (a conv over all input channels, GroupNorm statistics over a group's CTAs).
// Mapping: `ctas` CTAs of 512 threads per op; each CTA copies all of x from L2 into shared memory (float4,
// ld.global.cg: each thread one or two, 16-32 KB per CTA at n = 4096-8192, a unet1d op's sources), sums it
// (warp shuffles, then warp 0 over the 16 warp sums: two barriers, a unet1d op's GroupNorm statistics) and
// stores its slice of y (ceil(n / ctas) consecutive elements: a unet1d op's store). No weights, no products:
// what a layer of the real model costs beyond its stages.
// Four orders of the ops (dpk_chain_launch's mode):
//   0 stream: `ops` plain launches, each starts when its predecessor has finished;
//   1 pdl: the same launches with programmatic dependent launch (each CTA waits on griddepcontrol, then lets
//     its successor launch: the ordering of unet1d's layer kernels);
//   2 grid_barrier: one persistent cooperative launch, the ops separated by a grid-wide barrier (an arrival
//     counter and a generation word in global memory: what a persistent megakernel pays per dependency);
//   3 grid_counter: the same kernel with a leaner barrier: one red.release add per CTA to a counter that only
//     grows within the launch, polled until it reaches k x CTAs (no generation word, no reset per barrier).
// Ping-pong buffers: op k writes ws[k % 2] (the last op `out`) and reads what op k - 1 wrote; the op that
// overwrites a buffer starts only after every read of it (grid completion or the barrier).
// No torch headers: `nvcc -c` checks this file without a GPU.
#include <cuda_runtime.h>
#include <stdint.h>

#include "grid_dependency.cuh"  // kernels/_cuda/: PDL, acquire / release flags
#include "warp_reduce.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxFloats = 12288;  // 48 KB of shared memory: no opt-in attribute needed

struct Buffers {
    const float* in;  // (n,) the chain's input
    float* ws0;       // (n,) op outputs, alternating
    float* ws1;       // (n,)
    float* out;       // (n,) the last op's output
};

__device__ __forceinline__ const float* source_of(const Buffers& b, int k) {
    return k == 0 ? b.in : (k % 2 == 1 ? b.ws0 : b.ws1);
}

__device__ __forceinline__ float* target_of(const Buffers& b, int k, int ops) {
    return k == ops - 1 ? b.out : (k % 2 == 0 ? b.ws0 : b.ws1);
}

// One op on one CTA: sources into shared memory, the sum over all of them, this CTA's slice of y.
__device__ void exchange(const float* __restrict__ x, float* __restrict__ y, int n, int cta, int ctas,
                         float* sx, float* red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float s = 0.f;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* sx4 = reinterpret_cast<float4*>(sx);
    for (int i = threadIdx.x; i < n / 4; i += kThreads) {
        const float4 v = __ldcg(x4 + i);  // L2: another CTA wrote it
        sx4[i] = v;
        s += (v.x + v.y) + (v.z + v.w);
    }
    s = dpk_warp::sum(s);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    if (warp == 0) {
        float t = lane < kWarps ? red[lane] : 0.f;
        t = dpk_warp::sum(t);
        if (lane == 0) red[kWarps] = t;
    }
    __syncthreads();
    const float half_mean = 0.5f * (red[kWarps] / static_cast<float>(n));
    const int per = (n + ctas - 1) / ctas, lo = cta * per, hi = min(n, lo + per);
    for (int i = lo + static_cast<int>(threadIdx.x); i < hi; i += kThreads)
        y[i] = fmaf(0.5f, sx[(5 * i + 1) % n], half_mean);
}

__global__ void __launch_bounds__(kThreads) chain_op_kernel(Buffers b, int n, int k, int ops) {
    extern __shared__ float4 smem4[];
    __shared__ float red[kWarps + 1];
    dpk_async::grid_dependency_wait();  // no-ops when launched plainly
    dpk_async::launch_dependents();
    exchange(source_of(b, k), target_of(b, k, ops), n, blockIdx.x, gridDim.x, reinterpret_cast<float*>(smem4), red);
}

// Every CTA of the grid arrives before any leaves; bar[0] counts arrivals, bar[1] is the generation. The
// counter is back at 0 after each barrier, so the words carry over from one launch to the next.
__device__ void grid_barrier(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned gen = dpk_async::load_acquire(bar + 1);
        __threadfence();  // this CTA's stores before its arrival
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            dpk_async::store_release(bar + 1, gen + 1);
        } else {
            while (dpk_async::load_acquire(bar + 1) == gen) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// Before op k every CTA adds 1 to bar[0] and waits for k x CTAs arrivals. bar[0] only grows within a launch;
// the last CTA to leave (bar[2] counts departures, each after its last wait) sets both back to 0 for the next.
__device__ void counter_barrier(unsigned* bar, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        while (dpk_async::load_acquire(bar) < target) {
        }
    }
    __syncthreads();
}

template <bool kCounter>
__global__ void __launch_bounds__(kThreads) chain_persistent_kernel(Buffers b, int n, int ops, unsigned* bar) {
    extern __shared__ float4 smem4[];
    __shared__ float red[kWarps + 1];
    for (int k = 0; k < ops; ++k) {
        if (k > 0) {
            if (kCounter)
                counter_barrier(bar, static_cast<unsigned>(k) * gridDim.x);
            else
                grid_barrier(bar);
        }
        exchange(source_of(b, k), target_of(b, k, ops), n, blockIdx.x, gridDim.x, reinterpret_cast<float*>(smem4),
                 red);
    }
    if (kCounter && threadIdx.x == 0 && atomicAdd(bar + 2, 1u) == gridDim.x - 1) {
        bar[0] = 0;
        bar[2] = 0;
    }
}

}  // namespace

// The most CTAs of the persistent kernel that fit on the device at once (a cooperative launch needs them all).
extern "C" int dpk_chain_max_coresident(int n, int* ctas) {
    int device = 0, sms = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_persistent_kernel<false>, kThreads,
                                                          static_cast<size_t>(n) * 4);
    *ctas = sms * per_sm;
    return static_cast<int>(e);
}

// mode 0 stream, 1 pdl, 2 grid_barrier, 3 grid_counter (header). n a positive multiple of 4 up to kMaxFloats;
// bar: three zeroed words owned by the caller (modes 2 and 3), each left as found by a completed launch.
extern "C" int dpk_chain_launch(const float* in, float* ws0, float* ws1, float* out, int n, int ops, int ctas,
                                int mode, unsigned* bar, void* stream) {
    if (n <= 0 || n % 4 != 0 || n > kMaxFloats || ops <= 0 || ctas <= 0 || mode < 0 || mode > 3)
        return static_cast<int>(cudaErrorInvalidValue);
    const Buffers b{in, ws0, ws1, out};
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(ctas));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(n) * 4;
    cfg.stream = static_cast<cudaStream_t>(stream);
    cudaLaunchAttribute attr[1];
    if (mode >= 2) {
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        return static_cast<int>(mode == 2 ? cudaLaunchKernelEx(&cfg, chain_persistent_kernel<false>, b, n, ops, bar)
                                          : cudaLaunchKernelEx(&cfg, chain_persistent_kernel<true>, b, n, ops, bar));
    }
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = mode == 1 ? 1 : 0;
    for (int k = 0; k < ops; ++k) {
        const cudaError_t e = cudaLaunchKernelEx(&cfg, chain_op_kernel, b, n, k, ops);
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    return 0;
}

extern "C" const char* dpk_chain_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
