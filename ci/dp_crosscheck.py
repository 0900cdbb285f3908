"""Cross-check dpk against Diffusion Policy's own policy classes, end to end: DiffusionUnetHybridImagePolicy
(robomimic's image encoder: Push-T's one camera, robomimic's tasks' two cameras and three low-dim keys),
DiffusionUnetImagePolicy with the real-robot Push-T config (MultiImageObsEncoder: two 240 x 320 cameras, one ResNet
each, resize to their own size, crop 216 x 288, ImageNet normalisation) and DiffusionUnetLowdimPolicy (the obs
vector as conditioning).

    PYTHONPATH=$PWD python3 ci/dp_crosscheck.py DIFFUSION_POLICY_ROOT ROBOMIMIC_ROOT

DIFFUSION_POLICY_ROOT holds upstream's `diffusion_policy/` sources (real-stanford/diffusion_policy), ROBOMIMIC_ROOT
robomimic 0.2.0's `robomimic/` (the version upstream pins); neither is installed. Needs torch, torchvision, numpy,
einops, six, omegaconf and diffusers (zarr, which upstream's normalizer imports for fitting arrays, is stubbed).
Builds upstream's policy class itself (its robomimic config, ObservationEncoder, GroupNorm replacement and fixed
eval crop; the Push-T image shapes with a small U-Net), randomises its norms, softmax temperature and normaliser,
saves a workspace checkpoint as upstream's workspace does (cfg, state_dicts.model / ema_model), loads it with dpk
and compares, on the CPU: the global conditioning (dpk's normaliser and encoder against upstream's, bitwise) and
predict_action's actions under the same seed (dpk.load_policy against upstream's sampling loop). The low-dim
policy likewise (Push-T keypoints' 20-d obs, with and without oa_step_convention): its actions and executed steps.
Exit 1 on any difference beyond fp32 rounding of the actions.
"""
from __future__ import annotations

import importlib
import sys
import tempfile
import types
from pathlib import Path

import torch
from torch import nn

from dpk import registry

registry.load([Path(__file__).resolve().parent.parent / "kernels"], strict=True)
L = importlib.import_module("dpk.families.policy._observation")
OF = importlib.import_module("dpk.families.policy._observation_formats")
UF = importlib.import_module("dpk.families.unet1d._checkpoint_formats")
PUSHT = {"obs": {"image": {"shape": [3, 96, 96], "type": "rgb"}, "agent_pos": {"shape": [2], "type": "low_dim"}},
         "action": {"shape": [2]}}
LIFT = {"obs": {"agentview_image": {"shape": [3, 84, 84], "type": "rgb"},  # robomimic's image tasks (lift_image.yaml)
                "robot0_eye_in_hand_image": {"shape": [3, 84, 84], "type": "rgb"},
                "robot0_eef_pos": {"shape": [3]}, "robot0_eef_quat": {"shape": [4]},
                "robot0_gripper_qpos": {"shape": [2]}},
        "action": {"shape": [7]}}
REAL = {"obs": {"camera_1": {"shape": [3, 240, 320], "type": "rgb"},  # real_pusht_image.yaml
                "camera_3": {"shape": [3, 240, 320], "type": "rgb"}, "robot_eef_pose": {"shape": [2]}},
        "action": {"shape": [2]}}
SCHEDULER = {"_target_": "diffusers.schedulers.scheduling_ddpm.DDPMScheduler", "num_train_timesteps": 100,
             "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "squaredcos_cap_v2",
             "variance_type": "fixed_small", "clip_sample": True, "prediction_type": "epsilon"}


def upstream_policy(group_norm: bool, steps: int, shape_meta: dict) -> nn.Module:
    from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
    from diffusion_policy.policy.diffusion_unet_hybrid_image_policy import DiffusionUnetHybridImagePolicy
    kw = {k: v for k, v in SCHEDULER.items() if k != "_target_"}
    return DiffusionUnetHybridImagePolicy(
        shape_meta=shape_meta, noise_scheduler=DDPMScheduler(**kw), horizon=16, n_action_steps=8, n_obs_steps=2,
        num_inference_steps=steps, obs_as_global_cond=True, crop_shape=(76, 76), diffusion_step_embed_dim=32,
        down_dims=(32, 64, 128), kernel_size=5, n_groups=8, cond_predict_scale=True,
        obs_encoder_group_norm=group_norm, eval_fixed_crop=True)


def randomize(policy: nn.Module, shape_meta: dict, g: torch.Generator) -> None:
    """Norm affines and BatchNorm statistics away from their init and the softmax temperature away from 1, so that
    a misplaced tensor shows; a normaliser fitted to random data in upstream's 'limits' mode."""
    from diffusion_policy.model.common.normalizer import LinearNormalizer, SingleFieldLinearNormalizer
    from lerobot_crosscheck import randomize as randomize_norms  # the sibling script's: ci/ is sys.path[0]
    randomize_norms(policy, g)
    with torch.no_grad():
        for m in policy.modules():
            if hasattr(m, "temperature") and isinstance(m.temperature, torch.Tensor):
                m.temperature.fill_(0.8)
    data = {k: torch.rand(64, v["shape"][0], generator=g) * 512 for k, v in shape_meta["obs"].items()
            if v.get("type", "low_dim") == "low_dim"}
    normalizer = LinearNormalizer()
    normalizer.fit(data | {"action": torch.rand(64, shape_meta["action"]["shape"][0], generator=g) * 512},
                   mode="limits")
    for key in (k for k, v in shape_meta["obs"].items() if v.get("type") == "rgb"):
        normalizer[key] = SingleFieldLinearNormalizer.create_manual(  # upstream's get_image_range_normalizer
            scale=torch.tensor([2.0]), offset=torch.tensor([-1.0]),
            input_stats_dict={"min": torch.tensor([0.0]), "max": torch.tensor([1.0]), "mean": torch.tensor([0.5]),
                              "std": torch.tensor([0.2886751])})
    policy.set_normalizer(normalizer)


def save_workspace(policy: nn.Module, cfg: dict, path: Path) -> Path:
    """What upstream's workspace save_checkpoint writes: cfg (OmegaConf) and every module's state dict."""
    from omegaconf import OmegaConf
    sd = policy.state_dict()
    torch.save({"cfg": OmegaConf.create(cfg), "state_dicts": {"model": sd, "ema_model": sd}, "pickles": {}}, path)
    return path


def workspace_ckpt(policy: nn.Module, group_norm: bool, steps: int, shape_meta: dict, path: Path) -> Path:
    """The hybrid policy's workspace checkpoint, its cfg as train_diffusion_unet_hybrid_workspace.yaml's."""
    cfg = {"name": "train_diffusion_unet_hybrid", "horizon": 16, "n_obs_steps": 2, "n_action_steps": 8,
           "shape_meta": shape_meta, "task": {"name": "image", "shape_meta": shape_meta},
           "policy": {"_target_": OF.HYBRID_POLICY, "shape_meta": "${shape_meta}", "noise_scheduler": SCHEDULER,
                      "horizon": "${horizon}", "n_action_steps": "${n_action_steps}", "n_obs_steps": "${n_obs_steps}",
                      "num_inference_steps": steps, "obs_as_global_cond": True, "crop_shape": [76, 76],
                      "diffusion_step_embed_dim": 32, "down_dims": [32, 64, 128], "kernel_size": 5, "n_groups": 8,
                      "cond_predict_scale": True, "obs_encoder_group_norm": group_norm, "eval_fixed_crop": True}}
    return save_workspace(policy, cfg, path)


def same_actions(loaded, policy: nn.Module, obs: dict, kw: dict, what: str) -> bool:
    """dpk's predict(**kw, seed=7) against upstream's predict_action(obs) after torch.manual_seed(7) (upstream's
    loop draws from the global generator): action_pred within 1e-5 of its scale, the executed steps the same."""
    torch.manual_seed(7)
    with torch.no_grad():
        upstream = policy.predict_action(obs)
    ours = loaded.predict(**kw, seed=7)
    err = float((ours["action_pred"] - upstream["action_pred"]).abs().max())
    scale = float(upstream["action_pred"].abs().max())
    steps = ours["action"].shape == upstream["action"].shape and float(
        (ours["action"] - upstream["action"]).abs().max()) <= 1e-5 * scale
    close = err <= 1e-5 * scale and steps
    print(f"  predict_action, {what}, seed 7: action_pred {tuple(ours['action_pred'].shape)}, max |difference| "
          f"{err:.3g} of max |action| {scale:.4g}; executed steps {tuple(ours['action'].shape)} equal: {steps}; "
          f"within 1e-5: {close}")
    return close


def check(group_norm: bool, shape_meta: dict, tmp: Path, g: torch.Generator) -> bool:
    """Upstream's hybrid image policy for `shape_meta` (Push-T's one camera, or robomimic's two cameras and three
    low-dim keys), its workspace checkpoint; dpk takes the observations by name (predict(obs={...}))."""
    import dpk
    torch.manual_seed(0)
    policy = upstream_policy(group_norm, 100, shape_meta)
    randomize(policy, shape_meta, g)
    policy.eval()
    name = f"hybrid_{group_norm}_{len(shape_meta['obs'])}.ckpt"
    path = workspace_ckpt(policy, group_norm, 100, shape_meta, tmp / name)
    side = L.load_observation_side(path)
    obs = {k: torch.rand(3, 2, *v["shape"], generator=g) * (1 if v.get("type") == "rgb" else 512)
           for k, v in shape_meta["obs"].items()}
    cams = [k for k, v in shape_meta["obs"].items() if v.get("type") == "rgb"]
    image = obs[cams[0]] if len(cams) == 1 else torch.stack([obs[c] for c in cams], dim=2)
    low = torch.cat([v for k, v in obs.items() if k not in cams], dim=-1)
    with torch.no_grad():
        nobs = policy.normalizer.normalize(obs)
        want = policy.obs_encoder({k: v[:, :2].reshape(-1, *v.shape[2:]) for k, v in nobs.items()}).reshape(3, -1)
        got = side.encoder(*side.normalizer.normalize_obs(image, low))
    same = torch.equal(got, want)
    n_keys = sum(k.startswith("obs_encoder.") for k in policy.state_dict())
    print(f"{'GroupNorm' if group_norm else 'BatchNorm'} encoder, {len(cams)} camera(s), observations "
          f"{list(shape_meta['obs'])}: {n_keys} obs_encoder tensors loaded strictly ({side.encoder.config.name}, "
          f"crop {side.encoder.config.crop_shape}); global_cond {tuple(got.shape)}; bitwise equal to upstream's: "
          f"{same} (max |difference| {float((got - want).abs().max()):.3g})")
    loaded = dpk.load_policy(path, device="cpu", verify=False, variant="eager_diffusers")
    return same and same_actions(loaded, policy, obs, {"obs": obs}, "DDPM 100 steps")


def check_image(tmp: Path, g: torch.Generator) -> bool:
    """Upstream's image policy with train_diffusion_unet_real_image_workspace.yaml's encoder, its checkpoint."""
    from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
    from diffusion_policy.model.vision.model_getter import get_resnet
    from diffusion_policy.model.vision.multi_image_obs_encoder import MultiImageObsEncoder
    from diffusion_policy.policy.diffusion_unet_image_policy import DiffusionUnetImagePolicy

    import dpk
    torch.manual_seed(0)
    encoder_cfg = {"resize_shape": [240, 320], "crop_shape": [216, 288], "random_crop": True, "use_group_norm": True,
                   "share_rgb_model": False, "imagenet_norm": True}
    encoder = MultiImageObsEncoder(shape_meta=REAL, rgb_model=get_resnet("resnet18"), **encoder_cfg)
    unet = {"diffusion_step_embed_dim": 32, "down_dims": [32, 64, 128], "kernel_size": 5, "n_groups": 8,
            "cond_predict_scale": True}
    sched = {k: v for k, v in SCHEDULER.items() if k != "_target_"}
    policy = DiffusionUnetImagePolicy(shape_meta=REAL, noise_scheduler=DDPMScheduler(**sched), obs_encoder=encoder,
                                      horizon=16, n_action_steps=8, n_obs_steps=2, num_inference_steps=100, **unet)
    randomize(policy, REAL, g)
    policy.eval()
    cfg = {"name": "train_diffusion_unet_image", "horizon": 16, "n_obs_steps": 2, "n_action_steps": 8,
           "shape_meta": REAL, "task": {"name": "real_image", "shape_meta": REAL},
           "policy": {"_target_": OF.DP_IMAGE_POLICY, "shape_meta": "${shape_meta}", "noise_scheduler": SCHEDULER,
                      "obs_encoder": {"_target_": "MultiImageObsEncoder", "shape_meta": "${shape_meta}",
                                      "rgb_model": {"name": "resnet18", "weights": None}, **encoder_cfg},
                      "horizon": "${horizon}", "n_action_steps": "${n_action_steps}", "n_obs_steps": "${n_obs_steps}",
                      "num_inference_steps": 100, "obs_as_global_cond": True, **unet}}
    path = save_workspace(policy, cfg, tmp / "real_image.ckpt")
    side = L.load_observation_side(path)
    obs = {k: torch.rand(3, 2, *v["shape"], generator=g) * (1 if v.get("type") == "rgb" else 512)
           for k, v in REAL["obs"].items()}
    with torch.no_grad():
        nobs = policy.normalizer.normalize(obs)
        want = policy.obs_encoder({k: v[:, :2].reshape(-1, *v.shape[2:]) for k, v in nobs.items()}).reshape(3, -1)
        n = side.normalizer.normalize_obs(torch.stack([obs["camera_1"], obs["camera_3"]], dim=2), obs["robot_eef_pose"])
        got = side.encoder(*n)
    same = torch.equal(got, want)
    print(f"image policy, real-robot Push-T encoder ({list(REAL['obs'])}): {len(side.encoder.state_dict())} tensors "
          f"loaded strictly ({side.encoder.config.name}, {side.encoder.config.n_cameras} cameras, one ResNet each); "
          f"global_cond {tuple(got.shape)}; bitwise equal to upstream's: {same} "
          f"(max |difference| {float((got - want).abs().max()):.3g})")
    loaded = dpk.load_policy(path, device="cpu", verify=False, variant="eager_diffusers")
    return same and same_actions(loaded, policy, obs, {"obs": obs}, "DDPM 100 steps")


def check_lowdim(oa_step_convention: bool, tmp: Path, g: torch.Generator) -> bool:
    """Upstream's low-dim policy (Push-T keypoints: obs 20, global conditioning), its workspace checkpoint."""
    from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
    from diffusion_policy.model.common.normalizer import LinearNormalizer
    from diffusion_policy.model.diffusion.conditional_unet1d import ConditionalUnet1D
    from diffusion_policy.policy.diffusion_unet_lowdim_policy import DiffusionUnetLowdimPolicy

    import dpk
    torch.manual_seed(0)
    unet = dict(input_dim=2, global_cond_dim=40, diffusion_step_embed_dim=32, down_dims=[32, 64, 128], kernel_size=5,
                n_groups=8, cond_predict_scale=True)
    sched = {k: v for k, v in SCHEDULER.items() if k != "_target_"}
    policy = DiffusionUnetLowdimPolicy(
        model=ConditionalUnet1D(local_cond_dim=None, **unet), noise_scheduler=DDPMScheduler(**sched), horizon=16,
        obs_dim=20, action_dim=2, n_action_steps=8, n_obs_steps=2, num_inference_steps=100, obs_as_global_cond=True,
        oa_step_convention=oa_step_convention)
    normalizer = LinearNormalizer()
    normalizer.fit({"obs": torch.rand(64, 20, generator=g) * 512, "action": torch.rand(64, 2, generator=g) * 512},
                   mode="limits")
    policy.set_normalizer(normalizer)
    policy.eval()
    cfg = {"name": "train_diffusion_unet_lowdim", "horizon": 16, "n_obs_steps": 2, "n_action_steps": 8,
           "n_latency_steps": 0, "obs_dim": 20, "action_dim": 2, "obs_as_global_cond": True,
           "policy": {"_target_": OF.DP_LOWDIM_POLICY, "model": unet, "noise_scheduler": SCHEDULER,
                      "horizon": "${horizon}", "obs_dim": "${obs_dim}", "n_obs_steps": "${n_obs_steps}",
                      "num_inference_steps": 100, "obs_as_global_cond": "${obs_as_global_cond}",
                      "oa_step_convention": oa_step_convention}}
    path = save_workspace(policy, cfg, tmp / f"lowdim_{oa_step_convention}.ckpt")
    loaded = dpk.load_policy(path, device="cpu", verify=False, variant="eager_diffusers")
    print(f"low-dim policy, oa_step_convention {oa_step_convention}: conditioning {loaded.state}")
    obs = torch.rand(3, 2, 20, generator=g) * 512
    return same_actions(loaded, policy, {"obs": obs}, {"obs": obs}, "DDPM 100 steps")


def main() -> int:
    if len(sys.argv) != 3 or not all(Path(p).is_dir() for p in sys.argv[1:]):
        print(__doc__)
        return 2
    sys.path[:0] = sys.argv[1:]
    zarr = types.ModuleType("zarr")
    zarr.Array = type("Array", (), {})  # upstream's normalizer only tests isinstance(x, zarr.Array)
    sys.modules.setdefault("zarr", zarr)
    import robomimic
    import torchvision
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, robomimic {robomimic.__version__}")
    g = torch.Generator().manual_seed(1)
    with tempfile.TemporaryDirectory() as tmp:
        ok = [check(gn, PUSHT, Path(tmp), g) for gn in (True, False)] + [check(True, LIFT, Path(tmp), g)]
        ok += [check_image(Path(tmp), g)] + [check_lowdim(oa, Path(tmp), g) for oa in (True, False)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
