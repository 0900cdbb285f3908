"""Diffusion Policy's DiffusionUnetImagePolicy: its MultiImageObsEncoder from a checkpoint (layout "diffusion_policy").

    encoder, why, keys = image_encoder(state_dict, settings, notes)   # None, why, None: not implemented

MultiImageObsEncoder sorts its rgb keys and its low-dim keys, so the order is known without shape_meta: every
camera's ResNet-18 features (sorted keys), then the low-dim keys (sorted), concatenated. Its ResNets sit at
`obs_encoder.key_model_map.<rgb key>.<resnet18 key>`, one per camera, or one at `.rgb.` with `share_rgb_model`
(which upstream builds without replacing its BatchNorms: a GroupNorm ResNet is only ever a per-camera one).
Settings: cfg.policy.obs_encoder.{crop_shape, random_crop, use_group_norm, share_rgb_model, imagenet_norm,
resize_shape, rgb_model.name} and shape_meta; without a cfg, the keys, the normaliser's fields and the U-Net's width,
Push-T image's defaults where nothing says (each noted). `resize_shape` equal to the image's (H, W), as the
real-robot configs set it, is the identity (torchvision's Resize returns such an image unchanged); other sizes are
not implemented (their antialiasing depends on the torchvision installed).
"""
from __future__ import annotations

from typing import Any

from ..unet1d import _checkpoint as ck
from . import _observation_formats as fmt
from ._encoder import EncoderConfig, ObsEncoder


def image_encoder(sd: dict[str, Any], s: dict[str, Any], notes: list[str]
                  ) -> tuple[ObsEncoder | None, str, fmt.ObsKeys | None]:
    """The checkpoint's encoder, its keys checked strictly (CheckpointError), and its observation keys; or
    (None, why, None). `s`: _observation._dp_settings(cfg)."""
    enc_keys = [k for k in sd if k.startswith(fmt.DP_ENCODER)]
    if any(k.endswith(".running_mean") for k in enc_keys) or s["use_group_norm"] is False:
        return None, ("the ResNet keeps BatchNorm (use_group_norm False, or share_rgb_model, which upstream leaves "
                      "unreplaced): only upstream's GroupNorm ResNet is implemented"), None
    unsupported = [(s["target"] not in (None, fmt.DP_IMAGE_POLICY), f"policy {s['target']}"),
                   (s["global_cond"] is False, "obs_as_global_cond False (observations by inpainting)"),
                   (s["backbone"] not in (None, "resnet18"), f"rgb_model {s['backbone']}")]
    for bad, what in unsupported:
        if bad:
            return None, f"{what}: not implemented (DiffusionUnetImagePolicy with resnet18 is)", None
    defaults, kw, assumed = EncoderConfig(), {}, []
    models = sorted({k[len(fmt.DP_MODELS):].split(".")[0] for k in enc_keys if k.startswith(fmt.DP_MODELS)})
    shared = s["share_rgb_model"] if s["share_rgb_model"] is not None else models == ["rgb"]
    meta = (s["shape_meta"] or {}).get("obs") if isinstance(s["shape_meta"], dict) else None
    if meta:
        rgb = sorted(k for k, v in meta.items() if v.get("type", "low_dim") == "rgb")
        low = sorted(k for k, v in meta.items() if v.get("type", "low_dim") == "low_dim")
        shapes = {tuple(meta[k]["shape"]) for k in rgb}
        if not rgb or not low or len(shapes) != 1:
            return None, (f"shape_meta has rgb keys {rgb} and low-dim keys {low}: cameras of one shape and at "
                          "least one low-dim key are implemented"), None
        kw["image_shape"], dims = shapes.pop(), [int(meta[k]["shape"][0]) for k in low]
    else:
        fields = sorted({k[len(fmt.DP_NORMALIZER):].split(".")[0] for k in sd if k.startswith(fmt.DP_NORMALIZER)})
        rgb = [m for m in models if m != "rgb"] or [defaults.rgb_key]
        low = [f for f in fields if f not in rgb and f != "action"] or [defaults.low_dim_key]
        if shared and len(rgb) > 1:
            return None, "no shape_meta, and a shared ResNet does not name its cameras: not implemented", None
        dims = [sd[f"{fmt.DP_NORMALIZER}{k}.scale"].numel() if f"{fmt.DP_NORMALIZER}{k}.scale" in sd
                else defaults.low_dim for k in low]
        assumed.append(f"image_shape {defaults.image_shape}")
    resize = s["resize_shape"]
    if resize is not None and tuple(resize) != tuple(kw.get("image_shape", defaults.image_shape)[1:]):
        return None, f"resize_shape {resize} (torchvision Resize to another size): not implemented", None
    if resize is not None:
        notes.append(f"resize_shape {list(resize)} is the image's own size: torchvision's Resize returns it unchanged")
    kw.update(rgb_key=rgb[0], low_dim_key="+".join(low), low_dim=sum(dims), n_cameras=len(rgb),
              separate=len(rgb) > 1 and not shared)
    if s["crop_shape"] is not None or s["random_crop"] is not None:
        # upstream crops only through CropRandomizer (random_crop True); with False its CenterCrop is overwritten
        kw["crop_shape"] = tuple(s["crop_shape"]) if s["crop_shape"] and s["random_crop"] is not False else None
    else:
        assumed.append(f"crop_shape {defaults.crop_shape}")
    if s["imagenet_norm"] is not None:
        kw["imagenet_norm"] = bool(s["imagenet_norm"])
    else:
        assumed.append(f"imagenet_norm {defaults.imagenet_norm}")
    kw["n_obs_steps"] = fmt.n_obs_steps(s["n_obs_steps"], fmt.unet_width(sd),
                                        len(rgb) * defaults.feature_dim + kw["low_dim"], notes, assumed,
                                        defaults.n_obs_steps)
    if assumed:
        notes.append(f"not in the checkpoint, Push-T image defaults assumed: {', '.join(assumed)}")
    try:
        config = EncoderConfig(**kw)
    except ValueError as e:
        raise ck.CheckpointError(f"encoder settings do not fit: {e}") from None
    keys = fmt.ObsKeys(tuple(rgb), tuple(zip(low, dims)))
    return _load(sd, enc_keys, config, keys.cameras, shared, notes), "", keys


def _load(sd: dict[str, Any], enc_keys: list[str], config: EncoderConfig, cameras: tuple[str, ...], shared: bool,
          notes: list[str]) -> ObsEncoder:
    """ObsEncoder(config) with the checkpoint's weights; keys checked strictly, the U-Net's cond width too."""
    encoder = ObsEncoder(config)
    keys = {fmt.dp_encoder_key(k, cameras, shared): k for k in encoder.state_dict()}
    where = f"{fmt.DP_MODELS}{'rgb' if shared else list(cameras)}"
    encoder = fmt.load_strict(encoder, sd, keys, [k for k in enc_keys if k != fmt.DP_DUMMY],
                              f"obs_encoder keys do not fit the GroupNorm ResNet-18 under {where!r}", notes)
    fmt.check_width("encoder", config.n_obs_steps, config.frame_parts, config.cond_dim, fmt.unet_width(sd))
    notes.append(f"encoder: {where} ({len(keys)} tensors), {config}")
    return encoder
