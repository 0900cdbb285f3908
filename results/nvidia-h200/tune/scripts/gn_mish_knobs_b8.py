"""Knob sets on bf16 b8_c2048_l4096 at HEAD, cold, A/B/A-style medians (three rounds over the sets), us."""
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
sets = {"default": {}, "i8": {"t1_items": 8}, "s5": {"t2_ctas": 5}, "s6": {"t2_ctas": 6}, "s3": {"t2_ctas": 3},
        "st12": {"t1_stash": 12}, "st10": {"t1_stash": 10}, "s4,768": {"t2_ctas": 4, "t1_threads": 768},
        "s8,512": {"t2_ctas": 8, "t1_threads": 512}, "s6,i8": {"t2_ctas": 6, "t1_items": 8}}
for dt in ("bfloat16", "float32"):
    case = dpk.make_case("gn_mish", "b8_c2048_l4096", dt, B=8, C=2048, L=4096, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    res = {k: [] for k in sets}
    for _ in range(3):
        for k, kn in sets.items():
            kl = T(**kn).as_list()
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, kl), "cold").stats.median * 1e6)
    base = sorted(res["default"])[1]
    for k, kn in sets.items():
        p = dict(ext.plan(x, G, T(**kn).as_list()))
        print(f"{dt:8} {k:10} t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} st{p['stash']} g{p['grid']} | "
              + "/".join(f"{v:7.2f}" for v in res[k]) + f" ({sorted(res[k])[1] / base:.3f})", flush=True)
