"""Diffusion Policy's ConditionalUnet1D (Chi et al.): the module tree and forward of the reference implementation.

Written to the same module tree as diffusion_policy/model/diffusion/conditional_unet1d.py, so state dicts load
with the upstream key names (`down_modules.{i}.{0,1}.blocks.{0,1}.block.{0,1}.*`, `...cond_encoder.1.*`,
`down_modules.{i}.2.conv.*`, `up_modules.{i}.2.conv.*`, `final_conv.{0,1}.*`, `diffusion_step_encoder.{1,3}.*`)
and the forward is the same sequence of torch operations. Differences from upstream: no local conditioning
(local_cond_dim is always None), no einops, and global_cond_dim == 0 means "no global conditioning" (upstream's
None: the same parameter shapes, since the FiLM input width is diffusion_step_embed_dim + global_cond_dim).

Shapes: sample (B, T, input_dim), timestep int / 0-d / (B,), global_cond (B, global_cond_dim) or None,
output (B, T, input_dim). T must be divisible by 2 ** (len(down_dims) - 1).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class UNetConfig:
    input_dim: int  # action dim
    global_cond_dim: int  # 0: no global conditioning
    diffusion_step_embed_dim: int
    down_dims: tuple[int, ...]
    kernel_size: int
    n_groups: int  # GroupNorm groups of every residual block (the final Conv1dBlock always uses 8, as upstream)
    cond_predict_scale: bool  # FiLM predicts a per-channel scale as well as a bias


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half_dim = self.dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=x.device) * -emb)
        emb = x[:, None] * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class Conv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish, as `block.{0,1,2}`."""

    def __init__(self, inp_channels: int, out_channels: int, kernel_size: int, n_groups: int = 8):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(inp_channels, out_channels, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out_channels),
            nn.Mish(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Downsample1d(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample1d(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(dim, dim, 4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class _Unsqueeze(nn.Module):
    """Upstream's einops Rearrange('batch t -> batch t 1') at cond_encoder.2 (no parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(-1)


class ConditionalResidualBlock1D(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, cond_dim: int, kernel_size: int = 3, n_groups: int = 8,
                 cond_predict_scale: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList([
            Conv1dBlock(in_channels, out_channels, kernel_size, n_groups=n_groups),
            Conv1dBlock(out_channels, out_channels, kernel_size, n_groups=n_groups),
        ])
        cond_channels = out_channels * 2 if cond_predict_scale else out_channels
        self.cond_predict_scale = cond_predict_scale
        self.out_channels = out_channels
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, cond_channels), _Unsqueeze())
        self.residual_conv = nn.Conv1d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        out = self.blocks[0](x)
        embed = self.cond_encoder(cond)
        if self.cond_predict_scale:
            embed = embed.reshape(embed.shape[0], 2, self.out_channels, 1)
            out = embed[:, 0, ...] * out + embed[:, 1, ...]
        else:
            out = out + embed
        out = self.blocks[1](out)
        return out + self.residual_conv(x)


class ConditionalUnet1D(nn.Module):
    def __init__(self, cfg: UNetConfig):
        super().__init__()
        self.cfg = cfg
        all_dims = [cfg.input_dim, *cfg.down_dims]
        start_dim = cfg.down_dims[0]
        dsed = cfg.diffusion_step_embed_dim
        cond_dim = dsed + cfg.global_cond_dim
        in_out = list(itertools.pairwise(all_dims))
        block = dict(cond_dim=cond_dim, kernel_size=cfg.kernel_size, n_groups=cfg.n_groups,
                     cond_predict_scale=cfg.cond_predict_scale)

        # Registration order as upstream (mid_modules first), so state_dict() lists keys in the same order.
        mid_dim = all_dims[-1]
        self.mid_modules = nn.ModuleList([ConditionalResidualBlock1D(mid_dim, mid_dim, **block) for _ in range(2)])
        self.diffusion_step_encoder = nn.Sequential(
            SinusoidalPosEmb(dsed), nn.Linear(dsed, dsed * 4), nn.Mish(), nn.Linear(dsed * 4, dsed))
        self.local_cond_encoder = None
        # Upstream's up-level is_last test (ind >= len(in_out) - 1) is never true: every up level upsamples.
        self.up_modules = nn.ModuleList([
            nn.ModuleList([
                ConditionalResidualBlock1D(dim_out * 2, dim_in, **block),
                ConditionalResidualBlock1D(dim_in, dim_in, **block),
                Upsample1d(dim_in),
            ]) for dim_in, dim_out in reversed(in_out[1:])])
        self.down_modules = nn.ModuleList([
            nn.ModuleList([
                ConditionalResidualBlock1D(dim_in, dim_out, **block),
                ConditionalResidualBlock1D(dim_out, dim_out, **block),
                Downsample1d(dim_out) if ind < len(in_out) - 1 else nn.Identity(),
            ]) for ind, (dim_in, dim_out) in enumerate(in_out)])
        self.final_conv = nn.Sequential(
            Conv1dBlock(start_dim, start_dim, kernel_size=cfg.kernel_size),  # upstream: always 8 groups
            nn.Conv1d(start_dim, cfg.input_dim, 1),
        )

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor | float | int,
                global_cond: torch.Tensor | None = None) -> torch.Tensor:
        x = sample.transpose(1, 2)  # (B, input_dim, T)
        timesteps = timestep
        if not torch.is_tensor(timesteps):
            timesteps = torch.tensor([timesteps], dtype=torch.long, device=sample.device)
        elif timesteps.ndim == 0:
            timesteps = timesteps[None].to(sample.device)
        timesteps = timesteps.expand(sample.shape[0])
        global_feature = self.diffusion_step_encoder(timesteps)
        if global_cond is not None:
            global_feature = torch.cat([global_feature, global_cond], dim=-1)

        h = []
        for resnet, resnet2, downsample in self.down_modules:
            x = resnet2(resnet(x, global_feature), global_feature)
            h.append(x)
            x = downsample(x)
        for mid_module in self.mid_modules:
            x = mid_module(x, global_feature)
        for resnet, resnet2, upsample in self.up_modules:
            x = torch.cat((x, h.pop()), dim=1)
            x = upsample(resnet2(resnet(x, global_feature), global_feature))
        return self.final_conv(x).transpose(1, 2)
