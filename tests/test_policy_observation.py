"""policy observation side: the image encoder, the normaliser and their loading from every checkpoint layout.

  - the encoder against an oracle written here from upstream's description (functional ResNet-18 with
    GroupNorm(C // 16), explicit per-sample, per-frame loops): Push-T and odd configs, imagenet_norm;
  - deliberately wrong encoders (BatchNorm kept, 32 groups, no crop, crop off by one, state first, frames
    interleaved) all fail that comparison;
  - center crop as torchvision's (round half to even) and nothing outside the crop reaching the output;
    feature layout frame by frame; torchvision's module tree, init values (pinned) and outputs;
  - bad inputs name the problem; forward compiles as one graph; kernels_loop's compiled encoder (Inductor on the
    CPU); CUDA graph capture (GPU);
  - normalisers: upstream's affine arithmetic, round trips, bad keys;
  - loading: diffusion_policy .ckpt (EMA preferred, shared rgb model, cfg settings or none), a policy state dict
    in .pt / .safetensors; None with a reason for what is not implemented; missing / unexpected / misshaped keys
    listed. LeRobot's encoder, statistics and folders: test_policy_lerobot.py.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dpk import registry

from ._helpers import ROOT, gpu_test, randomized, resnet18_oracle

registry.load([ROOT / "kernels"], strict=True)
E = importlib.import_module("dpk.families.policy._encoder")
N = importlib.import_module("dpk.families.policy._normalizer")
L = importlib.import_module("dpk.families.policy._observation")
ORACLE = importlib.import_module("dpk.families.policy._oracle")
OF = importlib.import_module("dpk.families.policy._observation_formats")
ENC = importlib.import_module("dpk.families.policy._encoding")
CH = importlib.import_module("dpk.families.policy._chunk")
U = importlib.import_module("dpk.families.unet1d._unet")
UF = importlib.import_module("dpk.families.unet1d._checkpoint_formats")
CheckpointError = importlib.import_module("dpk.families.unet1d._checkpoint").CheckpointError

PUSHT = E.EncoderConfig()
ODD = E.EncoderConfig(image_shape=(3, 97, 90), crop_shape=(84, 83), n_obs_steps=3, low_dim=5, imagenet_norm=True)
CROP_TOP_LEFT = {PUSHT: (6, 6), ODD: (6, 4)}  # round(13 / 2) = 6 and round(7 / 2) = 4: halves to even
UNET = U.UNetConfig(input_dim=2, global_cond_dim=1028, diffusion_step_embed_dim=16, down_dims=(16, 32),
                    kernel_size=3, n_groups=8, cond_predict_scale=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def inputs(cfg: E.EncoderConfig, b: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(b, cfg.n_obs_steps, *cfg.image_shape, generator=g) * 2 - 1,
            torch.randn(b, cfg.n_obs_steps, cfg.low_dim, generator=g))


def oracle(w: dict[str, torch.Tensor], cfg: E.EncoderConfig, image: torch.Tensor, agent_pos: torch.Tensor):
    """DiffusionUnetImagePolicy.predict_action's global_cond, one sample and one frame at a time."""
    (top, left), (h, wd) = CROP_TOP_LEFT[cfg], cfg.crop_shape
    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    rows = []
    for b in range(image.shape[0]):
        frames = []
        for t in range(cfg.n_obs_steps):
            img = image[b, t, :, top:top + h, left:left + wd]
            img = (img - mean) / std if cfg.imagenet_norm else img
            feats = resnet18_oracle(w, img[None]).mean(dim=(2, 3))[0]  # global average pool
            frames += [feats, agent_pos[b, t]]  # rgb keys first, then low-dim
        rows.append(torch.cat(frames))
    return torch.stack(rows)


def backbone_weights(enc: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k.removeprefix("backbone."): v for k, v in enc.state_dict().items()}


@pytest.mark.parametrize("cfg", [PUSHT, ODD], ids=["pusht", "odd"])
def test_encoder_matches_oracle(cfg):
    enc = randomized(E.ObsEncoder(cfg, seed=2))
    image, agent_pos = inputs(cfg)
    with torch.no_grad():
        out = enc(image, agent_pos)
        assert out.shape == (2, cfg.cond_dim) and enc.cond_dim == cfg.cond_dim
        torch.testing.assert_close(out, oracle(backbone_weights(enc), cfg, image, agent_pos), rtol=1e-5, atol=1e-5)


def test_pusht_dims_and_module():
    enc = E.ObsEncoder()
    assert (PUSHT.frame_dim, PUSHT.cond_dim) == (514, 1028)
    assert sum(p.numel() for p in enc.parameters()) == 11_176_512  # resnet18's 11,689,512 less fc's 513,000
    norms = [m for m in enc.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert len(norms) == 20 and all(m.num_groups == m.num_channels // 16 for m in norms)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in enc.modules())
    assert len(enc.state_dict()) == 60 and not any("running" in k or "fc" in k for k in enc.state_dict())


class StateFirst(E.ObsEncoder):
    """LeRobot's order: the low-dim state before the image features."""

    def forward(self, image, agent_pos):
        b, n = image.shape[:2]
        feats = self.backbone(self.transform(image.reshape(b * n, *image.shape[2:])))
        return torch.cat([agent_pos.reshape(b * n, -1), feats], dim=-1).reshape(b, -1)


class TimeMajor(E.ObsEncoder):
    """Images flattened frame-major, (n, B) instead of upstream's (B, n)."""

    def forward(self, image, agent_pos):
        b, n = image.shape[:2]
        feats = self.backbone(self.transform(image.transpose(0, 1).reshape(b * n, *image.shape[2:])))
        return torch.cat([feats, agent_pos.reshape(b * n, -1)], dim=-1).reshape(b, -1)


def wrong_encoder(kind: str) -> E.ObsEncoder:
    cls = {"state_first": StateFirst, "time_major": TimeMajor}.get(kind, E.ObsEncoder)
    enc = randomized(cls(E.EncoderConfig(crop_shape=None) if kind == "no_crop" else PUSHT, seed=2))
    if kind == "crop_off_by_one":
        enc._crop = (7, 7, 84, 84)
    for name, m in list(enc.backbone.named_modules()):
        if kind in ("batchnorm_kept", "groups_32") and isinstance(m, torch.nn.GroupNorm):
            c = m.num_channels
            new = torch.nn.BatchNorm2d(c) if kind == "batchnorm_kept" else torch.nn.GroupNorm(32, c)
            new.load_state_dict({"weight": m.weight, "bias": m.bias}, strict=False)
            parent, _, leaf = name.rpartition(".")
            setattr(enc.backbone.get_submodule(parent), leaf, new)
    return enc.eval()


@pytest.mark.parametrize("kind", ["batchnorm_kept", "groups_32", "no_crop", "crop_off_by_one", "state_first",
                                  "time_major"])
def test_wrong_encoders_are_caught(kind):
    enc = wrong_encoder(kind)
    image, agent_pos = inputs(PUSHT)
    with torch.no_grad():
        got, want = enc(image, agent_pos), oracle(backbone_weights(enc), PUSHT, image, agent_pos)
    assert got.shape == want.shape and not torch.allclose(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("hw", "crop", "box"), [
    ((96, 96), (84, 84), (6, 6, 84, 84)), ((97, 96), (84, 84), (6, 6, 84, 84)), ((99, 98), (84, 85), (8, 6, 84, 85)),
    ((96, 96), (76, 76), (10, 10, 76, 76)), ((96, 96), None, (0, 0, 96, 96))])
def test_center_crop_box(hw, crop, box):
    assert E.center_crop_box(*hw, crop) == box  # torchvision: int(round((H - h) / 2.0))


def test_only_the_center_crop_reaches_the_output():
    enc = E.ObsEncoder()
    image, agent_pos = inputs(PUSHT, b=1)
    outside, inside = image.clone(), image.clone()
    outside[..., :6, :] = 5.0
    outside[..., :, 90:] = -5.0
    inside[..., 6, 6] += 1.0
    with torch.no_grad():
        base = enc(image, agent_pos)
        assert torch.equal(enc(outside, agent_pos), base)
        assert not torch.equal(enc(inside, agent_pos), base)
        assert torch.equal(enc.transform(image[0]), image[0, :, :, 6:90, 6:90])


def test_feature_layout_frame_by_frame():
    enc = randomized(E.ObsEncoder(seed=4))
    image, agent_pos = inputs(PUSHT)
    with torch.no_grad():
        out = enc(image, agent_pos).reshape(2, 2, 514)
        for t in range(2):
            assert torch.equal(out[:, t, 512:], agent_pos[:, t])
            torch.testing.assert_close(out[:, t, :512], enc.backbone(enc.transform(image[:, t])), rtol=1e-5, atol=1e-6)
        swapped = enc(image.flip(1), agent_pos.flip(1)).reshape(2, 2, 514)
    torch.testing.assert_close(swapped, out.flip(1), rtol=1e-5, atol=1e-6)


def test_seeded_init_is_torchvisions():
    """Values torchvision 0.28's resnet18(weights=None) has after torch.manual_seed(0) (GroupNorm swapped in)."""
    state = torch.random.get_rng_state()
    sd = backbone_weights(E.ObsEncoder(seed=0))
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    pinned = {"conv1.weight": (-5.018750041808971, [0.024109674617648125, 0.007528774905949831]),
              "layer2.0.downsample.0.weight": (12.327413307634743, [-0.10871897637844086, 0.07623140513896942]),
              "layer4.1.conv2.weight": (13.657922713767139, [0.02886549010872841, 0.011732267215847969])}
    for key, (total, first) in pinned.items():
        assert sd[key].double().sum().item() == pytest.approx(total, rel=1e-9)
        assert sd[key].flatten()[:2].tolist() == first
    x = torch.linspace(0, 1, 2 * 3 * 96 * 96).reshape(2, 3, 96, 96)
    with torch.no_grad():
        y = E.ObsEncoder(seed=0).backbone(x[:, :, 6:90, 6:90])
    assert y.double().sum().item() == pytest.approx(850.8807198305731, rel=1e-5)
    assert not torch.equal(backbone_weights(E.ObsEncoder(seed=1))["conv1.weight"], sd["conv1.weight"])


def test_same_as_torchvision_when_installed():
    try:
        import torchvision
    except (ImportError, RuntimeError) as e:  # RuntimeError: a torchvision built for another torch
        pytest.skip(f"torchvision does not import: {e}")
    torch.manual_seed(3)
    ref = torchvision.models.resnet18(weights=None)
    ref.fc = torch.nn.Identity()
    for name, m in [(n, m) for n, m in ref.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]:
        parent, _, leaf = name.rpartition(".")
        setattr(ref.get_submodule(parent) if parent else ref, leaf, torch.nn.GroupNorm(m.num_features // 16,
                                                                                         m.num_features))
    ours = E.ObsEncoder(seed=3)
    want, got = ref.state_dict(), backbone_weights(ours)
    assert list(want) == list(got) and all(torch.equal(want[k], got[k]) for k in want)
    with torch.no_grad():
        torch.testing.assert_close(ours.backbone(x := torch.rand(2, 3, 84, 84)), ref.eval()(x), rtol=0, atol=0)
    tf = torchvision.transforms.functional
    for shape, crop in (((3, 97, 95), (84, 84)), ((3, 99, 98), (84, 85))):
        enc = E.ObsEncoder(E.EncoderConfig(image_shape=shape, crop_shape=crop, imagenet_norm=True))
        image = torch.rand(2, *shape)
        want = tf.normalize(tf.center_crop(image, list(crop)), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
        torch.testing.assert_close(enc.transform(image), want, rtol=0, atol=0)


GOOD_IMAGE, GOOD_POS = torch.zeros(2, 2, 3, 96, 96), torch.zeros(2, 2, 2)


@pytest.mark.parametrize(("image", "agent_pos", "msg"), [
    (torch.zeros(2, 3, 96, 96), GOOD_POS, r"image must have shape \(B, 2, 3, 96, 96\), got \(2, 3, 96, 96\)"),
    (torch.zeros(2, 3, 3, 96, 96), GOOD_POS, r"image must have shape \(B, 2, 3, 96, 96\), got \(2, 3, 3, 96, 96\)"),
    (torch.zeros(2, 2, 3, 84, 84), GOOD_POS, r"image must have shape \(B, 2, 3, 96, 96\), got \(2, 2, 3, 84, 84\)"),
    (torch.zeros(2, 2, 96, 96, 3), GOOD_POS, r"got \(2, 2, 96, 96, 3\)"),
    (torch.zeros(0, 2, 3, 96, 96), GOOD_POS, r"got \(0, 2, 3, 96, 96\)"),
    (GOOD_IMAGE, torch.zeros(2, 2, 3), r"agent_pos must have shape \(B, 2, 2\), got \(2, 2, 3\)"),
    (GOOD_IMAGE, torch.zeros(2, 4), r"agent_pos must have shape \(B, 2, 2\), got \(2, 4\)"),
    (GOOD_IMAGE, torch.zeros(3, 2, 2), r"agent_pos has batch 3 but image has 2"),
    (GOOD_IMAGE.double(), GOOD_POS, r"image must be torch.float32 like the encoder's weights, got torch.float64"),
    (GOOD_IMAGE, GOOD_POS.half(), r"agent_pos must be torch.float32 .* got torch.float16"),
    (GOOD_IMAGE.to("meta"), GOOD_POS, r"image is on meta but the encoder is on cpu"),
    (GOOD_IMAGE.numpy(), GOOD_POS, r"image must be a torch.Tensor, got ndarray"),
])
def test_bad_inputs_name_the_problem(image, agent_pos, msg):
    with pytest.raises(ValueError, match=msg):
        E.ObsEncoder()(image, agent_pos)


@pytest.mark.parametrize(("kwargs", "msg"), [
    ({"crop_shape": (97, 84)}, r"crop_shape \(97, 84\) does not fit in the image's \(H, W\) = \(96, 96\)"),
    ({"image_shape": (4, 96, 96)}, r"image_shape must be \(3, H, W\)"),
    ({"feature_dim": 2048}, r"gives 512 per image \(only ResNet-18 is implemented\)"),
    ({"layout": "lerobot", "feature_dim": 64, "keypoints": 16}, r"lerobot layout gives 32 per image \(2 x keypoints\)"),
    ({"norm": "batch"}, "the diffusion_policy layout is upstream's GroupNorm ResNet"),
    ({"layout": "mimic"}, "layout must be one of"),
    ({"layout": "robomimic", "feature_dim": 0}, "robomimic's Linear needs at least one output"),
    ({"layout": "robomimic", "n_cameras": 2}, "robomimic's layout has one VisualCore per camera"),
    ({"separate": True}, "separate needs several"),
    ({"layout": "lerobot", "feature_dim": 0, "keypoints": 0}, "keypoints must be >= 1"),
    ({"n_obs_steps": 0}, "n_obs_steps must be >= 1"),
])
def test_bad_configs(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        E.EncoderConfig(**kwargs)


LEROBOT_ODD = E.EncoderConfig.lerobot(image_shape=(3, 90, 77), crop_shape=(80, 40), n_obs_steps=3, low_dim=5,
                                      norm="batch", keypoints=7)


@pytest.mark.parametrize("cfg", [ODD, LEROBOT_ODD, E.EncoderConfig.robomimic()],
                         ids=["diffusion_policy", "lerobot", "robomimic"])
def test_forward_is_one_graph(cfg):
    """No graph break (no host sync, no data-dependent branch): torch.compile(fullgraph=True) traces it whole."""
    torch._dynamo.reset()
    enc = E.ObsEncoder(cfg)
    image, agent_pos = inputs(cfg, b=1)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(enc, backend="eager", fullgraph=True)(image, agent_pos),
                                   enc(image, agent_pos), rtol=0, atol=0)


@pytest.mark.parametrize("cfg", [E.EncoderConfig(image_shape=(3, 20, 20), crop_shape=(16, 16), n_obs_steps=1),
                                 E.EncoderConfig.robomimic(image_shape=(3, 44, 44), crop_shape=(40, 40), keypoints=4,
                                                           n_obs_steps=1),
                                 E.EncoderConfig.lerobot(image_shape=(3, 44, 44), crop_shape=(40, 40), norm="batch",
                                                         keypoints=4, n_obs_steps=1, n_cameras=2, separate=True)],
                         ids=["diffusion_policy", "robomimic", "lerobot_bn_2cam"])
def test_kernels_loop_encoder_is_compiled_once(cfg):
    """kernels_loop's encoder (condition(..., compiled=True)): the module under Inductor (its CPU backend here), made
    once per encoder, the module's features within the family's float32 encoder bound."""
    torch._dynamo.reset()
    enc = ENC.Encoder(E.ObsEncoder(cfg), torch.device("cpu"), "random(0)")
    image, agent_pos = enc.random_observation(2, torch.Generator().manual_seed(0))
    chunk = SimpleNamespace(encoder=enc)
    with torch.no_grad():
        want, got = enc(image, agent_pos), CH.condition(chunk, None, image, agent_pos, compiled=True)
    assert enc.compiled() is enc.compiled()
    atol = 8 * ORACLE.encoder_rel_error("float32", enc.conv_lengths()) * float(want.pow(2).mean().sqrt())
    torch.testing.assert_close(got, want, rtol=0, atol=atol)


def test_compiled_encoder_without_triton_is_the_module(monkeypatch):
    """A CUDA device whose torch has no Triton (Inductor's GPU backend): kernels_loop runs the module itself."""
    enc = ENC.Encoder(E.ObsEncoder(E.EncoderConfig(image_shape=(3, 20, 20), crop_shape=(16, 16))), torch.device("cpu"),
                      "random(0)")
    enc.device = torch.device("cuda")  # the check reads only the device type
    monkeypatch.setattr(ENC.importlib.util, "find_spec", lambda name: None)
    assert enc.compiled() is enc.module


@gpu_test
@pytest.mark.parametrize("cfg", [PUSHT, E.EncoderConfig.lerobot(), E.EncoderConfig.robomimic()],
                         ids=["diffusion_policy", "lerobot", "robomimic"])
def test_cuda_graph_capture_and_compile(cfg):
    enc = E.ObsEncoder(cfg).cuda()
    image, agent_pos = (t.cuda() for t in inputs(cfg, b=8))
    with torch.no_grad():
        want = enc(image, agent_pos)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            enc(image, agent_pos)  # warm-up off the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = enc(image, agent_pos)
        new_image, new_pos = (t.cuda() for t in inputs(cfg, b=8, seed=1))
        image.copy_(new_image)
        agent_pos.copy_(new_pos)
        graph.replay()
        torch.testing.assert_close(out, enc(new_image, new_pos), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(out, want)
        # both TF32 (cuDNN's default; inductor picks its own conv algorithms): the family's encoder bound, twice
        lengths = [m.in_channels * m.kernel_size[0] * m.kernel_size[1] for m in enc.modules()
                   if isinstance(m, torch.nn.Conv2d)]
        want = enc(new_image, new_pos)
        atol = 8 * 2 ** 0.5 * ORACLE.encoder_rel_error("tf32", lengths) * float(want.pow(2).mean().sqrt())
        compiled = torch.compile(enc, fullgraph=True, mode="reduce-overhead")
        torch.testing.assert_close(compiled(new_image, new_pos), want, rtol=0, atol=atol)


DP_FIELDS = {"image": (torch.tensor([2.0]), torch.tensor([-1.0])),  # get_image_range_normalizer: [0, 1] -> [-1, 1]
             "agent_pos": (torch.tensor([0.0039, 0.0041]), torch.tensor([-1.05, -0.98])),
             "action": (torch.tensor([0.0038, 0.0042]), torch.tensor([-1.02, -0.99]))}
def test_diffusion_policy_normalizer_is_upstreams_linear_normalizer():
    sd = OF.dp_normalizer_tensors(DP_FIELDS)
    norm = N.Normalizer.from_diffusion_policy(sd)
    assert norm.modes == {"image": "affine", "agent_pos": "affine", "action": "affine"}
    image, pos = torch.rand(2, 2, 3, 96, 96), torch.rand(2, 2, 2) * 512
    nimage, npos = norm.normalize_obs(image, pos)
    assert torch.equal(nimage, image * 2 - 1)
    scale, offset = DP_FIELDS["agent_pos"]
    assert torch.equal(npos, (pos.reshape(-1, 2) * scale + offset).reshape(pos.shape))  # upstream's _normalize
    scale, offset = DP_FIELDS["action"]
    lo, hi = sd["normalizer.params_dict.action.input_stats.min"], sd["normalizer.params_dict.action.input_stats.max"]
    torch.testing.assert_close(norm.normalize_action(torch.stack([lo, hi])), torch.tensor([[-1.0] * 2, [1.0] * 2]))
    naction = torch.rand(3, 16, 2) * 2 - 1
    action = norm.unnormalize_action(naction)
    assert torch.equal(action, ((naction.reshape(-1, 2) - offset) / scale).reshape(naction.shape))
    torch.testing.assert_close(norm.normalize_action(action), naction, rtol=1e-5, atol=1e-6)


def test_identity_normalizer():
    norm = N.Normalizer.identity()
    image, pos = inputs(PUSHT)
    assert all(a is b for a, b in zip(norm.normalize_obs(image, pos), (image, pos)))
    assert norm.unnormalize_action(pos) is pos and set(norm.modes.values()) == {"identity"}


def _dp_error(edit) -> str:
    sd = OF.dp_normalizer_tensors(DP_FIELDS)
    edit(sd)
    with pytest.raises(CheckpointError) as err:
        N.Normalizer.from_diffusion_policy(sd)
    return str(err.value)


def test_normalizer_bad_keys_are_listed():
    p = "normalizer.params_dict."
    assert f"missing (1): {p}agent_pos.offset" in _dp_error(lambda sd: sd.pop(f"{p}agent_pos.offset"))
    assert f"missing (1): {p}image.input_stats.std" in _dp_error(lambda sd: sd.pop(f"{p}image.input_stats.std"))
    msg = _dp_error(lambda sd: sd.update({f"{p}action.offset": torch.zeros(3), f"{p}action.extra": torch.zeros(1)}))
    assert f"misshaped (1): {p}action.offset (expected (2,), found (3,))" in msg
    assert f"unexpected (1): {p}action.extra" in msg
    msg = _dp_error(lambda sd: [sd.pop(k) for k in list(sd) if ".agent_pos." in k])
    assert f"missing (6): {p}agent_pos.scale, {p}agent_pos.offset" in msg


UNET_MODEL = U.ConditionalUnet1D(UNET)
def policy_parts(enc: E.ObsEncoder, shared: bool = False) -> dict[str, torch.Tensor]:
    return OF.dp_encoder_tensors(enc, shared) | OF.dp_normalizer_tensors(DP_FIELDS)


def write_dp(tmp: Path, cfg: dict | None, shared: bool = False, edit=None) -> tuple[Path, E.ObsEncoder, E.ObsEncoder]:
    """A diffusion_policy .ckpt with a model and an EMA encoder that differ; `edit` changes both state dicts."""
    model, ema = E.ObsEncoder(seed=5), randomized(E.ObsEncoder(seed=6))
    parts = [policy_parts(model, shared), policy_parts(ema, shared)]
    for sd in parts:
        (edit or (lambda sd: None))(sd)
    path = UF.save_diffusion_policy_ckpt(UNET_MODEL, tmp / "latest.ckpt", ema_model=UNET_MODEL, cfg=cfg,
                                         others=parts[0], ema_others=parts[1])
    return path, model, ema


def same_outputs(loaded: E.ObsEncoder, saved: E.ObsEncoder, sd_weights: dict[str, torch.Tensor]) -> None:
    image, agent_pos = inputs(loaded.config, b=1)
    with torch.no_grad():
        out = loaded(image, agent_pos)
        assert torch.equal(out, saved(image, agent_pos))
        torch.testing.assert_close(out, oracle(sd_weights, loaded.config, image, agent_pos), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["cfg", "no_cfg", "shared_rgb_model"])
def test_diffusion_policy_ckpt_round_trip(kind, tmp_path):
    cfg = None if kind == "no_cfg" else OF.dp_cfg(UNET, PUSHT, shared=kind == "shared_rgb_model")
    path, model, ema = write_dp(tmp_path, cfg, shared=kind == "shared_rgb_model")
    side = L.load_observation_side(path)
    assert (side.source, side.weights, side.encoder_reason, side.normalizer_reason) == (
        "diffusion_policy", "ema_model", "", "")
    assert side.encoder.config == PUSHT
    prefix = "obs_encoder.key_model_map." + ("rgb." if kind == "shared_rgb_model" else "image.")
    ckpt = policy_parts(ema, kind == "shared_rgb_model")
    same_outputs(side.encoder, ema, {k[len(prefix):]: v for k, v in ckpt.items() if k.startswith(prefix)})
    for key, (scale, offset) in DP_FIELDS.items():
        assert torch.equal(side.normalizer.field(key).a, scale) and torch.equal(side.normalizer.field(key).b, offset)
    if kind == "no_cfg":
        assert any("n_obs_steps 2 from the U-Net's global_cond_dim 1028" in n for n in side.notes)
        assert any("Push-T image defaults assumed: image_shape (3, 96, 96), crop_shape (84, 84), imagenet_norm False"
                   in n for n in side.notes)
    trained = L.load_observation_side(path, prefer_ema=False)
    assert trained.weights == "model"
    same_outputs(trained.encoder, model, backbone_weights(model))


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_policy_state_dict_files(suffix, tmp_path):
    enc = randomized(E.ObsEncoder(seed=7))
    sd = {"model." + k: v for k, v in UNET_MODEL.state_dict().items()} | policy_parts(enc)
    side = L.load_observation_side(UF.save_state_dict(sd, tmp_path / f"policy{suffix}"))
    assert (side.source, side.weights) == ("state_dict", f"policy{suffix}")
    same_outputs(side.encoder, enc, backbone_weights(enc))


def test_cfg_settings_are_read(tmp_path):
    side = L.load_observation_side(write_dp(tmp_path, OF.dp_cfg(UNET, PUSHT, crop_shape=[76, 76],
                                                                 imagenet_norm=True))[0])
    assert (side.encoder.config.crop_shape, side.encoder.config.imagenet_norm) == ((76, 76), True)
    # upstream: random_crop False assigns a CenterCrop that is then overwritten, so no crop at all
    side = L.load_observation_side(write_dp(tmp_path, OF.dp_cfg(UNET, PUSHT, random_crop=False))[0])
    assert side.encoder.config.crop_shape is None
    cfg = OF.dp_cfg(UNET, PUSHT)
    cfg["n_obs_steps"] = 3
    with pytest.raises(CheckpointError, match=r"3 x \(512 \+ 2\) = 1542 features but the U-Net's global_cond_dim "
                                              r"is 1028"):
        L.load_observation_side(write_dp(tmp_path, cfg)[0])


def _cfg(**policy) -> dict:
    cfg = OF.dp_cfg(UNET, PUSHT)
    for dotted, value in policy.items():
        node = cfg["policy"]
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return cfg


@pytest.mark.parametrize(("cfg", "edit", "reason"), [
    (None, lambda sd: sd.update({"obs_encoder.key_model_map.image.bn1.running_mean": torch.zeros(64)}),
     "keeps BatchNorm"),
    (_cfg(obs_encoder__use_group_norm=False), None, "keeps BatchNorm"),
    (_cfg(obs_encoder__resize_shape=[90, 90]), None, "resize_shape [90, 90]"),
    (_cfg(obs_encoder__rgb_model__name="resnet34"), None, "rgb_model resnet34"),
    (_cfg(obs_as_global_cond=False), None, "obs_as_global_cond False"),
    (_cfg(shape_meta={"obs": {"a": {"shape": [3, 96, 96], "type": "rgb"}, "b": {"shape": [3, 84, 84], "type": "rgb"},
                              "agent_pos": {"shape": [2]}}}), None, "cameras of one shape"),
])
def test_unsupported_encoders_give_none_and_why(cfg, edit, reason, tmp_path):
    side = L.load_observation_side(write_dp(tmp_path, cfg, edit=edit)[0])
    assert side.encoder is None and reason in side.encoder_reason
    assert side.normalizer is not None and side.normalizer.keys == ("image", "agent_pos", "action")


def test_bare_unet_has_neither(tmp_path):
    side = L.load_observation_side(UF.save_state_dict(UNET_MODEL, tmp_path / "unet.safetensors"))
    assert side.encoder is None and "no obs_encoder.* keys" in side.encoder_reason
    assert side.normalizer is None and "no normalizer.params_dict.* keys" in side.normalizer_reason


def test_bad_encoder_keys_are_listed(tmp_path):
    p = "obs_encoder.key_model_map.image."

    def edit(sd):
        sd.pop(p + "layer3.1.bn2.bias")
        sd[p + "fc.weight"] = torch.zeros(1000, 512)
        sd[p + "conv1.weight"] = torch.zeros(64, 3, 5, 5)
    with pytest.raises(CheckpointError) as err:
        L.load_observation_side(write_dp(tmp_path, OF.dp_cfg(UNET, PUSHT), edit=edit)[0])
    msg = str(err.value)
    assert str(tmp_path / "latest.ckpt") in msg
    assert f"missing (1): {p}layer3.1.bn2.bias" in msg and f"unexpected (1): {p}fc.weight" in msg
    assert f"misshaped (1): {p}conv1.weight (expected (64, 3, 7, 7), found (64, 3, 5, 5))" in msg


def test_dill_omegaconf_checkpoint_with_placeholder_encoder(tmp_path):
    """unet1d's fixture (written by diffusion_policy's pickling: dill, OmegaConf cfg) holds a placeholder encoder
    tensor: read without dill or omegaconf, its keys are reported against the real layout."""
    fixture = ROOT / "tests" / "data" / "unet1d_dp_dill_omegaconf.ckpt"
    with pytest.raises(CheckpointError, match=r"unexpected \(1\): obs_encoder.nets.rgb.backbone.conv1.weight"):
        L.load_observation_side(fixture)


def test_bad_paths(tmp_path):
    with pytest.raises(CheckpointError, match="no such file or folder"):
        L.load_observation_side(tmp_path / "absent.ckpt")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"unknown extension '\.bin'"):
        L.load_observation_side(tmp_path / "weights.bin")
    (tmp_path / "folder").mkdir()
    with pytest.raises(CheckpointError, match=r"not a LeRobot pretrained-policy folder: no config\.json and no"):
        L.load_observation_side(tmp_path / "folder")
