"""The phase ladder's L5/L6 kernels (gn_mish_ladder.cu: the fused algorithm with 4 fp32 vectors per thread, no
generality: fixed counts, no guards, gamma/beta per item) against the fused kernel on the same bytes and CTA shapes,
with the one-in-flight engine: 1 MB (b1_c256_l1024) as 8 x 256 and 16 x 128, 4 MB (b1_c1024_l1024) as 8 x 1024 and
16 x 512. Cold, same process, A/B/A/B/A (medians of five, range in brackets), us; the same-size copy timed alike."""
import importlib
from pathlib import Path

import torch

import dpk
import dpk.build
from dpk.timing import Timer, TimingConfig
from dpk.timing_aids import size_matched_copies

HERE = Path(__file__).resolve().parent
KDIR = Path("kernels/gn_mish").resolve()
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
ext = fused.extension()
lad = dpk.build.cuda_extension("dpk_gn_mish_ladder", (HERE / "gn_mish_ladder.cpp", HERE / "gn_mish_ladder.cu"),
                               ("-O3", "-lineinfo", "--expt-relaxed-constexpr", f"-I{KDIR}"))
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning
ROUNDS = 5


def cold(fn) -> float:
    return timer.measure(fn, "cold").stats.median * 1e6


def plan_label(x, G, kn) -> str:
    p = dict(ext.plan(x, G, kn))
    return f"[t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']}]"


for C, shapes, knobs in (
        (256, ((8, 256), (16, 128)), {"default": {}, "t128i4": {"t1_threads": 128, "t1_items": 4}}),
        (1024, ((8, 1024), (16, 512)), {"default": {}, "t1024i4": {"t1_threads": 1024, "t1_items": 4},
                                        "t512i4": {"t1_threads": 512, "t1_items": 4}})):
    case = dpk.make_case("gn_mish", f"b1_c{C}_l1024", "float32", B=1, C=C, L=1024, G=8)
    inputs = fam.make_inputs(case, dev)
    xs, g, b, G, eps = inputs
    x = torch.randn_like(xs).reshape(-1)
    y = torch.empty_like(x)
    gb = torch.randn(512, device=dev)
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    fns, labels = {}, {}
    for k, th in shapes:
        for lv in (5, 6):
            fns[f"L{lv}/{k}x{th}"] = (lambda lv=lv, k=k, th=th, a=(x, y, gb): lad.forward(*a, lv, 0, k, th))
    errs = []
    for name, kn in knobs.items():
        kl = T(**kn).as_list()
        labels[name] = plan_label(xs, G, kl)
        fns[name] = (lambda kl=kl, i=inputs: ext.forward(*i, kl))
        errs.append(((ext.forward(xs, g, b, G, eps, kl).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs()))
                    .max().item())
    memcpy, ewcopy = size_matched_copies(2 * xs.numel() * 4, dev)
    fns["memcpy"], fns["ewcopy"] = memcpy, ewcopy
    res = {k: [] for k in fns}
    for r in range(ROUNDS):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[k].append(cold(fns[k]))
    med = {k: sorted(v)[ROUNDS // 2] for k, v in res.items()}
    copy = min(med["memcpy"], med["ewcopy"])
    base = med["default"]
    cells = " | ".join(f"{k}{labels.get(k, '')} {v:6.2f} ({v / base:.3f}, {100 * copy / v:.1f}%) "
                       f"[{min(res[k]):.2f}-{max(res[k]):.2f}]" for k, v in med.items())
    print(f"b1_c{C}_l1024 fp32 | {cells} | err/tol {max(errs):.3f}", flush=True)
