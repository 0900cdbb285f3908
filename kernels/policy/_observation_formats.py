"""Where the observation side of a policy sits in each checkpoint layout, and writers that fabricate it (tests, docs).

  diffusion_policy  (DiffusionUnetImagePolicy; the U-Net beside it under `model.`, _checkpoint_formats.py)
      obs_encoder._dummy_variable                          ModuleAttrMixin's empty parameter, shape (0,)
      obs_encoder.key_model_map.<rgb key>.<resnet18 key>   the ResNet (`rgb` instead of the key: share_rgb_model)
      normalizer.params_dict.<key>.scale | offset | input_stats.{min,max,mean,std}   one per obs key and action
      cfg.policy.obs_encoder.{crop_shape, random_crop, use_group_norm, share_rgb_model, imagenet_norm,
      resize_shape, rgb_model.name}, cfg.policy.shape_meta (or cfg.shape_meta, cfg.task.shape_meta),
      cfg.policy.n_obs_steps, cfg.policy.obs_as_global_cond
      DiffusionUnetHybridImagePolicy: obs_encoder.obs_nets.<rgb key>.* instead (robomimic's; _observation_hybrid.py),
      settings in cfg.policy.{crop_shape, obs_encoder_group_norm, eval_fixed_crop}
  lerobot  (model.safetensors beside config.json)
      diffusion.rgb_encoder.{backbone.<i>.*, pool.nets.*, pool.pos_grid, out.*}   DiffusionRgbEncoder (`.0.` after
          rgb_encoder with use_separate_rgb_encoder_per_camera); backbone numbered as resnet18's children[:-2]
      config.json: input_features {key: {type: VISUAL | STATE | ENV, shape}}, crop_shape, use_group_norm,
          spatial_softmax_num_keypoints, n_obs_steps, normalization_mapping {VISUAL, STATE, ACTION: MEAN_STD |
          MIN_MAX | ...}; older releases: input_shapes and input_normalization_modes / output_normalization_modes
      statistics, older releases: in model.safetensors,
          normalize_inputs.buffer_<key, dots as _>.{mean,std} or .{min,max}   e.g. buffer_observation_image.mean
          unnormalize_outputs.buffer_action.{min,max}                         (normalize_targets.* holds the same)
      statistics, processor-pipeline releases: policy_preprocessor.json (steps rename, batch, device,
          normalizer_processor with config {eps, features, norm_map} and state_file
          policy_preprocessor_step_3_normalizer_processor.safetensors: `<key>.<stat>` for every feature and stat),
          policy_postprocessor.json (unnormalizer_processor, then device; its state file step_0)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..unet1d import _checkpoint_formats as unet_fmt
from ..unet1d._checkpoint import CheckpointError, _cfg_get
from ._encoder import EncoderConfig, ObsEncoder
from ._keypoints import lerobot_encoder_key, robomimic_encoder_keys
from ._normalizer import key_problems

DP_ENCODER = "obs_encoder."
DP_MODELS = "obs_encoder.key_model_map."
DP_DUMMY = "obs_encoder._dummy_variable"
DP_HYBRID = "obs_encoder.obs_nets."
DP_NORMALIZER = "normalizer.params_dict."
DP_IMAGE_POLICY = "diffusion_policy.policy.diffusion_unet_image_policy.DiffusionUnetImagePolicy"
HYBRID_POLICY = "diffusion_policy.policy.diffusion_unet_hybrid_image_policy.DiffusionUnetHybridImagePolicy"
DP_LOWDIM_POLICY = "diffusion_policy.policy.diffusion_unet_lowdim_policy.DiffusionUnetLowdimPolicy"
LEROBOT_INPUTS, LEROBOT_OUTPUTS, LEROBOT_TARGETS = "normalize_inputs.", "unnormalize_outputs.", "normalize_targets."
LEROBOT_ENCODER = "diffusion.rgb_encoder."
UNET_COND = "model.down_modules.0.0.cond_encoder.1.weight"  # (C or 2C, step embedding + global_cond_dim)
UNET_STEP = "model.diffusion_step_encoder.1.weight"  # (4 dsed, dsed)


def unet_width(sd: dict[str, Any]) -> int | None:
    """A diffusion_policy policy's U-Net global_cond_dim, read from its first FiLM linear; None without one."""
    return sd[UNET_COND].shape[1] - sd[UNET_STEP].shape[1] if UNET_COND in sd and UNET_STEP in sd else None


def n_obs_steps(stored: Any, width: int | None, frame: int, notes: list[str], assumed: list[str],
                default: int = 2) -> int:
    """The frames the conditioning holds: the cfg's, else the U-Net's global_cond_dim over one frame's width (noted),
    else `default` (added to `assumed`)."""
    if stored is not None:
        return int(stored)
    if width and width % frame == 0:
        notes.append(f"n_obs_steps {width // frame} from the U-Net's global_cond_dim {width} = n * {frame}")
        return width // frame
    assumed.append(f"n_obs_steps {default}")
    return default


def cfg_get(cfg: Any, dotted: str, depth: int = 0) -> Any:
    """unet1d's _cfg_get, following `${a.b}` interpolations that a cfg read without omegaconf keeps as strings."""
    value = _cfg_get(cfg, dotted)
    m = re.fullmatch(r"\$\{([\w.]+)\}", value) if isinstance(value, str) else None
    return cfg_get(cfg, m[1], depth + 1) if m and depth < 8 else value


@dataclass(frozen=True)
class ObsKeys:
    """A policy's observation names as its checkpoint has them: cameras (stacked in this order), low-dim keys with
    their widths (concatenated in this order), LeRobot's environment-state key."""

    cameras: tuple[str, ...]
    low_dim: tuple[tuple[str, int | None], ...]
    env: str | None = None


def load_strict(encoder: ObsEncoder, sd: dict[str, torch.Tensor], keys: dict[str, str], present: list[str],
                what: str, notes: list[str]) -> ObsEncoder:
    """`encoder` with the checkpoint's tensors: `keys` maps each checkpoint key to the encoder's; `present`, the
    checkpoint's keys under the encoder's prefix. One CheckpointError lists what is missing, unexpected or
    misshaped; floating tensors are loaded as float32 (noted when converted)."""
    ours = encoder.state_dict()
    ref = {k: tuple(ours[v].shape) for k, v in keys.items()}
    key_problems({"missing": [k for k in ref if k not in sd],
                  "unexpected": [k for k in present if k not in ref],
                  "misshaped": [f"{k} (expected {ref[k]}, found {tuple(sd[k].shape)})"
                                for k in ref if k in sd and tuple(sd[k].shape) != ref[k]]}, what)
    state = {v: sd[k] for k, v in keys.items()}
    if any(t.is_floating_point() and t.dtype != torch.float32 for t in state.values()):
        notes.append("encoder weights converted to float32")
    encoder.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    return encoder.eval()


def check_width(who: str, n_obs: int, parts: list[object], width: int, unet_width: int | None) -> None:
    """CheckpointError unless the conditioning's width (n_obs frames of `parts`) is the U-Net's global_cond_dim."""
    if unet_width is not None and unet_width != width:
        raise CheckpointError(f"the {who} gives {n_obs} x ({' + '.join(map(str, parts))}) = {width} features but "
                              f"the U-Net's global_cond_dim is {unet_width}")


def dp_encoder_key(key: str, cameras: list[str] | tuple[str, ...], shared: bool = False) -> str:
    """ObsEncoder's key (layout diffusion_policy) -> the policy's: `backbone.<resnet18 key>` ->
    `obs_encoder.key_model_map.<camera 0, or rgb with share_rgb_model>.<key>`, `backbones.<i>.<key>` (one ResNet
    per camera) -> `obs_encoder.key_model_map.<cameras[i]>.<key>`."""
    head, rest = key.split(".", 1)
    if head == "backbones":
        i, rest = rest.split(".", 1)
        return f"{DP_MODELS}{cameras[int(i)]}.{rest}"
    return f"{DP_MODELS}{'rgb' if shared else cameras[0]}.{rest}"


def dp_encoder_tensors(encoder: ObsEncoder, shared: bool = False, cameras: list[str] | None = None
                       ) -> dict[str, torch.Tensor]:
    """`obs_encoder.*` of a DiffusionUnetImagePolicy holding `encoder`'s weights (cameras: their rgb keys, default
    the config's rgb_key)."""
    cameras = cameras or [encoder.config.rgb_key]
    sd = {dp_encoder_key(k, cameras, shared): v for k, v in encoder.state_dict().items()}
    return {DP_DUMMY: torch.zeros(0), **sd}


def dp_normalizer_tensors(fields: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """`normalizer.params_dict.*` from {key: (scale, offset)}; input_stats are the [-1, 1] preimages, as 'limits'
    mode fits them (min maps to -1, max to +1)."""
    out = {}
    for key, (scale, offset) in fields.items():
        lo, hi = (-1 - offset) / scale, (1 - offset) / scale
        stats = {"min": lo, "max": hi, "mean": (lo + hi) / 2, "std": (hi - lo) / 4}
        out.update({f"{DP_NORMALIZER}{key}.scale": scale, f"{DP_NORMALIZER}{key}.offset": offset})
        out.update({f"{DP_NORMALIZER}{key}.input_stats.{n}": v for n, v in stats.items()})
    return out


def dp_cfg(unet_config: Any, enc: EncoderConfig, random_crop: bool = True, shared: bool = False,
           cameras: list[str] | None = None, low_dim: list[tuple[str, int]] | None = None,
           **obs_encoder: Any) -> dict[str, Any]:
    """A train_diffusion_unet_image_workspace cfg (a plain dict) for this U-Net and encoder; `obs_encoder`
    overrides entries of cfg.policy.obs_encoder. shape_meta (the cameras, default the rgb key, then the low-dim keys,
    default the low-dim key) sits in cfg.task, referenced by interpolation."""
    cfg = unet_fmt.diffusion_policy_cfg(unet_config)
    obs = {c: {"shape": list(enc.image_shape), "type": "rgb"} for c in cameras or [enc.rgb_key]}
    obs |= {k: {"shape": [d], "type": "low_dim"} for k, d in low_dim or [(enc.low_dim_key, enc.low_dim)]}
    shape_meta = {"obs": obs, "action": {"shape": [unet_config.input_dim]}}
    cfg["task"]["shape_meta"], cfg["shape_meta"], cfg["n_obs_steps"] = shape_meta, "${task.shape_meta}", enc.n_obs_steps
    cfg["policy"]["shape_meta"] = "${shape_meta}"
    cfg["policy"]["obs_encoder"] = {
        "_target_": "diffusion_policy.model.vision.multi_image_obs_encoder.MultiImageObsEncoder",
        "shape_meta": "${shape_meta}",
        "rgb_model": {"_target_": "diffusion_policy.model.vision.model_getter.get_resnet", "name": "resnet18",
                      "weights": None},
        "resize_shape": None, "crop_shape": list(enc.crop_shape) if enc.crop_shape else None,
        "random_crop": random_crop, "use_group_norm": True, "share_rgb_model": shared,
        "imagenet_norm": enc.imagenet_norm, **obs_encoder}
    return cfg


def dp_hybrid_tensors(encoder: ObsEncoder, cameras: list[str] | None = None) -> dict[str, torch.Tensor]:
    """`obs_encoder.*` of a DiffusionUnetHybridImagePolicy holding `encoder`'s weights (layout "robomimic"; camera i
    under `obs_nets.<cameras[i]>`, default the config's rgb_key), in robomimic's state-dict order: per camera
    VisualCore's backbone and pool by name, then its `nets` (the same tensors), Linear."""
    cameras, sd, out = cameras or [encoder.config.rgb_key], encoder.state_dict(), {}
    paths = {k: robomimic_encoder_keys(k) for k in sd}
    for c, name in enumerate(cameras):
        mine = {k: p for k, (i, p) in paths.items() if i == c}
        out |= {f"{DP_HYBRID}{name}.{p[1]}": sd[k].clone() for k, p in mine.items() if len(p) > 1}
        out |= {f"{DP_HYBRID}{name}.{p[0]}": sd[k].clone() for k, p in mine.items()}
    return out


def dp_hybrid_cfg(unet_config: Any, enc: EncoderConfig, cameras: list[str] | None = None,
                  low_dim: list[tuple[str, int]] | None = None, **policy: Any) -> dict[str, Any]:
    """A train_diffusion_unet_hybrid_workspace cfg (a plain dict) for this U-Net and robomimic encoder; `policy`
    overrides entries of cfg.policy. shape_meta: the cameras (default the rgb key), then the low-dim keys (default
    the low-dim key), as Push-T's and robomimic's tasks order them."""
    cfg = dp_cfg(unet_config, enc, cameras=cameras, low_dim=low_dim)
    del cfg["policy"]["obs_encoder"]
    cfg["name"] = "train_diffusion_unet_hybrid"
    cfg["policy"].update({"_target_": HYBRID_POLICY, "crop_shape": list(enc.crop_shape) if enc.crop_shape else None,
                          "obs_encoder_group_norm": enc.norm == "group", "eval_fixed_crop": True, **policy})
    return cfg


def dp_lowdim_cfg(unet_config: Any, obs_dim: int, n_obs_steps: int = 2, **policy: Any) -> dict[str, Any]:
    """A train_diffusion_unet_lowdim_workspace cfg (a plain dict) whose policy takes `obs_dim` observations per frame
    as global conditioning: the U-Net's settings under cfg.policy.model (its dims as upstream's `${eval: ...}`
    strings), the flags as interpolations of the top-level ones; `policy` overrides entries of cfg.policy."""
    image = unet_fmt.diffusion_policy_cfg(unet_config)
    model = {k: image["policy"].pop(k) for k in unet_fmt.DP_CFG_KEYS}
    flags = {"obs_as_local_cond": False, "obs_as_global_cond": True, "pred_action_steps_only": False}
    image["policy"].update({
        "_target_": DP_LOWDIM_POLICY, "obs_dim": "${obs_dim}", "action_dim": "${action_dim}",
        "n_action_steps": "${eval:'${n_action_steps}+${n_latency_steps}'}", "num_inference_steps": 100,
        "model": {"_target_": "diffusion_policy.model.diffusion.conditional_unet1d.ConditionalUnet1D",
                  "input_dim": "${eval: ${task.action_dim} if ${obs_as_local_cond} or ${obs_as_global_cond} else "
                               "${task.obs_dim} + ${task.action_dim}}",
                  "global_cond_dim": "${eval: ${task.obs_dim}*${n_obs_steps} if ${obs_as_global_cond} else None}",
                  "local_cond_dim": "${eval: ${task.obs_dim} if ${obs_as_local_cond} else None}", **model},
        **{k: "${" + k + "}" for k in flags}, "oa_step_convention": True, **policy})
    return {**image, "name": "train_diffusion_unet_lowdim", "obs_dim": obs_dim, "action_dim": unet_config.input_dim,
            "n_obs_steps": n_obs_steps, "n_action_steps": 8, "n_latency_steps": 0, **flags,
            "task": {"name": "pusht_lowdim", "obs_dim": obs_dim, "action_dim": unet_config.input_dim}}


def lerobot_buffers(image_key: str, image: tuple[torch.Tensor, torch.Tensor], state: tuple[torch.Tensor, torch.Tensor],
                    action: tuple[torch.Tensor, torch.Tensor], state_key: str = "observation.state"
                    ) -> dict[str, torch.Tensor]:
    """A LeRobot DiffusionPolicy's normalisation buffers in its default modes: image (mean, std), state and
    action (min, max); the action under both normalize_targets and unnormalize_outputs, as LeRobot saves it."""
    def buf(where: str, key: str, names: tuple[str, str], pair: tuple) -> dict[str, torch.Tensor]:
        return {f"{where}buffer_{key.replace('.', '_')}.{n}": t.clone() for n, t in zip(names, pair)}
    return {**buf(LEROBOT_INPUTS, image_key, ("mean", "std"), image),
            **buf(LEROBOT_INPUTS, state_key, ("min", "max"), state),
            **buf(LEROBOT_TARGETS, "action", ("min", "max"), action),
            **buf(LEROBOT_OUTPUTS, "action", ("min", "max"), action)}


def lerobot_encoder_tensors(encoder: ObsEncoder) -> dict[str, torch.Tensor]:
    """`diffusion.rgb_encoder.*` of a LeRobot DiffusionPolicy holding `encoder`'s weights (layout "lerobot")."""
    separate = encoder.config.separate
    return {LEROBOT_ENCODER + lerobot_encoder_key(k, separate): v.clone() for k, v in encoder.state_dict().items()}


def lerobot_camera_keys(enc: EncoderConfig) -> list[str]:
    """The VISUAL feature names a fabricated LeRobot config gives the cameras: rgb_key, or .cam0, .cam1, ..."""
    return [enc.rgb_key] if enc.n_cameras == 1 else [f"observation.images.cam{i}" for i in range(enc.n_cameras)]


def lerobot_encoder_config(enc: EncoderConfig) -> dict[str, Any]:
    """config.json fields of a LeRobot DiffusionPolicy with this encoder (merge over unet1d's lerobot_config)."""
    cameras = {k: {"type": "VISUAL", "shape": list(enc.image_shape)} for k in lerobot_camera_keys(enc)}
    return {"n_obs_steps": enc.n_obs_steps,
            "input_features": {**cameras, enc.low_dim_key: {"type": "STATE", "shape": [enc.low_dim]}},
            "normalization_mapping": {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MIN_MAX"},
            "resize_shape": None, "crop_shape": list(enc.crop_shape) if enc.crop_shape else None,
            "crop_is_random": True, "use_group_norm": enc.norm == "group",
            "pretrained_backbone_weights": None if enc.norm == "group" else "ResNet18_Weights.IMAGENET1K_V1",
            "spatial_softmax_num_keypoints": enc.keypoints, "use_separate_rgb_encoder_per_camera": enc.separate}


def save_lerobot_processors(folder: str | Path, config: dict[str, Any], stats: dict[str, dict[str, torch.Tensor]],
                            eps: float = 1e-8) -> None:
    """policy_preprocessor.json / policy_postprocessor.json and their state files, as LeRobot's default pipelines
    save them for a policy of this config.json (`stats`: {feature: {stat: tensor}})."""
    from safetensors.torch import save_file
    folder = Path(folder)
    flat = {f"{key}.{name}": t.clone().contiguous() for key, named in stats.items() for name, t in named.items()}
    outputs = config.get("output_features") or {}
    norm_map = config.get("normalization_mapping") or {}

    def step(registry: str, features: dict, state_file: str) -> dict[str, Any]:
        save_file(flat, str(folder / state_file))
        return {"registry_name": registry, "config": {"eps": eps, "features": features, "norm_map": norm_map},
                "state_file": state_file}
    pre = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
           {"registry_name": "to_batch_processor", "config": {}},
           {"registry_name": "device_processor", "config": {"device": "cuda", "float_dtype": None}},
           step("normalizer_processor", {**(config.get("input_features") or {}), **outputs},
                "policy_preprocessor_step_3_normalizer_processor.safetensors")]
    post = [step("unnormalizer_processor", outputs, "policy_postprocessor_step_0_unnormalizer_processor.safetensors"),
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]
    for name, steps in (("policy_preprocessor", pre), ("policy_postprocessor", post)):
        (folder / f"{name}.json").write_text(json.dumps({"name": name, "steps": steps}, indent=2))
