"""Cold-L2 cost of fetching the kernel's code: flush L2, then (a) time the call, or (b) first run the same kernel
instantiation on a tiny problem (code now in L2 / i-cache, data still cold) and time the call. Same for a copy."""
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
knobs = fused.Tuning().as_list()


def timed(fn, pre=None, n=60):
    out = []
    for _ in range(n):
        timer._flush()
        if pre is not None:
            pre()
        torch.cuda._sleep(20000)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3)
    return sorted(out)[n // 2]


for (B, C, L), tiny in [((1, 256, 1024), (1, 64, 512)), ((1, 1024, 1024), (1, 128, 512)), ((1, 2048, 1024), (1, 64, 4096)),
                        ((64, 256, 1024), (1, 64, 512))]:
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", "float32", B=B, C=C, L=L, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    tx, tg, tb, _, _ = fam.make_inputs(dpk.make_case("gn_mish", "tiny", "float32", B=tiny[0], C=tiny[1], L=tiny[2], G=8), dev)
    p, tp = dict(ext.plan(x, G, knobs)), dict(ext.plan(tx, G, knobs))
    same = all(p[k] == tp[k] for k in ("tier", "items", "stash", "smem_slice", "vec"))
    dst = torch.empty_like(x)
    small = torch.empty(1024, device=dev)
    sd = torch.empty_like(small)
    f = (lambda: ext.forward(x, g, b, G, eps, knobs))
    cp = (lambda: torch.mul(x, 1, out=dst))
    print(f"{case.name}: fused cold {timed(f):6.2f} us, code warm {timed(f, lambda: ext.forward(tx, tg, tb, G, eps, knobs)):6.2f} "
          f"(same kernel: {same}) | copy cold {timed(cp):6.2f}, code warm {timed(cp, lambda: torch.mul(small, 1, out=sd)):6.2f}"
          f" | timer cold {timer.measure(f, 'cold').stats.median * 1e6:6.2f}", flush=True)
