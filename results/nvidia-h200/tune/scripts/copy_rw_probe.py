"""Read-only, write-only and copy bandwidth of the bf16 b8_c2048_l4096 size (134 MB each way), cold, us."""
import torch
from dpk.timing import Timer, TimingConfig
dev = torch.device("cuda")
timer = Timer(dev, TimingConfig(budget_s=0.3))
for mb in (134, 67, 16.7, 8.4):
    n = int(mb * 1e6 / 2)
    x = torch.randn(n, device=dev).to(torch.bfloat16)
    y = torch.empty_like(x)
    acc = torch.empty(1, device=dev, dtype=torch.float32)
    t = {}
    t["write fill_"] = lambda: y.fill_(1.0)
    t["read sum"] = lambda: torch.sum(x, dim=0, dtype=torch.float32, out=acc[0])
    t["copy_"] = lambda: y.copy_(x)
    res = {k: sorted(timer.measure(f, "cold").stats.median * 1e6 for _ in range(3))[1] for k, f in t.items()}
    print(f"{mb:6.1f} MB each way: " + "  ".join(f"{k} {v:7.2f} us ({mb * 1e6 * (2 if k == 'copy_' else 1) / v / 1e6:5.2f} TB/s)" for k, v in res.items()), flush=True)
