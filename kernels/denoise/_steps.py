"""Whole-step functions of one scheduler step, shared by this family's variants and by families that run
whole denoising loops (policy): diffusers' scheduler for a Schedule, the fused torch step, the float64 oracle.
See torch_variants.py and reference.py for what each is and why.
"""
from __future__ import annotations

import torch

from dpk.lru import LRU

from ._checks import check_step_inputs
from ._schedule import CACHE, COLUMNS, Schedule, device_table, step_scalars

_schedulers: LRU[object] = LRU(CACHE)


def scheduler_for(s: Schedule) -> object:
    """The diffusers scheduler of `s` (cached), with set_timesteps(N) applied."""
    return _schedulers.get_or_make(s, lambda: _make_scheduler(s))


def _make_scheduler(s: Schedule) -> object:
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
    return sch


def fused_step(eps: torch.Tensor, x: torch.Tensor, z: torch.Tensor, step: torch.Tensor, schedule: Schedule
               ) -> torch.Tensor:
    """torch_fused's step: the constants row picked on the device by `step`, no host sync (graph-capturable)."""
    check_step_inputs(eps, x, z, step, schedule, variant="torch_fused", dtypes=(torch.float32,))
    table = device_table(schedule, x.device, nan_pad=True)  # (N + 2, 8)
    row = table.index_select(0, (step.reshape(1) + 1).clamp_(0, schedule.num_steps + 1))  # (1, 8)
    neg_b, a, c_x0, c_x, c_eps, sigma, clip, _ = row.reshape(COLUMNS, *([1] * x.dim())).unbind(0)
    x0 = torch.addcmul(x, eps, neg_b).div_(a)
    if schedule.clip_sample:  # config, not per-step data: a host branch is free
        x0.clamp_(min=-clip, max=clip)
    out = x0.mul_(c_x0)
    if schedule.scheduler == "ddpm":
        out.addcmul_(x, c_x)
    else:
        out.addcmul_(eps, c_eps)
    if schedule.scheduler == "ddpm" or schedule.eta > 0:
        out.addcmul_(z, sigma)  # sigma = 0 on noise-free steps (DDPM t = 0)
    return out


def draws_noise(schedule: Schedule, i: int) -> bool:
    """Whether diffusers' step `i` draws z from the generator: DDPM at t > 0, DDIM with eta > 0."""
    if schedule.scheduler == "ddpm":
        return schedule.timesteps[i] > 0
    return schedule.eta > 0


def reference_step(eps: torch.Tensor, x: torch.Tensor, z: torch.Tensor, i: int, schedule: Schedule) -> torch.Tensor:
    """Step `i` straight from diffusers' formulas on diffusers' float32 scalars, in the inputs' precision."""
    c = step_scalars(schedule, i)
    x0 = (x - c["b"] * eps) / c["a"]
    if schedule.clip_sample:
        x0 = x0.clamp(-schedule.clip_sample_range, schedule.clip_sample_range)
    # DDPM: c_x x (c_eps = 0); DDIM: c_eps eps (c_x = 0): only the term diffusers computes is formed
    out = c["c_x0"] * x0 + (c["c_x"] * x if schedule.scheduler == "ddpm" else c["c_eps"] * eps)
    return out + c["sigma"] * z if draws_noise(schedule, i) else out
