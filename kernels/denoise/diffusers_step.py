"""diffusers baseline: the real DDPMScheduler.step / DDIMScheduler.step, fed the same noise as every variant.

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
"""
from __future__ import annotations

import weakref

import torch

import dpk

from ._checks import check_step_inputs
from ._noise import NoiseSpec, generator
from ._schedule import Schedule

_schedulers: dict[Schedule, object] = {}


def scheduler_for(s: Schedule) -> object:
    """The diffusers scheduler of `s` (cached), with set_timesteps(N) applied."""
    sch = _schedulers.get(s)
    if sch is None:
        import diffusers

        common = {"num_train_timesteps": s.num_train_timesteps, "beta_start": s.beta_start, "beta_end": s.beta_end,
                  "beta_schedule": s.beta_schedule, "clip_sample": s.clip_sample,
                  "clip_sample_range": s.clip_sample_range, "prediction_type": "epsilon",
                  "timestep_spacing": "leading", "steps_offset": s.steps_offset}
        if s.scheduler == "ddpm":
            sch = diffusers.DDPMScheduler(variance_type="fixed_small", **common)
        else:
            sch = diffusers.DDIMScheduler(set_alpha_to_one=s.set_alpha_to_one, **common)
        sch.set_timesteps(s.num_inference_steps)
        if tuple(sch.timesteps.tolist()) != s.timesteps:
            raise RuntimeError(f"denoise.diffusers: diffusers' timesteps {sch.timesteps.tolist()[:4]}... differ "
                               f"from the schedule's {s.timesteps[:4]}...")
        _schedulers[s] = sch
    return sch


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
