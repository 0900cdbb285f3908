"""Knob sets on the B = 1 shapes after the one-way cluster exchange (tier 1 vs tier 2), cold, interleaved x3."""
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
sets = {"default": T(), "t1": T(t2=-1), "t1,1024": T(t2=-1, t1_threads=1024), "t1,k16,256": T(t2=-1, t1_threads=256),
        "t1,k16,512": T(t2=-1, t1_threads=512), "t2": T(t2=1), "t2,256": T(t2=1, t1_threads=256),
        "t1,smem": T(t2=-1, t1_smem=1), "t1,256,smem2": T(t2=-1, t1_threads=256, t1_smem=2)}
for B, C, L, dt in [(1, 512, 1024, "float32"), (1, 1024, 1024, "float32"), (1, 2048, 1024, "float32"),
                    (1, 512, 4096, "float32"), (1, 2048, 4096, "bfloat16"), (1, 2048, 4096, "float32")]:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    plans, uniq = {}, {}
    for k, t in sets.items():
        p = dict(ext.plan(x, G, t.as_list()))
        key = tuple(sorted(p.items()))
        if key not in plans.values():
            plans[k] = key
            uniq[k] = (t.as_list(), p)
    res = {k: [] for k in uniq}
    for order in (list(uniq), list(uniq)[::-1], list(uniq)):
        for k in order:
            kn = uniq[k][0]
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    print(f"{case.name} {dt}: " + " | ".join(
        f"{k} t{uniq[k][1]['tier']} {uniq[k][1]['cluster']}x{uniq[k][1]['threads']} ch{uniq[k][1]['chunks']}"
        f"{' sm' if uniq[k][1]['smem_slice'] else ''} {sorted(v)[1]:.2f}" for k, v in res.items()), flush=True)
