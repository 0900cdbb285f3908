// unet1d_stream.cuh: a CTA's weight stream (steps 1 and 4 of unet1d.cu): its packed weights as stages requested
// into a ring of shared-memory slots (TMA bulk copies by thread 0 completing on one mbarrier per slot, or
// cp.async by every thread), waited on per stage and re-requested into a slot once every warp is done with it.
#pragma once

#include "unet1d_device.cuh"

namespace {

// this CTA's weight stream: where its packed weights start, bytes per stage, the ring of slots (each of the op's
// largest stage) and their mbarriers; made once per CTA (cta_stream), read by every stage loop
struct Stream {
    const char* w;
    int stage;
    float* ring;
    int slot_floats;
    unsigned bars;
};

__device__ __forceinline__ Stream cta_stream(const UnetSegment& sg, int c, float* ring, int slot_floats,
                                             unsigned bars) {
    const int stage = stage_bytes(sg);
    return {reinterpret_cast<const char*>(sg.w) + static_cast<int64_t>(c) * sg.nstages * stage, stage, ring,
            slot_floats, bars};
}

// request stage `st` of this CTA's weights into ring slot `slot` (see UnetOp::copy). Bulk copies: thread 0 only,
// completing on the slot's mbarrier. cp.async: every thread copies its 16-byte pieces and commits one group.
__device__ __forceinline__ void issue_stage(const UnetOp& op, const Stream& ws, int st, int slot,
                                            const ca::Policy& hint) {
    const int stage = ws.stage;
    const unsigned bars = ws.bars;
    const char* src = ws.w + static_cast<int64_t>(st) * stage;
    char* dst = reinterpret_cast<char*>(ws.ring + slot * ws.slot_floats);
    if (op.copy == 2) {
        for (int i = 16 * threadIdx.x; i < stage; i += 16 * blockDim.x) ca::copy16(dst + i, src + i, true, hint);
        ca::commit();
    } else if (threadIdx.x == 0) {
        ca::mbar_arrive_expect_tx(bars + 8u * slot, static_cast<unsigned>(stage));
        ca::bulk_copy_g2s(ca::smem_addr(dst), src, static_cast<unsigned>(stage), bars + 8u * slot,
                          op.copy == 0 ? hint : ca::Policy{0, 0});
    }
}

// wait until stage `st` (in slot st % ring) has landed and is visible to every thread of the CTA
// (slot = st % ring, parity = (st / ring) & 1, kept by the caller); traced: mark its landing (the marks stay
// off the loop's path unless tracing)
__device__ __forceinline__ void wait_stage(const UnetOp& op, int st, int nstages, unsigned bars, int slot,
                                           unsigned parity, bool traced) {
    if (op.copy == 2) {  // groups of later stages may be in flight: at most min(ring, nstages - st) - 1
        const int later = min(op.ring, nstages - st) - 1;
        ca::wait_pending(later);
        __syncthreads();
    } else {
        ca::mbar_wait_parity(bars + 8u * slot, parity);
    }
    if (traced) {
        if (st == 0) mark(op, 6);
        if (st < 30) mark(op, 8 + st);
    }
}

// after stage st's work (traced: mark stage 1's, thread 0's warp): the slot's reads precede the copy engine's next
// write (proxy fence), every warp is done with it (barrier), thread 0 requests stage st + ring into it; then the
// next slot and its barrier's parity. A slot that is not refilled (the ring's last stages: every stage of an op whose
// weights fit its ring) needs neither fence nor barrier.
__device__ __forceinline__ void release_slot(const UnetOp& op, const Stream& ws, int st, int nstages, int& slot,
                                             unsigned& parity, const ca::Policy& policy, bool traced) {
    if (traced && st == 1) mark(op, 38);
    if (st + op.ring < nstages) {
        if (op.copy != 2) ca::fence_proxy_async_smem();
        __syncthreads();
        issue_stage(op, ws, st + op.ring, slot, policy);
    }
    if (++slot == op.ring) {
        slot = 0;
        parity ^= 1u;
    }
}

}  // namespace
