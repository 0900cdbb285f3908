"""A/B/A in one process: tier 1 with the slice in registers (GN_SMEM=0) vs in shared memory via cp.async
(GN_SMEM=1: 256 x 6 launch bounds, 40 regs; 2: x 5, 48 regs). Same plan otherwise; cold; outputs compared bitwise."""
import importlib
import os
from pathlib import Path
import torch
import dpk, dpk.build
from dpk.timing import Timer, TimingConfig
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
ext = dpk.build.cuda_extension("dpk_gn_mish_exp", (Path(".whl/exp/gn_mish_binding.cpp"), Path(".whl/exp/gn_mish.cu")))
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.2))
T = fused.Tuning
shapes = [((64, 512, 1024, "bfloat16"), {}), ((64, 512, 1024, "float16"), {}), ((64, 512, 1024, "bfloat16"), {"t1_threads": 128}),
          ((64, 256, 1024, "float32"), {}), ((64, 512, 1024, "float32"), {}), ((64, 1024, 256, "float32"), {}),
          ((64, 256, 256, "float32"), {}), ((1, 256, 1024, "float32"), {}), ((1, 512, 1024, "float32"), {})]
for (B, C, L, dt), kn in shapes:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    knobs = T(**kn).as_list()
    plan = dict(ext.plan(x, G, knobs))
    os.environ["GN_SMEM"] = "0"
    ref = ext.forward(x, g, b, G, eps, knobs).float()
    res = {"0": [], "1": [], "4": []}
    diff = {}
    for order in (["0", "1", "4"], ["4", "1", "0"], ["0", "1", "4"]):
        for k in order:
            os.environ["GN_SMEM"] = k
            out = ext.forward(x, g, b, G, eps, knobs)
            diff[k] = (out.float() - ref).abs().max().item()
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, knobs), "cold").stats.median * 1e6)
    print(f"{case.name:16} {dt:8} {str(kn):40} t{plan['tier']} {plan['cluster']}x{plan['threads']} ch{plan['chunks']} "
          + "  ".join(f"smem{k} " + "/".join(f"{v:6.2f}" for v in res[k]) for k in res) + f"  diff {diff}", flush=True)
