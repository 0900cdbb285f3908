"""policy, LeRobot's observation side: its DiffusionRgbEncoder, its normalisation statistics in both releases'
layouts, and LeRobot folders loaded observation -> actions.

  - the encoder against an oracle written here from LeRobot's modeling_diffusion.py (a functional ResNet-18 trunk
    read from LeRobot's numbered keys, GroupNorm(C // 16) or eval BatchNorm; 1x1 conv, softmax over positions,
    numpy's grid, Linear, ReLU; the state first; per sample and frame); wrong encoders fail it;
  - the key layout of a Push-T policy (numbered backbone, pos_grid, the per-camera prefix);
  - statistics: buffers (mean_std, min_max with eps in the denominator) and processor pipelines (MIN_MAX with eps
    only for a zero range, QUANTILES, (C,) visual statistics); bad keys listed;
  - folders: encoder and statistics from either release, pipeline files preferred, reasons and errors;
  - dpk.load_policy on a folder: raw observation -> actions in the environment's units.
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
CROP_TOP_LEFT = {PUSHT: (6, 6), ODD_BN: (5, 18), TINY: (2, 2)}  # round(37 / 2) = 18: halves to even
UNET = U.UNetConfig(input_dim=2, global_cond_dim=132, diffusion_step_embed_dim=16, down_dims=(16, 32), kernel_size=3,
                    n_groups=8, cond_predict_scale=True)
UNET_MODEL = U.ConditionalUnet1D(UNET)
P = OF.LEROBOT_ENCODER


def inputs(cfg, b: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, cfg.n_obs_steps, *cfg.image_shape, generator=g),
            torch.rand(b, cfg.n_obs_steps, cfg.low_dim, generator=g) * 2 - 1)


def oracle(w: dict[str, torch.Tensor], cfg, image: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """LeRobot's _prepare_global_conditioning with one DiffusionRgbEncoder, eval, from its state dict `w` (keys
    without the `diffusion.rgb_encoder.` prefix), one sample and one frame at a time."""
    names = ("backbone.0", "backbone.1", *(f"backbone.{i}" for i in range(4, 8)))  # resnet18's children[:-2]
    (top, left), (h, wd) = CROP_TOP_LEFT[cfg], cfg.crop_shape
    rows = []
    for b in range(image.shape[0]):
        frames = []
        for t in range(cfg.n_obs_steps):
            fmap = resnet18_oracle(w, image[b, t, :, top:top + h, left:left + wd][None], cfg.norm, names)
            kp = F.conv2d(fmap, w["pool.nets.weight"], w["pool.nets.bias"])[0]
            mh, mw = kp.shape[1:]
            px, py = np.meshgrid(np.linspace(-1.0, 1.0, mw), np.linspace(-1.0, 1.0, mh))
            grid = torch.from_numpy(np.stack([px.reshape(-1), py.reshape(-1)], axis=1)).float()
            xy = torch.softmax(kp.reshape(cfg.keypoints, mh * mw), dim=-1) @ grid
            feat = F.relu(F.linear(xy.reshape(-1), w["out.weight"], w["out.bias"]))
            frames += [state[b, t], feat]  # the state before the image features
        rows.append(torch.cat(frames))
    return torch.stack(rows)


def lerobot_weights(enc: E.ObsEncoder) -> dict[str, torch.Tensor]:
    return {k[len(P):]: v for k, v in OF.lerobot_encoder_tensors(enc).items()}


@pytest.mark.parametrize("cfg", [PUSHT, ODD_BN], ids=["pusht_gn", "odd_bn"])
def test_encoder_matches_oracle(cfg):
    enc = randomized(E.ObsEncoder(cfg, seed=2))
    image, state = inputs(cfg)
    with torch.no_grad():
        out = enc(image, state)
        assert out.shape == (2, cfg.cond_dim) and cfg.cond_dim == cfg.n_obs_steps * (cfg.low_dim + 2 * cfg.keypoints)
        torch.testing.assert_close(out, oracle(lerobot_weights(enc), cfg, image, state), rtol=1e-5, atol=1e-5)


class ImageFirst(E.ObsEncoder):
    def forward(self, image, agent_pos):
        b, n = image.shape[:2]
        feats = self.head(self.backbone.features(self.transform(image.reshape(b * n, *image.shape[2:]))))
        return torch.cat([feats, agent_pos.reshape(b * n, -1)], dim=-1).reshape(b, -1)


def wrong_encoder(kind: str) -> E.ObsEncoder:
    cfg = dataclasses.replace(ODD_BN, crop_shape=None) if kind == "no_crop" else ODD_BN
    enc = randomized((ImageFirst if kind == "image_first" else E.ObsEncoder)(cfg, seed=2))
    pool = enc.head.pool
    if kind == "grid_yx":
        pool.pos_grid.copy_(pool.pos_grid.flip(1))
    if kind == "softmax_over_keypoints":
        pool.forward = lambda f: (torch.softmax(pool.nets(f).reshape(f.shape[0], pool.keypoints, -1), dim=1)
                                  @ pool.pos_grid).view(-1, pool.keypoints, 2)
    if kind == "no_relu":
        enc.head.relu = torch.nn.Identity()
    if kind == "batch_statistics":
        enc.backbone.train()
    return enc


@pytest.mark.parametrize("kind", ["image_first", "no_crop", "grid_yx", "softmax_over_keypoints", "no_relu",
                                  "batch_statistics"])
def test_wrong_encoders_are_caught(kind):
    enc = wrong_encoder(kind)
    image, state = inputs(ODD_BN)
    with torch.no_grad():
        got, want = enc(image, state), oracle(lerobot_weights(enc), ODD_BN, image, state)
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
    bn = OF.lerobot_encoder_tensors(E.ObsEncoder(E.EncoderConfig.lerobot(norm="batch")), separate=True)
    assert len(bn) == 125 and f"{P}0.backbone.4.1.bn2.running_var" in bn
    assert f"{P}0.backbone.1.num_batches_tracked" in bn


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


def write_folder(path, enc: E.ObsEncoder | None = None, release: str = "pipeline", separate: bool = False,
                 unet: U.ConditionalUnet1D = UNET_MODEL, encoder: dict | None = None, **config):
    """A LeRobot folder of `enc` (default: Push-T's, random) and UNET_MODEL, its statistics in `release`'s layout."""
    enc = enc or randomized(E.ObsEncoder(PUSHT, seed=5))
    cfg = OF.lerobot_encoder_config(enc.config, separate) | config
    buffers = {}
    if release == "buffers":
        buffers = OF.lerobot_buffers("observation.image", *(tuple(STATS[k][n].reshape(shape) for n in names)
                                     for k, names, shape in (("observation.image", ("mean", "std"), (3, 1, 1)),
                                                             ("observation.state", ("min", "max"), (-1,)),
                                                             ("action", ("min", "max"), (-1,)))))
    folder = UF.save_lerobot_folder(unet, path, unet.cfg, config_extra=cfg, others=buffers,
                                    encoder=OF.lerobot_encoder_tensors(enc, separate) if encoder is None else encoder)
    if release == "pipeline":
        OF.save_lerobot_processors(folder, UF.lerobot_config(unet.cfg, **cfg), STATS)
    return folder


@pytest.mark.parametrize(("release", "separate"), [("pipeline", False), ("pipeline", True), ("buffers", False)])
def test_folder_gives_encoder_and_statistics(release, separate, tmp_path):
    enc = randomized(E.ObsEncoder(PUSHT, seed=5))
    side = L.load_observation_side(write_folder(tmp_path / "pretrained_model", enc, release, separate))
    assert side.source == "lerobot" and side.encoder.config == PUSHT
    image, state = inputs(PUSHT)
    with torch.no_grad():
        assert torch.equal(side.encoder(image, state), enc(image, state))
    modes = {"pipeline": "range", "buffers": "min_max"}[release]
    assert side.normalizer.modes == {"observation.image": "mean_std", "observation.state": modes, "action": modes}
    assert any(f"encoder: {P}{'0.' if separate else ''}* (65 tensors)" in n for n in side.notes)


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


@pytest.mark.parametrize(("config", "reason"), [
    ({"resize_shape": [90, 90]}, "resize_shape [90, 90]"),
    ({"vision_backbone": "resnet34"}, "vision_backbone resnet34"),
    ({"input_features": {**FEATURES, "observation.images.top": {"type": "VISUAL", "shape": [3, 96, 96]}}},
     "one camera is implemented"),
    ({"input_features": {**FEATURES, "observation.environment_state": {"type": "ENV", "shape": [4]}}},
     "environment state"),
])
def test_unsupported_encoders_give_none_and_why(config, reason, tmp_path):
    side = L.load_observation_side(write_folder(tmp_path / "f", **config))
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
    with pytest.raises(CheckpointError, match=r"keys do not fit .* \(batch norm, 32 keypoints\)"):
        L.load_observation_side(write_folder(tmp_path / "norm", use_group_norm=False))
    with pytest.raises(CheckpointError, match=r"2 x \(2 \+ 64\) = 132 features but the U-Net's global_cond_dim is 6"):
        L.load_observation_side(write_folder(tmp_path / "cond", unet=U.ConditionalUnet1D(
            dataclasses.replace(UNET, global_cond_dim=6))))


def test_load_policy_observation_in_actions_out(tmp_path):
    """load_policy on a LeRobot folder: raw observation -> the pipeline's statistics -> LeRobot's encoder -> chunk
    -> actions in the environment's units, as feeding the encoder's output as conditioning."""
    enc = randomized(E.ObsEncoder(TINY, seed=3))
    unet = U.ConditionalUnet1D(dataclasses.replace(UNET, global_cond_dim=TINY.cond_dim))
    folder = write_folder(tmp_path / "tiny", enc, unet=unet, num_inference_steps=4, horizon=8, n_action_steps=4,
                          input_features={"observation.image": {"type": "VISUAL", "shape": [3, 44, 44]},
                                          "observation.state": {"type": "STATE", "shape": [2]}})
    OF.save_lerobot_processors(folder, UF.lerobot_config(unet.cfg, **OF.lerobot_encoder_config(TINY)),
                               {**STATS, "observation.state": {"min": torch.tensor([13.0, 32.0]),
                                                               "max": torch.tensor([496.0, 510.0])}})
    by_obs = dpk.load_policy(folder, device="cpu", verify=False, pick="order")
    by_cond = dpk.load_policy(folder, device="cpu", verify=False, observation=False, pick="order")
    assert by_cond.chunk.encoder is None  # load_policy loads the family afresh: its own EncoderConfig class
    assert dataclasses.asdict(by_obs.chunk.encoder.config) == dataclasses.asdict(TINY)
    g = torch.Generator().manual_seed(1)
    image, pos = torch.rand(2, 1, 3, 44, 44, generator=g), torch.rand(2, 1, 2, generator=g) * 500
    got = by_obs.predict(image=image, agent_pos=pos, seed=9)
    im = STATS["observation.image"]
    with torch.no_grad():
        cond = enc((image - im["mean"].view(3, 1, 1)) / (im["std"].view(3, 1, 1) + 1e-8),
                   2 * (pos - torch.tensor([13.0, 32.0])) / torch.tensor([483.0, 478.0]) - 1)
    want = by_cond.predict(cond, seed=9)
    assert float((got["action_pred"] - want["action_pred"]).abs().max()) < 1e-3 * float(want["action_pred"].abs().max())
    assert float(want["action_pred"].abs().max()) > 10 and got["action"].shape == (2, 4, 2)  # environment units


@pytest.mark.parametrize("norm", ["group", "batch"])
def test_same_as_lerobots_construction_when_torchvision_is_installed(norm):
    """DiffusionRgbEncoder's backbone as LeRobot builds it: torchvision's resnet18, children[:-2] in a Sequential,
    BatchNorm replaced by GroupNorm(C // 16) with use_group_norm; then SpatialSoftmax's conv and the Linear, drawn
    from the RNG in that order. Same keys, same seeded values, same outputs."""
    try:
        import torchvision
    except (ImportError, RuntimeError) as e:  # RuntimeError: a torchvision built for another torch
        pytest.skip(f"torchvision does not import: {e}")
    torch.manual_seed(4)
    backbone = torch.nn.Sequential(*list(torchvision.models.resnet18(weights=None).children())[:-2])
    if norm == "group":
        for name, m in [(n, m) for n, m in backbone.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]:
            parent, _, leaf = name.rpartition(".")
            setattr(backbone.get_submodule(parent), leaf, torch.nn.GroupNorm(m.num_features // 16, m.num_features))
    nets, out = torch.nn.Conv2d(512, 32, kernel_size=1), torch.nn.Linear(64, 64)
    cfg = E.EncoderConfig.lerobot(norm=norm)
    got = lerobot_weights(E.ObsEncoder(cfg, seed=4))
    want = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    want |= {"pool.nets.weight": nets.weight, "pool.nets.bias": nets.bias, "out.weight": out.weight,
             "out.bias": out.bias}
    assert sorted(want) == sorted(k for k in got if k != "pool.pos_grid")
    assert all(torch.equal(want[k], got[k]) for k in want)
    enc = randomized(E.ObsEncoder(cfg, seed=4))
    backbone.load_state_dict({k[len("backbone."):]: v for k, v in lerobot_weights(enc).items()
                              if k.startswith("backbone.")})
    with torch.no_grad():
        x = torch.rand(2, 3, 84, 84)
        torch.testing.assert_close(enc.backbone.features(x), backbone.eval()(x), rtol=0, atol=0)
