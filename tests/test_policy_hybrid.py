"""policy, Diffusion Policy's DiffusionUnetHybridImagePolicy: its robomimic encoder and checkpoints.

  - the encoder against an oracle written here from robomimic 0.2.0's source (ResNet18Conv read from its numbered
    keys, GroupNorm(C // 16) or eval BatchNorm; SpatialSoftmax's 1x1 conv, maps / temperature, softmax, sums of
    pos_x * attention and pos_y * attention; Linear; ReLU; the image, then the low-dim key; per sample and frame);
    wrong encoders fail it;
  - the key layout of the Push-T hybrid policy (both names of each backbone and pool tensor, `nets.3` the Linear);
  - .ckpt round trips with and without a cfg, a policy state dict with one name per tensor; bad keys listed, the two
    names disagreeing, the U-Net's width; None with the reason for what is not implemented;
  - dpk.load_policy on a hybrid .ckpt: raw observation -> actions, as feeding the encoder's output as conditioning;
  - robomimic's image tasks: two cameras (one VisualCore each) and three low-dim keys, by name (predict(obs={...})).
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
L = importlib.import_module("dpk.families.policy._observation")
OF = importlib.import_module("dpk.families.policy._observation_formats")
U = importlib.import_module("dpk.families.unet1d._unet")
UF = importlib.import_module("dpk.families.unet1d._checkpoint_formats")
CheckpointError = importlib.import_module("dpk.families.unet1d._checkpoint").CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")

PUSHT = E.EncoderConfig.robomimic()  # 96 -> crop 76 -> a 3 x 3 map; 32 keypoints, 64 features
ODD_BN = E.EncoderConfig.robomimic(image_shape=(3, 90, 77), crop_shape=(80, 40), n_obs_steps=3, low_dim=5,
                                   norm="batch", keypoints=7, feature_dim=10, rgb_key="agentview_image",
                                   low_dim_key="robot0_eef_pos")
LIFT = E.EncoderConfig.robomimic(image_shape=(3, 84, 84), n_obs_steps=2, low_dim=9, n_cameras=2, separate=True,
                                 rgb_key="agentview_image", low_dim_key="robot0_eef_pos+robot0_eef_quat+"
                                 "robot0_gripper_qpos")  # robomimic's image tasks: two cameras, three low-dim keys
CAMERAS = ["agentview_image", "robot0_eye_in_hand_image"]
LOW = [("robot0_eef_pos", 3), ("robot0_eef_quat", 4), ("robot0_gripper_qpos", 2)]
CROP_TOP_LEFT = {PUSHT: (10, 10), ODD_BN: (5, 18), LIFT: (4, 4)}  # round(37 / 2) = 18: halves to even
UNET = U.UNetConfig(input_dim=2, global_cond_dim=132, diffusion_step_embed_dim=16, down_dims=(16, 32), kernel_size=3,
                    n_groups=8, cond_predict_scale=True)
UNET_MODEL = U.ConditionalUnet1D(UNET)
NET = "obs_encoder.obs_nets.image."
FIELDS = {"image": (torch.tensor([2.0]), torch.tensor([-1.0])),  # get_image_range_normalizer: [0, 1] -> [-1, 1]
          "agent_pos": (torch.tensor([0.004, 0.005]), torch.tensor([-1.1, -0.9])),
          "action": (torch.tensor([0.004, 0.005]), torch.tensor([-1.1, -0.9]))}


def encoder(cfg, seed: int = 2, temperature: float = 0.7) -> E.ObsEncoder:
    """Norm affines (and statistics) random, the softmax temperature away from 1."""
    enc = randomized(E.ObsEncoder(cfg, seed=seed))
    enc.rgb[0].pool.temperature.fill_(temperature)
    return enc


def inputs(cfg, b: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(b, *cfg.input_shape, generator=g) * 2 - 1,
            torch.rand(b, cfg.n_obs_steps, cfg.low_dim, generator=g) * 2 - 1)


def visual_core(w: dict[str, torch.Tensor], cfg, image: torch.Tensor) -> torch.Tensor:
    """robomimic's VisualCore and the ReLU after it, eval, from its state dict `w` (its `nets.*` keys), one image."""
    (top, left), (h, wd) = CROP_TOP_LEFT[cfg], cfg.crop_shape
    names = ("nets.0.nets.0", "nets.0.nets.1", *(f"nets.0.nets.{i}" for i in range(4, 8)))
    fmap = resnet18_oracle(w, image[:, top:top + h, left:left + wd][None], cfg.norm, names)
    kp = F.conv2d(fmap, w["nets.1.nets.weight"], w["nets.1.nets.bias"])[0]
    mh, mw = kp.shape[1:]
    pos_x, pos_y = np.meshgrid(np.linspace(-1.0, 1.0, mw), np.linspace(-1.0, 1.0, mh))
    pos_x, pos_y = (torch.from_numpy(p.reshape(1, mh * mw)).float() for p in (pos_x, pos_y))
    assert torch.equal(w["nets.1.pos_x"], pos_x) and torch.equal(w["nets.1.pos_y"], pos_y)
    attention = F.softmax(kp.reshape(cfg.keypoints, mh * mw) / w["nets.1.temperature"], dim=-1)
    xy = torch.cat([torch.sum(pos_x * attention, 1, keepdim=True), torch.sum(pos_y * attention, 1, keepdim=True)], 1)
    return F.relu(F.linear(xy.reshape(-1), w["nets.3.weight"], w["nets.3.bias"]))


def oracle(ws: list[dict[str, torch.Tensor]], cfg, image: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """DiffusionUnetHybridImagePolicy.predict_action's global_cond, one sample and frame at a time: per frame each
    camera's features (camera c by its own VisualCore ws[c]), then the low-dim vector (shape_meta's order)."""
    def cams(x: torch.Tensor) -> list[torch.Tensor]:
        return [x] if cfg.n_cameras == 1 else list(x)
    return torch.stack([torch.cat([torch.cat([*(visual_core(w, cfg, x) for w, x in zip(ws, cams(image[b, t]),
                                                                                       strict=True)), low[b, t]])
                                   for t in range(cfg.n_obs_steps)]) for b in range(image.shape[0])])


def robomimic_weights(enc: E.ObsEncoder, cameras: list[str] | None = None) -> list[dict[str, torch.Tensor]]:
    """Each camera's VisualCore state dict under robomimic's names (without `obs_encoder.obs_nets.<camera>.`)."""
    cameras = cameras or [enc.config.rgb_key]
    sd = OF.dp_hybrid_tensors(enc, cameras)
    return [{k[len(f"{OF.DP_HYBRID}{c}."):]: v for k, v in sd.items() if k.startswith(f"{OF.DP_HYBRID}{c}.")}
            for c in cameras]


@pytest.mark.parametrize("cfg", [PUSHT, ODD_BN, LIFT], ids=["pusht_gn", "odd_bn", "two_cameras"])
def test_encoder_matches_oracle(cfg):
    enc = encoder(cfg)
    image, low = inputs(cfg)
    cameras = CAMERAS if cfg.n_cameras > 1 else None
    with torch.no_grad():
        out = enc(image, low)
        width = cfg.n_cameras * cfg.feature_dim + cfg.low_dim
        assert out.shape == (2, cfg.cond_dim) and cfg.cond_dim == cfg.n_obs_steps * width
        assert len(enc.rgb) == cfg.n_cameras
        torch.testing.assert_close(out, oracle(robomimic_weights(enc, cameras), cfg, image, low), rtol=1e-5,
                                   atol=1e-5)


class StateFirst(E.ObsEncoder):
    def forward(self, image, low):
        b, n = image.shape[:2]
        feats = self.rgb[0](self.transform(image.reshape(b * n, *image.shape[2:])))
        return torch.cat([low.reshape(b * n, -1), feats], dim=-1).reshape(b, -1)


def wrong_encoder(kind: str) -> E.ObsEncoder:
    cfg = dataclasses.replace(PUSHT, crop_shape=(84, 84)) if kind == "lerobot_crop" else PUSHT
    enc = encoder(cfg) if kind != "state_first" else randomized(StateFirst(PUSHT, seed=2))
    pool = enc.rgb[0].pool
    if kind == "state_first":
        pool.temperature.fill_(0.7)
    if kind == "temperature_ignored":
        pool.temperature.fill_(1.0)
    if kind == "grid_yx":
        pool.pos_x, pool.pos_y = pool.pos_y.clone(), pool.pos_x.clone()
    if kind == "no_relu":
        enc.rgb[0].relu = torch.nn.Identity()
    return enc


@pytest.mark.parametrize("kind", ["state_first", "lerobot_crop", "temperature_ignored", "grid_yx", "no_relu"])
def test_wrong_encoders_are_caught(kind):
    image, low = inputs(PUSHT)
    want = oracle(robomimic_weights(encoder(PUSHT)), PUSHT, image, low)
    with torch.no_grad():
        got = wrong_encoder(kind)(image, low)
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_pusht_key_layout():
    """Upstream's names: VisualCore's backbone and pool under `nets` and by name, the Linear at nets.3."""
    sd = OF.dp_hybrid_tensors(E.ObsEncoder(PUSHT))
    for key, shape in [("nets.0.nets.0.weight", (64, 3, 7, 7)), ("backbone.nets.0.weight", (64, 3, 7, 7)),
                       ("nets.0.nets.4.0.conv1.weight", (64, 64, 3, 3)), ("backbone.nets.7.1.bn2.bias", (512,)),
                       ("nets.0.nets.6.0.downsample.1.weight", (256,)), ("nets.1.nets.weight", (32, 512, 1, 1)),
                       ("pool.nets.bias", (32,)), ("nets.1.temperature", (1,)), ("pool.pos_x", (1, 9)),
                       ("nets.1.pos_y", (1, 9)), ("nets.3.weight", (64, 64)), ("nets.3.bias", (64,))]:
        assert tuple(sd[NET + key].shape) == shape, key
    nets = [k for k in sd if k.startswith(NET + "nets.")]
    assert len(sd) == 2 * len(nets) - 2 and not any(k.startswith(NET + "nets.2") for k in sd)  # Flatten: no tensors
    assert not any(".running_mean" in k for k in sd)


def write_ckpt(tmp, cfg: dict | None, enc: E.ObsEncoder | None = None, edit=None, unet=UNET_MODEL):
    enc = enc or encoder(PUSHT)
    parts = OF.dp_hybrid_tensors(enc) | OF.dp_normalizer_tensors(FIELDS)
    (edit or (lambda sd: None))(parts)
    return UF.save_diffusion_policy_ckpt(unet, tmp / "hybrid.ckpt", ema_model=unet, cfg=cfg, others=parts,
                                         ema_others=parts), enc


def same_outputs(loaded: E.ObsEncoder, saved: E.ObsEncoder) -> None:
    image, low = inputs(saved.config, b=1)
    with torch.no_grad():
        assert torch.equal(loaded(image, low), saved(image, low))


@pytest.mark.parametrize("kind", ["cfg", "omegaconf_cfg", "no_cfg"])
def test_hybrid_ckpt_round_trip(kind, tmp_path):
    cfg = None if kind == "no_cfg" else OF.dp_hybrid_cfg(UNET, PUSHT)
    if kind == "omegaconf_cfg":
        from omegaconf import OmegaConf
        cfg = OmegaConf.create(cfg)
    path, enc = write_ckpt(tmp_path, cfg)
    side = L.load_observation_side(path)
    assert (side.source, side.weights, side.encoder_reason, side.normalizer_reason) == (
        "diffusion_policy", "ema_model", "", "")
    assert side.encoder.config == PUSHT and side.encoder.config.name == "robomimic_resnet18_gn"
    assert side.normalizer.keys == ("image", "agent_pos", "action")
    same_outputs(side.encoder, enc)
    assert torch.equal(side.encoder.rgb[0].pool.temperature, torch.tensor([0.7]))
    if kind == "no_cfg":
        assert any("n_obs_steps 2 from the U-Net's global_cond_dim 132 = n * 66" in n for n in side.notes)
        assert any("image_shape (3, 96, 96), the order (image, agent_pos), crop_shape (76, 76)" in n
                   for n in side.notes)
    else:
        assert not any("eval_fixed_crop" in n for n in side.notes)


def test_settings_from_cfg_and_keys(tmp_path):
    unet = U.ConditionalUnet1D(dataclasses.replace(UNET, global_cond_dim=ODD_BN.cond_dim))
    enc = encoder(ODD_BN, temperature=1.3)
    fields = {"agentview_image": FIELDS["image"], "robot0_eef_pos": (torch.ones(5), torch.zeros(5)),
              "action": FIELDS["action"]}
    parts = OF.dp_hybrid_tensors(enc) | OF.dp_normalizer_tensors(fields)
    cfg = OF.dp_hybrid_cfg(UNET, ODD_BN, eval_fixed_crop=False)
    path = UF.save_diffusion_policy_ckpt(unet, tmp_path / "odd.ckpt", cfg=cfg, others=parts)
    side = L.load_observation_side(path)
    assert side.encoder.config == ODD_BN and side.encoder.config.name == "robomimic_resnet18_bn"
    same_outputs(side.encoder, enc)
    assert any("crops at random at evaluation" in n for n in side.notes)
    # without a cfg the image and crop are assumed Push-T's, which this map (3 x 2 positions) does not fit
    sd = {"model." + k: v for k, v in unet.state_dict().items()} | parts
    with pytest.raises(CheckpointError, match=r"assumed, not in the checkpoint: image_shape \(3, 96, 96\).*\n.*"
                                              r"misshaped \(2\): .*pos_x \(expected \(1, 9\), found \(1, 6\)\)"):
        L.load_observation_side(UF.save_state_dict(sd, tmp_path / "odd.safetensors"))


def test_policy_state_dict_with_one_name_per_tensor(tmp_path):
    """A policy state dict saved with one name per tensor (only nets.*), BatchNorm told by its keys."""
    enc = encoder(dataclasses.replace(PUSHT, norm="batch"))
    sd = {"model." + k: v for k, v in UNET_MODEL.state_dict().items()} | OF.dp_normalizer_tensors(FIELDS)
    sd |= {k: v for k, v in OF.dp_hybrid_tensors(enc).items() if not k.startswith((NET + "backbone.", NET + "pool."))}
    side = L.load_observation_side(UF.save_state_dict(sd, tmp_path / "policy.safetensors"))
    assert side.encoder.config.norm == "batch"
    assert any("obs_encoder_group_norm False: from the keys" in n for n in side.notes)
    same_outputs(side.encoder, enc)


def test_bad_encoder_keys_are_listed(tmp_path):
    def edit(sd):
        sd.pop(NET + "nets.0.nets.6.1.bn2.bias")
        sd.pop(NET + "backbone.nets.6.1.bn2.bias")
        sd[NET + "nets.0.nets.8.weight"] = torch.zeros(1000, 512)
        sd[NET + "nets.0.nets.0.weight"] = sd[NET + "backbone.nets.0.weight"] = torch.zeros(64, 3, 5, 5)
    with pytest.raises(CheckpointError) as err:
        L.load_observation_side(write_ckpt(tmp_path, OF.dp_hybrid_cfg(UNET, PUSHT), edit=edit)[0])
    msg = str(err.value)
    assert f"missing (1): {NET}nets.0.nets.6.1.bn2.bias" in msg and f"unexpected (1): {NET}nets.0.nets.8.weight" in msg
    assert f"misshaped (1): {NET}nets.0.nets.0.weight (expected (64, 3, 7, 7), found (64, 3, 5, 5))" in msg


def test_two_names_must_agree(tmp_path):
    def edit(sd):
        sd[NET + "pool.nets.bias"] = sd[NET + "pool.nets.bias"] + 1
    with pytest.raises(CheckpointError, match=r"under two names.*pool.nets.bias != .*nets.1.nets.bias"):
        L.load_observation_side(write_ckpt(tmp_path, OF.dp_hybrid_cfg(UNET, PUSHT), edit=edit)[0])


def test_unet_width_is_checked(tmp_path):
    cfg = OF.dp_hybrid_cfg(UNET, PUSHT)
    cfg["n_obs_steps"] = 3
    with pytest.raises(CheckpointError, match=r"3 x \(64 \+ 2\) = 198 features but the U-Net's global_cond_dim is 132"):
        L.load_observation_side(write_ckpt(tmp_path, cfg)[0])


def _hybrid_cfg(**policy) -> dict:
    cfg = OF.dp_hybrid_cfg(UNET, PUSHT)
    cfg["policy"].update(policy)
    return cfg


@pytest.mark.parametrize(("cfg", "edit", "reason"), [
    (None, lambda sd: sd.update({k.replace(".image.", ".wrist."): v for k, v in sd.items() if ".image." in k}),
     "no shape_meta to order the cameras ['image', 'wrist']"),
    (_hybrid_cfg(shape_meta={"obs": {"agent_pos": {"shape": [2]}, "image": {"shape": [3, 96, 96], "type": "rgb"}}}),
     None, "rgb keys of one shape, then low-dim keys are implemented"),
    (_hybrid_cfg(obs_as_global_cond=False), None, "obs_as_global_cond False"),
    (_hybrid_cfg(_target_="my.Policy"), None, "policy my.Policy"),
])
def test_unsupported_give_none_and_why(cfg, edit, reason, tmp_path):
    side = L.load_observation_side(write_ckpt(tmp_path, cfg, edit=edit)[0])
    assert side.encoder is None and reason in side.encoder_reason, side.encoder_reason


def test_load_policy_observation_in_actions_out(tmp_path):
    """load_policy on a hybrid .ckpt: raw observation -> the LinearNormalizer -> robomimic's encoder -> chunk ->
    actions in the environment's units, as feeding the encoder's output as conditioning."""
    cfg = _hybrid_cfg(num_inference_steps=4)
    cfg["policy"]["noise_scheduler"] = {"_target_": "diffusers.schedulers.scheduling_ddim.DDIMScheduler",
                                        "num_train_timesteps": 100, "beta_schedule": "squaredcos_cap_v2",
                                        "clip_sample": True, "prediction_type": "epsilon"}
    cfg |= {"horizon": 8, "n_action_steps": 4}
    path, enc = write_ckpt(tmp_path, cfg, unet=U.build(UNET, 3))
    by_obs = dpk.load_policy(path, device="cpu", verify=False, pick="order")
    by_cond = dpk.load_policy(path, device="cpu", verify=False, observation=False, pick="order")
    assert by_obs.chunk.encoder.config.name == "robomimic_resnet18_gn" and by_cond.chunk.encoder is None
    g = torch.Generator().manual_seed(1)
    image, pos = torch.rand(2, *PUSHT.input_shape, generator=g), torch.rand(2, 2, 2, generator=g) * 500
    got = by_obs.predict(image=image, agent_pos=pos, seed=9)
    (ps, po), (ims, imo) = FIELDS["agent_pos"], FIELDS["image"]
    with torch.no_grad():
        cond = enc(image * ims + imo, pos * ps + po)
    want = by_cond.predict(cond, seed=9)
    assert float((got["action_pred"] - want["action_pred"]).abs().max()) < 1e-3 * float(want["action_pred"].abs().max())
    assert float(want["action_pred"].abs().max()) > 10 and got["action"].shape == (2, 4, 2)  # environment units


def lift_ckpt(tmp, edit=None) -> tuple:
    """A hybrid policy of robomimic's image tasks: two cameras, three low-dim keys, shape_meta in that order."""
    enc = encoder(LIFT)
    unet = U.build(dataclasses.replace(UNET, global_cond_dim=LIFT.cond_dim), 3)
    fields = {c: FIELDS["image"] for c in CAMERAS} | {"action": FIELDS["action"]}
    fields |= {k: (torch.linspace(0.5, 1.5, d), torch.linspace(-0.2, 0.2, d)) for k, d in LOW}
    cfg = OF.dp_hybrid_cfg(UNET, LIFT, CAMERAS, LOW, num_inference_steps=4)
    cfg |= {"horizon": 8, "n_action_steps": 4}
    cfg["policy"]["noise_scheduler"] = {"_target_": "diffusers.schedulers.scheduling_ddim.DDIMScheduler",
                                        "num_train_timesteps": 100, "beta_schedule": "squaredcos_cap_v2",
                                        "clip_sample": True, "prediction_type": "epsilon"}
    parts = OF.dp_hybrid_tensors(enc, CAMERAS) | OF.dp_normalizer_tensors(fields)
    (edit or (lambda sd: None))(parts)
    return UF.save_diffusion_policy_ckpt(unet, tmp / "lift.ckpt", cfg=cfg, others=parts), enc, fields


def test_two_cameras_and_three_low_dim_keys(tmp_path):
    path, enc, fields = lift_ckpt(tmp_path)
    side = L.load_observation_side(path)
    assert side.encoder.config == LIFT and side.encoder_reason == ""
    same_outputs(side.encoder, enc)
    assert side.normalizer.keys == (*CAMERAS, "robot0_eef_pos+robot0_eef_quat+robot0_gripper_qpos", "action")
    assert (side.obs_keys.cameras, side.obs_keys.low_dim) == (tuple(CAMERAS), tuple(LOW))
    policy = dpk.load_policy(path, device="cpu", verify=False, pick="order")
    by_cond = dpk.load_policy(path, device="cpu", verify=False, observation=False, pick="order")
    g = torch.Generator().manual_seed(3)
    obs = {c: torch.rand(2, 2, 3, 84, 84, generator=g) for c in CAMERAS}
    obs |= {k: torch.rand(2, 2, d, generator=g) * 3 for k, d in LOW}
    got = policy.predict(obs=obs, seed=5)
    with torch.no_grad():  # each key normalised by its own field: upstream's LinearNormalizer on the obs dict
        n = {k: v * fields[k][0] + fields[k][1] if k not in CAMERAS else v * 2 - 1 for k, v in obs.items()}
        cond = enc(torch.stack([n[c] for c in CAMERAS], dim=2), torch.cat([n[k] for k, _ in LOW], dim=-1))
    want = by_cond.predict(cond, seed=5)
    assert float((got["action_pred"] - want["action_pred"]).abs().max()) < 1e-4 * float(want["action_pred"].abs().max())
    with pytest.raises(ValueError, match=r"missing \['robot0_gripper_qpos'\], unexpected \['gripper'\]"):
        policy.predict(obs={**{k: v for k, v in obs.items() if k != "robot0_gripper_qpos"}, "gripper": obs[LOW[2][0]]})
    with pytest.raises(ValueError, match=r"obs\['robot0_eef_quat'\] must be \(B, n_obs, 4\), got \(2, 2, 3\)"):
        policy.predict(obs={**obs, "robot0_eef_quat": obs["robot0_eef_pos"]})


def test_shape_meta_must_name_the_checkpoints_cameras(tmp_path):
    def edit(sd):
        for k in [k for k in sd if ".robot0_eye_in_hand_image." in k]:
            sd[k.replace(".robot0_eye_in_hand_image.", ".wrist.")] = sd.pop(k)
    want = r"rgb keys \['agentview_image', 'robot0_eye_in_hand_image'\] but obs_encoder.obs_nets holds \[.*'wrist'\]"
    with pytest.raises(CheckpointError, match=want):
        L.load_observation_side(lift_ckpt(tmp_path, edit)[0])
