"""unet1d checkpoints: every layout loads strictly into ConditionalUnet1D and computes what the saved model did.

  - round trips: a bare state dict (.pt, .pth wrapped as {"state_dict": ...}, .safetensors), a diffusion_policy
    workspace .ckpt, a Lightning-style .ckpt and a LeRobot folder (plain and torch.compile'd key names), over
    small configs (kernel 3/5, FiLM scale on/off, two and three levels, odd channels, input_dim 2/7, no global
    cond): config equal, load_state_dict(strict=True), forward bit-identical, source/weights/sha256 recorded;
  - EMA weights preferred over the training weights (and the fallback when there are none);
  - the config inferred from shapes alone (n_groups assumed 8, with a note) and from stored settings;
  - a real diffusion_policy checkpoint (dill + OmegaConf cfg, tests/data, written by this file's __main__)
    loads with omegaconf and without it (hidden), never needing dill; a cfg of a class that cannot be imported
    degrades to stand-ins;
  - LeRobot's key names map to upstream ones and back;
  - bad input names the problem: missing / unexpected / misshaped keys, a wrong folder, an unknown extension,
    a .ckpt without state_dicts, config.json or cfg values that disagree with the tensor shapes, bad hints.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from dpk import registry

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "unet1d_dp_dill_omegaconf.ckpt"
registry.load([ROOT / "kernels"], strict=True)
C = importlib.import_module("dpk.families.unet1d._checkpoint")
F = importlib.import_module("dpk.families.unet1d._checkpoint_formats")
M = importlib.import_module("dpk.families.unet1d._unet")
UNetConfig, CheckpointError = M.UNetConfig, C.CheckpointError

CONFIGS = {
    "k3_film_2lvl": UNetConfig(input_dim=2, global_cond_dim=10, diffusion_step_embed_dim=16, down_dims=(16, 32),
                               kernel_size=3, n_groups=8, cond_predict_scale=True),
    "k5_bias_3lvl_odd_g4": UNetConfig(input_dim=7, global_cond_dim=6, diffusion_step_embed_dim=8,
                                      down_dims=(24, 40, 56), kernel_size=5, n_groups=4, cond_predict_scale=False),
    "k5_film_2lvl_odd_nocond": UNetConfig(input_dim=7, global_cond_dim=0, diffusion_step_embed_dim=16,
                                          down_dims=(24, 40), kernel_size=5, n_groups=8, cond_predict_scale=True),
    "k3_bias_3lvl_g2": UNetConfig(input_dim=2, global_cond_dim=4, diffusion_step_embed_dim=8, down_dims=(8, 16, 24),
                                  kernel_size=3, n_groups=2, cond_predict_scale=False),
}
FIXTURE_CONFIG = UNetConfig(input_dim=2, global_cond_dim=4, diffusion_step_embed_dim=8, down_dims=(8, 16),
                            kernel_size=3, n_groups=4, cond_predict_scale=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def make_model(config: UNetConfig, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (GroupNorm affine included), so a swapped or mis-grouped tensor shows."""
    model = M.ConditionalUnet1D(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


@functools.cache
def source(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model each round trip saves, and its output (built once per config)."""
    model = make_model(CONFIGS[name])
    return model, forward(model, CONFIGS[name])


def forward(model: torch.nn.Module, config: UNetConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    sample = torch.randn(2, 16, config.input_dim, generator=g)
    cond = torch.randn(2, config.global_cond_dim, generator=g)
    with torch.no_grad():
        return model(sample, torch.tensor([3, 71]), global_cond=cond)


def write(kind: str, model: torch.nn.Module, config: UNetConfig, tmp: Path) -> tuple[Path, dict, str, str]:
    """Save `model` in layout `kind`: (path, hints it needs, expected source, expected weights)."""
    groups = {"n_groups": config.n_groups}  # the one setting a bare state dict cannot carry
    if kind == "pt":
        return F.save_state_dict(model, tmp / "unet.pt"), groups, "state_dict", "unet.pt"
    if kind == "pth_wrapped":
        return F.save_state_dict(model, tmp / "unet.pth", wrapped=True), groups, "state_dict", "unet.pth"
    if kind == "safetensors":
        return F.save_state_dict(model, tmp / "unet.safetensors"), groups, "state_dict", "unet.safetensors"
    if kind == "diffusion_policy":
        return F.save_diffusion_policy_ckpt(model, tmp / "latest.ckpt", cfg=config), {}, "diffusion_policy", "model"
    if kind == "lightning":
        path = tmp / "epoch=3.ckpt"
        torch.save({"epoch": 3, "state_dict": {"model." + k: v for k, v in model.state_dict().items()}}, path)
        return path, groups, "state_dict", path.name
    folder = F.save_lerobot_folder(model, tmp / "pretrained_model", config, compiled=kind == "lerobot_compiled")
    return folder, {}, "lerobot", "model.safetensors"


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("kind", ["pt", "pth_wrapped", "safetensors", "diffusion_policy", "lightning", "lerobot",
                                  "lerobot_compiled"])
def test_round_trip(kind, name, tmp_path):
    config = CONFIGS[name]
    model, out = source(name)
    path, hints, kind_source, weights = write(kind, model, config, tmp_path)
    loaded = C.load_checkpoint(path, hints=hints)
    assert loaded.config == config
    assert (loaded.source, loaded.weights) == (kind_source, weights)
    fresh = M.ConditionalUnet1D(loaded.config).eval()
    fresh.load_state_dict(loaded.state_dict, strict=True)
    assert torch.equal(forward(fresh, config), out)
    hashed = path / "model.safetensors" if path.is_dir() else path
    assert loaded.sha256 == hashlib.sha256(hashed.read_bytes()).hexdigest()
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in loaded.state_dict.values())


def test_ema_preferred_over_model(tmp_path):
    config = CONFIGS["k3_film_2lvl"]
    model, ema = make_model(config, seed=0), make_model(config, seed=1)
    path = F.save_diffusion_policy_ckpt(model, tmp_path / "latest.ckpt", ema_model=ema, cfg=config)
    for prefer_ema, want, source in ((True, "ema_model", ema), (False, "model", model)):
        loaded = C.load_checkpoint(path, prefer_ema=prefer_ema)
        assert loaded.weights == want
        assert all(torch.equal(loaded.state_dict[k], v) for k, v in source.state_dict().items())
    no_ema = C.load_checkpoint(F.save_diffusion_policy_ckpt(model, tmp_path / "no_ema.ckpt", cfg=config))
    assert no_ema.weights == "model" and any("no ema_model" in n for n in no_ema.notes)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_inferred_from_shapes(name):
    config = CONFIGS[name]
    sd = M.ConditionalUnet1D(config).state_dict()
    inferred, notes = C.infer_config(sd)
    assert inferred == UNetConfig(**{**config.__dict__, "n_groups": 8})
    assert any("n_groups not stored: assumed 8" in n for n in notes)
    assert C.infer_config(sd, {"n_groups": config.n_groups}) == (config, [])


def test_bare_state_dict_without_hints_assumes_8_groups(tmp_path):
    config = CONFIGS["k5_bias_3lvl_odd_g4"]  # saved with 4 groups: only hints can say so
    loaded = C.load_checkpoint(F.save_state_dict(make_model(config), tmp_path / "unet.safetensors"))
    assert loaded.config.n_groups == 8 and any("hints={'n_groups': G}" in n for n in loaded.notes)


def fixture_weights(config: UNetConfig, offset: int) -> dict[str, torch.Tensor]:
    """Exactly representable weights from each key's position and `offset`: no RNG, no init order."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in M.ConditionalUnet1D(config).state_dict().items()}
    return {k: (((torch.arange(s.numel()) * 7 + i * 3 + offset) % 17 - 8) / 16).reshape(s)
            for i, (k, s) in enumerate(sorted(shapes.items()))}


def write_fixture() -> None:
    """Write FIXTURE the way diffusion_policy does (dill, OmegaConf cfg); needs dill and omegaconf."""
    import dill
    model, ema = M.ConditionalUnet1D(FIXTURE_CONFIG), M.ConditionalUnet1D(FIXTURE_CONFIG)
    model.load_state_dict(fixture_weights(FIXTURE_CONFIG, 0))
    ema.load_state_dict(fixture_weights(FIXTURE_CONFIG, 5))
    FIXTURE.parent.mkdir(exist_ok=True)
    F.save_diffusion_policy_ckpt(model, FIXTURE, ema_model=ema, cfg=F.diffusion_policy_cfg(FIXTURE_CONFIG, True),
                                 pickle_module=dill)


HAS_OMEGACONF = importlib.util.find_spec("omegaconf") is not None


def hide_omegaconf(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import omegaconf` (and of its submodules, imported already or not) fail in this test, as on a machine
    without it."""
    for name in {"omegaconf", *(m for m in sys.modules if m.startswith("omegaconf."))}:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("with_omegaconf", [True, False], ids=["omegaconf", "no_omegaconf"])
def test_real_dill_omegaconf_checkpoint(with_omegaconf, monkeypatch):
    if with_omegaconf and not HAS_OMEGACONF:
        pytest.skip("omegaconf is not installed (pip install -e '.[dev]' brings it)")
    if not with_omegaconf:
        hide_omegaconf(monkeypatch)
    for prefer_ema, offset in ((True, 5), (False, 0)):
        loaded = C.load_checkpoint(FIXTURE, prefer_ema=prefer_ema)
        assert loaded.config == FIXTURE_CONFIG  # n_groups=4 comes from cfg.policy, not from the default
        assert loaded.source == "diffusion_policy"
        want = fixture_weights(FIXTURE_CONFIG, offset)
        assert set(loaded.state_dict) == set(want)
        assert all(torch.equal(loaded.state_dict[k], v) for k, v in want.items())
    # without omegaconf the cfg's nodes are stand-ins (named in the notes); with it they are real DictConfigs
    assert any("omegaconf.dictconfig.DictConfig" in n for n in loaded.notes) == (not with_omegaconf)


def _gone_module_cfg(tmp_path: Path, content: dict | None) -> Path:
    """A .ckpt whose cfg is an object of a class that no longer imports; with `content`, laid out as OmegaConf
    pickles a DictConfig (`_content` of nodes that keep `_val`)."""
    mod = types.ModuleType("dpk_test_gone_training_code")
    for cls_name in ("Container", "Node", "Opaque"):
        cls = type(cls_name, (), {"__module__": mod.__name__})
        setattr(mod, cls_name, cls)

    def make(cls, **state):
        obj = cls()
        obj.__dict__.update(state)
        return obj

    def tree(value):
        if isinstance(value, dict):
            return make(mod.Container, _content={k: tree(v) for k, v in value.items()}, _parent=None)
        return make(mod.Node, _val=value, _parent=None)

    sys.modules[mod.__name__] = mod
    try:
        cfg = tree(content) if content is not None else make(mod.Opaque, anything=1)
        return F.save_diffusion_policy_ckpt(make_model(FIXTURE_CONFIG), tmp_path / "gone.ckpt", cfg=cfg)
    finally:
        del sys.modules[mod.__name__]


def test_cfg_of_unimportable_classes_degrades_to_stand_ins(tmp_path):
    cfg = F.diffusion_policy_cfg(FIXTURE_CONFIG)
    loaded = C.load_checkpoint(_gone_module_cfg(tmp_path, cfg))
    assert loaded.config == FIXTURE_CONFIG  # n_groups read from the stand-ins' pickled state
    assert any("dpk_test_gone_training_code.Container" in n for n in loaded.notes)
    opaque = C.load_checkpoint(_gone_module_cfg(tmp_path, None))
    assert opaque.config == UNetConfig(**{**FIXTURE_CONFIG.__dict__, "n_groups": 8})
    assert any("no U-Net settings readable from the cfg" in n for n in opaque.notes)
    assert any("n_groups not stored" in n for n in opaque.notes)


def test_lowdim_cfg_layout(tmp_path):
    """diffusion_unet_lowdim_policy: the U-Net's settings sit in cfg.policy.model, some as ${eval:...} strings."""
    c = FIXTURE_CONFIG
    model_cfg = {"_target_": "diffusion_policy.model.diffusion.conditional_unet1d.ConditionalUnet1D",
                 "input_dim": "${eval: ${task.action_dim} if ${obs_as_global_cond} else ${task.obs_dim}}",
                 "global_cond_dim": c.global_cond_dim, "diffusion_step_embed_dim": c.diffusion_step_embed_dim,
                 "down_dims": list(c.down_dims), "kernel_size": c.kernel_size, "n_groups": c.n_groups,
                 "cond_predict_scale": c.cond_predict_scale}
    cfg = {"policy": {"_target_": "diffusion_policy.policy.diffusion_unet_lowdim_policy.DiffusionUnetLowdimPolicy",
                      "model": model_cfg}}
    loaded = C.load_checkpoint(F.save_diffusion_policy_ckpt(make_model(c), tmp_path / "lowdim.ckpt", cfg=cfg))
    assert loaded.config == c
    assert any(n.startswith("cfg policy.model.input_dim = '${eval:") and n.endswith("not used") for n in loaded.notes)


@pytest.mark.skipif(not HAS_OMEGACONF, reason="omegaconf is not installed (pip install -e '.[dev]' brings it)")
def test_omegaconf_cfg_read_with_omegaconf(tmp_path):
    config = CONFIGS["k5_bias_3lvl_odd_g4"]
    cfg = F.diffusion_policy_cfg(config, omegaconf=True)
    loaded = C.load_checkpoint(F.save_diffusion_policy_ckpt(make_model(config), tmp_path / "x.ckpt", cfg=cfg))
    assert loaded.config == config


def test_lerobot_names_map_both_ways():
    keys = list(M.ConditionalUnet1D(CONFIGS["k3_bias_3lvl_g2"]).state_dict())
    theirs = [F.to_lerobot(k) for k in keys]
    assert [F.from_lerobot(k) for k in theirs] == keys
    for want in ("down_modules.0.0.conv1.block.0.weight", "down_modules.1.1.conv2.block.1.bias",
                 "mid_modules.1.conv1.block.1.weight", "up_modules.0.0.conv2.block.0.bias",
                 "down_modules.0.2.weight", "up_modules.1.2.bias", "down_modules.0.0.cond_encoder.1.weight",
                 "final_conv.0.block.0.weight", "final_conv.1.weight", "diffusion_step_encoder.3.bias"):
        assert want in theirs
    assert not any(".blocks." in k or ".2.conv." in k for k in theirs)


def test_half_precision_weights_become_float32(tmp_path):
    config = CONFIGS["k3_film_2lvl"]
    model = make_model(config)
    sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    loaded = C.load_checkpoint(F.save_state_dict(sd, tmp_path / "unet.safetensors"))
    assert all(v.dtype == torch.float32 for v in loaded.state_dict.values())
    assert any("bfloat16" in n for n in loaded.notes)


def _state_dict_error(tmp_path: Path, edit) -> str:
    config = CONFIGS["k3_film_2lvl"]
    sd = dict(make_model(config).state_dict())
    edit(sd)
    with pytest.raises(CheckpointError) as err:
        C.load_checkpoint(F.save_state_dict(sd, tmp_path / "unet.pt"))
    assert str(tmp_path / "unet.pt") in str(err.value)
    return str(err.value)


def test_missing_unexpected_misshaped_keys(tmp_path):
    msg = _state_dict_error(tmp_path, lambda sd: sd.pop("down_modules.1.1.blocks.1.block.1.weight"))
    assert "missing (1): down_modules.1.1.blocks.1.block.1.weight" in msg
    msg = _state_dict_error(tmp_path, lambda sd: sd.update({"down_modules.0.0.extra.weight": torch.zeros(3)}))
    assert "unexpected (1): down_modules.0.0.extra.weight" in msg
    msg = _state_dict_error(tmp_path, lambda sd: sd.update({"mid_modules.0.blocks.0.block.0.bias": torch.zeros(33)}))
    assert "misshaped (1): mid_modules.0.blocks.0.block.0.bias (expected (32,), found (33,))" in msg

    def drop_mid(sd):
        for k in [k for k in sd if k.startswith("mid_modules.")]:
            del sd[k]
    msg = _state_dict_error(tmp_path, drop_mid)
    assert "missing (20): mid_modules.0.blocks.0.block.0.weight" in msg and msg.endswith(" ...")
    msg = _state_dict_error(tmp_path, lambda sd: sd.pop("final_conv.1.weight"))
    assert "no key ending in 'final_conv.1.weight'" in msg
    msg = _state_dict_error(tmp_path, lambda sd: sd.update({"local_cond_encoder.0.x": torch.zeros(1)}))
    assert "local conditioning" in msg


def test_check_state_dict_directly():
    config = CONFIGS["k3_film_2lvl"]
    sd = dict(M.ConditionalUnet1D(config).state_dict())
    C.check_state_dict(config, sd)
    sd["up_modules.0.2.conv.weight"] = torch.zeros(16, 16, 3)
    with pytest.raises(CheckpointError, match=r"up_modules\.0\.2\.conv\.weight \(expected \(16, 16, 4\)"):
        C.check_state_dict(config, sd)


def test_bad_paths(tmp_path):
    with pytest.raises(CheckpointError, match="no such file or folder"):
        C.load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "unet.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"unet\.bin: unknown extension '\.bin'"):
        C.load_checkpoint(tmp_path / "unet.bin")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"junk\.pt: cannot be read by torch\.load"):
        C.load_checkpoint(tmp_path / "junk.pt")
    torch.save({"epoch": 1, "weights": {}}, tmp_path / "other.ckpt")
    with pytest.raises(CheckpointError, match=r"other\.ckpt: a \.ckpt without 'state_dicts'.*\['epoch', 'weights'\]"):
        C.load_checkpoint(tmp_path / "other.ckpt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"not a LeRobot pretrained-policy folder: no config\.json and no model"):
        C.load_checkpoint(empty)
    (empty / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"empty: .*no model\.safetensors \(it holds \['config\.json'\]\)"):
        C.load_checkpoint(empty)


@pytest.mark.parametrize(("extra", "msg"), [
    ({"down_dims": [16, 64]}, r"config\.json says down_dims=\(16, 64\) but the tensor shapes say \(16, 32\)"),
    ({"kernel_size": 5}, "config.json says kernel_size=5 but the tensor shapes say 3"),
    ({"use_film_scale_modulation": False}, "config.json says cond_predict_scale=False but the tensor shapes say True"),
    ({"diffusion_step_embed_dim": 32}, "config.json says diffusion_step_embed_dim=32 but the tensor shapes say 16"),
    ({"output_features": {"action": {"type": "ACTION", "shape": [3]}}}, "says input_dim=3 but the tensor shapes say 2"),
    ({"n_groups": 3}, r"n_groups=3 does not divide the channel counts \[16, 32\]"),
    ({"type": "act"}, "config.json: a 'act' policy, not 'diffusion'"),
    ({"down_dims": "wide"}, "config.json: down_dims = 'wide' is not a valid value"),
])
def test_lerobot_config_disagreeing_with_shapes(extra, msg, tmp_path):
    config = CONFIGS["k3_film_2lvl"]
    folder = F.save_lerobot_folder(make_model(config), tmp_path / "policy", config, config_extra=extra)
    with pytest.raises(CheckpointError, match=msg) as err:
        C.load_checkpoint(folder)
    assert str(folder) in str(err.value)


def test_diffusion_policy_cfg_and_hints_disagreeing(tmp_path):
    config = CONFIGS["k3_film_2lvl"]
    cfg = F.diffusion_policy_cfg(config)
    cfg["policy"]["kernel_size"] = 5
    path = F.save_diffusion_policy_ckpt(make_model(config), tmp_path / "x.ckpt", cfg=cfg)
    with pytest.raises(CheckpointError, match="the checkpoint's cfg says kernel_size=5 but the tensor shapes say 3"):
        C.load_checkpoint(path)
    path = F.save_diffusion_policy_ckpt(make_model(config), tmp_path / "y.ckpt", cfg=config)
    with pytest.raises(CheckpointError, match="hints give n_groups=4 but the checkpoint's cfg says 8"):
        C.load_checkpoint(path, hints={"n_groups": 4})
    bare = F.save_state_dict(make_model(config), tmp_path / "u.pt")
    with pytest.raises(CheckpointError, match=r"u\.pt: unknown config field in hints: 'groups'"):
        C.load_checkpoint(bare, hints={"groups": 4})
    with pytest.raises(CheckpointError, match=r"u\.pt: hints give n_groups='4', not a valid value"):
        C.load_checkpoint(bare, hints={"n_groups": "4"})
    assert C.load_checkpoint(bare, hints={"down_dims": [16, 32], "n_groups": 8}).config == config


def test_lerobot_folder_without_n_groups_uses_lerobots_default(tmp_path):
    config = CONFIGS["k3_film_2lvl"]
    folder = F.save_lerobot_folder(make_model(config), tmp_path / "policy", config)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["n_groups"]
    (folder / "config.json").write_text(json.dumps(cfg))
    loaded = C.load_checkpoint(folder)
    assert loaded.config == config and any("LeRobot's default 8" in n for n in loaded.notes)


if __name__ == "__main__":  # regenerate tests/data/unet1d_dp_dill_omegaconf.ckpt (needs dill and omegaconf)
    write_fixture()
