"""The round-balance rule (gn_mish_plan.cuh balance_rounds) on every shape whose default plan it changes, beyond the
suite (B 1..64, C 256..2048, L 256..4096, G = 8): the new default against the L2 rule's S (t2 = 1, t2_ctas = old S,
otherwise the same plan), interleaved in one process, cold, us; parity vs fp64. Old S per L2 size from the host planner
(60 MB: H200, 50 MB: H100)."""
import importlib
from pathlib import Path
import torch
import dpk
from dpk.timing import Timer, TimingConfig
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
dev = torch.device("cuda")
l2 = torch.cuda.get_device_properties(dev).L2_cache_size
print("#", torch.cuda.get_device_name(dev), "L2", l2)
both = [(3, 2048, 4096, 4, 8), (5, 1024, 4096, 4, 4), (5, 2048, 2048, 4, 4), (5, 2048, 4096, 4, 8), (6, 1024, 4096, 4, 4),
        (6, 2048, 2048, 4, 4), (6, 2048, 4096, 4, 8), (12, 2048, 4096, 4, 8), (24, 2048, 4096, 4, 8), (64, 2048, 4096, 4, 8)]
changed = both + ([(5, 2048, 4096, 8, 4), (6, 2048, 4096, 8, 4)] if l2 > 55 << 20 else
                  [(8, 2048, 4096, 8, 5), (5, 2048, 4096, 8, 5), (6, 2048, 4096, 8, 5)])
timer = Timer(dev, TimingConfig(budget_s=0.12))
for B, C, L, vec, old_s in changed:
    dt = "float32" if vec == 4 else "bfloat16"
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    tun = {"new": fused.Tuning(), "old": fused.Tuning(t2=1, t2_ctas=old_s)}
    plans = {k: fused.fused_plan(x, G, t) for k, t in tun.items()}
    ref = fam.reference(x.double(), g.double(), b.double(), G, eps) if B <= 24 else None
    tol = fam.tolerance(case, "float32")
    err = max(((fused.fused_gn_mish(x, g, b, G, eps, t).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
              for t in tun.values()) if ref is not None else float("nan")
    del ref
    res = {k: [] for k in tun}
    for order in ("new", "old"), ("old", "new"), ("new", "old"):
        for k in order:
            res[k].append(timer.measure(lambda: fused.fused_gn_mish(x, g, b, G, eps, tun[k]), "cold").stats.median * 1e6)
    med = {k: sorted(v)[1] for k, v in res.items()}
    desc = {k: f"S={p['cluster']} ch{p['chunks']} st{p['stash']} g{p['grid']} rounds {-(-B * 8 // (p['grid'] // p['cluster']))}"
            for k, p in plans.items()}
    print(f"{case.name:16} {dt:8} old {desc['old']:34} {med['old']:8.2f} | new {desc['new']:34} {med['new']:8.2f} | "
          f"new/old {med['new'] / med['old']:.3f} | err/tol {err:.3f}", flush=True)
    torch.cuda.empty_cache()
