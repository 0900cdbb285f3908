"""Diffusion Policy's ConditionalUnet1D (Chi et al.), written from its description, with upstream's module tree.

`ConditionalUnet1D(cfg).state_dict()` has upstream `diffusion_policy`'s keys, so `load_state_dict(strict=True)`
takes a real checkpoint's U-Net:
  diffusion_step_encoder = [SinusoidalPosEmb(dsed), Linear(dsed, 4 dsed), Mish, Linear(4 dsed, dsed)]
  down_modules.i = [res(in, out), res(out, out), Downsample1d(out) (Conv1d k3 s2 p1; Identity on the last level)]
  mid_modules    = [res(d, d), res(d, d)]                                     d = down_dims[-1]
  up_modules.i   = [res(2 dout, din), res(din, din), Upsample1d(din) (ConvTranspose1d k4 s2 p1)]
  final_conv     = [Conv1dBlock(d0, d0, k) (always 8 groups, as upstream), Conv1d(d0, input_dim, 1)]
  res(in, out)   = blocks.{0,1} = Conv1dBlock (Conv1d(k, pad k//2) -> GroupNorm -> Mish); cond_encoder =
                   [Mish, Linear(cond_dim, 2 out | out), unsqueeze]; FiLM h = scale h + bias (or h + embed)
                   between the two blocks; + residual_conv(x) (Conv1d 1x1 when in != out, else identity)
sample (B, T, input_dim) -> (B, input_dim, T) inside -> (B, T, input_dim); cond = cat(step_emb(t), global_cond).

Two additions, neither changing the function: `film` (B, F) replaces every block's cond_encoder output (the
denoising-step form: _film.py builds it from a timestep table and a once-per-observation part), and each layer
runs in an NVTX range named like `down1.res0.conv1` when `nvtx_ranges` is on (off under torch.compile).
"""
from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

FINAL_GROUPS = 8  # upstream's final Conv1dBlock keeps Conv1dBlock's default n_groups


@dataclass(frozen=True)
class UNetConfig:
    input_dim: int
    global_cond_dim: int
    diffusion_step_embed_dim: int = 256
    down_dims: tuple[int, ...] = (256, 512, 1024)
    kernel_size: int = 5
    n_groups: int = 8
    cond_predict_scale: bool = True

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> UNetConfig:
        """The config fields of a case's (or a checkpoint's) parameters; other keys are ignored."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in p.items() if k in names}
        if "down_dims" in kw:
            kw["down_dims"] = tuple(int(d) for d in kw["down_dims"])
        cfg = cls(**kw)
        cfg.check()
        return cfg

    def check(self) -> None:
        problems = []
        if self.input_dim < 1 or self.global_cond_dim < 0:
            problems.append(f"input_dim {self.input_dim} and global_cond_dim {self.global_cond_dim} must be >= 1, >= 0")
        if self.diffusion_step_embed_dim < 4 or self.diffusion_step_embed_dim % 2:
            problems.append(f"diffusion_step_embed_dim {self.diffusion_step_embed_dim} must be even and >= 4")
        if not self.down_dims:
            problems.append("down_dims is empty")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            problems.append(f"kernel_size {self.kernel_size} must be odd")
        for d in self.down_dims:
            if d % self.n_groups:
                problems.append(f"channels {d} not divisible by n_groups {self.n_groups}")
        if self.down_dims and self.down_dims[0] % FINAL_GROUPS:
            problems.append(f"down_dims[0] {self.down_dims[0]} not divisible by the final block's 8 groups")
        if problems:
            raise ValueError("invalid U-Net config: " + "; ".join(problems))

    @property
    def cond_dim(self) -> int:
        return self.diffusion_step_embed_dim + self.global_cond_dim

    @property
    def levels(self) -> int:
        return len(self.down_dims)

    @property
    def horizon_multiple(self) -> int:
        """T must be a multiple of this: each of the levels - 1 downsamples halves it."""
        return 2 ** (self.levels - 1)


def mish(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mish(x)


class SinusoidalPosEmb(nn.Module):
    """emb = cat(sin(t f), cos(t f)), f_i = exp(-i ln(10000) / (half - 1)), i < half = dim / 2."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        dtype = t.dtype if t.is_floating_point() else torch.float32
        f = torch.exp(torch.arange(half, device=t.device, dtype=dtype) * -(math.log(10000) / (half - 1)))
        arg = t[:, None] * f[None, :]
        return torch.cat((arg.sin(), arg.cos()), dim=-1)


class Unsqueeze(nn.Module):
    """(B, C) -> (B, C, 1): upstream's parameter-free Rearrange('batch t -> batch t 1')."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(-1)


class Conv1dBlock(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, n_groups: int = 8):
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(cin, cout, k, padding=k // 2), nn.GroupNorm(n_groups, cout), nn.Mish())

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


class ConditionalResidualBlock1D(nn.Module):
    def __init__(self, cin: int, cout: int, cond_dim: int, k: int, n_groups: int, cond_predict_scale: bool):
        super().__init__()
        self.blocks = nn.ModuleList([Conv1dBlock(cin, cout, k, n_groups), Conv1dBlock(cout, cout, k, n_groups)])
        self.cond_predict_scale = cond_predict_scale
        self.out_channels = cout
        self.film_width = 2 * cout if cond_predict_scale else cout
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, self.film_width), Unsqueeze())
        self.residual_conv = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()
        self.layer_name = ""  # set by the U-Net: e.g. "down1.res0"

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None, film: torch.Tensor | None = None,
                ranges: LayerRanges | None = None) -> torch.Tensor:
        r = ranges or NO_RANGES
        with r(self.layer_name, "conv1"):
            out = self.blocks[0](x)
        with r(self.layer_name, "film"):
            embed = self.cond_encoder(cond) if film is None else film.unsqueeze(-1)
            if self.cond_predict_scale:
                embed = embed.reshape(embed.shape[0], 2, self.out_channels, 1)
                out = embed[:, 0, ...] * out + embed[:, 1, ...]
            else:
                out = out + embed
        with r(self.layer_name, "conv2"):
            out = self.blocks[1](out)
        with r(self.layer_name, "residual"):
            return out + self.residual_conv(x)


class LayerRanges:
    """NVTX ranges `<layer>.<part>` (domain dpk) around each layer, nested in the caller's family/variant/case."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def __call__(self, layer: str, part: str = "") -> contextlib.AbstractContextManager:
        if torch.compiler.is_compiling():
            return contextlib.nullcontext()
        from dpk.nvtx import Ranges

        name = f"{layer}.{part}" if part else layer
        if name not in self._cache:
            self._cache[name] = Ranges(name)
        return self._cache[name]


class _NoRanges:
    def __call__(self, layer: str, part: str = "") -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


NO_RANGES = _NoRanges()


class ConditionalUnet1D(nn.Module):
    def __init__(self, cfg: UNetConfig):
        super().__init__()
        cfg.check()
        self.cfg = cfg
        self.nvtx_ranges = False
        self._ranges = LayerRanges()
        dsed, k, g, cps, cd = (cfg.diffusion_step_embed_dim, cfg.kernel_size, cfg.n_groups, cfg.cond_predict_scale,
                               cfg.cond_dim)
        step_encoder = nn.Sequential(SinusoidalPosEmb(dsed), nn.Linear(dsed, 4 * dsed), nn.Mish(),
                                     nn.Linear(4 * dsed, dsed))
        in_out = list(itertools.pairwise((cfg.input_dim, *cfg.down_dims)))

        def res(cin: int, cout: int) -> ConditionalResidualBlock1D:
            return ConditionalResidualBlock1D(cin, cout, cd, k, g, cps)

        mid = cfg.down_dims[-1]
        # attributes in upstream's order, so state_dict() lists the keys in the same order too
        self.mid_modules = nn.ModuleList([res(mid, mid), res(mid, mid)])
        self.diffusion_step_encoder = step_encoder
        self.up_modules = nn.ModuleList(  # upstream's is_last test never holds here: every up level upsamples
            nn.ModuleList([res(2 * o, i), res(i, i), Upsample1d(i) if n < len(in_out) - 1 else nn.Identity()])
            for n, (i, o) in enumerate(reversed(in_out[1:])))
        self.down_modules = nn.ModuleList(
            nn.ModuleList([res(i, o), res(o, o), Downsample1d(o) if n < len(in_out) - 1 else nn.Identity()])
            for n, (i, o) in enumerate(in_out))
        d0 = cfg.down_dims[0]
        self.final_conv = nn.Sequential(Conv1dBlock(d0, d0, k, FINAL_GROUPS), nn.Conv1d(d0, cfg.input_dim, 1))
        for name, blk in self.res_blocks():
            blk.layer_name = name

    def res_blocks(self) -> Iterator[tuple[str, ConditionalResidualBlock1D]]:
        """The residual blocks in forward order with their layer names (down0.res0, ..., mid1, ..., up1.res1)."""
        for i, level in enumerate(self.down_modules):
            yield f"down{i}.res0", level[0]
            yield f"down{i}.res1", level[1]
        for i, blk in enumerate(self.mid_modules):
            yield f"mid{i}", blk
        for i, level in enumerate(self.up_modules):
            yield f"up{i}.res0", level[0]
            yield f"up{i}.res1", level[1]

    def film_slices(self) -> list[tuple[int, int]]:
        """(offset, width) of each block's FiLM embedding inside the concatenated `film` (B, F), forward order."""
        out, off = [], 0
        for _, blk in self.res_blocks():
            out.append((off, blk.film_width))
            off += blk.film_width
        return out

    def timesteps(self, timestep: torch.Tensor | float | int, batch: int, device: torch.device) -> torch.Tensor:
        t = timestep if torch.is_tensor(timestep) else torch.tensor([timestep], dtype=torch.long, device=device)
        if t.dim() == 0:
            t = t[None]
        if t.dim() != 1 or t.shape[0] not in (1, batch):
            raise ValueError(f"timestep must be an int, a 0-d tensor or a ({batch},) tensor, got {tuple(t.shape)}")
        return t.to(device).expand(batch)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor | float | int,
                global_cond: torch.Tensor | None = None, film: torch.Tensor | None = None) -> torch.Tensor:
        """sample (B, T, input_dim) -> (B, T, input_dim). With `film` (B, F) the step encoder and every
        cond_encoder are skipped: block i takes film[:, off_i:off_i + width_i] as its embedding."""
        r = self._ranges if self.nvtx_ranges else NO_RANGES
        x = sample.transpose(1, 2)
        cond = None
        if film is None:
            with r("step_encoder"):  # the embedding of integer t is float32: cast to the weights' dtype (bf16)
                enc = self.diffusion_step_encoder
                emb = enc[0](self.timesteps(timestep, x.shape[0], x.device)).to(enc[1].weight.dtype)
                cond = enc[3](enc[2](enc[1](emb)))
            if global_cond is not None:
                cond = torch.cat([cond, global_cond], dim=-1)
        films = iter([film[:, o:o + w] for o, w in self.film_slices()] if film is not None else [])
        skips = []
        for i, (res0, res1, down) in enumerate(self.down_modules):
            x = res0(x, cond, next(films, None), r)
            x = res1(x, cond, next(films, None), r)
            skips.append(x)
            with r(f"down{i}.downsample"):
                x = down(x)
        for blk in self.mid_modules:
            x = blk(x, cond, next(films, None), r)
        for i, (res0, res1, up) in enumerate(self.up_modules):
            x = torch.cat((x, skips.pop()), dim=1)
            x = res0(x, cond, next(films, None), r)
            x = res1(x, cond, next(films, None), r)
            with r(f"up{i}.upsample"):
                x = up(x)
        with r("final.conv"):
            x = self.final_conv[0](x)
        with r("final.proj"):
            x = self.final_conv[1](x)
        return x.transpose(1, 2)


def build(cfg: UNetConfig, seed: int) -> ConditionalUnet1D:
    """A U-Net initialised as PyTorch initialises its modules, from `seed` (CPU RNG, so every machine agrees)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ConditionalUnet1D(cfg).eval()


def is_film_or_step(name: str) -> bool:
    """Parameters that the denoising-step form reads from tables instead: FiLM linears and the step encoder."""
    return ".cond_encoder." in name or name.startswith("diffusion_step_encoder.")


def conv_param_count(model: ConditionalUnet1D) -> int:
    """Parameters streamed by every step-form forward (convs, their biases, GroupNorm affines): the floor's."""
    return sum(p.numel() for n, p in model.named_parameters() if not is_film_or_step(n))
