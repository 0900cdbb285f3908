"""denoise family: one diffusers scheduler step x_{t-1} = step(eps, x_t, z) for DDPM and DDIM (epsilon prediction).

Inputs (make_inputs): eps, x, z of shape B x T x D (float32), the inference-step index `step` (int64 tensor,
shape [], on the device; 0 = the first step, the largest t), the `Schedule` and the `NoiseSpec` (pass-through
objects). Output: x_{t-1}, B x T x D float32. The formulas are those of diffusers' DDPMScheduler.step
(fixed_small variance) and DDIMScheduler.step, listed in _schedule.py.

Constants: every variant uses diffusers' own float32 per-step scalars (sqrt(abar_t), the posterior
coefficients, sigma: _schedule.step_scalars derives them from the bit-identical float32 alphas_cumprod with
diffusers' operations). The oracle upcasts those scalars and the inputs to float64 and does the tensor math
in float64, so its difference to a float32 variant is that variant's arithmetic error on the tensors, not a
constant-table difference (diffusers' own step run on float64 tensors reproduces the oracle bit for bit).

Case parameters: scheduler (ddpm|ddim), num_train_timesteps, num_inference_steps, beta_schedule
(linear|scaled_linear|squaredcos_cap_v2), clip_sample, eta (DDIM), optional set_alpha_to_one, steps_offset,
beta_start, beta_end; B, T, D; step; optional noise_generator (cpu|device, default cpu) and inputs:
  consistent (default): x0 ~ U(-1.1, 1.1), eps ~ N(0, 1), x = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, as
      from a perfect denoiser: the predicted x0 lands near [-1, 1] (about 9% clipped), so the step exercises
      the 1/sqrt(abar_t) amplification (2029x at t=99 of Push-T) instead of a clip that hides it;
  random: x, eps ~ N(0, 1) independent (x0 far outside [-1, 1] at large t: clip-dominated, or huge unclipped).
"""
from __future__ import annotations

import math

import torch

import dpk
from dpk.tolerance import torch_dtype, unit_roundoff

from ._checks import check_step_inputs
from ._noise import NoiseSpec, draw
from ._schedule import Schedule, step_scalars
from ._steps import reference_step

X0_MAX = 1.1  # consistent inputs: x0 ~ U(-X0_MAX, X0_MAX)
GAUSS_MAX = 5.5  # bound on |N(0, 1)| draws: P(|g| > 5.5) = 3.8e-8 per element
FLOPS_PER_ELEMENT = 10  # 3 for x0, 1 clip, 6 for the output's multiply-adds


def schedule_of(case: dpk.Case) -> Schedule:
    return Schedule.from_params(case.p)


def action_shape(case: dpk.Case) -> tuple[int, int, int]:
    return case["B"], case["T"], case["D"]


def make_inputs(case: dpk.Case, device: torch.device) -> tuple:
    """(eps, x, z, step, schedule, noise_spec); z is drawn exactly as diffusers' randn_tensor would draw it."""
    sched = schedule_of(case)
    i = sched.check_step(case["step"])
    shape = action_shape(case)
    dt = torch_dtype(case.dtype)
    g = torch.Generator().manual_seed(case.seed)
    kind = case.get("inputs", "consistent")
    if kind == "consistent":
        c = step_scalars(sched, i)
        x0 = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * X0_MAX
        eps = torch.randn(shape, generator=g, dtype=torch.float64)
        x = c["a"] * x0 + c["b"] * eps
    elif kind == "random":
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        eps = torch.randn(shape, generator=g, dtype=torch.float64)
    else:
        raise ValueError(f"denoise case {case.id}: inputs must be 'consistent' or 'random', got {kind!r}")
    spec = NoiseSpec.for_case(case.seed, case.get("noise_generator", "cpu"))
    z = draw(shape, dt, device, spec)
    step = torch.tensor(i, dtype=torch.int64, device=device)
    return eps.to(dt).to(device), x.to(dt).to(device), z, step, sched, spec


def tolerance(case: dpk.Case, compute: str) -> dpk.Tolerance:
    """First-order bound on the rounding error of one step evaluated in `compute` arithmetic.

    With u = unit roundoff, |eps|, |z| <= G = 5.5 and |x| <= xm (sqrt(abar) 1.1 + b G for consistent inputs,
    G for random ones):
      n = x - b eps carries u (|x| + b |eps|) when the product b*eps is rounded before the subtraction (a
          difference of nearly equal numbers when x0 is small, so no relative bound), amplified by
          1/a = 1/sqrt(abar_t) into x0 and by c_x0 into the output: u c_x0 / a (xm + b G). This term is
          11 u 31.6 ~ 2e-5 at t=99 of the Push-T schedule: the catastrophic one; the clip (1-Lipschitz) never
          enlarges it; a fused multiply-add (the CUDA kernel) avoids it;
      each output term c * v carries 2u |c v| (its product's rounding and a share of the sum's);
      the final sum and store: 2u |out| (rtol).
    The constants themselves are exact: every variant uses the same float32 scalars.
    Measured errors sit well below this worst-case sum (NOTES.md has the numbers).
    """
    sched = schedule_of(case)
    c = step_scalars(sched, case["step"])
    u = max(unit_roundoff(compute), unit_roundoff(case.dtype))
    g = GAUSS_MAX
    consistent = case.get("inputs", "consistent") == "consistent"
    xm = c["a"] * X0_MAX + c["b"] * g if consistent else g
    inv_a = 1.0 / c["a"]
    x0m = X0_MAX if consistent else (xm + c["b"] * g) * inv_a
    x0m = min(x0m, c["clip"])
    amplified = c["c_x0"] * inv_a * (xm + c["b"] * g)
    terms = c["c_x0"] * x0m + c["c_x"] * xm + c["c_eps"] * g + c["sigma"] * g
    atol = u * (amplified + 2 * terms)
    return dpk.Tolerance(atol=atol, rtol=2 * u,
                         why=f"u({compute})*(c_x0/a*(|x|+b|eps|) = {amplified:.3g} + 2*sum|c*v| = {2 * terms:.3g})"
                             f" at t={c['t']}")


def work(case: dpk.Case) -> dpk.Work:
    """Read eps and x (and z when the step adds noise), write x_{t-1}."""
    n = math.prod(action_shape(case))
    noisy = step_scalars(schedule_of(case), case["step"])["sigma"] != 0
    elt = torch_dtype(case.dtype).itemsize
    return dpk.Work(bytes=elt * n * (4 if noisy else 3), flops=FLOPS_PER_ELEMENT * n)


@dpk.family("denoise", make_inputs=make_inputs, tolerance=tolerance, work=work)
def reference(eps: torch.Tensor, x: torch.Tensor, z: torch.Tensor, step: torch.Tensor, schedule: Schedule,
              noise: NoiseSpec | None = None) -> torch.Tensor:
    """One DDPM/DDIM step in float64 straight from diffusers' formulas, on diffusers' float32 scalars."""
    check_step_inputs(eps, x, z, step, schedule, variant="reference", dtypes=(torch.float64, torch.float32))
    return reference_step(eps, x, z, int(step), schedule)
