"""Input validation shared by every chain variant: y = chain(x, spec).

x is a 1-d float32 tensor (float64 for the oracle) of n >= 1 elements; spec a `ChainSpec` (ops >= 1 dependent
exchanges, ctas >= 1 CTAs per op). Bad input raises TypeError / ValueError naming the problem before anything runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dpk.validate import require_tensors, same_kind


@dataclass(frozen=True)
class ChainSpec:
    """How many dependent ops the chain has and how many CTAs each op spreads over (the CUDA variants)."""

    ops: int
    ctas: int

    def __post_init__(self) -> None:
        for name in ("ops", "ctas"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"chain: {name} must be an integer >= 1, got {v!r}")


def check_chain_inputs(x: object, spec: object, *, variant: str, device_type: str | None = None,
                       dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> int:
    """Validate one call's inputs for `variant`; return n."""
    where = f"chain.{variant}"
    require_tensors(where, x=x)
    if not isinstance(spec, ChainSpec):
        raise TypeError(f"{where}: spec must be a chain ChainSpec, got {type(spec).__name__}")
    same_kind(where, {"x": x}, dtypes, device_type)
    if x.dim() != 1 or x.numel() < 1:
        raise ValueError(f"{where}: x must be a non-empty 1-d tensor, got shape {tuple(x.shape)}")
    return x.numel()
