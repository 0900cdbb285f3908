"""A/B/A in one process: HEAD's kernel (base: Chan's ordered merges) vs equal-count merges with a Chan fallback (eq)
vs symmetric merges (sym, the working tree), each with registers (t1_smem=-1) and the shared-memory slice (_s1)."""
import importlib
from pathlib import Path
import torch
import dpk, dpk.build
from dpk.timing import Timer, TimingConfig
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
new = fused.extension()
base = dpk.build.cuda_extension("dpk_gn_mish_base", (Path(".whl/ab_base/gn_mish_binding.cpp"), Path(".whl/ab_base/gn_mish.cu")))
eq = dpk.build.cuda_extension("dpk_gn_mish_eq", (Path(".whl/ab_eq/gn_mish_binding.cpp"), Path(".whl/ab_eq/gn_mish.cu")))
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.2))
T = fused.Tuning
cfg = {"base": (base, T().as_list()[:11]), "eq": (eq, T(t1_smem=-1).as_list()), "sym": (new, T(t1_smem=-1).as_list()),
       "eq_s1": (eq, T(t1_smem=1).as_list()), "sym_s1": (new, T(t1_smem=1).as_list())}
shapes = [(64, 256, 1024, "float32"), (64, 512, 1024, "float32"), (64, 1024, 256, "float32"), (64, 256, 256, "float32"),
          (64, 512, 1024, "bfloat16"), (64, 512, 1024, "float16"), (64, 1024, 1024, "float32"), (64, 2048, 1024, "float32"),
          (16, 1024, 2048, "float32"), (8, 2048, 4096, "bfloat16"), (8, 2048, 4096, "float32"), (8, 256, 1024, "float32"),
          (8, 1024, 1024, "float32"), (1, 256, 1024, "float32"), (1, 512, 1024, "float32"), (1, 1024, 1024, "float32"),
          (1, 2048, 1024, "float32"), (1, 2048, 4096, "bfloat16")]
for B, C, L, dt in shapes:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    ref = base.forward(x, g, b, G, eps, cfg["base"][1]).float()
    plans = {k: dict(e.plan(x, G, kn)) for k, (e, kn) in cfg.items()}
    keys = [k for k in cfg if k in ("base", "eq", "sym") or plans[k].get("smem_slice")]
    res = {k: [] for k in keys}
    err = {}
    for order in (keys, keys[::-1], keys):
        for k in order:
            e, kn = cfg[k]
            out = e.forward(x, g, b, G, eps, kn).float()
            err[k] = ((out - ref).abs() / (ref.abs() + 1)).max().item()
            assert err[k] < 2e-2, (k, err[k])
            res[k].append(timer.measure(lambda: e.forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    print(f"{case.name:16} {dt:8} t{plans['sym']['tier']} {plans['sym']['cluster']}x{plans['sym']['threads']} "
          f"ch{plans['sym']['chunks']} | " + "  ".join(f"{k} " + "/".join(f"{v:6.2f}" for v in res[k]) for k in keys)
          + f" | maxrel {max(err.values()):.1e}", flush=True)
