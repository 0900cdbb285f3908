"""denoise PyTorch variants: diffusers (the baseline, the real scheduler's step) and torch_fused.

diffusers: the real DDPMScheduler.step / DDIMScheduler.step, fed the same noise as every variant.

One scheduler per Schedule is built and `set_timesteps(N)` once (CPU timesteps, as Diffusion Policy's loop
uses them). The step index comes in as a device tensor (shared input of all variants: the fused kernels read
it on the device, so a CUDA graph can replay every step); diffusers needs `timesteps[i]` on the host, a CPU
int64 0-d tensor as `for t in scheduler.timesteps` yields. Diffusion Policy's loop holds that t on the host and
never reads it back, so neither does this variant per call: the host value is read once per step tensor
(memoised on the tensor object and its version counter, which any in-place write bumps). A fresh generator
seeded from the NoiseSpec makes diffusers' randn_tensor draw exactly the z of make_inputs (same generator
device, shape and dtype). With a device generator (the Push-T cases; Diffusion Policy passes generator=None,
which draws on the device too) the step never waits for the device; a CPU generator draws on the host and
copies from pageable memory, which waits for the stream. Not graph-capturable: CPU scalars, host branches.

torch_fused: one step as a handful of tensor ops on a precomputed constants table (no host sync).

out = c_x0 * clip((x - b*eps) / a, -r, r) + c_x * x + c_eps * eps + sigma * z, with the constants of
inference step i (diffusers' own float32 scalars) in row i of a float32 table (_schedule.constants_table:
built once per schedule, copied to the device once, cached). The row is picked on the device by the step
tensor, so nothing is read back to the host and the call can be captured in a CUDA graph. Versus
diffusers: no CPU-side scalar math, branch or generator per step, x - b*eps as one addcmul (a fused
multiply-add where the backend contracts it, as on CPU: the product is not rounded before 1/a amplifies
it); DDPM and DDIM are the same ops with different constants (c_x = 0 for DDIM, c_eps = 0 for DDPM,
sigma = 0 on noise-free steps).

The table carries a NaN row on either side: a step outside [0, N) is clamped onto one of them, so a bad step
index held in device memory yields an all-NaN output rather than another step's answer (on CPU the index
is also checked up front and raises ValueError).
"""
from __future__ import annotations

import weakref

import torch

import dpk

from ._checks import check_step_inputs
from ._noise import NoiseSpec, generator
from ._schedule import Schedule
from ._steps import fused_step, scheduler_for

_host_steps: dict[int, tuple[weakref.ref, int, int]] = {}  # id -> (the tensor, its version, its value)


def host_step(step: torch.Tensor) -> int:
    """int(step), read from the device once per step tensor and value (a CPU tensor is read every time)."""
    if step.device.type == "cpu":
        return int(step)
    hit = _host_steps.get(id(step))
    if hit is not None and hit[0]() is step and hit[1] == step._version:
        return hit[2]
    value, key = int(step), id(step)
    _host_steps[key] = (weakref.ref(step, lambda _: _host_steps.pop(key, None)), step._version, value)
    return value


@dpk.variant("denoise", "diffusers", needs=("diffusers",), baseline=True, graph=False)
def diffusers_step(eps: torch.Tensor, x: torch.Tensor, z: torch.Tensor, step: torch.Tensor, schedule: Schedule,
                   noise: NoiseSpec | None = None) -> torch.Tensor:
    """HuggingFace diffusers DDPMScheduler/DDIMScheduler.step with a generator that redraws z exactly."""
    check_step_inputs(eps, x, z, step, schedule, variant="diffusers", dtypes=(torch.float32,))
    if not isinstance(noise, NoiseSpec):
        raise TypeError("denoise.diffusers: needs the NoiseSpec of z (diffusers draws its own noise from a seed)")
    sch = scheduler_for(schedule)
    i = schedule.check_step(host_step(step))
    t = sch.timesteps[i]
    gen = generator(noise, x.device)
    if schedule.scheduler == "ddpm":
        return sch.step(eps, t, x, generator=gen).prev_sample
    return sch.step(eps, t, x, eta=schedule.eta, generator=gen).prev_sample


@dpk.variant("denoise", "torch_fused")
def torch_fused(eps: torch.Tensor, x: torch.Tensor, z: torch.Tensor, step: torch.Tensor, schedule: Schedule,
                noise: NoiseSpec | None = None) -> torch.Tensor:
    """Precomputed per-step constants in one device tensor, indexed on the device; ~9 tensor ops, no sync."""
    return fused_step(eps, x, z, step, schedule)
