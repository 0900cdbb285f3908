"""NumPy model of tiled.cu's index math (conventions as in _models.py): the planner, a CTA-by-CTA emulation with
the cp.async slot discipline and the shared-memory layouts, and vectorized coverage counts for large shapes."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._models import MAX_DYNAMIC_SMEM, SMEM_PER_SM, SMEM_RESERVED_PER_CTA, chunk_range, knobs_with_defaults

TILES = ((64, 32, 32, 4, 4), (64, 64, 32, 4, 8), (128, 64, 32, 8, 8), (128, 128, 32, 8, 8))  # BM, BN, BK, TM, TN
MMA_THREADS = (128, 128, 256, 256)  # tiled.cu kTiles: MmaTile's CTA size per tile
TILED_DEFAULTS = {"tile": -1, "stages": -1, "ctas_per_sm": 2, "cache_policy": -1, "mma": -1}  # Conv1dTiledConfig
BIG_TILE_MACS = 1 << 30  # conv1d.h kConv1dTiledBigTileMacs: B*L > 64 with at least this many MACs -> tile 2


class TiledPlan(NamedTuple):
    ok: int = 0
    tile: int = 0
    bm: int = 0
    bn: int = 0
    bk: int = 0
    tm: int = 0
    tn: int = 0
    threads: int = 0
    n_tiles: int = 0
    m_tiles: int = 0
    splits: int = 0
    k_steps: int = 0
    stages: int = 0
    smem_bytes: int = 0
    workspace_floats: int = 0
    counters: int = 0
    cache_policy: int = 0
    mma: int = 0


def tiled_plan(B: int, Cin: int, Cout: int, L: int, K: int, knobs: dict | None = None,
               num_sms: int = 132) -> TiledPlan:
    """conv1d_tiled_plan."""
    c = knobs_with_defaults(knobs, TILED_DEFAULTS)
    if (not -1 <= c["tile"] < len(TILES) or (c["stages"] != -1 and not 2 <= c["stages"] <= 8)
            or not 1 <= c["ctas_per_sm"] <= 8 or not -1 <= c["cache_policy"] <= 3 or not -1 <= c["mma"] <= 1
            or num_sms < 1
            or min(B, Cin, Cout, L, K) < 1):
        return TiledPlan()
    n, r = B * L, Cin * K
    mma = c["mma"] if c["mma"] != -1 else 1
    index = c["tile"] if c["tile"] >= 0 else (
        0 if n <= 32 else (1 if n <= 64 else (2 if mma or n * Cout * r >= BIG_TILE_MACS else 1)))
    bm, bn, bk, tm, tn = TILES[index]
    n_tiles, m_tiles, k_steps = math.ceil(n / bn), math.ceil(Cout / bm), math.ceil(r / bk)
    if m_tiles > 65535 or n_tiles * m_tiles > 2**31 - 1:
        return TiledPlan()
    stage_bytes = 4 * (bm * (bk + 4) + bk * (bn + 8 * mma))  # B rows padded by 8 floats for the mma fragments
    budget = MAX_DYNAMIC_SMEM if c["ctas_per_sm"] == 1 else SMEM_PER_SM // c["ctas_per_sm"] - SMEM_RESERVED_PER_CTA
    stages = c["stages"] if c["stages"] != -1 else (4 if index == 0 or mma else 3)
    while stages > 2 and stages * stage_bytes > budget:
        stages -= 1
    tiles = n_tiles * m_tiles
    splits = max(1, min(min(k_steps, 65535), num_sms * c["ctas_per_sm"] // tiles))
    return TiledPlan(1, index, bm, bn, bk, tm, tn, MMA_THREADS[index] if mma else (bm // tm) * (bn // tn), n_tiles,
                     m_tiles, splits, k_steps, stages, stages * stage_bytes,
                     splits * tiles * bm * bn if splits > 1 else 0, tiles if splits > 1 else 0,
                     c["cache_policy"] if c["cache_policy"] != -1 else (1 if n_tiles == 1 or mma else 0), mma)


def thread_tile(p: TiledPlan) -> tuple[np.ndarray, np.ndarray]:
    """SimtTile: rows (NT x TM) and columns (NT x TN) of its tile that each thread accumulates (interleaved)."""
    mg, ng = p.bm // p.tm, p.bn // p.tn
    tid = np.arange(mg * ng)
    rows = (tid // ng)[:, None] + np.arange(p.tm) * mg
    cols = (tid % ng)[:, None] * 4 + (np.arange(p.tn) // 4) * ng * 4 + np.arange(p.tn) % 4
    return rows, cols


# mma.sync m16n8k8 .tf32 fragments (PTX ISA), lane = 4 g + t: register e of A at (row g + 8 (e % 2),
# col t + 4 (e // 2)), register h of B at (k t + 4 h, n g), accumulator e at (row g + 8 (e // 2), col 2 t + e % 2).
def mma_warp_tile(p: TiledPlan) -> tuple[int, int, int, int]:
    """MmaTile: warps along N, warp tile rows (32) and columns, B's row stride, for the plan's tile."""
    warps_n = p.threads // 32 // (p.bm // 32)
    return warps_n, 32, p.bn // warps_n, p.bn + 8


def thread_elements(p: TiledPlan) -> tuple[np.ndarray, np.ndarray]:
    """Tile rows and columns (NT x E each) of every accumulator of every thread, in the engine's for_each order."""
    if not p.mma:
        rows, cols = thread_tile(p)
        return np.repeat(rows[:, None, :], p.tn, 1).reshape(p.threads, -1), np.repeat(cols, p.tm, 1)
    warps_n, wm, wn, _ = mma_warp_tile(p)
    tid = np.arange(p.threads)[:, None, None, None]
    i, j, e = np.ix_(np.arange(wm // 16), np.arange(wn // 8), np.arange(4))
    warp, g, t = tid // 32, tid % 32 // 4, tid % 4
    rows = (warp // warps_n) * wm + i * 16 + g + (e // 2) * 8
    cols = (warp % warps_n) * wn + j * 8 + 2 * t + e % 2
    rows, cols = np.broadcast_arrays(rows, cols)
    return rows.reshape(p.threads, -1), cols.reshape(p.threads, -1)


def mma_fragment_offsets(p: TiledPlan) -> tuple[np.ndarray, np.ndarray]:
    """Shared-memory float offsets that MmaTile.step reads per warp instruction: A (warps, k8 steps, MT, 4, 32 lanes)
    from the stage's A ([BM][BK+4]) and B (warps, k8 steps, NT8, 2, 32) from its B ([BK][BN+8])."""
    warps_n, wm, wn, sb = mma_warp_tile(p)
    sa = p.bk + 4
    warp, k8, i, e, lane = np.ix_(np.arange(p.threads // 32), np.arange(0, p.bk, 8), np.arange(wm // 16),
                                  np.arange(4), np.arange(32))
    g, t = lane // 4, lane % 4
    a = ((warp // warps_n) * wm + i * 16 + g + (e % 2) * 8) * sa + k8 + t + (e // 2) * 4
    j, h = np.arange(wn // 8)[:, None, None], np.arange(2)[:, None]
    b = (k8 + t + h * 4) * sb + (warp % warps_n) * wn + j * 8 + g
    return a, b


def truncate_tf32(v: np.ndarray) -> np.ndarray:
    """fp32 with the low 13 bits cleared: a TF32 value, and what the tensor core reads of any fp32 operand."""
    return (np.asarray(v, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def split_tf32(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MmaTile's operand split as the tensor core sees it: big = v truncated to TF32, small = (v - big) (exact in
    fp32) truncated to TF32 by the tensor core."""
    big = truncate_tf32(v)
    return big, truncate_tf32(np.asarray(v, np.float32) - big)


def load_a(W: np.ndarray, p: TiledPlan, m0: int, ks: int, avec: bool, counts: np.ndarray) -> np.ndarray:
    """One stage of A ([BM][BK+4], padding columns left NaN): the 16-byte (or 4-byte) copies of the kernel."""
    Cout, R = W.shape
    nt, sa, k0 = p.threads, p.bk + 4, ks * p.bk
    a = np.full((p.bm, sa), np.nan)
    per = 4 if avec else 1
    for v in range(p.bm * p.bk // per // nt):
        idx = np.arange(nt) + v * nt
        row, kq = idx // (p.bk // per), idx % (p.bk // per)
        for e in range(per):
            co, col = m0 + row, k0 + kq * per + e
            ok = (co < Cout) & (col < R)
            assert np.isnan(a[row, kq * per + e]).all()  # every element copied once
            a[row, kq * per + e] = np.where(ok, W[np.minimum(co, Cout - 1), np.minimum(col, R - 1)], 0.0)
            np.add.at(counts, (co[ok], col[ok]), 1)
    assert not np.isnan(a[:, :p.bk]).any()
    return a


def load_b(x: np.ndarray, K: int, p: TiledPlan, n0: int, ks: int) -> np.ndarray:
    """One stage of B ([BK][BN]): X^ gathered with zero fill, (ci, k) advanced without divisions."""
    B, Cin, L = x.shape
    nt, pad, k_stride = p.threads, K // 2, p.threads // p.bn
    tid = np.arange(nt)
    nn, kk0 = tid % p.bn, tid // p.bn
    n = n0 + nn
    n_ok = n < B * L
    nb, nl = np.where(n_ok, n // L, 0), np.where(n_ok, n % L, 0)
    step_ci, step_k = divmod(k_stride, K)
    j = ks * p.bk + kk0
    ci, k = j // K, j % K
    b = np.full((p.bk, p.bn), np.nan)
    for i in range(p.bk * p.bn // nt):
        assert (ci * K + k == j + i * k_stride).all() and (k < K).all()  # the increments track divmod(j, K)
        pos = nl + k - pad
        ok = n_ok & (ci < Cin) & (pos >= 0) & (pos < L)
        assert np.isnan(b[kk0 + i * k_stride, nn]).all()
        b[kk0 + i * k_stride, nn] = np.where(ok, x[nb, np.minimum(ci, Cin - 1), np.clip(pos, 0, L - 1)], 0.0)
        k, ci = k + step_k, ci + step_ci
        ci, k = np.where(k >= K, ci + 1, ci), np.where(k >= K, k - K, k)
    assert not np.isnan(b).any()
    return b


def emulate_tiled(x: np.ndarray, w: np.ndarray, bias: np.ndarray, knobs: dict | None = None, num_sms: int = 132,
                  avec: bool | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """conv1d_tiled_kernel CTA by CTA; returns (y, writes per output, loads per weight)."""
    B, Cin, L = x.shape
    Cout, _, K = w.shape
    R, N = Cin * K, B * L
    p = tiled_plan(B, Cin, Cout, L, K, knobs, num_sms)
    assert p.ok
    avec = R % 4 == 0 if avec is None else avec
    W = w.reshape(Cout, R)
    nt, st = p.threads, p.stages
    rows, cols = thread_elements(p)
    y, writes, reads = np.full((B, Cout, L), np.nan), np.zeros((B, Cout, L), int), np.zeros((Cout, R), int)
    ws = np.full((p.splits, p.n_tiles * p.m_tiles, p.bm * p.bn), np.nan)

    def store_y(co: np.ndarray, col: np.ndarray, val: np.ndarray) -> None:
        ok = (co < Cout) & (col < N)
        bb, ll = col[ok] // L, col[ok] % L
        y[bb, co[ok], ll] = val[ok] + bias[co[ok]]
        np.add.at(writes, (bb, co[ok], ll), 1)
    for nt_i, mt_i in np.ndindex(p.n_tiles, p.m_tiles):
        n0, m0, tile = nt_i * p.bn, mt_i * p.bm, mt_i * p.n_tiles + nt_i
        for split in range(p.splits):
            ks_begin, ks_end = chunk_range(split, p.splits, p.k_steps)
            nks = ks_end - ks_begin
            a_s, b_s, tag = [None] * st, [None] * st, [-1] * st
            # the kernel keeps B's (ci, k) incrementally: stages must be loaded in k-step order, ks_begin first
            for s in range(min(st - 1, nks)):
                a_s[s], b_s[s] = load_a(W, p, m0, ks_begin + s, avec, reads), load_b(x, K, p, n0, ks_begin + s)
                tag[s] = s
            acc = np.zeros(rows.shape)
            read_slot, write_slot = 0, st - 1
            for i in range(nks):
                if i + st - 1 < nks:
                    assert tag[write_slot] in (-1, i - 1)  # refilled after the barrier that ends step i - 1
                    assert max(tag) == i + st - 2          # ... and in k-step order
                    ks = ks_begin + i + st - 1
                    a_s[write_slot], b_s[write_slot] = load_a(W, p, m0, ks, avec, reads), load_b(x, K, p, n0, ks)
                    tag[write_slot] = i + st - 1
                assert tag[read_slot] == i
                acc += stage_product(a_s[read_slot][rows, :p.bk], b_s[read_slot][:, cols], p.mma)
                read_slot, write_slot = (read_slot + 1) % st, (write_slot + 1) % st
            if p.splits == 1:
                store_y(m0 + rows, n0 + cols, acc)
                continue
            local = (rows * p.bn + cols).reshape(-1)  # the float4 / float2 stores, element-wise
            assert np.isnan(ws[split, tile, local]).all() and np.unique(local).size == p.bm * p.bn
            ws[split, tile, local] = acc.reshape(-1)
        if p.splits > 1:  # the last CTA of the tile: float4 e = tid + p*NT, splits in order
            e = 4 * (np.arange(nt)[:, None] + np.arange(p.bm * p.bn // 4 // nt) * nt)
            e = e[:, :, None] + np.arange(4)
            total = sum(ws[sp, tile][e] for sp in range(p.splits))
            store_y(m0 + e // p.bn, n0 + e % p.bn, total)
    return y, writes, reads


def stage_product(a: np.ndarray, b: np.ndarray, mma: int) -> np.ndarray:
    """One k-step of every accumulator: a (NT, E, BK) and b (BK, NT, E) gathered at the accumulators' rows/columns;
    fp64 sums of exact products, those of the 3xTF32 split on the mma engine (a_s b_b + a_b b_s + a_b b_b)."""
    if not mma:
        return np.einsum("tek,kte->te", a, b)
    (ab, as_), (bb, bs) = split_tf32(a), split_tf32(b)
    ab, as_, bb, bs = (v.astype(np.float64) for v in (ab, as_, bb, bs))
    return sum(np.einsum("tek,kte->te", u, v) for u, v in ((as_, bb), (ab, bs), (ab, bb)))


def tiled_weight_reads(Cin: int, Cout: int, K: int, B: int, L: int, knobs: dict | None = None) -> np.ndarray:
    """Loads of each weight by the CTAs of one N tile (all N tiles load the same): A_VECS 16-byte copies per
    thread and k-step over the splits' k-step ranges. Must be all ones."""
    p = tiled_plan(B, Cin, Cout, L, K, knobs)
    R = Cin * K
    ks = np.array([k for s in range(p.splits) for k in range(*chunk_range(s, p.splits, p.k_steps))])
    mt, kstep, tid, v, e = np.ix_(np.arange(p.m_tiles), ks, np.arange(p.threads),
                                  np.arange(p.bm * p.bk // 4 // p.threads), np.arange(4))
    idx = tid + v * p.threads
    co = mt * p.bm + idx // (p.bk // 4)
    col = kstep * p.bk + (idx % (p.bk // 4)) * 4 + e
    co, col = np.broadcast_arrays(co, col)
    ok = (co < Cout) & (col < R)
    return np.bincount((co * R + col)[ok], minlength=Cout * R).reshape(Cout, R)


def tiled_output_writes(B: int, Cin: int, Cout: int, L: int, K: int, knobs: dict | None = None) -> np.ndarray:
    """Writes of each y element: the thread-tile mapping (one split) or the last CTA's float4 mapping (splits)."""
    p = tiled_plan(B, Cin, Cout, L, K, knobs)
    N = B * L
    ntile, mtile = np.ix_(np.arange(p.n_tiles), np.arange(p.m_tiles))
    if p.splits == 1:
        rows, cols = thread_elements(p)
        co, col = mtile[:, :, None, None] * p.bm + rows[None, None], ntile[:, :, None, None] * p.bn + cols[None, None]
    else:
        e = 4 * (np.arange(p.threads)[:, None] + np.arange(p.bm * p.bn // 4 // p.threads) * p.threads)
        e = (e[:, :, None] + np.arange(4))[None, None]
        co, col = mtile[:, :, None, None, None] * p.bm + e // p.bn, ntile[:, :, None, None, None] * p.bn + e % p.bn
    co, col = np.broadcast_arrays(co, col)
    ok = (co < Cout) & (col < N)
    return np.bincount((co * N + col)[ok], minlength=Cout * N).reshape(Cout, N)
