"""Input validation shared by the reference and every policy variant: a clear error naming the problem."""
from __future__ import annotations

import torch

from ._chunk import Chunk

PREDICTION_TYPES = ("epsilon",)  # what every variant's step computes (diffusers' default, Diffusion Policy's)


def check_prediction_type(value: object, where: str) -> None:
    if value not in PREDICTION_TYPES:
        raise ValueError(f"{where}: prediction_type {value!r} is not supported: every variant predicts the noise "
                         f"(epsilon), as Diffusion Policy's Push-T policies do")


def check_inputs(global_cond: object, image: object, agent_pos: object, noise: object, chunk: object,
                 variant: str, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> int:
    """Raise TypeError / ValueError for input a chunk cannot take; returns the batch size."""
    where = f"policy.{variant}"
    if not isinstance(chunk, Chunk):
        raise TypeError(f"{where}: the last input must be a policy Chunk, got {type(chunk).__name__}")
    cfg, dev = chunk.net.config, chunk.net.device
    if not isinstance(noise, torch.Tensor):
        raise TypeError(f"{where}: noise must be a tensor (S + 1, B, T, D), got {type(noise).__name__}")
    S = chunk.steps
    if noise.dim() != 4 or noise.shape[0] != S + 1 or noise.shape[3] != cfg.input_dim:
        raise ValueError(f"{where}: noise must be ({S + 1}, B, T, {cfg.input_dim}) (the initial trajectory and one z "
                         f"per step), got {tuple(noise.shape)}")
    B, T = noise.shape[1], noise.shape[2]
    if T % cfg.horizon_multiple:
        raise ValueError(f"{where}: horizon T = {T} is not a multiple of 2^(levels-1) = {cfg.horizon_multiple}")
    named = [("noise", noise)]
    if chunk.encoder is None:
        if image is not None or agent_pos is not None:
            raise ValueError(f"{where}: this chunk has no encoder stage: pass global_cond, not image/agent_pos")
        if not isinstance(global_cond, torch.Tensor):
            raise TypeError(f"{where}: global_cond must be a ({B}, {cfg.global_cond_dim}) tensor, got "
                            f"{type(global_cond).__name__}")
        if global_cond.shape != (B, cfg.global_cond_dim):
            raise ValueError(f"{where}: global_cond must be ({B}, {cfg.global_cond_dim}), got "
                             f"{tuple(global_cond.shape)}")
        named.append(("global_cond", global_cond))
    else:
        if global_cond is not None:
            raise ValueError(f"{where}: this chunk encodes observations: pass image and agent_pos, not global_cond")
        chunk.encoder.check(image, agent_pos, B, where)
        named += [("image", image), ("agent_pos", agent_pos)]
    for name, t in named:
        if t.device != dev:
            raise ValueError(f"{where}: {name} is on {t.device}, the weights are on {dev}")
        if t.dtype not in dtypes:
            raise TypeError(f"{where}: {name} is {t.dtype}, expected {', '.join(map(str, dtypes))}")
    return B
