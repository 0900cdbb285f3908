"""Does the cover spin's length change what a cold sample times? Cold medians (us, the engine of 501f08b) of a
one-element add, a 1 MB copy_ and fused gn_mish b1_c256_l1024 fp32 with the spin's margin forced to 0..400 us
(cover = 2 x host cost + margin), three measurements each, A/B order over the margins twice."""
import statistics as st

import torch

import dpk
from dpk.timing import Timer, TimingConfig
from dpk.timing_aids import size_matched_copies

dev = torch.device("cuda")
reg = dpk.registry.load([__import__("pathlib").Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = reg.variant("gn_mish", "fused")
case = dpk.make_case("gn_mish", "b1_c256_l1024", "float32", B=1, C=256, L=1024, G=8)
x, g, b, G, eps = fam.make_inputs(case, dev)
memcpy, _ = size_matched_copies(2 * x.numel() * 4, dev)
tiny = torch.zeros(1, device=dev)
FNS = {"tiny": lambda: tiny.add_(1), "memcpy": memcpy, "fused": lambda: fused.fn(x, g, b, G, eps)}
MARGINS = [0, 10, 25, 50, 100, 200, 400]
print(torch.cuda.get_device_name(), flush=True)
res = {(k, m): [] for k in FNS for m in MARGINS}
for rnd in range(2):
    for m in (MARGINS if rnd == 0 else MARGINS[::-1]):
        timer = Timer(dev, TimingConfig(budget_s=0.1, cover_margin_s=m * 1e-6))
        for k, fn in FNS.items():
            res[(k, m)] += [timer.measure(fn, "cold").stats.median * 1e6 for _ in range(3)]
print("margin_us " + " ".join(f"{k:>22}" for k in FNS))
for m in MARGINS:
    print(f"{m:9} " + " ".join(f"{st.median(res[(k, m)]):7.2f} [{min(res[(k, m)]):5.2f}-{max(res[(k, m)]):5.2f}]"
                               for k in FNS), flush=True)
