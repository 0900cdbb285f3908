"""A/B/A in one process: HEAD (base) vs a pipelined tier 2 for 16-bit one-chunk multi-round plans (pipe: three
shared-memory buffers, cp.async of round r + 2 while round r - 1 stores; the knobs select S so that K = 4), cold, us."""
import importlib
import sys
from pathlib import Path
import torch
import dpk, dpk.build
from dpk.timing import Timer, TimingConfig
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
names = sys.argv[1].split(",")
cfg = {v: dpk.build.cuda_extension(f"dpk_gn_mish_{v}", (Path(f".whl/ab_{v}/gn_mish_binding.cpp"), Path(f".whl/ab_{v}/gn_mish.cu")))
       for v in names}
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.2))
T = fused.Tuning
PIPE = lambda S: dict(t1_threads=1024, t1_items=4, t2=1, t2_ctas=S)  # noqa: E731
plans = [((8, 2048, 4096, "bfloat16"), {}), ((8, 2048, 4096, "bfloat16"), PIPE(32)), ((8, 2048, 4096, "float16"), PIPE(32)),
         ((8, 2048, 4096, "bfloat16"), PIPE(16)), ((16, 1024, 2048, "bfloat16"), {}), ((16, 1024, 2048, "bfloat16"), PIPE(8)),
         ((8, 2048, 1024, "bfloat16"), {}), ((8, 2048, 1024, "bfloat16"), PIPE(8)), ((64, 512, 1024, "bfloat16"), {}),
         ((64, 512, 1024, "bfloat16"), PIPE(2)), ((64, 1024, 1024, "bfloat16"), {}), ((64, 1024, 1024, "bfloat16"), PIPE(4)),
         ((8, 2048, 4096, "bfloat16"), {}), ((8, 2048, 4096, "bfloat16"), PIPE(32))]
for (B, C, L, dt), knobs in plans:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    x, g, b, G, eps = inputs
    kn = T(**knobs).as_list()
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    err = {k: ((e.forward(x, g, b, G, eps, kn).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
           for k, e in cfg.items()}
    del ref
    res = {k: [] for k in cfg}
    for order in (list(cfg), list(cfg)[::-1], list(cfg)):
        for k in order:
            e = cfg[k]
            res[k].append(timer.measure(lambda: e.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    p = dict(cfg[names[0]].plan(x, G, kn))
    med = {k: sorted(v)[1] for k, v in res.items()}
    print(f"{case.name:16} {dt:8} {str(knobs):22} t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} "
          f"st{p['stash']} g{p['grid']} | " + "  ".join(f"{k} " + "/".join(f"{v:6.2f}" for v in res[k]) for k in cfg)
          + " | " + " ".join(f"{k} {med[k] / med['base']:.3f}" for k in cfg if k != "base")
          + " | err/tol " + " ".join(f"{err[k]:.3f}" for k in cfg), flush=True)
