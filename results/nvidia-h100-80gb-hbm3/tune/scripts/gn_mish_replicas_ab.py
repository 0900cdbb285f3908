"""Replicated clusters (t1_replicas = 2) and the four-at-once mish reciprocal (overlay argv[1], e.g. .whl/exp_quad), in
one process, cold, A/B/A/B/A (medians of five, range in brackets), us. Knob sets per shape on both builds: the default,
r2 (two clusters per group), r2p1 (r2 with at most one CTA per SM), p1 (one CTA per SM alone). Per row: parity of
every build x knob set vs fp64 (err/tol), whether r2 is bit-identical to the default of its build, the plans with
their resident CTAs, and the same-size copies timed alike. argv[2:]: shape filter (substrings), default all.
Runs with gn_mish_replicas-experiment.patch applied (the t1_replicas knob; rejected, not in the kernel).
"""
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
patched = Path("/tmp/gn_overlay")
shutil.rmtree(patched, ignore_errors=True)
shutil.copytree(KDIR, patched)
for f in Path(sys.argv[1]).resolve().iterdir():
    shutil.copy(f, patched / f.name)
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
base = fused.extension()
new = dpk.build.cuda_extension("dpk_gn_mish_overlay", (patched / "gn_mish_binding.cpp", patched / "gn_mish.cu"))
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning
shapes = [(1, 256, 1024, "float32"), (1, 512, 1024, "float32"), (1, 1024, 1024, "float32"),
          (1, 1024, 1024, "bfloat16"), (1, 256, 256, "float32"), (1, 2048, 1024, "float32"),
          (1, 512, 4096, "float32"), (8, 256, 1024, "float32"), (64, 512, 1024, "float32"),
          (64, 512, 1024, "bfloat16"), (8, 2048, 4096, "bfloat16"), (8, 2048, 4096, "float32")]
KNOBSETS = {"": {}, ",r2": {"t1_replicas": 2}, ",r2p1": {"t1_replicas": 2, "t1_ctas_per_sm": 1},
            ",p1": {"t1_ctas_per_sm": 1}}
only = sys.argv[2:]
ROUNDS = 5


def cold(fn) -> float:
    return timer.measure(fn, "cold").stats.median * 1e6


for B, C, L, dt in shapes:
    name = f"b{B}_c{C}_l{L}"
    if only and not any(o in f"{name} {dt}" for o in only):
        continue
    case = dpk.make_case("gn_mish", name, dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    x, g, b, G, eps = inputs
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    memcpy, ewcopy = size_matched_copies(2 * x.numel() * x.element_size(), dev)
    fns, errs, plans, same = {}, {}, {}, []
    default_plan = dict(base.plan(x, G, T().as_list()))
    for tag, kn in KNOBSETS.items():
        k = T(**kn).as_list()
        p = dict(base.plan(x, G, k))
        if tag and p == default_plan:
            continue  # the knob set changes nothing here
        plans[tag] = (f"t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} r{p['replicas']} "
                      f"grid {p['grid']} res {p['resident_ctas']}")
        for ename, e in (("base", base), ("new", new)):
            fns[ename + tag] = (lambda e=e, k=k, i=inputs: e.forward(*i, k))
            out = e.forward(x, g, b, G, eps, k)
            errs[ename + tag] = ((out.double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
            if tag == ",r2":
                same.append(f"{ename} r2==default {torch.equal(out, e.forward(x, g, b, G, eps, T().as_list()))}")
    res = {k: [] for k in fns}
    for r in range(ROUNDS):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[k].append(cold(fns[k]))
    for _ in range(ROUNDS):
        for k, c in (("memcpy", memcpy), ("ewcopy", ewcopy)):
            res.setdefault(k, []).append(cold(c))
    med = {k: sorted(v)[ROUNDS // 2] for k, v in res.items()}
    copies = " ".join(f"{k} {med[k]:.2f} [{min(res[k]):.2f}-{max(res[k]):.2f}]" for k in ("memcpy", "ewcopy"))
    copy = min(med.pop("memcpy"), med.pop("ewcopy"))
    cells = " | ".join(f"{k} {v:6.2f} ({v / med['base']:.3f}, {100 * copy / v:.1f}%) "
                       f"[{min(res[k]):.2f}-{max(res[k]):.2f}]" for k, v in med.items())
    plan_text = "; ".join(f"{k or 'default'}: {v}" for k, v in plans.items())
    err_text = " ".join(f"{k}={v:.3f}" for k, v in errs.items())
    print(f"{name:15} {dt:8} [{plan_text}] {copies} | {cells} | err/tol {err_text} | {'; '.join(same)}", flush=True)
