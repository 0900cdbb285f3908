"""The encoder stage of a chunk: which observation encoder a case names, built once per device.

`encoder: none` (the default): the chunk starts from the global conditioning. Other values name an encoder
of _encoder.py; the U-Net's global_cond_dim must equal the encoder's output width.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

ENCODERS = ("none",)


def encoder_for(params: Mapping[str, Any], global_cond_dim: int, device: torch.device | None) -> Any:
    """The case's encoder stage on `device` (None: its description only, for the work model), or None."""
    name = params.get("encoder", "none")
    if name not in ENCODERS:
        raise ValueError(f"policy: unknown encoder {name!r}; known: {', '.join(ENCODERS)}")
    return None
