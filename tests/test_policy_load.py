"""dpk.load_policy on CPU: sampling settings read from each checkpoint format, the variant picked and checked, seeded
calls equal to the upstream loop, executed steps, and clear errors."""
from __future__ import annotations

import dataclasses
import importlib
import json

import pytest
import torch

import dpk
from dpk import registry

from ._helpers import ROOT

registry.load([ROOT / "kernels"], strict=True)
FMT = importlib.import_module("dpk.families.unet1d._checkpoint_formats")
UNET = importlib.import_module("dpk.families.unet1d._unet")
SETTINGS = importlib.import_module("dpk.families.policy._settings")
ENC = importlib.import_module("dpk.families.policy._encoder")
OF = importlib.import_module("dpk.families.policy._observation_formats")

CONFIG = UNET.UNetConfig(input_dim=3, global_cond_dim=6, diffusion_step_embed_dim=8, down_dims=(16, 24),
                         kernel_size=3, n_groups=4, cond_predict_scale=True)
SCHEDULER = {"_target_": "diffusers.schedulers.scheduling_ddim.DDIMScheduler", "num_train_timesteps": 100,
             "beta_schedule": "squaredcos_cap_v2", "clip_sample": True, "prediction_type": "epsilon"}


def dp_ckpt(tmp_path, scheduler=None, **top):
    cfg = FMT.diffusion_policy_cfg(CONFIG)
    cfg["policy"]["noise_scheduler"] = dict(scheduler or SCHEDULER)
    cfg["policy"]["num_inference_steps"] = 8
    cfg |= {"horizon": 8, "n_obs_steps": 2, "n_action_steps": 4} | top
    return FMT.save_diffusion_policy_ckpt(UNET.build(CONFIG, 3), tmp_path / "policy.ckpt", cfg=cfg,
                                          extra_prefixes=False)


def test_settings_of_each_format(tmp_path):
    got = SETTINGS.checkpoint_settings(dp_ckpt(tmp_path))
    assert got["scheduler"] == "ddim" and got["num_inference_steps"] == 8 and got["horizon"] == 8
    assert got["n_obs_steps"] == 2 and got["n_action_steps"] == 4 and got["beta_schedule"] == "squaredcos_cap_v2"
    folder = FMT.save_lerobot_folder(UNET.build(CONFIG, 3), tmp_path / "lerobot", CONFIG,
                                     config_extra={"noise_scheduler_type": "DDIM", "num_inference_steps": 10,
                                                   "beta_schedule": "linear"})
    got = SETTINGS.checkpoint_settings(folder)
    assert got["scheduler"] == "ddim" and got["num_inference_steps"] == 10 and got["beta_schedule"] == "linear"
    assert got["horizon"] == 16 and got["n_action_steps"] == 8
    sd = FMT.save_state_dict(UNET.build(CONFIG, 3), tmp_path / "unet.pt")
    assert SETTINGS.checkpoint_settings(sd) == {}


def test_sampling_settings_keep_the_training_schedule():
    stored = {"scheduler": "ddpm", "num_train_timesteps": 1000, "beta_schedule": "linear"}
    assert SETTINGS.sampling_settings(stored, None)["num_inference_steps"] == 1000
    ddim = SETTINGS.sampling_settings(stored, "ddim16")
    assert (ddim["scheduler"], ddim["num_inference_steps"], ddim["num_train_timesteps"]) == ("ddim", 16, 1000)
    assert SETTINGS.sampling_settings({}, None)["scheduler"] == "ddpm"
    with pytest.raises(ValueError, match="unknown scheduler preset 'ddim10'"):
        SETTINGS.sampling_settings(stored, "ddim10")
    assert SETTINGS.executed_steps({"n_obs_steps": 2, "n_action_steps": 8}, 16) == slice(1, 9)
    assert SETTINGS.executed_steps({}, 16) == slice(0, 16)


def test_loaded_policy_is_the_upstream_loop(tmp_path):
    """A seeded call equals eager_diffusers (upstream's loop) with that seed; the executed steps are sliced."""
    policy = dpk.load_policy(dp_ckpt(tmp_path), batch=2, device="cpu")
    assert policy.variant == "eager_loop" and any("kernels_loop" in n for n in policy.notes)
    cond = torch.randn(2, CONFIG.global_cond_dim, generator=torch.Generator().manual_seed(0))
    out = policy.predict(cond, seed=11)
    assert out["action_pred"].shape == (2, 8, 3) and torch.equal(out["action"], out["action_pred"][:, 1:5])
    # load_policy loaded the family afresh: use its modules, not the ones imported above
    tv, noise_mod = (importlib.import_module(f"dpk.families.{m}") for m in ("policy.torch_variants", "denoise._noise"))
    chunk = dataclasses.replace(policy.chunk, noise=noise_mod.NoiseSpec(11, "cpu"))
    noise = torch.zeros(chunk.steps + 1, 2, 8, 3)  # eager_diffusers draws its own from the seed
    want = tv.eager_diffusers(cond, None, None, noise, chunk)
    assert float((out["action_pred"] - want).abs().max()) < 1e-5
    assert torch.equal(policy(cond, seed=11), out["action"])
    assert not torch.equal(policy(cond), policy(cond))  # unseeded calls draw fresh noise


def test_forced_variant_and_bad_input(tmp_path):
    ckpt = dp_ckpt(tmp_path)
    policy = dpk.load_policy(ckpt, variant="eager_diffusers", scheduler="ddpm100", device="cpu", verify=False)
    assert policy.variant == "eager_diffusers" and policy.chunk.steps == 100
    with pytest.raises(RuntimeError, match="graph_loop: needs a CUDA GPU"):
        dpk.load_policy(ckpt, variant="graph_loop", device="cpu")
    with pytest.raises(ValueError, match=r"global_cond must be \(1, 6\)"):
        policy(torch.zeros(1, 5))
    with pytest.raises(ValueError, match="not both"):
        dpk.load_policy(ckpt, config={"input_dim": 2, "global_cond_dim": 0})
    with pytest.raises(ValueError, match="prediction_type 'sample' is not supported"):
        dpk.load_policy(dp_ckpt(tmp_path, scheduler=SCHEDULER | {"prediction_type": "sample"}), device="cpu")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"type": "diffusion"}))
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        dpk.load_policy(tmp_path / "broken", device="cpu")


def test_observation_in_actions_out_in_environment_units(tmp_path):
    """With the checkpoint's encoder and normaliser: raw observation -> normalised -> encoder -> chunk ->
    unnormalised actions, the same as feeding the encoder's output as conditioning."""
    enc_cfg = ENC.EncoderConfig(image_shape=(3, 20, 20), crop_shape=(16, 16), n_obs_steps=1)
    unet_cfg = dataclasses.replace(CONFIG, global_cond_dim=enc_cfg.cond_dim)
    encoder = ENC.ObsEncoder(enc_cfg, seed=4)
    fields = {"image": (torch.tensor([2.0]), torch.tensor([-1.0])),
              "agent_pos": (torch.tensor([0.004, 0.005]), torch.tensor([-1.0, -0.9])),
              "action": (torch.tensor([0.004, 0.003]), torch.tensor([-1.1, -0.95]))}
    cfg = OF.dp_cfg(unet_cfg, enc_cfg)
    cfg["policy"]["noise_scheduler"] = dict(SCHEDULER)
    cfg["policy"]["num_inference_steps"] = 4
    ckpt = FMT.save_diffusion_policy_ckpt(UNET.build(unet_cfg, 2), tmp_path / "obs.ckpt", cfg=cfg,
                                          extra_prefixes=False,
                                          others=OF.dp_encoder_tensors(encoder) | OF.dp_normalizer_tensors(fields))
    by_obs = dpk.load_policy(ckpt, device="cpu", verify=False)
    by_cond = dpk.load_policy(ckpt, device="cpu", verify=False, observation=False)
    assert by_obs.chunk.encoder is not None and by_cond.chunk.encoder is None
    g = torch.Generator().manual_seed(1)
    image, pos = torch.rand(2, 1, 3, 20, 20, generator=g), torch.rand(2, 1, 2, generator=g) * 500
    got = by_obs.predict(image=image, agent_pos=pos, seed=9)["action_pred"]
    with torch.no_grad():
        cond = encoder(image * 2 - 1, pos * fields["agent_pos"][0] + fields["agent_pos"][1])
    want = by_cond.predict(cond, seed=9)["action_pred"]
    assert float((got - want).abs().max()) < 1e-3 * float(want.abs().max())
    assert float(want.abs().max()) > 10  # unnormalised: environment units (hundreds of pixels), not [-1, 1]
    with pytest.raises(ValueError, match="image= and agent_pos="):
        by_obs(cond)
    with pytest.raises(ValueError, match="no image encoder"):
        dpk.load_policy(dp_ckpt(tmp_path), device="cpu", observation=True)
