"""A/B/A in one process: HEAD (base) vs the working tree (tier 2 asks L2 for the next group's slice before its store
pass), on tier-2 plans with more groups than slots (and B = 1 controls), cold, us; parity of every run vs fp64."""
import importlib
from pathlib import Path
import torch
import dpk, dpk.build
from dpk.timing import Timer, TimingConfig
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
new = fused.extension()
base = dpk.build.cuda_extension("dpk_gn_mish_base", (Path(".whl/ab_base/gn_mish_binding.cpp"), Path(".whl/ab_base/gn_mish.cu")))
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.2))
T = fused.Tuning
plans = [((8, 2048, 4096, "bfloat16"), {}), ((8, 2048, 4096, "bfloat16"), {"t2": 1, "t2_ctas": 8}),
         ((8, 2048, 4096, "bfloat16"), {"t2": 1, "t2_ctas": 6}), ((8, 2048, 4096, "bfloat16"), {"t2": 1, "t2_ctas": 16}),
         ((8, 2048, 4096, "float16"), {}), ((8, 2048, 4096, "float32"), {}),
         ((8, 2048, 4096, "float32"), {"t2": 1, "t2_ctas": 16}), ((8, 2048, 4096, "float32"), {"t2": 1, "t2_ctas": 12}),
         ((16, 1024, 2048, "float32"), {"t2": 1}), ((8, 2048, 1024, "float32"), {"t2": 1}),
         ((1, 2048, 1024, "float32"), {}), ((1, 2048, 4096, "bfloat16"), {})]
for (B, C, L, dt), knobs in plans:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    x, g, b, G, eps = inputs
    kn = T(**knobs).as_list()
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    cfg = {"base": base, "new": new}
    err = {k: ((e.forward(x, g, b, G, eps, kn).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
           for k, e in cfg.items()}
    res = {k: [] for k in cfg}
    for order in (list(cfg), list(cfg)[::-1], list(cfg)):
        for k in order:
            e = cfg[k]
            res[k].append(timer.measure(lambda: e.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    p = dict(new.plan(x, G, kn))
    med = {k: sorted(v)[1] for k, v in res.items()}
    print(f"{case.name:16} {dt:8} {str(knobs):28} t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} "
          f"st{p['stash']} g{p['grid']} | " + "  ".join(f"{k} " + "/".join(f"{v:7.2f}" for v in res[k]) for k in cfg)
          + f" | new/base {med['new'] / med['base']:.3f} | err/tol {err['base']:.3f} {err['new']:.3f}", flush=True)
