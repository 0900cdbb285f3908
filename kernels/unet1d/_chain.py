"""Runs of small consecutive ops as one launch on one cluster (unet1d_chain.h): which ops, the shared-memory slots
that carry their activations from op to op, their weights' layout, and the ctypes mirror of the C structs.

At B = 1 an op of a few hundred channels (blog's 256-channel head and tail, up to 1.3 MB of weights) spends ~7 us as
a grid, nearly all of it the latency chain of its prologue and the grid boundary; a chain of them on one cluster
exchanges each output through distributed shared memory and one cluster barrier instead.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

import torch

from ._plan import SMEM_MAX, Buf, Op, Segment

CTAS = int(os.environ.get("DPK_UNET1D_CHAIN", "0"))  # CTAs of a chain's cluster (0: no chains; 8 or 16)
MAX_LINKS = 8  # unet1d_chain.h UNET_CHAIN_MAX_LINKS
LINK_BYTES = 496  # sizeof(UnetLink): the kernel copies the links to shared memory
MAX_RING = 8
HALO = 4
MAX_GROUPS = 16  # a warp per group
CIN_MAX = 256
WEIGHT_MAX = 2 << 20  # bytes of an op's weights: beyond it the op's stream wants the whole GPU's bandwidth
STAGE_TARGET = 32 * 1024
SHAPES = {(k, lo, 1) for k in (1, 2, 3, 5) for lo in (4, 8, 16)} | {(3, 8, 2), (3, 4, 2)}  # (k, l_out, stride)


@dataclass
class LinkSeg:
    seg: Segment
    rc: int
    cb: int
    nstages: int
    w: Buf | None = None  # [ctas][nstages][rc][k][cb]
    bias: Buf | None = None  # [rows]
    out_global: bool = True
    out_slot: int = -1


@dataclass
class Link:
    op: Op
    segs: list[LinkSeg]
    src_slot: list[int] = field(default_factory=lambda: [-1, -1])
    res_slot: list[int] = field(default_factory=lambda: [-1, -1])
    mat_slot: int = -1
    mat_global: bool = False


@dataclass
class Chain:
    first: int  # index of its first op in the program
    links: list[Link]
    ctas: int
    nslots: int = 0
    slot_floats: int = 0
    stage_floats: int = 0
    ring: int = 0
    cin_max: int = 0
    l_max: int = 0
    smem_bytes: int = 0

    @property
    def ops(self) -> list[Op]:
        return [link.op for link in self.links]


def rows_per_cta(rows: int, ctas: int) -> int | None:
    """Rows of a segment per CTA: up to 16 (a warp each), or 32 (two per warp); None beyond."""
    rc = -(-rows // ctas)
    return rc if rc <= 16 else 32 if rc <= 32 else None


def link_fits(op: Op, ctas: int) -> bool:
    """Whether `op` can run inside a chain of `ctas` CTAs (unet1d_chain.cu's shapes, B = 1, small weights)."""
    if op.batch_grid != 1 or op.cin > CIN_MAX or op.l_in not in (4, 8, 16):
        return False
    if sum(s.weight_bytes for s in op.segs) > WEIGHT_MAX:
        return False
    for s in op.srcs:
        if s.kind != 0 or s.raw is None or (s.gamma is not None and (s.groups > MAX_GROUPS or s.channels % s.groups)):
            return False
    return all((s.k, s.l_out, s.stride) in SHAPES and rows_per_cta(s.rows, ctas) for s in op.segs)


def _outputs(op: Op) -> list[tuple[Buf, int, int]]:
    """What `op` writes: (buffer, element offset of (c, l) = c * oc + l * ol as (oc, ol))."""
    out = [(s.out, s.oc, s.ol) for s in op.segs]
    return out + ([(op.mat, op.l_in, 1)] if op.mat is not None else [])


def _reads(op: Op) -> list[tuple[Buf, int, int, str, int]]:
    """What `op` reads: (buffer, the (c, l) layout (sc, sl), role, source index)."""
    out = []
    for i, s in enumerate(op.srcs):
        if s.raw is not None:
            out.append((s.raw, s.sc, s.sl, "raw", i))
        if s.res is not None:
            out.append((s.res, op.l_in, 1, "res", i))
    return out


def find_chains(ops: list[Op], batch: int, ctas: int = CTAS) -> list[tuple[int, int]]:
    """Maximal runs [i, j) of at least two consecutive ops that fit a chain, each op reading what an earlier op of
    its run wrote with the layout it was written in (so that it can come from a slot), at most MAX_LINKS long."""
    if batch != 1 or ctas < 1:
        return []
    runs, i = [], 0
    while i < len(ops):
        if not link_fits(ops[i], ctas):
            i += 1
            continue
        j, layout = i + 1, {b.name: (oc, ol) for b, oc, ol in _outputs(ops[i])}
        while j < len(ops) and j - i < MAX_LINKS and link_fits(ops[j], ctas):
            reads = [(b, sc, sl) for b, sc, sl, _, _ in _reads(ops[j]) if b.name in layout]
            if any(b.offset or layout[b.name] != (sc, sl) for b, sc, sl in reads):
                break
            layout.update({b.name: (oc, ol) for b, oc, ol in _outputs(ops[j])})
            j += 1
        if j - i >= 2:
            runs.append((i, j))
        i = j
    return runs


def _align128(n: int) -> int:
    return (n + 127) & ~127


def smem_bytes(c: Chain) -> int:
    """unet1d_chain.cu chain_carve: barriers, statistics, links, coefficients, X, slots, ring."""
    fixed = 128 + _align128(2 * MAX_GROUPS * 8) + _align128(MAX_LINKS * LINK_BYTES) + _align128(c.cin_max * 16)
    fixed += _align128(c.cin_max * (c.l_max + 2 * HALO) * 4) + _align128(c.nslots * c.slot_floats * 4)
    return fixed + c.ring * _align128(c.stage_floats * 4)


def _stages(cin: int, rc: int, k: int) -> tuple[int, int]:
    """(cb, nstages): channels per stage (a multiple of 32 once over 32, so lanes share stages evenly; else of 4:
    bulk copies move multiples of 16 bytes) near STAGE_TARGET bytes per stage."""
    cap = max(32, STAGE_TARGET // (rc * k * 4) // 32 * 32)
    if cin <= min(cap, 32):
        cb = -(-cin // 4) * 4
    else:
        n = -(-cin // cap)
        per = -(-cin // n)  # channels per stage, evenly
        cb = min(cap, -(-per // 32) * 32)
    return cb, -(-cin // cb)


def plan_chain(ops: list[Op], first: int, last: int, ctas: int = CTAS) -> Chain:
    """The chain of ops[first:last]: rows and stages per segment, slots (a buffer written and read inside the chain
    gets one, reused once its last reader is done), what must also reach global memory (read by any other op, or
    an output of the forward), the ring and the shared-memory carve."""
    inside = ops[first:last]
    names_in = {id(op) for op in inside}
    outside = {b.name for op in ops if id(op) not in names_in for b, *_ in _reads(op)}
    outside |= {b.name for op in ops if id(op) not in names_in for s in op.srcs
                for b in (s.film_a, s.film_b, s.t) if b is not None}
    links = [Link(op, [LinkSeg(s, rows_per_cta(s.rows, ctas), *_stages(s.cin, rows_per_cta(s.rows, ctas), s.k))
                       for s in op.segs]) for op in inside]
    produced: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for i, op in enumerate(inside):
        for b, *_ in _reads(op):
            if b.name in produced:
                last_read[b.name] = i
        for b, _, _ in _outputs(op):
            produced[b.name] = i
    slot_of: dict[str, int] = {}
    ends: list[int] = []  # per slot, the last link that reads what it holds
    sizes: list[int] = []
    for i, link in enumerate(links):
        op = link.op
        for b, _, _ in _outputs(op):
            if b.name not in last_read or produced[b.name] != i:
                continue
            size = (op.cin * op.l_in) if b == op.mat else max(s.rows * s.oc for s in op.segs if s.out == b)
            free = [k for k, e in enumerate(ends) if e < i]
            k = free[0] if free else len(ends)
            if k == len(ends):
                ends.append(0)
            ends[k] = last_read[b.name]
            slot_of[b.name] = k
            sizes.append(size)
        for ls in link.segs:
            ls.out_slot = slot_of.get(ls.seg.out.name, -1) if produced[ls.seg.out.name] == i else -1
            ls.out_global = ls.seg.out.name in outside or ls.seg.out.name not in last_read
        if op.mat is not None:
            link.mat_slot = slot_of.get(op.mat.name, -1)
            link.mat_global = op.mat.name in outside
        for b, _, _, role, s in _reads(op):
            if b.name in slot_of and produced[b.name] < i:
                (link.src_slot if role == "raw" else link.res_slot)[s] = slot_of[b.name]
    c = Chain(first, links, ctas, nslots=len(ends), slot_floats=max(sizes, default=0),
              stage_floats=max(ls.rc * ls.seg.k * ls.cb for link in links for ls in link.segs),
              cin_max=max(op.cin for op in inside), l_max=max(op.l_in for op in inside))
    stages = sum(ls.nstages for link in links for ls in link.segs)
    c.ring = 1
    c.ring = max(1, min(MAX_RING, stages, (SMEM_MAX - smem_bytes(c)) // _align128(c.stage_floats * 4) + 1))
    c.smem_bytes = smem_bytes(c)
    if c.smem_bytes > SMEM_MAX or c.ring < 2:
        raise ValueError(f"chain at {inside[0].name}: {c.smem_bytes} bytes of shared memory (ring {c.ring})")
    return c


def pack_chain_weight(w: torch.Tensor, ls: LinkSeg, ctas: int) -> torch.Tensor:
    """(rows, cin, k) -> flat [cta][stage][rc][k][cb]: a CTA's stage is one contiguous bulk copy, and in it the
    lanes (consecutive channels) of one (row, tap) read consecutive words. Zero rows and channels where padded."""
    rows, cin, k = w.shape
    full = w.new_zeros(ctas * ls.rc, ls.nstages * ls.cb, k)
    full[:rows, :cin] = w
    return full.reshape(ctas, ls.rc, ls.nstages, ls.cb, k).permute(0, 2, 1, 4, 3).reshape(-1)


def unpack_chain_weight(flat: torch.Tensor, ls: LinkSeg, ctas: int) -> torch.Tensor:
    """The inverse of pack_chain_weight: (rows, cin, k)."""
    s = ls.seg
    v = flat[: ctas * ls.nstages * ls.rc * s.k * ls.cb].reshape(ctas, ls.nstages, ls.rc, s.k, ls.cb)
    return v.permute(0, 2, 1, 4, 3).reshape(ctas * ls.rc, ls.nstages * ls.cb, s.k)[: s.rows, : s.cin]


P = ctypes.c_void_p
I64, I32 = ctypes.c_int64, ctypes.c_int32


class CLinkSeg(ctypes.Structure):
    _fields_ = [("w", P), ("bias", P), ("out", P), ("ob", I64), ("oc", I64), ("ol", I64)] + [
        (n, I32) for n in ("rows", "k", "pad", "stride", "ostep", "ophase", "l_out", "rc", "cb", "nstages",
                           "out_slot", "pad_")]


def c_chain_type(source: type) -> tuple[type, type]:
    """The ctypes UnetLink and UnetChain, built on _launch's CSource (unet1d.h UnetSource)."""
    class CLink(ctypes.Structure):
        _fields_ = [("src", source * 2), ("seg", CLinkSeg * 2), ("mat", P), ("src_slot", I32 * 2),
                    ("res_slot", I32 * 2)] + [(n, I32) for n in ("mat_slot", "nsrc", "nseg", "cin", "l_in", "pad_")]

    class CChain(ctypes.Structure):
        _fields_ = [("link", CLink * MAX_LINKS)] + [
            (n, I32) for n in ("n", "ctas", "nslots", "slot_floats", "stage_floats", "ring", "cin_max", "l_max",
                               "smem_bytes", "pad_")] + [("trace", P)]
    return CLink, CChain
