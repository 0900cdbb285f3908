"""Build the fused extension (argv[1] == "base") or gn_mish_ab_overlay.py's overlay extension (argv[1] = the overlay
folder) ahead of the A/B, so that two device processes can compile them side by side; the A/B script then finds both
built (dpk.build caches by source hash)."""
import importlib
import shutil
import sys
from pathlib import Path

import dpk
import dpk.build

KDIR = Path("kernels/gn_mish").resolve()
if sys.argv[1] == "base":
    dpk.registry.load([Path("kernels")], strict=True)
    importlib.import_module("dpk.families.gn_mish.fused").extension()
else:
    patched = Path("/tmp/gn_overlay")
    shutil.rmtree(patched, ignore_errors=True)
    shutil.copytree(KDIR, patched)
    for f in Path(sys.argv[1]).resolve().iterdir():
        shutil.copy(f, patched / f.name)
    dpk.build.cuda_extension("dpk_gn_mish_overlay", (patched / "gn_mish_binding.cpp", patched / "gn_mish.cu"))
print("built", sys.argv[1], flush=True)
