// unet1d.cu: the U-Net's generic layer kernel (unet1d.h: what an op computes) and its C ABI launcher.
//
// fp32 activations (the weights of SIMT segments fp32 or bf16: UnetSegment::wbf16), fp32-accurate arithmetic (fp32
// FMAs or 3xTF32 tensor-core products, fp32 sums). One CTA of T threads (512 for up to 4 row blocks, else 256) per
// (rc rows of one segment, batch element): it owns rc output
// rows of all l_out columns, so there is no cross-CTA reduction; a forward's ~30 ops are grids of up to ~130 CTAs, each
// under ~110 KB of shared memory where it can, so that two ops' CTAs fit one SM. Per CTA, in order:
//   1. thread 0 requests the first `ring` stages of its weights (TMA bulk copies, one contiguous stage each,
//      completing on one mbarrier per ring slot): weights never depend on the previous op, so they stream
//      while it still runs;
//   2. griddepcontrol.launch_dependents (the next op may start its own step 1 on free SM space), then
//      griddepcontrol.wait (the previous op's grid has finished and its stores are visible);
//   3. prologue: the sources into X (shared memory; cp.async), GroupNorm statistics (two passes, a warp per
//      group), per-channel coefficients (a, b, scale, shift), then X = scale * mish(a x + b) + shift + res in
//      place (a float4 per thread and step where L is a power of two); CTAs store their share of X when the
//      op materialises it. Where the op's one transformed source fits two float4s per thread (512 threads) or
//      four (256), prologue_fast instead loads it into registers beside the partials, one barrier publishes the
//      statistics, and each thread transforms its own float4s onto the residual it copied into X before the wait;
//   4. stages: run_segment_simt for a stride-1 'same' conv of 4 or 8 columns (most of the bytes at B = 1): fp32
//      FMAs, a thread per row pair and channel; else run_segment: per tap, a transposed GEMM on m16n8k8 TF32 MMAs
//      split 3 ways for fp32 accuracy, warps over channel blocks; slot reuse: every thread fences its generic
//      reads of the slot, one barrier, thread 0 re-issues;
//   5. the warps' partial sums meet in shared memory; + bias; store.
// An op whose output is read next under a GroupNorm also stores its GroupNorm partials (per 16 or 32 outputs: mean
// and squared deviations), which the reader combines while its sources load, instead of a statistics pass over X.
// A SIMT segment 0 may carry a rider (simt = 2): the block's 1x1 residual conv of the same X and rows, its weights tap
// k of the packed ones, summed into a second set of accumulators and stored after segment 0's outputs. An op over
// the two-CTA shared-memory budget runs the MINB = 1 instantiation (128 registers: a register prologue of four
// float4s per thread) and requests its ring's later stages after its early loads.
// Versus conv1d's stream_rows.cu (one conv per launch, x copied in raw, FMAs on CUDA cores): the input
// transform of the previous layer (GroupNorm, Mish, FiLM, residual, concatenation) runs in this kernel's
// prologue, segments let one launch hold a conv and its 1x1 residual conv (or both phases of the transposed
// conv), weights are requested before the dependency wait, and the products of the 16- and 32-column, strided
// and transposed convs run on tensor cores.
// Files: unet1d_device.cuh (helpers), unet1d_sources.cuh and unet1d_prologue.cuh (step 3), unet1d_stream.cuh (the
// weight ring of steps 1 and 4), unet1d_stages.cuh (steps 4-5); here: the kernel, its instantiations, the C ABI.
#include <cuda_runtime.h>
#include <stdint.h>

#include "grid_dependency.cuh"  // kernels/_cuda/
#include "unet1d.h"
#include "unet1d_prologue.cuh"
#include "unet1d_stages.cuh"

namespace {

// MINB: CTAs per SM the registers must allow (2: up to 64 registers at 512 threads; 1 for an op whose shared memory
// leaves its SM to it alone anyway)
template <int COLS, int NBMAX, int T, int MINB>
__global__ void __launch_bounds__(T, MINB) unet1d_op_kernel(const __grid_constant__ UnetOp op) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Carve cv = carve(op);
    const unsigned bars = ca::smem_addr(smem);
    float2* stats = reinterpret_cast<float2*>(smem + cv.stats);
    float* red = reinterpret_cast<float*>(smem + cv.red);
    float4* coef = reinterpret_cast<float4*>(smem + cv.coef);
    float* X = reinterpret_cast<float*>(smem + cv.x);

    const int b = blockIdx.x % op.batch_grid, cta = blockIdx.x / op.batch_grid;
    const int si = (op.nseg > 1 && cta >= op.seg[1].cta0) ? 1 : 0;
    const UnetSegment& sg = op.seg[si];
    const int c = cta - sg.cta0;
    const Stream ws = cta_stream(sg, c, reinterpret_cast<float*>(smem + cv.ring), cv.stage_bytes / 4, bars);

    mark(op, 0);
    // 1. weights first: they do not depend on the previous op
    {
        const ca::Policy policy = ca::make_policy(1);
        if (threadIdx.x == 0 && op.copy != 2) {
            for (int s = 0; s < op.ring; ++s) ca::mbar_init(bars + 8u * s, 1);
            ca::fence_mbar_init();
        }
        // (a CTA alone on its SM starts as its predecessor there leaves, with the dependency mostly met: its early
        // loads are on the critical path, so they go ahead of all but the first stage, not behind ring x 40 KB)
        const int now = MINB == 1 && op.copy != 2 ? 1 : op.ring;
        for (int s = 0; s < now && s < sg.nstages; ++s)
            issue_stage(op, ws, s, s, policy);
    }
    // 2. what older ops wrote; wait for the previous op; then let the next op start streaming its weights
    // (released only now, so that when op j starts, every op before j - 1 has finished: what 3a relies on)
    float4 rpre[UR];
    int rsrc;
    const bool fast = fast_prologue<T, MINB>(op, b);
    prologue_early<T>(op, b, X, coef, rpre, rsrc, fast);
    if (MINB == 1 && op.copy != 2) {
        const ca::Policy policy = ca::make_policy(1);
        for (int s = 1; s < op.ring && s < sg.nstages; ++s)
            issue_stage(op, ws, s, s, policy);
    }
    mark(op, 1);
    ca::grid_dependency_wait();
    ca::launch_dependents();
    mark(op, 2);
    // 3. (its __syncthreads also publishes the barrier initialisation)
    if (fast)
        prologue_fast<T, MINB>(op, b, cta, op.grid / op.batch_grid, X, stats, coef);
    else
        prologue<T>(op, b, cta, op.grid / op.batch_grid, X, stats, coef, red, (cv.coef - cv.red) / 4, rpre, rsrc);
    // 4.-5. (taps are compile-time: the kernel holds one copy of the stage loop per supported K)
    if constexpr (COLS == 8 && T == 512) {
        if (sg.simt) {  // the plan admits l_out 4 or 8, K 1, 3 or 5 (a carrier: 3 or 5) (_plan.simt_fits)
            if (sg.simt == 2 && sg.wbf16) run_simt<T, true, true>(op, sg, c, b, X, ws, red);
            else if (sg.simt == 2) run_simt<T, true, false>(op, sg, c, b, X, ws, red);
            else if (sg.wbf16) run_simt<T, false, true>(op, sg, c, b, X, ws, red);
            else run_simt<T, false, false>(op, sg, c, b, X, ws, red);
            return;
        }
    }
    switch (sg.k) {
        case 1: run_segment<COLS, NBMAX, T, 1>(op, sg, c, b, X, ws, red); break;
        case 2: run_segment<COLS, NBMAX, T, 2>(op, sg, c, b, X, ws, red); break;
        case 3: run_segment<COLS, NBMAX, T, 3>(op, sg, c, b, X, ws, red); break;
        case 5: run_segment<COLS, NBMAX, T, 5>(op, sg, c, b, X, ws, red); break;
        default: __trap();  // the plan admits K in {1, 2, 3, 5}
    }
}

using KernelFn = void (*)(UnetOp);

constexpr int kNbMax[] = {1, 2, 4, 8, 16};

// threads per CTA of an instantiation: 512 while the accumulators fit 64 registers (two CTAs per SM), else 256
constexpr int threads_for(int nb) { return nb <= 4 ? 512 : 256; }

// an op over this much shared memory has its SM to itself (_plan.SMEM_BUDGET: two CTAs per SM fit under it)
constexpr int kTwoCtaSmem = 113 * 1024;

// (256-thread instantiations hold 4 float4s in either case: only the 512-thread ones come in both MINB forms)
template <int COLS, int MINB>
KernelFn kernel_for_nb(int nb) {
    switch (nb) {
        case 1: return unet1d_op_kernel<COLS, 1, threads_for(1), MINB>;
        case 2: return unet1d_op_kernel<COLS, 2, threads_for(2), MINB>;
        case 4:
        case 8:
        case 16:
            if constexpr (COLS <= 16) {  // two 16-column tiles of 4+ row blocks would spill: the plan caps them at 2
                if (nb == 4) return unet1d_op_kernel<COLS, 4, threads_for(4), MINB>;
                if (nb == 8) return unet1d_op_kernel<COLS, 8, threads_for(8), 2>;
                return unet1d_op_kernel<COLS, 16, threads_for(16), 2>;
            }
            return nullptr;
        default: return nullptr;
    }
}

int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p *= 2;
    return p;
}

template <int MINB>
KernelFn kernel_for_cols(int cols, int nb) {
    switch (cols) {
        case 8: return kernel_for_nb<8, MINB>(nb);
        case 16: return kernel_for_nb<16, MINB>(nb);
        case 32: return kernel_for_nb<32, MINB>(nb);
        default: return nullptr;
    }
}

// the instantiation of an op: its output columns (8, 16 or 32), its segments' largest row-block count, and whether
// it has its SM to itself (alone: the 128-register form)
KernelFn kernel_for(int cols, int nbmax, bool alone) {
    const int nb = pow2_at_least(nbmax);
    return alone ? kernel_for_cols<1>(cols, nb) : kernel_for_cols<2>(cols, nb);
}

int op_nbmax(const UnetOp& op) {
    int nb = 0;
    for (int s = 0; s < op.nseg; ++s) nb = op.seg[s].nb > nb ? op.seg[s].nb : nb;
    return nb;
}

}  // namespace

extern "C" int dpk_unet1d_smem_bytes(const UnetOp* op) { return carve(*op).total; }

extern "C" int dpk_unet1d_struct_sizes(int* source, int* segment, int* op) {
    *source = static_cast<int>(sizeof(UnetSource));
    *segment = static_cast<int>(sizeof(UnetSegment));
    *op = static_cast<int>(sizeof(UnetOp));
    return 0;
}

extern "C" int dpk_unet1d_prepare(int max_smem_bytes) {
    for (int cols = 8; cols <= 32; cols *= 2) {
        for (int i = 0; i < 2 * 5; ++i) {
            const KernelFn fn = kernel_for(cols, kNbMax[i % 5], i >= 5);
            if (fn == nullptr) continue;
            cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem_bytes);
            if (e == cudaSuccess)  // one shared-memory carveout for every op: no reconfiguration between them
                e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         static_cast<int>(cudaSharedmemCarveoutMaxShared));
            if (e != cudaSuccess) return static_cast<int>(e);
        }
    }
    return 0;
}

extern "C" int dpk_unet1d_launch(const UnetOp* ops, int n, void* stream, int pdl) {
    for (int i = 0; i < n; ++i) {
        const UnetOp& op = ops[i];
        const KernelFn fn = kernel_for(op.cols, op_nbmax(op), op.smem_bytes > kTwoCtaSmem);
        if (fn == nullptr || op.grid <= 0 || op.threads != threads_for(pow2_at_least(op_nbmax(op))))
            return static_cast<int>(cudaErrorInvalidValue);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(static_cast<unsigned>(op.grid));
        cfg.blockDim = dim3(static_cast<unsigned>(op.threads));
        cfg.dynamicSmemBytes = static_cast<size_t>(op.smem_bytes);
        cfg.stream = static_cast<cudaStream_t>(stream);
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        const cudaError_t e = cudaLaunchKernelEx(&cfg, fn, op);
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    return 0;
}

extern "C" const char* dpk_unet1d_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
