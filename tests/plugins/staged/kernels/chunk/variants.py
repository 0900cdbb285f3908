"""Chunk variants with stages: each part spends COSTS[part] seconds on CLOCK (a test's fake clock; None: no cost),
and every call also spends COSTS["issue"] outside any stage (the host issuing work: the "host / other" share)."""
from __future__ import annotations

from typing import Any

import torch

import dpk

from .reference import STEPS

COSTS = {"encoder": 1e-3, "unet": 2e-3, "step": 5e-4, "unet_step": 1.5e-3, "issue": 5e-4}
CLOCK: Any = None  # an object with a float `t` that the parts advance


def _spend(part: str) -> None:
    if CLOCK is not None:
        CLOCK.t += COSTS[part]


def encoder(obs: torch.Tensor) -> torch.Tensor:
    _spend("encoder")
    return 2 * obs


def unet(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _spend("unet")
    return y @ w


def step(y: torch.Tensor) -> torch.Tensor:
    _spend("step")
    return y / 2


def unet_step(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _spend("unet_step")
    return (y @ w) / 2


def _eager_stages(obs: torch.Tensor, w: torch.Tensor) -> list[dpk.Stage]:
    return [dpk.Stage("encoder", lambda: encoder(obs)), dpk.Stage("unet", lambda: unet(obs, w), STEPS),
            dpk.Stage("step", lambda: step(obs), STEPS)]


@dpk.variant("chunk", "eager", baseline=True, stages=_eager_stages)
def eager(obs, w):
    """Encoder, then STEPS x (U-Net, step), plus the host's issue cost."""
    _spend("issue")
    y = encoder(obs)
    for _ in range(STEPS):
        y = step(unet(y, w))
    return y


@dpk.variant("chunk", "fused", stages=lambda obs, w: [dpk.Stage("encoder", lambda: encoder(obs)),
                                                       dpk.Stage("unet_step", lambda: unet_step(obs, w), STEPS)])
def fused(obs, w):
    """Encoder, then STEPS x one fused U-Net + step."""
    _spend("issue")
    y = encoder(obs)
    for _ in range(STEPS):
        y = unet_step(y, w)
    return y


def _broken_step() -> None:
    raise RuntimeError("no step alone")


@dpk.variant("chunk", "broken_stage", stages=lambda obs, w: [dpk.Stage("encoder", lambda: encoder(obs)),
                                                              dpk.Stage("step", _broken_step, STEPS)])
def broken_stage(obs, w):
    """eager, whose step stage cannot run alone: the row stays ok, that stage is NaN with its error."""
    return eager(obs, w)


@dpk.variant("chunk", "plain")
def plain(obs, w):
    """eager without stages: a latency, no breakdown."""
    return eager(obs, w)
