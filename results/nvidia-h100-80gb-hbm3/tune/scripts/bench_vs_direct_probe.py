"""Why did `dpk bench` time fused b1_c256_l1024 at 6.53 us (run 3e75) when direct measure() calls of the same
kernel on the same machine gave 5.84? In one process: `dpk bench` on that case (fused + eager, then fused alone, then
the case after b1_c512 in reverse order), then measure() of the variant directly, through the NVTX wrapper, and with
the bench's fresh inputs. Cold medians, us."""
import json
import statistics as st
import tempfile
from pathlib import Path

import torch

import dpk
from dpk import cli
from dpk.nvtx import ranged
from dpk.timing import Timer, TimingConfig

dev = torch.device("cuda")
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = reg.variant("gn_mish", "fused")
C256, C512 = "b1_c256_l1024_g8.fp32", "b1_c512_l1024_g8.fp32"
out = Path(tempfile.mkdtemp())


def bench(*args: str) -> None:
    cli.main(["bench", "--family", "gn_mish", "--suite", "sweep", "--mode", "cold", "--results-dir", str(out), *args])
    run = sorted(out.glob("*/*.json"))[-1]
    for r in json.loads(run.read_text())["rows"]:
        print(f"   bench {' '.join(args):70} {r['variant']:6} {r['case']:24} {r['median_us']:7.2f} copy "
              f"{r['size_copy_us']:5.2f} n {r['n']} host {r['host_us']:.1f}", flush=True)
    run.unlink()
    run.with_suffix(".csv").unlink()


for args in (("--case", C256, "--variant", "fused", "--variant", "eager"), ("--case", C256, "--variant", "fused"),
             ("--case", f"{C512},{C256}", "--variant", "fused"), ("--case", C256, "--variant", "fused")):
    bench(*args)

case = dpk.make_case("gn_mish", "b1_c256_l1024", "float32", B=1, C=256, L=1024, G=8)
x, g, b, G, eps = fam.make_inputs(case, dev)
timer = Timer(dev, TimingConfig())
direct = lambda: fused.fn(x, g, b, G, eps)  # noqa: E731
wrapped = ranged(direct, "gn_mish", "fused", C256)
for name, fn in (("direct", direct), ("nvtx", wrapped), ("direct", direct), ("nvtx", wrapped)):
    m = [timer.measure(fn, "cold") for _ in range(3)]
    print(f"   measure {name:8} {st.median(x.stats.median * 1e6 for x in m):7.2f} n {[x.stats.n for x in m]} "
          f"host {m[0].host_s * 1e6:.1f}", flush=True)
