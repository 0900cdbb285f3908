"""Does a microsecond cold timing depend on what was timed around it? The 1 MB same-size copies (memcpy, ewcopy) of
b1_c256_l1024 timed with the engine's cold mode in five contexts, each five rounds (medians of each measurement, us;
n samples; SM MHz at the batch boundaries): A alone (the copies back to back, as gn_mish_ab_overlay.py times them);
B in a round robin with eager GroupNorm+Mish on the case (as gn_mish_bisect.py times its kernels); C in a round robin
with a 64 MB copy; D alone again; E alone with a fresh Timer per measurement; F as B. No extension builds."""
import statistics

import torch
import torch.nn.functional as F

import dpk
from dpk.timing import Timer, TimingConfig
from dpk.timing_aids import size_matched_copies

reg = dpk.registry.load(["kernels"], strict=True)
fam = reg.family("gn_mish")
dev = torch.device("cuda")
case = dpk.make_case("gn_mish", "b1_c256_l1024", "float32", B=1, C=256, L=1024, G=8)
x, g, b, G, eps = fam.make_inputs(case, dev)
memcpy, ewcopy = size_matched_copies(2 * x.numel() * 4, dev)
big_src = torch.empty(16 << 20, device=dev)
big_dst = torch.empty_like(big_src)
others = {"eager": lambda: F.mish(F.group_norm(x, G, g, b, eps)), "big copy": lambda: big_dst.copy_(big_src)}
timer = Timer(dev, TimingConfig(budget_s=0.15))


def measure(fn, t=None):
    m = (t or timer).measure(fn, "cold")
    return m.stats.median * 1e6, m.stats.n, m.clocks.get("sm_mhz_min"), m.clocks.get("sm_mhz_end")


def run(name: str, order: list, fresh: bool = False) -> None:
    res = {k: [] for k in order}
    for _ in range(5):
        for k in order:
            fn = memcpy if k == "memcpy" else ewcopy if k == "ewcopy" else others[k]
            res[k].append(measure(fn, Timer(dev, TimingConfig(budget_s=0.15)) if fresh else None))
    cells = []
    for k, v in res.items():
        meds = [m for m, *_ in v]
        cells.append(f"{k} {statistics.median(meds):6.2f} [{min(meds):.2f}-{max(meds):.2f}] n {v[0][1]}-{v[-1][1]} "
                     f"MHz {min(c for *_, c, _ in v)}")
    print(f"{name:34} | " + " | ".join(cells), flush=True)


run("A copies alone", ["memcpy", "ewcopy"])
run("B round robin with eager gn_mish", ["eager", "memcpy", "ewcopy"])
run("C round robin with a 64 MB copy", ["big copy", "memcpy", "ewcopy"])
run("D copies alone again", ["memcpy", "ewcopy"])
run("E copies alone, a fresh Timer each", ["memcpy", "ewcopy"], fresh=True)
run("F round robin with eager again", ["eager", "memcpy", "ewcopy"])
