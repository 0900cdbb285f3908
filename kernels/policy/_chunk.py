"""The non-tensor input of every policy variant (`Chunk`), the chunk's noise, and the loop every variant runs.

A chunk runs its U-Net in unet1d's DTYPES, float32 or bfloat16 (bf16 weights; `Chunk.unet` says what stays
float32).

A chunk is one U-Net (unet1d's `Net`: the weights on the device, their float64 copy, the FiLM table, each
variant's prepared state), one scheduler config (denoise's `Schedule`), the noise seed (denoise's `NoiseSpec`)
and, with the encoder stage on, the observation encoder. Variants prepare their state (graphs, compiled
functions, kernel programs) once per configuration through `Net.prepare`, so parity and timing reuse it.

Noise. Diffusion Policy's `conditional_sample` draws the initial trajectory, then every `scheduler.step`
draws its z from the same generator (DDPM at t > 0, DDIM only with eta > 0). `predraw` makes that sequence
of draws in the same order, from a generator in the same state, with the same shapes and dtype, as
diffusers' `randn_tensor` makes them: row 0 of the stacked noise (S + 1, B, T, D) is the initial
trajectory, row k + 1 the z of step k (zeros where diffusers draws none). So eager_diffusers, which draws
for itself, and every variant that reads the stack see the same numbers (tests/test_policy.py intercepts
diffusers' draws to prove it).
"""
from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dpk.timing_aids import graph_of

from ..denoise._noise import NoiseSpec, generator, randn_as_diffusers
from ..denoise._schedule import Schedule
from ..denoise._steps import draws_noise
from ..unet1d._net import Net


@dataclass(frozen=True, eq=False)
class Chunk:
    """Which net, schedule, noise seed and encoder one action chunk runs with."""

    net: Net
    schedule: Schedule
    noise: NoiseSpec
    encoder: Any = None  # _observation.Encoder (module + float64 copy) when the encoder stage is on

    def __repr__(self) -> str:  # shown in error messages: keep it short
        s = self.schedule
        return (f"Chunk({self.net.weights}, {s.scheduler} {s.num_train_timesteps}/{s.num_inference_steps}, "
                f"encoder={'on' if self.encoder is not None else 'off'})")

    @property
    def steps(self) -> int:
        return self.schedule.num_inference_steps

    def unet(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        """eps = U-Net(x, t, cond) in float32. A bf16 net (a case of dtype bfloat16) gets x and cond narrowed
        and its output widened: the trajectory, the noise, the conditioning and the scheduler stay float32."""
        module = self.net.module
        if self.net.dtype == torch.float32:
            return module(x, t, cond)
        return module(x.to(self.net.dtype), t, None if cond is None else cond.to(self.net.dtype)).float()

    def timesteps(self, device: torch.device) -> torch.Tensor:
        """(S,) int64 timesteps on `device` (cached on the net, one per schedule)."""
        return self.net.prepare(("policy.timesteps", self.schedule, str(device)),
                                lambda: torch.tensor(self.schedule.timesteps, dtype=torch.int64, device=device))

    def step_indices(self, device: torch.device) -> torch.Tensor:
        """(S,) int64 step indices 0..S-1 on `device`: row k is the device-resident index of step k."""
        return self.net.prepare(("policy.steps", self.steps, str(device)),
                                lambda: torch.arange(self.steps, dtype=torch.int64, device=device))

    def prepare(self, variant: str, noise: torch.Tensor, make: Callable[[], Any]) -> Any:
        """A variant's state for this chunk configuration and noise shape (S + 1, B, T, D), made once (the time
        it took is in Net.prepare_s)."""
        return self.net.prepare(self.key(variant, noise), make)

    def key(self, variant: str, noise: torch.Tensor) -> tuple:
        enc = id(self.encoder) if self.encoder is not None else None
        return ("policy", variant, self.schedule, tuple(noise.shape), str(noise.device), enc)


def noise_spec(case_seed: int, generator_kind: str = "cpu") -> NoiseSpec:
    """The chunk's noise seed, independent of the case's input stream (seeded with the case seed itself)."""
    return NoiseSpec(zlib.crc32(f"policy-noise:{case_seed}".encode()) & 0x7FFFFFFF, generator_kind)


def predraw(spec: NoiseSpec, schedule: Schedule, shape: tuple[int, int, int], device: torch.device,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(S + 1, B, T, D): the initial trajectory, then each step's z (zeros where diffusers draws none)."""
    gen = generator(spec, device)
    rows = [randn_as_diffusers(shape, gen, device, dtype)]
    for i in range(schedule.num_inference_steps):
        draws = draws_noise(schedule, i)
        rows.append(randn_as_diffusers(shape, gen, device, dtype) if draws else torch.zeros(shape, dtype=dtype,
                                                                                             device=device))
    return torch.stack(rows)


def condition(chunk: Chunk, global_cond: torch.Tensor | None, image: torch.Tensor | None,
              agent_pos: torch.Tensor | None, compiled: bool = False) -> torch.Tensor | None:
    """(B, G) global conditioning of the U-Net: the encoder's output (`compiled`: its torch.compile form), the
    given one, or None (G = 0)."""
    if chunk.encoder is not None:
        return (chunk.encoder.compiled() if compiled else chunk.encoder)(image, agent_pos)
    return global_cond if chunk.net.config.global_cond_dim else None


def capture(fn: Callable[[], Any], device: torch.device) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`fn` captured in one CUDA graph without autograd (the harness's graph_of: two warm-up calls on a side
    stream); returns the graph and fn's captured output."""
    with torch.no_grad():
        graph, out = graph_of(fn, device)
    torch.cuda.synchronize(device)
    return graph, out


INPUT_NAMES = ("global_cond", "image", "agent_pos", "noise")


def static_copies(*inputs: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Graph-owned copies of a call's tensor inputs (global_cond, image, agent_pos, noise), by name."""
    return {n: t.clone() for n, t in zip(INPUT_NAMES, inputs) if t is not None}


def copy_in(static: dict[str, torch.Tensor], *inputs: torch.Tensor | None) -> None:
    """A call's inputs into the graph's buffers (the shapes were fixed at capture)."""
    for n, t in zip(INPUT_NAMES, inputs):
        if t is not None:
            static[n].copy_(t)


def info_of(variant: str) -> Callable[..., dict]:
    """The `info` hook of a variant that prepares state through Chunk.prepare."""
    def info(*inputs: Any) -> dict:
        """resident_mb: the weights plus what the variant keeps (graph pools, buffers, packed weights, as the
        allocator's growth while preparing); prepare_s: capture, packing (compile time is first_call_s)."""
        noise, chunk = inputs[-2], inputs[-1]
        key = chunk.key(variant, noise)
        st = chunk.net.prepared.get(key)
        extra = st.get("bytes", 0) if isinstance(st, dict) else 0
        out = {"resident_mb": (chunk.net.weight_bytes() + max(0, extra)) / 1e6}
        return out | ({"prepare_s": chunk.net.prepare_s[key]} if key in chunk.net.prepare_s else {})
    return info
