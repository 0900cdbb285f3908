"""A LeRobot pretrained-policy folder's observation side: its image encoder and its normalisation statistics.

    side = lerobot_side(Path("diffusion_pusht"), notes)     # ObservationSide (_observation.py)

Encoder (`diffusion.rgb_encoder.*`, or `.<camera>.*` with use_separate_rgb_encoder_per_camera): LeRobot's
DiffusionRgbEncoder (_keypoints.py, _encoder.py layout "lerobot"), configured from config.json: its VISUAL input
features (cameras, in the config's order, of one shape) and `observation.state`; `crop_shape`, `use_group_norm`,
`spatial_softmax_num_keypoints`, `n_obs_steps`, `use_separate_rgb_encoder_per_camera` (absent before LeRobot had
it: one shared encoder); fields of either config era (input_features + normalization_mapping, or input_shapes +
*_normalization_modes). Not implemented (None plus the reason): an environment-state feature, `resize_shape`, a
backbone other than resnet18. Keys that do not fit (missing, unexpected, misshaped) raise one CheckpointError.

A policy without cameras (e.g. LeRobot's Push-T keypoints policy: `observation.state` and
`observation.environment_state`) has no encoder: its conditioning is the normalised state, then the environment
state, per frame (`StateConditioning`, which the Policy applies to `predict(agent_pos=, env_state=)`).

Normaliser: a processor-pipeline release keeps the statistics beside the policy (`policy_preprocessor.json` with a
`normalizer_processor` step and its state file, `policy_postprocessor.json` with an `unnormalizer_processor`);
older releases keep them in model.safetensors (`normalize_inputs.buffer_*`, `unnormalize_outputs.buffer_action.*`).
The pipeline files win where both exist (the policy then ignores the buffers).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..unet1d import _checkpoint as ck
from . import _observation_formats as fmt
from ._encoder import EncoderConfig, ObsEncoder
from ._keypoints import lerobot_encoder_key
from ._normalizer import Normalizer

if TYPE_CHECKING:
    from ._observation import ObservationSide

ENV_KEY = "observation.environment_state"
PROCESSORS = {"pre": ("policy_preprocessor.json", "normalizer_processor"),
              "post": ("policy_postprocessor.json", "unnormalizer_processor")}
UNET_COND = re.compile(r"^diffusion\.unet\.(_orig_mod\.)?down_modules\.0\.0\.cond_encoder\.1\.weight$")
UNET_STEP = re.compile(r"^diffusion\.unet\.(_orig_mod\.)?diffusion_step_encoder\.1\.weight$")


@dataclass(frozen=True)
class StateConditioning:
    """A policy without cameras: global_cond = per frame cat(state, environment state), frames in order (LeRobot's
    DiffusionModel._prepare_global_conditioning with no image features; diffusion_policy's DiffusionUnetLowdimPolicy
    with its obs vector as the state and no environment state)."""

    n_obs_steps: int
    state_dim: int
    env_dim: int  # 0: no environment-state feature

    @property
    def cond_dim(self) -> int:
        return self.n_obs_steps * (self.state_dim + self.env_dim)

    def check(self, state: object, env_state: object, state_name: str = "agent_pos") -> None:
        """ValueError naming the expected and the received shapes."""
        n = self.n_obs_steps
        for name, x, d in ((state_name, state, self.state_dim), ("env_state", env_state, self.env_dim)):
            if d == 0:
                if x is not None:
                    raise ValueError("this policy has no environment-state feature: call it without env_state=")
                continue
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[1:]) != (n, d):
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} must be (B, {n}, {d}), got {got}")
        if self.env_dim and env_state.shape[0] != state.shape[0]:
            raise ValueError(f"env_state has batch {env_state.shape[0]} but {state_name} has {state.shape[0]}")

    def __call__(self, state: torch.Tensor, env_state: torch.Tensor | None) -> torch.Tensor:
        """(B, n_obs, state_dim) [and (B, n_obs, env_dim)], checked and normalised -> (B, cond_dim)."""
        return torch.cat([state] if self.env_dim == 0 else [state, env_state], dim=-1).flatten(start_dim=1)


def lerobot_side(folder: Path, notes: list[str]) -> ObservationSide:
    from ._observation import ObservationSide  # here: _observation imports this module

    absent = [n for n in ("config.json", "model.safetensors") if not (folder / n).is_file()]
    if absent:
        raise ck.CheckpointError(f"{folder}: not a LeRobot pretrained-policy folder: no {' and no '.join(absent)}")
    cfg = _read_json(folder / "config.json")
    sd = ck._read_safetensors(folder / "model.safetensors")
    side = ObservationSide(None, None, "lerobot", "model.safetensors", notes=notes)
    images, states, others = _features(cfg)
    try:
        config, side.encoder_reason = _encoder_config(cfg, images, states, others)
        if config is not None:
            side.encoder = _load_encoder(sd, config, notes)
        env = ENV_KEY if not images and others == [ENV_KEY] else None
        if not images and states == ["observation.state"] and others in ([], [ENV_KEY]):
            side.state = _state_conditioning(cfg, sd, env)
        if states == ["observation.state"]:
            side.obs_keys = fmt.ObsKeys(tuple(images), ((states[0], _shape(cfg, states[0])[0]),), env)
        side.normalizer, side.normalizer_reason = _normalizer(folder, cfg, sd, images, env, notes)
    except ck.CheckpointError as e:
        raise ck.CheckpointError(f"{folder}: {e}") from None
    return side


def _read_json(path: Path) -> dict[str, Any]:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ck.CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(out, dict):
        raise ck.CheckpointError(f"{path}: holds a JSON {type(out).__name__}, not an object")
    return out


def _features(cfg: dict) -> tuple[list[str], list[str], list[str]]:
    """(image keys, state keys, other input keys) of config.json, in either era's fields; the cameras in the
    config's order (LeRobot's `image_features`, the order its encoders and features follow)."""
    feats = cfg.get("input_features")
    if feats:
        kinds = {k: str(f.get("type")) for k, f in feats.items()}
    else:  # before input_features: input_shapes by key
        kinds = {k: "VISUAL" if k.startswith("observation.image") else "STATE" if k == "observation.state" else "ENV"
                 for k in cfg.get("input_shapes") or {}}
    images = [k for k, t in kinds.items() if t == "VISUAL"]
    states = sorted(k for k, t in kinds.items() if t == "STATE")
    return images, states, sorted(k for k in kinds if k not in images and k not in states)


def _shape(cfg: dict, key: str) -> list[int]:
    feats = cfg.get("input_features") or {}
    return list(feats[key]["shape"]) if key in feats else list((cfg.get("input_shapes") or {})[key])


def _encoder_config(cfg: dict, images: list[str], states: list[str], others: list[str]
                    ) -> tuple[EncoderConfig | None, str]:
    shapes = {tuple(_shape(cfg, k)) for k in images}
    unsupported = [(not images, "no VISUAL input feature (a state-only policy has no image encoder)"),
                   (len(shapes) > 1, f"cameras of different shapes {sorted(shapes)} (LeRobot requires one)"),
                   (states != ["observation.state"], f"state features {states}: observation.state is implemented"),
                   (bool(others), f"other input features {others} (environment state): not implemented"),
                   (cfg.get("resize_shape") is not None, f"resize_shape {cfg.get('resize_shape')} (torchvision "
                                                         "Resize, whose result depends on its version)"),
                   (cfg.get("vision_backbone", "resnet18") != "resnet18",
                    f"vision_backbone {cfg.get('vision_backbone')}: resnet18 is implemented")]
    for bad, why in unsupported:
        if bad:
            return None, f"LeRobot encoder: {why}"
    crop = cfg.get("crop_shape")
    try:
        return EncoderConfig.lerobot(
            image_shape=tuple(int(v) for v in _shape(cfg, images[0])), crop_shape=tuple(crop) if crop else None,
            n_obs_steps=int(cfg.get("n_obs_steps", 2)), low_dim=int(_shape(cfg, states[0])[0]),
            rgb_key=images[0], norm="group" if cfg.get("use_group_norm", False) else "batch",
            keypoints=int(cfg.get("spatial_softmax_num_keypoints", 32)), n_cameras=len(images),
            separate=bool(cfg.get("use_separate_rgb_encoder_per_camera", False))), ""
    except ValueError as e:
        raise ck.CheckpointError(f"config.json: encoder settings do not fit: {e}") from None


def _state_conditioning(cfg: dict, sd: dict[str, torch.Tensor], env: str | None) -> StateConditioning:
    out = StateConditioning(int(cfg.get("n_obs_steps", 2)), int(_shape(cfg, "observation.state")[0]),
                            int(_shape(cfg, env)[0]) if env else 0)
    fmt.check_width("state", out.n_obs_steps, [out.state_dim, out.env_dim], out.cond_dim, _unet_cond_width(sd))
    return out


def _unet_cond_width(sd: dict[str, torch.Tensor]) -> int | None:
    cond = [sd[k].shape[1] for k in sd if UNET_COND.match(k)]
    step = [sd[k].shape[1] for k in sd if UNET_STEP.match(k)]
    return cond[0] - step[0] if cond and step else None


def _load_encoder(sd: dict[str, torch.Tensor], config: EncoderConfig, notes: list[str]) -> ObsEncoder:
    """ObsEncoder(config) with the folder's weights, keys checked strictly; the U-Net's cond width too."""
    prefix = fmt.LEROBOT_ENCODER
    encoder = ObsEncoder(config)
    keys = {prefix + lerobot_encoder_key(k, config.separate): k for k in encoder.state_dict()}
    encoder = fmt.load_strict(encoder, sd, keys, [k for k in sd if k.startswith(prefix)],
                              f"rgb_encoder keys do not fit LeRobot's DiffusionRgbEncoder ({config.norm} norm, "
                              f"{config.keypoints} keypoints, {'one per camera' if config.separate else 'one shared'})"
                              f" under {prefix!r}", notes)
    fmt.check_width("encoder", config.n_obs_steps, config.frame_parts, config.cond_dim, _unet_cond_width(sd))
    notes.append(f"encoder: {prefix}* ({len(keys)} tensors, {config.n_cameras} camera(s), "
                 f"{'one encoder per camera' if config.separate else 'one shared encoder'}), {config}")
    return encoder


def _normalizer(folder: Path, cfg: dict, sd: dict[str, torch.Tensor], image_keys: list[str], env: str | None,
                notes: list[str]) -> tuple[Normalizer | None, str]:
    steps = {}
    for where, (name, registry) in PROCESSORS.items():
        if (folder / name).is_file():
            steps[where] = _processor_step(folder, name, registry)
    if steps:
        if len(steps) == 1:
            raise ck.CheckpointError(f"{PROCESSORS['pre' if 'post' in steps else 'post'][0]} is missing beside "
                                     f"{PROCESSORS['post' if 'post' in steps else 'pre'][0]}")
        notes.append(f"normaliser: {steps['pre'][2]} and {steps['post'][2]}")
        norm = Normalizer.from_lerobot_processors(steps["pre"][:2], steps["post"][:2], image_key=image_keys,
                                                  env_key=env)
        return norm, ""
    if not any(k.startswith(fmt.LEROBOT_INPUTS) for k in sd):
        return None, ("no policy_preprocessor.json / policy_postprocessor.json and no normalize_inputs.* buffers in "
                      "model.safetensors: the folder holds no normalisation statistics")
    modes, images = _lerobot_modes(cfg, sd, notes)
    return Normalizer.from_lerobot(sd, modes, image_key=images, env_key=env), ""


def _processor_step(folder: Path, name: str, registry: str) -> tuple[dict, dict[str, torch.Tensor], str]:
    """(config, state tensors, state file name) of the pipeline's `registry` step."""
    pipeline = _read_json(folder / name)
    found = [s for s in pipeline.get("steps") or [] if s.get("registry_name") == registry]
    if len(found) != 1:
        raise ck.CheckpointError(f"{name}: {len(found)} '{registry}' steps (one is expected)")
    state_file = found[0].get("state_file")
    if not state_file or not (folder / state_file).is_file():
        raise ck.CheckpointError(f"{name}: the '{registry}' step's state file {state_file!r} is not in the folder")
    return found[0].get("config") or {}, ck._read_safetensors(folder / state_file), state_file


def _lerobot_modes(cfg: dict, sd: dict, notes: list[str]) -> tuple[dict[str, str], list[str]]:
    """{feature: mode} and the image feature names, from config.json (either era's fields) or the buffers."""
    feats = {**(cfg.get("input_features") or {}), **(cfg.get("output_features") or {})}
    mapping = cfg.get("normalization_mapping")
    if feats and mapping:
        modes = {k: str(mapping.get(f.get("type"), "IDENTITY")).lower() for k, f in feats.items()}
        images = [k for k, f in feats.items() if f.get("type") == "VISUAL"]
        return modes, images
    modes = {**(cfg.get("input_normalization_modes") or {}), **(cfg.get("output_normalization_modes") or {})}
    images = [k for k in (cfg.get("input_shapes") or modes) if k.startswith("observation.image")]
    if modes:
        return {k: str(v).lower() for k, v in modes.items()}, images
    notes.append("config.json names no normalisation modes: read from the buffers present")
    found = {}
    for key in sd:
        m = re.match(r"^(normalize_inputs|unnormalize_outputs)\.buffer_(\w+)\.(mean|min)$", key)
        if m:
            name = "action" if m[2] == "action" else m[2].replace("observation_", "observation.", 1)
            found[name] = "mean_std" if m[3] == "mean" else "min_max"
    return found, sorted(k for k in found if k.startswith("observation.image"))
