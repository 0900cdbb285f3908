"""Diffusion Policy's DiffusionUnetHybridImagePolicy: its robomimic image encoder from a checkpoint.

    encoder, why = hybrid_encoder(state_dict, settings, cfg, notes)   # None and why for what is not implemented

The paper's image policies (its Push-T image checkpoints among them) encode observations with robomimic 0.2.0's
ObservationEncoder (_encoder.py says what it computes). In the policy's state dict it sits at `obs_encoder.`:
`obs_nets.<rgb key>.nets.0.nets.<i>.*` (ResNet18Conv: torchvision's resnet18 children[:-2]), `.nets.1.*` (the
SpatialSoftmax: `nets.{weight,bias}`, `temperature`, `pos_x`, `pos_y`), `.nets.3.*` (the Linear); VisualCore also
registers its backbone and pool by name, so the same tensors come again at `obs_nets.<rgb key>.backbone.nets.<i>.*`
and `.pool.*`. Low-dim keys and the crop randomizer hold no tensors. Settings: cfg.policy.{crop_shape (class
default 76 x 76), obs_encoder_group_norm, eval_fixed_crop, n_obs_steps, shape_meta}; without a cfg they come from
the keys and the U-Net's width, Push-T's where nothing says (each noted).
"""
from __future__ import annotations

from typing import Any

import torch

from ..unet1d import _checkpoint as ck
from . import _observation_formats as fmt
from ._encoder import EncoderConfig, ObsEncoder
from ._keypoints import robomimic_encoder_keys


def hybrid_encoder(sd: dict[str, Any], settings: dict[str, Any], cfg: Any, notes: list[str]
                   ) -> tuple[ObsEncoder | None, str]:
    """The checkpoint's robomimic encoder (layout "robomimic"), its keys checked strictly (CheckpointError), or
    (None, why). `settings`: _observation._dp_settings(cfg) (target, global_cond, n_obs_steps, shape_meta)."""
    policy = fmt.cfg_get(cfg, "policy")
    policy = policy if isinstance(policy, dict) else {}
    if settings["target"] not in (None, fmt.HYBRID_POLICY):
        return None, f"obs_encoder.obs_nets.* under policy {settings['target']}: not implemented"
    if settings["global_cond"] is False:
        return None, "obs_as_global_cond False (observations by inpainting): not implemented"
    rgb = sorted({k[len(fmt.DP_HYBRID):].split(".")[0] for k in sd if k.startswith(fmt.DP_HYBRID)})
    if len(rgb) != 1:
        return None, f"obs_encoder.obs_nets holds {rgb}: one camera is implemented"
    net = f"{fmt.DP_HYBRID}{rgb[0]}."
    kw: dict[str, Any] = {"rgb_key": rgb[0]}
    assumed: list[str] = []
    meta = settings["shape_meta"]
    obs = meta.get("obs") if isinstance(meta, dict) else None
    if obs:
        order = [(k, v.get("type", "low_dim")) for k, v in obs.items()]
        if [t for _, t in order] != ["rgb", "low_dim"] or order[0][0] != rgb[0]:
            return None, (f"shape_meta's observations {order}: the {rgb[0]!r} image, then one low-dim key is "
                          "implemented")
        kw.update(image_shape=tuple(obs[rgb[0]]["shape"]), low_dim_key=order[1][0],
                  low_dim=int(obs[order[1][0]]["shape"][0]))
    else:
        fields = sorted({k[len(fmt.DP_NORMALIZER):].split(".")[0] for k in sd if k.startswith(fmt.DP_NORMALIZER)})
        low = [f for f in fields if f not in (rgb[0], "action")]
        if len(low) != 1:
            return None, f"no shape_meta, and the normalizer's fields {fields} name no single low-dim key"
        kw.update(low_dim_key=low[0], low_dim=sd[f"{fmt.DP_NORMALIZER}{low[0]}.scale"].numel())
        assumed += ["image_shape (3, 96, 96)", f"the order ({rgb[0]}, {low[0]})"]
    if "crop_shape" in policy:
        kw["crop_shape"] = tuple(policy["crop_shape"]) if policy["crop_shape"] else None
    else:
        assumed.append("crop_shape (76, 76) (the policy's default)")
    group = policy.get("obs_encoder_group_norm")
    if group is None:
        group = not any(k.endswith(".running_mean") for k in sd if k.startswith(net))
        notes.append(f"obs_encoder_group_norm {group}: from the keys")
    kw["norm"] = "group" if group else "batch"
    if not policy.get("eval_fixed_crop") and kw.get("crop_shape", (76, 76)):
        notes.append("eval_fixed_crop is not set: upstream's robomimic CropRandomizer crops at random at evaluation "
                     "too; the center crop is taken here")
    for name, key, dim in (("keypoints", f"{net}nets.1.nets.weight", 0), ("feature_dim", f"{net}nets.3.weight", 0)):
        if key in sd:
            kw[name] = sd[key].shape[dim]
    n_obs = settings["n_obs_steps"]
    width = fmt.unet_width(sd)
    if n_obs is not None:
        kw["n_obs_steps"] = int(n_obs)
    elif width:
        frame = kw.get("feature_dim", 64) + kw["low_dim"]
        if width % frame == 0:
            kw["n_obs_steps"] = width // frame
            notes.append(f"n_obs_steps {width // frame} from the U-Net's global_cond_dim {width} = n * {frame}")
    if "n_obs_steps" not in kw:
        assumed.append("n_obs_steps 2")
    if assumed:
        notes.append(f"not in the checkpoint, Push-T image defaults assumed: {', '.join(assumed)}")
    try:
        config = EncoderConfig.robomimic(**kw)
    except ValueError as e:
        raise ck.CheckpointError(f"encoder settings do not fit: {e}") from None
    return _load(sd, net, config, width, notes, assumed), ""


def _load(sd: dict[str, Any], net: str, config: EncoderConfig, width: int | None, notes: list[str],
          assumed: list[str]) -> ObsEncoder:
    """ObsEncoder(config) with the tensors at `net`; each tensor is read from either of its names, and where a
    checkpoint holds both (as robomimic saves them) they must be equal."""
    encoder = ObsEncoder(config)
    paths = {ours: [net + p for p in robomimic_encoder_keys(ours)] for ours in encoder.state_dict()}
    canonical = {alias: names[0] for names in paths.values() for alias in names}
    differ = [f"{names[1]} != {names[0]}" for names in paths.values()
              if len(names) > 1 and names[0] in sd and names[1] in sd and not torch.equal(sd[names[0]], sd[names[1]])]
    if differ:
        raise ck.CheckpointError(f"robomimic's encoder saves each backbone and pool tensor under two names, which "
                                 f"hold different values: {', '.join(differ[:6])}")
    named = dict(sd)
    for names in paths.values():
        if names[0] not in sd and any(n in sd for n in names[1:]):
            named[names[0]] = sd[next(n for n in names[1:] if n in sd)]
    present = sorted({canonical.get(k, k) for k in sd if k.startswith(fmt.DP_ENCODER)})
    what = f"obs_encoder keys do not fit the {config.name} encoder under {net!r}"
    what += f" (assumed, not in the checkpoint: {', '.join(assumed)})" if assumed else ""
    encoder = fmt.load_strict(encoder, named, {names[0]: ours for ours, names in paths.items()}, present, what,
                              notes)
    fmt.check_width("encoder", config.n_obs_steps, config.frame_parts, config.cond_dim, width)
    notes.append(f"encoder: {net}* ({len(paths)} tensors, each under both of its names), {config}")
    return encoder
