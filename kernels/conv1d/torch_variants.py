"""conv1d PyTorch variant: cudnn, torch.nn.functional.conv1d as PyTorch runs it by default (the baseline).

At the Push-T shapes (batch 1, L = 4..16, 256..2048 channels) cuDNN transposes the weights to NHWC on every
call (about 42 us for the 21 MB of a 1024->1024, k=5 conv on an H200) and then runs an implicit GEMM, in
TF32 when torch.backends.cudnn.allow_tf32 is on (PyTorch's default). The flag is read once, when this
module registers the variant, and becomes the variant's declared `compute` (so it is recorded with every
result and sets the tolerance).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import dpk

from ._checks import check_conv1d_inputs

CUDNN_TF32 = bool(torch.backends.cudnn.allow_tf32)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dpk.variant("conv1d", "cudnn", needs=("cuda",), dtypes=("float32", "bfloat16", "float16"), baseline=True,
             compute="tf32" if CUDNN_TF32 else "float32")
def cudnn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """F.conv1d (cuDNN, PyTorch defaults: TF32 when cudnn.allow_tf32): the baseline speedups are quoted against."""
    check_conv1d_inputs(x, w, b, variant="cudnn", dtypes=DTYPES, device_type="cuda")
    return F.conv1d(x, w, b, padding=w.shape[2] // 2)
