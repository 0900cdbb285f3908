"""policy, Diffusion Policy's image policy with several cameras (its real-robot configs: MultiImageObsEncoder over
camera_1 and camera_3, one ResNet each or one shared, several low-dim keys):

  - the encoder against an oracle written here from MultiImageObsEncoder's source (per sample and frame: each
    camera in sorted key order, crop, ImageNet normalisation, its ResNet-18 with GroupNorm, global average pool;
    then the low-dim keys in sorted order); a shared ResNet batches the cameras as upstream does;
  - .ckpt round trips (cfg or none), observations by name through dpk.load_policy; resize_shape equal to the
    image's size (the real-robot configs) taken as the identity, any other named as not implemented.
The single-camera image policy: test_policy_observation.py.
"""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

import dpk
from dpk import registry

from ._helpers import ROOT, randomized, resnet18_oracle

registry.load([ROOT / "kernels"], strict=True)
E = importlib.import_module("dpk.families.policy._encoder")
L = importlib.import_module("dpk.families.policy._observation")
OF = importlib.import_module("dpk.families.policy._observation_formats")
U = importlib.import_module("dpk.families.unet1d._unet")
UF = importlib.import_module("dpk.families.unet1d._checkpoint_formats")

pytestmark = pytest.mark.usefixtures("one_thread")

CAMERAS = ["camera_1", "camera_3"]  # sorted, as MultiImageObsEncoder orders them
LOW = [("robot_eef_pose", 2), ("robot_gripper", 1)]
SEPARATE = E.EncoderConfig(image_shape=(3, 40, 48), crop_shape=(36, 44), low_dim=3, imagenet_norm=True, n_cameras=2,
                           separate=True, rgb_key="camera_1", low_dim_key="robot_eef_pose+robot_gripper")
SHARED = dataclasses.replace(SEPARATE, separate=False)
MEAN, STD = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
UNET = U.UNetConfig(input_dim=2, global_cond_dim=SEPARATE.cond_dim, diffusion_step_embed_dim=16, down_dims=(16, 32),
                    kernel_size=3, n_groups=8, cond_predict_scale=True)
FIELDS = {"camera_1": (torch.tensor([2.0]), torch.tensor([-1.0])), "camera_3": (torch.tensor([2.0]),
                                                                                 torch.tensor([-1.0])),
          "robot_eef_pose": (torch.tensor([0.004, 0.005]), torch.tensor([-1.1, -0.9])),
          "robot_gripper": (torch.tensor([0.5]), torch.tensor([0.1])),
          "action": (torch.tensor([0.004, 0.005]), torch.tensor([-1.1, -0.9]))}


def weights(enc: E.ObsEncoder, shared: bool) -> list[dict[str, torch.Tensor]]:
    """Each camera's ResNet under torchvision's names, read back from the policy's keys."""
    sd = OF.dp_encoder_tensors(enc, shared, CAMERAS)
    names = ["rgb"] * 2 if shared else CAMERAS
    return [{k[len(f"{OF.DP_MODELS}{n}."):]: v for k, v in sd.items() if k.startswith(f"{OF.DP_MODELS}{n}.")}
            for n in names]


def oracle(ws: list[dict[str, torch.Tensor]], cfg, image: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """DiffusionUnetImagePolicy.predict_action's global_cond, one sample and frame at a time (crop box (2, 2))."""
    h, w = cfg.crop_shape
    rows = []
    for b in range(image.shape[0]):
        frames = []
        for t in range(cfg.n_obs_steps):
            for c, wc in enumerate(ws):
                x = (image[b, t, c, :, 2:2 + h, 2:2 + w] - MEAN) / STD
                frames.append(resnet18_oracle(wc, x[None]).mean(dim=(2, 3))[0])
            frames.append(low[b, t])
        rows.append(torch.cat(frames))
    return torch.stack(rows)


def inputs(b: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(b, *SEPARATE.input_shape, generator=g), torch.randn(b, 2, 3, generator=g)


@pytest.mark.parametrize("cfg", [SEPARATE, SHARED], ids=["one_resnet_per_camera", "shared_resnet"])
def test_encoder_matches_oracle(cfg):
    enc = randomized(E.ObsEncoder(cfg, seed=2))
    image, low = inputs()
    with torch.no_grad():
        out = enc(image, low)
        assert out.shape == (2, 2 * (2 * 512 + 3))
        want = oracle(weights(enc, not cfg.separate), cfg, image, low)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        swapped = enc(image.flip(2), low)  # cameras in the other order: a different conditioning
        assert not torch.allclose(swapped, want, rtol=1e-3, atol=1e-3)


def write(tmp, cfg: dict | None, enc: E.ObsEncoder, shared: bool = False):
    unet = U.build(UNET, 3)
    parts = OF.dp_encoder_tensors(enc, shared, CAMERAS) | OF.dp_normalizer_tensors(FIELDS)
    return UF.save_diffusion_policy_ckpt(unet, tmp / "real.ckpt", cfg=cfg, others=parts)


def real_cfg(enc_cfg, **obs_encoder) -> dict:
    cfg = OF.dp_cfg(UNET, enc_cfg, shared=not enc_cfg.separate, cameras=CAMERAS, low_dim=LOW,
                    resize_shape=[40, 48], **obs_encoder)
    cfg["policy"] |= {"num_inference_steps": 4, "noise_scheduler": {
        "_target_": "diffusers.schedulers.scheduling_ddim.DDIMScheduler", "num_train_timesteps": 100,
        "beta_schedule": "squaredcos_cap_v2", "clip_sample": True, "prediction_type": "epsilon"}}
    return cfg | {"horizon": 8, "n_action_steps": 4}


def test_real_robot_checkpoint_observation_in(tmp_path):
    enc = randomized(E.ObsEncoder(SEPARATE, seed=3))
    path = write(tmp_path, real_cfg(SEPARATE), enc)
    side = L.load_observation_side(path)
    assert side.encoder.config == SEPARATE and side.encoder_reason == ""
    assert any("resize_shape [40, 48] is the image's own size" in n for n in side.notes)
    assert side.normalizer.keys == (*CAMERAS, "robot_eef_pose+robot_gripper", "action")
    policy = dpk.load_policy(path, device="cpu", verify=False, pick="order")
    by_cond = dpk.load_policy(path, device="cpu", verify=False, observation=False, pick="order")
    g = torch.Generator().manual_seed(4)
    obs = {c: torch.rand(2, 2, 3, 40, 48, generator=g) for c in CAMERAS}
    obs |= {k: torch.rand(2, 2, d, generator=g) * 3 for k, d in LOW}
    got = policy.predict(obs=obs, seed=5)
    with torch.no_grad():
        n = {k: v * FIELDS[k][0] + FIELDS[k][1] for k, v in obs.items()}
        cond = enc(torch.stack([n[c] for c in CAMERAS], dim=2), torch.cat([n[k] for k, _ in LOW], dim=-1))
    want = by_cond.predict(cond, seed=5)
    assert float((got["action_pred"] - want["action_pred"]).abs().max()) < 1e-4 * float(want["action_pred"].abs().max())


def test_shared_and_cfg_less(tmp_path):
    enc = randomized(E.ObsEncoder(SHARED, seed=3))
    side = L.load_observation_side(write(tmp_path, real_cfg(SHARED), enc, shared=True))
    assert side.encoder.config == SHARED
    enc = randomized(E.ObsEncoder(SEPARATE, seed=3))
    side = L.load_observation_side(write(tmp_path, None, enc))  # keys give the cameras (sorted), fields the rest
    assert (side.encoder.config.n_cameras, side.encoder.config.separate, side.encoder.config.low_dim) == (2, True, 3)
    assert side.obs_keys.cameras == tuple(CAMERAS) and side.obs_keys.low_dim == tuple(LOW)
    assert any("n_obs_steps 2 from the U-Net's global_cond_dim 2054 = n * 1027" in n for n in side.notes)


def test_resize_to_another_size_is_named(tmp_path):
    cfg = real_cfg(SEPARATE)
    cfg["policy"]["obs_encoder"]["resize_shape"] = [36, 40]
    side = L.load_observation_side(write(tmp_path, cfg, randomized(E.ObsEncoder(SEPARATE, seed=3))))
    assert side.encoder is None and "resize_shape [36, 40] (torchvision Resize to another size)" in side.encoder_reason
