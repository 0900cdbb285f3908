"""What the timing engine needs besides its loop: the L2 flush buffer, the spin clock, the host probe, the state
the loop keeps per timed callable, CUDA graph capture, the copy of an output to the host (latency), and the
size-matched copy that a row's bandwidth is also judged against."""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .clocks import nvml_for
from .registry import Unavailable

CPU_FLUSH_CAP = 64 << 20  # CPU runs exercise the harness; a 0.5 GB flush per sample (server LLCs) is not worth it


def _flush_bytes_cpu() -> int:
    try:
        size = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1)
        return min(2 * int(size.rstrip("KM")) * mult, CPU_FLUSH_CAP)
    except (OSError, ValueError):
        return CPU_FLUSH_CAP


@functools.cache
def flush_buffer(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, 0-d sink): the buffer is read into the sink to flush, so no allocation happens per sample."""
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
        nbytes = max(2 * l2, 64 << 20)
    else:
        nbytes = _flush_bytes_cpu()
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    return buf, torch.empty((), dtype=torch.float32, device=device)


def flush_cache(device: torch.device) -> None:
    """Flush the device's L2 (a CPU's last-level cache) by reading a buffer twice its size, queued on the stream."""
    buf, sink = flush_buffer(device)
    if device.type == "cuda":
        torch.sum(buf, dim=0, out=sink)  # every line read allocates in L2: all of it is replaced, clean
    else:
        buf.add_(1)  # read-modify-write: large CPU memsets use non-temporal stores that bypass the cache


def flush_bytes(device: torch.device) -> int:
    buf, _ = flush_buffer(device)
    return buf.numel() * buf.element_size()


@functools.cache
def sm_hz(device: torch.device) -> float:
    """Cycles per second of torch.cuda._sleep's spin: the SM's max clock (NVML), or 2 GHz when unknown."""
    mhz = nvml_for(device).info().get("sm_mhz_max")
    return float(mhz) * 1e6 if mhz else 2e9


PROBE_OPS = 20


def host_probe_s(device: torch.device) -> float:
    """Host seconds to issue one tiny torch op (mean of PROBE_OPS, then a sync): a fixed host workload whose
    time tracks the host CPU's speed, timed between batches so host-bound rows can be normalised by it."""
    x = _probe_tensor(device)
    t0 = time.perf_counter()
    for _ in range(PROBE_OPS):
        x.add_(1)
    t = (time.perf_counter() - t0) / PROBE_OPS
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return t


@functools.cache
def _probe_tensor(device: torch.device) -> torch.Tensor:
    return torch.zeros(1, device=device)


def flush_method(device: torch.device) -> str:
    return f"{'read' if device.type == 'cuda' else 'read-modify-write'} of {flush_bytes(device) >> 20} MiB"


def size_matched_copies(nbytes: int, device: torch.device) -> list[Callable[[], torch.Tensor]]:
    """Two device copies that move `nbytes` in all (half read, half written), like a memory-bound kernel's one read of
    its input and one write of its output: `copy_` (on a GPU the driver's device-to-device memcpy) and an elementwise
    kernel (`mul(src, 1, out=dst)`). Timed in the same mode as a row, the faster is the roofline at that size: a cold
    2 MB copy pays the same kernel start and DRAM latency as the kernel it is compared with, which the 512 MiB probe of
    the fingerprint amortises away. Two, because the driver's memcpy is much slower than an elementwise copy at some
    sizes (for every placement of the buffers) and not at sizes a few KB away, while the elementwise kernel is
    steady; the faster of the two is the copy a kernel could have matched."""
    n = max(1, nbytes // 8)  # float32 elements per buffer
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    return [lambda: dst.copy_(src), lambda: torch.mul(src, 1.0, out=dst)]


def graph_of(fn: Callable[[], Any], device: torch.device, warmup: int = 2, calls: int = 1
             ) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`calls` back-to-back calls of `fn` captured in one CUDA graph, after `warmup` calls on a side stream (as
    torch.cuda.graph requires; cuDNN picks its algorithms, lazy tables and extensions are built outside the
    capture). Returns the graph and the last captured call's output, which lives in the graph's memory pool: the
    graph writes it on every replay. Grad mode is the caller's (wrap the call in torch.no_grad() for inference)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph, out = torch.cuda.CUDAGraph(), None
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn()
    return graph, out


def capture_graph(fn: Callable[[], Any], calls: int, device: torch.device) -> torch.cuda.CUDAGraph:
    """The timing engine's graph: `calls` calls of `fn` (graph_of, 3 warm-up calls); a failed capture makes the
    row unavailable."""
    try:
        graph, _ = graph_of(fn, device, warmup=3, calls=calls)
    except Unavailable:
        raise
    except Exception as e:
        torch.cuda.synchronize(device)
        raise Unavailable(f"CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    return graph


def to_host(out: Any) -> int:
    """Copy a call's output to the host as a caller acting on it must (`.cpu()` of a tensor, or of each tensor of a
    tuple/list); returns how many tensors came back."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return len([t.cpu() for t in outs if isinstance(t, torch.Tensor)])


@dataclass
class Side:
    """The timing loop's state for one callable of a measurement: its spin, cover check and samples."""

    fn: Callable[[], Any]
    k: int  # calls per sample
    cover: int  # spin cycles before each sample
    grow: int  # doublings of the spin left
    waits: bool = False  # the call synchronises with the device: sampled after a sync, without a spin
    samples: list[float] = field(default_factory=list)
    host: list[float] = field(default_factory=list)
    late: list[bool] = field(default_factory=list)  # per kept sample: the spin ended before the call was queued
    batch: tuple[list[float], list[float], list[bool]] = ([], [], [])  # the current batch's samples, host, late

    def too_short(self, max_cycles: int, cover_grow: int) -> bool:
        """Whether this batch is discarded because the spin fell short; grows the spin (or gives up on it)."""
        late = self.batch[2]
        if not (any(late) and self.grow > 0):
            return False
        if all(late) and (self.grow < cover_grow or self.cover >= max_cycles):
            # all late twice, or once with the longest spin already: the call waits for the device (or its host
            # cost outlasts any spin), no spin helps
            self.waits, self.grow = True, 0
        else:
            self.cover, self.grow = min(2 * self.cover, max_cycles), self.grow - 1
        return True

    def keep(self) -> None:
        self.samples += self.batch[0]
        self.host += self.batch[1]
        self.late += self.batch[2]
