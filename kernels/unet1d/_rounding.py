"""The rounding error of one U-Net forward, from the computation (kernels/unet1d/NOTES.md derives it): the
unet1d family's tolerance, and the per-step error the policy family propagates through a denoising loop.
"""
from __future__ import annotations

import math

from torch import nn

import dpk
from dpk.tolerance import unit_roundoff

SAFETY = 8.0  # as dpk.tolerance.reduction: the constant of the probabilistic bound, large suites stay quiet


def _conv_lengths(module: nn.Module) -> list[int]:
    """Reduction length of every conv output (cin * taps; a transposed conv output sums cin * 2 taps)."""
    out = []
    for m in module.modules():
        if isinstance(m, nn.ConvTranspose1d):
            out.append(m.in_channels * 2)
        elif isinstance(m, nn.Conv1d):
            out.append(m.in_channels * m.kernel_size[0])
    return out


def output_scale(module: nn.Module) -> float:
    """A bound on the output's typical size: the final 1x1 conv of z = mish(GroupNorm(.)), |z|_rms <=
    rms(gamma) + rms(beta) + 0.31 (|mish(v)| <= |v| + 0.31, GroupNorm output has unit rms per group)."""
    norm, proj = module.final_conv[0].block[1], module.final_conv[1]
    z = float(norm.weight.double().pow(2).mean().sqrt() + norm.bias.double().pow(2).mean().sqrt()) + 0.31
    w = proj.weight.double().reshape(proj.out_channels, -1)
    return float((w.norm(dim=1) * z + proj.bias.double().abs()).max())


def forward_tolerance(module: nn.Module, compute: str, dtype: str, t_max: int = 0) -> dpk.Tolerance:
    """Rounding error of the whole forward, from the computation (kernels/unet1d/NOTES.md derives it).

    Each conv output of reduction length n carries ~u32 sqrt(n) of relative error when accumulated in fp32,
    ~2 u_tf32 when its operands are rounded to TF32, ~u_bf16 per stored bf16 activation (3 per layer: conv,
    GroupNorm, Mish). GroupNorm rescales each group to unit variance, so relative errors pass through every
    layer about unchanged and independent layers add in quadrature over the D conv layers; the plain form's
    sinusoid argument t f rounds to u32 t_max. All of it in units of the output's scale y (`output_scale`):
        atol = 8 y sqrt(u32^2 (sum_l n_l + t_max^2) + D (2 u_tf32)^2 [tf32] + 3 D u_bf16^2 [bf16 storage])
    and rtol = 2 u(out dtype) for the final store.
    """
    lengths = _conv_lengths(module)
    depth = len(lengths)
    u32 = unit_roundoff("float32")
    var = u32 ** 2 * (sum(lengths) + t_max ** 2)
    if compute == "tf32":
        var += depth * (2 * unit_roundoff("tf32")) ** 2
    if dtype != "float32" or compute not in ("float32", "tf32"):
        u = max(unit_roundoff(dtype), unit_roundoff(compute))
        var += 3 * depth * u ** 2
    y = output_scale(module)
    atol = SAFETY * y * math.sqrt(var)
    return dpk.Tolerance(atol=atol, rtol=2 * unit_roundoff(dtype),
                         why=f"8*y*sqrt(err^2 over {depth} convs, sum n = {sum(lengths)}, {compute}), y = {y:.3g}")
