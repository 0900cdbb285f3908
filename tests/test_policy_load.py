"""dpk.load_policy on CPU: sampling settings read from each checkpoint format, the variant picked and checked, seeded
calls equal to the upstream loop, executed steps, and clear errors."""
from __future__ import annotations

import dataclasses
import importlib
import json

import pytest
import torch
import yaml

import dpk
from dpk import registry

from ._helpers import ROOT, gpu_test

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
    # raced at load: the two variants that run on a CPU, timed; the faster one checked and kept
    assert set(policy.load_latency_ms) == {"eager_loop", "eager_diffusers"}
    assert policy.variant == min(policy.load_latency_ms, key=policy.load_latency_ms.get)
    assert any("kernels_loop" in n for n in policy.notes) and any("latency at load" in n for n in policy.notes)
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


def test_bf16_policy_runs_the_bf16_net(tmp_path):
    """dtype="bfloat16": the U-Net's weights in bf16, float32 actions, verified against the bf16 net's oracle."""
    policy = dpk.load_policy(dp_ckpt(tmp_path), batch=2, device="cpu", dtype="bfloat16", pick="order")
    assert policy.chunk.net.dtype == torch.bfloat16 and policy.variant == "eager_loop"
    cond = torch.randn(2, CONFIG.global_cond_dim, generator=torch.Generator().manual_seed(0))
    out = policy.predict(cond, seed=5)["action_pred"]
    fp32 = dpk.load_policy(dp_ckpt(tmp_path), batch=2, device="cpu", pick="order").predict(cond, seed=5)["action_pred"]
    assert out.dtype == torch.float32 and 0 < float((out - fp32).abs().max()) < 0.5
    with pytest.raises(Exception, match="unknown dtype 'float8'"):
        dpk.load_policy(dp_ckpt(tmp_path), device="cpu", dtype="float8")


def test_forced_variant_and_bad_input(tmp_path):
    ckpt = dp_ckpt(tmp_path)
    policy = dpk.load_policy(ckpt, variant="eager_diffusers", scheduler="ddpm100", device="cpu", verify=False)
    assert policy.variant == "eager_diffusers" and policy.chunk.steps == 100
    cond = torch.randn(1, CONFIG.global_cond_dim)
    assert not torch.equal(policy(cond), policy(cond))  # it draws its own noise: a fresh seed per unseeded call
    assert torch.equal(policy(cond, seed=3), policy(cond, seed=3))
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
    by_obs = dpk.load_policy(ckpt, device="cpu", verify=False, pick="order")
    by_cond = dpk.load_policy(ckpt, device="cpu", verify=False, observation=False, pick="order")
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


def test_pick_follows_the_measured_latency_and_falls_back_on_parity(tmp_path, monkeypatch):
    """pick="measure" takes the fastest candidate as timed; one that fails parity gives way to the next fastest;
    pick="order" takes the first of PREFERENCE that runs, untimed."""
    reg = registry.load([ROOT / "kernels"], families=["policy"])
    runtime = importlib.import_module("dpk.families.policy._runtime")
    ckpt = str(dp_ckpt(tmp_path))
    kw = {"config": None, "weights_seed": 0, "scheduler": None, "batch": 1, "horizon": None,
          "device": torch.device("cpu"), "variant": None, "observation": None}
    raced = []

    def fake_race(reg, case, device, names, cfg=None):
        raced.append(list(names))
        return {"eager_loop": 9.0, "eager_diffusers": 4.0}

    monkeypatch.setattr(runtime, "race", fake_race)
    policy = runtime.load(reg, ckpt, verify=True, **kw)
    assert raced == [["eager_loop", "eager_diffusers"]] and policy.variant == "eager_diffusers"
    assert policy.load_latency_ms == {"eager_loop": 9.0, "eager_diffusers": 4.0}
    assert "latency at load: eager_diffusers 4 ms, eager_loop 9 ms" in policy.notes

    checked = []

    def fake_parity(reg, case, device, name):
        checked.append(name)
        return "parity fail: planted" if name == "eager_diffusers" else ""

    monkeypatch.setattr(runtime, "_parity", fake_parity)
    policy = runtime.load(reg, ckpt, verify=True, **kw)
    assert checked == ["eager_diffusers", "eager_loop"] and policy.variant == "eager_loop"
    assert "eager_diffusers: parity fail: planted" in policy.notes

    raced.clear()
    policy = runtime.load(reg, ckpt, verify=False, pick="order", **kw)
    assert policy.variant == "eager_loop" and not raced and not policy.load_latency_ms
    policy = runtime.load(reg, ckpt, verify=False, candidates=["eager_diffusers"], **kw)
    assert policy.variant == "eager_diffusers" and not raced  # one candidate: nothing to race
    with pytest.raises(ValueError, match="pick must be one of measure, order"):
        runtime.load(reg, ckpt, verify=False, pick="fastest", **kw)
    with pytest.raises(ValueError, match=r"unknown policy variant.*graph_loops"):
        runtime.load(reg, ckpt, verify=False, candidates=["graph_loops"], **kw)


@gpu_test
@pytest.mark.parametrize("config,batch", [("blog", 1), ("pusht_image", 8)])
def test_every_default_candidate_is_raced_on_a_gpu(config, batch):
    """On a GPU every default candidate prepares (kernels, graphs, diffusers) and is timed; the policy keeps the
    fastest as measured, which passed parity on these weights. The latencies go to the log (-s)."""
    fields = dict(yaml.safe_load((ROOT / "suites" / "policy.yaml").read_text())["configs"][config])
    horizon = fields.pop("T")
    policy = dpk.load_policy(config=fields, scheduler="ddim16", batch=batch, horizon=horizon, device="cuda")
    runtime = importlib.import_module("dpk.families.policy._runtime")
    lat = policy.load_latency_ms
    print(f"\n{torch.cuda.get_device_name()} {config} B={batch} ddim16: kept {policy.variant};",
          ", ".join(f"{n} {ms:.3f} ms" for n, ms in sorted(lat.items(), key=lambda kv: kv[1])))
    assert set(lat) == set(runtime.RACED) and policy.variant == min(lat, key=lat.get)
    cond = torch.randn(batch, fields["global_cond_dim"])
    assert policy(cond, seed=1).shape == (batch, horizon, fields["input_dim"])
