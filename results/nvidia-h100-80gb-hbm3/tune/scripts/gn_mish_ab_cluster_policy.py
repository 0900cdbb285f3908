"""Tier-1 cluster plans with the launch's cluster scheduling policy preference (DPK_GN_CLUSTER_POLICY, read at each
launch by an experimental build: 0 = none given, 1 = spread, 2 = load balancing), same process, cold, us, A/B/A
order, the same-size copy timed in the same process, parity vs fp64 after timing."""
import importlib
import os
from pathlib import Path

import torch

import dpk
from dpk.timing import Timer, TimingConfig
from dpk.timing_aids import size_matched_copies

reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
ext = fused.extension()
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning
configs = {"default": ({}, 0), "spread": ({}, 1), "balance": ({}, 2),
           "t1=128": ({"t1_threads": 128}, 0), "t1=128,spread": ({"t1_threads": 128}, 1)}
shapes = [(1, 256, 1024, "float32"), (1, 512, 1024, "float32"), (1, 1024, 1024, "float32"),
          (8, 256, 1024, "float32"), (8, 512, 1024, "float32"), (8, 1024, 1024, "float32"),
          (64, 256, 256, "float32"), (16, 1024, 2048, "float32"), (1, 1024, 1024, "bfloat16"),
          (2, 1024, 1024, "float32")]
copies = {}
worst = 0.0
for B, C, L, dt in shapes:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = inputs = fam.make_inputs(case, dev)
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    nbytes = 2 * x.numel() * x.element_size()
    if nbytes not in copies:
        copies[nbytes] = min(timer.measure(c, "cold").stats.median for c in size_matched_copies(nbytes, dev)) * 1e6
    plans = {k: dict(ext.plan(x, G, T(**v).as_list())) for k, (v, _) in configs.items()}
    res = {k: [] for k in configs}
    for order in (list(configs), list(configs)[::-1], list(configs)):
        for k in order:
            kn, policy = T(**configs[k][0]).as_list(), configs[k][1]
            os.environ["DPK_GN_CLUSTER_POLICY"] = str(policy)
            res[k].append(timer.measure(lambda kn=kn, a=inputs: ext.forward(*a, kn), "cold").stats.median * 1e6)
    errs = []
    for v, policy in configs.values():
        os.environ["DPK_GN_CLUSTER_POLICY"] = str(policy)
        y = ext.forward(x, g, b, G, eps, T(**v).as_list()).double()
        errs.append(((y - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item())
    worst = max(worst, *errs)
    med = {k: sorted(v)[1] for k, v in res.items()}
    desc = {k: f"t{p['tier']} {p['cluster']}x{p['threads']} ch{p['chunks']} g{p['grid']}" for k, p in plans.items()}
    print(f"{case.name:16} {dt:8} copy {copies[nbytes]:7.2f} | " + " | ".join(
        f"{k} [{desc[k]}] {med[k]:7.2f} ({med[k] / med['default']:.3f}, {100 * copies[nbytes] / med[k]:.1f}%)"
        for k in configs) + f" | err/tol max {max(errs):.3f}", flush=True)
print(f"worst err/tol {worst:.3f}")
