"""A/B/A in one process: HEAD (base) vs the working tree (mish in the log2 domain, mean folded into the shift), default
plans, cold; then the shared-memory ring (t2=2) against the default on the working tree. Parity vs fp64 for every run."""
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
T = fused.Tuning
knobs = T().as_list()


def parity(case, inputs, out):
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    err = (out.double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())
    return err.max().item() if bool(torch.isfinite(out).all()) else float("inf")


def run(label, shapes, cfgs):
    print(f"== {label}", flush=True)
    for B, C, L, dt in shapes:
        case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
        inputs = fam.make_inputs(case, dev)
        x, g, b, G, eps = inputs
        plans, ok = {}, {}
        for k, (e, kn) in cfgs.items():
            try:
                plans[k] = dict(e.plan(x, G, kn))
            except Exception as exc:  # noqa: BLE001
                print(f"   {case.name} {k}: no plan: {exc}")
        res = {k: [] for k in plans}
        for k in plans:
            e, kn = cfgs[k]
            ok[k] = parity(case, inputs, e.forward(x, g, b, G, eps, kn))
        for order in (list(plans), list(plans)[::-1], list(plans)):
            for k in order:
                e, kn = cfgs[k]
                res[k].append(timer.measure(lambda: e.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
        med = {k: sorted(v)[1] for k, v in res.items()}
        first = next(iter(med))
        print(f"{case.name:16} {dt:8} | " + " | ".join(
            f"{k} t{plans[k]['tier']}{'r' if plans[k]['tier'] == 2 and plans[k]['smem_slice'] else ''} "
            f"{plans[k]['cluster']}x{plans[k]['threads']} g{plans[k]['grid']} ch{plans[k]['chunks']} {med[k]:7.2f}"
            f" ({med[k] / med[first]:.3f}) err {ok[k]:.2f}" for k in med), flush=True)


cold = [(1, 256, 1024, "float32"), (1, 1024, 1024, "float32"), (1, 2048, 1024, "float32"), (1, 512, 4096, "float32"),
        (1, 2048, 4096, "bfloat16"), (8, 1024, 1024, "float32"), (8, 2048, 4096, "bfloat16"), (8, 2048, 4096, "float32"),
        (64, 512, 1024, "bfloat16"), (64, 512, 1024, "float16"), (64, 1024, 1024, "float32"), (16, 1024, 2048, "float32")]
what = sys.argv[1] if len(sys.argv) > 1 else "all"
if what in ("all", "mish"):
    run("base vs log2 mish (default plans)", cold, {"base": (base, knobs), "new": (new, knobs)})
if what in ("all", "ring"):
    ring = {"default": (new, knobs), "ring": (new, T(t2=2).as_list()), "ring512": (new, T(t2=2, t1_threads=512).as_list()),
            "ring256": (new, T(t2=2, t1_threads=256).as_list())}
    shapes = [(8, 2048, 4096, "bfloat16"), (8, 2048, 4096, "float32"), (8, 2048, 4096, "float16"),
              (16, 1024, 2048, "float32"), (64, 1024, 1024, "float32"), (64, 2048, 1024, "float32"),
              (8, 2048, 1024, "float32"), (8, 512, 4096, "float32"), (64, 512, 1024, "bfloat16"),
              (1, 2048, 4096, "bfloat16"), (1, 2048, 1024, "float32"), (8, 1024, 1024, "float32"),
              (3, 1000, 333, "float32"), (5, 1536, 250, "bfloat16")]
    run("default vs ring (t2=2)", shapes, ring)
