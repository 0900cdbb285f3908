"""Every CUDA kernel file compiles with plain `nvcc -c` for sm_90, without torch headers (CPU CI can check it) and
within its kernels' register-spill budgets; every family's extension lists sources that exist and names its module
TORCH_EXTENSION_NAME."""
from __future__ import annotations

import importlib
import re
import shutil
import subprocess

import pytest

from dpk.build import nvcc_path
from dpk.registry import load

from ._helpers import ptxas_build
from .conftest import ROOT

SOURCES = sorted((ROOT / "kernels").glob("*/*.cu"))
BINDINGS = sorted((ROOT / "kernels").glob("*/binding.cpp"))


# Bytes of register spill stores per kernel (ptxas -v, -O3, sm_90, nvcc 13.0) where there are any; every other kernel
# spills nothing. A change that makes a kernel spill more fails here, on any machine with nvcc: spills cost what
# they store and reload on the critical path (a 1/n written through a helper with a division path made unet1d's
# 64-register kernels spill up to 1.5 KB, and a forward 9-11 % slower). Another nvcc may move these: re-read them.
SPILL_BUDGET = {
    "unet1d/unet1d.cu": {
        "unet1d_op_kernel<32, 2, 512, 2>": 264, "unet1d_op_kernel<32, 1, 512, 2>": 12,
        "unet1d_op_kernel<16, 4, 512, 2>": 24, "unet1d_op_kernel<16, 2, 512, 2>": 24,
        "unet1d_op_kernel<16, 1, 512, 2>": 12,
    },
    "gn_mish/gn_mish.cu": {
        "gn_mish_persistent_kernel<float, 1, 8>": 24, "gn_mish_persistent_kernel<float, 4, 4>": 24,
        "gn_mish_persistent_kernel<__half, 1, 8>": 12, "gn_mish_persistent_kernel<__nv_bfloat16, 1, 8>": 12,
        "gn_mish_persistent_kernel<__half, 8, 4>": 72, "gn_mish_persistent_kernel<__nv_bfloat16, 8, 4>": 72,
        "gn_mish_grid_kernel<__half, 8, 8, false, false, false>": 8,
        "gn_mish_grid_kernel<__nv_bfloat16, 8, 8, false, false, false>": 8,
    },
}


def spill_stores(ptxas_log: str) -> dict[str, int]:
    """{kernel: bytes of spill stores} from `-Xptxas -v` output, names demangled without namespaces or parameters."""
    found: dict[str, int] = {}
    entry = None
    for line in ptxas_log.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            entry = m.group(1)
        elif (m := re.search(r"(\d+) bytes spill stores", line)) and entry:
            found[entry] = int(m.group(1))
            entry = None
    names = subprocess.run(["c++filt"], input="\n".join(found), capture_output=True, text=True, check=True).stdout
    bare = [re.sub(r"^void |\(anonymous namespace\)::|\w+::detail::", "", n) for n in names.splitlines()]
    short = [n[:n.index("(")] if "(" in n else n for n in bare]  # the template arguments, not the parameters
    assert len(set(short)) == len(found), f"kernel names collide once shortened: {short}"
    return dict(zip(short, found.values()))


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("source", SOURCES, ids=[f"{p.parent.name}/{p.name}" for p in SOURCES])
def test_compiles_for_sm90_without_torch(source):
    """Compiles, and no kernel spills more registers than SPILL_BUDGET allows it."""
    proc = ptxas_build(source)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if shutil.which("c++filt") is None:
        pytest.skip("c++filt (binutils) not installed: spills not checked")
    spills = spill_stores(proc.stderr)
    assert spills, "ptxas -v reported no kernels"
    budget = SPILL_BUDGET.get(f"{source.parent.name}/{source.name}", {})
    assert set(budget) <= set(spills), f"SPILL_BUDGET names kernels that no longer exist: {set(budget) - set(spills)}"
    over = {k: f"{v} B > {budget.get(k, 0)} B" for k, v in spills.items() if v > budget.get(k, 0)}
    assert not over, f"kernels spill more registers than before: {over}"


KERNEL_FILES = SOURCES + sorted(p for ext in ("cuh", "h") for p in (ROOT / "kernels").glob(f"*/*.{ext}"))


@pytest.mark.parametrize("path", KERNEL_FILES, ids=[f"{p.parent.name}/{p.name}" for p in KERNEL_FILES])
def test_kernel_files_keep_torch_out(path):
    """Kernel files and their headers include no torch header: `nvcc -c` checks them on any machine."""
    text = path.read_text()
    assert "torch/" not in text and "ATen/" not in text, f"{path.name} includes torch headers"


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
