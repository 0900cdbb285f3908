"""dpk: benchmarking and regression-testing harness for Diffusion Policy inference kernels.

The framework lives in `harness/` and imports as `dpk`; kernel families (in `kernels/`) and suites
(in `suites/`) are plugins loaded by path. A family file uses only what is exported here.
"""
from __future__ import annotations

import os

import torch

# Triton reads TRITON_INTERPRET when @triton.jit decorates a kernel, so a CPU-only machine must set it
# before any family module is imported; the interpreter then runs Triton kernels on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from . import tolerance
from .cases import Case, make_case
from .policy import load_policy
from .registry import Unavailable, Work, family, variant
from .stages import Stage
from .tolerance import Tolerance

__all__ = [
    "Case", "Stage", "Tolerance", "Unavailable", "Work", "family", "load_policy", "make_case", "tolerance", "variant",
]
__version__ = "0.1.0"
