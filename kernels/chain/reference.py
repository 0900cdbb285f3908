"""chain family: the dependency skeleton of one unet1d forward, `ops` dependent all-to-all exchanges.

y = chain(x, spec): op k maps x (n,) to y[i] = 0.5 x[(5 i + 1) mod n] + 0.5 mean(x); the next op reads y.
Every output depends on every input, as every output of a unet1d op depends on every channel its predecessor
wrote; there are no weights and no products. Its CUDA variants (chain.cu) do per op only what a unet1d op does
besides its stages (copy the predecessor's output from L2, a block-wide sum, store a slice), ordered four ways:
plain launches, programmatic dependent launch, one persistent kernel with either of two grid barriers. Rows at 1
and N ops give the fixed cost of one dependent op, (t_N - t_1) / (N - 1): under that ordering, no forward of N
dependent ops takes less than N times it.

Case parameters: n (floats exchanged: blog's activations at B = 1 are 4096 at every level, Push-T image's
8192), ops, ctas (CTAs per op: unet1d's B = 1 ops run 128). Inputs: x ~ U(-1, 1) seeded, and the ChainSpec.
"""
from __future__ import annotations

import math

import torch

import dpk
from dpk.tolerance import unit_roundoff

from ._checks import ChainSpec, check_chain_inputs

SAFETY = 8.0  # the constant of the probabilistic bound, as the other families' reductions


def spec_of(case: dpk.Case) -> ChainSpec:
    return ChainSpec(ops=int(case["ops"]), ctas=int(case["ctas"]))


def make_inputs(case: dpk.Case, device: torch.device) -> tuple:
    if case.dtype != "float32":
        raise ValueError(f"chain case {case.id}: float32 only, got {case.dtype}")
    n = int(case["n"])
    if n < 1:
        raise ValueError(f"chain case {case.id}: n must be >= 1, got {n}")
    g = torch.Generator().manual_seed(case.seed)
    x = torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1
    return x.float().to(device), spec_of(case)


def tolerance(case: dpk.Case, compute: str) -> dpk.Tolerance:
    """Every value stays within M = max|x| = 1 (each op averages two of them). Per op, the fp32 sum of n terms
    of size <= M errs by ~u sqrt(n) n M (pairwise or tree order, probabilistic), so 0.5 mean(x) by
    0.5 u sqrt(n) M; the gather is exact; the multiply-add and the division add <= 3 u M. An error already in x
    passes on with gain <= 0.5 + 0.5 = 1, so after `ops` ops: atol = 8 ops (0.5 sqrt(n) + 3) u M."""
    n, ops, u = int(case["n"]), int(case["ops"]), unit_roundoff(compute)
    atol = SAFETY * ops * (0.5 * math.sqrt(n) + 3) * u
    return dpk.Tolerance(atol=atol, rtol=2 * unit_roundoff("float32"),
                         why=f"{SAFETY:g}*{ops}*(0.5*sqrt({n})+3)*u({compute})")


def work(case: dpk.Case) -> dpk.Work:
    """The input read and the output written once (the ops' exchanges stay in L2)."""
    n = int(case["n"])
    return dpk.Work(bytes=2 * 4 * n, flops=3 * n * int(case["ops"]))


def gather_index(n: int, device: torch.device | None = None) -> torch.Tensor:
    return (torch.arange(n, device=device) * 5 + 1) % n


@dpk.family("chain", make_inputs=make_inputs, tolerance=tolerance, work=work)
def reference(x: torch.Tensor, spec: ChainSpec) -> torch.Tensor:
    """`ops` dependent exchanges y[i] = 0.5 x[(5 i + 1) mod n] + 0.5 mean(x), in float64."""
    n = check_chain_inputs(x, spec, variant="reference", dtypes=(torch.float32, torch.float64))
    idx, y = gather_index(n, x.device), x.double()
    for _ in range(spec.ops):
        y = 0.5 * y[idx] + 0.5 * y.mean()
    return y
