"""The float64 chunk and the propagation of per-step rounding errors through it (the family's tolerance).

`loop64` is the oracle: the float64 copy of the U-Net and of the encoder, denoise's float64 step on diffusers'
float32 scalars, the same stacked noise. `propagated_tolerance` derives how far a float32 (or TF32) chunk may
land from it; kernels/policy/NOTES.md explains the derivation:

  A variant's chunk differs from the oracle's by the rounding of each of its S forwards (the unet1d family's
  bound, `_rounding.forward_tolerance`: typical size atol / 8 per output element), of its encoder, and of its
  steps (negligible next to the forwards: u (|x| + b |eps|) against y u sqrt(sum n)). Each step error reaches
  the final actions through every later step: scaled by c_x0 b / a (31.6x at t = 99 of Push-T, a clip
  removes it), contracted or grown by the U-Net's response to its own input. Rather than bound that
  Jacobian by hand, the derivation measures it: a second float64 chunk (the shadow) adds to every step's
  eps, and to the conditioning, independent normal errors of exactly the typical size the bound assigns,
  and the tolerance is 8 x the rms difference of the two final action chunks (8: the constant of the other
  families' probabilistic bounds), at least 8 u32 max |actions|. DDIM with eta = 0 adds no noise, so nothing
  hides an error there: its tolerance comes out tight by the same rule.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch

import dpk
from dpk.tolerance import unit_roundoff

from ..denoise._steps import reference_step
from ..unet1d._rounding import SAFETY, forward_tolerance
from ._chunk import Chunk
from ._encoding import ENCODER_COMPUTE

Perturb = Callable[[torch.Tensor, int], torch.Tensor]  # (eps or cond, step index or -1) -> perturbed


@torch.no_grad()
def loop64(chunk: Chunk, global_cond: torch.Tensor | None, image: torch.Tensor | None,
           agent_pos: torch.Tensor | None, noise: torch.Tensor, perturb: Perturb | None = None) -> torch.Tensor:
    """The action chunk in float64 (on the net's device): conditioning, S forwards and steps."""
    dev, f64 = chunk.net.device, torch.float64
    ref = chunk.net.reference_module()
    if chunk.encoder is not None:
        cond = chunk.encoder.reference(image.to(dev, f64), agent_pos.to(dev, f64))
    else:
        cond = global_cond.to(dev, f64) if chunk.net.config.global_cond_dim else None
    if perturb is not None and cond is not None:
        cond = perturb(cond, -1)
    noise = noise.to(dev, f64)
    x, B = noise[0], noise.shape[1]
    for k, t in enumerate(chunk.schedule.timesteps):
        eps = ref(x, torch.full((B,), float(t), dtype=f64, device=dev), cond)
        if perturb is not None:
            eps = perturb(eps, k)
        x = reference_step(eps, x, noise[k + 1], k, chunk.schedule)
    return x


def _shadow_perturb(seed: int, eps_sigma: float, cond_rel: float) -> Perturb:
    gen = torch.Generator().manual_seed(seed)

    def perturb(v: torch.Tensor, k: int) -> torch.Tensor:
        sigma = eps_sigma if k >= 0 else cond_rel * float(v.pow(2).mean().sqrt())
        return v + sigma * torch.randn(v.shape, generator=gen, dtype=torch.float64).to(v.device)
    return perturb


def encoder_rel_error(compute: str, conv_lengths: list[int]) -> float:
    """Typical relative rounding error of the encoder's features, by the U-Net's rule (NOTES.md)."""
    u32 = unit_roundoff("float32")
    var = u32 ** 2 * sum(conv_lengths)
    if compute == "tf32":
        var += len(conv_lengths) * (2 * unit_roundoff("tf32")) ** 2
    return math.sqrt(var)


def propagated_tolerance(chunk: Chunk, inputs: tuple, clean: torch.Tensor, compute: str, activations: str,
                         label: str) -> dpk.Tolerance:
    """8 x the rms gap between the oracle's chunk and its shadow under typical per-step rounding errors; with
    bf16 `activations`, unet1d's bf16 bound per forward (its 3 D bf16 roundings hold the narrowing of x, cond)."""
    num_t = chunk.schedule.num_train_timesteps
    fwd = forward_tolerance(chunk.net.module, compute, activations, t_max=num_t)
    eps_sigma = fwd.atol / SAFETY
    enc = chunk.encoder  # the PyTorch encoder in every variant: its arithmetic is cuDNN's, whatever the loop's
    cond_rel = encoder_rel_error(ENCODER_COMPUTE, enc.conv_lengths()) if enc is not None else 0.0
    seed = zlib.crc32(f"policy-shadow:{label}:{compute}".encode()) & 0x7FFFFFFF  # label: the case id, dtype in it
    shadow = loop64(chunk, *inputs, perturb=_shadow_perturb(seed, eps_sigma, cond_rel))
    gap = float((shadow - clean).pow(2).mean().sqrt())
    u32 = unit_roundoff("float32")
    floor = u32 * float(clean.abs().max())
    atol = SAFETY * max(gap, floor)
    return dpk.Tolerance(atol=atol, rtol=2 * u32,
                         why=f"8 x rms gap {gap:.3g} of a shadow chunk with per-step eps errors {eps_sigma:.3g} "
                             f"({compute}, {activations} activations, {chunk.steps} steps)"
                             + (f", cond errors {cond_rel:.2g} rel" if cond_rel else ""))
