"""Same process, cold, us: the default plan vs tier 2 forced (t2 = 1, its S rule), now that multi-round tier-2
plans load their stashed slots with evict_first; fp32 shapes that the default rule keeps on tier 1."""
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
shapes = [(16, 1024, 2048, "float32"), (8, 2048, 1024, "float32"), (8, 512, 4096, "float32"), (8, 1024, 1024, "float32"),
          (64, 1024, 1024, "float32"), (64, 2048, 1024, "float32"), (16, 1024, 2048, "bfloat16"), (8, 2048, 4096, "float32")]
configs = {"default": {}, "t2": {"t2": 1}, "t2,s=4": {"t2": 1, "t2_ctas": 4}}
for B, C, L, dt in shapes:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    res = {k: [] for k in configs}
    for order in (list(configs), list(configs)[::-1], list(configs)):
        for k in order:
            kn = T(**configs[k]).as_list()
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    med = {k: sorted(v)[1] for k, v in res.items()}
    plans = {k: dict(ext.plan(x, G, T(**v).as_list())) for k, v in configs.items()}
    desc = {k: f"t{p['tier']} {p['cluster']}x{p['threads']} ch{p['chunks']} st{p['stash']} g{p['grid']}" for k, p in plans.items()}
    print(f"{case.name:16} {dt:8} | " + " | ".join(f"{k} [{desc[k]}] " + "/".join(f"{v:7.2f}" for v in res[k])
          + f" ({med[k] / med['default']:.3f})" for k in configs), flush=True)
