"""Chunk family for the stage and latency tests: a toy action chunk, an observation encoded once, then STEPS x
(a "U-Net" y = y @ W, then a "scheduler step" y = y / 2), declared with latency=True. Every part also costs a set
time on a clock a test controls (`variants.COSTS`, `variants.CLOCK`), so timed rows have exact values."""
from __future__ import annotations

import torch

import dpk
from dpk.tolerance import reduction, torch_dtype

STEPS = 3


def make_inputs(case: dpk.Case, device: torch.device) -> tuple:
    g = torch.Generator().manual_seed(case.seed)
    n = case["N"]
    obs = torch.randn(n, generator=g)
    w = torch.randn(n, n, generator=g) / n**0.5
    return tuple(t.to(torch_dtype(case.dtype)).to(device) for t in (obs, w))


def tolerance(case: dpk.Case, compute: str) -> dpk.Tolerance:
    return reduction(case["N"] * STEPS, case.dtype, compute, magnitude=4.0)


@dpk.family("chunk", make_inputs=make_inputs, tolerance=tolerance, latency=True)
def reference(obs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64 chunk: encode (2 x obs), then STEPS x (y @ W, halved)."""
    y = 2 * obs
    for _ in range(STEPS):
        y = (y @ w) / 2
    return y
