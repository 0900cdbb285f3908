"""Ops of the kernels path as data (mirroring unet1d.h) and how each op's segments are split over CTAs (their
weights' layout: `_pack.py`).

Buffers are referred to by name (`Buf`), resolved later either to device pointers (`_launch.py`) or to torch
views (`_emulate.py`, the CPU model of the kernel that the tests run), so one op list serves both.

Planning a segment (rows x cin x K weights): CTAs in proportion to its share of the op's bytes (the op's grid
is about one wave of `sms` CTAs), `rc` rows per CTA in blocks of 8 (the MMA's N); stages of `cb` channels in
blocks of 8 (its K) (4-16 KB, 16-byte multiples for the bulk copies, little zero padding), small enough that a ring
of several fits the shared-memory budget beside X, which keeps two ops' CTAs on one SM.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch

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


@dataclass(frozen=True)
class Buf:
    """`name`'s storage plus `offset` elements (a workspace activation, a parameter, or an I/O tensor)."""

    name: str
    offset: int = 0


@dataclass
class Source:
    channels: int
    raw: Buf | None = None
    sb: int = 0
    sc: int = 0
    sl: int = 0
    res: Buf | None = None
    gamma: Buf | None = None
    beta: Buf | None = None
    groups: int = 1
    act: int = 0
    film: int = 0  # 0 none, 1 scale and shift, 2 shift only
    film_a: Buf | None = None
    film_b: Buf | None = None
    film_off: int = 0
    film_ld: int = 0
    kind: int = 0  # 0 tensor, 1 sin/cos embedding of t[l]
    t: Buf | None = None
    num_t: int = 0
    early: int = 0  # raw values written two or more ops back (or before the forward): read before the wait
    res_early: int = 0
    coef_early: int = 0

    @property
    def transformed(self) -> bool:
        return self.gamma is not None or bool(self.act) or bool(self.film) or self.res is not None


@dataclass
class Segment:
    rows: int
    cin: int
    k: int
    out: Buf
    ob: int
    oc: int
    ol: int
    l_out: int
    pad: int = 0
    stride: int = 1
    ostep: int = 1
    ophase: int = 0
    w: Buf | None = None  # packed: [ncta][nstages][rc][cb][k]
    bias: Buf | None = None  # [ncta * rc]
    rc: int = 0
    cb: int = 0
    nstages: int = 0
    cta0: int = 0
    ncta: int = 0
    nb: int = 0  # row blocks of 8 per CTA (rc = 8 nb; the SIMT form: rc a power of two, nb = ceil(rc / 8))
    simt: int = 0  # 1: fp32 FMAs on CUDA cores (unet1d.h UnetSegment::simt), weights packed for them; 2: that,
    #                and the CTAs also compute the op's segment 1 (a 1x1 conv of the same X) from tap k
    rider: int = 0  # 1: computed by segment 0's CTAs (its simt = 2); no CTAs of its own, no packed weights
    wbf16: int = 0  # 1: packed weights in bf16 (SIMT segments of a bf16 net: unet1d.h UnetSegment::wbf16)

    @property
    def weight_bytes(self) -> int:
        return self.rows * self.cin * self.k * 4

    @property
    def taps(self) -> int:
        """Taps per (row, channel) in the packed weights: k, plus the rider's one where this segment carries it."""
        return self.k + (self.simt == 2)

    @property
    def stage_elems(self) -> int:
        return self.rc * self.cb * self.taps

    @property
    def stage_bytes(self) -> int:
        return self.stage_elems * (2 if self.wbf16 else 4)


@dataclass
class Op:
    name: str
    srcs: list[Source]
    segs: list[Segment]
    l_in: int
    batch_grid: int
    mat: Buf | None = None
    cin_pad: int = 0
    cols: int = 0  # output columns the MMA tiles cover: 8, 16 or 32
    threads: int = 0
    ring: int = 0
    coef: int = 0
    smem_bytes: int = 0
    grid: int = 0
    notes: dict = field(default_factory=dict)
    stat_out: Buf | None = None  # segment 0 also writes GroupNorm partials (float2 per partial_outputs) for the next op
    stat_in: Buf | None = None  # source 0's GroupNorm statistics combined from the previous op's partials
    stat_in_n: int = 0  # outputs per partial of stat_in (its producer's stat_out_n)
    stat_out_n: int = 0  # outputs per partial of stat_out (partial_outputs of segment 0)

    @property
    def cin(self) -> int:
        return sum(s.channels for s in self.srcs)


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


class Store:
    """Named flat regions of one tensor, each starting on a 256-byte boundary."""

    def __init__(self, align: int = 64):
        self.align = align
        self.parts: list[tuple[str, torch.Tensor | int]] = []
        self.offsets: dict[str, int] = {}
        self.size = 0

    def add(self, name: str, data: torch.Tensor | int) -> Buf:
        """Reserve `data` elements (an int) or place a tensor's values; returns the region's Buf."""
        if name in self.offsets:
            raise ValueError(f"buffer {name!r} declared twice")
        n = data if isinstance(data, int) else data.numel()
        self.offsets[name] = self.size
        self.parts.append((name, data))
        self.size += math.ceil(max(n, 1) / self.align) * self.align
        return Buf(name)

    def materialize(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        out = torch.zeros(self.size, dtype=dtype, device=device)
        for name, data in self.parts:
            if isinstance(data, torch.Tensor):
                o = self.offsets[name]
                out[o:o + data.numel()] = data.reshape(-1).to(dtype)
        return out
