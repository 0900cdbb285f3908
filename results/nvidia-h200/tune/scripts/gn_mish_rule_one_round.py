"""16-bit one-round tier 2 rule (c): the new default (tier 2 where tier 1 streams >= 2 chunks and tier 2 holds every
group at once) against tier 1 (t2 = -1, the previous default on these shapes), cold, us, medians of three
interleaved rounds; parity vs fp64 (max error / tolerance)."""
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
shapes = [(4, 1024, 4096, "bfloat16"), (4, 2048, 2048, "bfloat16"), (4, 2048, 4096, "bfloat16"),
          (8, 512, 4096, "bfloat16"), (8, 1024, 2048, "bfloat16"), (8, 1024, 4096, "bfloat16"),
          (8, 2048, 1024, "bfloat16"), (8, 2048, 2048, "bfloat16"), (16, 512, 4096, "bfloat16"),
          (16, 1024, 2048, "bfloat16"), (16, 2048, 1024, "bfloat16"), (4, 2048, 4096, "float16"),
          (8, 2048, 1024, "float16"), (8, 1024, 4096, "float16"), (16, 1024, 2048, "float16"),
          (16, 1024, 4096, "bfloat16"), (8, 1024, 1024, "bfloat16")]  # the last two: unchanged by the rule
sets = {"default": {}, "t1": {"t2": -1}}
for B, C, L, dt in shapes:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    x, g, b, G, eps = inputs
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    res, err, plans = {k: [] for k in sets}, {}, {}
    for k, kn in sets.items():
        kl = T(**kn).as_list()
        plans[k] = dict(ext.plan(x, G, kl))
        err[k] = ((ext.forward(x, g, b, G, eps, kl).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
    del ref
    for _ in range(3):
        for k, kn in sets.items():
            kl = T(**kn).as_list()
            res[k].append(timer.measure(lambda: ext.forward(x, g, b, G, eps, kl), "cold").stats.median * 1e6)
    med = {k: sorted(v)[1] for k, v in res.items()}
    desc = " | ".join(f"{k} t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} st{p['stash']} "
                      + "/".join(f"{v:7.2f}" for v in res[k]) for k, p in plans.items())
    print(f"{case.name:16} {dt:8} {desc} | default/t1 {med['default'] / med['t1']:.3f} | err/tol "
          + " ".join(f"{err[k]:.3f}" for k in sets), flush=True)
