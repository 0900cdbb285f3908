"""A/B/A in one process: fused with mish2 (working tree) vs the HEAD kernel (pairless mish), default plans, cold."""
import importlib
import sys
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
timer = Timer(dev, TimingConfig(budget_s=float(sys.argv[1]) if len(sys.argv) > 1 else 0.2))
knobs = fused.Tuning().as_list()
shapes = [(64, 512, 1024, "bfloat16"), (64, 512, 1024, "float16"), (8, 2048, 4096, "bfloat16"), (1, 2048, 4096, "bfloat16"),
          (64, 512, 1024, "float32"), (8, 2048, 4096, "float32"), (1, 2048, 1024, "float32"), (8, 256, 1024, "float32"),
          (1, 256, 1024, "float32")]
for B, C, L, dt in shapes:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    cfg = {"mish2": new, "head": base}
    ref = base.forward(x, g, b, G, eps, knobs).float()
    res = {k: [] for k in cfg}
    for order in (list(cfg), list(cfg)[::-1], list(cfg)):
        for k in order:
            ext = cfg[k]
            out = ext.forward(x, g, b, G, eps, knobs)
            d = (out.float() - ref).abs().max().item()
            assert d < 0.05, (k, d)
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, knobs), "cold").stats.median * 1e6)
    print(f"b{B}_c{C}_l{L} {dt:8} " + "  ".join(f"{k} " + "/".join(f"{v:7.2f}" for v in res[k]) for k in cfg)
          + f"  maxdiff {d:.2e}", flush=True)
