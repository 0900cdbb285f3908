"""conv1d Triton variant: program per (L tile, Cout tile, batch), broadcast-multiply-sum over Cin*K.

On a GPU it runs compiled; on a CPU-only machine dpk sets TRITON_INTERPRET=1 and the same kernel runs on CPU
tensors (slow: a few ms per program, so the smoke suite keeps grids to a handful of programs).

Arithmetic: the interpreter computes the products exactly in fp32, but on Hopper Triton's compiler turns the
broadcast-multiply-sum into an MMA with TF32 inputs once the tiles are large enough (measured on an H200: fp32
parity failed on the sweep's B*L >= 1024 cases with TF32-sized errors, ~1e-3 relative). The variant therefore
declares TF32 arithmetic on a GPU, like the cuDNN baseline, and its tolerance follows.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch

import dpk

from ._checks import check_conv1d_inputs

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@dpk.variant("conv1d", "triton", needs=("triton",), dtypes=("float32", "bfloat16", "float16"),
             compute="float32" if os.environ.get("TRITON_INTERPRET") == "1" else "tf32")
def triton_conv1d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Triton: program per (L tile, Cout tile, batch), multiply-sum over Cin*K (TF32 MMA on a GPU, see header)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    bsz, cin, length, cout, k = check_conv1d_inputs(x, w, b, variant="triton", dtypes=DTYPES,
                                                    device_type=None if interpreted else "cuda")
    if bsz > 65535:
        raise dpk.Unavailable(f"conv1d.triton: batch {bsz} exceeds the grid's z limit 65535")
    from . import _triton_kernels as tk

    target = 2 * _sm_count(x.device.index) if x.is_cuda else 1  # ~2 programs per SM; 1: few under the interpreter
    block_co, block_l, block_r = tk.block_sizes(bsz, cout, length, cin * k, target)
    y = torch.empty(bsz, cout, length, dtype=x.dtype, device=x.device)
    grid = (tk.triton.cdiv(length, block_l), tk.triton.cdiv(cout, block_co), bsz)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        tk.conv1d_kernel[grid](x, w, b, y, cin, cout, length, K=k, BLOCK_CO=block_co, BLOCK_L=block_l,
                               BLOCK_R=block_r)
    return y
