"""Helpers shared by the family tests: the GPU-test marker, the U-Net walk of suites/pusht_unet.py, host builds
of tests/cuda/, the kernel files' ptxas reports."""
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
