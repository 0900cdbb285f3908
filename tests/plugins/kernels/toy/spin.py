"""A toy variant with a calibrated cost: a busy-wait of SPIN_US, then the correct result. On a GPU the wait is
a device spin (dpk times device work there: a host wait would be hidden behind the cold-mode cover spin), on
CPU a host busy-wait.

The regression-gate tests plant a slowdown here (SPIN_US 200 -> 240, or DPK_TOY_SPIN_US) and expect
`pytest --benchmark-compare` and asv to flag exactly this variant.
"""
from __future__ import annotations

import os
import time

import torch

import dpk

SPIN_US = 200.0


@dpk.variant("toy", "spin", graph=False)
def spin(a, v, c):
    """torch.mv after a fixed busy-wait: a device spin on a GPU, a host one on CPU (~1% noise)."""
    seconds = float(os.environ.get("DPK_TOY_SPIN_US", SPIN_US)) * 1e-6
    if a.is_cuda:
        torch.cuda._sleep(int(seconds * dpk.timing.sm_hz(a.device)))
        return torch.mv(a, v) + c
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return torch.mv(a, v) + c
