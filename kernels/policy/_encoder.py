"""Diffusion Policy's image observation encoder at inference: observation frames -> the U-Net's global_cond.

    enc = ObsEncoder(EncoderConfig())                   # Push-T image: 2 frames of (3, 96, 96) + agent_pos (2)
    global_cond = enc(image, agent_pos)                 # (B, 2, 3, 96, 96), (B, 2, 2) -> (B, 1028)

What upstream diffusion_policy computes for DiffusionUnetImagePolicy.predict_action with obs_as_global_cond and a
MultiImageObsEncoder holding one rgb key and one low-dim key, in eval mode:
  - frames flattened: (B, n_obs, ...) -> (B * n_obs, ...), frame t of sample b at row b * n_obs + t;
  - the image transform Sequential(resize, crop randomizer, imagenet normalize): no resize here (NOTES.md);
    CropRandomizer in eval takes torchvision's center crop (top = round((H - h) / 2), Python's round); with
    random_crop False upstream applies no crop at all (its CenterCrop is assigned and then overwritten), which a
    config expresses as crop_shape None; imagenet_norm subtracts ImageNet's mean and divides by its std;
  - ResNet-18 with GroupNorm (_resnet.py) -> 512 features per frame;
  - features of rgb keys first, then low-dim keys, each group in sorted key order: cat(image 512, agent_pos 2);
  - reshape (B * n_obs, 514) -> (B, n_obs * 514): frame 0's features, then frame 1's.
The inputs are the normalised observations (the policy's LinearNormalizer runs before the encoder: _normalizer.py).
forward has no host syncs and no data-dependent branches, so it can be captured in a CUDA graph and compiled
whole; the checks read shapes, dtypes and devices only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._resnet import FEATURE_DIM, ResNet18

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # upstream's imagenet_norm: torchvision Normalize with these
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class EncoderConfig:
    """One camera and one low-dim observation per frame; defaults are Push-T image's."""

    image_shape: tuple[int, int, int] = (3, 96, 96)  # (C, H, W) of one frame
    crop_shape: tuple[int, int] | None = (84, 84)  # eval-time center crop; None: the full image
    n_obs_steps: int = 2
    low_dim: int = 2  # agent_pos
    feature_dim: int = FEATURE_DIM  # per image: ResNet-18's 512, the only backbone here
    imagenet_norm: bool = False
    rgb_key: str = "image"  # names in the checkpoint (state-dict keys, normalizer fields)
    low_dim_key: str = "agent_pos"

    def __post_init__(self) -> None:
        c, h, w = self.image_shape
        if c != 3 or h < 1 or w < 1:
            raise ValueError(f"image_shape must be (3, H, W) with H, W >= 1, got {self.image_shape}")
        if self.crop_shape is not None and not (1 <= self.crop_shape[0] <= h and 1 <= self.crop_shape[1] <= w):
            raise ValueError(f"crop_shape {self.crop_shape} does not fit in the image's (H, W) = {(h, w)}")
        if self.n_obs_steps < 1 or self.low_dim < 0:
            raise ValueError(f"n_obs_steps must be >= 1 and low_dim >= 0, got {self.n_obs_steps}, {self.low_dim}")
        if self.feature_dim != FEATURE_DIM:
            raise ValueError(f"feature_dim {self.feature_dim}: only ResNet-18's {FEATURE_DIM} is implemented")

    @property
    def frame_dim(self) -> int:
        """Features of one frame: image features then the low-dim vector."""
        return self.feature_dim + self.low_dim

    @property
    def cond_dim(self) -> int:
        """The U-Net's global_cond_dim: n_obs_steps frames of frame_dim."""
        return self.n_obs_steps * self.frame_dim


def center_crop_box(height: int, width: int, crop: tuple[int, int] | None) -> tuple[int, int, int, int]:
    """(top, left, h, w) of torchvision's center_crop: top = round((H - h) / 2), halves to even (Python's round)."""
    if crop is None:
        return 0, 0, height, width
    return round((height - crop[0]) / 2.0), round((width - crop[1]) / 2.0), crop[0], crop[1]


class ObsEncoder(nn.Module):
    """(image (B, n_obs, 3, H, W), agent_pos (B, n_obs, low_dim)) -> global_cond (B, n_obs * (512 + low_dim)).

    `seed` initialises the backbone as torchvision does after torch.manual_seed(seed) (the global RNG is left as it
    was); None draws from the global RNG. State-dict keys are `backbone.<torchvision resnet18 key>`.
    """

    def __init__(self, config: EncoderConfig | None = None, seed: int | None = 0):
        super().__init__()
        self.config = config or EncoderConfig()
        if seed is None:
            self.backbone = ResNet18()
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.backbone = ResNet18()
        _, h, w = self.config.image_shape
        self._crop = center_crop_box(h, w, self.config.crop_shape)
        self.register_buffer("imagenet_mean", torch.tensor(IMAGENET_MEAN).view(3, 1, 1), persistent=False)
        self.register_buffer("imagenet_std", torch.tensor(IMAGENET_STD).view(3, 1, 1), persistent=False)
        self.eval()

    @property
    def cond_dim(self) -> int:
        return self.config.cond_dim

    def transform(self, images: torch.Tensor) -> torch.Tensor:
        """Upstream's eval-time image transform of (N, 3, H, W) frames: center crop, then imagenet_norm."""
        top, left, h, w = self._crop
        x = images[:, :, top:top + h, left:left + w]
        if self.config.imagenet_norm:
            x = (x - self.imagenet_mean) / self.imagenet_std
        return x

    def forward(self, image: torch.Tensor, agent_pos: torch.Tensor) -> torch.Tensor:
        self.check_inputs(image, agent_pos)
        b, n = image.shape[:2]
        feats = self.backbone(self.transform(image.reshape(b * n, *image.shape[2:])))
        low = agent_pos.reshape(b * n, self.config.low_dim)
        frames = torch.cat([feats, low], dim=-1)  # rgb keys first, then low-dim
        return frames.reshape(b, n * self.config.frame_dim)

    def check_inputs(self, image: torch.Tensor, agent_pos: torch.Tensor) -> None:
        """ValueError naming the expected and the received shape / dtype / device."""
        cfg, weight = self.config, self.backbone.conv1.weight
        _check("image", image, ("B", cfg.n_obs_steps, *cfg.image_shape), weight)
        _check("agent_pos", agent_pos, ("B", cfg.n_obs_steps, cfg.low_dim), weight)
        if agent_pos.shape[0] != image.shape[0]:
            raise ValueError(f"agent_pos has batch {agent_pos.shape[0]} but image has {image.shape[0]} "
                             f"(image {tuple(image.shape)}, agent_pos {tuple(agent_pos.shape)})")


def _check(name: str, x: torch.Tensor, expected: tuple, weight: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    shape = tuple(x.shape)
    if len(shape) != len(expected) or shape[0] < 1 or shape[1:] != expected[1:]:
        raise ValueError(f"{name} must have shape ({', '.join(map(str, expected))}), got {shape}")
    if x.dtype != weight.dtype:
        raise ValueError(f"{name} must be {weight.dtype} like the encoder's weights, got {x.dtype}")
    if x.device != weight.device:
        raise ValueError(f"{name} is on {x.device} but the encoder is on {weight.device}")
