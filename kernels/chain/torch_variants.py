"""chain PyTorch variant: eager (the baseline), three tensor ops per exchange (gather, mean, multiply-add)."""
from __future__ import annotations

import torch

import dpk

from ._checks import ChainSpec, check_chain_inputs
from .reference import gather_index


@dpk.variant("chain", "eager", baseline=True)
def eager(x: torch.Tensor, spec: ChainSpec) -> torch.Tensor:
    """Each op as torch ops in fp32: one launch per op and tensor op on a GPU."""
    n = check_chain_inputs(x, spec, variant="eager")
    idx = gather_index(n, x.device)
    for _ in range(spec.ops):
        x = torch.add(x[idx], x.mean(), alpha=1.0).mul_(0.5)
    return x
