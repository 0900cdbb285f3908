"""Diffusion Policy's DiffusionUnetHybridImagePolicy: its robomimic image encoder from a checkpoint.

    encoder, why, keys = hybrid_encoder(state_dict, settings, cfg, notes)   # None, why, None: not implemented

The paper's image policies (its Push-T image checkpoints and robomimic image tasks among them) encode observations
with robomimic 0.2.0's ObservationEncoder (_encoder.py says what it computes): cameras of one shape, then low-dim
keys, in shape_meta's order. In the policy's state dict it sits at `obs_encoder.`, per camera
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
                   ) -> tuple[ObsEncoder | None, str, fmt.ObsKeys | None]:
    """The checkpoint's robomimic encoder (layout "robomimic"), its keys checked strictly (CheckpointError), and its
    observation keys; or (None, why, None). `settings`: _observation._dp_settings(cfg) (target, global_cond,
    n_obs_steps, shape_meta)."""
    policy = fmt.cfg_get(cfg, "policy")
    policy = policy if isinstance(policy, dict) else {}
    if settings["target"] not in (None, fmt.HYBRID_POLICY):
        return None, f"obs_encoder.obs_nets.* under policy {settings['target']}: not implemented", None
    if settings["global_cond"] is False:
        return None, "obs_as_global_cond False (observations by inpainting): not implemented", None
    nets = sorted({k[len(fmt.DP_HYBRID):].split(".")[0] for k in sd if k.startswith(fmt.DP_HYBRID)})
    kw: dict[str, Any] = {}
    assumed: list[str] = []
    meta = settings["shape_meta"]
    obs = meta.get("obs") if isinstance(meta, dict) else None
    if obs:
        order = [(k, v.get("type", "low_dim")) for k, v in obs.items()]
        rgb = [k for k, t in order if t == "rgb"]
        low = [k for k, t in order if t == "low_dim"]
        shapes = {tuple(obs[k]["shape"]) for k in rgb}
        if not rgb or not low or [k for k, _ in order] != rgb + low or len(shapes) != 1:
            return None, (f"shape_meta's observations {order}: rgb keys of one shape, then low-dim keys are "
                          "implemented"), None
        if sorted(rgb) != nets:
            raise ck.CheckpointError(f"shape_meta's rgb keys {rgb} but obs_encoder.obs_nets holds {nets}")
        kw["image_shape"] = shapes.pop()
        dims = [int(obs[k]["shape"][0]) for k in low]
    else:
        fields = sorted({k[len(fmt.DP_NORMALIZER):].split(".")[0] for k in sd if k.startswith(fmt.DP_NORMALIZER)})
        rgb, low = nets, [f for f in fields if f not in nets and f != "action"]
        if len(rgb) != 1 or len(low) != 1:
            return None, (f"no shape_meta to order the cameras {rgb} and low-dim keys {low}: one of each is "
                          "implemented without one"), None
        dims = [sd[f"{fmt.DP_NORMALIZER}{low[0]}.scale"].numel()]
        assumed += ["image_shape (3, 96, 96)", f"the order ({rgb[0]}, {low[0]})"]
    kw.update(rgb_key=rgb[0], n_cameras=len(rgb), separate=len(rgb) > 1, low_dim_key="+".join(low),
              low_dim=sum(dims))
    net = f"{fmt.DP_HYBRID}{rgb[0]}."
    if "crop_shape" in policy:
        kw["crop_shape"] = tuple(policy["crop_shape"]) if policy["crop_shape"] else None
    else:
        assumed.append("crop_shape (76, 76) (the policy's default)")
    group = policy.get("obs_encoder_group_norm")
    if group is None:
        group = not any(k.endswith(".running_mean") for k in sd if k.startswith(fmt.DP_HYBRID))
        notes.append(f"obs_encoder_group_norm {group}: from the keys")
    kw["norm"] = "group" if group else "batch"
    if not policy.get("eval_fixed_crop") and kw.get("crop_shape", (76, 76)):
        notes.append("eval_fixed_crop is not set: upstream's robomimic CropRandomizer crops at random at evaluation "
                     "too; the center crop is taken here")
    for name, key in (("keypoints", f"{net}nets.1.nets.weight"), ("feature_dim", f"{net}nets.3.weight")):
        if key in sd:
            kw[name] = sd[key].shape[0]
    width = fmt.unet_width(sd)
    kw["n_obs_steps"] = fmt.n_obs_steps(settings["n_obs_steps"], width, len(rgb) * kw.get("feature_dim", 64)
                                        + kw["low_dim"], notes, assumed)
    if assumed:
        notes.append(f"not in the checkpoint, Push-T image defaults assumed: {', '.join(assumed)}")
    try:
        config = EncoderConfig.robomimic(**kw)
    except ValueError as e:
        raise ck.CheckpointError(f"encoder settings do not fit: {e}") from None
    keys = fmt.ObsKeys(tuple(rgb), tuple(zip(low, dims)))
    return _load(sd, keys.cameras, config, width, notes, assumed), "", keys


def _load(sd: dict[str, Any], cameras: tuple[str, ...], config: EncoderConfig, width: int | None, notes: list[str],
          assumed: list[str]) -> ObsEncoder:
    """ObsEncoder(config) with camera i's tensors at `obs_nets.<cameras[i]>.`; each tensor is read from either of its
    names, and where a checkpoint holds both (as robomimic saves them) they must be equal."""
    encoder = ObsEncoder(config)
    paths = {}
    for ours in encoder.state_dict():
        c, names = robomimic_encoder_keys(ours)
        paths[ours] = [f"{fmt.DP_HYBRID}{cameras[c]}.{n}" for n in names]
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
    what = f"obs_encoder keys do not fit the {config.name} encoder under {fmt.DP_HYBRID}{list(cameras)}"
    what += f" (assumed, not in the checkpoint: {', '.join(assumed)})" if assumed else ""
    encoder = fmt.load_strict(encoder, named, {names[0]: ours for ours, names in paths.items()}, present, what,
                              notes)
    fmt.check_width("encoder", config.n_obs_steps, config.frame_parts, config.cond_dim, width)
    notes.append(f"encoder: {fmt.DP_HYBRID}{list(cameras)} ({len(paths)} tensors, each under both of its names), "
                 f"{config}")
    return encoder
