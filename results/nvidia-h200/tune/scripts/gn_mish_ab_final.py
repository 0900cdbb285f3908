"""A/B/A in one process: HEAD (base) vs the working tree (16-bit outputs: the affine in the log2 domain with the mean
folded into the shift; fp32 unchanged), default plans; cold (sweep shapes) and graph (Push-T, fp32 and 16-bit). Parity
of both builds vs fp64 (max error / tolerance) on every shape. Then knobs: tier 2 with 4 vectors per thread per chunk
(t1_items=4) against the default on the B = 1 tier-2 shapes, the new build only."""
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
timer = Timer(dev, TimingConfig(budget_s=0.2))
knobs = fused.Tuning().as_list()
cfg = {"base": base, "new": new}
cold = [(1, 256, 1024, "float32"), (1, 512, 1024, "float32"), (1, 1024, 1024, "float32"), (1, 2048, 1024, "float32"),
        (1, 512, 4096, "float32"), (1, 2048, 4096, "float32"), (1, 2048, 4096, "bfloat16"), (8, 256, 1024, "float32"),
        (8, 512, 1024, "float32"), (8, 1024, 1024, "float32"), (8, 2048, 1024, "float32"), (8, 2048, 4096, "bfloat16"),
        (8, 2048, 4096, "float32"), (8, 512, 4096, "float32"), (64, 256, 1024, "float32"), (64, 512, 1024, "bfloat16"),
        (64, 512, 1024, "float16"), (64, 512, 1024, "float32"), (64, 1024, 1024, "float32"), (64, 256, 256, "float32"),
        (16, 1024, 2048, "float32"), (3, 1000, 333, "float32"), (5, 1536, 250, "bfloat16")]
graph = [(1, 256, 16, "float32"), (64, 256, 16, "float32"), (64, 512, 4, "float32"), (8, 1024, 8, "bfloat16"),
         (1, 256, 16, "float16"), (64, 256, 16, "bfloat16"), (64, 512, 4, "float16")]
only = sys.argv[1] if len(sys.argv) > 1 else "all"
for mode, shapes in (("cold", cold), ("graph", graph)):
    if only not in ("all", mode):
        continue
    for B, C, L, dt in shapes:
        case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
        inputs = fam.make_inputs(case, dev)
        x, g, b, G, eps = inputs
        ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
        tol = fam.tolerance(case, "float32")
        ratio = lambda out: ((out.double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()  # noqa: E731
        err = {k: ratio(e.forward(x, g, b, G, eps, knobs)) for k, e in cfg.items()}
        res = {k: [] for k in cfg}
        for order in (list(cfg), list(cfg)[::-1], list(cfg)):
            for k in order:
                e = cfg[k]
                res[k].append(timer.measure(lambda: e.forward(x, g, b, G, eps, knobs), mode).stats.median * 1e6)
        p = dict(new.plan(x, G, knobs))
        med = {k: sorted(v)[1] for k, v in res.items()}
        print(f"{mode:5} {case.name:16} {dt:8} t{p['tier']} {p['cluster']}x{p['threads']} ch{p['chunks']} sm{p['smem_slice']} | "
              + "  ".join(f"{k} " + "/".join(f"{v:6.2f}" for v in res[k]) for k in cfg)
              + f" | new/base {med['new'] / med['base']:.3f} | err/tol base {err['base']:.3f} new {err['new']:.3f}",
              flush=True)

if only in ("all", "knobs"):
    T = fused.Tuning
    sets = {"default": T().as_list(), "t2,16el": T(t2=1, t1_items=4).as_list(), "t2,16el,nostash": T(t2=1, t1_items=4, t1_stash=-1).as_list()}
    for B, C, L, dt in [(1, 2048, 1024, "float32"), (1, 512, 4096, "float32"), (1, 1024, 1024, "float32"),
                        (1, 2048, 4096, "float32"), (1, 2048, 4096, "bfloat16"), (1, 512, 4096, "bfloat16"),
                        (1, 2048, 1024, "bfloat16")]:
        case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
        inputs = fam.make_inputs(case, dev)
        x, g, b, G, eps = inputs
        ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
        tol = fam.tolerance(case, "float32")
        res = {k: [] for k in sets}
        err = {k: ((new.forward(x, g, b, G, eps, kn).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
               for k, kn in sets.items()}
        for order in (list(sets), list(sets)[::-1], list(sets)):
            for k in order:
                kn = sets[k]
                res[k].append(timer.measure(lambda: new.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
        med = {k: sorted(v)[1] for k, v in res.items()}
        desc = {}
        for k, kn in sets.items():
            p = dict(new.plan(x, G, kn))
            desc[k] = f"t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} st{p['stash']}"
        print(f"knobs {case.name:16} {dt:8} | " + " | ".join(
            f"{k} {desc[k]} " + "/".join(f"{v:6.2f}" for v in res[k]) + f" ({med[k] / med['default']:.3f}) err {err[k]:.3f}"
            for k in sets), flush=True)
