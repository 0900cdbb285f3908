"""Latency and stages on CPU, on a fake clock so every number is exact: `Timer.latency`, the runner's `latency_us`
and `stages` columns (tests/plugins/staged: the `chunk` family, latency=True, whose parts cost set times), their round
trip through the results store, `dpk report`'s stage breakdown and `dpk show`'s latency column."""
from __future__ import annotations

import importlib
import json
import math

import pandas as pd
import pytest
import torch

import dpk
from dpk import cli, results, runner, stages, timing
from dpk.cases import SuiteError
from dpk.report_stages import HOST, PANELS, REST, _names, plot_stages, segments
from dpk.runner import Selection, Session
from dpk.timing import Timer, TimingConfig

from .conftest import PLUGINS

STAGED = PLUGINS / "staged"
CPU = torch.device("cpu")
COSTS_US = {"encoder": 1000.0, "unet": 2000.0, "step": 500.0, "unet_step": 1500.0, "issue": 500.0}  # variants.COSTS


class Clock:
    """A clock that moves only when the chunk family's parts spend time on it."""

    t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def chunk(monkeypatch) -> tuple[Session, TimingConfig]:
    """The chunk family on CPU, its parts spending their costs on a fake clock that the timer reads."""
    session = Session([STAGED / "kernels"], [STAGED / "suites"], device=CPU, project=False, strict=True)
    clock = Clock()
    monkeypatch.setattr(importlib.import_module(session.registry.variant("chunk", "eager").fn.__module__),
                        "CLOCK", clock)
    return session, TimingConfig(clock=clock, warmup_s=0.0, min_samples=5, min_time_s=0.0, budget_s=1.0)


def bench(session: Session, cfg: TimingConfig, modes: str = "hot,cold,graph", case: str = "n8") -> list[dict]:
    rows: list[dict] = []
    sel = Selection(families=["chunk"], cases=[case], modes=modes.split(","))
    session.bench(sel, cfg, lambda row, samples: rows.append(row))
    return rows


def by(rows: list[dict], variant: str, mode: str) -> dict:
    return next(r for r in rows if r["variant"] == variant and r["mode"] == mode)


def check_breakdown(row: dict, expected: dict[str, float]) -> None:
    """The row's stages are each part's cost x how often one call runs it, and latency - their sum is the host's
    issue cost: the check the stage tests rely on (test_the_breakdown_check_catches_an_ignored_count)."""
    assert row["stages"] == pytest.approx(expected)
    assert row["latency_us"] - sum(row["stages"].values()) == pytest.approx(COSTS_US["issue"])


def test_latency_is_wall_time_to_the_output_on_the_host():
    clock = Clock()

    def call() -> torch.Tensor:
        clock.t += 3e-3
        return torch.zeros(2)
    cfg = TimingConfig(clock=clock, warmup_s=0.0, min_samples=5, min_time_s=0.0, budget_s=1.0)
    m = Timer(CPU, cfg).latency(call)
    assert (m.mode, m.timer, m.host_s, m.stopped) == ("latency", "wall", None, "precision")
    assert m.stats.n == 5 and m.stats.median == pytest.approx(3e-3) and m.stats.p90 == pytest.approx(3e-3)
    assert timing.to_host((torch.ones(1), 3, [torch.ones(1)], torch.ones(2))) == 2 and timing.to_host(None) == 0


def test_latencies_sample_their_callables_in_turn():
    """`Timer.latencies` (what dpk.load_policy races candidates with): A, B, A, B, ..., one Measurement each."""
    clock, order = Clock(), []

    def call(name: str, cost_s: float) -> torch.Tensor:
        order.append(name)
        clock.t += cost_s
        return torch.zeros(1)
    cfg = TimingConfig(clock=clock, warmup_s=0.0, min_samples=4, min_time_s=0.0, budget_s=1.0)
    a, b = Timer(CPU, cfg).latencies([lambda: call("a", 2e-3), lambda: call("b", 5e-3)])
    assert a.stats.median == pytest.approx(2e-3) and b.stats.median == pytest.approx(5e-3)
    assert order[6:] == ["a", "b"] * 4  # after three warm-up calls each
    with pytest.raises(ValueError, match="nothing to measure"):
        Timer(CPU, cfg).latencies([])


def test_latency_sample_starts_flushed_and_idle_and_ends_on_the_host(monkeypatch):
    """On a GPU (here a fake one): flush, then synchronize, both outside the timed call; the output comes to the
    host inside it, and a call that returns no tensor is waited for with a synchronize."""
    calls: list[str] = []
    monkeypatch.setattr(Timer, "_flush", lambda self: calls.append("flush"))
    monkeypatch.setattr(Timer, "_sync", lambda self: calls.append("sync"))
    monkeypatch.setattr(timing, "to_host", lambda out: calls.append("host") or (out is not None))
    timer = Timer(CPU, TimingConfig(warmup_s=0.0, min_samples=3, min_time_s=0.0, budget_s=0.0))
    timer.cuda = True
    for out, tail in ((torch.ones(1), ["host"]), (None, ["host", "sync"])):
        calls.clear()
        timer.latency(lambda out=out: calls.append("call") or out)
        sampled = calls[calls.index("flush"):]
        assert sampled[:3 + len(tail)] == ["flush", "sync", "call", *tail] and sampled.count("call") >= 3


def test_rows_carry_latency_and_stages_with_their_counts(chunk, monkeypatch):
    session, cfg = chunk
    fam, eager = session.registry.family("chunk"), session.registry.variant("chunk", "eager")
    assert fam.latency and eager.stages is not None and session.registry.variant("chunk", "plain").stages is None
    latencies, budgets, ranges = [], [], []
    real_latency, real_measure, real_ranged = Timer.latency, Timer.measure, stages.ranged
    monkeypatch.setattr(Timer, "latency", lambda self, fn: latencies.append(fn) or real_latency(self, fn))
    monkeypatch.setattr(Timer, "measure", lambda self, fn, m: budgets.append(self.cfg.budget_s) or
                        real_measure(self, fn, m))
    monkeypatch.setattr(stages, "ranged", lambda fn, *names: ranges.append(names) or real_ranged(fn, *names))
    rows = bench(session, cfg)
    assert len(latencies) == 4  # once per (variant, case), not per mode
    for mode in ("hot", "cold"):
        row = by(rows, "eager", mode)
        assert row["status"] == "ok" and row["reason"] == "" and row["median_us"] == pytest.approx(9000)
        assert row["latency_us"] == pytest.approx(9000) and row["latency_p90_us"] == pytest.approx(9000)
        check_breakdown(row, {"encoder": 1000, "unet": 3 * 2000, "step": 3 * 500})
        check_breakdown(by(rows, "fused", mode), {"encoder": 1000, "unet_step": 3 * 1500})
    graph = by(rows, "eager", "graph")  # unavailable on CPU; on a GPU a graph row has no stages either
    assert "stages" not in graph and graph["latency_us"] == pytest.approx(9000)
    plain = by(rows, "plain", "hot")
    assert "stages" not in plain and plain["latency_us"] == pytest.approx(9000)
    broken = by(rows, "broken_stage", "hot")
    assert broken["status"] == "ok" and broken["median_us"] == pytest.approx(9000)
    assert broken["stages"]["encoder"] == pytest.approx(1000) and math.isnan(broken["stages"]["step"])
    assert broken["reason"] == "stage step: RuntimeError: no step alone"
    assert ("chunk", "eager", "n8.fp32", "unet") in ranges  # a stage's NVTX range sits inside its row's
    assert budgets.count(1.0) == 4 * 3  # the rows (graph included): 4 variants x 3 modes
    assert budgets.count(1.0 / 3) == 2 * 3 and budgets.count(1.0 / 2) == 2 * 2 * 2  # eager's 3 stages, 2 of others


def test_the_breakdown_check_catches_an_ignored_count(chunk, monkeypatch):
    """A runner that forgot `count` (the U-Net's 3 calls per chunk charged as one) fails the check above."""
    session, cfg = chunk
    monkeypatch.setattr(stages, "per_call_us", lambda meas, stage: meas.stats.median * stages.US)
    row = by(bench(session, cfg, "hot"), "eager", "hot")
    assert row["stages"]["unet"] == pytest.approx(2000)
    with pytest.raises(AssertionError):
        check_breakdown(row, {"encoder": 1000, "unet": 3 * 2000, "step": 3 * 500})


def test_families_without_latency_leave_the_columns_empty(toy_session, tmp_path):
    v = toy_session.registry.variant("toy", "torch")
    case = toy_session.cases("toy", "smoke", ["m7_n13"])[0]
    timer = Timer(toy_session.device, TimingConfig(budget_s=0.02, warmup_s=0.0))
    [(row, samples)] = toy_session.run_one(v, case, ["hot"], timer)
    assert row["status"] == "ok" and not {"latency_us", "latency_p90_us", "stages"} & set(row)
    w = results.RunWriter(tmp_path, fingerprint(), {})
    w.add(row, samples)
    df = results.Run(w.json_path).df
    assert df[["latency_us", "latency_p90_us", "stages"]].isna().all().all()


def test_stage_declarations_are_checked():
    with pytest.raises(SuiteError, match="stage name 'a/b'"):
        dpk.Stage("a/b", lambda: None)  # '/' would nest NVTX ranges
    with pytest.raises(ValueError, match="count must be a positive int"):
        dpk.Stage("unet", lambda: None, 0)
    assert stages.stages_of(None, ()) == ([], "")
    twice = stages.stages_of(lambda: [dpk.Stage("a", print), dpk.Stage("a", print)], ())
    assert twice == ([], "stages: ValueError: the hook must return dpk.Stages with distinct names, got ['a', 'a']")
    assert stages.stages_of(lambda: [print], ())[1].endswith("got ['<built-in function print>']")
    assert stages.stages_of(lambda: 1 / 0, ()) == ([], "stages: ZeroDivisionError: division by zero")


def fingerprint() -> dict:
    return {"timestamp": "2026-11-21T10:00:00+00:00", "machine": "test-machine", "gpu": None, "device": "cpu",
            "git_sha": "abc1234def", "copy_gbps": 10.0}


def test_stages_round_trip_through_the_results_store(tmp_path):
    w = results.RunWriter(tmp_path, fingerprint(), {})
    base = {"family": "chunk", "case": "n8.fp32", "dtype": "float32", "mode": "cold", "status": "ok", "n": 3}
    w.add(base | {"variant": "a", "median_us": 9.0, "latency_us": 10.0, "latency_p90_us": 11.0,
                  "stages": {"unet": 6.0, "step": math.nan}}, [9e-6] * 3)
    w.add(base | {"variant": "b", "median_us": 9.0}, [9e-6] * 3)
    run = results.Run(w.json_path)
    a, b = run.df.iloc[0], run.df.iloc[1]
    assert a["stages"]["unet"] == 6.0 and math.isnan(a["stages"]["step"]) and list(a["stages"]) == ["unet", "step"]
    assert a["latency_us"] == 10.0 and a["latency_p90_us"] == 11.0 and b["stages"] is None
    csv = pd.read_csv(w.csv_path)
    assert json.loads(csv["stages"][0]) == {"unet": 6.0, "step": None} and csv["stages"].isna()[1]
    assert results.stage_times(csv["stages"][0])["unet"] == 6.0 and results.stage_times(float("nan")) == {}


def test_report_draws_where_a_call_goes(chunk, tmp_path, capsys):
    session, cfg = chunk
    w = results.RunWriter(tmp_path, fingerprint(), {})
    for row in bench(session, cfg, "cold,hot"):
        w.add(row, [])
    assert cli.main(["report", "latest", "--results-dir", str(tmp_path), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert (tmp_path / "rep" / "plots" / "stages_chunk.png").stat().st_size > 0
    assert "![stages_chunk](plots/stages_chunk.png)" in text and "Where a call's time goes (cold" in text
    table = text.split("Where a call's time goes")[1].split("```")[1]
    head = table.splitlines()[1].split()
    assert head == ["latency_us", "median_us", "encoder", "unet", "step", "unet_step", "x_floor", "speedup"]
    assert "eager        n8.fp32      9000.0     9000.0   1000.0  6000.0  1500.0        NaN      NaN      1.0" in table
    assert cli.main(["show", "latest", "--results-dir", str(tmp_path)]) == 0
    assert "latency us" in capsys.readouterr().out
    # with a run of another family on the same machine: one report, a header per run, both families
    other = results.RunWriter(tmp_path, fingerprint(), {})
    other.add({"family": "toy", "variant": "a", "case": "m7.fp32", "dtype": "float32", "mode": "hot",
               "status": "ok", "median_us": 1.0, "n": 3}, [1e-6] * 3)
    runs = [str(w.json_path), str(other.json_path)]
    assert cli.main(["report", *runs, "--results-dir", str(tmp_path), "--out", str(tmp_path / "both")]) == 0
    both = (tmp_path / "both" / "report.md").read_text()
    assert f"Run `{w.run_id}` (chunk)" in both and f"Run `{other.run_id}` (toy)" in both
    assert "## chunk" in both and "## toy" in both and "plots/stages_chunk.png" in both


def test_bars_end_at_the_latency_and_more_cases_make_more_figures(tmp_path):
    def row(case: str, variant: str, stages: dict | None, latency: float) -> dict:
        return {"family": "chunk", "variant": variant, "case": case, "dtype": "float32", "mode": "hot",
                "status": "ok", "median_us": 5.0, "latency_us": latency, "stages": stages}
    assert segments(pd.Series(row("c", "v", {"unet": 6.0, "step": 1.5}, 9.0))) == [
        ("unet", 6.0), ("step", 1.5), (HOST, 1.5)]
    assert segments(pd.Series(row("c", "v", {"unet": 6.0, "step": 1.5}, 7.0))) == [("unet", 6.0), ("step", 1.5)]
    assert segments(pd.Series(row("c", "v", {"unet": 6.0, "step": math.nan}, 9.0)))[-1] == (REST, 3.0)
    df = pd.DataFrame([row(f"n{i}.fp32", v, {"unet": 600.0 * i}, 2000.0 * i) for i in range(1, PANELS + 2)
                       for v in ("a", "b")], columns=results.COLUMNS)
    made = plot_stages(df, "chunk", tmp_path)
    assert [p.name for p in made] == ["stages_chunk.png", "stages_chunk_2.png"] and all(p.exists() for p in made)
    assert plot_stages(df.assign(stages=None), "chunk", tmp_path) == []
    later = pd.DataFrame([row("a", "v", {"unet": 1.0, "step": 1.0}, 3.0),
                          row("b", "v", {"encoder": 1.0, "unet": 1.0, "step": 1.0}, 4.0)])
    assert _names(later) == ["encoder", "unet", "step"]  # a stage only later cases run keeps its place in the call


def test_show_without_latency_has_no_latency_column(tmp_path, capsys):
    w = results.RunWriter(tmp_path, fingerprint(), {})
    w.add({"family": "toy", "variant": "a", "case": "m7.fp32", "dtype": "float32", "mode": "hot", "status": "ok",
           "median_us": 1.0, "n": 3}, [1e-6] * 3)
    assert cli.main(["show", "latest", "--results-dir", str(tmp_path)]) == 0
    assert "latency" not in capsys.readouterr().out


def test_a_run_without_cold_or_hot_rows_does_not_build_stages(chunk, monkeypatch):
    """A hook may capture a graph per part: a graph-only run, which times no stages, must not pay for it."""
    session, cfg = chunk
    called: list[str] = []
    real = runner.stages_of
    monkeypatch.setattr(runner, "stages_of", lambda hook, inputs: called.append("hook") or real(hook, inputs))
    bench(session, cfg, "graph")
    assert called == []
    bench(session, cfg, "cold")
    assert called
