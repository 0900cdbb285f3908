"""ncu target: the default bf16 / fp32 b8_c2048_l4096 plans once per A/B extension (base, L2 hints h1, h2, h3), two
launches each; ncu filters the grid kernel."""
import importlib
from pathlib import Path
import torch
import dpk, dpk.build
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
exts = {v: dpk.build.cuda_extension(f"dpk_gn_mish_{v}", (Path(f".whl/ab_{v}/gn_mish_binding.cpp"), Path(f".whl/ab_{v}/gn_mish.cu")))
        for v in ("base", "h1", "h2", "h3")}
dev = torch.device("cuda")
for dt in ("bfloat16", "float32"):
    case = dpk.make_case("gn_mish", "b8_c2048_l4096", dt, B=8, C=2048, L=4096, G=8)
    x, g, b, G, eps = fam.make_inputs(case, dev)
    kn = fused.Tuning().as_list()
    for name, e in exts.items():
        for _ in range(2):
            torch.cuda.nvtx.range_push(f"{dt}:{name}")
            e.forward(x, g, b, G, eps, kn)
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(dt, name, flush=True)
