"""Where tier 3's time goes: a copy of the kernels (.whl/ab_trace, made from gn_mish_spread-trace-experiment.patch)
stamps %globaltimer per CTA (entry, requests issued, per group: piece landed, slot published, statistics collected;
storer warp 0: staging done, per group statistics seen and stores issued; departure). After an L2 flush, one launch;
us from the earliest entry, p50 and max over CTAs, median of 7 launches. Also the tier's and the default plan's cold
time from the timing engine."""
import importlib
from pathlib import Path

import torch

import dpk
import dpk.build
from dpk.timing import Timer, TimingConfig

reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
ext = dpk.build.cuda_extension("dpk_gn_mish_trace", (Path(".whl/ab_trace/gn_mish_binding.cpp"),
                                                     Path(".whl/ab_trace/gn_mish.cu")))
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning
flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
names = {0: "entry", 1: "requested", 43: "staged", 42: "departed"}
for g in range(8):
    names.update({2 + g: f"landed{g}", 10 + g: f"published{g}", 18 + g: f"collected{g}", 26 + g: f"ready{g}",
                  34 + g: f"stored{g}"})
order = [0, 1, 43] + [i for g in range(8) for i in (2 + g, 10 + g, 18 + g, 26 + g, 34 + g)] + [42]
for B, C, L, dt in [(1, 2048, 1024, "float32"), (1, 2048, 4096, "bfloat16"), (1, 1024, 1024, "float32")]:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    configs = {"default": {}, "t3": {"t3": 1}, "t3,d2": {"t3": 1, "t3_depth": 2}, "t3,d3": {"t3": 1, "t3_depth": 3},
               "t3,d4": {"t3": 1, "t3_depth": 4}}
    res = {k: [] for k in configs}
    for sequence in (list(configs), list(configs)[::-1], list(configs)):
        for k in sequence:
            kn = T(**configs[k]).as_list()
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    print(f"{case.name} {dt}: cold us " + "  ".join(f"{k} {sorted(v)[1]:.2f}" for k, v in res.items()))
    for label in ("t3", "t3,d2"):
        kn = T(**configs[label]).as_list()
        ctas = dict(ext.plan(x, G, kn))["grid"]
        runs = []
        for _ in range(7):
            flush.zero_()
            torch.cuda.synchronize()
            ext.forward(x, g, b, G, eps, kn)
            torch.cuda.synchronize()
            t = ext.trace()[:ctas].double()
            t0 = t[:, 0].min()
            runs.append((t - t0) / 1000.0)
        stack = torch.stack(runs)  # runs x ctas x stamps
        p50 = stack.median(dim=1).values.median(dim=0).values
        mx = stack.max(dim=1).values.median(dim=0).values
        print(f"  {label} stamps p50/max us: " + "  ".join(f"{names[i]} {p50[i]:.2f}/{mx[i]:.2f}" for i in order),
              flush=True)
