"""Tier 2 CTAs per group (t2_ctas = S) on the multi-round B = 8 shapes, interleaved in one process, cold, us, with
the same-size copy: is the rule's S (the fewest whose re-reads in flight fit half the L2) also the fastest, or does
the number of rounds (ceil(groups / slots)) decide? Prints each S's slots, rounds and rounds / S."""
import importlib
from pathlib import Path
import torch
import dpk
from dpk.timing import Timer, TimingConfig
from dpk.timing_aids import size_matched_copies
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
dev = torch.device("cuda")
print("#", torch.cuda.get_device_name(dev), "L2", torch.cuda.get_device_properties(dev).L2_cache_size)
timer = Timer(dev, TimingConfig(budget_s=0.15))
shapes = [((8, 2048, 4096, "bfloat16"), (0, 4, 5, 6, 7, 8, 10, 11)), ((8, 2048, 4096, "float16"), (0, 4, 5, 6, 8)),
          ((8, 2048, 4096, "float32"), (0, 8, 10, 11, 12, 16)), ((16, 2048, 4096, "bfloat16"), (0, 4, 5, 6, 8)),
          ((8, 1024, 4096, "bfloat16"), (0, 2, 3, 4, 6))]
for (B, C, L, dt), ss in shapes:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    ref = fam.reference(x.double(), g.double(), b.double(), G, eps)
    tol = fam.tolerance(case, "float32")
    nbytes = 2 * x.numel() * x.element_size()
    copy = min(timer.measure(c, "cold").stats.median for c in size_matched_copies(nbytes, dev)) * 1e6
    tun = {s: fused.Tuning(t2=1, t2_ctas=s) if s else fused.Tuning() for s in ss}
    err = max(((fused.fused_gn_mish(x, g, b, G, eps, t).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
              for t in tun.values())
    del ref
    res = {s: [] for s in ss}
    for order in (ss, ss[::-1], ss):
        for s in order:
            res[s].append(timer.measure(lambda: fused.fused_gn_mish(x, g, b, G, eps, tun[s]), "cold").stats.median * 1e6)
    out = []
    for s in ss:
        p = fused.fused_plan(x, G, tun[s])
        slots = p["grid"] // p["cluster"]
        rounds = -(-B * G // slots)
        med = sorted(res[s])[1]
        out.append(f"{'rule' if s == 0 else 'S=' + str(s)}: t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} "
                   f"st{p['stash']} slots {slots} rounds {rounds} r/S {rounds / p['cluster']:.3f} {med:7.2f} ({100 * copy / med:.1f}%)")
    print(f"{case.name} {dt} copy {copy:.2f} err/tol {err:.3f}\n   " + "\n   ".join(out), flush=True)
