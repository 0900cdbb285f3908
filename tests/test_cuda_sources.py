"""Every CUDA kernel file compiles with plain `nvcc -c` for sm_90, without torch headers (CPU CI can check it); every
family's extension lists sources that exist and names its module TORCH_EXTENSION_NAME."""
from __future__ import annotations

import importlib

import pytest

from dpk.build import nvcc_compile_check, nvcc_path
from dpk.registry import load

from .conftest import ROOT

SOURCES = sorted((ROOT / "kernels").glob("*/*.cu"))
BINDINGS = sorted((ROOT / "kernels").glob("*/binding.cpp"))


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("source", SOURCES, ids=[f"{p.parent.name}/{p.name}" for p in SOURCES])
def test_compiles_for_sm90_without_torch(source):
    text = source.read_text()
    assert "torch/" not in text and "ATen/" not in text, f"{source.name} includes torch headers"
    proc = nvcc_compile_check(source)
    assert proc.returncode == 0, proc.stderr[-3000:]


HEADERS = sorted(p for ext in ("cuh", "h") for p in (ROOT / "kernels").glob(f"*/*.{ext}"))


@pytest.mark.parametrize("header", HEADERS, ids=[f"{p.parent.name}/{p.name}" for p in HEADERS])
def test_headers_keep_torch_out(header):
    """The kernel files' headers (compiled by the check above through their .cu) include no torch header either."""
    text = header.read_text()
    assert "torch/" not in text and "ATen/" not in text, f"{header.name} includes torch headers"


def test_there_are_cuda_sources():
    assert SOURCES, "no kernels/*/*.cu found"


@pytest.mark.parametrize("binding", BINDINGS, ids=[p.parent.name for p in BINDINGS])
def test_binding_names_its_module_by_the_build(binding):
    """The build imports each extension under a name of its own, so two builds can load side by side."""
    assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in binding.read_text()


def test_extension_sources_exist():
    """cuda_variants.py of each family with a binding.cpp builds from it and kernel files that exist."""
    load([ROOT / "kernels"], strict=True)
    for binding in BINDINGS:
        sources = importlib.import_module(f"dpk.families.{binding.parent.name}.cuda_variants").SOURCES
        assert sources[0] == binding and all(s.exists() for s in sources), sources
