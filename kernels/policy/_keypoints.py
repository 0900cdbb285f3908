"""LeRobot's image-feature head: ResNet-18's layer4 map -> SpatialSoftmax keypoints -> Linear -> ReLU.

What LeRobot's DiffusionRgbEncoder computes after its backbone (policies/diffusion/modeling_diffusion.py), eval:
  - `pool.nets` Conv2d(512, K, 1) maps the (N, 512, h, w) map to K keypoint maps;
  - softmax over each map's h * w positions, then the expected position under it: attention (N K, h w) @ pos_grid
    (h w, 2), pos_grid[i * w + j] = (x_j, y_i) with x, y numpy's linspace(-1, 1, w or h) rounded to float32 (a
    persistent buffer, so a checkpoint carries it); -> (N, K, 2) flattened to (N, 2K): x0, y0, x1, y1, ...;
  - `out` Linear(2K, 2K), then ReLU: 2K features per image (64 with LeRobot's 32 keypoints).
Keys under the encoder's prefix: `pool.nets.{weight,bias}`, `pool.pos_grid`, `out.{weight,bias}`; the backbone is
torchvision's resnet18 children [:-2] in a Sequential, so its keys are numbered where ResNet18's are named
(`backbone.0` conv1, `backbone.1` bn1, `backbone.4`..`7` layer1..4): `lerobot_backbone_key` maps them.
"""
from __future__ import annotations

import torch
from torch import nn

from ._resnet import FEATURE_DIM

LEROBOT_BACKBONE = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}


def lerobot_backbone_key(key: str) -> str:
    """`4.0.conv1.weight` (LeRobot's Sequential) -> `layer1.0.conv1.weight` (ResNet18's names); KeyError otherwise."""
    head, _, rest = key.partition(".")
    return f"{LEROBOT_BACKBONE[head]}.{rest}"


def resnet_to_lerobot_key(key: str) -> str:
    head, _, rest = key.partition(".")
    return f"{dict(zip(LEROBOT_BACKBONE.values(), LEROBOT_BACKBONE))[head]}.{rest}"


def lerobot_encoder_key(key: str) -> str:
    """ObsEncoder's key (layout "lerobot") -> the key under LeRobot's encoder prefix: `backbone.layer1.0.bn1.weight`
    -> `backbone.4.0.bn1.weight`, `head.pool.nets.weight` -> `pool.nets.weight`, `head.out.bias` -> `out.bias`."""
    if key.startswith("backbone."):
        return "backbone." + resnet_to_lerobot_key(key[len("backbone."):])
    if key.startswith("head."):
        return key[len("head."):]
    raise KeyError(key)


def linspace_like_numpy(n: int) -> torch.Tensor:
    """numpy.linspace(-1, 1, n) in float64: start + i * step, the last point exactly 1 (torch.linspace's float32
    points can differ in the last bit, which LeRobot notes changes a trained policy's success rate)."""
    if n == 1:
        return torch.tensor([-1.0], dtype=torch.float64)
    y = torch.arange(n, dtype=torch.float64) * (2.0 / (n - 1)) - 1.0
    y[-1] = 1.0
    return y


def position_grid(h: int, w: int) -> torch.Tensor:
    """(h w, 2) float32: (x, y) of each position of an h x w map, row-major, as np.meshgrid(x, y) lays them out."""
    x, y = linspace_like_numpy(w), linspace_like_numpy(h)
    return torch.stack([x.repeat(h), y.repeat_interleave(w)], dim=1).float()


class SpatialSoftmax(nn.Module):
    """(N, C, h, w) -> (N, K, 2): each keypoint map's softmax-weighted mean position."""

    def __init__(self, h: int, w: int, keypoints: int, channels: int = FEATURE_DIM):
        super().__init__()
        self.h, self.w, self.keypoints = h, w, keypoints
        self.nets = nn.Conv2d(channels, keypoints, kernel_size=1)
        self.register_buffer("pos_grid", position_grid(h, w))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        maps = self.nets(features).reshape(-1, self.h * self.w)
        attention = torch.softmax(maps, dim=-1)
        return (attention @ self.pos_grid).view(-1, self.keypoints, 2)


class KeypointHead(nn.Module):
    """layer4's map -> 2K image features: SpatialSoftmax, flatten, Linear(2K, 2K), ReLU (LeRobot's `pool`, `out`)."""

    def __init__(self, h: int, w: int, keypoints: int):
        super().__init__()
        self.pool = SpatialSoftmax(h, w, keypoints)
        self.out = nn.Linear(2 * keypoints, 2 * keypoints)
        self.relu = nn.ReLU()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.relu(self.out(torch.flatten(self.pool(features), start_dim=1)))
