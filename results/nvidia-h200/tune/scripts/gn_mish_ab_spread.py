"""Tier 3 (gn_mish_spread.cuh: every CTA holds a piece of every group, groups pipelined through the chip) against the
default plan, same process, cold, us, A/B/A order; the same-size copy timed in the same process; parity vs fp64
before and after timing (the slots must be back at zero after every launch), after tier-2 launches on the same
stream, and in a CUDA graph. Argument: quick (the issue's B = 1 misses, a few knob sets), knobs (more) or depth
(tier 3's request depth and group warps on the four shapes its default rule takes)."""
import importlib
import sys
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
mode = sys.argv[1] if len(sys.argv) > 1 else "quick"
t3 = {"t3": {"t3": 1}, "t3,r4": {"t3": 1, "t3_reducers": 4}, "t3,r12": {"t3": 1, "t3_reducers": 12},
      "t3,512t": {"t3": 1, "t1_threads": 512, "t3_reducers": 4}, "t3,64cta": {"t3": 1, "t3_ctas": 64}}
if mode == "quick":
    t3 = {k: t3[k] for k in ("t3", "t3,512t", "t3,64cta")}
if mode == "depth":
    t3 = {"d2": {"t3_depth": 2}, "d3": {"t3_depth": 3}, "d4": {"t3_depth": 4}, "r16": {"t3_reducers": 16},
          "t1=512": {"t1_threads": 512}}
shapes = [(1, 2048, 1024, "float32"), (1, 512, 4096, "float32"), (1, 1024, 1024, "float32"),
          (1, 2048, 4096, "bfloat16"), (1, 256, 1024, "float32"), (1, 512, 1024, "float32"),
          (1, 2048, 4096, "float16"), (2, 1024, 1024, "float32"), (4, 512, 1024, "float32"),
          (1, 2048, 4096, "float32"), (1, 512, 1001, "float32"), (1, 1024, 2000, "bfloat16")]
if mode == "depth":
    shapes = [(1, 2048, 4096, "bfloat16"), (1, 2048, 4096, "float16"), (1, 2048, 1024, "float32"),
              (1, 512, 4096, "float32")]


def error(x, g, b, G, eps, kn, ref, tol):
    y = ext.forward(x, g, b, G, eps, kn).double()
    return ((y - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()


copies = {}
worst = 0.0
for B, C, L, dt in shapes:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    x, g, b, G, eps = inputs
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    nbytes = 2 * x.numel() * x.element_size()
    if nbytes not in copies:
        copies[nbytes] = min(timer.measure(c, "cold").stats.median for c in size_matched_copies(nbytes, dev)) * 1e6
    configs = {"default": {}, **t3}
    plans = {k: dict(ext.plan(x, G, T(**v).as_list())) for k, v in configs.items()}
    errs = {k: error(x, g, b, G, eps, T(**v).as_list(), ref, tol) for k, v in configs.items()}
    res = {k: [] for k in configs}
    for order in (list(configs), list(configs)[::-1], list(configs)):
        for k in order:
            kn = T(**configs[k]).as_list()
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    after = {k: error(x, g, b, G, eps, T(**v).as_list(), ref, tol) for k, v in configs.items()}
    # tier 2 then tier 3 on the same stream (shared counters buffer), then tier 3 in a CUDA graph
    mixed = []
    for kn in (T(t2=1).as_list(), T(t3=1).as_list(), T(t2=1, t2_ctas=3).as_list(), T(t3=1).as_list()):
        mixed.append(error(x, g, b, G, eps, kn, ref, tol))
    graph = torch.cuda.CUDAGraph()
    kn3 = T(t3=1).as_list()
    ext.forward(x, g, b, G, eps, kn3)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        y_graph = ext.forward(x, g, b, G, eps, kn3)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    graph_err = ((y_graph.double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
    del ref
    worst = max(worst, *errs.values(), *after.values(), *mixed, graph_err)
    med = {k: sorted(v)[1] for k, v in res.items()}
    desc = {k: (f"t3 g{p['grid']} p{p['slice_vecs']} r{p['reducers']} {p['threads']}t smem{p['smem_bytes'] // 1024}K"
                if p["tier"] == 3 else f"t{p['tier']} {p['cluster']}x{p['threads']} ch{p['chunks']} g{p['grid']}")
            for k, p in plans.items()}
    print(f"{case.name:16} {dt:8} copy {copies[nbytes]:7.2f} | " + " | ".join(
        f"{k} [{desc[k]}] {med[k]:7.2f} ({med[k] / med['default']:.3f}, {100 * copies[nbytes] / med[k]:.1f}%)"
        for k in configs) + f" | err/tol max {max(*errs.values(), *after.values()):.3f} mixed {max(mixed):.3f} "
        f"graph {graph_err:.3f}", flush=True)
print(f"worst err/tol {worst:.3f}")
