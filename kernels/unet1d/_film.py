"""The FiLM algebra of the denoising-step form.

Every block's FiLM is `Linear(Mish(cat(step_emb(t), global_cond)))`; Mish is elementwise and Linear is linear, so
    embed = W_t mish(step_emb(t)) + W_g mish(global_cond) + b
with W = [W_t | W_g] the block's cond_encoder weight. Concatenated over the blocks (forward order, F columns in
all), `table[t] = W_t mish(step_emb(t))` is a function of the timestep alone, made once at load for every
integer t < num_train_timesteps (in float64, rounded once to float32), and `observe(g) = W_g mish(g) + b` is
made once per observation. Per denoising step a forward then reads FiLM as table[t] + obs: no FiLM or
step-encoder weights are streamed.
"""
from __future__ import annotations

import torch

from ._unet import ConditionalUnet1D


def film_weight(model: ConditionalUnet1D) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (F, cond_dim), b (F,)): every block's cond_encoder Linear, stacked in forward order."""
    lins = [blk.cond_encoder[1] for _, blk in model.res_blocks()]
    return torch.cat([m.weight for m in lins]), torch.cat([m.bias for m in lins])


@torch.no_grad()
def step_table(model: ConditionalUnet1D, num_t: int) -> torch.Tensor:
    """(num_t, F) float32: W_t mish(step_emb(t)) for t = 0 .. num_t - 1, computed in float64."""
    dsed = model.cfg.diffusion_step_embed_dim
    w, _ = film_weight(model)
    enc = model.diffusion_step_encoder
    dev = w.device
    t = torch.arange(num_t, dtype=torch.float64, device=dev)
    h = enc[0](t)
    h = torch.nn.functional.linear(h, enc[1].weight.double(), enc[1].bias.double())
    h = torch.nn.functional.linear(torch.nn.functional.mish(h), enc[3].weight.double(), enc[3].bias.double())
    return (torch.nn.functional.mish(h) @ w[:, :dsed].double().T).float()


@torch.no_grad()
def observe(model: ConditionalUnet1D, global_cond: torch.Tensor | None, batch: int,
            weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """(B, F): W_g mish(global_cond) + b, in the precision of `weights` (film_weight(model) made once, e.g.
    widened to float32; by default the model's own, stacked per call; float32: TF32 is off for matmuls)."""
    dsed = model.cfg.diffusion_step_embed_dim
    w, b = weights if weights is not None else film_weight(model)
    if global_cond is None or model.cfg.global_cond_dim == 0:
        return b.expand(batch, -1).clone()
    return torch.nn.functional.linear(torch.nn.functional.mish(global_cond.to(w.dtype)), w[:, dsed:], b)


def step_film(table: torch.Tensor, obs: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
    """(B, F) FiLM of one denoising step: table rows at the (B,) integer timesteps + the observation part."""
    return table.index_select(0, timestep.reshape(-1).long()).to(obs.dtype) + obs
