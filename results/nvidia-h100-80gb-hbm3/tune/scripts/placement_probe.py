"""Is the whole-measurement slow mode of 1 MB cold rows a matter of where the buffers sit? Cold medians (us, the
engine of 501f08b) of a 1 MB copy_ and of fused gn_mish b1_c256_l1024 fp32 with their buffers at chosen offsets in
one large allocation (offset modulo 2 MiB printed), and with fresh allocations."""
import statistics as st

import torch

import dpk
from dpk.timing import Timer, TimingConfig

dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.1))
reg = dpk.registry.load([__import__("pathlib").Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = reg.variant("gn_mish", "fused")
case = dpk.make_case("gn_mish", "b1_c256_l1024", "float32", B=1, C=256, L=1024, G=8)
x0, g, b, G, eps = fam.make_inputs(case, dev)
N = x0.numel()  # 1 MiB of fp32
MB = 1 << 20
big = torch.randn(64 * MB // 4, device=dev)
print(f"{torch.cuda.get_device_name()}  big at {big.data_ptr() % (2 * MB) / MB:.2f} MiB mod 2 MiB", flush=True)


def med(fn) -> float:
    return st.median(timer.measure(fn, "cold").stats.median * 1e6 for _ in range(3))


def view(off_mb: float) -> torch.Tensor:
    start = int(off_mb * MB) // 4
    return big[start:start + N]


print("== copy_ dst <- src, offsets from an 8 MiB mark (MiB); rows: src, columns: dst")
offs = [0.0, 0.5, 1.0, 1.5]
print("src\\dst " + " ".join(f"{o:6.2f}" for o in offs))
for so in offs:
    src = view(8 + so)
    cells = []
    for do in offs:
        dst = view(24 + do)
        cells.append(med(lambda src=src, dst=dst: dst.copy_(src)))
    print(f"{so:6.2f}  " + " ".join(f"{c:6.2f}" for c in cells), flush=True)

print("== fused, x at offsets (MiB; y is the kernel's own allocation)")
for xo in [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]:
    x = view(40 + xo).view_as(x0)
    y = fused.fn(x, g, b, G, eps)
    print(f"x {xo:5.2f}  y mod 2 MiB {y.data_ptr() % (2 * MB) / MB:.2f}: {med(lambda x=x: fused.fn(x, g, b, G, eps)):6.2f}",
          flush=True)

print("== fresh allocations (kept alive), x and the copy's buffers")
keep = []
for t in range(10):
    x = torch.randn_like(x0)
    src, dst = torch.randn(N, device=dev), torch.empty(N, device=dev)
    keep += [x, src, dst, torch.empty(int(0.37 * MB * (t + 1)), device=dev)]  # shift the next allocations
    y = fused.fn(x, g, b, G, eps)
    f = med(lambda x=x: fused.fn(x, g, b, G, eps))
    c = med(lambda src=src, dst=dst: dst.copy_(src))
    print(f"trial {t}: x {x.data_ptr() % (2 * MB) / MB:.2f} y {y.data_ptr() % (2 * MB) / MB:.2f} fused {f:6.2f} | "
          f"src {src.data_ptr() % (2 * MB) / MB:.2f} dst {dst.data_ptr() % (2 * MB) / MB:.2f} copy {c:6.2f} "
          f"-> {100 * c / f:.1f} %", flush=True)
