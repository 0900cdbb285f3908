"""gn_mish Triton variant: triton, GroupNorm+Mish in one Triton kernel (_triton_kernels.py), fp32 math.

One program per (batch, group) on fp32, fp16 or bf16 data: the whole group in one register tile when it fits,
else a stats loop and a normalise loop. On a CPU-only machine it runs under TRITON_INTERPRET=1 on CPU tensors
(the CI parity check).
"""
from __future__ import annotations

import os

import torch

import dpk

from ._checks import check_inputs

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _device_type() -> str:
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@dpk.variant("gn_mish", "triton", needs=("triton",), dtypes=("float32", "float16", "bfloat16"), compute="float32")
def triton_fused(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """Fused Triton kernel, one program per (batch, group)."""
    check_inputs(x, gamma, beta, groups, eps, dtypes=DTYPES, device_type=_device_type())
    from ._triton_kernels import gn_mish_triton

    return gn_mish_triton(x, gamma, beta, groups, eps)
