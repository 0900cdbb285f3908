"""The one timing engine. Everything that reports a time (CLI, pytest-benchmark, asv, `dpk ab`) calls
`Timer.measure` or `Timer.measure_interleaved`; both run the same sampling loop.

GPU (CUDA events, one pair per sample, all kept samples stored). Every mode times the DEVICE; the host's cost
of one call is measured separately (`host_s`), so a row does not move with the host CPU's speed:
  cold   flush L2 before every sample, outside the event pair, by READING a buffer >= 2x the device's L2:
         L2 ends up full of clean lines unrelated to the call (a write flush would leave dirty lines whose
         write-backs get charged to the call's own reads). Then the stream is held by a spin covering the
         call's host cost (nvbench's blocking-kernel idea), so the whole call is queued before the first
         event fires: device time with a cold L2, GPU-side kernel starts included.
  hot    M back-to-back calls between one event pair, divided by M (M sized so a sample lasts ~hot_target_s),
         queued behind the same kind of spin: device time per call with a warm L2, the GPU-side gaps between
         launches included. An eager loop costs max(host_s, hot) per call.
  graph  K calls captured in one CUDA graph and replayed behind the same kind of spin; sample = replay time / K:
         device time with launch overhead removed. The spin matters here too: on an idle stream the event pair
         would also time the host's submission of the replay, and a host stall would inflate both the samples
         and the pilot replay that sizes K.
One sample in flight: the host waits for each sample's end event before it queues the next (as nvbench's cold
loop does). Samples queued ahead let the next sample's flush, spin and events reach the GPU while the call still
runs, which adds a constant and a periodic pattern to the samples of microsecond kernels.
Cover check: after each call is enqueued, the event behind the spin is queried; if it already fired, the
spin ended before the host had queued the call (the host was slower than the cover, or the call waits for
the device: `.item()`, a pageable copy). A batch with such samples doubles the spin and is discarded, up to
`cover_grow` times; a call late in two whole batches (or in one behind the longest spin) waits for the device or
outlasts any spin on the host, so it is sampled without a spin
(after a synchronize, so its own wait finds the device idle instead of a long wait and a slow wake-up) and
counts as uncovered. The fraction of uncovered kept samples is recorded (`uncovered`): such a row times the
host, not the kernel, and `dpk compare` judges it on host-speed-normalised samples, using `host_probe_s`, a
fixed host workload timed between the row's batches.

Stopping: warm up for `warmup_s`, then sample in growing batches until the ~95% CI of the median is
within `target_rel` of it (after `min_samples` and `min_time_s` of sampling), or `budget_s` runs out. The
minimum time matters because the samples of one measurement can be tight and still all be offset: precision
reached after a dozen samples would let one short, unlucky stretch of time decide the row.

Interleaved (`measure_interleaved`, for `dpk ab`): several callables sampled in turn, A, B, A, B, ..., inside
the same batches of the same loop, so a drift of clocks or host speed during the measurement touches every side
alike; it stops when every side has its precision, or at the budget.

Latency (`latency`; `latencies` samples several in turn; timer "wall"): host wall time from a call to its output
on the host, the device idle (and on a GPU its L2 flushed) before each sample: what a caller that acts on the
result waits for. It and CPU runs use one host-clock loop with the same warm-up, stopping rule and statistics,
on `clock` (time.perf_counter by default; tests inject a fake clock; on a GPU always perf_counter).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .clocks import ClockTrace, nvml_for
from .registry import Unavailable
from .stats import Stats, summarize
from .timing_aids import Side, capture_graph, flush_cache, host_probe_s, sm_hz, to_host

TIMING_ENGINE = 4  # stored in each run's fingerprint; a change to what a sample measures bumps it (caveats.py)
MODES = ("cold", "hot", "graph")
PROBED = ("cold", "hot")  # modes whose calls can be host-bound (a graph replay never waits for the device)


@dataclass
class TimingConfig:
    target_rel: float = 0.01
    budget_s: float = 1.0
    min_samples: int = 10
    min_time_s: float = 0.02  # precision may stop sampling only after this much wall time (nvbench: --min-time)
    max_samples: int = 20000
    warmup_s: float = 0.05
    graph_target_s: float = 2e-4  # device time one replay should take; K = this / time of one call
    graph_max_calls: int = 100
    hot_target_s: float = 1e-4  # wall time of one hot sample; M = this / time of one call
    hot_max_calls: int = 200
    cover_factor: float = 2.0  # cold/hot: spin for this times the call's host cost, plus cover_margin_s
    cover_margin_s: float = 1e-5
    cover_max_s: float = 4e-3
    cover_grow: int = 3  # times a batch with uncovered samples doubles the spin (and is discarded)
    clock: Callable[[], float] = time.perf_counter


@dataclass
class Measurement:
    mode: str
    timer: str  # "cuda_event", "perf_counter" (CPU runs) or "wall" (latency)
    samples: list[float]  # seconds per call
    stats: Stats
    host_s: float | None = None  # median host-side cost of one call
    calls_per_sample: int = 1
    stopped: str = ""
    clocks: dict[str, Any] = field(default_factory=dict)
    throttled: bool = False
    uncovered: float | None = None  # on a GPU: fraction of kept samples the spin did not cover
    host_probe_s: float | None = None  # cold/hot on a GPU: median of the host probe timed between batches


class Timer:
    """Times zero-argument callables on one device."""

    def __init__(self, device: torch.device, cfg: TimingConfig | None = None):
        self.device = device
        self.cfg = cfg or TimingConfig()
        self.cuda = device.type == "cuda"

    # -- helpers ---------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _flush(self) -> None:
        flush_cache(self.device)

    def first_call(self, fn: Callable[[], Any]) -> float:
        """Wall time of the very first call (JIT builds, torch.compile, autotuning), synchronized."""
        self._sync()
        t0 = time.perf_counter()
        fn()
        self._sync()
        return time.perf_counter() - t0

    def _host_clock(self) -> Callable[[], float]:
        return self.cfg.clock if not self.cuda else time.perf_counter

    def _warmup(self, fn: Callable[[], Any]) -> None:
        clock = self._host_clock()
        end = clock() + self.cfg.warmup_s
        calls = 0
        while calls < 3 or clock() < end:
            fn()
            calls += 1
            if calls % 16 == 0:
                self._sync()
        self._sync()

    def _done(self, sides: list[list[float]], start: float, deadline: float, now: float) -> str:
        """Why sampling stops now ('' to go on): every side must have its precision; one full side ends it."""
        n = min(len(s) for s in sides)
        if max(len(s) for s in sides) >= self.cfg.max_samples:
            return "max_samples"
        if (n >= self.cfg.min_samples and now - start >= self.cfg.min_time_s
                and all(summarize(s).rel_spread <= self.cfg.target_rel for s in sides)):
            return "precision"
        if now >= deadline and n >= min(self.cfg.min_samples, 3):
            return "budget"
        return ""

    # -- public ----------------------------------------------------------------------------------
    def measure(self, fn: Callable[[], Any], mode: str) -> Measurement:
        """Sample `fn` in `mode` ('cold' | 'hot' | 'graph')."""
        return self.measure_interleaved([fn], mode)[0]

    def latency(self, fn: Callable[[], Any]) -> Measurement:
        """Wall time from calling `fn` to its output on the host (`.cpu()` of a tensor, or of each tensor of a
        tuple/list; a sync when it returns none), each sample started on an idle device with L2 flushed on a GPU."""
        return self.latencies([fn])[0]

    def latencies(self, fns: Sequence[Callable[[], Any]]) -> list[Measurement]:
        """`latency` of several callables sampled in turn (A, B, A, B, ...), one Measurement each, in order."""
        if not fns:
            raise ValueError("nothing to measure")
        return self._host_loop(list(fns), "latency")

    def measure_interleaved(self, fns: Sequence[Callable[[], Any]], mode: str) -> list[Measurement]:
        """Sample several callables in turn (A, B, A, B, ... within each batch of one loop), one Measurement
        each, in `fns`' order. Sampling stops when every side has its precision, or at the budget."""
        if mode not in MODES:
            raise ValueError(f"unknown timing mode {mode!r}; modes: {', '.join(MODES)}")
        if not fns:
            raise ValueError("nothing to measure")
        if mode == "graph":
            if not self.cuda:
                raise Unavailable("graph mode needs a CUDA GPU")
            replays = [self._capture(fn) for fn in fns]
            ms = self._measure_cuda(replays, "graph")
            del replays
            return ms
        if not self.cuda:
            return self._host_loop(list(fns), mode)  # perf_counter costs ~0.1 us: one call per sample is fine
        if mode == "hot":
            return self._measure_cuda([self._hot_batch(fn) for fn in fns], "hot")
        return self._measure_cuda([(fn, 1) for fn in fns], mode)

    def _hot_batch(self, fn: Callable[[], Any]) -> tuple[Callable[[], None], int]:
        """M back-to-back calls of `fn` as one callable, M sized from a wall-time pilot."""
        m = self._calls_per_sample(fn, self.cfg.hot_target_s, self.cfg.hot_max_calls, self._wall_pilot(fn))

        def batch() -> None:
            for _ in range(m):
                fn()
        return batch, m

    def _host_loop(self, fns: list[Callable[[], Any]], mode: str) -> list[Measurement]:
        """The host-clock loop: CPU runs (a call per sample) and latency (flush and an idle device before each
        sample, the output brought to the host inside it)."""
        clock, wall = self._host_clock(), mode == "latency"
        for fn in fns:
            self._warmup(fn)
        sides: list[list[float]] = [[] for _ in fns]
        start = clock()
        deadline = start + self.cfg.budget_s
        while not (stopped := self._done(sides, start, deadline, clock())):
            for fn, samples in zip(fns, sides):
                if mode == "cold" or (wall and self.cuda):
                    self._flush()
                if wall:
                    self._sync()  # flush done, device idle: nothing queued before the call is charged to it
                t0 = clock()
                out = fn()
                if wall and not to_host(out):
                    self._sync()  # no tensor came back: the result is ready when the device is idle
                samples.append(clock() - t0)
        return [Measurement(mode, "wall" if wall else "perf_counter", s, summarize(s),
                            host_s=None if wall else summarize(s).median, stopped=stopped) for s in sides]

    def _measure_cuda(self, calls: list[tuple[Callable[[], Any], int]], mode: str) -> list[Measurement]:
        """The GPU loop over one or more sides, each `(fn, k)`: fn makes k calls, a sample is its time / k."""
        sides = []
        for fn, k in calls:
            self._warmup(fn)
            sides.append(Side(fn, k, self._cover_cycles(fn), self.cfg.cover_grow))  # every mode spins
        nvml, trace = nvml_for(self.device), ClockTrace()
        nvml.sample(trace)
        probe: list[float] = []
        start = time.perf_counter()
        deadline = start + self.cfg.budget_s
        batch = 4
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        while True:
            for side in sides:
                side.batch = ([], [], [])
            for _ in range(batch):
                for side in sides:  # interleaved: A, B, A, B, ... within the batch
                    self._sample(side, mode, e0, e1)
            if mode in PROBED:  # only cold/hot rows can be host-bound and judged per host op
                probe.append(host_probe_s(self.device))
            if any([side.too_short(self._cycles(self.cfg.cover_max_s), self.cfg.cover_grow) for side in sides]):
                continue  # a spin was too short: discard the batch (every side's), that side spins longer
            for side in sides:
                side.keep()
            nvml.sample(trace)
            if stopped := self._done([side.samples for side in sides], start, deadline, time.perf_counter()):
                break
            spent = sum(sum(side.samples[-batch:]) * side.k for side in sides)
            batch = int(min(max(batch * 2, 4), 256, max(4, 0.05 / max(spent / batch, 1e-7))))
        return [Measurement(mode, "cuda_event", side.samples, summarize(side.samples),
                            host_s=None if mode == "graph" else summarize(side.host).median, calls_per_sample=side.k,
                            stopped=stopped, clocks=trace.summary(), throttled=trace.throttled,
                            uncovered=sum(side.late) / len(side.late),
                            host_probe_s=summarize(probe).median if probe else None) for side in sides]

    def _sample(self, side: Side, mode: str, e0: torch.cuda.Event, e1: torch.cuda.Event) -> None:
        """One sample of one side: flush (cold), spin, events around the call, wait for it to finish."""
        b_samples, b_host, b_late = side.batch
        if mode == "cold":
            self._flush()
        if side.waits:
            self._sync()  # the call will wait for the device anyway: let it find the flush done
        else:
            torch.cuda._sleep(side.cover)
        e0.record()
        h0 = time.perf_counter()
        side.fn()
        b_host.append((time.perf_counter() - h0) / side.k)
        e1.record()
        b_late.append(side.waits or e0.query())
        e1.synchronize()  # one sample at a time: see "One sample in flight" above
        b_samples.append(e0.elapsed_time(e1) / 1e3 / side.k)

    def _capture(self, fn: Callable[[], Any]) -> tuple[Callable[[], Any], int]:
        """K back-to-back calls of `fn` in one CUDA graph, K sized from a 4-call graph's replay time (device
        time, whatever the host costs: a few covered samples of the same loop) so that a replay lasts
        ~graph_target_s."""
        pilot = capture_graph(fn, 4, self.device)
        quick = replace(self.cfg, min_samples=3, budget_s=0.0, warmup_s=0.0)
        per_call = Timer(self.device, quick)._measure_cuda([(pilot.replay, 4)], "graph")[0].stats.min
        del pilot
        k = self._calls_per_sample(fn, self.cfg.graph_target_s, self.cfg.graph_max_calls, per_call)
        return capture_graph(fn, k, self.device).replay, k

    def _cover_cycles(self, fn: Callable[[], Any]) -> int:
        """Spin cycles that outlast enqueueing one call: cover_factor x its median host cost + margin."""
        host = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
        self._sync()
        return self._cycles(min(self.cfg.cover_factor * sorted(host)[2] + self.cfg.cover_margin_s,
                                self.cfg.cover_max_s))

    def _cycles(self, seconds: float) -> int:
        return int(seconds * sm_hz(self.device))

    @staticmethod
    def _calls_per_sample(fn: Callable[[], Any], target_s: float, max_calls: int, per_call_s: float) -> int:
        return int(min(max_calls, max(1, math.ceil(target_s / max(per_call_s, 1e-7)))))

    def _wall_pilot(self, fn: Callable[[], Any]) -> float:
        """Wall time of one call in a back-to-back loop (host cost and device time overlapping)."""
        self._warmup(fn)
        t0 = time.perf_counter()
        for _ in range(8):
            fn()
        self._sync()
        return (time.perf_counter() - t0) / 8
