"""The denoise step kernel's Python entry points (denoise.cu through binding.cpp), shared by the `cuda` variant
and by families that run whole denoising loops (policy): build once per source hash, look up the schedule's
constants table, launch; bad input re-diagnosed with the family's full checks (see cuda_variants.py).
"""
from __future__ import annotations

import types
from pathlib import Path

import torch

import dpk

from ._checks import check_step_inputs
from ._schedule import Schedule, table_for

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "binding.cpp", HERE / "denoise.cu")
_ext: types.ModuleType | None = None


def extension() -> types.ModuleType:
    """The compiled extension (built once per source hash), or dpk.Unavailable saying why not."""
    global _ext
    if _ext is None:
        from dpk.build import cuda_extension

        _ext = cuda_extension("dpk_denoise", SOURCES)
    return _ext


def _diagnose(eps: object, x: object, z: object, step: object, schedule: object, out: object,
              variant: str) -> None:
    """Raise the precise TypeError / ValueError for bad input (returns if the inputs look valid)."""
    check_step_inputs(eps, x, z, step, schedule, variant=variant, dtypes=(torch.float32,), device_type="cuda",
                      contiguous=True)
    if out is not None and not (isinstance(out, torch.Tensor) and out.shape == x.shape  # type: ignore[union-attr]
                                and out.dtype == torch.float32 and out.device == x.device  # type: ignore[union-attr]
                                and out.is_contiguous()):
        raise ValueError(f"denoise.{variant}: out must be a contiguous float32 tensor shaped and placed like x")


def step_cuda(eps: torch.Tensor, x: torch.Tensor, z: torch.Tensor, step: torch.Tensor, schedule: Schedule,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """x_{t-1} for inference step `step` (device int64); `out` may be x itself for an in-place loop."""
    try:
        if type(schedule) is not Schedule or not x.is_cuda:
            raise TypeError("not a CUDA call")
        return extension().step(eps, x, z, table_for(schedule, x), step, out)
    except dpk.Unavailable:
        raise
    except Exception:
        _diagnose(eps, x, z, step, schedule, out, "cuda")
        raise


def step_cuda_philox(eps: torch.Tensor, x: torch.Tensor, step: torch.Tensor, schedule: Schedule,
                     seed_offset: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Like step_cuda, with z drawn in the kernel: seed_offset = int64 tensor [seed, offset] on x's device."""
    try:
        if type(schedule) is not Schedule or not x.is_cuda:
            raise TypeError("not a CUDA call")
        return extension().step_philox(eps, x, table_for(schedule, x), step, seed_offset, out)
    except dpk.Unavailable:
        raise
    except Exception as e:
        _diagnose(eps, x, x, step, schedule, out, "cuda_philox")
        if not (isinstance(seed_offset, torch.Tensor) and seed_offset.dtype == torch.int64
                and seed_offset.numel() == 2 and seed_offset.device == x.device):
            raise TypeError("denoise.cuda_philox: seed_offset must be an int64 tensor [seed, offset] on x's "
                            "device") from e
        raise


def philox_normals(step: torch.Tensor, seed_offset: torch.Tensor, n: int) -> torch.Tensor:
    """The n standard normals step_cuda_philox adds (times sigma) at `step`: for tests and diagnostics."""
    return extension().philox_normal(step, seed_offset, n)
