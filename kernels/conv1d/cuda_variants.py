"""conv1d CUDA C++ variants: naive (seed Part IV), optimized (seed Part V) and stream (weight streaming).

All live in one torch extension (binding.cpp with naive.cu, optimized.cu, stream.cu, stream_rows.cu, tiled.cu), built on
first use through dpk.build (cached per source hash, sm_90 on Hopper). Each variant validates its inputs in Python
with the family's shared helper before the extension is even loaded, so bad input gets a ValueError/TypeError
naming the problem, on any machine; a valid shape a kernel cannot run (the seed kernel's K and Cin limits) raises
dpk.Unavailable saying why. `optimized` and `stream` hand large B*L (fp32) to the tiled implicit-GEMM
kernel (tiled.cu). Their tuning knobs (`StreamKnobs`, `OptimizedKnobs`; every field -1 = the default in
conv1d.h) are reachable through `run_stream` / `run_optimized` (kernels/conv1d/_tune.py sweeps them); the
registered variants always run the defaults. Kernel designs: the header of each .cu file and NOTES.md.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

import dpk

from ._checks import check_conv1d_inputs

HERE = Path(__file__).resolve().parent
SOURCES = tuple(HERE / name for name in ("binding.cpp", "naive.cu", "optimized.cu", "stream.cu", "stream_rows.cu",
                                          "tiled.cu"))
OPTIMIZED_KS = (1, 3, 5, 7)   # template instantiations of optimized.cu
OPTIMIZED_MAX_CIN = 2048      # its (CPT, LT) rule fits shared memory and registers up to here
OPTIMIZED_TILED_MIN_BL = 16   # conv1d.h kConv1dOptimizedTiledMinBL: larger B*L runs tiled.cu (any Cin, odd K)
STREAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_ext: types.ModuleType | None = None
_ext_error: dpk.Unavailable | None = None


@dataclass(frozen=True)
class TiledKnobs:
    """Conv1dTiledConfig: tile (0..3, table in tiled.cu), cp.async stages (2..8), CTAs per SM the split-K grid
    fills (1..8), L2 policy of the weight loads (0 plain, 1 evict_first, 2 evict_first + 256 B, 3 256 B), math
    engine (mma 1: 3xTF32 tensor cores, 0: fp32 FMAs). -1: the default; for tile, stages, policy and mma that is
    conv1d.h's rule by B*L, Cout and Cin*K."""

    tile: int = -1
    stages: int = -1
    ctas_per_sm: int = -1
    cache_policy: int = -1
    mma: int = -1

    def as_list(self) -> list[int]:
        return [self.tile, self.stages, self.ctas_per_sm, self.cache_policy, self.mma]


@dataclass(frozen=True)
class StreamKnobs:
    """Conv1dStreamConfig: rows per warp (2, 4, 8), 16-byte loads per lane and row (1, 2, 4), cp.async ring
    stages (2..8), CTAs per SM the grid targets (0: one chunk per CTA, the first version's grid), L2 policy
    (as TiledKnobs), the B*L above which fp32 runs the tiled kernel with `tiled`, and `bulk` (1: the weight ring
    is filled by TMA bulk copies counted on mbarriers; rows of whole 16-byte vectors only, else ignored), and `rows`
    (1: stream_rows.cu, whole rows per CTA, all bulk copies issued up front, where its plan fits: B*L <= 16, rows of
    whole 16-byte vectors), `row_chunks` (its column chunks per row, one mbarrier each), `row_threads` (its
    threads per CTA: 256, 512 or 1024) and `row_ahead` (0: every chunk's copies issued at launch; D: D chunks in
    flight, chunk c + D requested once chunk c has landed)."""

    rows_per_warp: int = -1
    vecs_per_row: int = -1
    stages: int = -1
    ctas_per_sm: int = -1
    cache_policy: int = -1
    tiled_min_bl: int = -1
    bulk: int = -1
    rows: int = -1
    row_chunks: int = -1
    row_threads: int = -1
    row_ahead: int = -1
    tiled: TiledKnobs = field(default_factory=TiledKnobs)

    def as_list(self) -> list[int]:
        return [self.rows_per_warp, self.vecs_per_row, self.stages, self.ctas_per_sm, self.cache_policy,
                self.tiled_min_bl, self.bulk, self.rows, self.row_chunks, self.row_threads,
                self.row_ahead, *self.tiled.as_list()]


@dataclass(frozen=True)
class OptimizedKnobs:
    """B*L above which the tiled kernel (with `tiled`) replaces the seed kernel."""

    tiled_min_bl: int = -1
    tiled: TiledKnobs = field(default_factory=TiledKnobs)

    def as_list(self) -> list[int]:
        return [self.tiled_min_bl, *self.tiled.as_list()]


def extension() -> types.ModuleType:
    """The built extension (memoized, and so is a build failure: it is reported once, not rebuilt per call)."""
    global _ext, _ext_error
    if _ext is None:
        if _ext_error is not None:
            raise _ext_error
        from dpk.build import cuda_extension
        try:
            _ext = cuda_extension("dpk_conv1d", SOURCES)
        except dpk.Unavailable as e:
            _ext_error = e
            raise
    return _ext


def check_optimized_shape(cin: int, k: int) -> None:
    """The seed kernel's limits (optimized.cu): dpk.Unavailable before launch for a valid shape beyond them (the
    binding checks them again)."""
    if k not in OPTIMIZED_KS:
        raise dpk.Unavailable(f"conv1d.optimized: kernel size K={k} not supported (supports K in {OPTIMIZED_KS})")
    if cin > OPTIMIZED_MAX_CIN:
        raise dpk.Unavailable(f"conv1d.optimized: Cin={cin} not supported (supports Cin <= {OPTIMIZED_MAX_CIN})")


def run_optimized(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                  knobs: OptimizedKnobs | None = None) -> torch.Tensor:
    """The optimized path with explicit knobs (None: the defaults, as the variant)."""
    bsz, cin, length, _, k = check_conv1d_inputs(x, w, b, variant="optimized", dtypes=(torch.float32,),
                                                 device_type="cuda")
    min_bl = knobs.tiled_min_bl if knobs is not None and knobs.tiled_min_bl != -1 else OPTIMIZED_TILED_MIN_BL
    if bsz * length <= min_bl:  # the seed kernel runs
        check_optimized_shape(cin, k)
    return extension().optimized(x, w, b, None if knobs is None else knobs.as_list())


def run_stream(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, knobs: StreamKnobs | None = None) -> torch.Tensor:
    """The stream path with explicit knobs (None: the defaults, as the variant)."""
    check_conv1d_inputs(x, w, b, variant="stream", dtypes=STREAM_DTYPES, device_type="cuda")
    return extension().stream(x, w, b, None if knobs is None else knobs.as_list())


@dpk.variant("conv1d", "naive", needs=("cuda", "nvcc"), dtypes=("float32",))
def naive(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Seed Part IV: block per (output channel, batch), thread per input channel, shared-memory tree reduction."""
    check_conv1d_inputs(x, w, b, variant="naive", dtypes=(torch.float32,), device_type="cuda")
    return extension().naive(x, w, b)


@dpk.variant("conv1d", "optimized", needs=("cuda", "nvcc"), dtypes=("float32",))
def optimized(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Seed Part V fixed (16-byte loads, filter in registers, shuffle reduction); B*L > 16: tiled fp32 GEMM."""
    return run_optimized(x, w, b)


@dpk.variant("conv1d", "stream", needs=("cuda", "nvcc"), dtypes=("float32", "bfloat16", "float16"))
def stream(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Weight streaming: cp.async ring, one-wave grid, last-CTA split sum; fp32 B*L > 16: tiled fp32 GEMM."""
    return run_stream(x, w, b)
