"""Knob sets around the new 16-bit b8_c2048_l4096 default (tier 2, S = 4, half chunks), cold, A/B/A interleaved in one process, us."""
import importlib
from pathlib import Path
import torch
import dpk
from dpk.timing import Timer, TimingConfig
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
ext = fused.extension()
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.2))
T = fused.Tuning
sets = {"default": T(), "s4,st10": T(t2=1, t2_ctas=4, t1_stash=10), "s4,st-1": T(t2=1, t2_ctas=4, t1_stash=-1),
        "s4,i8": T(t2=1, t2_ctas=4, t1_items=8), "s8,t512": T(t2=1, t2_ctas=8, t1_threads=512),
        "s4,t512": T(t2=1, t2_ctas=4, t1_threads=512), "s2": T(t2=1, t2_ctas=2), "s3": T(t2=1, t2_ctas=3),
        "t1,16el": T(t2=-1, t1_items=4), "t1": T(t2=-1), "s4,cps1": T(t2=1, t2_ctas=4, t1_ctas_per_sm=1)}
for B, C, L, dt in [(8, 2048, 4096, "bfloat16")]:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    x, g, b, G, eps = inputs
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    uniq, desc = {}, {}
    for k, t in sets.items():
        p = dict(ext.plan(x, G, t.as_list()))
        key = tuple(sorted(p.items()))
        if key in uniq.values():
            continue
        uniq[k] = key
        desc[k] = f"t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} st{p['stash']} g{p['grid']}"
    err = {k: ((ext.forward(x, g, b, G, eps, sets[k].as_list()).double() - ref).abs()
               / (tol.atol + tol.rtol * ref.abs())).max().item() for k in uniq}
    res = {k: [] for k in uniq}
    for order in (list(uniq), list(uniq)[::-1], list(uniq)):
        for k in order:
            kn = sets[k].as_list()
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    med = {k: sorted(v)[1] for k, v in res.items()}
    for k in uniq:
        print(f"{case.name} {dt:8} {k:14} {desc[k]:34} " + "/".join(f"{v:7.2f}" for v in res[k])
              + f" ({med[k] / med['default']:.3f}) err {err[k]:.3f}", flush=True)
