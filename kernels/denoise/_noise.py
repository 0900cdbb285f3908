"""The noise z of one step, drawn exactly as diffusers' `randn_tensor` draws it from a seeded generator.

diffusers' DDPMScheduler.step (t > 0) and DDIMScheduler.step (eta > 0) call
`randn_tensor(model_output.shape, generator=g, device=model_output.device, dtype=model_output.dtype)`, which is
  - CPU generator:    torch.randn(shape, generator=g, device="cpu", dtype=dtype).to(device)
  - device generator: torch.randn(shape, generator=g, device=device, dtype=dtype)
(a CPU generator with CUDA tensors draws on the CPU and copies; the two streams differ). `draw` repeats that
call with a generator seeded from a `NoiseSpec`; the diffusers variant passes `generator(spec, device)`, a
fresh generator with the same seed, so diffusers draws the very z every other variant receives
(tests/test_denoise.py proves it by intercepting diffusers' randn_tensor).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

GENERATORS = ("cpu", "device")


@dataclass(frozen=True)
class NoiseSpec:
    """Seed and generator placement of the noise z (pass-through input, read only by the diffusers variant)."""

    seed: int
    generator: str = "cpu"  # "cpu": torch.Generator() as Diffusion Policy's callers use; "device": on x's device

    def __post_init__(self) -> None:
        if self.generator not in GENERATORS:
            raise ValueError(f"denoise: noise generator must be one of {GENERATORS}, got {self.generator!r}")

    @classmethod
    def for_case(cls, case_seed: int, generator: str = "cpu") -> NoiseSpec:
        """A noise seed independent of the case's input stream (which is seeded with case_seed itself)."""
        return cls(zlib.crc32(f"denoise-noise:{case_seed}".encode()) & 0x7FFFFFFF, generator)


def generator(spec: NoiseSpec, device: torch.device) -> torch.Generator:
    """A fresh generator in the state diffusers must start from to draw z."""
    gen_device = torch.device("cpu") if spec.generator == "cpu" else torch.device(device)
    return torch.Generator(device=gen_device).manual_seed(spec.seed)


def randn_as_diffusers(shape: torch.Size | tuple[int, ...], gen: torch.Generator, device: torch.device,
                       dtype: torch.dtype) -> torch.Tensor:
    """What diffusers.utils.torch_utils.randn_tensor(shape, generator=gen, device, dtype) draws (one generator):
    on the generator's device when it differs from the target's, then copied."""
    rand_device = gen.device if gen.device.type != torch.device(device).type else torch.device(device)
    return torch.randn(tuple(shape), generator=gen, device=rand_device, dtype=dtype).to(device)


def draw(shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device, spec: NoiseSpec
         ) -> torch.Tensor:
    """z exactly as diffusers.utils.torch_utils.randn_tensor(shape, generator(spec), device, dtype) returns it."""
    return randn_as_diffusers(shape, generator(spec, device), device, dtype)
