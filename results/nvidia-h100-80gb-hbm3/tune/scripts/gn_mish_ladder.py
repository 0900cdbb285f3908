"""Where the B = 1 tier-1 kernel's time over a copy goes (gn_mish_ladder.cu: L0 copy, L1 the copy launched as 8-CTA
clusters, L2 + thread stats, L3 + CTA reduction, L4 + cluster exchange, L5 + affine and mish), next to the fused
kernel's default plan and other tier-1 CTA shapes on the B = 1 fp32 l1024 shapes, and tier 3's request depth on the
16-bit b1_c2048_l4096. Argument `launch`: the launch set-up instead (L5/L6 with gn_mish.cu's dynamic shared memory
attribute and variants, and the fused kernel built without that attribute). Cold, same process, A/B/A order (medians of the three), us; the same-size copy timed alike."""
import importlib
import shutil
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
lad = dpk.build.cuda_extension("dpk_gn_mish_ladder", (HERE / "gn_mish_ladder.cpp", HERE / "gn_mish_ladder.cu"),
                               ("-O3", "-lineinfo", "--expt-relaxed-constexpr", f"-I{KDIR}"))
MODE = sys.argv[1] if len(sys.argv) > 1 else "ladder"  # ladder | launch (the launch set-up; noattr build)
NOATTR = None
if MODE == "launch":  # gn_mish.cu without MaxDynamicSharedMemorySize (prepare_kernel patched in a copy)
    patched = Path("/tmp/gn_noattr")
    shutil.rmtree(patched, ignore_errors=True)
    shutil.copytree(KDIR, patched)
    cu = (patched / "gn_mish.cu").read_text()
    old = "  if (device_info(&dev) == cudaSuccess && dev.smem_optin > 48 * 1024 &&"
    assert old in cu
    (patched / "gn_mish.cu").write_text(cu.replace(old, "  if (false && device_info(&dev) == cudaSuccess &&"))
    NOATTR = dpk.build.cuda_extension("dpk_gn_mish_noattr", (patched / "gn_mish_binding.cpp", patched / "gn_mish.cu"))
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
T = fused.Tuning


def cold(fn) -> float:
    return timer.measure(fn, "cold").stats.median * 1e6


def ab(fns: dict) -> dict:
    res = {k: [] for k in fns}
    for order in (list(fns), list(fns)[::-1], list(fns)):
        for k in order:
            res[k].append(cold(fns[k]))
    return {k: sorted(v)[1] for k, v in res.items()}


def line(name: str, copy: float, meds: dict, plans: dict | None = None) -> str:
    base = next(iter(meds.values()))
    cells = []
    for k, v in meds.items():
        p = plans.get(k, "") if plans else ""
        cells.append(f"{k}{p} {v:6.2f} ({v / base:.3f}, {100 * copy / v:.1f}%)")
    return f"{name:24} copy {copy:6.2f} | " + " | ".join(cells)


def plan_label(x, G, kn) -> str:
    p = dict(ext.plan(x, G, kn))
    return f" [t{p['tier']} {p['cluster']}x{p['threads']} i{p['items']} ch{p['chunks']} g{p['grid']}]"


# 1. the ladder, 1 MB fp32 (b1_c256_l1024's bytes), 8-CTA clusters of 256 threads
x = torch.randn(256 * 1024, device=dev)
y = torch.empty_like(x)
gb = torch.randn(512, device=dev)
copy = min(cold(c) for c in size_matched_copies(2 * x.numel() * 4, dev))
case = dpk.make_case("gn_mish", "b1_c256_l1024", "float32", B=1, C=256, L=1024, G=8)
xs, g, b, G, eps = fam.make_inputs(case, dev)
kn = T().as_list()
if MODE == "ladder":
    steps = {"L0": (0, 0, 1), "L1": (0, 0, 8), "L2": (2, 0, 8), "L3": (3, 0, 8), "L4": (4, 0, 8), "L5": (5, 0, 8)}
else:  # launch setup: v1 = gn_mish.cu's (the attribute at the opt-in maximum, 64 B dynamic)
    steps = {"L5": (5, 0, 8), "L5v1": (5, 1, 8), "L5v2": (5, 2, 8), "L5v3": (5, 3, 8), "L5v4": (5, 4, 8),
             "L0": (0, 0, 1), "L0v1": (0, 1, 1), "L6": (6, 0, 8), "L6v1": (6, 1, 8), "L6v4": (6, 4, 8)}
fns = {k: (lambda lv=lv, va=va, k_=k_: lad.forward(x, y, gb, lv, va, k_, 256)) for k, (lv, va, k_) in steps.items()}
fns["fused"] = lambda: ext.forward(xs, g, b, G, eps, kn)
if NOATTR is not None:
    fns["fused noattr"] = lambda: NOATTR.forward(xs, g, b, G, eps, kn)
print(line(f"ladder 1 MB 8x256 {MODE}", copy, ab(fns)), flush=True)
if MODE == "ladder":
    steps16 = {"L0/128": (0, 0, 1), "L1/16": (0, 0, 16), "L4/16": (4, 0, 16), "L5/16": (5, 0, 16)}
    fns = {k: (lambda lv=lv, va=va, k_=k_: lad.forward(x, y, gb, lv, va, k_, 128))
           for k, (lv, va, k_) in steps16.items()}
    print(line("ladder 1 MB 16x128", copy, ab(fns)), flush=True)
if NOATTR is not None:  # the fused kernel without MaxDynamicSharedMemorySize at the opt-in maximum, tier-1 shapes
    for C, L, dt in ((256, 1024, "float32"), (512, 1024, "float32"), (1024, 1024, "float32"),
                     (2048, 1024, "float32"), (1024, 1024, "bfloat16"), (256, 1024, "float32")):
        B = 8 if C == 2048 else 1
        case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
        inputs = fam.make_inputs(case, dev)
        xs2, g2, b2, G2, eps2 = inputs
        ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
        tol = fam.tolerance(case, "float32")
        err = max(((m.forward(xs2, g2, b2, G2, eps2, kn).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs()))
                  .max().item() for m in (ext, NOATTR))
        c2 = min(cold(c) for c in size_matched_copies(2 * xs2.numel() * xs2.element_size(), dev))
        meds = ab({"default": lambda: ext.forward(xs2, g2, b2, G2, eps2, kn),
                   "noattr": lambda: NOATTR.forward(xs2, g2, b2, G2, eps2, kn)})
        print(line(f"{case.name} {dt}", c2, meds, {"default": plan_label(xs2, G2, kn)}) + f" | err/tol {err:.3f}",
              flush=True)
if MODE != "ladder":
    raise SystemExit(0)


def knob_ab(B: int, C: int, L: int, dt: str, knobs: dict, show_plans: bool) -> None:
    """The fused kernel's knob sets on one shape: A/B/A medians, % of the same-size copy, parity vs fp64."""
    case = dpk.make_case("gn_mish", f"b{B}_c{C}_l{L}", dt, B=B, C=C, L=L, G=8)
    inputs = fam.make_inputs(case, dev)
    xs, g, b, G, eps = inputs
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    copy = min(cold(c) for c in size_matched_copies(2 * xs.numel() * xs.element_size(), dev))
    kns = {k: T(**v).as_list() for k, v in knobs.items()}
    err = max(((ext.forward(xs, g, b, G, eps, v).double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max().item()
              for v in kns.values())
    meds = ab({k: (lambda v=v: ext.forward(xs, g, b, G, eps, v)) for k, v in kns.items()})
    plans = {k: plan_label(xs, G, v) for k, v in kns.items()} if show_plans else None
    print(line(f"{case.name} {dt}", copy, meds, plans) + f" | err/tol {err:.3f}", flush=True)


# 2. tier-1 CTA shapes, B = 1
for C, L, dt in ((256, 1024, "float32"), (512, 1024, "float32"), (1024, 1024, "float32"), (1024, 1024, "bfloat16")):
    knob_ab(1, C, L, dt, {"default": {}, "t1=256": {"t1_threads": 256}, "t1=128": {"t1_threads": 128},
                          "t1=64": {"t1_threads": 64}, "k<=4": {"max_cluster": 4}}, True)

# 3. tier 3's request depth, 16-bit b1_c2048_l4096
for dt in ("bfloat16", "float16"):
    knob_ab(1, 2048, 4096, dt, {"default": {}, "d2": {"t3_depth": 2}, "d3": {"t3_depth": 3}, "d6": {"t3_depth": 6},
                                "d8": {"t3_depth": 8}, "r16": {"t3_reducers": 16}}, False)
