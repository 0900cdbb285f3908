"""The keypoint image encoders after their crop: ResNet-18 trunk -> SpatialSoftmax keypoints -> Linear -> ReLU.

What LeRobot's encoder computes (policies/diffusion/modeling_diffusion.py), eval, on a cropped (N, 3, h, w) image:
  - `backbone`: torchvision's resnet18 children[:-2] (GroupNorm(C // 16) with use_group_norm, else BatchNorm):
    layer4's (N, 512, h', w') map;
  - `pool.nets` Conv2d(512, K, 1) maps it to K keypoint maps;
  - softmax over each map's h' w' positions, then the expected position under it: attention (N K, h' w') @ pos_grid
    (h' w', 2), pos_grid[i * w' + j] = (x_j, y_i) with x, y numpy's linspace(-1, 1, w' or h') rounded to float32 (a
    persistent buffer, so a checkpoint carries it); -> (N, K, 2) flattened to (N, 2K): x0, y0, x1, y1, ...;
  - `out` Linear(2K, 2K), then ReLU: 2K features per image (64 with LeRobot's 32 keypoints).
Keys under the encoder's prefix (`diffusion.rgb_encoder.`, or `.<camera>.` with one encoder per camera):
`backbone.*`, `pool.nets.{weight,bias}`, `pool.pos_grid`, `out.{weight,bias}`. The backbone is a Sequential, so its
keys are numbered where ResNet18's are named (`backbone.0` conv1, `backbone.1` bn1, `backbone.4`..`7` layer1..4):
`lerobot_encoder_key` maps them.

robomimic's VisualCore (ResNet18Conv, SpatialSoftmax, Flatten, Linear; robomimic 0.2.0, which Diffusion Policy's
DiffusionUnetHybridImagePolicy pins) computes the same up to two details: its SpatialSoftmax divides the maps by a
`temperature` buffer before the softmax and sums `pos_x * attention` and `pos_y * attention` over the positions
(buffers (1, h' w'), the same float32 grid) instead of a matmul; and its Linear maps 2K to `feature_dimension` (64),
the ReLU being its ObservationEncoder's activation. `head="robomimic"` builds that form (`RobomimicSoftmax`);
`robomimic_encoder_keys` gives its two key paths (VisualCore registers its backbone and pool both by name and inside
`nets`, so a checkpoint holds each tensor twice).
"""
from __future__ import annotations

import torch
from torch import nn

from ._resnet import FEATURE_DIM, ResNet18

RESNET_TO_LEROBOT = {"conv1": "0", "bn1": "1", "layer1": "4", "layer2": "5", "layer3": "6", "layer4": "7"}


def resnet_to_lerobot_key(key: str) -> str:
    """`layer1.0.conv1.weight` (ResNet18's names) -> `4.0.conv1.weight` (LeRobot's Sequential of resnet18's
    children[:-2]: conv1, bn1, relu, maxpool, layer1..4)."""
    head, _, rest = key.partition(".")
    return f"{RESNET_TO_LEROBOT[head]}.{rest}"


def lerobot_encoder_key(key: str, separate: bool = False) -> str:
    """ObsEncoder's key (layout "lerobot": `rgb.<i>.<RgbEncoder key>`) -> the key under LeRobot's encoder prefix:
    `rgb.0.backbone.layer1.0.bn1.weight` -> `backbone.4.0.bn1.weight` (one shared encoder) or
    `0.backbone.4.0.bn1.weight` (one per camera), `rgb.1.pool.nets.weight` -> `1.pool.nets.weight`."""
    rgb, i, rest = key.split(".", 2)
    if rgb != "rgb" or (i != "0" and not separate):
        raise KeyError(key)
    if rest.startswith("backbone."):
        rest = "backbone." + resnet_to_lerobot_key(rest[len("backbone."):])
    return f"{i}.{rest}" if separate else rest


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


class RobomimicSoftmax(nn.Module):
    """robomimic 0.2.0's SpatialSoftmax, eval, without variance output: (N, C, h, w) -> (N, K, 2)."""

    def __init__(self, h: int, w: int, keypoints: int, channels: int = FEATURE_DIM, temperature: float = 1.0):
        super().__init__()
        self.h, self.w, self.keypoints = h, w, keypoints
        self.nets = nn.Conv2d(channels, keypoints, kernel_size=1)
        self.register_buffer("temperature", torch.ones(1) * temperature)
        grid = position_grid(h, w)
        self.register_buffer("pos_x", grid[:, 0].reshape(1, h * w).clone())
        self.register_buffer("pos_y", grid[:, 1].reshape(1, h * w).clone())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        attention = torch.softmax(self.nets(features).reshape(-1, self.h * self.w) / self.temperature, dim=-1)
        x = torch.sum(self.pos_x * attention, dim=1, keepdim=True)
        y = torch.sum(self.pos_y * attention, dim=1, keepdim=True)
        return torch.cat([x, y], 1).view(-1, self.keypoints, 2)


# VisualCore's modules under both of their names: (ours, robomimic's in `nets`, robomimic's by attribute)
ROBOMIMIC_PATHS = (("backbone.", "nets.0.nets.", "backbone.nets."), ("pool.", "nets.1.", "pool."),
                   ("out.", "nets.3.", None))


def robomimic_encoder_keys(key: str) -> tuple[int, tuple[str, ...]]:
    """ObsEncoder's key (layout "robomimic": `rgb.<camera>.<RgbEncoder key>`) -> (camera, its paths under that
    camera's `obs_nets.<rgb key>.`): `rgb.0.backbone.layer1.0.bn1.weight` -> (0, (`nets.0.nets.4.0.bn1.weight`,
    `backbone.nets.4.0.bn1.weight`)); `rgb.1.out.weight` -> (1, (`nets.3.weight`,))."""
    rgb, i, rest = key.split(".", 2)
    if rgb != "rgb" or not i.isdigit():
        raise KeyError(key)
    for ours, in_nets, by_name in ROBOMIMIC_PATHS:
        if rest.startswith(ours):
            tail = rest[len(ours):]
            tail = resnet_to_lerobot_key(tail) if ours == "backbone." else tail
            return int(i), (in_nets + tail,) + ((by_name + tail,) if by_name else ())
    raise KeyError(key)


class RgbEncoder(nn.Module):
    """A cropped (N, 3, h, w) image -> features: LeRobot's DiffusionRgbEncoder without its crop (ObsEncoder's
    transform crops; 2K features), or with `head="robomimic"` robomimic's VisualCore and the ReLU after it
    (`out_dim` features). Built in their order: the ResNet, then `pool`, then `out`."""

    def __init__(self, norm: str, h: int, w: int, keypoints: int, head: str = "lerobot", out_dim: int | None = None):
        super().__init__()
        self.backbone = ResNet18(norm)
        self.pool = RobomimicSoftmax(h, w, keypoints) if head == "robomimic" else SpatialSoftmax(h, w, keypoints)
        self.out = nn.Linear(2 * keypoints, out_dim or 2 * keypoints)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.out(torch.flatten(self.pool(self.backbone.features(x)), start_dim=1)))
