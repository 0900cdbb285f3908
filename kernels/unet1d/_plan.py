"""How each op's segments (`_ops.py`) are split over CTAs (their weights' layout: `_pack.py`).

Planning a segment (rows x cin x K weights): CTAs in proportion to its share of the op's bytes (the op's grid
is about one wave of `sms` CTAs), `rc` rows per CTA in blocks of 8 (the MMA's N); stages of `cb` channels in
blocks of 8 (its K) (4-16 KB, 16-byte multiples for the bulk copies, little zero padding), small enough that a ring
of several fits the shared-memory budget beside X, which keeps two ops' CTAs on one SM.
"""
from __future__ import annotations

import itertools
import math

from ._ops import Op, Segment, Store

THREADS = 512  # the most threads of a CTA
MAX_RING = 8
MAX_GROUPS = 32
MAX_NB = 16  # row blocks of 8 per CTA (the kernel's largest instantiation)
SMEM_BUDGET = 113 * 1024  # two CTAs per SM (228 KB, 1 KB reserved per CTA): the next op's CTAs fit beside
SMEM_MAX = 227 * 1024  # one CTA's opt-in limit on sm_90
STAGE_TARGET = 24 * 1024  # a warp's share of a stage must outweigh the stage's wait, barrier and refill
STAGE_MIN = 4 * 1024
RING_WANT = 3
SMS = 132
SIMT_RPT = 2  # rows per thread of the SIMT form (unet1d_stages.cuh run_segment_simt)
SIMT_RC_MAX = THREADS * SIMT_RPT // 32  # rows per CTA while each row pair still has a whole warp


def threads_for(nb: int) -> int:
    """Threads per CTA (unet1d.cu threads_for): 512 while the accumulators of nb row blocks fit 64 registers."""
    return 512 if next_pow2(nb) <= 4 else 256


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _align128(n: int) -> int:
    return (n + 127) & ~127


def smem_bytes(op: Op) -> int:
    """The kernel's shared-memory carve (unet1d_device.cuh `carve`): barriers, stats, reduction, coefficients, ring,
    X."""
    stage = max(s.stage_bytes for s in op.segs)
    red = max(s.rc * s.l_out * (2 if s.simt == 2 else 1) for s in op.segs)
    total = 128 + _align128(2 * MAX_GROUPS * 8) + _align128((op.threads // 32) * red * 4)
    total += _align128(op.coef * 16) + _align128(op.ring * stage) + _align128(op.cin_pad * op.l_in * 4)
    return total


def _channels_per_stage(cin: int, rc: int, k: int, stage_target: int, warps: int, wbytes: int = 4) -> int:
    """cb: a multiple of 8 (one MMA channel block) near `stage_target` bytes per stage, preferring padding under
    1/128 of cin, then channel blocks in multiples of the warps (each warp takes blocks), then the least padding,
    then the target."""
    target = max(8 * warps, stage_target // (rc * k * wbytes) // 8 * 8)
    if cin <= target:
        return -(-cin // 8) * 8
    best = None
    for cb in range(8, target + 1, 8):
        if cb < target // 2:
            continue
        waste = -(-cin // cb) * cb - cin
        key = (waste > cin // 128, (cb // 8) % warps != 0, waste, abs(cb - target))
        if best is None or key < best[0]:
            best = (key, cb)
    return best[1]


def plan_op(op: Op, sms: int = SMS, wbf16: bool = False) -> None:
    """Fill the CTA split, stages, ring, shared memory and grid of `op` (segments' rows/cin/k/out set).

    Stages are sized so that at least RING_WANT fit beside X and the coefficients within SMEM_BUDGET (two
    ops' CTAs per SM); an op whose X alone leaves no room for that goes over the budget (up to SMEM_MAX)
    rather than stream its weights one stage at a time. Such an op has one CTA per SM, so its CTAs beyond `sms`
    would run as a second wave after the first has streamed its share: its SIMT rows per CTA are then rounded up
    instead of to the nearest power of two. A block's 1x1 residual conv rides on its first conv's CTAs where
    `rider_fits` (one group of CTAs with the same rows of both, not two groups with unequal shares) and those CTAs
    still fill 7/8 of the SMs. `wbf16`: SIMT segments take bf16 weights (half the bytes per stage); the others
    keep fp32 (exact: a bf16 value is a TF32 one)."""
    ride = rider_fits(op)
    _plan_op(op, sms, round_up=False, ride=ride, wbf16=wbf16)
    if ride and (op.segs[0].simt != 2 or op.grid < sms * 7 // 8):  # the carrier runs SIMT, on most SMs
        ride = False
        _plan_op(op, sms, round_up=False, ride=False, wbf16=wbf16)
    if op.smem_bytes > SMEM_BUDGET and op.grid > sms and op.batch_grid == 1:
        _plan_op(op, sms, round_up=True, ride=ride, wbf16=wbf16)


def rider_fits(op: Op) -> bool:
    """Whether segment 1 can ride on segment 0's CTAs (unet1d.h UnetSegment::simt = 2): at B = 1, a SIMT-shaped
    conv of k = 3 or 5 and a 1x1 conv of the same X with the same rows and columns (a block's residual conv)."""
    if len(op.segs) != 2 or op.batch_grid != 1:
        return False
    a, r = op.segs
    return (simt_shape(a, op.l_in) and a.k in (3, 5) and r.k == 1 and simt_shape(r, op.l_in)
            and (r.rows, r.cin, r.l_out) == (a.rows, a.cin, a.l_out))


def _plan_op(op: Op, sms: int, round_up: bool, ride: bool, wbf16: bool) -> None:
    total = sum(s.weight_bytes for s in op.segs)
    lout = max(s.l_out for s in op.segs)
    if any(s.k not in (1, 2, 3, 5) for s in op.segs):
        raise ValueError(f"op {op.name}: kernel sizes other than 1, 2, 3 and 5 are not supported by the kernels path")
    if lout > 32:
        raise ValueError(f"op {op.name}: {lout} output columns > 32 are not supported by the kernels path")
    op.cols = 8 if lout <= 8 else 16 if lout <= 16 else 32
    nb_max = MAX_NB if op.cols <= 16 else 2  # two column tiles of more row blocks would spill registers
    op.coef = sum(s.channels for s in op.srcs if s.transformed)
    op.cin_pad, op.ring = op.cin, 0
    for s in op.segs:  # rows per CTA first: the fixed part of the carve depends on them
        s.simt = s.rider = s.wbf16 = 0
        want = max(1, round(sms * (total if ride else s.weight_bytes) / total))
        per_cta = -(-s.rows // want)
        if op.cols == 8 and simt_shape(s, op.l_in) and op.batch_grid == 1:
            # SIMT at B = 1: rows in pairs, a power of two nearest the share (not rounded up to 8: 1024 rows over
            # 126 CTAs take 128 CTAs, not 64), at least 16 outputs (the smallest GroupNorm partial the plans use:
            # blog's 512 rows at L = 4 take 128 CTAs of 4), at most 32 (512 threads).
            # (With a CTA per batch element the grid is already several waves: smaller shares only multiply
            # the prologues, measured 855 -> 928 us at blog B = 8.)
            log2 = math.ceil(math.log2(per_cta)) if round_up else round(math.log2(per_cta))
            s.rc = max(2, 16 // s.l_out, min(SIMT_RC_MAX, 1 << max(0, log2)))
        else:
            s.rc = min(8 * nb_max, -(-per_cta // 8) * 8)
        s.nb = -(-s.rc // 8)
        s.ncta = -(-s.rows // s.rc)
        s.cb = 0
    op.threads = threads_for(max(s.nb for s in op.segs))
    for s in op.segs:  # a SIMT-shaped segment beside one that needs 256 threads goes back to the MMA form
        s.simt = int(simt_fits(op, s))
        if not s.simt and s.rc % 8:
            s.rc = 8 * s.nb
            s.ncta = -(-s.rows // s.rc)
    if ride and op.segs[0].simt:
        a, r = op.segs
        a.simt, r.rider, r.rc, r.nb, r.ncta = 2, 1, a.rc, a.nb, a.ncta
    for s in op.segs:
        s.wbf16 = int(wbf16 and (s.simt > 0 or s.rider))  # (a rider's weights are its carrier's)
    fixed = smem_bytes(op) + 4 * 128  # alignment slack of the padded X
    room = SMEM_BUDGET - fixed if SMEM_BUDGET - fixed >= RING_WANT * STAGE_MIN else SMEM_MAX - fixed
    stage_target = max(STAGE_MIN, min(STAGE_TARGET, room // RING_WANT))
    cta0 = 0
    for s in op.segs:
        if s.rider:  # segment 0's rows, stages and CTAs; cta0 past the grid: no CTA runs it by itself
            a = op.segs[0]
            s.cb, s.nstages, s.cta0 = a.cb, a.nstages, cta0
            continue
        s.cb = _channels_per_stage(s.cin, s.rc, s.taps, stage_target, op.threads // 32, 2 if s.wbf16 else 4)
        s.nstages = -(-s.cin // s.cb)
        s.cta0, cta0 = cta0, cta0 + s.ncta
    op.cin_pad = max(s.nstages * s.cb for s in op.segs)
    stage = max(s.stage_bytes for s in op.segs)
    fixed = smem_bytes(op)
    limit = SMEM_BUDGET if SMEM_BUDGET - fixed >= (RING_WANT - 1) * stage else SMEM_MAX
    op.ring = max(1, min(MAX_RING, max(s.nstages for s in op.segs), (limit - fixed) // stage))
    op.smem_bytes = smem_bytes(op)
    op.grid = op.batch_grid * cta0
    if op.smem_bytes > SMEM_MAX:
        raise ValueError(f"op {op.name}: needs {op.smem_bytes} bytes of shared memory (> {SMEM_MAX})")
    for src in op.srcs:
        if src.gamma is not None and (src.groups > MAX_GROUPS or src.channels % src.groups):
            raise ValueError(f"op {op.name}: {src.groups} groups over {src.channels} channels not supported")


def simt_shape(s: Segment, l_in: int) -> bool:
    """A 'same' conv (stride 1, pad k // 2, odd k) of 4 or 8 output columns: a tensor-core tile would be at most
    half used, so the SIMT form's FMAs take fewer instructions."""
    return s.l_out == l_in and s.l_out in (4, 8) and s.stride == 1 and s.k in (1, 3, 5) and s.pad == s.k // 2


def simt_fits(op: Op, s: Segment) -> bool:
    """Whether segment `s` runs in the SIMT form: its shape, and its rows in pairs over whole warps of 512 threads."""
    tg = op.threads * SIMT_RPT // s.rc if (op.threads * SIMT_RPT) % s.rc == 0 else 0  # threads per row pair
    return op.cols == 8 and op.threads == THREADS and simt_shape(s, op.l_in) and tg >= 32 and tg % 32 == 0


def partial_outputs(seg: Segment) -> int:
    """Consecutive outputs per GroupNorm partial that segment `seg` stores (unet1d_stages.cuh store_segment): the
    largest power of two up to 32 that divides a CTA's rc x l_out outputs, so that no partial straddles two CTAs."""
    n = seg.rc * seg.l_out
    return min(32, n & -n)


def partials_fit(prev: Op, op: Op) -> bool:
    """Whether `op`'s source 0 can take its GroupNorm statistics from `prev`'s partials (unet1d.h stat_in):
    its raw values are exactly `prev`'s segment 0 output as (B, C, L), partials never straddle a group, a group
    has at most 32 of them and a warp of its own."""
    s, g = op.srcs[0], prev.segs[0]
    if s.gamma is None or s.kind or s.raw is None or s.raw != g.out or g.out.offset:
        return False
    if any(o.out.name == g.out.name for o in prev.segs[1:]) or prev.batch_grid != op.batch_grid:
        return False
    L, cpg, n = op.l_in, s.channels // s.groups, partial_outputs(g)
    layout = (g.ostep, g.ophase, g.ol, g.oc, g.l_out, g.ob, g.rows) == (1, 0, 1, L, L, s.channels * L, s.channels)
    return (layout and (s.sb, s.sc, s.sl) == (s.channels * L, L, 1) and g.rows * L % n == 0
            and cpg * L % n == 0 and cpg * L // n <= 32 and s.groups <= op.threads // 32)


def link_stats(ops: list[Op], store: Store) -> None:
    """Where an op's source 0 is normalised from the previous op's output, have that op store the GroupNorm
    partials and this one combine them (a buffer `<raw>.stat` of 2 floats per partial)."""
    for prev, op in itertools.pairwise(ops):
        if partials_fit(prev, op):
            g = prev.segs[0]
            op.stat_in_n = prev.stat_out_n = partial_outputs(g)
            size = 2 * op.batch_grid * g.rows * g.l_out // op.stat_in_n
            prev.stat_out = op.stat_in = store.add(f"{g.out.name}.stat", size)
