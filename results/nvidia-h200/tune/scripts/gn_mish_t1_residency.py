"""Tier-1 default plans (t2 = -1) and their residency: grid vs resident CTAs (clusters that fit at once)."""
import importlib
from pathlib import Path
import torch
import dpk
reg = dpk.registry.load([Path("kernels")], strict=True)
fam = reg.family("gn_mish")
fused = importlib.import_module("dpk.families.gn_mish.fused")
ext = fused.extension()
T = fused.Tuning
for dt in ("float32", "bfloat16"):
    for B, C, L in [(2, 2048, 4096), (4, 512, 4096), (4, 1024, 4096), (4, 2048, 2048), (4, 2048, 4096), (8, 512, 4096),
                    (8, 1024, 1024), (8, 2048, 1024), (8, 1024, 4096), (16, 1024, 1024), (16, 1024, 2048), (16, 2048, 4096),
                    (32, 1024, 2048), (64, 1024, 1024)]:
        x = torch.empty(B, C, L, device="cuda", dtype=getattr(torch, dt))
        for kn in ({"t2": -1}, {"t2": 1}):
            p = dict(ext.plan(x, 8, T(**kn).as_list()))
            print(f"{dt:8} b{B}_c{C}_l{L:<5} {str(kn):12} t{p['tier']} {p['cluster']}x{p['threads']} ch{p['chunks']} st{p['stash']} "
                  f"grid {p['grid']} resident {p['resident_ctas']} persistent {p['persistent']}", flush=True)
