"""Timing engine on CPU: stats on a fake clock, adaptive stopping, modes, interleaved sides (also through the GPU
loop, on fake CUDA events)."""
from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from dpk import stats, timing
from dpk.registry import Unavailable
from dpk.timing import Timer, TimingConfig

from ._helpers import gpu_test


class FakeClock:
    """A clock that only moves when the timed function says so."""

    def __init__(self, durations):
        self.t = 0.0
        self.durations = itertools.cycle(durations)

    def __call__(self) -> float:
        return self.t

    def work(self) -> None:
        self.t += next(self.durations)


def test_stats_on_fake_clock_are_exact():
    clock = FakeClock([1e-3, 2e-3, 3e-3, 4e-3])
    cfg = TimingConfig(clock=clock, warmup_s=0.0, min_samples=40, max_samples=40, target_rel=0.0, budget_s=1e9)
    m = Timer(torch.device("cpu"), cfg).measure(clock.work, "hot")
    assert m.timer == "perf_counter" and m.stopped == "max_samples"
    assert len(m.samples) == 40 and sorted(set(round(s, 9) for s in m.samples)) == [1e-3, 2e-3, 3e-3, 4e-3]
    s = m.stats
    assert s.n == 40 and s.min == pytest.approx(1e-3) and s.mean == pytest.approx(2.5e-3)
    assert s.median == pytest.approx(2.5e-3) and s.iqr == pytest.approx(1.5e-3)
    assert s.p10 == pytest.approx(1e-3) and s.p90 == pytest.approx(4e-3)


def test_adaptive_stop_on_precision_and_budget():
    steady = FakeClock([1e-3])
    cfg = TimingConfig(clock=steady, warmup_s=0.0, min_samples=10, min_time_s=0.0, budget_s=1e9)
    m = Timer(torch.device("cpu"), cfg).measure(steady.work, "hot")
    assert m.stopped == "precision" and m.stats.n == 10  # zero spread: stops at the minimum
    m = Timer(torch.device("cpu"), replace(cfg, min_time_s=0.025)).measure(steady.work, "hot")
    assert m.stopped == "precision" and m.stats.n == 25  # ... but samples for min_time_s first
    noisy = FakeClock([1e-3, 5e-3, 2e-3, 9e-3, 1e-4])
    cfg = TimingConfig(clock=noisy, warmup_s=0.0, min_samples=10, target_rel=1e-6, budget_s=0.2)
    m = Timer(torch.device("cpu"), cfg).measure(noisy.work, "hot")
    assert m.stopped == "budget" and m.stats.rel_spread > 1e-6
    assert sum(m.samples) == pytest.approx(0.2, rel=0.1)  # all samples kept, none beyond the budget + one


def test_real_cpu_modes():
    a = torch.randn(64, 64)
    timer = Timer(torch.device("cpu"), TimingConfig(budget_s=0.1, min_samples=5))
    for mode in ("hot", "cold"):  # a cold sample first rewrites a 2xLLC buffer: few fit in the budget
        m = timer.measure(lambda: a @ a, mode)
        assert m.stats.n >= 3 and m.stats.median > 0 and m.host_s is not None
    with pytest.raises(Unavailable, match="CUDA GPU"):
        timer.measure(lambda: a @ a, "graph")
    with pytest.raises(ValueError, match="unknown timing mode"):
        timer.measure(lambda: a @ a, "warm")
    assert timer.first_call(lambda: a @ a) > 0


def test_quantiles_and_median_ci():
    xs = sorted(float(i) for i in range(1, 101))
    assert stats.quantile(xs, 0.5) == pytest.approx(50.5)
    lo, hi = stats.median_ci(xs)
    assert 40 <= lo < 50.5 < hi <= 61
    s = stats.summarize([1.0])
    assert s.n == 1 and s.std == 0 and s.median == 1.0


def test_mann_whitney_against_known_values():
    # Same sample: no evidence. Fully separated samples of 10: exact two-sided p = 2/C(20,10) = 1.08e-5;
    # the normal approximation with continuity correction gives ~1.8e-4.
    a = [float(i) for i in range(10)]
    assert stats.mann_whitney_p(a, a) == pytest.approx(1.0, abs=0.05)
    p = stats.mann_whitney_p(a, [x + 100 for x in a])
    assert 1e-5 < p < 5e-4
    assert stats.mann_whitney_p([1.0, 2.0], [3.0, 4.0]) == 1.0  # too few samples: never a verdict


@gpu_test
def test_gpu_modes_time_the_device_and_name_host_bound_calls():
    """cold/hot time the device: a call whose host cost is ~10x its device time (20 tiny launches) is covered
    (uncovered ~0, hot well below the host cost); a call that synchronises is named host-bound (uncovered 1)."""
    dev = torch.device("cuda")
    x = torch.zeros(256, device=dev)

    def launches() -> None:
        for _ in range(20):
            x.add_(1)

    def syncing() -> None:
        x.add_(1)
        torch.cuda.synchronize(dev)

    timer = Timer(dev, TimingConfig(budget_s=0.1))
    for mode in ("cold", "hot"):
        m = timer.measure(launches, mode)
        assert m.uncovered is not None and m.uncovered < 0.1, (mode, m.uncovered)
        assert m.host_probe_s and m.host_probe_s > 0
        if mode == "hot":
            assert m.stats.median < 0.7 * m.host_s, (m.stats.median, m.host_s)  # device time, not the host's
        s = timer.measure(syncing, mode)
        assert s.uncovered is not None and s.uncovered > 0.9, (mode, s.uncovered)
    g = timer.measure(launches, "graph")
    assert g.uncovered is not None and g.uncovered < 0.1 and g.host_probe_s is None


@gpu_test
def test_graph_mode_does_not_time_the_host_submitting_a_replay(monkeypatch):
    """A replay whose submission the host delays by 100 us (a GIL stall, a busy CPU) times as the plain one: the
    spin queues it before the first event fires. Without the spin its pilot and samples both timed the delay (an
    H100 run: a 1.9 us kernel at 5.8 us)."""
    dev = torch.device("cuda")
    x = torch.zeros(256, device=dev)
    timer = Timer(dev, TimingConfig(budget_s=0.1))
    plain = timer.measure(lambda: x.add_(1), "graph")

    class SlowReplay:
        def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
            self.graph = graph

        def replay(self) -> None:
            time.sleep(1e-4)
            self.graph.replay()

    capture = timing.capture_graph
    monkeypatch.setattr(timing, "capture_graph", lambda fn, calls, device: SlowReplay(capture(fn, calls, device)))
    slow = timer.measure(lambda: x.add_(1), "graph")
    assert slow.calls_per_sample >= plain.calls_per_sample // 2, (slow.calls_per_sample, plain.calls_per_sample)
    assert slow.stats.median < 1.5 * plain.stats.median, (slow.stats.median, plain.stats.median)


@gpu_test
def test_cold_samples_of_a_tiny_kernel_are_tight_and_have_no_period():
    """One sample in flight: a one-element add's cold samples have medians by position modulo 4 within 0.3 us
    and p90 - p10 under 0.8 us. With samples queued ahead, an H100 spread those medians by ~1 us (one position
    in four slow) and p10..p90 by ~1.4 us (results/nvidia-h100-80gb-hbm3/tune/cold-period-probe-20261125.txt)."""
    dev = torch.device("cuda")
    x = torch.zeros(1, device=dev)
    m = Timer(dev, TimingConfig(budget_s=0.3, target_rel=0.0)).measure(lambda: x.add_(1), "cold")
    us = [t * 1e6 for t in m.samples]
    assert len(us) >= 200, len(us)
    by_pos = [statistics.median(us[i::4]) for i in range(4)]
    assert max(by_pos) - min(by_pos) < 0.3, by_pos
    assert m.stats.p90 - m.stats.p10 < 0.8e-6, (m.stats.p10, m.stats.p90)


def test_size_matched_copies_move_the_bytes():
    """Both copies (memcpy, elementwise) read and write half of `nbytes`: one source into one destination."""
    from dpk.timing_aids import size_matched_copies

    nbytes = 8 * 1000 + 4
    copies = size_matched_copies(nbytes, torch.device("cpu"))
    assert len(copies) == 2
    first = copies[0]().clone()
    assert first.numel() == nbytes // 8 and first.dtype == torch.float32 and first.abs().sum() > 0
    out = copies[1]()
    out_ptr = out.data_ptr()
    out.zero_()
    torch.testing.assert_close(copies[1](), first)
    assert copies[0]().data_ptr() == out_ptr  # one destination, written by both


def test_interleaved_samples_alternate_in_one_loop_and_stop_when_every_side_is_precise():
    """measure_interleaved on CPU: A, B, A, B, ... in one loop; each side keeps its own samples; a steady side
    alone does not stop the loop while the other is still short of its precision."""
    clock = FakeClock([0.0])
    order: list[str] = []

    def side(name: str, durations: list[float]):
        it = itertools.cycle(durations)

        def fn() -> None:
            order.append(name)
            clock.t += next(it)
        return fn
    cfg = TimingConfig(clock=clock, warmup_s=0.0, min_samples=10, min_time_s=0.0, target_rel=0.05, budget_s=1e9)
    a, b = Timer(torch.device("cpu"), cfg).measure_interleaved(
        [side("A", [1e-3]), side("B", [2e-3, 2e-3, 2e-3, 4e-3] * 3 + [2e-3] * 40)], "hot")
    assert a.stats.median == pytest.approx(1e-3) and b.stats.median == pytest.approx(2e-3)
    assert a.stats.n == b.stats.n > 10 and a.stopped == b.stopped == "precision"  # B needed more than A alone
    assert order[:6] == ["A"] * 3 + ["B"] * 3  # each side's warm-up (3 calls), then the samples in turn
    assert order[6:] == ["A", "B"] * a.stats.n


class FakeEvent:
    """torch.cuda.Event on the fake clock: record() notes the time, query() says whether the spin had ended."""

    clock: FakeClock
    late: Callable[[], bool]

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = self.clock.t

    def query(self) -> bool:
        return self.late()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1e3


def test_interleaved_gpu_loop_on_fake_cuda(monkeypatch):
    """The CUDA loop (events, spin, cover check) on CPU with fake events: two sides sampled in turn inside the same
    batches; a side whose spin falls short has its batch discarded and only its spin doubled."""
    from dpk import timing

    clock = FakeClock([0.0])
    sleeps: list[int] = []
    calls: list[str] = []
    late_b = {"batches": 1}  # side B's first batch finds the spin ended before the call was queued

    def late() -> bool:
        return calls[-1] == "B" and late_b["batches"] > 0

    FakeEvent.clock, FakeEvent.late = clock, staticmethod(late)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", sleeps.append)
    monkeypatch.setattr(timing, "host_probe_s", lambda device: 1e-6)
    monkeypatch.setattr(Timer, "_sync", lambda self: None)
    monkeypatch.setattr(Timer, "_flush", lambda self: calls.append("flush"))
    discarded = {"n": 0}
    real_keep = timing.Side.too_short

    def too_short(self, max_cycles, grow):
        short = real_keep(self, max_cycles, grow)
        if short:
            discarded["n"] += 1
            late_b["batches"] = 0
        return short
    monkeypatch.setattr(timing.Side, "too_short", too_short)

    def side(name: str, seconds: float):
        def fn() -> None:
            calls.append(name)
            clock.t += seconds
        return fn
    timer = Timer(torch.device("cpu"), TimingConfig(warmup_s=0.0, min_samples=8, min_time_s=0.0, budget_s=1e9))
    timer.cuda = True
    a, b = timer.measure_interleaved([side("A", 1e-5), side("B", 3e-5)], "cold")
    assert a.timer == b.timer == "cuda_event" and a.stats.n == b.stats.n >= 8
    assert a.stats.median == pytest.approx(1e-5) and b.stats.median == pytest.approx(3e-5)
    assert a.uncovered == b.uncovered == 0.0 and discarded["n"] == 1
    sampled = calls[calls.index("flush"):]
    assert sampled[:4 * 4] == ["flush", "A", "flush", "B"] * 4  # the first batch: 4 rounds of A then B
    assert len(sleeps) == 2 * 4 + 2 * a.stats.n  # the discarded batch's spins, then the kept samples'
    assert sleeps[8:10] == [sleeps[0], 2 * sleeps[1]]  # B's spin doubled after its late batch; A's kept


def test_a_call_late_behind_the_longest_spin_waits_at_once():
    """A batch all late behind the longest spin gives up on the spin at once (no second wasted batch); with a
    shorter spin it first doubles the spin."""
    from dpk.timing_aids import Side

    capped = Side(lambda: None, 1, cover=1000, grow=3)
    capped.batch = ([1.0] * 4, [1.0] * 4, [True] * 4)
    assert capped.too_short(max_cycles=1000, cover_grow=3) and capped.waits
    short = Side(lambda: None, 1, cover=100, grow=3)
    short.batch = ([1.0] * 4, [1.0] * 4, [True] * 4)
    assert short.too_short(max_cycles=1000, cover_grow=3) and not short.waits and short.cover == 200
    short.batch = ([1.0] * 4, [1.0] * 4, [True] * 4)
    assert short.too_short(max_cycles=1000, cover_grow=3) and short.waits
