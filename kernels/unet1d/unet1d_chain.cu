// unet1d_chain.cu: a run of small consecutive ops (unet1d_chain.h) as one launch on one cluster of CTAs.
//
// fp32 storage and fp32 FMAs, B = 1. Grid: one cluster of `ctas` CTAs (8, or up to 16) of 512 threads, one CTA per
// SM. Per CTA (rank r), for each op (link) in order:
//   1. sources -> X (shared memory, X[p][c]: channels fastest, UNET_CHAIN_HALO zero columns each side): from a slot
//      (what an earlier link of the chain pushed there) or from global memory (what ran before the chain);
//   2. GroupNorm statistics of every normalised source over the whole X (a warp per group), per-channel coefficients
//      (loaded during the previous link), X = scale mish(a x + b) + shift + res in place; X stored to a slot (a later
//      link's identity residual) and / or to global memory (a skip read after the chain);
//   3. each segment: rows [r rc, (r + 1) rc): warp w takes rows w and w + 16, its lanes take channels; per channel a
//      lane holds X's window (l_out stride + k - 1 values) and its rows' k weights and issues every product into its
//      accumulators (rows x l_out); the weights stream through a ring of stages (TMA bulk copies, one mbarrier per
//      slot) in one sequence over the whole chain, so the next link's stages land during this one; the lanes' sums
//      meet by a warp reduce-scatter; + bias; each output pushed to the same offset of its slot in every CTA of the
//      cluster (st.shared::cluster) and / or stored to global memory;
//   4. cluster barrier (arrive after the pushes, wait before the next link's sources).
// Versus unet1d.cu's layer kernel (one grid per op): no grid boundary between the chain's ops, and each op's input
// arrives in shared memory instead of being re-read from L2 by every CTA; the price is that one cluster's SMs do all
// of the chain's products (blog's 256-channel convs: ~0.66 M FMAs per CTA at 8 CTAs).
#include <cuda_runtime.h>
#include <stdint.h>

#include "async_copy.cuh"
#include "grid_dependency.cuh"
#include "unet1d_chain.h"
#include "unet1d_math.cuh"

namespace {

namespace ca = dpk_async;
using namespace dpk_unet1d;

constexpr int kThreads = 512, kHalo = UNET_CHAIN_HALO, kMaxGroups = 16, kU = 8;
constexpr float kGnEps = 1e-5f;

__host__ __device__ inline int align128(int bytes) { return (bytes + 127) & ~127; }

struct ChainCarve {
    int stats, links, coef, x, slots, ring, stage_stride, total;
};

__host__ __device__ inline ChainCarve chain_carve(const UnetChain& c) {
    ChainCarve k;
    k.stats = 128;  // ring barriers (UNET_CHAIN_MAX_RING x 8 bytes), then thread 0's Issuer
    k.links = k.stats + align128(UNET_MAX_SRC * kMaxGroups * 8);
    k.coef = k.links + align128(UNET_CHAIN_MAX_LINKS * static_cast<int>(sizeof(UnetLink)));
    k.x = k.coef + align128(c.cin_max * 16);
    k.slots = k.x + align128(c.cin_max * (c.l_max + 2 * kHalo) * 4);
    k.ring = k.slots + align128(c.nslots * c.slot_floats * 4);
    k.stage_stride = align128(c.stage_floats * 4);
    k.total = k.ring + c.ring * k.stage_stride;
    return k;
}

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// v into the shared-memory word at `addr` (this CTA's address) of CTA `rank` of the cluster
__device__ __forceinline__ void store_cluster(unsigned addr, unsigned rank, float v) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}

// Thread 0's position in the CTA's weight stream: (link, segment, stage) of the next request, and its count.
struct Issuer {
    int link, seg, stage, g;
};
static_assert(sizeof(UnetLink) % 8 == 0, "links are copied 8 bytes at a time");
static_assert(8 * UNET_CHAIN_MAX_RING + sizeof(Issuer) <= 128, "barriers and issuer share the first 128 bytes");

__device__ void issue_next(const UnetLink* links, int nlinks, int nring, Issuer& is, unsigned rank, unsigned bars,
                           unsigned ring, int stride) {
    if (is.link >= nlinks) return;
    const UnetLinkSeg& s = links[is.link].seg[is.seg];
    const unsigned floats = static_cast<unsigned>(s.rc * s.k * s.cb);
    const float* src = s.w + (static_cast<int64_t>(rank) * s.nstages + is.stage) * floats;
    const int slot = is.g % nring;
    ca::mbar_arrive_expect_tx(bars + 8 * slot, floats * 4);
    ca::bulk_copy_g2s(ring + slot * stride, src, floats * 4, bars + 8 * slot);
    ++is.g;
    if (++is.stage == s.nstages) {
        is.stage = 0;
        if (++is.seg == links[is.link].nseg) {
            is.seg = 0;
            ++is.link;
        }
    }
}

// What every phase needs, in registers (the chain's links are read from their copy in shared memory: indexed at
// run time, the kernel's parameter space would be read through generic addresses)
struct Ring {
    unsigned bars, base;  // shared addresses: the ring slots' mbarriers, slot 0
    float* slots;         // ring slot 0 (generic)
    int stride, n;        // bytes per ring slot, ring slots
    Issuer* issuer;
    const UnetLink* links;  // shared copy
    int nlinks, ctas, slot_floats;
};

// stage gc of the stream, landed
__device__ __forceinline__ const float* stage_wait(const Ring& r, int gc) {
    const int slot = gc % r.n;
    ca::mbar_wait_parity(r.bars + 8 * slot, (gc / r.n) & 1);
    return r.slots + slot * (r.stride / 4);
}

// every thread is done with the stage's slot: thread 0 refills it with the stream's next request
__device__ __forceinline__ void stage_release(const Ring& r, unsigned rank) {
    ca::fence_proxy_async_smem();
    __syncthreads();
    if (threadIdx.x == 0) issue_next(r.links, r.nlinks, r.n, *r.issuer, rank, r.bars, r.base, r.stride);
}

// 3. one segment: K taps, LOUT output columns, STRIDE, RPW rows per warp (rc <= 16: 1, rc = 32: 2)
template <int K, int LOUT, int STRIDE, int RPW>
__device__ __forceinline__ int conv_segment(const UnetLinkSeg& s, const float* X, int cin, unsigned rank, int gc,
                                            const Ring& ring, float* slots) {
    constexpr int WIN = (LOUT - 1) * STRIDE + K, N = RPW * LOUT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rc = s.rc, cb = s.cb, nstages = s.nstages, rows = s.rows;  // into registers once
    const bool active = warp < rc;
    float acc[N];
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.0f;
    float bias[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const int co = static_cast<int>(rank) * rc + warp + 16 * i;
        bias[i] = active && co < rows ? s.bias[co] : 0.0f;
    }
    const float* xb = X + (kHalo - s.pad) * cin;
    for (int st = 0; st < nstages; ++st, ++gc) {
        const float* w = stage_wait(ring, gc);
        if (active) {
            const int c0 = st * cb, cend = min(cb, cin - c0);
            for (int cl = lane; cl < cend; cl += 32) {
                float xw[WIN];
#pragma unroll
                for (int p = 0; p < WIN; ++p) xw[p] = xb[p * cin + c0 + cl];
#pragma unroll
                for (int i = 0; i < RPW; ++i) {
                    const float* wr = w + (warp + 16 * i) * K * cb + cl;
#pragma unroll
                    for (int k = 0; k < K; ++k) {
                        const float wv = wr[k * cb];
#pragma unroll
                        for (int j = 0; j < LOUT; ++j) acc[i * LOUT + j] = fmaf(wv, xw[j * STRIDE + k], acc[i * LOUT + j]);
                    }
                }
            }
        }
        stage_release(ring, rank);
    }
    if (!active) return gc;
    int idx;
    const float v = warp_sum_scatter<N>(acc, lane, idx);
    if ((lane & (32 / N - 1)) != 0) return gc;  // 32 / N lanes hold each sum: the first of them stores it
    const int i = idx / LOUT, j = idx - i * LOUT, r = warp + 16 * i, co = static_cast<int>(rank) * rc + r;
    if (r >= rc || co >= rows) return gc;
    float b = bias[0];
    if constexpr (RPW == 2) b = i ? bias[1] : b;
    const float y = v + b;
    const int64_t e = co * s.oc + static_cast<int64_t>(j * s.ostep + s.ophase) * s.ol;
    if (s.out != nullptr) s.out[e] = y;
    if (s.out_slot >= 0) {
        const unsigned a = ca::smem_addr(slots + static_cast<int64_t>(s.out_slot) * ring.slot_floats + e);
        for (int q = 0; q < ring.ctas; ++q) store_cluster(a, q, y);
    }
    return gc;
}

__device__ __forceinline__ int run_segment(const UnetLinkSeg& s, const float* X, int cin, unsigned rank, int gc,
                                           const Ring& ring, float* slots) {
    const bool two = s.rc > 16;
#define DPK_CHAIN_CASE(K, LO, ST)                                                                   \
    if (s.k == K && s.l_out == LO && s.stride == ST)                                                \
        return two ? conv_segment<K, LO, ST, 2>(s, X, cin, rank, gc, ring, slots)                   \
                   : conv_segment<K, LO, ST, 1>(s, X, cin, rank, gc, ring, slots);
    DPK_CHAIN_CASE(5, 16, 1) DPK_CHAIN_CASE(5, 8, 1) DPK_CHAIN_CASE(5, 4, 1)
    DPK_CHAIN_CASE(3, 16, 1) DPK_CHAIN_CASE(3, 8, 1) DPK_CHAIN_CASE(3, 4, 1)
    DPK_CHAIN_CASE(2, 16, 1) DPK_CHAIN_CASE(2, 8, 1) DPK_CHAIN_CASE(2, 4, 1)
    DPK_CHAIN_CASE(1, 16, 1) DPK_CHAIN_CASE(1, 8, 1) DPK_CHAIN_CASE(1, 4, 1)
    DPK_CHAIN_CASE(3, 8, 2) DPK_CHAIN_CASE(3, 4, 2)
#undef DPK_CHAIN_CASE
    __trap();  // _chain.py admits only the shapes above
    return gc;
}

// source and channel within it of X's channel c
__device__ __forceinline__ int source_of(const UnetLink& L, int c, int& cs) {
    const int s = L.nsrc > 1 && c >= L.src[0].channels;
    cs = c - (s ? L.src[0].channels : 0);
    return s;
}

// gamma, beta, FiLM scale and shift of X's channel c (statistics folded in later); issued a link ahead
__device__ float4 load_coef(const UnetLink& L, int c) {
    float4 k = make_float4(1.0f, 0.0f, 1.0f, 0.0f);
    if (c >= L.cin) return k;
    int cs;
    const UnetSource& S = L.src[source_of(L, c, cs)];
    if (S.gamma != nullptr) {
        k.x = S.gamma[cs];
        k.y = S.beta[cs];
    }
    if (S.film) {
        const int64_t base = S.film_off, tbase = S.film_b != nullptr ? S.t[0] * S.film_ld + S.film_off : 0;
        const int hc = S.film == 1 ? cs + S.channels : cs;
        k.w = S.film_a[base + hc] + (S.film_b != nullptr ? S.film_b[tbase + hc] : 0.0f);
        if (S.film == 1) k.z = S.film_a[base + cs] + (S.film_b != nullptr ? S.film_b[tbase + cs] : 0.0f);
    }
    return k;
}

// a link's source fields in registers
struct Src {
    const float* raw;
    const float* res;
    int64_t sc, sl;
    int slot, res_slot, channels, act, on;  // on: transformed (normalised, activated, FiLM or a residual)
};

__device__ __forceinline__ Src src_view(const UnetLink& L, int s) {
    const UnetSource& S = L.src[s];
    Src v{S.raw, S.res, S.sc, S.sl, L.src_slot[s], L.res_slot[s], S.channels, S.act, 0};
    v.on = S.gamma != nullptr || S.act || S.film || S.res != nullptr || L.res_slot[s] >= 0;
    return v;
}

// (p, c) of element idx = p * cin + c, advanced by the CTA's stride without a division per element
struct Walk {
    int p, c, dp, dc, cin;
    __device__ __forceinline__ Walk(int idx, int cin_) : cin(cin_) {
        p = idx / cin;
        c = idx - p * cin;
        dp = kThreads / cin;
        dc = kThreads - dp * cin;
    }
    __device__ __forceinline__ void next() {
        c += dc;
        p += dp;
        if (c >= cin) {
            c -= cin;
            ++p;
        }
    }
};

// 1. raw values into X (halo columns zero); global loads kU at a time per thread (each an L2 round trip)
__device__ void load_sources(const UnetLink& L, float* X, const float* slots, int slot_floats) {
    const int cin = L.cin, lin = L.l_in, total = (lin + 2 * kHalo) * cin, nsrc = L.nsrc;
    const Src s0 = src_view(L, 0), s1 = nsrc > 1 ? src_view(L, 1) : s0;
    Walk w(threadIdx.x, cin);
    for (int base = threadIdx.x; base < total; base += kU * kThreads) {
        float v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u, w.next()) {
            const int l = w.p - kHalo;
            v[u] = 0.0f;
            if (base + u * kThreads >= total || l < 0 || l >= lin) continue;
            const bool second = nsrc > 1 && w.c >= s0.channels;
            const Src s = second ? s1 : s0;
            const int64_t e = (w.c - (second ? s0.channels : 0)) * s.sc + l * s.sl;
            v[u] = s.slot >= 0 ? slots[s.slot * slot_floats + e] : s.raw[e];
        }
#pragma unroll
        for (int u = 0; u < kU; ++u)
            if (base + u * kThreads < total) X[base + u * kThreads] = v[u];
    }
}

// 2a. (mean, rstd) of every group of every normalised source: warp g takes group g, two passes over X
__device__ void group_stats(const UnetLink& L, const float* X, float2* stats) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, cin = L.cin, lin = L.l_in;
    for (int s = 0, c0 = 0; s < L.nsrc; c0 += L.src[s].channels, ++s) {
        const UnetSource& S = L.src[s];
        if (S.gamma == nullptr || warp >= S.groups) continue;
        const int cpg = S.channels / S.groups;
        const float* g = X + kHalo * cin + c0 + warp * cpg;
        float sum = 0.0f;
        for (int l = 0; l < lin; ++l)
            for (int cc = lane; cc < cpg; cc += 32) sum += g[l * cin + cc];
        const float mean = warp_sum(sum) / (cpg * lin);
        float q = 0.0f;
        for (int l = 0; l < lin; ++l)
            for (int cc = lane; cc < cpg; cc += 32) {
                const float d = g[l * cin + cc] - mean;
                q += d * d;
            }
        const float var = warp_sum(q) / (cpg * lin);
        if (lane == 0) stats[s * kMaxGroups + warp] = make_float2(mean, rsqrtf(var + kGnEps));
    }
}

// 2b. X = scale mish(a x + b) + shift + res in place for the transformed sources; X to the mat slot / global
__device__ void transform(const UnetLink& L, float* X, const float4* coef, const float* slots, int slot_floats,
                          unsigned rank, int ctas) {
    const int cin = L.cin, lin = L.l_in, total = lin * cin, nsrc = L.nsrc;
    const Src s0 = src_view(L, 0), s1 = nsrc > 1 ? src_view(L, 1) : s0;
    float* mat_slot = L.mat_slot >= 0 ? const_cast<float*>(slots) + L.mat_slot * slot_floats : nullptr;
    float* mat = L.mat;
    Walk w(threadIdx.x, cin);
    for (int base = threadIdx.x; base < total; base += kU * kThreads) {
        float r[kU];
        Walk wr = w;
#pragma unroll
        for (int u = 0; u < kU; ++u, wr.next()) {  // residuals first, all in flight
            r[u] = 0.0f;
            if (base + u * kThreads >= total) continue;
            const bool second = nsrc > 1 && wr.c >= s0.channels;
            const Src s = second ? s1 : s0;
            const int64_t e = static_cast<int64_t>(wr.c - (second ? s0.channels : 0)) * lin + wr.p;
            if (s.res_slot >= 0) r[u] = slots[s.res_slot * slot_floats + e];
            else if (s.res != nullptr) r[u] = s.res[e];
        }
#pragma unroll
        for (int u = 0; u < kU; ++u, w.next()) {
            if (base + u * kThreads >= total) continue;
            const int l = w.p, c = w.c;
            const Src s = nsrc > 1 && c >= s0.channels ? s1 : s0;
            float& x = X[(kHalo + l) * cin + c];
            float v = x;
            if (s.on) {
                const float4 k = coef[c];
                v = v * k.x + k.y;
                if (s.act) v = mish(v);
                v = v * k.z + k.w + r[u];
                x = v;
            }
            if (mat_slot != nullptr) mat_slot[c * lin + l] = v;
            if (mat != nullptr && c % ctas == static_cast<int>(rank)) mat[c * lin + l] = v;
        }
    }
}

__global__ void __launch_bounds__(kThreads, 1) unet1d_chain_kernel(const __grid_constant__ UnetChain ch) {
    extern __shared__ __align__(128) unsigned char smem[];  // all of it dynamic: the opt-in limit is for the total
    const ChainCarve cv = chain_carve(ch);
    float2* stats = reinterpret_cast<float2*>(smem + cv.stats);
    float4* coef = reinterpret_cast<float4*>(smem + cv.coef);
    float* X = reinterpret_cast<float*>(smem + cv.x);
    float* slots = reinterpret_cast<float*>(smem + cv.slots);
    UnetLink* links = reinterpret_cast<UnetLink*>(smem + cv.links);
    const Ring ring{ca::smem_addr(smem), ca::smem_addr(smem + cv.ring), reinterpret_cast<float*>(smem + cv.ring),
                    cv.stage_stride, ch.ring, reinterpret_cast<Issuer*>(smem + 8 * UNET_CHAIN_MAX_RING), links,
                    ch.n, ch.ctas, ch.slot_floats};
    {  // the links into shared memory, 8 bytes a thread at a time
        const int2* from = reinterpret_cast<const int2*>(&ch.link[0]);
        int2* to = reinterpret_cast<int2*>(links);
        for (int i = threadIdx.x; i < ch.n * static_cast<int>(sizeof(UnetLink) / 8); i += kThreads) to[i] = from[i];
    }
    __syncthreads();
    const unsigned rank = cluster_rank();
    const int tid = threadIdx.x;
    if (tid == 0) {  // the weights never depend on an earlier op: requested before the dependency wait
        for (int i = 0; i < ch.ring; ++i) ca::mbar_init(ring.bars + 8 * i, 1);
        ca::fence_mbar_init();
        *ring.issuer = Issuer{0, 0, 0, 0};
        for (int i = 0; i < ch.ring; ++i)
            issue_next(links, ch.n, ch.ring, *ring.issuer, rank, ring.bars, ring.base, ring.stride);
    }
    cluster_arrive();  // every CTA of the cluster has started before any pushes into it
    ca::grid_dependency_wait();
    ca::launch_dependents();
    float4 k = load_coef(links[0], tid);
    cluster_wait();
    int gc = 0;
    uint64_t* trace = ch.trace != nullptr && tid == 0 ? ch.trace + blockIdx.x * ch.n * UNET_CHAIN_TRACE_POINTS : nullptr;
    for (int li = 0; li < ch.n; ++li) {
        const UnetLink& L = links[li];
        if (li > 0) cluster_wait();
        uint64_t* tr = trace != nullptr ? trace + li * UNET_CHAIN_TRACE_POINTS : nullptr;
        if (tr) tr[0] = ca::globaltimer_ns();
        load_sources(L, X, slots, ch.slot_floats);
        __syncthreads();
        if (tr) tr[1] = ca::globaltimer_ns();
        group_stats(L, X, stats);
        __syncthreads();
        if (tr) tr[2] = ca::globaltimer_ns();
        if (tid < L.cin) {
            int cs;
            const int s = source_of(L, tid, cs);
            if (L.src[s].gamma != nullptr) {
                const float2 st = stats[s * kMaxGroups + cs / (L.src[s].channels / L.src[s].groups)];
                k.x *= st.y;
                k.y -= st.x * k.x;
            }
            coef[tid] = k;
        }
        __syncthreads();
        if (tr) tr[3] = ca::globaltimer_ns();
        transform(L, X, coef, slots, ch.slot_floats, rank, ch.ctas);
        __syncthreads();
        if (tr) tr[4] = ca::globaltimer_ns();
        if (li + 1 < ch.n) k = load_coef(links[li + 1], tid);
        for (int s = 0; s < L.nseg; ++s) {
            gc = run_segment(L.seg[s], X, L.cin, rank, gc, ring, slots);
            if (tr) tr[5 + s] = ca::globaltimer_ns();
        }
        if (tr) tr[7] = ca::globaltimer_ns();
        cluster_arrive();
    }
    cluster_wait();  // no CTA leaves while another may still push into it
}

}  // namespace

extern "C" int dpk_unet1d_chain_smem_bytes(const UnetChain* chain) { return chain_carve(*chain).total; }

extern "C" int dpk_unet1d_chain_struct_sizes(int* seg, int* link, int* chain) {
    *seg = static_cast<int>(sizeof(UnetLinkSeg));
    *link = static_cast<int>(sizeof(UnetLink));
    *chain = static_cast<int>(sizeof(UnetChain));
    return 0;
}

extern "C" int dpk_unet1d_chain_prepare(int max_smem_bytes) {
    cudaError_t e = cudaFuncSetAttribute(unet1d_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         max_smem_bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(unet1d_chain_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return static_cast<int>(e);
}

extern "C" int dpk_unet1d_chain_launch(const UnetChain* chain, void* stream, int pdl) {
    const UnetChain& c = *chain;
    if (c.n < 1 || c.n > UNET_CHAIN_MAX_LINKS || c.ctas < 1 || c.ctas > 16 || c.ring < 1 ||
        c.ring > UNET_CHAIN_MAX_RING || c.smem_bytes != chain_carve(c).total)
        return static_cast<int>(cudaErrorInvalidValue);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(c.ctas));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(c.smem_bytes);
    cfg.stream = static_cast<cudaStream_t>(stream);
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(c.ctas);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 2 : 1;
    return static_cast<int>(cudaLaunchKernelEx(&cfg, unet1d_chain_kernel, c));
}
