"""Default plans of every sweep and Push-T case (and the rule's probe shapes) before (.whl/ab_base, HEAD's planner) and
after (the tree); then the rule's shapes timed default vs t2 = -1 on this device."""
import importlib
from pathlib import Path
import torch
import dpk, dpk.build
from dpk.timing import Timer, TimingConfig
from dpk.runner import Session
reg = dpk.registry.load([Path("kernels")], strict=True)
fused = importlib.import_module("dpk.families.gn_mish.fused")
new = fused.extension()
old = dpk.build.cuda_extension("dpk_gn_mish_base", (Path(".whl/ab_base/gn_mish_binding.cpp"), Path(".whl/ab_base/gn_mish.cu")))
T = fused.Tuning
shapes = set()
runner = Session()
for suite in runner.suite_names():
    for case in runner.cases("gn_mish", suite):
        p = dict(case.params)
        shapes.add((p["B"], p["C"], p["L"], p.get("G", 8), case.dtype))
print(len(shapes), "suite shapes")
key = lambda p: (p["tier"], p["cluster"], p["threads"], p["items"], p["chunks"], p["stash"], p["grid"])  # noqa: E731
for B, C, L, G, dt in sorted(shapes):
    x = torch.empty(B, C, L, device="cuda", dtype=getattr(torch, dt))
    a, b = dict(old.plan(x, G, T().as_list())), dict(new.plan(x, G, T().as_list()))
    print(f"b{B}_c{C}_l{L}_g{G} {dt:8} {'same' if key(a) == key(b) else 'CHANGED'} {key(a)} -> {key(b)}", flush=True)

probe = [(3, 1024, 4096, "float32"), (4, 1024, 4096, "float32"), (4, 256, 4096, "float32"), (4, 1024, 2048, "bfloat16"),
         (6, 1024, 2048, "bfloat16"), (12, 1024, 2048, "bfloat16"), (16, 1024, 2048, "bfloat16"), (1, 1024, 1024, "float32"),
         (5, 1024, 4096, "bfloat16"), (2, 2048, 4096, "bfloat16")]
timer = Timer(torch.device("cuda"), TimingConfig(budget_s=0.2))
fam = reg.family("gn_mish")
for B, C, L, dt in probe:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, torch.device("cuda"))
    a, n = dict(old.plan(x, G, T().as_list())), dict(new.plan(x, G, T().as_list()))
    res = {k: [] for k in ("new", "old")}
    for _ in range(3):
        for k, e in (("new", new), ("old", old)):
            res[k].append(timer.measure(lambda: e.forward(x, g, b, G, eps, T().as_list()), "cold").stats.median * 1e6)
    m = {k: sorted(v)[1] for k, v in res.items()}
    print(f"probe {case.name:16} {dt:8} old {key(a)} {m['old']:7.2f} | new {key(n)} resident {n['resident_ctas']} {m['new']:7.2f} | new/old {m['new'] / m['old']:.3f}", flush=True)
