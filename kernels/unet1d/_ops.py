"""Ops of the kernels path as data, mirroring unet1d.h: buffers by name, sources, segments, ops, and the `Store`
that lays named buffers out in one tensor.

Buffers are referred to by name (`Buf`), resolved later either to device pointers (`_launch.py`) or to torch
views (`_emulate.py`, the CPU model of the kernel that the tests run), so one op list serves both. How an op's
segments are split over CTAs: `_plan.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


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
