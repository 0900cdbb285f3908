"""denoise CUDA variant: cuda, the whole step in one launch (denoise.cu), any action shape and batch, DDPM and DDIM.

The per-step constants (diffusers' float32 scalars) live in one device table per schedule, built and
copied once, cached; the kernel reads the step index from device memory, picks its row and writes x_{t-1}:
no host sync, no host scalar math, graph-capturable. Versus torch_fused: one launch instead of ~10,
x - b*eps formed with one fused multiply-add by construction, z read only on steps that add noise.

The hot path is kept to a device test, a memoized table lookup and one pybind call whose C++ checks cost
a few hundred ns; any failure (or CPU tensors) is re-diagnosed with the family's full Python checks, so bad
input raises the same clear TypeError / ValueError as the other variants, before any launch.

`step_cuda_philox` is the same kernel drawing z in-kernel from Philox4x32-10 (seed and offset in device
memory) for a fully captured denoising loop; its noise cannot equal diffusers' z, so it is not a parity
variant: tests/test_denoise.py (GPU) compares its normals with the Python reimplementation in _philox.py and
checks their mean and variance.
"""
from __future__ import annotations

import torch

import dpk

from ._extension import SOURCES, extension, philox_normals, step_cuda, step_cuda_philox
from ._noise import NoiseSpec
from ._schedule import Schedule

__all__ = ["SOURCES", "cuda", "extension", "philox_normals", "step_cuda", "step_cuda_philox"]


@dpk.variant("denoise", "cuda", needs=("cuda", "nvcc"))
def cuda(eps: torch.Tensor, x: torch.Tensor, z: torch.Tensor, step: torch.Tensor, schedule: Schedule,
         noise: NoiseSpec | None = None) -> torch.Tensor:
    """One CUDA launch per step: constants table on the device, step index read in the kernel, fma x0."""
    return step_cuda(eps, x, z, step, schedule)
