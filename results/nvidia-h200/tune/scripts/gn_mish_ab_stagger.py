"""A/B in one process: HEAD (base) vs slots/groups that start late (stg: unit u of U spins (u * levels / U) * GN_STAGGER
SM cycles before loading, so the first half of the groups loads, exchanges and stores while the rest still load),
cold, us; the same-size copy timed in the same process; parity vs fp64. Argument: b1 (one-round plans: the first
half of the groups should exchange and store while the second half loads) or b8 (multi-round plans: the two halves of
the slots a phase apart, so DRAM sees one half's loads while the other half stores)."""
import importlib
import os
import sys
from pathlib import Path
import torch
import dpk, dpk.build
from dpk.timing import Timer, TimingConfig
from dpk.timing_aids import size_matched_copies
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
ext = {v: dpk.build.cuda_extension(f"dpk_gn_mish_{v}", (Path(f".whl/ab_{v}/gn_mish_binding.cpp"), Path(f".whl/ab_{v}/gn_mish.cu")))
       for v in ("base", "stg")}
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning
K = 1000  # cycles
small = [(0, 2), (500, 2), (1 * K, 2), (2 * K, 2), (3 * K, 2), (1 * K, 4), (500, 8)]
b1 = [((1, 2048, 1024, "float32"), {}, small), ((1, 512, 4096, "float32"), {}, small),
         ((1, 2048, 4096, "bfloat16"), {}, small + [(4 * K, 2), (2 * K, 4)]),
         ((1, 1024, 1024, "float32"), {}, small), ((1, 1024, 1024, "float32"), {"t2": 1}, small),
         ((1, 256, 1024, "float32"), {}, small[:5]), ((1, 512, 1024, "float32"), {}, small[:5]),
         ((1, 2048, 4096, "float32"), {}, small),
         ((8, 2048, 4096, "bfloat16"), {}, [(0, 2), (4 * K, 2), (8 * K, 2), (16 * K, 2), (32 * K, 2), (8 * K, 4)]),
         ((8, 2048, 4096, "float32"), {}, [(0, 2), (4 * K, 2), (8 * K, 2), (16 * K, 2), (8 * K, 4)]),
         ((1, 2048, 1024, "float32"), {}, small)]
big = [(0, 2), (8 * K, 2), (16 * K, 2), (24 * K, 2), (32 * K, 2), (48 * K, 2), (16 * K, 4)]
b8 = [((8, 2048, 4096, "bfloat16"), {}, big + [(64 * K, 2)]),
      ((8, 2048, 4096, "bfloat16"), {"t2": 1, "t2_ctas": 8}, big),
      ((8, 2048, 4096, "float32"), {}, big + [(64 * K, 2)]),
      ((8, 2048, 4096, "float32"), {"t2": 1, "t2_ctas": 16}, big),
      ((16, 1024, 2048, "bfloat16"), {}, big[:5]),
      ((8, 2048, 1024, "float32"), {}, big[:5]),
      ((8, 2048, 4096, "bfloat16"), {}, big)]
plans = {"b1": b1, "b8": b8}[sys.argv[1]]
copies = {}
for (B, C, L, dt), knobs, stg in plans:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    x, g, b, G, eps = inputs
    kn = T(**knobs).as_list()
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    nbytes = 2 * x.numel() * x.element_size()
    if nbytes not in copies:
        copies[nbytes] = min(timer.measure(c, "cold").stats.median for c in size_matched_copies(nbytes, dev)) * 1e6
    def err(e):
        return ((e.forward(x, g, b, G, eps, kn).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
    p = dict(ext["base"].plan(x, G, kn))
    head = (f"{case.name:15} {dt:8} {str(knobs):10} t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} "
            f"ch{p['chunks']} st{p['stash']} g{p['grid']} copy {copies[nbytes]:6.2f} |")
    res = {}
    errs = {}
    for rep in range(3):
        for cyc, lv in (stg if rep != 1 else stg[::-1]):
            os.environ["GN_STAGGER"], os.environ["GN_LEVELS"] = str(cyc), str(lv)
            if rep == 0:
                errs[(cyc, lv)] = err(ext["stg"])
            res.setdefault((cyc, lv), []).append(timer.measure(lambda: ext["stg"].forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
        res.setdefault("base", []).append(timer.measure(lambda: ext["base"].forward(x, g, b, G, eps, kn), "cold").stats.median * 1e6)
    del ref
    med = {k: sorted(v)[1] for k, v in res.items()}
    print(head + f" base {med['base']:6.2f} ({100 * copies[nbytes] / med['base']:.1f}%) | " + "  ".join(
        f"{k[0]}/{k[1]} {med[k]:6.2f} ({med[k] / med['base']:.3f}, {100 * copies[nbytes] / med[k]:.1f}%)" for k in res if k != "base")
        + f" | max err/tol {max(errs.values()):.3f}", flush=True)
