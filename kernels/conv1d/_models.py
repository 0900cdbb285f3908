"""NumPy models of the conv1d CUDA kernels' index math, for CPU tests (no GPU needed).

Each function mirrors its .cu counterpart statement by statement (same names, same formulas), so a test can
check on a CPU that the partition covers every weight once, that the shared-memory layouts written and read
agree, that a pipeline slot is refilled only after it was read, and that the whole kernel computes the
convolution. The compiled host planners are compared with these on CPU (nvcc) and, on a GPU, through the
extension (binding.cpp: stream_plan, tiled_plan, optimized_config). This file: stream.cu (and what tiled.cu shares);
stream_rows.cu (stream.cu's `rows` path): _models_rows.py; tiled.cu: _models_tiled.py; optimized.cu:
_models_optimized.py.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

# ---- shared with async_copy.cuh ----
MAX_DYNAMIC_SMEM = 227 * 1024 - 256
SMEM_PER_SM, SMEM_RESERVED_PER_CTA = 228 * 1024, 1024

# ---- stream.cu ----
STREAM_THREADS, STREAM_WARPS = 256, 8
STREAM_DEFAULTS = {"rows_per_warp": 8, "vecs_per_row": 1, "stages": 3, "ctas_per_sm": 1, "cache_policy": 1,
                   "tiled_min_bl": 16, "bulk": 0, "rows": 1, "row_chunks": 0,
                   "row_threads": 0, "row_ahead": 0}  # conv1d.h Conv1dStreamConfig (row_*: 0 = the rule)
STREAM_BAR_BYTES_PER_STAGE = STREAM_WARPS * 8  # bulk: one 8-byte mbarrier per warp and ring stage
STREAM_COMBOS = ((2, 2), (2, 4), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2))  # (RPW, V) compiled for fp32, NO = 4


class StreamPlan(NamedTuple):
    ok: int = 0
    rows_per_warp: int = 0
    vecs_per_row: int = 0
    outputs_per_pass: int = 0
    passes: int = 0
    splits: int = 0
    row_groups: int = 0
    chunks: int = 0
    chunks_per_cta: int = 0
    stages: int = 0
    smem_bytes: int = 0
    workspace_floats: int = 0
    counters: int = 0
    bulk: int = 0
    rows: int = 0


def knobs_with_defaults(knobs: dict | None, defaults: dict) -> dict:
    """The binding's rule: a missing knob or -1 means the default."""
    out = dict(defaults)
    out.update({k: v for k, v in (knobs or {}).items() if v != -1})
    return out


def stream_plan(B: int, Cin: int, Cout: int, L: int, K: int, elem_bytes: int, knobs: dict | None = None,
                num_sms: int = 132) -> StreamPlan:
    """conv1d_stream_plan."""
    from ._models_rows import rows_knobs_ok, rows_plan  # _models_rows imports this module

    c = knobs_with_defaults(knobs, STREAM_DEFAULTS)
    if (elem_bytes not in (2, 4) or not 2 <= c["stages"] <= 8 or not 0 <= c["ctas_per_sm"] <= 8
            or not 0 <= c["cache_policy"] <= 3 or c["bulk"] not in (0, 1) or c["rows"] not in (0, 1)
            or not rows_knobs_ok(c["row_chunks"], c["row_threads"], c["row_ahead"])
            or num_sms < 1 or min(B, Cin, Cout, L, K) < 1):
        return StreamPlan()
    if c["rows"] == 1:  # stream_rows.cu where it fits
        r = rows_plan(B, Cin, Cout, L, K, elem_bytes, c["row_chunks"], c["row_threads"], num_sms, c["row_ahead"])
        if r.ok:
            return StreamPlan(ok=1, rows_per_warp=c["rows_per_warp"], vecs_per_row=c["vecs_per_row"],
                              outputs_per_pass=r.outputs, passes=1, splits=1, row_groups=r.ctas, chunks=r.chunks,
                              chunks_per_cta=r.chunks, stages=r.chunks, smem_bytes=r.smem_bytes, workspace_floats=0,
                              counters=0, bulk=1, rows=1)
    bl, r = B * L, Cin * K
    no = 4 if bl <= 4 else (8 if bl <= 8 else 16)
    passes = math.ceil(bl / no)
    compiled = ((c["rows_per_warp"], c["vecs_per_row"]) in STREAM_COMBOS if elem_bytes == 4 and no == 4
                else (c["rows_per_warp"], c["vecs_per_row"]) == (4, 2))
    rpw, v = (c["rows_per_warp"], c["vecs_per_row"]) if compiled else (4, 2)
    cw = v * 32 * (16 // elem_bytes)
    bulk = int(c["bulk"] == 1 and r * elem_bytes % 16 == 0)
    stage_bytes = STREAM_THREADS * rpw * v * 16 + (STREAM_BAR_BYTES_PER_STAGE if bulk else 0)
    chunk_x_bytes = cw * no * 4
    chunks, row_groups = math.ceil(r / cw), math.ceil(Cout / (STREAM_WARPS * rpw))
    stages = min(c["stages"], int((MAX_DYNAMIC_SMEM - chunk_x_bytes) / stage_bytes))  # C++ truncation
    if stages < 2:
        return StreamPlan()
    base = row_groups * passes
    splits = chunks if c["ctas_per_sm"] == 0 else max(1, min(chunks, num_sms * c["ctas_per_sm"] // base))

    def smem(sp: int) -> int:
        return stages * stage_bytes + math.ceil(chunks / sp) * chunk_x_bytes
    stages = min(stages, max(2, math.ceil(chunks / splits)))  # no idle ring slots, before they could raise splits
    while smem(splits) > MAX_DYNAMIC_SMEM:
        splits += 1
    stages = min(stages, max(2, math.ceil(chunks / splits)))  # ... and after more splits
    if c["ctas_per_sm"] >= 2:
        budget = SMEM_PER_SM // c["ctas_per_sm"] - SMEM_RESERVED_PER_CTA
        while stages > 2 and smem(splits) > budget:
            stages -= 1
    if row_groups > 65535 or passes > 65535:
        return StreamPlan()
    return StreamPlan(1, rpw, v, no, passes, splits, row_groups, chunks, math.ceil(chunks / splits), stages,
                      smem(splits), splits * Cout * bl if splits > 1 else 0, row_groups * passes if splits > 1 else 0,
                      bulk)


def chunk_range(split: int, splits: int, chunks: int) -> tuple[int, int]:
    """[c_begin, c_end) of a split: balanced integer ranges, as the kernel computes them."""
    return split * chunks // splits, (split + 1) * chunks // splits


def stream_weight_owners(Cin: int, Cout: int, K: int, elem_bytes: int, p: StreamPlan) -> np.ndarray:
    """How many (split, chunk of its range, row group, warp, lane, r, u, e) slots of one pass load each weight
    w[co, j] under plan p (every pass, grid.z, streams the weights once more): must be all ones."""
    assert not p.rows, "the ring kernel's partition; stream_rows.cu: each CTA copies whole rows (emulate_rows)"
    e_per_vec = 16 // elem_bytes
    cw = p.vecs_per_row * 32 * e_per_vec
    R = Cin * K
    chunk_list = [c for s in range(p.splits) for c in range(*chunk_range(s, p.splits, p.chunks))]
    ch, g, warp, lane, r, u, e = np.ix_(np.array(chunk_list), *(np.arange(n) for n in (
        p.row_groups, STREAM_WARPS, 32, p.rows_per_warp, p.vecs_per_row, e_per_vec)))
    row = g * STREAM_WARPS * p.rows_per_warp + warp * p.rows_per_warp + r
    col = ch * cw + (u * 32 + lane) * e_per_vec + e
    row, col = np.broadcast_arrays(row, col)
    loaded = (row < Cout) & (col < R)
    return np.bincount((row * R + col)[loaded], minlength=Cout * R).reshape(Cout, R)


def reduce_scatter(v: np.ndarray) -> np.ndarray:
    """dpk_warp::reduce_scatter<N> (kernels/_cuda/warp_reduce.cuh) on a warp: v[lane, i] (32 x N) -> the N/32 (or 1)
    values each lane keeps."""
    v = v.copy()
    n, lane = v.shape[1], np.arange(32)
    for d in (16, 8, 4, 2, 1):
        if n > 1:
            h = n // 2
            upper = ((lane & d) != 0)[:, None]
            send = np.where(upper, v[:, :h], v[:, h:n])
            keep = np.where(upper, v[:, h:n], v[:, :h])
            v[:, :h] = keep + send[lane ^ d]
            n = h
        else:
            v[:, 0] = v[:, 0] + v[lane ^ d, 0]
    return v[:, :n]


def kept_index(lane: int, i: int, nv: int) -> int:
    """Index (r * NO + o) of the total a lane holds in slot i after reduce_scatter (the kernel's write rule)."""
    h = 5 if nv >= 32 else int(math.log2(nv))
    return (lane >> (5 - h)) * (nv >> h) + i


def stream_writers(nv: int) -> list[tuple[int, int, int]]:
    """(lane, i, index) of every value the kernel writes after the warp reduction."""
    h = 5 if nv >= 32 else int(math.log2(nv))
    return [(lane, i, kept_index(lane, i, nv)) for lane in range(32) if lane & ((1 << (5 - h)) - 1) == 0
            for i in range(nv >> h)]


def stream_output_writes(B: int, Cin: int, Cout: int, L: int, K: int, elem_bytes: int,
                         knobs: dict | None = None) -> np.ndarray:
    """Writes of each y[b, co, l] (as Cout x B*L): the lanes kept by the warp reduction (one split), or the last
    CTA's loop over its (row, output) pairs (splits). Must be all ones."""
    p = stream_plan(B, Cin, Cout, L, K, elem_bytes, knobs)
    assert not p.rows, "the ring kernel's writes; stream_rows.cu: _models_rows.emulate_rows"
    BL, no, rpc = B * L, p.outputs_per_pass, STREAM_WARPS * p.rows_per_warp
    counts = np.zeros((Cout, BL), int)
    for group, pas in np.ndindex(p.row_groups, p.passes):
        if p.splits == 1:
            idx = np.array([i for _, _, i in stream_writers(p.rows_per_warp * no)])
            row = (group * rpc + np.arange(STREAM_WARPS)[:, None] * p.rows_per_warp + idx // no).ravel()
            og = np.broadcast_to(pas * no + idx % no, (STREAM_WARPS, idx.size)).ravel()
        else:
            rows, outs = min(rpc, Cout - group * rpc), min(no, BL - pas * no)
            i = np.arange(rows * outs)
            row, og = group * rpc + i // outs, pas * no + i % outs
        ok = (row < Cout) & (og < BL)
        np.add.at(counts, (row[ok], og[ok]), 1)
    return counts


def stage_im2col(x: np.ndarray, K: int, c_begin: int, nc: int, p: int, no: int, cw: int, e_per_vec: int,
                 slots: int) -> np.ndarray:
    """Step 1 of the kernel: xs[(s * NO4 + o4) * 32 + lane] float4 rows for the CTA's nc chunks and pass p."""
    B, Cin, L = x.shape
    R, pad, no4 = Cin * K, K // 2, no // 4
    xs = np.full((nc * slots * no4 * 32, 4), np.nan)
    for s in range(nc * slots):  # warp s % 8 stages slot s
        ch, ue = divmod(s, slots)
        for lane in range(32):
            j = (c_begin + ch) * cw + ((ue // e_per_vec) * 32 + lane) * e_per_vec + ue % e_per_vec
            col_ok = j < R
            ci, k = divmod(j, K) if col_ok else (0, 0)
            b, ll = divmod(p * no, L)
            for o in range(no):
                pos = ll + k - pad
                ok = col_ok and b < B and 0 <= pos < L
                xs[(s * no4 + o // 4) * 32 + lane, o % 4] = x[b, ci, pos] if ok else 0.0
                ll += 1
                if ll == L:
                    ll, b = 0, b + 1
    return xs


def chunk_weights(wflat: np.ndarray, row0: int, rpw: int, v: int, e_per_vec: int, chunk: int) -> np.ndarray:
    """What one warp's lanes copy into a ring slot for `chunk`: [r][u][lane][e], zeros past Cout or R."""
    Cout, R = wflat.shape
    col = chunk * v * 32 * e_per_vec + (np.arange(v)[:, None, None] * 32 + np.arange(32)[:, None]) * e_per_vec \
        + np.arange(e_per_vec)
    rows = row0 + np.arange(rpw)[:, None, None, None]
    ok = (rows < Cout) & (col < R)
    return np.where(ok, wflat[np.minimum(rows, Cout - 1), np.minimum(col, R - 1)], 0.0)


def bulk_fill(wflat: np.ndarray, row0: int, rpw: int, v: int, e_per_vec: int, chunk: int, elem_bytes: int,
              slot: np.ndarray, zeroed: np.ndarray) -> int:
    """issue_chunk_bulk for one warp: lanes past Cout or R zero their own 16 bytes of `slot` ([r][u][lane][e]),
    lane t < RPW*V copies piece (t / V, t % V) (its in-range bytes, one bulk copy into the 32 lanes' contiguous 512
    bytes). Checks what the copy engine needs (size and both addresses multiples of 16, relative to an aligned w and
    ring) and that zeroed bytes and copied bytes are disjoint, now and (via `zeroed`, per slot, updated) against
    every earlier chunk of the slot. Returns the expect_tx byte count (the sum of the copies)."""
    Cout, R = wflat.shape
    cw = v * 32 * e_per_vec
    col0 = chunk * cw
    lanes = np.arange(32)
    copied = np.zeros(zeroed.shape, bool)
    slot[...] = np.nan
    for r in range(rpw):
        for u in range(v):
            out = ~((row0 + r < Cout) & (col0 + (u * 32 + lanes) * e_per_vec < R))
            slot[r, u, out] = 0.0
            zeroed[r, u] |= out
    total = 0
    for t in range(min(32, rpw * v)):
        r, u = divmod(t, v)
        row, col = row0 + r, col0 + u * 32 * e_per_vec
        if not (row < Cout and col < R):
            continue
        nbytes = min(32 * e_per_vec, R - col) * elem_bytes
        assert nbytes % 16 == 0 and (row * R + col) * elem_bytes % 16 == 0, (row, col, nbytes)
        n = nbytes // elem_bytes  # elements; whole lanes since R is a multiple of e_per_vec
        assert n % e_per_vec == 0
        nl = n // e_per_vec
        assert not zeroed[r, u, :nl].any() and not copied[r, u, :nl].any()  # disjoint from every zero write
        copied[r, u, :nl] = True
        slot[r, u, :nl] = wflat[row, col:col + n].reshape(nl, e_per_vec)
        total += nbytes
    assert not np.isnan(slot).any()  # every ring byte of the chunk is copied or zeroed
    return total


def fill_slot(wflat: np.ndarray, row0: int, rpw: int, v: int, e_per_vec: int, chunk: int, elem_bytes: int,
              bulk: int, slot: np.ndarray, zeroed: np.ndarray) -> None:
    """One warp's ring slot for `chunk`: the cp.async lanes (chunk_weights) or the bulk copies (bulk_fill, which
    must produce the same bytes; for bulk one arrive + tx bytes completes the slot barrier's next phase)."""
    if bulk:
        tx = bulk_fill(wflat, row0, rpw, v, e_per_vec, chunk, elem_bytes, slot, zeroed)
        assert tx < 1 << 20  # the mbarrier's tx-count range
        assert np.array_equal(slot, chunk_weights(wflat, row0, rpw, v, e_per_vec, chunk))
    else:
        slot[...] = chunk_weights(wflat, row0, rpw, v, e_per_vec, chunk)


def emulate_stream(x: np.ndarray, w: np.ndarray, bias: np.ndarray, elem_bytes: int = 4,
                   knobs: dict | None = None, num_sms: int = 132) -> np.ndarray:
    """conv1d_stream_kernel CTA by CTA: im2col layout, per-thread cp.async ring (a slot is refilled only after
    its chunk was read), FMAs, warp reduction, split partials and the last CTA's ordered sum. With bulk the ring is
    filled by bulk_fill and each wait checks the kernel's incremental mbarrier parity against the slot's phase. A
    plan with rows = 1 runs _models_rows.emulate_rows instead, as launch_typed runs stream_rows.cu."""
    B, Cin, L = x.shape
    Cout, _, K = w.shape
    p = stream_plan(B, Cin, Cout, L, K, elem_bytes, knobs, num_sms)
    assert p.ok
    if p.rows:  # launch_typed: conv1d_stream_rows with the rows plan
        from ._models_rows import emulate_rows

        c = knobs_with_defaults(knobs, STREAM_DEFAULTS)
        return emulate_rows(x, w, bias, elem_bytes, c["row_chunks"], c["row_threads"], num_sms, ahead=c["row_ahead"])
    rpw, v, no, stages = p.rows_per_warp, p.vecs_per_row, p.outputs_per_pass, p.stages
    E = 16 // elem_bytes
    CW, SLOTS, NO4, NV, R, BL = v * 32 * E, v * E, no // 4, rpw * no, Cin * K, B * L
    wflat, lanes = w.reshape(Cout, R), np.arange(32)
    ws = np.full((p.splits, Cout, BL), np.nan)
    y = np.full((B, Cout, L), np.nan)
    for split, group, pas in np.ndindex(p.splits, p.row_groups, p.passes):
        c_begin, c_end = chunk_range(split, p.splits, p.chunks)
        nc = c_end - c_begin
        xs = stage_im2col(x, K, c_begin, nc, pas, no, CW, E, SLOTS)
        for warp in range(STREAM_WARPS):
            row0 = group * STREAM_WARPS * rpw + warp * rpw
            ring = np.full((stages, rpw, v, 32, E), np.nan)  # [slot][r][u][lane][e]: each lane's own slots
            tag = [-1] * stages                              # chunk each slot holds
            phases = [0] * stages                            # bulk: completed phases of the warp's slot barriers
            zeroed = np.zeros((stages, rpw, v, 32), bool)
            for i in range(min(stages - 1, nc)):
                fill_slot(wflat, row0, rpw, v, E, c_begin + i, elem_bytes, p.bulk, ring[i], zeroed[i])
                assert tag[i] == -1 and i < stages  # bulk: a first use, no proxy fence (the kernel's i >= stages)
                tag[i], phases[i] = i, phases[i] + p.bulk
            acc = np.zeros((32, NV))
            slot, ahead, parity = 0, stages - 1, 0
            for i in range(nc):
                if i + stages - 1 < nc:
                    assert tag[ahead] in (-1, i - 1)  # refilled only after chunk i - 1 was read from it
                    c = i + stages - 1
                    assert (tag[ahead] != -1) == (c >= stages)  # the kernel's proxy fence condition: slot reused
                    fill_slot(wflat, row0, rpw, v, E, c_begin + c, elem_bytes, p.bulk, ring[ahead], zeroed[ahead])
                    tag[ahead], phases[ahead] = c, phases[ahead] + p.bulk
                if p.bulk:  # try_wait.parity(parity) passes iff phase i // stages of the slot completed and the
                    # next one has not (no phase is skipped: the slot's next chunk is issued after this read)
                    assert parity == (i // stages) & 1 and phases[slot] == i // stages + 1
                assert tag[slot] == i
                for u in range(v):
                    for e in range(E):
                        for o4 in range(NO4):
                            xv = xs[((i * SLOTS + u * E + e) * NO4 + o4) * 32 + lanes]
                            for r in range(rpw):
                                acc[:, r * no + 4 * o4:r * no + 4 * o4 + 4] += ring[slot, r, u, :, e][:, None] * xv
                if slot + 1 == stages:
                    parity ^= 1
                slot, ahead = (slot + 1) % stages, (ahead + 1) % stages
            assert sum(phases) == (nc if p.bulk else 0)  # every issued chunk was waited for (nothing left in flight)
            kept = reduce_scatter(acc)
            for lane, i, idx in stream_writers(NV):
                row, og = row0 + idx // no, pas * no + idx % no
                if row < Cout and og < BL:
                    if p.splits == 1:
                        y[og // L, row, og % L] = kept[lane, i] + bias[row]
                    else:
                        ws[split, row, og] = kept[lane, i]
    if p.splits > 1:  # the last CTA of each (row group, pass): splits in order, then the bias
        for og in range(BL):
            y[og // L, :, og % L] = sum(ws[s, :, og] for s in range(p.splits)) + bias
    return y
