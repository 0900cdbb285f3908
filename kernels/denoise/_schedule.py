"""Scheduler configuration and per-step constants shared by every denoise variant.

`Schedule` is the frozen, hashable description of one diffusers DDPMScheduler / DDIMScheduler config
(prediction_type="epsilon", DDPM variance_type="fixed_small", timestep_spacing="leading"). It rebuilds
diffusers' float32 `alphas_cumprod` with the same torch calls diffusers makes (bit-identical: a test checks),
its timesteps, and each inference step's previous timestep:

  timesteps  = arange(N)[::-1] * (T // N) + steps_offset       (leading spacing; index i = 0 is the largest t)
  DDPM prev  = timesteps[i + 1], or -1 after the last step       (diffusers' previous_timestep)
  DDIM prev  = t - T // N                                        (diffusers' DDIMScheduler.step)
  abar_prev  = alphas_cumprod[prev] if prev >= 0 else (1 for DDPM; final_alpha_cumprod for DDIM)

Every step is then the same affine form, which the fused variants evaluate with one row of constants:

  x0  = clip((x - b * eps) / a, -r, r)
  out = c_x0 * x0 + c_x * x + c_eps * eps + sigma * z

The scalars are diffusers' own float32 values, computed by the same torch operations on the same 0-d
float32 tensors in the same order (`step_scalars`; a test runs diffusers' step on float64 tensors and
gets the reference bit for bit):
  DDPM: a = abar_t^0.5, b = (1 - abar_t)^0.5, alpha_t = abar_t / abar_prev, beta_t = 1 - alpha_t,
        c_x0 = abar_prev^0.5 beta_t / (1 - abar_t), c_x = alpha_t^0.5 (1 - abar_prev) / (1 - abar_t), c_eps = 0,
        sigma = clamp((1 - abar_prev) / (1 - abar_t) beta_t, 1e-20)^0.5 if t > 0 else 0.
  DDIM: var = ((1 - abar_prev) / (1 - abar_t)) (1 - abar_t / abar_prev), std = eta var^0.5,
        c_x0 = abar_prev^0.5, c_x = 0, c_eps = (1 - abar_prev - std^2)^0.5, sigma = std if eta > 0 else 0.
Deriving them in float32 is part of diffusers' definition of the step: beta_t = 1 - abar_t / abar_prev cancels
when beta_t is small, and the exact (float64) scalars would move x_{t-1} by up to ~1.3e-5 (t = 10 of linear
1000/100); sharing diffusers' scalars keeps that constant difference out of every comparison (NOTES.md).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from dpk.lru import LRU

SCHEDULERS = ("ddpm", "ddim")
BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
DDPM_MIN_VARIANCE = 1e-20  # diffusers clamps the DDPM variance before its square root

# Columns of one row of the constants table (float32, 8 per step: one 32-byte row, two float4 loads);
# T is the step's timestep (informational: the kernels do not read it).
NEG_B, A, C_X0, C_X, C_EPS, SIGMA, CLIP, T = range(8)
COLUMNS = 8


@dataclass(frozen=True)
class Schedule:
    """One scheduler config (hashable: it keys the cached constant tables and diffusers schedulers)."""

    scheduler: str = "ddpm"
    num_train_timesteps: int = 100
    num_inference_steps: int = 100
    beta_schedule: str = "squaredcos_cap_v2"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    clip_sample: bool = True
    clip_sample_range: float = 1.0
    eta: float = 0.0  # DDIM only
    set_alpha_to_one: bool = True  # DDIM only
    steps_offset: int = 0

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"denoise: unknown scheduler {self.scheduler!r}; known: {', '.join(SCHEDULERS)}")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"denoise: unknown beta_schedule {self.beta_schedule!r}; "
                             f"known: {', '.join(BETA_SCHEDULES)}")
        for name in ("num_train_timesteps", "num_inference_steps", "steps_offset"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"denoise: {name} must be an int, got {v!r}")
        if not 1 <= self.num_inference_steps <= self.num_train_timesteps:
            raise ValueError(f"denoise: num_inference_steps={self.num_inference_steps} must be in "
                             f"[1, num_train_timesteps={self.num_train_timesteps}]")
        if self.steps_offset < 0 or self.timesteps[0] >= self.num_train_timesteps:
            raise ValueError(f"denoise: steps_offset={self.steps_offset} puts the first timestep "
                             f"{self.timesteps[0]} outside [0, {self.num_train_timesteps})")
        if not (math.isfinite(self.eta) and self.eta >= 0):
            raise ValueError(f"denoise: eta must be finite and >= 0, got {self.eta}")
        if self.scheduler == "ddpm" and self.eta != 0:
            raise ValueError("denoise: eta is a DDIM parameter; DDPM needs eta=0")
        if not self.clip_sample_range > 0:
            raise ValueError(f"denoise: clip_sample_range must be > 0, got {self.clip_sample_range}")

    @property
    def num_steps(self) -> int:
        return self.num_inference_steps

    @property
    def step_ratio(self) -> int:
        return self.num_train_timesteps // self.num_inference_steps

    @functools.cached_property
    def timesteps(self) -> tuple[int, ...]:
        """diffusers' set_timesteps(N) with timestep_spacing="leading": index 0 is the first (largest) t."""
        n = self.num_inference_steps
        return tuple((n - 1 - i) * self.step_ratio + self.steps_offset for i in range(n))

    def prev_timestep(self, i: int) -> int:
        if self.scheduler == "ddpm":  # DDPMScheduler.previous_timestep: the next entry of `timesteps`
            return self.timesteps[i + 1] if i + 1 < self.num_steps else -1
        return self.timesteps[i] - self.step_ratio  # DDIMScheduler.step

    def alphas_cumprod(self) -> torch.Tensor:
        """diffusers' float32 alphas_cumprod (CPU), built with the same torch calls; do not modify."""
        return _alphas_cumprod(self.num_train_timesteps, self.beta_schedule, self.beta_start, self.beta_end)

    def final_alpha_cumprod(self) -> float:
        """abar_prev once prev < 0: 1 for DDPM (diffusers' `one`), DDIM's `final_alpha_cumprod`."""
        if self.scheduler == "ddim" and not self.set_alpha_to_one:
            return float(self.alphas_cumprod()[0])
        return 1.0

    def check_step(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"denoise: step index must be an int, got {type(i).__name__}")
        if not 0 <= i < self.num_steps:
            raise ValueError(f"denoise: step index {i} is outside the schedule: valid indices are "
                             f"0..{self.num_steps - 1} (timesteps {self.timesteps[0]}..{self.timesteps[-1]})")
        return i

    @classmethod
    def from_params(cls, params: dict) -> Schedule:
        """A Schedule from case parameters (unknown keys, e.g. B/T/D/step, are ignored)."""
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in params.items() if k in fields})


@functools.lru_cache(maxsize=64)
def _alphas_cumprod(num_train_timesteps: int, beta_schedule: str, beta_start: float, beta_end: float
                    ) -> torch.Tensor:
    n = num_train_timesteps
    if beta_schedule == "linear":
        betas = torch.linspace(beta_start, beta_end, n, dtype=torch.float32)
    elif beta_schedule == "scaled_linear":
        betas = torch.linspace(beta_start**0.5, beta_end**0.5, n, dtype=torch.float32) ** 2
    elif beta_schedule == "squaredcos_cap_v2":  # diffusers.schedulers.scheduling_ddpm.betas_for_alpha_bar
        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        betas = torch.tensor([min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), 0.999) for i in range(n)],
                             dtype=torch.float32)
    else:
        raise ValueError(f"denoise: unknown beta_schedule {beta_schedule!r}; known: {', '.join(BETA_SCHEDULES)}")
    return torch.cumprod(1.0 - betas, dim=0)


def step_scalars(s: Schedule, i: int) -> dict[str, float]:
    """diffusers' float32 scalars of inference step i (as Python floats), computed with diffusers' own ops."""
    s.check_step(i)
    abar = s.alphas_cumprod()
    t, prev = s.timesteps[i], s.prev_timestep(i)
    alpha_prod_t = abar[t]
    alpha_prod_t_prev = abar[prev] if prev >= 0 else torch.tensor(s.final_alpha_cumprod())
    beta_prod_t = 1 - alpha_prod_t
    beta_prod_t_prev = 1 - alpha_prod_t_prev
    if s.scheduler == "ddpm":  # DDPMScheduler.step and _get_variance
        current_alpha_t = alpha_prod_t / alpha_prod_t_prev
        current_beta_t = 1 - current_alpha_t
        c_x0 = (alpha_prod_t_prev ** (0.5) * current_beta_t) / beta_prod_t
        c_x = current_alpha_t ** (0.5) * beta_prod_t_prev / beta_prod_t
        c_eps = torch.tensor(0.0)
        variance = (1 - alpha_prod_t_prev) / (1 - alpha_prod_t) * (1 - alpha_prod_t / alpha_prod_t_prev)
        sigma = torch.clamp(variance, min=DDPM_MIN_VARIANCE) ** 0.5 if t > 0 else torch.tensor(0.0)
    else:  # DDIMScheduler.step and _get_variance
        variance = (beta_prod_t_prev / beta_prod_t) * (1 - alpha_prod_t / alpha_prod_t_prev)
        std_dev_t = s.eta * variance ** (0.5)
        c_x0 = alpha_prod_t_prev ** (0.5)
        c_x = torch.tensor(0.0)
        c_eps = (1 - alpha_prod_t_prev - std_dev_t**2) ** (0.5)
        sigma = std_dev_t if s.eta > 0 else torch.tensor(0.0)
    out = {"a": alpha_prod_t ** (0.5), "b": beta_prod_t ** (0.5), "c_x0": c_x0, "c_x": c_x, "c_eps": c_eps,
           "sigma": sigma, "abar_t": alpha_prod_t, "abar_prev": alpha_prod_t_prev}
    for k, v in out.items():
        assert v.dtype == torch.float32, (k, v.dtype)  # float32 scalars, exactly diffusers' values
    return {"t": t, "prev_t": prev, "clip": s.clip_sample_range if s.clip_sample else math.inf} | \
        {k: float(v) for k, v in out.items()}


@functools.lru_cache(maxsize=64)
def constants_table(s: Schedule) -> torch.Tensor:
    """(N, 8) float32 CPU table, row i = inference step i (columns NEG_B..T); do not modify."""
    rows = []
    for i in range(s.num_steps):
        c = step_scalars(s, i)
        rows.append([-c["b"], c["a"], c["c_x0"], c["c_x"], c["c_eps"], c["sigma"], c["clip"], float(c["t"])])
    table = torch.tensor(rows, dtype=torch.float64)
    assert torch.equal(table.float().double()[:, :CLIP], table[:, :CLIP])  # float32 values: no rounding here
    return table.float()


CACHE = 64  # device tables kept (schedule x device x padding), as the lru_caches above
_device_tables: LRU[torch.Tensor] = LRU(CACHE)


def device_table(s: Schedule, device: torch.device, nan_pad: bool = False) -> torch.Tensor:
    """The constants table on `device`, built and copied once per (schedule, device), then cached.

    nan_pad adds a NaN row before and after the N steps (rows 0 and N+1): torch_fused indexes it with
    clamp(step + 1, 0, N + 1), so an out-of-range step read on the device gives a NaN output, not a wrong one.
    """
    def make() -> torch.Tensor:
        table = constants_table(s)
        if nan_pad:
            pad = torch.full((1, COLUMNS), math.nan, dtype=torch.float32)
            table = torch.cat([pad, table, pad])
        return table.to(device).contiguous()
    return _device_tables.get_or_make((s, torch.device(device), nan_pad), make)


def table_for(s: Schedule, x: torch.Tensor) -> torch.Tensor:
    """device_table(s, x.device) memoized on the Schedule instance: the per-call cost of the CUDA wrapper.

    Hashing the 11-field key of the shared cache costs ~1 us per call in Python; the memo keyed by the device
    index costs ~0.2 us. (The frozen dataclass's fields are untouched: equality and hash ignore the memo.)
    """
    memo = s.__dict__.get("_tables")
    if memo is None:
        memo = s.__dict__.setdefault("_tables", {})
    index = x.get_device()
    table = memo.get(index)
    if table is None:
        table = memo[index] = device_table(s, x.device)
    return table
