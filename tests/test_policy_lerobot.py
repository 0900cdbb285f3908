"""policy, LeRobot's observation side: its DiffusionRgbEncoder, its normalisation statistics in both releases'
layouts, and LeRobot folders loaded observation -> actions.

  - the encoder against an oracle written here from LeRobot's modeling_diffusion.py (a functional ResNet-18 trunk
    read from LeRobot's numbered keys, GroupNorm(C // 16) or eval BatchNorm; 1x1 conv, softmax over positions,
    numpy's grid, Linear, ReLU; the state first, then each camera; per sample, frame and camera); wrong encoders
    fail it; one to three cameras, one shared encoder or one per camera;
  - the key layout of a Push-T policy (numbered backbone, pos_grid, the per-camera prefix);
  - statistics: buffers (mean_std, min_max with eps in the denominator) and processor pipelines (MIN_MAX with eps
    only for a zero range, QUANTILES, (C,) visual statistics); bad keys listed;
  - folders: encoder and statistics from either release, pipeline files preferred, reasons and errors;
  - dpk.load_policy on a folder: raw observation -> actions in the environment's units; a policy without cameras
    conditioned on its state and environment state.
"""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dpk
from dpk import registry

from ._helpers import ROOT, randomized, resnet18_oracle

registry.load([ROOT / "kernels"], strict=True)
E = importlib.import_module("dpk.families.policy._encoder")
N = importlib.import_module("dpk.families.policy._normalizer")
L = importlib.import_module("dpk.families.policy._observation")
OF = importlib.import_module("dpk.families.policy._observation_formats")
U = importlib.import_module("dpk.families.unet1d._unet")
UF = importlib.import_module("dpk.families.unet1d._checkpoint_formats")
CheckpointError = importlib.import_module("dpk.families.unet1d._checkpoint").CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")

PUSHT = E.EncoderConfig.lerobot()
ODD_BN = E.EncoderConfig.lerobot(image_shape=(3, 90, 77), crop_shape=(80, 40), n_obs_steps=3, low_dim=5,
                                 norm="batch", keypoints=7)
TINY = E.EncoderConfig.lerobot(image_shape=(3, 44, 44), crop_shape=(40, 40), n_obs_steps=1, keypoints=4)
TWO_SEPARATE = dataclasses.replace(TINY, n_obs_steps=2, n_cameras=2, separate=True)  # one encoder per camera
THREE_SHARED = dataclasses.replace(TINY, n_obs_steps=2, n_cameras=3, norm="batch")  # one encoder for all three
CROP_TOP_LEFT = {PUSHT: (6, 6), ODD_BN: (5, 18), TINY: (2, 2), TWO_SEPARATE: (2, 2), THREE_SHARED: (2, 2)}
# (round(37 / 2) = 18: halves to even)
UNET = U.UNetConfig(input_dim=2, global_cond_dim=132, diffusion_step_embed_dim=16, down_dims=(16, 32), kernel_size=3,
                    n_groups=8, cond_predict_scale=True)
UNET_MODEL = U.ConditionalUnet1D(UNET)
P = OF.LEROBOT_ENCODER


def inputs(cfg, b: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, *cfg.input_shape, generator=g),
            torch.rand(b, cfg.n_obs_steps, cfg.low_dim, generator=g) * 2 - 1)


def rgb_oracle(w: dict[str, torch.Tensor], cfg, image: torch.Tensor) -> torch.Tensor:
    """One DiffusionRgbEncoder, eval, from its state dict `w` (LeRobot's keys), on one (3, H, W) image."""
    names = ("backbone.0", "backbone.1", *(f"backbone.{i}" for i in range(4, 8)))  # resnet18's children[:-2]
    (top, left), (h, wd) = CROP_TOP_LEFT[cfg], cfg.crop_shape
    fmap = resnet18_oracle(w, image[:, top:top + h, left:left + wd][None], cfg.norm, names)
    kp = F.conv2d(fmap, w["pool.nets.weight"], w["pool.nets.bias"])[0]
    mh, mw = kp.shape[1:]
    px, py = np.meshgrid(np.linspace(-1.0, 1.0, mw), np.linspace(-1.0, 1.0, mh))
    grid = torch.from_numpy(np.stack([px.reshape(-1), py.reshape(-1)], axis=1)).float()
    xy = torch.softmax(kp.reshape(cfg.keypoints, mh * mw), dim=-1) @ grid
    return F.relu(F.linear(xy.reshape(-1), w["out.weight"], w["out.bias"]))


def oracle(ws: list[dict[str, torch.Tensor]], cfg, image: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """LeRobot's _prepare_global_conditioning, eval, with camera c's encoder weights ws[c], one sample, frame and
    camera at a time: per frame the state, then each camera's features."""
    rows = []
    for b in range(image.shape[0]):
        frames = []
        for t in range(cfg.n_obs_steps):
            cams = [image[b, t]] if cfg.n_cameras == 1 else list(image[b, t])
            frames += [state[b, t], *(rgb_oracle(w, cfg, img) for w, img in zip(ws, cams, strict=True))]
        rows.append(torch.cat(frames))
    return torch.stack(rows)


def lerobot_weights(enc: E.ObsEncoder) -> list[dict[str, torch.Tensor]]:
    """Each camera's encoder weights under LeRobot's keys (without `diffusion.rgb_encoder.[<camera>.]`)."""
    sd, cfg = {k[len(P):]: v for k, v in OF.lerobot_encoder_tensors(enc).items()}, enc.config
    if not cfg.separate:
        return [sd] * cfg.n_cameras
    return [{k[len(f"{c}."):]: v for k, v in sd.items() if k.startswith(f"{c}.")} for c in range(cfg.n_cameras)]


@pytest.mark.parametrize("cfg", [PUSHT, ODD_BN, TWO_SEPARATE, THREE_SHARED],
                         ids=["pusht_gn", "odd_bn", "two_cameras_separate", "three_cameras_shared_bn"])
def test_encoder_matches_oracle(cfg):
    enc = randomized(E.ObsEncoder(cfg, seed=2))
    image, state = inputs(cfg)
    with torch.no_grad():
        out = enc(image, state)
        width = cfg.low_dim + cfg.n_cameras * 2 * cfg.keypoints
        assert out.shape == (2, cfg.cond_dim) and cfg.cond_dim == cfg.n_obs_steps * width
        assert len(enc.rgb) == (cfg.n_cameras if cfg.separate else 1)
        torch.testing.assert_close(out, oracle(lerobot_weights(enc), cfg, image, state), rtol=1e-5, atol=1e-5)


class ImageFirst(E.ObsEncoder):
    def forward(self, image, agent_pos):
        b, n = image.shape[:2]
        feats = self.rgb[0](self.transform(image.reshape(b * n, *image.shape[2:])))
        return torch.cat([feats, agent_pos.reshape(b * n, -1)], dim=-1).reshape(b, -1)


def wrong_encoder(kind: str, cfg) -> E.ObsEncoder:
    cfg = dataclasses.replace(cfg, crop_shape=None) if kind == "no_crop" else cfg
    enc = randomized((ImageFirst if kind == "image_first" else E.ObsEncoder)(cfg, seed=2))
    pool = enc.rgb[0].pool
    if kind == "grid_yx":
        pool.pos_grid.copy_(pool.pos_grid.flip(1))
    if kind == "softmax_over_keypoints":
        pool.forward = lambda f: (torch.softmax(pool.nets(f).reshape(f.shape[0], pool.keypoints, -1), dim=1)
                                  @ pool.pos_grid).view(-1, pool.keypoints, 2)
    if kind == "no_relu":
        enc.rgb[0].relu = torch.nn.Identity()
    if kind == "batch_statistics":
        enc.rgb[0].backbone.train()
    if kind == "cameras_reversed":
        enc.forward = lambda image, state: E.ObsEncoder.forward(enc, image.flip(2), state)
    return enc


@pytest.mark.parametrize(("kind", "cfg"), [*((k, ODD_BN) for k in ("image_first", "no_crop", "grid_yx",
                                                                   "softmax_over_keypoints", "no_relu",
                                                                   "batch_statistics")),
                                           ("cameras_reversed", TWO_SEPARATE), ("cameras_reversed", THREE_SHARED)])
def test_wrong_encoders_are_caught(kind, cfg):
    enc = wrong_encoder(kind, cfg)
    image, state = inputs(cfg)
    with torch.no_grad():
        got, want = enc(image, state), oracle(lerobot_weights(enc), cfg, image, state)
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_pusht_key_layout():
    """A Push-T LeRobot policy's encoder keys (GroupNorm ResNet, 32 keypoints on a 3 x 3 map: 132 features)."""
    sd = OF.lerobot_encoder_tensors(E.ObsEncoder(PUSHT))
    assert PUSHT.cond_dim == 132 and PUSHT.map_shape == (3, 3) and len(sd) == 65
    shapes = {f"{P}backbone.0.weight": (64, 3, 7, 7), f"{P}backbone.1.bias": (64,),
              f"{P}backbone.5.0.downsample.1.weight": (128,), f"{P}backbone.7.1.bn2.bias": (512,),
              f"{P}pool.nets.weight": (32, 512, 1, 1), f"{P}pool.pos_grid": (9, 2), f"{P}out.weight": (64, 64)}
    assert {k: tuple(sd[k].shape) for k in shapes} == shapes
    assert not any(k.startswith(f"{P}backbone.{i}.") for k in sd for i in (2, 3, 8, 9))  # relu, maxpool; no avgpool
    bn = OF.lerobot_encoder_tensors(E.ObsEncoder(E.EncoderConfig.lerobot(norm="batch", n_cameras=2, separate=True)))
    assert len(bn) == 250 and f"{P}0.backbone.4.1.bn2.running_var" in bn and f"{P}1.pool.pos_grid" in bn
    assert f"{P}1.backbone.1.num_batches_tracked" in bn and not any(k.startswith(f"{P}2.") for k in bn)
    shared = OF.lerobot_encoder_tensors(E.ObsEncoder(E.EncoderConfig.lerobot(n_cameras=2)))
    assert len(shared) == 65 and f"{P}backbone.0.weight" in shared


STATS = {"observation.image": {"mean": torch.tensor([0.4, 0.5, 0.6]), "std": torch.tensor([0.2, 0.25, 0.3]),
                               "min": torch.zeros(3), "max": torch.ones(3)},
         "observation.state": {"min": torch.tensor([13.0, 32.0, 7.0]), "max": torch.tensor([496.0, 510.0, 7.0]),
                               "q01": torch.tensor([20.0, 40.0, 6.0]), "q99": torch.tensor([480.0, 500.0, 8.0]),
                               "mean": torch.tensor([250.0, 260.0, 7.0]), "std": torch.tensor([90.0, 95.0, 0.0]),
                               "count": torch.tensor([25650])},
         "action": {"min": torch.tensor([12.0, 25.0]), "max": torch.tensor([511.0, 505.0]),
                    "q01": torch.tensor([30.0, 35.0]), "q99": torch.tensor([490.0, 495.0])}}
FEATURES = {"observation.image": {"type": "VISUAL", "shape": [3, 96, 96]},
            "observation.state": {"type": "STATE", "shape": [3]}, "action": {"type": "ACTION", "shape": [2]}}


def pipelines(norm_map: dict[str, str], eps: float = 1e-8, stats: dict | None = None):
    flat = {f"{k}.{n}": t for k, named in (stats or STATS).items() for n, t in named.items()}
    pre = {"eps": eps, "features": FEATURES, "norm_map": norm_map}
    return (pre, flat), ({**pre, "features": {"action": FEATURES["action"]}}, flat)


def test_processor_statistics_are_lerobots():
    """normalize_processor.py's arithmetic: MEAN_STD (x - mean) / (std + eps); MIN_MAX 2 (x - min) / d - 1 with
    d = max - min, eps where that is 0 (the state's third entry); QUANTILES with q01 / q99; back (x + 1) / 2 d + lo."""
    norm = N.Normalizer.from_lerobot_processors(*pipelines({"VISUAL": "MEAN_STD", "STATE": "MIN_MAX",
                                                            "ACTION": "QUANTILES"}), image_key="observation.image")
    assert norm.modes == {"observation.image": "mean_std", "observation.state": "range", "action": "range"}
    image, state = torch.rand(2, 2, 3, 96, 96), torch.rand(2, 2, 3) * 512
    nimage, nstate = norm.normalize_obs(image, state)
    im, st = STATS["observation.image"], STATS["observation.state"]
    assert torch.equal(nimage, (image - im["mean"].view(3, 1, 1)) / (im["std"].view(3, 1, 1) + 1e-8))
    d = torch.tensor([483.0, 478.0, 1e-8])
    assert torch.equal(nstate, 2 * (state - st["min"]) / d - 1)
    naction = torch.rand(3, 16, 2) * 2 - 1
    q01, q99 = STATS["action"]["q01"], STATS["action"]["q99"]
    assert torch.equal(norm.unnormalize_action(naction), (naction + 1) / 2 * (q99 - q01) + q01)
    torch.testing.assert_close(norm.normalize_action(norm.unnormalize_action(naction)), naction)
    identity = N.Normalizer.from_lerobot_processors(*pipelines({"VISUAL": "IDENTITY", "ACTION": "MIN_MAX"}),
                                                    image_key="observation.image")
    assert identity.modes == {"observation.image": "identity", "observation.state": "identity", "action": "range"}


def test_processor_statistics_errors():
    def load(norm_map, **stats):
        return N.Normalizer.from_lerobot_processors(*pipelines(norm_map, stats={**STATS, **stats}),
                                                    image_key="observation.image")
    with pytest.raises(CheckpointError, match=r"missing \(2\): observation.state.q10, observation.state.q90"):
        load({"STATE": "QUANTILE10"})
    with pytest.raises(CheckpointError, match=r"misshaped \(1\): action.max \(expected \(2,\), found \(3,\)\)"):
        load({"ACTION": "MIN_MAX"}, action={"min": torch.zeros(2), "max": torch.ones(3)})
    with pytest.raises(CheckpointError, match="mode 'LOG' of 'action' is not supported"):
        load({"ACTION": "LOG"})


STATE2 = {"min": torch.tensor([13.0, 32.0]), "max": torch.tensor([496.0, 510.0])}  # a 2-d agent position's


def camera_stats(cfg) -> dict[str, dict[str, torch.Tensor]]:
    """Each camera's image statistics (camera c's mean and std STATS' + c / 10), the 2-d state's, the action's."""
    image = STATS["observation.image"]
    cams = {k: {n: t + c / 10 for n, t in image.items()} for c, k in enumerate(OF.lerobot_camera_keys(cfg))}
    return cams | {"observation.state": STATE2, "action": STATS["action"]}


def write_folder(path, enc: E.ObsEncoder | None = None, release: str = "pipeline",
                 unet: U.ConditionalUnet1D = UNET_MODEL, encoder: dict | None = None, stats: dict | None = None,
                 **config):
    """A LeRobot folder of `enc` (default: Push-T's, random) and UNET_MODEL, its statistics in `release`'s layout."""
    enc = enc or randomized(E.ObsEncoder(PUSHT, seed=5))
    cfg = OF.lerobot_encoder_config(enc.config) | config
    buffers, stats = {}, stats or camera_stats(enc.config)
    if release == "buffers":  # one camera
        buffers = OF.lerobot_buffers("observation.image", *(tuple(stats[k][n].reshape(shape) for n in names)
                                     for k, names, shape in (("observation.image", ("mean", "std"), (3, 1, 1)),
                                                             ("observation.state", ("min", "max"), (-1,)),
                                                             ("action", ("min", "max"), (-1,)))))
    folder = UF.save_lerobot_folder(unet, path, unet.cfg, config_extra=cfg, others=buffers,
                                    encoder=OF.lerobot_encoder_tensors(enc) if encoder is None else encoder)
    if release == "pipeline":
        OF.save_lerobot_processors(folder, UF.lerobot_config(unet.cfg, **cfg), stats)
    return folder


@pytest.mark.parametrize(("release", "cfg", "tensors"), [
    ("pipeline", PUSHT, 65), ("buffers", PUSHT, 65), ("pipeline", dataclasses.replace(PUSHT, separate=True), 65),
    ("pipeline", dataclasses.replace(PUSHT, n_cameras=2, separate=True), 130),
    ("pipeline", dataclasses.replace(PUSHT, n_cameras=3), 65)])
def test_folder_gives_encoder_and_statistics(release, cfg, tensors, tmp_path):
    enc = randomized(E.ObsEncoder(cfg, seed=5))
    unet = U.ConditionalUnet1D(dataclasses.replace(UNET, global_cond_dim=cfg.cond_dim))
    side = L.load_observation_side(write_folder(tmp_path / "pretrained_model", enc, release, unet=unet))
    assert side.source == "lerobot" and side.encoder.config == dataclasses.replace(cfg, rgb_key=OF.lerobot_camera_keys(
        cfg)[0])
    image, state = inputs(cfg)
    with torch.no_grad():
        assert torch.equal(side.encoder(image, state), enc(image, state))
    modes = {"pipeline": "range", "buffers": "min_max"}[release]
    cameras = OF.lerobot_camera_keys(cfg)
    assert side.normalizer.modes == {**{k: "mean_std" for k in cameras}, "observation.state": modes, "action": modes}
    assert any(f"encoder: {P}* ({tensors} tensors, {cfg.n_cameras} camera(s)" in n for n in side.notes)
    raw = torch.rand(2, *cfg.input_shape)
    stats = camera_stats(cfg)
    want = [(raw[:, :, c] if cfg.n_cameras > 1 else raw) - stats[k]["mean"].view(3, 1, 1) for c, k in
            enumerate(cameras)]
    want = [w / (stats[k]["std"].view(3, 1, 1) + 1e-8) for w, k in zip(want, cameras)]
    got = side.normalizer.normalize_obs(raw, state)[0]
    assert torch.equal(got, torch.stack(want, dim=2) if cfg.n_cameras > 1 else want[0])


def test_pipeline_statistics_win_over_buffers(tmp_path):
    folder = write_folder(tmp_path / "both", release="buffers")
    OF.save_lerobot_processors(folder, {"input_features": FEATURES, "output_features": {"action": FEATURES["action"]},
                                        "normalization_mapping": {"STATE": "MEAN_STD"}}, STATS)
    side = L.load_observation_side(folder)
    assert side.normalizer.modes == {"observation.image": "identity", "observation.state": "mean_std",
                                     "action": "identity"}
    (folder / "policy_postprocessor.json").unlink()
    with pytest.raises(CheckpointError, match=r"postprocessor\.json is missing beside policy_preprocessor\.json"):
        L.load_observation_side(folder)
    OF.save_lerobot_processors(folder, {}, STATS)
    (folder / "policy_preprocessor_step_3_normalizer_processor.safetensors").unlink()
    with pytest.raises(CheckpointError, match="state file 'policy_preprocessor_step_3_normalizer_processor"):
        L.load_observation_side(folder)


PUSHT_FEATURES = OF.lerobot_encoder_config(PUSHT)["input_features"]


@pytest.mark.parametrize(("config", "reason"), [
    ({"resize_shape": [90, 90]}, "resize_shape [90, 90]"),
    ({"vision_backbone": "resnet34"}, "vision_backbone resnet34"),
    ({"input_features": {**PUSHT_FEATURES, "observation.images.top": {"type": "VISUAL", "shape": [3, 64, 64]}}},
     "cameras of different shapes"),
    ({"input_features": {**PUSHT_FEATURES, "observation.environment_state": {"type": "ENV", "shape": [4]}}},
     "environment state"),
])
def test_unsupported_encoders_give_none_and_why(config, reason, tmp_path):
    stats = camera_stats(PUSHT) | {"observation.images.top": STATS["observation.image"]}
    side = L.load_observation_side(write_folder(tmp_path / "f", stats=stats, **config))
    assert side.encoder is None and reason in side.encoder_reason


def test_bad_encoder_folders_are_listed(tmp_path):
    enc = E.ObsEncoder(PUSHT)
    sd = OF.lerobot_encoder_tensors(enc)
    sd.pop(f"{P}backbone.6.1.bn2.bias")
    sd[f"{P}backbone.8.weight"] = torch.zeros(1)
    sd[f"{P}pool.nets.weight"] = torch.zeros(16, 512, 1, 1)
    with pytest.raises(CheckpointError) as err:
        L.load_observation_side(write_folder(tmp_path / "keys", encoder=sd))
    msg = str(err.value)
    assert str(tmp_path / "keys") in msg and f"missing (1): {P}backbone.6.1.bn2.bias" in msg
    assert f"unexpected (1): {P}backbone.8.weight" in msg
    assert f"misshaped (1): {P}pool.nets.weight (expected (32, 512, 1, 1), found (16, 512, 1, 1))" in msg
    with pytest.raises(CheckpointError, match=r"keys do not fit .* \(batch norm, 32 keypoints, one shared\)"):
        L.load_observation_side(write_folder(tmp_path / "norm", use_group_norm=False))
    with pytest.raises(CheckpointError, match=rf"one per camera\) under .*\n  missing \(65\): {P}0\.backbone"):
        L.load_observation_side(write_folder(tmp_path / "separate", use_separate_rgb_encoder_per_camera=True))
    with pytest.raises(CheckpointError, match=r"2 x \(2 \+ 64\) = 132 features but the U-Net's global_cond_dim is 6"):
        L.load_observation_side(write_folder(tmp_path / "cond", unet=U.ConditionalUnet1D(
            dataclasses.replace(UNET, global_cond_dim=6))))


@pytest.mark.parametrize("cfg", [TINY, TWO_SEPARATE], ids=["one_camera", "two_cameras"])
def test_load_policy_observation_in_actions_out(cfg, tmp_path):
    """load_policy on a LeRobot folder: raw observation -> the pipeline's statistics (each camera's own) -> LeRobot's
    encoder -> chunk -> actions in the environment's units, as feeding the encoder's output as conditioning."""
    enc = randomized(E.ObsEncoder(cfg, seed=3))
    unet = U.ConditionalUnet1D(dataclasses.replace(UNET, global_cond_dim=cfg.cond_dim))
    folder = write_folder(tmp_path / "tiny", enc, unet=unet, num_inference_steps=4, horizon=8, n_action_steps=4)
    by_obs = dpk.load_policy(folder, device="cpu", verify=False, pick="order")
    by_cond = dpk.load_policy(folder, device="cpu", verify=False, observation=False, pick="order")
    assert by_cond.chunk.encoder is None  # load_policy loads the family afresh: its own EncoderConfig class
    assert dataclasses.asdict(by_obs.chunk.encoder.config) == dataclasses.asdict(
        dataclasses.replace(cfg, rgb_key=OF.lerobot_camera_keys(cfg)[0]))
    g = torch.Generator().manual_seed(1)
    image, pos = torch.rand(2, *cfg.input_shape, generator=g), torch.rand(2, cfg.n_obs_steps, 2, generator=g) * 500
    got = by_obs.predict(image=image, agent_pos=pos, seed=9)
    stats = camera_stats(cfg)
    cams = [image] if cfg.n_cameras == 1 else list(image.unbind(2))
    cams = [(x - stats[k]["mean"].view(3, 1, 1)) / (stats[k]["std"].view(3, 1, 1) + 1e-8)
            for x, k in zip(cams, OF.lerobot_camera_keys(cfg), strict=True)]
    with torch.no_grad():
        cond = enc(cams[0] if cfg.n_cameras == 1 else torch.stack(cams, dim=2),
                   2 * (pos - STATE2["min"]) / (STATE2["max"] - STATE2["min"]) - 1)
    want = by_cond.predict(cond, seed=9)
    assert float((got["action_pred"] - want["action_pred"]).abs().max()) < 1e-3 * float(want["action_pred"].abs().max())
    assert float(want["action_pred"].abs().max()) > 10 and got["action"].shape == (2, 4, 2)  # environment units
    by_name = {k: image if cfg.n_cameras == 1 else image[:, :, c] for c, k in enumerate(OF.lerobot_camera_keys(cfg))}
    named = by_obs.predict(obs={**by_name, "observation.state": pos}, seed=9)  # as LeRobot's batch names them
    assert torch.equal(named["action_pred"], got["action_pred"])


@pytest.mark.parametrize("norm", ["group", "batch"])
def test_same_as_lerobots_construction_when_torchvision_is_installed(norm):
    """DiffusionRgbEncoder's backbone as LeRobot builds it: torchvision's resnet18, children[:-2] in a Sequential,
    BatchNorm replaced by GroupNorm(C // 16) with use_group_norm; then SpatialSoftmax's conv and the Linear, drawn
    from the RNG in that order. Same keys, same seeded values, same outputs."""
    try:
        import torchvision
    except (ImportError, RuntimeError) as e:  # RuntimeError: a torchvision built for another torch
        pytest.skip(f"torchvision does not import: {e}")
    def lerobots() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:  # one DiffusionRgbEncoder's construction
        backbone = torch.nn.Sequential(*list(torchvision.models.resnet18(weights=None).children())[:-2])
        if norm == "group":
            for name, m in [(n, m) for n, m in backbone.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]:
                parent, _, leaf = name.rpartition(".")
                setattr(backbone.get_submodule(parent), leaf, torch.nn.GroupNorm(m.num_features // 16,
                                                                                 m.num_features))
        nets, out = torch.nn.Conv2d(512, 32, kernel_size=1), torch.nn.Linear(64, 64)
        return backbone, {**{f"backbone.{k}": v for k, v in backbone.state_dict().items()},
                          "pool.nets.weight": nets.weight, "pool.nets.bias": nets.bias, "out.weight": out.weight,
                          "out.bias": out.bias}
    cfg = E.EncoderConfig.lerobot(norm=norm, n_cameras=2, separate=True)  # two encoders, built one after the other
    torch.manual_seed(4)
    theirs = [lerobots() for _ in range(2)]
    for (_, want), got in zip(theirs, lerobot_weights(E.ObsEncoder(cfg, seed=4)), strict=True):
        assert sorted(want) == sorted(k for k in got if k != "pool.pos_grid")
        assert all(torch.equal(want[k], got[k]) for k in want)
    enc, backbone = randomized(E.ObsEncoder(cfg, seed=4)), theirs[1][0]
    backbone.load_state_dict({k[len("backbone."):]: v for k, v in lerobot_weights(enc)[1].items()
                              if k.startswith("backbone.")})
    with torch.no_grad():
        x = torch.rand(2, 3, 84, 84)
        torch.testing.assert_close(enc.rgb[1].backbone.features(x), backbone.eval()(x), rtol=0, atol=0)


KEYPOINTS_FEATURES = {"observation.state": {"type": "STATE", "shape": [2]},
                      "observation.environment_state": {"type": "ENV", "shape": [16]}}
ENV_STATS = {"min": torch.arange(16.0), "max": torch.arange(16.0) * 3 + 100}


def state_only_folder(path, features=KEYPOINTS_FEATURES, release="pipeline", global_cond_dim=36):
    """A LeRobot policy without cameras (LeRobot's Push-T keypoints setting: 2 frames of state 2 + keypoints 16)."""
    unet = U.ConditionalUnet1D(dataclasses.replace(UNET, global_cond_dim=global_cond_dim))
    cfg = {"n_obs_steps": 2, "horizon": 8, "n_action_steps": 4, "num_inference_steps": 4, "input_features": features,
           "normalization_mapping": {"STATE": "MIN_MAX", "ENV": "MIN_MAX", "ACTION": "MIN_MAX"}}
    stats = {"observation.state": STATE2, "observation.environment_state": ENV_STATS, "action": STATS["action"]}
    buffers = {}
    if release == "buffers":
        buffers = {f"normalize_inputs.buffer_{k.replace('.', '_')}.{n}": t for k, v in stats.items()
                   if k != "action" for n, t in v.items()}
        buffers |= {f"unnormalize_outputs.buffer_action.{n}": stats["action"][n] for n in ("min", "max")}
    folder = UF.save_lerobot_folder(unet, path, unet.cfg, config_extra=cfg, encoder={}, others=buffers)
    if release == "pipeline":
        OF.save_lerobot_processors(folder, UF.lerobot_config(unet.cfg, **cfg), stats)
    return folder


@pytest.mark.parametrize("release", ["pipeline", "buffers"])
def test_state_only_policy_is_conditioned_on_its_state(release, tmp_path):
    """No cameras: global_cond per frame = cat(normalised state, normalised environment state); load_policy's
    predict(agent_pos=, env_state=) equals predict(global_cond) built that way by hand."""
    side = L.load_observation_side(state_only_folder(tmp_path / "keypoints", release=release))
    assert side.encoder is None and "no VISUAL input feature" in side.encoder_reason
    assert (side.state.n_obs_steps, side.state.state_dim, side.state.env_dim, side.state.cond_dim) == (2, 2, 16, 36)
    mode = {"pipeline": "range", "buffers": "min_max"}[release]
    assert side.normalizer.modes == {"observation.state": mode, "observation.environment_state": mode, "action": mode}
    folder = tmp_path / "keypoints"
    by_state = dpk.load_policy(folder, device="cpu", verify=False, pick="order")
    by_cond = dpk.load_policy(folder, device="cpu", verify=False, observation=False, pick="order")
    g = torch.Generator().manual_seed(2)
    pos, env = torch.rand(3, 2, 2, generator=g) * 500, torch.rand(3, 2, 16, generator=g) * 120
    got = by_state.predict(agent_pos=pos, env_state=env, seed=5)["action_pred"]
    if release == "pipeline":  # processor MIN_MAX: 2 (x - min) / (max - min) - 1
        npos = 2 * (pos - STATE2["min"]) / (STATE2["max"] - STATE2["min"]) - 1
        nenv = 2 * (env - ENV_STATS["min"]) / (ENV_STATS["max"] - ENV_STATS["min"]) - 1
    else:  # the buffers' Normalize module: (x - min) / (max - min + 1e-8) * 2 - 1
        npos = (pos - STATE2["min"]) / (STATE2["max"] - STATE2["min"] + 1e-8) * 2 - 1
        nenv = (env - ENV_STATS["min"]) / (ENV_STATS["max"] - ENV_STATS["min"] + 1e-8) * 2 - 1
    want = by_cond.predict(torch.cat([npos, nenv], dim=-1).flatten(start_dim=1), seed=5)["action_pred"]
    assert torch.equal(got, want) and float(want.abs().max()) > 10
    with pytest.raises(ValueError, match=r"env_state must be \(B, 2, 16\), got \(3, 2, 15\)"):
        by_state.predict(agent_pos=pos, env_state=env[..., :15])
    with pytest.raises(TypeError, match="or agent_pos= \\(and env_state=\\): its state"):
        by_state.predict()


def test_state_only_errors(tmp_path):
    no_env = {"observation.state": {"type": "STATE", "shape": [2]}}
    policy = dpk.load_policy(state_only_folder(tmp_path / "a", no_env, global_cond_dim=4), device="cpu",
                             verify=False, pick="order")
    with pytest.raises(ValueError, match="no environment-state feature: call it without env_state="):
        policy.predict(agent_pos=torch.zeros(1, 2, 2), env_state=torch.zeros(1, 2, 16))
    assert policy.predict(agent_pos=torch.zeros(1, 2, 2), seed=0)["action"].shape == (1, 4, 2)
    with pytest.raises(CheckpointError, match=r"2 x \(2 \+ 16\) = 36 features but the U-Net's global_cond_dim is 6"):
        L.load_observation_side(state_only_folder(tmp_path / "b", global_cond_dim=6))
