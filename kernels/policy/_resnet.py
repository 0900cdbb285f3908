"""ResNet-18 as Diffusion Policy's image encoders build it: torchvision's resnet18(weights=None), `fc` replaced by
Identity, every BatchNorm2d replaced by GroupNorm(C // 16, C) (upstream diffusion_policy `get_resnet` +
`replace_submodules` with `use_group_norm`; LeRobot's DiffusionRgbEncoder with `use_group_norm`), or BatchNorm2d
kept (`norm="batch"`: LeRobot's default, evaluated with its running statistics). `features` is the trunk up to
layer4's map, which LeRobot's encoder pools with its SpatialSoftmax instead of the global average.

Written here rather than imported from torchvision so that the observation side needs only torch (torchvision's
compiled ops must match the installed torch build exactly). It reproduces torchvision's module tree, so the state
dict keys are the same (`conv1.weight`, `bn1.weight`, `layer2.0.downsample.1.bias`, ...), and its initialisation:
modules are constructed in torchvision's order (a block's downsample before the block, `fc` last) so that, from
the same RNG state, every tensor gets the value torchvision's would.
"""
from __future__ import annotations

import torch
from torch import nn

FEATURE_DIM = 512  # layer4's channels: global average pooling gives one 512-vector per image
WIDTHS = (64, 128, 256, 512)
BLOCKS = (2, 2, 2, 2)  # BasicBlocks per stage: resnet18
TORCHVISION_CLASSES = 1000  # the fc that torchvision builds (and upstream then drops): it draws from the RNG


NORMS = ("group", "batch")


def group_norm(channels: int) -> nn.GroupNorm:
    """Upstream's BatchNorm2d replacement: groups of 16 channels."""
    return nn.GroupNorm(num_groups=channels // 16, num_channels=channels)


def norm_layer(kind: str, channels: int) -> nn.Module:
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
    return group_norm(channels) if kind == "group" else nn.BatchNorm2d(channels)


def conv_output_size(size: int) -> int:
    """layer4's height (or width) for an input of `size`: conv1 and maxpool, then three stride-2 stages."""
    size = (size + 2 * 3 - 7) // 2 + 1
    for _ in range(4):  # maxpool (3, 2, 1) and layer2..4's first 3x3 convs (stride 2, padding 1)
        size = (size + 2 - 3) // 2 + 1
    return size


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: conv3x3-norm-relu-conv3x3-norm, plus the (downsampled) input, relu."""

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(norm, planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm_layer(norm, planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """(N, 3, H, W) -> (N, 512): the trunk, global average pool, flatten; `fc` is Identity."""

    def __init__(self, norm: str = "group") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, WIDTHS[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = norm_layer(norm, WIDTHS[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = WIDTHS[0]
        for i, (planes, blocks) in enumerate(zip(WIDTHS, BLOCKS)):
            stride = 1 if i == 0 else 2
            downsample = None
            if stride != 1 or inplanes != planes:  # built before its block, as torchvision's _make_layer does
                downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                           norm_layer(norm, planes))
            layers = [BasicBlock(inplanes, planes, stride, downsample, norm)]
            layers += [BasicBlock(planes, planes, 1, None, norm) for _ in range(1, blocks)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*layers))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        nn.Linear(FEATURE_DIM, TORCHVISION_CLASSES)  # torchvision's fc: built (drawing its init) then dropped
        self.fc = nn.Identity()
        for m in self.modules():  # torchvision's init loop
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.GroupNorm, nn.BatchNorm2d)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) -> layer4's (N, 512, h, w) map (h = conv_output_size(H))."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(self.features(x)), 1))
