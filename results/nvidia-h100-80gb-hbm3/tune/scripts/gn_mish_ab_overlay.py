"""The fused kernel as committed (knob sets of KNOBSETS with argv[1] = none), or against a copy of kernels/gn_mish with the files of an overlay folder (argv[1], e.g.
.whl/exp1 holding patched headers; the patch is kept next to this script) laid over it, built as a second extension.
Same process, cold, A/B/A/B/A order (medians of five; range in brackets), us; each knob set on both builds; parity of both vs fp64; the
same-size copy timed alike. argv[2:]: shape filter (substrings of the case names), default all."""
import importlib
import shutil
import sys
from pathlib import Path

import torch

import dpk
import dpk.build
from dpk.timing import Timer, TimingConfig
from dpk.timing_aids import size_matched_copies

KDIR = Path("kernels/gn_mish").resolve()
OVERLAY = sys.argv[1] != "none"  # "none": the committed build only, knob sets from KNOBSETS[argv[2]]
if OVERLAY:
    patched = Path("/tmp/gn_overlay")
    shutil.rmtree(patched, ignore_errors=True)
    shutil.copytree(KDIR, patched)
    for f in Path(sys.argv[1]).resolve().iterdir():
        shutil.copy(f, patched / f.name)
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
base = fused.extension()
new = (dpk.build.cuda_extension("dpk_gn_mish_overlay", (patched / "gn_mish_binding.cpp", patched / "gn_mish.cu"))
       if OVERLAY else None)
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning
shapes = [(1, 2048, 4096, "float16"), (1, 256, 1024, "float32"), (1, 512, 1024, "float32"), (1, 1024, 1024, "float32"),
          (1, 2048, 1024, "float32"), (1, 1024, 1024, "bfloat16"), (1, 2048, 4096, "bfloat16"),
          (8, 256, 1024, "float32"), (8, 512, 1024, "float32"), (64, 512, 1024, "float32"),
          (64, 512, 1024, "bfloat16"), (8, 2048, 4096, "bfloat16"), (64, 256, 256, "float32"),
          (8, 1024, 1024, "float32"), (1, 512, 4096, "float32")]
KNOBSETS = {  # per shape substring: knob sets (argv[1] == "none"); the first is the base of the ratios
    "b1_c256_l1024 float32": {"": {}, ",t3": {"t3": 1}, ",t128": {"t1_threads": 128}, ",smem1": {"t1_smem": 1},
                              ",smem2": {"t1_smem": 2}},
    "b1_c512_l1024 float32": {"": {}, ",t3": {"t3": 1}, ",t256": {"t1_threads": 256},
                              ",t256i8": {"t1_threads": 256, "t1_items": 8}, ",t1024": {"t1_threads": 1024}},
    "b1_c1024_l1024 float32": {"": {}, ",t3": {"t3": 1}, ",t256": {"t1_threads": 256},
                               ",t512i4": {"t1_threads": 512, "t1_items": 4}},
    "b1_c512_l4096 float32": {"": {}, ",t3off": {"t3": -1}, ",c64": {"t3_ctas": 64}},
    "b1_c2048_l4096 bfloat16": {"": {}, ",t3off": {"t3": -1}, ",c64": {"t3_ctas": 64}},
}
only = sys.argv[2:]
knobsets = {"": {}, ",i4": {"t1_items": 4}, ",c128": {"t3_ctas": 128}}
ROUNDS = 5  # A/B/A/B/A: medians of five, all five printed


def cold(fn) -> float:
    return timer.measure(fn, "cold").stats.median * 1e6


for B, C, L, dt in shapes:
    name = f"b{B}_c{C}_l{L}"
    if only and not any(o in f"{name} {dt}" for o in only):
        continue
    if not OVERLAY:
        knobsets = next((v for k, v in KNOBSETS.items() if k == f"{name} {dt}"), None)
        if knobsets is None:
            continue
    case = dpk.make_case("gn_mish", name, dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    x, g, b, G, eps = inputs
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    memcpy, ewcopy = size_matched_copies(2 * x.numel() * x.element_size(), dev)
    fns, errs, plans = {}, {}, {}
    for tag, kn in knobsets.items():
        k = T(**kn).as_list()
        p = dict(base.plan(x, G, k))
        if tag and OVERLAY and p == dict(base.plan(x, G, T().as_list())) and p == dict(new.plan(x, G, k)):
            continue  # the knob set changes nothing here
        plans[tag] = f"t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']}"
        for ename, e in (("base", base), ("new", new)) if OVERLAY else (("base", base),):
            fns[ename + tag] = (lambda e=e, k=k: e.forward(x, g, b, G, eps, k))
            errs[ename + tag] = ((e.forward(x, g, b, G, eps, k).double() - ref).abs()
                                 / (tol.atol + tol.rtol * ref.abs())).max().item()
    res = {k: [] for k in fns}
    for r in range(ROUNDS):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[k].append(cold(fns[k]))
    for r in range(ROUNDS):  # the copies, same rounds count
        for k, c in (("memcpy", memcpy), ("ewcopy", ewcopy)):
            res.setdefault(k, []).append(cold(c))
    med = {k: sorted(v)[ROUNDS // 2] for k, v in res.items()}
    copies = " ".join(f"{k} {med[k]:.2f} [{min(res[k]):.2f}-{max(res[k]):.2f}]" for k in ("memcpy", "ewcopy"))
    copy = min(med.pop("memcpy"), med.pop("ewcopy"))
    cells = " | ".join(f"{k} {v:6.2f} ({v / med['base']:.3f}, {100 * copy / v:.1f}%) [{min(res[k]):.2f}-{max(res[k]):.2f}]"
                       for k, v in med.items())
    plan_text = "; ".join(f"{k or 'default'}: {v}" for k, v in plans.items())
    print(f"{name:15} {dt:8} [{plan_text}] {copies} | {cells} | err/tol max "
          f"{max(errs.values()):.3f}", flush=True)
