"""Load a trained policy's observation side (image encoder + normaliser) from the checkpoint layouts unet1d reads.

    side = load_observation_side("latest.ckpt")        # or .pt/.pth/.safetensors, or a LeRobot folder
    if side.encoder is None: print(side.encoder_reason)
    global_cond = side.encoder(*side.normalizer.normalize_obs(image, agent_pos))

diffusion_policy .ckpt (EMA weights preferred, as unet1d's loader does) or a policy state dict: the image policy's
encoder from `obs_encoder.key_model_map.<rgb key>.*` (_observation_image.py), configured from cfg.policy.obs_encoder
and shape_meta, or, without a cfg, from the keys and the U-Net's global_cond_dim with Push-T defaults (each noted);
the normaliser from `normalizer.params_dict.*`; DiffusionUnetHybridImagePolicy's robomimic encoder
(`obs_encoder.obs_nets.*`) from _observation_hybrid.py. A LeRobot folder: its DiffusionRgbEncoder (ResNet trunk +
SpatialSoftmax keypoints + Linear, the state before the image features) and its statistics (_observation_lerobot.py).
A bare U-Net state dict has neither. What is absent comes back as None with the reason; what is
present but does not fit (missing / unexpected / misshaped keys) raises one CheckpointError listing them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..unet1d import _checkpoint as ck
from ..unet1d import _checkpoint_pickle as unpickle
from . import _observation_formats as fmt
from ._encoder import ObsEncoder
from ._normalizer import Normalizer
from ._observation_hybrid import hybrid_encoder
from ._observation_image import image_encoder
from ._observation_lerobot import StateConditioning, lerobot_side


@dataclass
class ObservationSide:
    encoder: ObsEncoder | None  # the checkpoint's weights, float32, CPU, eval mode
    normalizer: Normalizer | None
    source: str  # "state_dict" | "diffusion_policy" | "lerobot"
    weights: str  # "ema_model" / "model" for a diffusion_policy .ckpt, else the weights file's name
    encoder_reason: str = ""  # why encoder is None
    normalizer_reason: str = ""
    notes: list[str] = field(default_factory=list)
    state: StateConditioning | None = None  # a policy without cameras (LeRobot's, diffusion_policy's low-dim one):
    # its conditioning from the state
    obs_keys: fmt.ObsKeys | None = None  # the checkpoint's observation names: Policy.predict(obs={name: tensor})


def load_observation_side(path: str | Path, prefer_ema: bool = True) -> ObservationSide:
    """The encoder and normaliser stored in `path`; None (with the reason) for each the file does not hold."""
    path, notes = Path(path), []
    if path.is_dir():
        return lerobot_side(path, notes)
    if not path.exists():
        raise ck.CheckpointError(f"{path}: no such file or folder")
    if path.suffix not in ck.SUFFIXES:
        raise ck.CheckpointError(f"{path}: unknown extension {path.suffix!r}; expected one of "
                                 f"{', '.join(ck.SUFFIXES)} or a LeRobot folder (config.json + model.safetensors)")
    cfg, source, weights = None, "state_dict", path.name
    if path.suffix == ".safetensors":
        sd = ck._read_safetensors(path)
    else:
        obj = ck._torch_load(path, notes)
        if not isinstance(obj, dict):
            raise ck.CheckpointError(f"{path}: holds a {type(obj).__name__}, not a dict of tensors")
        if "state_dicts" in obj:  # diffusion_policy's workspace payload
            sds, source = obj["state_dicts"], "diffusion_policy"
            weights = "ema_model" if prefer_ema and "ema_model" in sds else "model"
            if weights not in sds:
                raise ck.CheckpointError(f"{path}: state_dicts has no 'model' or 'ema_model' (has {sorted(sds)})")
            sd, cfg = sds[weights], unpickle.plain(obj.get("cfg"))
        else:
            sd = obj.get("state_dict", obj)
    try:
        side = _policy_side(dict(sd), cfg, notes)
    except ck.CheckpointError as e:
        raise ck.CheckpointError(f"{path}: {e}") from None
    side.source, side.weights = source, weights
    return side


def _policy_side(sd: dict[str, Any], cfg: Any, notes: list[str]) -> ObservationSide:
    """A diffusion_policy policy state dict (and its cfg, when there is one)."""
    side, keys = ObservationSide(None, None, "", "", notes=notes), None
    enc_keys = [k for k in sd if k.startswith(fmt.DP_ENCODER)]
    settings = _dp_settings(cfg)
    why = ""
    if not enc_keys:
        if _lowdim_side(side, sd, settings, cfg, notes):
            return side
        why = side.encoder_reason or "no obs_encoder.* keys: a bare U-Net state dict has no image encoder"
    elif any(k.startswith(fmt.DP_HYBRID) for k in enc_keys):  # DiffusionUnetHybridImagePolicy: robomimic's
        side.encoder, why, keys = hybrid_encoder(sd, settings, cfg, notes)
    else:  # DiffusionUnetImagePolicy: MultiImageObsEncoder
        side.encoder, why, keys = image_encoder(sd, settings, notes)
    side.encoder_reason = why
    images, states = (keys.cameras, keys.low_dim) if keys else (("image",), (("agent_pos", None),))
    side.obs_keys = keys
    have = sorted({k[len(fmt.DP_NORMALIZER):].split(".")[0] for k in sd if k.startswith(fmt.DP_NORMALIZER)})
    need = [*images, *(k for k, _ in states), "action"]
    if all(k in have for k in need):
        side.normalizer = Normalizer.from_diffusion_policy(sd, images, [k for k, _ in states])
    else:
        side.normalizer_reason = (f"normalizer.params_dict holds {have or 'nothing'}; {need} are needed"
                                  if have else "no normalizer.params_dict.* keys (a bare U-Net state dict)")
    return side


def _lowdim_side(side: ObservationSide, sd: dict[str, Any], settings: dict[str, Any], cfg: Any,
                 notes: list[str]) -> bool:
    """DiffusionUnetLowdimPolicy with obs_as_global_cond: global_cond = the normalised `obs` vector of each frame,
    frames in order (`nobs[:, :To].reshape(B, -1)`), as StateConditioning builds it; normaliser fields `obs` and
    `action`. False where the checkpoint is not such a policy (its reason, if any, in side.encoder_reason)."""
    fields = {k[len(fmt.DP_NORMALIZER):].split(".")[0] for k in sd if k.startswith(fmt.DP_NORMALIZER)}
    if fields != {"obs", "action"} or settings["target"] not in (None, fmt.DP_LOWDIM_POLICY):
        return False
    unsupported = [fmt.cfg_get(cfg, "policy.obs_as_local_cond") and "obs_as_local_cond (a local conditioning)",
                   fmt.cfg_get(cfg, "policy.pred_action_steps_only") and "pred_action_steps_only",
                   settings["global_cond"] is False and "obs_as_global_cond False (observations by inpainting)"]
    width, obs_dim = fmt.unet_width(sd), sd[f"{fmt.DP_NORMALIZER}obs.scale"].numel()
    if any(unsupported) or not width:
        what = [u for u in unsupported if u] or ["a U-Net without global conditioning (observations by inpainting)"]
        side.encoder_reason = f"low-dim policy with {', '.join(what)}: not implemented"
        return False
    n_obs = fmt.n_obs_steps(settings["n_obs_steps"], width, obs_dim, notes, [])
    side.state, side.obs_keys = StateConditioning(int(n_obs), obs_dim, 0), fmt.ObsKeys((), (("obs", obs_dim),))
    fmt.check_width("state conditioning", side.state.n_obs_steps, [obs_dim], side.state.cond_dim, width)
    side.normalizer = Normalizer.from_diffusion_policy(sd, (), "obs")
    side.encoder_reason = "a low-dim policy: conditioned on its obs vector (predict(obs=...)), no image encoder"
    notes.append(f"low-dim policy: global_cond = {n_obs} frames of the normalised obs ({obs_dim})")
    return True


def _dp_settings(cfg: Any) -> dict[str, Any]:
    """The encoder's settings from a diffusion_policy cfg: None where absent."""
    def get(dotted: str) -> Any:
        return fmt.cfg_get(cfg, dotted)
    out = {name: get(f"policy.obs_encoder.{name}") for name in (
        "crop_shape", "random_crop", "use_group_norm", "share_rgb_model", "imagenet_norm", "resize_shape")}
    out["backbone"] = get("policy.obs_encoder.rgb_model.name")
    out["target"] = get("policy._target_")
    out["global_cond"] = get("policy.obs_as_global_cond")
    out["n_obs_steps"] = get("policy.n_obs_steps") or get("n_obs_steps")
    out["shape_meta"] = get("policy.shape_meta") or get("shape_meta") or get("task.shape_meta")
    return out
