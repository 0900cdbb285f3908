"""policy, diffusion_policy's low-dim policies (DiffusionUnetLowdimPolicy, e.g. its Push-T keypoint checkpoints):

  - observation in: the normalised `obs` vector of each frame, frames in order, is the global conditioning
    (`nobs[:, :To].reshape(B, -1)`), actions unnormalised with the `action` field; the executed steps start at
    n_obs_steps - 1 with oa_step_convention (Push-T's), else at n_obs_steps (the class default);
  - settings from the cfg (its `${...}` interpolations and `${eval: ...}` strings as upstream writes them) or from
    the U-Net's width; bad observations, the width and what is not implemented named.
The same against upstream's own class: ci/dp_crosscheck.py.
"""
from __future__ import annotations

import importlib

import pytest
import torch

import dpk
from dpk import registry

from ._helpers import ROOT

registry.load([ROOT / "kernels"], strict=True)
L = importlib.import_module("dpk.families.policy._observation")
OF = importlib.import_module("dpk.families.policy._observation_formats")
SETTINGS = importlib.import_module("dpk.families.policy._settings")
U = importlib.import_module("dpk.families.unet1d._unet")
UF = importlib.import_module("dpk.families.unet1d._checkpoint_formats")
CheckpointError = importlib.import_module("dpk.families.unet1d._checkpoint").CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")

OBS_DIM = 20  # Push-T keypoints: 9 keypoints x 2 + the agent position
UNET = U.UNetConfig(input_dim=2, global_cond_dim=2 * OBS_DIM, diffusion_step_embed_dim=8, down_dims=(16, 24),
                    kernel_size=3, n_groups=4, cond_predict_scale=True)
FIELDS = {"obs": (torch.linspace(0.002, 0.004, OBS_DIM), torch.linspace(-1.2, -0.8, OBS_DIM)),
          "action": (torch.tensor([0.004, 0.005]), torch.tensor([-1.1, -0.9]))}
DDIM4 = {"_target_": "diffusers.schedulers.scheduling_ddim.DDIMScheduler", "num_train_timesteps": 100,
         "beta_schedule": "squaredcos_cap_v2", "clip_sample": True, "prediction_type": "epsilon"}


def lowdim_ckpt(tmp, cfg: dict | None = "default", unet: U.UNetConfig = UNET, **policy):
    if cfg == "default":
        cfg = OF.dp_lowdim_cfg(unet, OBS_DIM, noise_scheduler=DDIM4, num_inference_steps=4, **policy)
    parts = OF.dp_normalizer_tensors(FIELDS) | {"mask_generator._dummy_variable": torch.zeros(0)}
    return UF.save_diffusion_policy_ckpt(U.build(unet, 3), tmp / "lowdim.ckpt", cfg=cfg, others=parts)


def raw_obs(b: int = 2, n_obs: int = 2) -> torch.Tensor:
    return torch.rand(b, n_obs, OBS_DIM, generator=torch.Generator().manual_seed(1)) * 512


@pytest.mark.parametrize("oa_step_convention", [True, False])
def test_obs_in_actions_out(oa_step_convention, tmp_path):
    path = lowdim_ckpt(tmp_path, oa_step_convention=oa_step_convention)
    side = L.load_observation_side(path)
    assert side.encoder is None and side.state.cond_dim == 40 and side.normalizer.keys == ("obs", "action")
    assert any("low-dim policy: global_cond = 2 frames of the normalised obs (20)" in n for n in side.notes)
    by_obs = dpk.load_policy(path, device="cpu", verify=False, pick="order")
    by_cond = dpk.load_policy(path, device="cpu", verify=False, observation=False, pick="order")
    assert by_obs.state is not None and by_cond.state is None
    obs = raw_obs()
    got = by_obs.predict(obs=obs, seed=9)
    scale, offset = FIELDS["obs"]
    want = by_cond.predict((obs * scale + offset).reshape(2, -1), seed=9)
    assert torch.equal(got["action_pred"], want["action_pred"])
    start = 1 if oa_step_convention else 2  # n_obs_steps - 1, or n_obs_steps without the convention
    assert torch.equal(got["action"], got["action_pred"][:, start:start + 8])
    assert float(got["action_pred"].abs().max()) > 10  # the environment's units
    assert torch.equal(by_obs.predict(agent_pos=obs, seed=9)["action_pred"], got["action_pred"])


def test_settings_without_a_cfg(tmp_path):
    side = L.load_observation_side(lowdim_ckpt(tmp_path, cfg=None))
    assert side.state.n_obs_steps == 2
    assert any("n_obs_steps 2 from the U-Net's global_cond_dim 40 = n * 20" in n for n in side.notes)
    assert SETTINGS.executed_steps(SETTINGS.checkpoint_settings(tmp_path / "lowdim.ckpt"), 16) == slice(0, 16)


def test_bad_observations_are_named(tmp_path):
    policy = dpk.load_policy(lowdim_ckpt(tmp_path), device="cpu", verify=False, pick="order")
    with pytest.raises(ValueError, match=r"obs must be \(B, 2, 20\), got \(2, 2, 19\)"):
        policy.predict(obs=torch.zeros(2, 2, 19))
    with pytest.raises(ValueError, match="give obs= or agent_pos="):
        policy.predict(obs=raw_obs(), agent_pos=raw_obs())


def test_width_is_checked(tmp_path):
    cfg = OF.dp_lowdim_cfg(UNET, OBS_DIM, n_obs_steps=3)
    with pytest.raises(CheckpointError, match=r"3 x \(20\) = 60 features but the U-Net's global_cond_dim is 40"):
        L.load_observation_side(lowdim_ckpt(tmp_path, cfg=cfg))


@pytest.mark.parametrize(("policy", "reason"), [
    ({"obs_as_local_cond": True, "obs_as_global_cond": False}, "obs_as_local_cond"),
    ({"pred_action_steps_only": True}, "pred_action_steps_only"),
    ({"obs_as_global_cond": False}, "obs_as_global_cond False"),
])
def test_not_implemented_is_named(policy, reason, tmp_path):
    side = L.load_observation_side(lowdim_ckpt(tmp_path, **policy))
    assert side.state is None and reason in side.encoder_reason and "not implemented" in side.encoder_reason
    with pytest.raises(ValueError, match=reason):
        dpk.load_policy(tmp_path / "lowdim.ckpt", device="cpu", verify=False, pick="order", observation=True)
