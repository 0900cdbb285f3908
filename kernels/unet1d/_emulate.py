"""The kernels path's program executed with torch ops: what unet1d.cu computes, op by op, read from the same
packed weights, strides, offsets and segment plans (unet1d.h has the contract).

Run in float64 on the CPU, it checks the program itself (walk, packing, phases of the transposed conv, FiLM
offsets, stored skips) against the float64 model: everything but the CUDA code's own indexing and
synchronisation, which the GPU parity checks cover.
"""
from __future__ import annotations

import math

import torch

from ._ops import Buf, Op, Segment, Source
from ._pack import unpack_weight
from ._program import Program

GN_EPS = 1e-5


class Memory:
    """Buf -> flat tensor view: I/O tensors by name, else the params or the work store."""

    def __init__(self, program: Program, params: torch.Tensor, work: torch.Tensor, io: dict[str, torch.Tensor]):
        self.p, self.params, self.work, self.io = program, params, work, io

    def flat(self, buf: Buf) -> torch.Tensor:
        if buf.name in self.io:
            return self.io[buf.name].reshape(-1)[buf.offset:]
        if buf.name in self.p.params.offsets:
            return self.params[self.p.params.offsets[buf.name] + buf.offset:]
        if buf.name in self.p.work.offsets:
            return self.work[self.p.work.offsets[buf.name] + buf.offset:]
        raise KeyError(f"buffer {buf.name!r} is neither an input, a parameter nor an activation")


def _values(mem: Memory, s: Source, b: int, L: int, dtype: torch.dtype) -> torch.Tensor:
    c = torch.arange(s.channels)[:, None]
    l_idx = torch.arange(L)[None, :]
    if s.kind == 1:
        half = s.channels // 2
        i = torch.where(c < half, c, c - half).to(torch.float64)
        f = torch.exp(-i * (math.log(10000.0) / (half - 1)))
        arg = mem.flat(s.t)[:L].to(torch.float64)[None, :] * f
        return torch.where(c < half, torch.sin(arg), torch.cos(arg)).to(dtype)
    return mem.flat(s.raw)[b * s.sb + c * s.sc + l_idx * s.sl].to(dtype)


def _partials(y: torch.Tensor, n: int) -> torch.Tensor:
    """(mean, squared deviations) of each n consecutive values of y (flattened): unet1d.h stat_out."""
    c = y.reshape(-1, n)
    m = c.mean(dim=1)
    return torch.stack([m, ((c - m[:, None]) ** 2).sum(dim=1)], dim=1)


def _group_stats(mem: Memory, s: Source, g: torch.Tensor, b: int, stat: Buf | None,
                 k: int) -> tuple[torch.Tensor, ...]:
    """Each group's mean and variance: from the values, or combined from the producer's partials of k outputs."""
    if stat is None:
        mean = g.mean(dim=1, keepdim=True)
        return mean, ((g - mean) ** 2).mean(dim=1, keepdim=True)
    n = g.shape[1]
    p = mem.flat(stat)[2 * b * g.numel() // k:][: 2 * g.numel() // k].reshape(s.groups, n // k, 2).to(g.dtype)
    mean = p[..., 0].mean(dim=1, keepdim=True)
    return mean, (p[..., 1].sum(dim=1, keepdim=True) + k * ((p[..., 0] - mean) ** 2).sum(dim=1, keepdim=True)) / n


def _transform(mem: Memory, s: Source, v: torch.Tensor, b: int, stat: Buf | None = None, k: int = 0) -> torch.Tensor:
    C, L = v.shape
    if s.gamma is not None:
        g = v.reshape(s.groups, -1)
        mean, var = _group_stats(mem, s, g, b, stat, k)
        rstd = torch.rsqrt(var + GN_EPS)
        v = ((g - mean) * rstd).reshape(C, L)
        v = v * mem.flat(s.gamma)[:C, None].to(v.dtype) + mem.flat(s.beta)[:C, None].to(v.dtype)
    if s.act:
        v = torch.nn.functional.mish(v)
    if s.film:
        def film(base_buf: Buf, row: int) -> torch.Tensor:
            return mem.flat(base_buf)[row * s.film_ld + s.film_off:][: 2 * C if s.film == 1 else C].to(v.dtype)

        f = film(s.film_a, b)
        if s.film_b is not None:
            f = f + film(s.film_b, int(mem.flat(s.t)[b]))
        shift = f[C:2 * C] if s.film == 1 else f[:C]
        scale = f[:C] if s.film == 1 else torch.ones_like(shift)
        v = v * scale[:, None] + shift[:, None]
    if s.res is not None:
        v = v + mem.flat(s.res)[b * C * L:(b + 1) * C * L].reshape(C, L).to(v.dtype)
    return v


def _weights(mem: Memory, op: Op) -> list[torch.Tensor]:
    """Each segment's (ncta * rc, nstages * cb, k) weights from the packed ones (a rider's: its carrier's tap k)."""
    out = []
    for s in op.segs:
        if s.rider:
            out[0], W = out[0][:, :, :-1], out[0][:, :, -1:]
        else:
            n = s.ncta * s.nstages * s.stage_elems
            flat = mem.flat(s.w)
            # bf16 weights: pairs in fp32 slots, read as the kernel reads them (element 2i in slot i's low half)
            W = unpack_weight(flat[: n // 2].view(torch.bfloat16) if s.wbf16 else flat[:n], s)
        out.append(W)
    return out


def _segment(mem: Memory, s: Segment, W: torch.Tensor, X: torch.Tensor, b: int) -> None:
    W = W.to(X.dtype)
    Xs = X[: s.nstages * s.cb]
    L = X.shape[1]
    cols = torch.arange(s.l_out)[None, :] * s.stride + torch.arange(s.k)[:, None] - s.pad  # (k, l_out)
    valid = (cols >= 0) & (cols < L)
    Xcol = torch.where(valid[None], Xs[:, cols.clamp(0, L - 1)], torch.zeros((), dtype=X.dtype))  # (ci, k, j)
    y = torch.einsum("rck,ckj->rj", W, Xcol)[: s.rows] + mem.flat(s.bias)[: s.rows, None].to(X.dtype)
    co = torch.arange(s.rows)[:, None]
    j = torch.arange(s.l_out)[None, :]
    out = mem.flat(s.out)
    out[b * s.ob + co * s.oc + (j * s.ostep + s.ophase) * s.ol] = y.to(out.dtype)


def run_op(mem: Memory, op: Op, dtype: torch.dtype) -> None:
    for b in range(op.batch_grid):
        parts = [_transform(mem, s, _values(mem, s, b, op.l_in, dtype), b, op.stat_in if i == 0 else None,
                            op.stat_in_n)
                 if s.transformed else _values(mem, s, b, op.l_in, dtype) for i, s in enumerate(op.srcs)]
        X = torch.cat(parts)
        if op.mat is not None:
            n = X.numel()
            mem.flat(op.mat)[b * n:(b + 1) * n] = X.reshape(-1).to(mem.work.dtype)
        X = torch.cat([X, X.new_zeros(op.cin_pad - X.shape[0], op.l_in)])
        for s, W in zip(op.segs, _weights(mem, op), strict=True):
            _segment(mem, s, W, X, b)
        if op.stat_out is not None:  # segment 0's output (B, rows, L): its partials, as the kernel stores them
            g = op.segs[0]
            n, k = g.rows * g.l_out, op.stat_out_n
            y = mem.flat(g.out)[b * n:(b + 1) * n]
            mem.flat(op.stat_out)[2 * b * n // k:2 * (b + 1) * n // k] = _partials(y, k).reshape(-1).to(y.dtype)


def emulate(program: Program, io: dict[str, torch.Tensor], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Run every op on the CPU in `dtype`; io: sample, t and global_cond (plain) or obs and table (step)."""
    params = program.params.materialize(torch.float32, torch.device("cpu"))  # as on the device (bf16 pairs)
    work = torch.zeros(program.work.size, dtype=dtype)
    out = torch.zeros(program.batch, program.horizon, io["sample"].shape[-1], dtype=dtype)
    io = {k: (v.to(dtype) if v.is_floating_point() else v).cpu() for k, v in io.items()} | {"out": out}
    mem = Memory(program, params, work, io)
    for op in program.ops:
        run_op(mem, op, dtype)
    return out
