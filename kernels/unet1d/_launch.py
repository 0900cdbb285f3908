"""The kernels path on a GPU: unet1d.h's structs in ctypes, a program bound to device memory, its launches.

`Compiled` holds one program (model x batch x horizon x form) on the device: the packed weights, the
activation workspace, and per set of I/O addresses the op array (pointers resolved once) and, for
`kernels_graph`, the CUDA graph of the whole forward. Inputs are read in place and the output is written
to a buffer owned by that entry (a graph is captured once per input address set, as torch.compile's
CUDA-graph trees do), so a denoising loop that reuses its buffers replays with no host work per step.
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

import torch

import dpk
import dpk.build
from dpk.lru import LRU
from dpk.nvtx import Ranges
from dpk.timing_aids import graph_of

from ._net import Call
from ._ops import Buf, Op, Segment, Source
from ._plan import SMEM_MAX
from ._program import Program, build_program

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "unet1d.cu",)
CACHE = 4  # bound op arrays / graphs kept per program (input address sets)
COPY = int(os.environ.get("DPK_UNET1D_COPY", "0"))  # unet1d.h UnetOp::copy: how stages reach shared memory
PDL = int(os.environ.get("DPK_UNET1D_PDL", "1"))  # 0: plain stream order between ops (a diagnostic: _trace.py)
TRACE_POINTS = 40  # unet1d.h UNET_TRACE_POINTS: 8 phases, then the landing of stages 0..31
TRACE_NAMES = ("start", "requested", "dependency", "sources", "stats", "transform", "first_stage", "stages")

P = ctypes.c_void_p
I64, I32 = ctypes.c_int64, ctypes.c_int32


class CSource(ctypes.Structure):
    _fields_ = [("raw", P), ("res", P), ("gamma", P), ("beta", P), ("film_a", P), ("film_b", P), ("t", P),
                ("sb", I64), ("sc", I64), ("sl", I64), ("channels", I32), ("groups", I32), ("act", I32),
                ("film", I32), ("film_off", I32), ("film_ld", I32), ("kind", I32), ("num_t", I32), ("early", I32),
                ("res_early", I32), ("coef_early", I32), ("pad_", I32)]


class CSegment(ctypes.Structure):
    _fields_ = [("w", P), ("bias", P), ("out", P), ("ob", I64), ("oc", I64), ("ol", I64)] + [
        (n, I32) for n in ("rows", "k", "pad", "stride", "ostep", "ophase", "l_out", "rc", "cb", "nstages",
                           "cta0", "ncta", "nb", "simt", "wbf16")]


class COp(ctypes.Structure):
    _fields_ = [("src", CSource * 2), ("seg", CSegment * 2), ("mat", P)] + [
        (n, I32) for n in ("nsrc", "nseg", "cin", "cin_pad", "l_in", "cols", "batch_grid", "ring", "coef",
                           "smem_bytes", "grid", "threads")] + [("trace", P), ("copy", I32), ("stat_in_n", I32),
                                                                     ("stat_out", P), ("stat_in", P),
                                                                     ("stat_out_n", I32)]


def library_path() -> Path:
    """Build (or find in the build cache) libdpk_unet1d.so; works without a GPU."""
    return dpk.build.build_library("dpk_unet1d", SOURCES)


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.dpk_unet1d_smem_bytes.argtypes = [ctypes.POINTER(COp)]
    lib.dpk_unet1d_struct_sizes.argtypes = [ctypes.POINTER(ctypes.c_int)] * 3
    lib.dpk_unet1d_prepare.argtypes = [ctypes.c_int]
    lib.dpk_unet1d_launch.argtypes = [ctypes.POINTER(COp), ctypes.c_int, P, ctypes.c_int]
    lib.dpk_unet1d_error_string.restype = ctypes.c_char_p
    return lib


_lib: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The loaded library with every kernel's shared-memory limit raised (Unavailable without a GPU)."""
    global _lib
    if _lib is None:
        lib = declare(dpk.build.nvcc_library("dpk_unet1d", SOURCES))
        _check(lib, lib.dpk_unet1d_prepare(SMEM_MAX))
        _lib = lib
    return _lib


def _check(lib: ctypes.CDLL, code: int) -> None:
    if code:
        raise RuntimeError(f"unet1d kernel launch failed: {lib.dpk_unet1d_error_string(code).decode()}")


class Resolver:
    """Buf -> address: I/O tensors by name, else the params or the workspace tensor."""

    def __init__(self, program: Program, params: torch.Tensor, work: torch.Tensor, io: dict[str, torch.Tensor]):
        self.p, self.params, self.work, self.io = program, params, work, io

    def __call__(self, buf: Buf | None) -> int | None:
        if buf is None:
            return None
        if buf.name in self.io:
            t = self.io[buf.name]
            return t.data_ptr() + buf.offset * t.element_size()
        store, base = (self.p.params, self.params) if buf.name in self.p.params.offsets else (self.p.work, self.work)
        return base.data_ptr() + (store.offsets[buf.name] + buf.offset) * 4


def _source(s: Source, r: Resolver) -> CSource:
    return CSource(r(s.raw), r(s.res), r(s.gamma), r(s.beta), r(s.film_a), r(s.film_b), r(s.t), s.sb, s.sc, s.sl,
                   s.channels, s.groups, s.act, s.film, s.film_off, s.film_ld, s.kind, s.num_t, s.early,
                   s.res_early, s.coef_early, 0)


def _segment(s: Segment, r: Resolver) -> CSegment:
    return CSegment(r(s.w), r(s.bias), r(s.out), s.ob, s.oc, s.ol, s.rows, s.k, s.pad, s.stride, s.ostep,
                    s.ophase, s.l_out, s.rc, s.cb, s.nstages, s.cta0, s.ncta, s.nb, s.simt, s.wbf16)


def c_op(op: Op, r: Resolver) -> COp:
    c = COp()
    for i, s in enumerate(op.srcs):
        c.src[i] = _source(s, r)
    for i, s in enumerate(op.segs):
        c.seg[i] = _segment(s, r)
    c.mat = r(op.mat)
    c.nsrc, c.nseg, c.cin, c.cin_pad, c.l_in, c.cols = len(op.srcs), len(op.segs), op.cin, op.cin_pad, \
        op.l_in, op.cols
    c.batch_grid, c.ring, c.coef, c.smem_bytes, c.grid, c.threads = op.batch_grid, op.ring, op.coef, \
        op.smem_bytes, op.grid, op.threads
    c.copy = COPY
    c.stat_out, c.stat_in, c.stat_in_n, c.stat_out_n = r(op.stat_out), r(op.stat_in), op.stat_in_n, op.stat_out_n
    return c


class Compiled:
    """One program on one device: weights packed once, the workspace, bound op arrays and graphs."""

    def __init__(self, program: Program, device: torch.device, table: torch.Tensor | None):
        self.program, self.device, self.table = program, device, table
        self.params = program.params.materialize(torch.float32, device)
        self.work = torch.zeros(program.work.size, dtype=torch.float32, device=device)
        self.entries: LRU[dict] = LRU(CACHE)
        self.ranges = [Ranges(op.name) for op in program.ops]

    def resident_bytes(self) -> int:
        extra = sum(t.numel() * t.element_size() for e in self.entries.values() for t in _owned(e))
        return (self.params.numel() + self.work.numel()) * 4 + extra

    def _entry(self, io: dict[str, torch.Tensor]) -> dict:
        return self.entries.get_or_make(tuple((k, v.data_ptr()) for k, v in sorted(io.items())),
                                        lambda: self._bind(io))

    def _bind(self, io: dict[str, torch.Tensor]) -> dict:
        p = self.program
        out = torch.empty(p.batch, p.horizon, io["sample"].shape[-1], device=self.device)
        # the kernel reads and writes fp32 activations: bf16 inputs are widened into buffers of this entry
        # (copies that a graph captures with the launches), the output narrowed into one
        staged = {k: torch.empty(v.shape, device=self.device) for k, v in io.items() if v.dtype == torch.bfloat16}
        out_io = out if io["sample"].dtype == torch.float32 else torch.empty_like(out, dtype=io["sample"].dtype)
        r = Resolver(p, self.params, self.work, io | staged | {"out": out} | (
            {"table": self.table} if self.table is not None else {}))
        ops = (COp * len(p.ops))(*[c_op(op, r) for op in p.ops])
        return {"out": out, "out_io": out_io, "staged": staged, "ops": ops, "io": dict(io), "graph": None}

    def launch(self, io: dict[str, torch.Tensor], ranges: bool = True) -> torch.Tensor:
        """Every op on the current stream (programmatic dependent launch between them); returns the output."""
        lib, e = library(), self._entry(io)
        stream = P(torch.cuda.current_stream(self.device).cuda_stream)
        size = ctypes.sizeof(COp)
        for k, t in e["staged"].items():
            t.copy_(e["io"][k])
        for i, rng in enumerate(self.ranges):
            with rng if ranges else _NULL:
                _check(lib, lib.dpk_unet1d_launch(ctypes.cast(ctypes.addressof(e["ops"]) + i * size,
                                                              ctypes.POINTER(COp)), 1, stream, PDL))
        if e["out_io"] is not e["out"]:
            e["out_io"].copy_(e["out"])
        return e["out_io"]

    def phase_trace(self, io: dict[str, torch.Tensor], graph: bool = True, forwards: int = 1,
                    before: Callable[[], object] | None = None) -> list[dict]:
        """One forward with %globaltimer marks in every CTA: per op, the median over its CTAs of each phase's end
        (us after the op's first CTA started) and the op's span. A diagnostic: the marks cost ~0.1 us each.
        `graph`: the forward replayed from a CUDA graph, as kernels_graph runs it; else launched from the host,
        whose ~5-10 us per launch can pace the first ops. `forwards` > 1: that many back to back in the graph (a
        denoising loop's chain), the last one's marks. `before` runs right before the traced call (an L2 flush)."""
        e = self._entry(io)
        counts = [op.grid for op in self.program.ops]
        buf = torch.zeros(sum(counts) * TRACE_POINTS, dtype=torch.int64, device=self.device)
        base = 0
        for c, n in zip(e["ops"], counts):
            c.trace = buf.data_ptr() + base * TRACE_POINTS * 8
            base += n
        try:
            # the trace pointers are kernel parameters: captured into a graph of their own
            g = graph_of(lambda: self.launch(io, ranges=False), self.device, warmup=1, calls=forwards)[0] \
                if graph else None
            if before is not None:
                before()
            g.replay() if g is not None else self.launch(io, ranges=False)
            torch.cuda.synchronize(self.device)
        finally:
            for c in e["ops"]:
                c.trace = None
        t = buf.view(-1, TRACE_POINTS).cpu().double()
        out, base, t_first = [], 0, float(t[:, 0].min())
        for op, n in zip(self.program.ops, counts):
            rows = t[base:base + n]
            start = float(rows[:, 0].min())
            med = (rows - start).median(dim=0).values / 1e3
            nst = min(30, max(s.nstages for s in op.segs))
            landed = [round(float(med[8 + i]), 2) for i in range(nst)]
            out.append({"op": op.name, "grid": n, "start_us": (start - t_first) / 1e3,
                        "span_us": float(rows[:, 7].max() - start) / 1e3} | {
                           name: float(med[i]) for i, name in enumerate(TRACE_NAMES)} | {
                           "stored": float(med[39]), "end_abs_us": (float(rows[:, 39].max()) - t_first) / 1e3,
                           "dep_abs_us": (start + float((rows[:, 2] - start).median()) - t_first) / 1e3,
                           "landed": landed})
            base += n
        return out

    def replay(self, io: dict[str, torch.Tensor]) -> torch.Tensor:
        """The whole forward as one CUDA graph, captured on first use of this input address set."""
        e = self._entry(io)
        if e["graph"] is None:
            e["graph"], _ = graph_of(lambda: self.launch(io, ranges=False), self.device, warmup=1)
        e["graph"].replay()
        return e["out_io"]


def _owned(entry: dict) -> list[torch.Tensor]:
    """The buffers an entry allocated: its output, the widened bf16 inputs, the narrowed output."""
    owned = [entry["out"], *entry["staged"].values()]
    return owned if entry["out_io"] is entry["out"] else [*owned, entry["out_io"]]


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


def compiled_program(call: Call, batch: int, horizon: int) -> Compiled:
    """The packed program of (net, batch, horizon, form) on the net's device, built once."""
    def make() -> Compiled:
        try:
            program = build_program(call.net.module, batch, horizon, call.form,
                                    sms=torch.cuda.get_device_properties(call.net.device).multi_processor_count)
        except ValueError as e:  # a dtype or shape the kernel has no instantiation for
            raise dpk.Unavailable(str(e)) from e
        table = call.net.table(call.num_t) if call.form == "step" else None
        return Compiled(program, call.net.device, table)
    return call.net.prepare(("kernels", call.form, call.num_t, batch, horizon), make)
