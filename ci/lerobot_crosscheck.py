"""Cross-check dpk's LeRobot observation side against LeRobot's own source, without installing LeRobot.

    PYTHONPATH=$PWD python3 ci/lerobot_crosscheck.py LEROBOT/src/lerobot/policies/diffusion/modeling_diffusion.py

Needs torch, torchvision, numpy, safetensors and einops (LeRobot's encoder builds torchvision's resnet18, its
_prepare_global_conditioning rearranges with einops). Executes LeRobot's SpatialSoftmax, DiffusionRgbEncoder and
DiffusionModel._prepare_global_conditioning from that file (the rest of LeRobot is not imported), writes their
weights into a LeRobot folder, loads it with dpk (strict keys) and compares dpk's global conditioning with
LeRobot's, bitwise: one camera with GroupNorm and with BatchNorm (Push-T's shapes), two cameras with one shared
encoder and with one per camera. Exit 1 on any difference.
"""
from __future__ import annotations

import importlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import einops
import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn

from dpk import registry

registry.load([Path(__file__).resolve().parent.parent / "kernels"], strict=True)
E = importlib.import_module("dpk.families.policy._encoder")
L = importlib.import_module("dpk.families.policy._observation")
OF = importlib.import_module("dpk.families.policy._observation_formats")
U = importlib.import_module("dpk.families.unet1d._unet")
UF = importlib.import_module("dpk.families.unet1d._checkpoint_formats")


def get_output_shape(module: nn.Module, input_shape: tuple) -> tuple:
    """lerobot/policies/utils.py's, which DiffusionRgbEncoder calls for its feature map's shape."""
    with torch.inference_mode():
        return tuple(module(torch.zeros(size=input_shape)).shape)


def lerobot_namespace(source: Path) -> dict:
    src = source.read_text()
    ns = {"torch": torch, "nn": nn, "F": F, "np": np, "Tensor": Tensor, "torchvision": torchvision,
          "Callable": Callable, "einops": einops, "get_output_shape": get_output_shape, "DiffusionConfig": object,
          "OBS_STATE": "observation.state", "OBS_IMAGES": "observation.images",
          "OBS_ENV_STATE": "observation.environment_state"}
    exec(src[src.index("class DiffusionModel"):src.index("class DiffusionSinusoidalPosEmb")], ns)  # LeRobot's classes
    return ns


def randomize(module: nn.Module, g: torch.Generator) -> None:
    """Norm affines and BatchNorm statistics away from their init, so that a misplaced tensor shows."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.GroupNorm, nn.BatchNorm2d)):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))


def check(ns: dict, norm: str, cameras: list[str], separate: bool, size: int, crop: int, keypoints: int,
          folder: Path, g: torch.Generator) -> bool:
    cfg = SimpleNamespace(resize_shape=None, crop_shape=(crop, crop), crop_is_random=True, vision_backbone="resnet18",
                          pretrained_backbone_weights=None, use_group_norm=norm == "group",
                          image_features={k: SimpleNamespace(shape=(3, size, size)) for k in cameras},
                          spatial_softmax_num_keypoints=keypoints, use_separate_rgb_encoder_per_camera=separate,
                          env_state_feature=None)
    torch.manual_seed(0)
    rgb = nn.ModuleList([ns["DiffusionRgbEncoder"](cfg) for _ in cameras]) if separate else \
        ns["DiffusionRgbEncoder"](cfg)
    randomize(rgb, g)
    rgb.eval()
    sd = {OF.LEROBOT_ENCODER + k: v for k, v in rgb.state_dict().items()}
    ours = E.EncoderConfig.lerobot(image_shape=(3, size, size), crop_shape=(crop, crop), keypoints=keypoints,
                                   n_cameras=len(cameras), separate=separate, norm=norm)
    unet = U.build(U.UNetConfig(input_dim=2, global_cond_dim=ours.cond_dim, diffusion_step_embed_dim=16,
                                down_dims=(16, 32), kernel_size=3, n_groups=8, cond_predict_scale=True), 3)
    extra = OF.lerobot_encoder_config(ours)
    extra["input_features"] = {**{k: {"type": "VISUAL", "shape": [3, size, size]} for k in cameras},
                               "observation.state": {"type": "STATE", "shape": [2]}}
    side = L.load_observation_side(UF.save_lerobot_folder(unet, folder, unet.cfg, config_extra=extra, encoder=sd))
    images = torch.rand(3, 2, len(cameras), 3, size, size, generator=g)
    state = torch.rand(3, 2, 2, generator=g) * 2 - 1
    with torch.no_grad():
        want = ns["DiffusionModel"]._prepare_global_conditioning(
            SimpleNamespace(config=cfg, rgb_encoder=rgb), {"observation.state": state, "observation.images": images})
        got = side.encoder(images if len(cameras) > 1 else images[:, :, 0], state)
    same = torch.equal(got, want)
    print(f"{norm} norm, {len(cameras)} camera(s), {'one encoder per camera' if separate else 'one shared encoder'}: "
          f"{len(sd)} tensors loaded strictly; global_cond {tuple(got.shape)}; bitwise equal to LeRobot's: {same} "
          f"(max |difference| {float((got - want).abs().max()):.3g})")
    return same


def main() -> int:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():
        print(__doc__)
        return 2
    ns = lerobot_namespace(Path(sys.argv[1]))
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, einops {einops.__version__}")
    g = torch.Generator().manual_seed(1)
    two = ["observation.images.front", "observation.images.wrist"]
    cases = [("group", ["observation.image"], False, 96, 84, 32), ("batch", ["observation.image"], False, 96, 84, 32),
             ("group", two, False, 44, 40, 4), ("batch", two, True, 44, 40, 4)]
    with tempfile.TemporaryDirectory() as tmp:
        ok = [check(ns, *case, Path(tmp) / str(i), g) for i, case in enumerate(cases)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
