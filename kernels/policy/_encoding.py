"""The encoder stage of a chunk: which observation encoder a case names, built once per device.

`encoder: none` (the default): the chunk starts from the global conditioning. `encoder: resnet18_gn`: Diffusion
Policy's image encoder (_encoder.py) runs first, on the (normalised) observation; `lerobot_resnet18_gn` /
`lerobot_resnet18_bn`: LeRobot's (SpatialSoftmax keypoints, GroupNorm or BatchNorm ResNet);
`robomimic_resnet18_gn` / `robomimic_resnet18_bn`: Diffusion Policy's hybrid image policy (robomimic's VisualCore,
64 features). Weights come from the case's checkpoint (load_observation_side: an error with the reason when it holds
none) or are seeded (`weights_seed`), with `image_size`, `crop`, `n_obs_steps`, `keypoints`, `cameras`, `separate`
from the case (Push-T's 96, 84 (76 for robomimic's), 2, 32, one camera by default). The U-Net's global_cond_dim
must be the encoder's width: n_obs_steps x (512 + 2) for Diffusion Policy's, n_obs_steps x (2 + cameras x 2
keypoints) for LeRobot's, n_obs_steps x (64 + 2) for robomimic's (132 on Push-T for both).
"""
from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpk.lru import LRU

from ..unet1d._net import weights_key
from ._encoder import EncoderConfig, ObsEncoder

ENCODERS = ("none", "resnet18_gn", "lerobot_resnet18_gn", "lerobot_resnet18_bn", "robomimic_resnet18_gn",
            "robomimic_resnet18_bn")
# every variant runs the PyTorch encoder, so its convs are TF32 wherever cuDNN's default allows it
ENCODER_COMPUTE = "tf32" if torch.backends.cudnn.allow_tf32 else "float32"


class Encoder:
    """One encoder on one device: the float32 module the variants run, its float64 copy for the oracle, and the
    module under torch.compile for kernels_loop."""

    def __init__(self, module: ObsEncoder, device: torch.device, label: str):
        self.module = module.to(device).eval().requires_grad_(False)
        self.label, self.device = label, device
        self._ref: ObsEncoder | None = None
        self._compiled: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    @property
    def config(self) -> EncoderConfig:
        return self.module.config

    def __call__(self, image: torch.Tensor, agent_pos: torch.Tensor) -> torch.Tensor:
        return self.module(image, agent_pos)

    def compiled(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The module under torch.compile (Inductor, static shapes, one graph): each normalisation with its ReLU
        (and residual add) one generated kernel instead of ~4, the convs still cuDNN's, in the same TF32. Its first
        call per input shape compiles (seconds), so callers make it before any graph capture. Where Inductor has no
        backend for the device (a CUDA device without Triton), the module itself."""
        if self._compiled is None:
            no_triton = self.device.type == "cuda" and importlib.util.find_spec("triton") is None
            self._compiled = self.module if no_triton else torch.compile(self.module, fullgraph=True, dynamic=False)
        return self._compiled

    def reference(self, image: torch.Tensor, agent_pos: torch.Tensor) -> torch.Tensor:
        if self._ref is None:
            ref = ObsEncoder(self.config, seed=0)
            ref.load_state_dict(self.module.state_dict())
            self._ref = ref.to(self.device, torch.float64).eval().requires_grad_(False)
        with torch.no_grad():
            return self._ref(image, agent_pos)

    def check(self, image: object, agent_pos: object, batch: int, where: str) -> None:
        for name, t in (("image", image), ("agent_pos", agent_pos)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{where}: {name} must be a tensor, got {type(t).__name__}")
        cfg = self.config
        want = (batch, *cfg.input_shape)
        if tuple(image.shape) != want:
            raise ValueError(f"{where}: image must be {want}, got {tuple(image.shape)}")
        if tuple(agent_pos.shape) != (batch, cfg.n_obs_steps, cfg.low_dim):
            raise ValueError(f"{where}: agent_pos must be ({batch}, {cfg.n_obs_steps}, {cfg.low_dim}), got "
                             f"{tuple(agent_pos.shape)}")

    def conv_lengths(self) -> list[int]:
        """Reduction length of every conv output (in_channels x kernel area), for the rounding estimate."""
        return [m.in_channels * m.kernel_size[0] * m.kernel_size[1] for m in self.module.modules()
                if isinstance(m, nn.Conv2d)]

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())

    def random_observation(self, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A normalised observation: images and agent positions ~ U(-1, 1) (Push-T's normalisers map to it)."""
        cfg = self.config
        image = torch.rand(batch, *cfg.input_shape, generator=gen) * 2 - 1
        return image, torch.rand(batch, cfg.n_obs_steps, cfg.low_dim, generator=gen) * 2 - 1


# each a ResNet-18 (~45 MB) on its device; one evicted is rebuilt the same (seeded, or loaded again from its checkpoint)
KEEP = 8  # encoders kept
_encoders: LRU[Encoder] = LRU(KEEP)


def _config(params: Mapping[str, Any]) -> EncoderConfig:
    name = params["encoder"]
    size, crop = int(params.get("image_size", 96)), params.get("crop", 76 if name.startswith("robomimic_") else 84)
    kw = {"image_shape": (3, size, size), "crop_shape": None if crop is None else (int(crop), int(crop)),
          "n_obs_steps": int(params.get("n_obs_steps", 2))}
    if name.startswith("robomimic_"):
        cameras = int(params.get("cameras", 1))
        return EncoderConfig.robomimic(norm="group" if name.endswith("_gn") else "batch",
                                       keypoints=int(params.get("keypoints", 32)), n_cameras=cameras,
                                       separate=cameras > 1, **kw)
    if name.startswith("lerobot_"):
        return EncoderConfig.lerobot(norm="group" if name.endswith("_gn") else "batch",
                                     keypoints=int(params.get("keypoints", 32)),
                                     n_cameras=int(params.get("cameras", 1)), separate=bool(params.get("separate")),
                                     **kw)
    cameras = int(params.get("cameras", 1))
    return EncoderConfig(n_cameras=cameras, separate=cameras > 1 and bool(params.get("separate", True)), **kw)


def _make_encoder(name: str, wkey: tuple, params: Mapping[str, Any], dev: torch.device) -> Encoder:
    """The encoder of `wkey` (a checkpoint's, or seeded weights) on `dev`."""
    if wkey[0] == "checkpoint" and dev.type != "meta":
        from ._observation import load_observation_side

        side = load_observation_side(Path(wkey[1]))
        if side.encoder is None:
            raise ValueError(f"policy: encoder {name}: {wkey[1]} holds no usable encoder ({side.encoder_reason})")
        if side.encoder.config.name != name:
            raise ValueError(f"policy: encoder {name}: {wkey[1]} holds a {side.encoder.config.name} encoder")
        module, label = side.encoder, f"{side.source}:{side.weights}"
    else:  # seeded weights (a checkpoint's, on the meta device, have the same shapes: ResNet-18's)
        with torch.device("meta") if dev.type == "meta" else contextlib.nullcontext():
            module = ObsEncoder(_config(params), seed=int(wkey[1]) if wkey[0] == "random" else 0)
        label = f"random({wkey[1]})"
    return Encoder(module, dev, label)


def encoder_for(params: Mapping[str, Any], global_cond_dim: int, device: torch.device | None) -> Encoder | None:
    """The case's encoder stage on `device` (None: on the meta device, for the work model), or None."""
    name = params.get("encoder", "none")
    if name not in ENCODERS:
        raise ValueError(f"policy: unknown encoder {name!r}; known: {', '.join(ENCODERS)}")
    if name == "none":
        return None
    dev = torch.device("meta") if device is None else torch.device(device)
    wkey = weights_key(params)
    key = (wkey, None if wkey[0] == "checkpoint" else _config(params), str(dev))
    enc = _encoders.get_or_make(key, lambda: _make_encoder(name, wkey, params, dev))
    if dev.type != "meta" and enc.config.cond_dim != global_cond_dim:
        raise ValueError(f"policy: the encoder gives {enc.config.cond_dim} features ({enc.config.n_obs_steps} frames "
                         f"x {enc.config.frame_dim}), the U-Net takes global_cond_dim {global_cond_dim}")
    return enc
