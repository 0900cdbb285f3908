"""Bisect of the fused tier-1 kernel's 0.5 us over the ladder's L6 at b1_c256_l1024 (gn_mish_bisect.cu): the cluster
kernel's body with its affine (A), load and statistics (L) and normalise (N) each as the fused kernel has them or as the
ladder writes them ("bisect ALN", 1 = the fused kernel's), on the fused kernel's inputs and plan (8 x 256, 4 vectors per
thread; and 16 x 128); the ladder's L6 on the same x; the fused kernel itself. Cold, same process, A/B/A/B/A (medians
of five, range in brackets), us; the same-size copy timed alike; bisect 111 must equal the fused output bit for bit.
argv[1:]: timing modes (default cold; e.g. cold hot: hot = L2 warm, back-to-back calls)."""
import importlib
import sys
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
flags = ("-O3", "-lineinfo", "--expt-relaxed-constexpr", f"-I{KDIR}")
lad = dpk.build.cuda_extension("dpk_gn_mish_ladder", (HERE / "gn_mish_ladder.cpp", HERE / "gn_mish_ladder.cu"), flags)
bis = dpk.build.cuda_extension("dpk_gn_mish_bisect", (HERE / "gn_mish_bisect.cpp", HERE / "gn_mish_bisect.cu"), flags)
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning
ROUNDS = 5
C, L = 256, 1024


MODES = sys.argv[1:] or ["cold"]


case = dpk.make_case("gn_mish", f"b1_c{C}_l{L}", "float32", B=1, C=C, L=L, G=8)
inputs = fam.make_inputs(case, dev)
xs, g, b, G, eps = inputs
ys = torch.empty_like(xs)
gb = torch.cat([g, b])
default = T().as_list()
want = ext.forward(xs, g, b, G, eps, default)
fns = {"fused": lambda: ext.forward(xs, g, b, G, eps, default),
       "fused t128i4": lambda: ext.forward(xs, g, b, G, eps, T(t1_threads=128, t1_items=4).as_list()),
       "L6/8x256": lambda: lad.forward(xs.view(-1), ys.view(-1), gb, 6, 0, 8, 256)}
for v in (7, 6, 5, 4, 2, 0):
    fns[f"bisect {v:03b}/8x256"] = (lambda v=v: bis.forward(xs, g, b, ys, v, C, L, 8, 256))
for v in (7, 0):
    fns[f"bisect {v:03b}/16x128"] = (lambda v=v: bis.forward(xs, g, b, ys, v, C, L, 16, 128))
bis.forward(xs, g, b, ys, 7, C, L, 8, 256)
same8 = torch.equal(ys, want)
bis.forward(xs, g, b, ys, 7, C, L, 16, 128)
ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
tol = fam.tolerance(case, "float32")
err16 = ((ys.double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
memcpy, ewcopy = size_matched_copies(2 * xs.numel() * 4, dev)
fns["memcpy"], fns["ewcopy"] = memcpy, ewcopy
for mode in MODES:
    res = {k: [] for k in fns}
    for r in range(ROUNDS):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[k].append(timer.measure(fns[k], mode).stats.median * 1e6)
    med = {k: sorted(v)[ROUNDS // 2] for k, v in res.items()}
    copy = min(med["memcpy"], med["ewcopy"])
    for k, v in med.items():
        print(f"{mode:5} {k:20} {v:6.2f} ({v / med['fused']:.3f}, {100 * copy / v:.1f}%) "
              f"[{min(res[k]):.2f}-{max(res[k]):.2f}]")
print(f"bisect 111/8x256 == fused bit for bit: {same8}; bisect 111/16x128 err/tol {err16:.3f}", flush=True)
