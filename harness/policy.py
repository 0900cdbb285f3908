"""`dpk.load_policy`: a Diffusion Policy a control loop calls, from a checkpoint, on the fastest checked variant.

    policy = dpk.load_policy("epoch=0550.ckpt", scheduler="ddim16")   # loads, picks, verifies, captures
    actions = policy(image=image, agent_pos=agent_pos)                  # (B, n_action_steps, D) on the host

The policy family (kernels/policy/) does the work (_runtime.py); this adapter finds it by path like every
other entry point, so a second kernels dir can replace it.
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from . import paths, registry


def load_policy(checkpoint: str | Path | None = None, *, config: dict[str, Any] | None = None, weights_seed: int = 0,
                scheduler: str | dict[str, Any] | None = None, batch: int = 1, horizon: int | None = None,
                device: str | torch.device | None = None, variant: str | None = None, verify: bool = True,
                observation: bool | None = None, pick: str = "measure", candidates: Sequence[str] | None = None,
                dtype: str = "float32", kernels_dirs: list[Path] | None = None) -> Any:
    """A `Policy` (kernels/policy/_runtime.py) for `checkpoint` (any of the unet1d family's three formats) or for
    seeded random weights of `config` (UNetConfig fields).

    scheduler: None (the checkpoint's own sampler), "ddpm100", "ddim16", or a dict of denoise Schedule fields.
    batch, horizon: the shapes captured at load (another batch is captured on its first call).
    variant: force one; else pick="measure" times every candidate that runs here at load (action latency, the
    timing engine's latency loop) and takes the fastest, pick="order" the first of the family's PREFERENCE that
    runs; candidates: the variants raced (default: all but `compiled`, whose compile costs minutes at load).
    verify: check the chosen one with the parity engine first (the next fastest where it fails).
    observation: None runs the checkpoint's image encoder when it has one (call with image=, agent_pos=: raw
    observations, normalised with the checkpoint's normaliser; a LeRobot policy without cameras: agent_pos= and
    env_state=), False takes global_cond only, True requires one of those.
    dtype: "bfloat16" runs the U-Net's weights in bf16 (the kernels keep fp32 activations; the PyTorch variants
    bf16 ones); observations, conditioning, noise, trajectory and actions stay float32.
    Actions come back in the environment's units when the checkpoint has a normaliser.
    """
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reg = registry.load(paths.kernel_dirs(kernels_dirs, True), families=["policy"])
    if "policy" not in reg.families:
        raise RuntimeError(f"no policy family in {paths.kernel_dirs(kernels_dirs, True)}")
    runtime = importlib.import_module(f"{registry.PLUGIN_PACKAGE}.policy._runtime")
    return runtime.load(reg, None if checkpoint is None else str(checkpoint), config=config,
                        weights_seed=weights_seed, scheduler=scheduler, batch=batch, horizon=horizon, device=dev,
                        variant=variant, verify=verify, observation=observation, pick=pick, candidates=candidates,
                        dtype=dtype)
