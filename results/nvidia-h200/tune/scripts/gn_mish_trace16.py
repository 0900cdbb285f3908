"""Per-CTA phase timeline (globaltimer, thread 0 of each CTA), cold L2. Stamps: 0 entry, 1 slice loaded + thread
stats, 2 CTA reduce, 3 barrier passed (cluster wait / global spin), 4 group stats merged, 5 stores issued, 6 exit."""
import importlib
from pathlib import Path
import torch
import dpk, dpk.build
from dpk.timing import Timer, TimingConfig
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
ext = dpk.build.cuda_extension("dpk_gn_mish_trace", (Path(".whl/trace/gn_mish_binding.cpp"), Path(".whl/trace/gn_mish.cu")))
real = fused.extension()
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.3))
T = fused.Tuning
cases = [((1, 2048, 4096), {}, "bfloat16"), ((1, 2048, 4096), {}, "float32"), ((8, 2048, 4096), {}, "bfloat16"),
         ((1, 2048, 4096), {"t1_items": 4}, "bfloat16")]
_unused = [((1, 256, 1024), {}), ((1, 256, 1024), {"t1_threads": 512}), ((1, 256, 1024), {"t1_threads": 1024}),
         ((1, 512, 1024), {}), ((1, 512, 1024), {"t1_threads": 512}), ((1, 512, 1024), {"t1_threads": 1024}),
         ((1, 1024, 1024), {}), ((1, 1024, 1024), {"t1_threads": 1024}), ((1, 2048, 1024), {}),
         ((1, 2048, 1024), {"t2_ctas": 32}), ((1, 2048, 1024), {"t2_ctas": 16, "t1_threads": 1024})]
q = lambda t, p: t.float().quantile(p).item() / 1e3  # noqa: E731
for (B, C, L), knobs, dt in cases:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    k = T(**knobs).as_list()
    plan = dict(real.plan(x, G, k))
    n = min(plan["grid"], 8192)
    cold = sorted(timer.measure(lambda: real.forward(x, g, b, G, eps, k), "cold").stats.median * 1e6
                  for _ in range(3))[1]
    reps = []
    for _ in range(7):
        ext.trace_clear()
        timer._flush()
        torch.cuda.synchronize()
        ext.forward(x, g, b, G, eps, k)
        reps.append(ext.trace()[:n].clone())
    tr = torch.stack(reps)  # rep, cta, slot
    t0 = tr[:, :, 0].min(dim=1, keepdim=True).values
    span = (tr[:, :, 6].max(dim=1).values - t0[:, 0]).float().median().item() / 1e3
    ph = [(tr[:, :, i + 1] - tr[:, :, i]).flatten() for i in range(6)]
    ent = (tr[:, :, 0] - t0).flatten()
    print(f"{case.name:15} {dt:8} {str(knobs):22} t{plan['tier']} {plan['cluster']:2}x{plan['threads']:4} items {plan['items']} "
          f"cold {cold:6.2f} | span {span:5.2f} | entry p90 {q(ent, .9):4.2f} | p50 load {q(ph[0], .5):4.2f} "
          f"reduce {q(ph[1], .5):4.2f} barrier {q(ph[2], .5):4.2f} merge {q(ph[3], .5):4.2f} store {q(ph[4], .5):4.2f} "
          f"exit {q(ph[5], .5):4.2f} | load p90 {q(ph[0], .9):4.2f} reduce p90 {q(ph[1], .9):4.2f}", flush=True)
