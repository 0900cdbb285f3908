"""The on-disk layouts of a ConditionalUnet1D's weights, and writers that fabricate each one (tests, docs).

Three layouts hold the same tensors (`load_checkpoint` in _checkpoint.py reads all of them):
  state_dict         torch.save(unet.state_dict()) as .pt/.pth (optionally {"state_dict": sd}), or .safetensors;
                     upstream key names, nothing else stored (n_groups is not recoverable from shapes).
  diffusion_policy   a training checkpoint `<tag>.ckpt` written by BaseWorkspace.save_checkpoint:
                     torch.save({"cfg": OmegaConf cfg, "state_dicts": {"model": policy_sd, "ema_model": policy_sd,
                     "optimizer": ...}, "pickles": {"_output_dir": dill bytes}}, pickle_module=dill).
                     The policy's state dict holds the U-Net under `model.` beside `obs_encoder.*`,
                     `normalizer.*`, `mask_generator.*`; U-Net settings sit in cfg.policy (image/hybrid policies)
                     or cfg.policy.model (lowdim: the U-Net is instantiated by hydra from that node).
  lerobot            a pretrained-policy folder: config.json (`"type": "diffusion"`, `down_dims`, `kernel_size`,
                     `n_groups`, `diffusion_step_embed_dim`, `use_film_scale_modulation`,
                     `output_features.action.shape`) + model.safetensors with the U-Net under `diffusion.unet.`
                     (`diffusion.unet._orig_mod.` when saved compiled) beside `diffusion.rgb_encoder.*`.
                     LeRobot names a residual block's Conv1dBlocks `conv1`/`conv2` (upstream `blocks.0`/`blocks.1`)
                     and its down/up-sampling convs are bare nn.Conv1d/nn.ConvTranspose1d (`.2.weight`, upstream
                     `.2.conv.weight`); every other name matches upstream.

To make a test checkpoint of each kind from a ConditionalUnet1D `unet` built with UNetConfig `cfg`:
    save_state_dict(unet, "unet.safetensors")
    save_diffusion_policy_ckpt(unet, "latest.ckpt", ema_model=ema_unet, cfg=cfg)
    save_lerobot_folder(unet, "pretrained_model/", cfg)
"""
from __future__ import annotations

import json
import pickle
import re
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch

DP_PREFIX = "model."  # the U-Net inside a diffusion_policy policy's state dict
LEROBOT_PREFIX = "diffusion.unet."  # the U-Net inside a LeRobot DiffusionPolicy's state dict
DP_POLICY = "diffusion_policy.policy.diffusion_unet_image_policy.DiffusionUnetImagePolicy"
# cfg.policy keys that set up the U-Net (diffusion_unet_{image,hybrid_image,video}_policy.py arguments).
DP_CFG_KEYS = ("n_groups", "down_dims", "kernel_size", "cond_predict_scale", "diffusion_step_embed_dim")
# Where they are: cfg.policy (image/hybrid/video policies), cfg.policy.model (lowdim: hydra builds the U-Net from it).
DP_CFG_SECTIONS = {"policy": DP_CFG_KEYS, "policy.model": (*DP_CFG_KEYS, "input_dim", "global_cond_dim")}
# LeRobot config.json field -> UNetConfig field (the action dim comes from output_features.action.shape).
LEROBOT_FIELDS = {"down_dims": "down_dims", "kernel_size": "kernel_size", "n_groups": "n_groups",
                  "diffusion_step_embed_dim": "diffusion_step_embed_dim",
                  "use_film_scale_modulation": "cond_predict_scale"}

_BLOCK = r"^((?:down|up)_modules\.\d+\.[01]|mid_modules\.[01])"
_SAMPLER = r"^((?:down|up)_modules\.\d+\.2)"
LEROBOT_NAMED = re.compile(_BLOCK + r"\.conv[12]\.")  # a key that only LeRobot's naming has


def from_lerobot(key: str) -> str:
    """LeRobot U-Net key (prefix stripped) -> upstream key."""
    key = re.sub(_BLOCK + r"\.conv([12])\.", lambda m: f"{m[1]}.blocks.{int(m[2]) - 1}.", key)
    return re.sub(_SAMPLER + r"\.(weight|bias)$", r"\1.conv.\2", key)


def to_lerobot(key: str) -> str:
    """Upstream key -> LeRobot U-Net key (without the `diffusion.unet.` prefix)."""
    key = re.sub(_BLOCK + r"\.blocks\.([01])\.", lambda m: f"{m[1]}.conv{int(m[2]) + 1}.", key)
    return re.sub(_SAMPLER + r"\.conv\.(weight|bias)$", r"\1.\2", key)


def _tensors(model_or_sd: torch.nn.Module | dict) -> dict[str, torch.Tensor]:
    sd = model_or_sd.state_dict() if isinstance(model_or_sd, torch.nn.Module) else model_or_sd
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in sd.items()}


def save_state_dict(model_or_sd: torch.nn.Module | dict, path: str | Path, wrapped: bool = False) -> Path:
    """Write a bare U-Net state dict: .pt/.pth via torch.save (as {"state_dict": sd} if wrapped), or .safetensors."""
    path, sd = Path(path), _tensors(model_or_sd)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file
        save_file(sd, str(path), metadata={"format": "pt"})
    elif path.suffix in (".pt", ".pth"):
        torch.save({"state_dict": sd} if wrapped else sd, path)
    else:
        raise ValueError(f"{path}: save_state_dict writes .pt, .pth or .safetensors")
    return path


def diffusion_policy_cfg(config: Any, omegaconf: bool = False) -> Any:
    """A cfg shaped like diffusion_policy's train_diffusion_unet_image_workspace.yaml, as a dict or OmegaConf."""
    c = asdict(config)
    policy = {"_target_": DP_POLICY, "horizon": "${horizon}", "n_obs_steps": "${n_obs_steps}",
              "obs_as_global_cond": True, "noise_scheduler": {"num_train_timesteps": 100},
              **{k: list(c[k]) if k == "down_dims" else c[k] for k in DP_CFG_KEYS}}
    cfg = {"name": "train_diffusion_unet_image", "horizon": 16, "n_obs_steps": 2, "policy": policy,
           "training": {"use_ema": True, "seed": 42}, "task": {"name": "pusht_image"}}
    if omegaconf:
        from omegaconf import OmegaConf
        return OmegaConf.create(cfg)
    return cfg


def _policy_state_dict(model: torch.nn.Module, extra_prefixes: bool,
                       others: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    sd = {DP_PREFIX + k: v for k, v in _tensors(model).items()}
    if others is not None:  # the policy's real other tensors (an obs encoder, a normalizer)
        sd.update(_tensors(others))
    elif extra_prefixes:  # what else a diffusion_unet_*_policy holds: none of it belongs to the U-Net
        sd.update({"obs_encoder.nets.rgb.backbone.conv1.weight": torch.randn(4, 3, 3, 3),
                   "normalizer.params_dict.action.scale": torch.ones(2),
                   "normalizer.params_dict.action.offset": torch.zeros(2),
                   "mask_generator._dummy_variable": torch.zeros(0)})
    return sd


def save_diffusion_policy_ckpt(model: torch.nn.Module, path: str | Path, ema_model: torch.nn.Module | None = None,
                               extra_prefixes: bool = True, cfg: Any = None, pickle_module: Any = pickle,
                               others: dict | None = None, ema_others: dict | None = None) -> Path:
    """Write a diffusion_policy workspace checkpoint around `model` (and `ema_model`).

    cfg: a UNetConfig (turned into diffusion_policy's cfg, an OmegaConf object when omegaconf imports), or any
    object stored as payload["cfg"] unchanged (a dict, an OmegaConf cfg, None). pickle_module: diffusion_policy
    itself uses dill; plain pickle writes the same structure. others / ema_others: the rest of the policy state
    dict beside `model.*` (obs_encoder.*, normalizer.*, ...) for each; default a few placeholders (extra_prefixes).
    """
    if is_dataclass(cfg):
        try:
            import omegaconf  # noqa: F401
            cfg = diffusion_policy_cfg(cfg, omegaconf=True)
        except ImportError:
            cfg = diffusion_policy_cfg(cfg)
    state_dicts = {"model": _policy_state_dict(model, extra_prefixes, others)}
    if ema_model is not None:
        state_dicts["ema_model"] = _policy_state_dict(ema_model, extra_prefixes, ema_others)
    n_params = len(list(model.parameters()))
    state_dicts["optimizer"] = {"state": {}, "param_groups": [{"lr": 1e-4, "betas": (0.95, 0.999),
                                                                "params": list(range(n_params))}]}
    payload = {"cfg": cfg, "state_dicts": state_dicts,
               "pickles": {"_output_dir": pickle_module.dumps("data/outputs/train_diffusion_unet_image")}}
    path = Path(path)
    with path.open("wb") as f:
        torch.save(payload, f, pickle_module=pickle_module)
    return path


def lerobot_config(config: Any, **extra: Any) -> dict[str, Any]:
    """config.json of a LeRobot DiffusionPolicy with this U-Net (LeRobot's field names), `extra` merged on top."""
    n_obs = 2 if config.global_cond_dim % 2 == 0 else 1
    cfg = {"type": "diffusion", "n_obs_steps": n_obs, "horizon": 16, "n_action_steps": 8,
           "input_features": {"observation.state": {"type": "STATE", "shape": [config.global_cond_dim // n_obs]}},
           "output_features": {"action": {"type": "ACTION", "shape": [config.input_dim]}},
           "vision_backbone": "resnet18", "down_dims": list(config.down_dims), "kernel_size": config.kernel_size,
           "n_groups": config.n_groups, "diffusion_step_embed_dim": config.diffusion_step_embed_dim,
           "use_film_scale_modulation": config.cond_predict_scale, "noise_scheduler_type": "DDPM",
           "num_train_timesteps": 100, "compile_model": False}
    cfg.update(extra)
    return cfg


def save_lerobot_folder(model: torch.nn.Module, folder: str | Path, config: Any,
                        config_extra: dict[str, Any] | None = None, compiled: bool = False,
                        others: dict | None = None, encoder: dict | None = None) -> Path:
    """Write a LeRobot pretrained-policy folder: config.json + model.safetensors (`diffusion.unet.` keys,
    LeRobot's names, plus `encoder`: the `diffusion.rgb_encoder.*` tensors, by default a few placeholders that no
    encoder fits); `compiled` adds torch.compile's `_orig_mod.`; `others` adds more tensors (normalisation
    buffers)."""
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prefix = LEROBOT_PREFIX + ("_orig_mod." if compiled else "")
    sd = {prefix + to_lerobot(k): v for k, v in _tensors(model).items()}
    sd.update(encoder if encoder is not None else {"diffusion.rgb_encoder.backbone.0.weight": torch.randn(4, 3, 3, 3),
                                                   "diffusion.rgb_encoder.out.weight": torch.randn(8, 8),
                                                   "diffusion.rgb_encoder.out.bias": torch.zeros(8)})
    sd.update(_tensors(others or {}))
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(lerobot_config(config, **(config_extra or {})), indent=4))
    return folder
