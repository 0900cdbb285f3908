"""ResNet-18 as Diffusion Policy's image encoder builds it: torchvision's resnet18(weights=None), `fc` replaced by
Identity, every BatchNorm2d replaced by GroupNorm(C // 16, C) (upstream diffusion_policy `get_resnet` +
`replace_submodules` with `use_group_norm`).

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


def group_norm(channels: int) -> nn.GroupNorm:
    """Upstream's BatchNorm2d replacement: groups of 16 channels."""
    return nn.GroupNorm(num_groups=channels // 16, num_channels=channels)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: conv3x3-norm-relu-conv3x3-norm, plus the (downsampled) input, relu."""

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = group_norm(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = group_norm(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """(N, 3, H, W) -> (N, 512): the trunk, global average pool, flatten; `fc` is Identity."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, WIDTHS[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = group_norm(WIDTHS[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = WIDTHS[0]
        for i, (planes, blocks) in enumerate(zip(WIDTHS, BLOCKS)):
            stride = 1 if i == 0 else 2
            downsample = None
            if stride != 1 or inplanes != planes:  # built before its block, as torchvision's _make_layer does
                downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                           group_norm(planes))
            layers = [BasicBlock(inplanes, planes, stride, downsample)]
            layers += [BasicBlock(planes, planes, 1, None) for _ in range(1, blocks)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*layers))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        nn.Linear(FEATURE_DIM, TORCHVISION_CLASSES)  # torchvision's fc: built (drawing its init) then dropped
        self.fc = nn.Identity()
        for m in self.modules():  # torchvision's init loop
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.GroupNorm):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
