"""policy family: one Diffusion Policy action chunk, conditioning (or observation) + noise -> final actions.

Inputs (make_inputs): global_cond (B, G) ~ N(0, 1), or with an `encoder` the normalised observation instead
(image (B, n_obs, 3, H, W) ~ U(-1, 1), agent_pos (B, n_obs, 2) ~ U(-1, 1), global_cond None); the stacked noise
(S + 1, B, T, D) drawn as diffusers draws it (_chunk.predraw); and a `Chunk` (net, schedule, noise seed,
encoder). Output: the actions after the last of the S steps, (B, T, D) float32.

Case parameters: the U-Net config fields (unet1d's UNetConfig) or `checkpoint: PATH`; `weights_seed`; B; T;
the scheduler (denoise's Schedule fields: scheduler ddpm | ddim, num_train_timesteps, num_inference_steps,
beta_schedule, clip_sample, eta, ...); `prediction_type` (epsilon only); `noise_generator` (cpu | device);
`encoder` (none | resnet18_gn: Diffusion Policy's image policy's | lerobot_resnet18_gn, lerobot_resnet18_bn:
LeRobot's | robomimic_resnet18_gn, robomimic_resnet18_bn: Diffusion Policy's hybrid image policy's) with
`n_obs_steps`, `image_size`, `crop`, `keypoints`, `cameras`, `separate` (_encoding.py).
"""
from __future__ import annotations

import torch

import dpk
from dpk.lru import LRU
from dpk.tolerance import torch_dtype

from ..denoise._schedule import Schedule
from ..unet1d._net import DTYPES, case_config, find_net, get_net
from ..unet1d._net import conv_bytes as _conv_bytes
from ._checks import check_inputs, check_prediction_type
from ._chunk import Chunk, noise_spec, predraw
from ._encoding import encoder_for
from ._oracle import loop64, propagated_tolerance

KEEP = 16  # oracle chunks kept
_clean: LRU[torch.Tensor] = LRU(KEEP)  # the oracle's chunk per (case, weights, device): the tolerance's anchor


def _schedule(case: dpk.Case) -> Schedule:
    check_prediction_type(case.get("prediction_type", "epsilon"), f"policy case {case.id}")
    return Schedule.from_params(case.p)


def make_inputs(case: dpk.Case, device: torch.device) -> tuple:
    """(global_cond, image, agent_pos, noise, chunk) on `device`, drawn from the case seed."""
    if case.dtype not in DTYPES:
        raise ValueError(f"policy case {case.id}: the U-Net runs in {' or '.join(DTYPES)} (got {case.dtype})")
    net = get_net(case.p, device, torch_dtype(case.dtype))
    cfg, B, T = net.config, int(case["B"]), int(case["T"])
    if T % cfg.horizon_multiple:
        raise ValueError(f"policy case {case.id}: T = {T} is not a multiple of 2^(levels-1) = {cfg.horizon_multiple}")
    encoder = encoder_for(case.p, cfg.global_cond_dim, device)
    chunk = Chunk(net, _schedule(case), noise_spec(case.seed, case.get("noise_generator", "cpu")), encoder)
    g = torch.Generator().manual_seed(case.seed)
    if encoder is None:
        global_cond, image, agent_pos = torch.randn(B, cfg.global_cond_dim, generator=g).to(device), None, None
    else:
        global_cond = None
        image, agent_pos = (t.to(device) for t in encoder.random_observation(B, g))
    noise = predraw(chunk.noise, chunk.schedule, (B, T, cfg.input_dim), device)
    return global_cond, image, agent_pos, noise, chunk


def tolerance(case: dpk.Case, compute: str) -> dpk.Tolerance:
    """Per-step rounding propagated through the chunk by a float64 shadow run (_oracle.py, NOTES.md), on the
    weights the case runs (a bf16 case's oracle: its bf16 weights in float64). A bf16 case's PyTorch variants
    store the U-Net's activations in bf16; the float32-compute ones (the kernels) only read bf16 weights, which
    the oracle shares, so theirs is the float32 bound."""
    found = find_net(case.p)
    inputs = make_inputs(case, found.device if found is not None else torch.device("cpu"))
    chunk = inputs[-1]
    key = (case.id, chunk.net.weights, str(chunk.net.device))
    clean = _clean.get_or_make(key, lambda: loop64(chunk, *inputs[:4]))
    activations = "float32" if compute == "float32" else case.dtype
    return propagated_tolerance(chunk, inputs[:4], clean, compute, activations, case.id)


def work(case: dpk.Case) -> dpk.Work:
    """The floor's bytes: every step's forward streams the conv weights once (S x unet1d's floor); with the
    encoder stage, its weights once more."""
    cfg = case_config(case.p)
    steps = _schedule(case).num_inference_steps
    enc = encoder_for(case.p, cfg.global_cond_dim, None)
    return dpk.Work(bytes=steps * _conv_bytes(cfg, torch_dtype(case.dtype)) + (enc.weight_bytes() if enc else 0))


@dpk.family("policy", make_inputs=make_inputs, tolerance=tolerance, work=work,
            params=("checkpoint", "weights_seed", "num_inference_steps", "scheduler", "eta", "noise_generator"),
            latency=True, output_dtype="float32")
def reference(global_cond: torch.Tensor | None, image: torch.Tensor | None, agent_pos: torch.Tensor | None,
              noise: torch.Tensor, chunk: Chunk) -> torch.Tensor:
    """The chunk in float64: float64 U-Net and encoder, denoise's float64 step, the same noise."""
    check_inputs(global_cond, image, agent_pos, noise, chunk, "reference", dtypes=(torch.float64, torch.float32))
    return loop64(chunk, global_cond, image, agent_pos, noise)
