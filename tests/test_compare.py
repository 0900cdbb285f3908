"""`dpk compare`: same distribution -> SAME, planted 10% slowdown -> SLOWER (non-zero exit)."""
from __future__ import annotations

import random

import pandas as pd

from dpk import cli, compare, results

from .test_results import fingerprint, row


def samples(median: float, n: int = 200, noise: float = 0.01, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.gauss(0, noise)) for _ in range(n)]


def store(tmp_path, ts: str, scale: dict[str, float], seed: int) -> str:
    w = results.RunWriter(tmp_path, fingerprint(ts=ts), {})
    for i, name in enumerate(["a", "b", "c"]):
        med = 1e-5 * (i + 1) * scale.get(name, 1.0)
        w.add(row(name, med * 1e6), samples(med, seed=seed * 10 + i))
    return w.run_id


def test_verdicts_on_synthetic_samples():
    base = samples(1e-5, seed=1)
    assert compare.verdict(base, samples(1e-5, seed=2))["verdict"] == "SAME"
    assert compare.verdict(base, samples(1.1e-5, seed=3))["verdict"] == "SLOWER"
    assert compare.verdict(base, samples(0.9e-5, seed=4))["verdict"] == "FASTER"
    assert compare.verdict(base, samples(1.02e-5, seed=5))["verdict"] == "SAME"  # below the 5% effect
    assert compare.verdict(base, base[:2])["verdict"] == "UNKNOWN"
    noisy = compare.verdict(samples(1e-5, noise=0.2, seed=6), samples(1.1e-5, noise=0.2, seed=7))
    assert noisy["verdict"] == "SAME" and noisy["threshold"] > 0.1  # the rows' own spread raises the bar


def test_runs_and_cli_exit_codes(tmp_path, capsys):
    a = store(tmp_path, "2026-11-21T10:00:00+00:00", {}, seed=1)
    same = store(tmp_path, "2026-11-21T11:00:00+00:00", {}, seed=2)
    slow = store(tmp_path, "2026-11-21T12:00:00+00:00", {"b": 1.10}, seed=3)
    df = compare.compare_runs(results.resolve_run(a, tmp_path), results.resolve_run(same, tmp_path))
    assert set(df.verdict) == {"SAME"}
    df = compare.compare_runs(results.resolve_run(a, tmp_path), results.resolve_run(slow, tmp_path))
    assert dict(zip(df.variant, df.verdict)) == {"a": "SAME", "b": "SLOWER", "c": "SAME"}
    assert cli.main(["compare", a, same, "--results-dir", str(tmp_path)]) == 0
    assert cli.main(["compare", a, slow, "--results-dir", str(tmp_path)]) == 1
    assert "SLOWER" in capsys.readouterr().out


def test_missing_and_failed_rows_are_unknown(tmp_path):
    w1 = results.RunWriter(tmp_path, fingerprint(ts="2026-11-21T10:00:00+00:00"), {})
    w1.add(row("a", 10.0), samples(1e-5))
    w1.add(row("b", 10.0), samples(1e-5))
    w2 = results.RunWriter(tmp_path, fingerprint(ts="2026-11-21T11:00:00+00:00"), {})
    w2.add({**row("a", 10.0), "status": "parity_fail"}, [])
    df = compare.compare_runs(results.Run(w1.json_path), results.Run(w2.json_path))
    assert list(df.verdict) == ["UNKNOWN", "UNKNOWN"]
    assert "missing in run B" in df[df.variant == "b"].iloc[0]["note"]


def test_host_speed_drift_is_reported(tmp_path):
    fa, fb = fingerprint(ts="2026-11-21T10:00:00+00:00"), fingerprint(ts="2026-11-21T11:00:00+00:00")
    fa["host_op_us"], fb["host_op_us"] = 5.0, 6.5
    runs = []
    for fp in (fa, fb):
        w = results.RunWriter(tmp_path, fp, {})
        w.add(row("a", 10.0), samples(1e-5))
        runs.append(results.Run(w.json_path))
    notes = compare.different_environments(*runs)
    assert len(notes) == 1 and notes[0].startswith("host speed: one torch op costs 5.0 vs 6.5 us")


def test_host_bound_hot_rows_are_marked(tmp_path):
    """A hot-mode row whose host cost per call is >= 80% of its median times the host: the note says so;
    device-bound hot rows and cold rows are not marked."""
    runs = []
    for ts, host_scale in (("2026-11-21T10:00:00+00:00", 1.0), ("2026-11-21T11:00:00+00:00", 1.3)):
        w = results.RunWriter(tmp_path, fingerprint(ts=ts), {})
        w.add({**row("launch", 13.0 * host_scale), "mode": "hot", "host_us": 12.0 * host_scale},
              samples(13e-6 * host_scale))
        w.add({**row("kernel", 50.0), "mode": "hot", "host_us": 12.0 * host_scale}, samples(50e-6))
        w.add({**row("launch", 5.0), "mode": "cold", "host_us": 12.0 * host_scale}, samples(5e-6))
        runs.append(results.Run(w.json_path))
    df = compare.compare_runs(*runs).set_index(["variant", "mode"])
    assert df.loc[("launch", "hot"), "verdict"] == "SLOWER"
    assert "host-bound (12.0/15.6 us host)" in df.loc[("launch", "hot"), "note"]
    assert "host-bound" not in df.loc[("kernel", "hot"), "note"] + df.loc[("launch", "cold"), "note"]


def _pair(tmp_path, rows_a: list, rows_b: list, argv=(["bench"], ["bench"])) -> tuple:
    runs = []
    stamps = ("2026-11-21T10:00:00+00:00", "2026-11-21T11:00:00+00:00")
    for ts, rows, av in zip(stamps, (rows_a, rows_b), argv):
        w = results.RunWriter(tmp_path, fingerprint(ts=ts), {"argv": av})
        for r, s in rows:
            w.add(r, s)
        runs.append(results.Run(w.json_path))
    return tuple(runs)


def gpu_row(variant: str, median_us: float, mode: str = "cold", **kw) -> dict:
    return {**row(variant, median_us, mode=mode), "timer": "cuda_event", **kw}


def test_uncovered_rows_are_judged_per_host_op(tmp_path):
    """A row whose calls wait for the device (uncovered) times the host: a host 1.4x slower in run B alone is
    SAME, the same host with a 1.3x slower call is SLOWER; covered rows are judged on raw samples."""
    a = [(gpu_row("sync", 400.0, uncovered=1.0, host_probe_us=7.0, host_us=390.0), samples(400e-6, seed=1)),
         (gpu_row("sync2", 400.0, uncovered=1.0, host_probe_us=7.0, host_us=390.0), samples(400e-6, seed=2)),
         (gpu_row("kernel", 50.0, uncovered=0.0, host_probe_us=7.0, host_us=9.0), samples(50e-6, seed=3))]
    b = [(gpu_row("sync", 560.0, uncovered=1.0, host_probe_us=9.8, host_us=550.0), samples(560e-6, seed=4)),
         (gpu_row("sync2", 728.0, uncovered=0.9, host_probe_us=9.8, host_us=720.0), samples(728e-6, seed=5)),
         (gpu_row("kernel", 60.0, uncovered=0.0, host_probe_us=9.8, host_us=12.0), samples(60e-6, seed=6))]
    df = compare.compare_runs(*_pair(tmp_path, a, b)).set_index("variant")
    assert df.loc["sync", "verdict"] == "SAME" and "per host op (7.0/9.8 us op)" in df.loc["sync", "note"]
    assert df.loc["sync2", "verdict"] == "SLOWER" and abs(df.loc["sync2", "ratio"] - 1.3) < 0.03
    assert df.loc["kernel", "verdict"] == "SLOWER" and df.loc["kernel", "note"] == ""


def test_gpu_floor_absorbs_sub_microsecond_start_shifts(tmp_path, capsys):
    """cold/hot GPU rows: a 0.6 us shift of a 5 us kernel (12%) is below the 2.5 us floor; 3.5 us is not; graph
    rows and CPU rows have no floor; --floor-us overrides it."""
    a = [(gpu_row("k", 5.0), samples(5.0e-6, seed=1)), (gpu_row("k2", 5.0), samples(5.0e-6, seed=2)),
         (gpu_row("g", 5.0, mode="graph"), samples(5.0e-6, seed=3)), (row("cpu", 5.0, mode="cold"), samples(5e-6))]
    b = [(gpu_row("k", 5.6), samples(5.6e-6, seed=4)), (gpu_row("k2", 8.5), samples(8.5e-6, seed=5)),
         (gpu_row("g", 5.6, mode="graph"), samples(5.6e-6, seed=6)), (row("cpu", 5.6, mode="cold"), samples(5.6e-6))]
    ra, rb = _pair(tmp_path, a, b)
    v = compare.compare_runs(ra, rb).set_index("variant")["verdict"].to_dict()
    assert v == {"k": "SAME", "k2": "SLOWER", "g": "SLOWER", "cpu": "SLOWER"}
    v0 = compare.compare_runs(ra, rb, compare.CompareConfig(floor_us=0.0)).set_index("variant")["verdict"]
    assert v0["k"] == "SLOWER"
    for floor, k_shown in (("0", True), ("4", False)):
        capsys.readouterr()
        assert cli.main(["compare", ra.run_id, rb.run_id, "--results-dir", str(tmp_path), "--floor-us", floor]) == 1
        assert any(line.split()[1:2] == ["k"] for line in capsys.readouterr().out.splitlines()) == k_shown


def test_different_commands_are_reported(tmp_path):
    ra, rb = _pair(tmp_path, [(row("a", 10.0), samples(1e-5))], [(row("a", 10.0), samples(1e-5))],
                   argv=(["bench", "--suite", "pusht"], ["bench", "--suite", "smoke"]))
    assert compare.different_environments(ra, rb) == [
        "commands: dpk bench --suite pusht vs dpk bench --suite smoke"]


def test_rows_timed_in_neither_run_are_left_out(tmp_path, capsys):
    na = {**row("g", 10.0, mode="graph"), "status": "unavailable", "reason": "variant is not graph-capturable"}
    ra, rb = _pair(tmp_path, [(row("a", 10.0), samples(1e-5)), (na, [])],
                   [(row("a", 10.0), samples(1e-5)), (na, [])])
    df = compare.compare_runs(ra, rb)
    assert list(df.variant) == ["a"] and df.attrs["not_timed"] == [
        "toy.g graph: unavailable: variant is not graph-capturable"]
    assert cli.main(["compare", ra.run_id, rb.run_id, "--results-dir", str(tmp_path)]) == 0
    assert "1 rows timed in neither run" in capsys.readouterr().err


def test_graph_rows_are_never_host_bound():
    """A graph replay never waits for the host: whatever its `uncovered` says, it is judged on device time."""
    hot = pd.Series({"uncovered": 1.0, "host_us": 5.0, "median_us": 5.0})
    assert compare.host_bound(hot, "hot") and not compare.host_bound(hot, "graph")
