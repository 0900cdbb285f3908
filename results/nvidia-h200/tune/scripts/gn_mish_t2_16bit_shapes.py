"""16-bit shapes around bf16 b16_c1024_l2048: the default plan against tier 2 at S = 1, 2 and the rule's S, cold, us
(medians of three interleaved rounds); parity vs fp64 of each."""
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
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning
sets = {"default": {}, "t2": {"t2": 1}, "t2,s1": {"t2": 1, "t2_ctas": 1}, "t2,s2": {"t2": 1, "t2_ctas": 2}}
for B in (8, 16, 32, 64):
    for C in (512, 1024, 2048):
        for L in (1024, 2048, 4096):
            if B * C * L * 2 > 600e6:
                continue
            case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", "bfloat16", B=B, C=C, L=L, G=8)
            x, g, b, G, eps = fam.make_inputs(case, dev)
            res = {k: [] for k in sets}
            plans = {k: dict(ext.plan(x, G, T(**kn).as_list())) for k, kn in sets.items()}
            for _ in range(3):
                for k, kn in sets.items():
                    if plans[k]["tier"] != 2 and k != "default":
                        continue
                    kl = T(**kn).as_list()
                    res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, kl), "cold").stats.median * 1e6)
            base = sorted(res["default"])[1]
            row = []
            for k in sets:
                p = plans[k]
                if res[k]:
                    row.append(f"{k} t{p['tier']} {p['cluster']}x{p['threads']} ch{p['chunks']} st{p['stash']} {sorted(res[k])[1]:7.2f} ({sorted(res[k])[1] / base:.3f})")
            print(f"{case.name:16} " + " | ".join(row), flush=True)
