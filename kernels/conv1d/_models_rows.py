"""NumPy model of stream_rows.cu (conventions as in _models.py): the planner conv1d_rows_plan and a CTA-by-CTA
emulation of conv1d_rows_kernel (shared-memory layout, the bulk copies warp 0 issues and each chunk's mbarrier byte
count, the per-thread column loop with its incremental (ci, k), the x gather, the reduce-scatter, the sum over warps)
at any of its thread counts (the `row_threads` knob: the kernel's THREADS template parameter).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._models import MAX_DYNAMIC_SMEM, reduce_scatter, stream_writers

ROWS_THREAD_COUNTS = (256, 512, 1024)  # THREADS instantiated in stream_rows.cu (conv1d_rows_plan accepts these)
ROWS_LONG_SLAB = 128 * 1024  # conv1d.h kConv1dRowsLongSlab
ROWS_MAX_CHUNKS = 32               # conv1d.h kConv1dRowsMaxChunks
ROWS_MAX_ACC = 32                  # RC * NO accumulators per thread (the warp-totals row holds NV <= 32)
ROWS_TX_LIMIT = 1 << 20            # an mbarrier's tx-count range (bytes per phase)


class RowsPlan(NamedTuple):
    ok: int = 0
    outputs: int = 0
    rows_per_cta: int = 0
    ctas: int = 0
    chunks: int = 0
    chunk_cols: int = 0
    threads: int = 0
    ahead: int = 0
    smem_bytes: int = 0


def rows_knobs_ok(chunks: int, threads: int, ahead: int) -> bool:
    """conv1d_rows_knobs_ok: row_chunks, row_threads, row_ahead in range (0 = the rule)."""
    return 0 <= chunks <= ROWS_MAX_CHUNKS and 0 <= ahead <= ROWS_MAX_CHUNKS and threads in (0, *ROWS_THREAD_COUNTS)


def rows_plan(B: int, Cin: int, Cout: int, L: int, K: int, elem_bytes: int, chunks: int, threads: int,
              num_sms: int = 132, ahead: int = 0) -> RowsPlan:
    """conv1d_rows_plan; chunks, threads, ahead: 0 = the rule (by the bytes of w per CTA)."""
    if (elem_bytes not in (2, 4) or not rows_knobs_ok(chunks, threads, ahead) or num_sms < 1
            or min(B, Cin, Cout, L, K) < 1):
        return RowsPlan()
    bl, r = B * L, Cin * K
    if bl > 16 or r * elem_bytes % 16 != 0:
        return RowsPlan()
    outputs = 4 if bl <= 4 else (8 if bl <= 8 else 16)
    rc_max = ROWS_MAX_ACC // outputs
    want = (Cout + num_sms - 1) // num_sms  # about one CTA per SM
    rows_per_cta = 1
    while rows_per_cta < want and rows_per_cta < rc_max:
        rows_per_cta *= 2
    ctas = (Cout + rows_per_cta - 1) // rows_per_cta
    longer = rows_per_cta * r * elem_bytes >= ROWS_LONG_SLAB
    chunks = chunks or (4 if longer else 1)
    threads = threads or (512 if longer else 256)
    ahead = ahead or (2 if longer else chunks)
    vec = 16 // elem_bytes  # chunk columns: whole 16-byte vectors
    chunk_cols = ((r + chunks - 1) // chunks + vec - 1) // vec * vec
    n_chunks = (r + chunk_cols - 1) // chunk_cols
    nbytes = 16 * ((n_chunks + 1) // 2) + threads // 32 * 32 * 4 + rows_per_cta * r * elem_bytes + bl * Cin * 4
    if nbytes > MAX_DYNAMIC_SMEM:
        return RowsPlan()
    return RowsPlan(1, outputs, rows_per_cta, ctas, n_chunks, chunk_cols, threads, min(ahead, n_chunks), nbytes)


def rows_smem_layout(p: RowsPlan, R: int, elem_bytes: int) -> dict[str, int]:
    """Byte offsets of the kernel's shared-memory regions (bars, red, slab, xs) and the end: its pointer math on
    `extern __shared__ uint4 smem[]`."""
    red = 16 * ((p.chunks + 1) // 2)             # smem + (chunks + 1) / 2 uint4s
    slab = red + p.threads // 32 * 32 * 4        # red + kWarps = THREADS / 32 rows of float[32]
    xs = slab + p.rows_per_cta * R * elem_bytes  # slab + RC * R elements of T
    return {"bars": 0, "red": red, "slab": slab, "xs": xs}


def emulate_rows(x: np.ndarray, w: np.ndarray, bias: np.ndarray, elem_bytes: int = 4, chunks: int = 4,
                 threads: int = 256, num_sms: int = 132, broken: str | None = None, ahead: int = 0) -> np.ndarray:
    """conv1d_rows_kernel CTA by CTA with THREADS = `threads` (threads vectorized). Checks the layout against the
    plan's smem_bytes, that warp 0's copies write every slab element of rows < rows-in-CTA exactly once (the rest
    zeroed), with 16-byte sizes and addresses, and that each chunk's expect_tx equals the bytes of its copies; that
    the incremental (ci, k) equals (j / K, j % K); that every warp-total slot (THREADS / 32 rows) and every y element
    is written exactly once; with `ahead` (row_ahead) D in 1..chunks-1, that warp 0 issues chunks 0..D-1 first and
    chunk c + D after chunk c's wait, and that every chunk's copies are all issued before its wait.
    `broken` (tests only): "k_carry" drops the (ci, k) carry (and its check), "bounds" lets the gather read at
    l + k - pad == L: the numeric comparison must catch both. Reads past the x region give NaN."""
    B, Cin, L = x.shape
    Cout, _, K = w.shape
    p = rows_plan(B, Cin, Cout, L, K, elem_bytes, chunks, threads, num_sms, ahead)
    assert p.ok
    NO, RC, T = p.outputs, p.rows_per_cta, p.threads
    warps = T // 32
    D = p.ahead  # chunks in flight (RowsArgs.ahead)
    assert 1 <= D <= p.chunks
    NV = RC * NO
    assert NV <= ROWS_MAX_ACC
    R, BL, pad = Cin * K, B * L, K // 2
    lay = rows_smem_layout(p, R, elem_bytes)
    assert lay["red"] >= 8 * p.chunks and lay["slab"] % 16 == 0  # the barriers fit; copies land 16-byte aligned
    assert lay["xs"] % 4 == 0 and lay["xs"] + BL * Cin * 4 == p.smem_bytes <= MAX_DYNAMIC_SMEM
    wflat = w.reshape(-1)
    nx = BL * Cin
    tid = np.arange(T)
    # this thread's NO outputs (the same for every thread): xs offset xo[o] + ci*L + k, valid iff xl[o] + k in [0, L)
    o = np.arange(NO)
    b_o, l_o = o // L, o - (o // L) * L
    xo = b_o * Cin * L + l_o - pad
    xl = np.where(o < BL, l_o - pad, -(1 << 20))
    step_ci = T // K
    step_k = T - step_ci * K
    y = np.full((B, Cout, L), np.nan)
    y_writes = np.zeros((B, Cout, L), int)
    for cta in range(p.ctas):
        row0 = cta * RC
        rows = min(RC, Cout - row0)
        # 1. warp 0: lane 0 declares each chunk's bytes, then lanes issue the copies of chunks 0..D-1 (issue_chunk:
        # lane r copies row r of chunk c); chunk c + D follows chunk c's wait (step 3)
        expect = [rows * min(p.chunk_cols, R - c * p.chunk_cols) * elem_bytes for c in range(p.chunks)]
        assert max(expect) < ROWS_TX_LIMIT
        tx = [0] * p.chunks
        slab = np.full(RC * R, np.nan)
        writes = np.zeros(RC * R, int)

        def issue(c: int, rows: int = rows, row0: int = row0, slab: np.ndarray = slab, writes: np.ndarray = writes,
                  tx: list[int] = tx) -> None:  # this CTA's state, bound now
            for lane in range(32):
                if lane < rows:
                    col = c * p.chunk_cols
                    cols = min(p.chunk_cols, R - col)
                    off = lane * R + col
                    src = row0 * R + off
                    nbytes = cols * elem_bytes
                    assert cols > 0 and nbytes % 16 == 0
                    assert (lay["slab"] + off * elem_bytes) % 16 == 0 and src * elem_bytes % 16 == 0  # aligned w
                    slab[off:off + cols] = wflat[src:src + cols]
                    writes[off:off + cols] += 1
                    tx[c] += nbytes
        for c in range(D):
            issue(c)
        # 2. x as fp32 (threads i = tid, tid + THREADS, ...: all of [0, nx)); a NaN guard past it ("not x")
        xs = np.concatenate([x.reshape(-1).astype(np.float64), np.full(T, np.nan)])
        # rows past Cout (last CTA only): zeroed, never copied
        for i0 in range(rows * R, RC * R, T):
            i = i0 + tid[: min(T, RC * R - i0)]
            slab[i] = 0.0
            writes[i] += 1
        # 3. per chunk: columns j = j0 + tid + THREADS i
        acc = np.zeros((T, NV))
        for c in range(p.chunks):
            assert tx[c] == expect[c], (cta, c)  # the barrier's one phase completes: every copy of chunk c issued
            if c + D < p.chunks:
                issue(c + D)
            j0 = c * p.chunk_cols
            j1 = min(R, j0 + p.chunk_cols)
            j = j0 + tid
            ci = j // K
            k = j - ci * K
            while (j < j1).any():
                act = j < j1
                pos = xl[None, :] + k[:, None]
                ok = (pos >= 0) & ((pos <= L) if broken == "bounds" else (pos < L))  # unsigned compare < L
                ok &= act[:, None]
                idx = np.where(ok, xo[None, :] + ci[:, None] * L + k[:, None], 0)
                assert (idx < nx + T).all()
                xv = np.where(ok, xs[idx], 0.0)
                for r in range(RC):
                    wv = np.where(act, slab[r * R + np.minimum(j, j1 - 1)], 0.0)
                    acc[:, r * NO:(r + 1) * NO] += wv[:, None] * xv
                j = j + T
                ci = ci + step_ci
                k = k + step_k
                if broken != "k_carry":
                    carry = k >= K
                    k = np.where(carry, k - K, k)
                    ci = np.where(carry, ci + 1, ci)
                    assert (ci == j // K).all() and (k == j % K).all()
        assert tx == expect and (writes == 1).all(), (cta, rows)  # copied or zeroed, once; copies for rows < rows
        # 4. warp totals (reduce-scatter), the warps' totals in order, bias, y
        red = np.full((warps, 32), np.nan)
        red_writes = np.zeros((warps, 32), int)
        for warp in range(warps):
            kept = reduce_scatter(acc[warp * 32:(warp + 1) * 32])
            for lane, i, index in stream_writers(NV):
                red[warp, index] = kept[lane, i]
                red_writes[warp, index] += 1
        assert (red_writes[:, :NV] == 1).all() and not red_writes[:, NV:].any()
        for t in range(NV):
            r, o_ = t // NO, t % NO
            if r < rows and o_ < BL:
                s = 0.0
                for wp in range(warps):
                    s += red[wp, t]
                b, ll, row = o_ // L, o_ % L, row0 + r
                y[b, row, ll] = s + bias[row]
                y_writes[b, row, ll] += 1
    assert (y_writes == 1).all()
    return y
