"""Per-CTA, per-round phase timeline of the tier-2 grid kernel (globaltimer, thread 0 of each CTA), cold L2.
Stamps per round r (slot 5r + i): 0 round start, 1 slice loaded + thread stats, 2 group barrier passed,
3 pass 2 reaches chunk 3 (chunks 7..4 done: the last chunk from registers and the re-read chunks), 4 stores issued."""
import importlib
from pathlib import Path
import torch
import dpk, dpk.build
from dpk.timing import Timer, TimingConfig
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
import sys
folder = sys.argv[1]
ext = dpk.build.cuda_extension(f"dpk_gn_mish_{folder}", (Path(f".whl/{folder}/gn_mish_binding.cpp"), Path(f".whl/{folder}/gn_mish.cu")))
real = ext
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.3))
T = fused.Tuning
cases = [((1, 2048, 1024, "float32"), {}), ((1, 512, 4096, "float32"), {}), ((16, 1024, 2048, "bfloat16"), {"t2": 1, "t2_ctas": 1}),
         ((8, 2048, 4096, "bfloat16"), {}), ((8, 2048, 4096, "float32"), {}), ((1, 2048, 4096, "bfloat16"), {})]
for (B, C, L, dt), knobs in cases:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    k = T(**knobs).as_list()
    plan = dict(real.plan(x, G, k))
    n = plan["grid"]
    cold = sorted(timer.measure(lambda: real.forward(x, g, b, G, eps, k), "cold").stats.median * 1e6 for _ in range(3))[1]
    tcold = sorted(timer.measure(lambda: ext.forward(x, g, b, G, eps, k), "cold").stats.median * 1e6 for _ in range(3))[1]
    reps = []
    for _ in range(7):
        ext.trace_clear()
        timer._flush()
        torch.cuda.synchronize()
        ext.forward(x, g, b, G, eps, k)
        reps.append(ext.trace()[:n].clone())
    tr = torch.stack(reps).double() / 1e3  # rep, cta, slot (us)
    t0 = tr[:, :, 0].min(dim=1, keepdim=True).values
    rounds = -(-(B * 8) // (n // plan["cluster"]))
    last = tr[:, :, :12].max(dim=2).values.max(dim=1).values - t0[:, 0]
    print(f"{case.name:15} {dt:8} {str(knobs):22} t{plan['tier']} {plan['cluster']:2}x{plan['threads']:4} i{plan['items']} "
          f"ch{plan['chunks']} st{plan['stash']} g{n} rounds {rounds} | cold {cold:6.2f} traced {tcold:6.2f} | span p50 {last.median():6.2f}", flush=True)
    med = lambda v: v.median().item()  # noqa: E731
    f = lambda i, j: med(tr[:, :, j] - tr[:, :, i])  # noqa: E731
    print(f"   round 0 detail: load->reduced {f(1, 12):5.2f} | reduced->ready {f(12, 14):5.2f} (p90 {(tr[:, :, 14] - tr[:, :, 12]).quantile(.9).item():5.2f}) "
          f"[{f(12, 13):5.2f} + {f(13, 14):5.2f}] | ready->store end {f(14, 4):5.2f} | first ready - last reduced "
          f"{med(tr[:, :, 14].reshape(7, -1, plan['cluster']).min(dim=2).values - tr[:, :, 12].reshape(7, -1, plan['cluster']).max(dim=2).values):5.2f}", flush=True)
    for r in range(min(rounds, 2)):
        s = [tr[:, :, 5 * r + i] - t0 for i in range(5)]
        has3 = bool((tr[:, :, 5 * r + 3] > 0).all())
        load, bar = s[1] - s[0], s[2] - s[1]
        store = s[4] - s[2]
        mid = f"re-read part {med(s[3] - s[2]):6.2f} stash part {med(s[4] - s[3]):6.2f}" if has3 else ""
        print(f"   round {r}: start p10/p50/p90 {s[0].quantile(.1).item():6.2f}/{med(s[0]):6.2f}/{s[0].quantile(.9).item():6.2f}"
              f" | load {med(load):6.2f} (p90 {load.quantile(.9).item():6.2f}) | reduce+barrier {med(bar):5.2f} | "
              f"store {med(store):6.2f} (p90 {store.quantile(.9).item():6.2f}) {mid} | end p50/p90 {med(s[4]):6.2f}/{s[4].quantile(.9).item():6.2f}", flush=True)
