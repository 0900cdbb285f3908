"""Where the cold samples' period of four comes from, and whether the 1 MB copy's fast/slow draws are moments
(shared by a copy and a kernel timed side by side) or something fixed per measurement.

Part 1: the engine's cold sample (flush, spin, e0, call, e1) re-run by hand with one thing changed at a time.
Per variant: median, and the medians by sample position modulo 3, 4, 5 and 8 (spread = max - min, us).
Part 2: the engine's own measure() of a 1 MB copy and of fused b1_c256_l1024, alternated for ROUNDS rounds.
Part 3: the same pair sampled interleaved batch by batch (one batch of each in turn)."""
import statistics as st
import sys

import torch

import dpk
from dpk.timing import Timer, TimingConfig
from dpk.timing_aids import size_matched_copies

dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.15))
reg = dpk.registry.load([__import__("pathlib").Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = reg.variant("gn_mish", "fused")
case = dpk.make_case("gn_mish", "b1_c256_l1024", "float32", B=1, C=256, L=1024, G=8)
inputs = fam.make_inputs(case, dev)
memcpy, ewcopy = size_matched_copies(2 * inputs[0].numel() * 4, dev)
tiny = torch.zeros(1, device=dev)
FNS = {"memcpy": memcpy, "ewcopy": ewcopy, "fused": lambda: fused.fn(*inputs), "tiny": lambda: tiny.add_(1)}
N = int(sys.argv[1]) if len(sys.argv) > 1 else 512
POOL = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(64)]


def loop(fn, how: str) -> list[float]:
    """N cold samples in batches of 64, the engine's sample with `how` changed."""
    for _ in range(20):
        fn()
    cover = timer._cover_cycles(fn)
    out: list[float] = []
    extra = torch.cuda.Event(enable_timing=True)
    while len(out) < N:
        pairs = POOL if how == "pool" else [(torch.cuda.Event(enable_timing=True),
                                             torch.cuda.Event(enable_timing=True)) for _ in range(64)]
        if how == "sync1":
            pairs = POOL[:1] * 64
        got = []
        for e0, e1 in pairs:
            if how == "event3":
                torch.cuda.Event(enable_timing=True).record()
            if how == "kernel3":
                tiny.add_(1)
            timer._flush()
            if how != "nospin":
                torch.cuda._sleep(cover)
            e0.record()
            fn()
            e1.record()
            if how == "sync1":
                e1.synchronize()
                got.append(e0.elapsed_time(e1) * 1e3)
        pairs[-1][1].synchronize()
        out += got if how == "sync1" else [e0.elapsed_time(e1) * 1e3 for e0, e1 in pairs]
    del extra
    return out[:N]


def by_pos(s: list[float], m: int) -> str:
    meds = [st.median(s[i::m]) for i in range(m)]
    return f"mod{m} {max(meds) - min(meds):.2f} [" + " ".join(f"{x:.2f}" for x in meds) + "]"


print(f"{torch.cuda.get_device_name()}  N={N}", flush=True)
print("== part 1: sample loop variants (us)")
for name in ("tiny", "memcpy", "fused"):
    for how in ("engine", "pool", "event3", "kernel3", "sync1", "nospin"):
        s = loop(FNS[name], how)
        print(f"{name:7} {how:8} med {st.median(s):6.2f} p10 {sorted(s)[len(s) // 10]:6.2f} "
              f"p90 {sorted(s)[9 * len(s) // 10]:6.2f} | {by_pos(s, 4)} | {by_pos(s, 8)} | "
              f"{by_pos(s, 3)} | {by_pos(s, 5)}", flush=True)

print("== part 2: measure() alternated, medians us (memcpy, ewcopy, fused, ratio copy/fused)")
for r in range(12):
    m = {k: timer.measure(FNS[k], "cold").stats.median * 1e6 for k in ("memcpy", "ewcopy", "fused")}
    c = min(m["memcpy"], m["ewcopy"])
    print(f"round {r:2}: memcpy {m['memcpy']:.2f} ewcopy {m['ewcopy']:.2f} fused {m['fused']:.2f} "
          f"-> {100 * c / m['fused']:.1f} %", flush=True)

print("== part 3: interleaved by batch of 16 (loop() on 16 samples each in turn), medians of 256 per fn")
for r in range(6):
    acc = {k: [] for k in ("memcpy", "ewcopy", "fused")}
    N = 16
    for _ in range(16):
        for k in acc:
            acc[k] += loop(FNS[k], "engine")
    m = {k: st.median(v) for k, v in acc.items()}
    c = min(m["memcpy"], m["ewcopy"])
    print(f"round {r:2}: memcpy {m['memcpy']:.2f} ewcopy {m['ewcopy']:.2f} fused {m['fused']:.2f} "
          f"-> {100 * c / m['fused']:.1f} %", flush=True)
