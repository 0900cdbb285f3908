"""Input validation shared by the reference and every unet1d variant: a clear error naming the problem."""
from __future__ import annotations

import torch

from ._net import Call


def check_inputs(sample: object, timestep: object, global_cond: object, obs: object, call: object, variant: str,
                 integer_timesteps: bool = False, contiguous: bool = False) -> None:
    """Raise TypeError / ValueError for input the U-Net cannot take (shapes against the net's config)."""
    where = f"unet1d.{variant}"
    if not isinstance(call, Call):
        raise TypeError(f"{where}: the last input must be a unet1d Call, got {type(call).__name__}")
    cfg, net = call.net.config, call.net
    for name, t in (("sample", sample), ("timestep", timestep), ("global_cond", global_cond), ("obs", obs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a tensor, got {type(t).__name__}")
        if t.device != net.device:
            raise ValueError(f"{where}: {name} is on {t.device}, the weights are on {net.device}")
        if contiguous and not t.is_contiguous():
            raise ValueError(f"{where}: {name} must be contiguous")
    if sample.dim() != 3 or sample.shape[2] != cfg.input_dim:
        raise ValueError(f"{where}: sample must be (B, T, {cfg.input_dim}), got {tuple(sample.shape)}")
    B, T = sample.shape[0], sample.shape[1]
    if T % cfg.horizon_multiple:
        raise ValueError(f"{where}: horizon T = {T} is not a multiple of 2^(levels-1) = {cfg.horizon_multiple}")
    if sample.dtype != net.dtype:
        raise TypeError(f"{where}: sample is {sample.dtype}, the weights are {net.dtype}")
    if timestep.shape not in ((B,), ()):
        raise ValueError(f"{where}: timestep must be ({B},) or 0-d, got {tuple(timestep.shape)}")
    if (integer_timesteps or call.form == "step") and timestep.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{where}: timestep must be int64 here (it indexes the step table), got {timestep.dtype}")
    if integer_timesteps and timestep.dtype != torch.int64:
        raise TypeError(f"{where}: timestep must be int64, got {timestep.dtype}")
    if global_cond.shape != (B, cfg.global_cond_dim):
        raise ValueError(f"{where}: global_cond must be ({B}, {cfg.global_cond_dim}), got {tuple(global_cond.shape)}")
    width = sum(w for _, w in net.module.film_slices())
    if obs.shape != (B, width):
        raise ValueError(f"{where}: obs must be ({B}, {width}) (the FiLM of every block), got {tuple(obs.shape)}")
    for name, t in (("global_cond", global_cond), ("obs", obs)):
        if t.dtype != net.dtype:
            raise TypeError(f"{where}: {name} is {t.dtype}, the weights are {net.dtype}")
