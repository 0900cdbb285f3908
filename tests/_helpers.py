"""Helpers shared by the family tests: the GPU-test marker, the U-Net walk of suites/pusht_unet.py, host builds
of tests/cuda/, the kernel files' ptxas reports, the policy encoders' ResNet-18 oracle."""
from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dpk.build import nvcc_compile_check, nvcc_path, shared_include_dir

ROOT = Path(__file__).resolve().parent.parent
CUDA_TESTS = ROOT / "tests" / "cuda"  # C++ test programs the family tests compile with nvcc


def gpu_test(fn):
    """GPU-only test: marked `gpu` (`pytest -m gpu` selects them), skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(fn))


@functools.cache
def ptxas_build(source: Path) -> subprocess.CompletedProcess:
    """`nvcc -c` of one kernel file for sm_90 with `-Xptxas -v` (each kernel's registers, spills, shared memory),
    once per test session: the compile check, the spill budgets and gn_mish's shared-memory bounds read one build."""
    return nvcc_compile_check(source, extra=("-Xptxas", "-v"))


def pusht_unet() -> types.ModuleType:
    """suites/pusht_unet.py, imported by path (it is a script beside the suites, not a package module)."""
    spec = importlib.util.spec_from_file_location("pusht_unet", ROOT / "suites" / "pusht_unet.py")
    unet = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = unet  # its dataclasses look their module up while the class is built
    spec.loader.exec_module(unet)
    return unet


def nvcc_build(out: Path, sources: Sequence[Path], flags: Sequence[str], family: str, timeout: int = 600
               ) -> subprocess.CompletedProcess:
    """nvcc `flags` `sources` -o `out`, seeing kernels/<family>/ and kernels/_cuda/ (as every build does); fails the
    test with the compiler's last lines when the build fails, else returns the finished compiler run."""
    cmd = [nvcc_path(), *flags, f"-I{ROOT / 'kernels' / family}", f"-I{shared_include_dir()}", *map(str, sources),
           "-o", str(out)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert build.returncode == 0, build.stderr[-3000:]
    return build


TORCHVISION_NAMES = ("conv1", "bn1", "layer1", "layer2", "layer3", "layer4")


def resnet18_oracle(w: dict[str, torch.Tensor], x: torch.Tensor, norm: str = "group",
                    names: Sequence[str] = TORCHVISION_NAMES) -> torch.Tensor:
    """torchvision resnet18's trunk (N, 3, H, W) -> layer4's map, functional, from the state dict `w` whose prefixes
    of conv1, bn1, layer1..4 are `names`; every BatchNorm2d as GroupNorm(C // 16, C) (upstream diffusion_policy's
    and LeRobot's use_group_norm) or, norm="batch", evaluated with its running statistics."""
    def nrm(x: torch.Tensor, p: str) -> torch.Tensor:
        if norm == "group":
            return F.group_norm(x, x.shape[1] // 16, w[p + ".weight"], w[p + ".bias"])
        return F.batch_norm(x, w[p + ".running_mean"], w[p + ".running_var"], w[p + ".weight"], w[p + ".bias"],
                            training=False, eps=1e-5)
    conv1, bn1, *layers = names
    x = F.max_pool2d(F.relu(nrm(F.conv2d(x, w[conv1 + ".weight"], stride=2, padding=3), bn1)), 3, 2, 1)
    for stage, layer in enumerate(layers):
        for block in range(2):
            p, stride = f"{layer}.{block}.", 2 if stage > 0 and block == 0 else 1
            out = F.relu(nrm(F.conv2d(x, w[p + "conv1.weight"], stride=stride, padding=1), p + "bn1"))
            out = nrm(F.conv2d(out, w[p + "conv2.weight"], padding=1), p + "bn2")
            if p + "downsample.0.weight" in w:
                x = nrm(F.conv2d(x, w[p + "downsample.0.weight"], stride=stride), p + "downsample.1")
            x = F.relu(out + x)
    return x


def randomized(module: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Norm affines (and BatchNorm's running statistics) random, so that a wrong grouping, a swapped tensor or
    batch statistics in place of the running ones show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (torch.nn.GroupNorm, torch.nn.BatchNorm2d)):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return module
