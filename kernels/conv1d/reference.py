"""conv1d family: y[b, co, l] = bias[co] + sum_{ci, k} w[co, ci, k] * x[b, ci, l + k - K//2] (zero outside [0, L)).

Shapes x: B x Cin x L, w: Cout x Cin x K (K odd), b: Cout -> y: B x Cout x L; stride 1, padding K//2: the
Conv1d of Diffusion Policy's Conv1dBlock. The oracle is float64 PyTorch conv1d. Inputs mimic a trained
layer at PyTorch's default init: x ~ N(0, 1), w and b ~ U(-1/sqrt(Cin*K), +1/sqrt(Cin*K)), so every output
is O(1) (std sqrt(1/3)) whatever the channel count, and one tolerance derivation fits all shapes.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import dpk

from ._checks import check_conv1d_inputs

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def make_inputs(case: dpk.Case, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    bsz, cin, cout, length, k = case["B"], case["Cin"], case["Cout"], case["L"], case.get("K", 5)
    g = torch.Generator().manual_seed(case.seed)
    bound = 1.0 / math.sqrt(cin * k)
    x = torch.randn(bsz, cin, length, generator=g)
    w = (torch.rand(cout, cin, k, generator=g) * 2 - 1) * bound
    b = (torch.rand(cout, generator=g) * 2 - 1) * bound
    dt = dpk.tolerance.torch_dtype(case.dtype)
    return tuple(t.to(dt).to(device) for t in (x, w, b))


def tolerance(case: dpk.Case, compute: str) -> dpk.Tolerance:
    """Derived from the reduction length n = Cin*K and the input scales of make_inputs.

    Partial sums are O(1) (outputs have std sqrt(1/3)), so fp32 accumulation error is
    ~ sqrt(n) * u_fp32 * 1 (dpk.tolerance.reduction). TF32 (cuDNN's default) rounds both operands of every
    product to 10 mantissa bits (two roundings of ~u_tf32 each on a term of size ~1/sqrt(n)): summed over n
    terms the random part is ~ sqrt(n) * u * 2/sqrt(n), in atol. Some tensor-core paths truncate instead of
    rounding, which shrinks every product by ~2u on average, i.e. a bias of -2u*y: 4*u_tf32 in rtol.
    """
    n = case["Cin"] * case.get("K", 5)
    acc = dpk.tolerance.reduction(n, case.dtype, "float32", magnitude=1.0)
    if compute != "tf32":
        return acc if compute == "float32" else dpk.tolerance.reduction(n, case.dtype, compute, magnitude=1.0)
    operand = dpk.tolerance.reduction(n, "float32", "tf32", magnitude=2.0 / math.sqrt(n))
    u = dpk.tolerance.unit_roundoff("tf32")
    return dpk.Tolerance(atol=acc.atol + operand.atol, rtol=acc.rtol + 4 * u,
                         why=f"fp32 sum [{acc.why}] + tf32 operand rounding [{operand.why}], rtol += 4*u(tf32)")


def work(case: dpk.Case) -> dpk.Work:
    bsz, cin, cout, length, k = case["B"], case["Cin"], case["Cout"], case["L"], case.get("K", 5)
    elt = dpk.tolerance.torch_dtype(case.dtype).itemsize
    elems = bsz * cin * length + cout * cin * k + cout + bsz * cout * length
    return dpk.Work(bytes=elt * elems, flops=2 * bsz * cout * length * cin * k)


@dpk.family("conv1d", make_inputs=make_inputs, tolerance=tolerance, work=work)
def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Conv1d, stride 1, padding K//2, bias (Diffusion Policy's Conv1dBlock conv); float64 oracle."""
    check_conv1d_inputs(x, w, b, variant="reference", dtypes=FLOAT_DTYPES)
    return F.conv1d(x, w, b, padding=w.shape[2] // 2)
