"""Results store: round trip, atomic rewrites, never overwriting, interrupted runs keep finished rows."""
from __future__ import annotations

import json
import math
import os

import pytest

from dpk import results


def fingerprint(machine: str = "test-machine", ts: str = "2026-11-21T10:00:00+00:00") -> dict:
    return {"timestamp": ts, "machine": machine, "gpu": None, "device": "cpu", "git_sha": "abc1234def",
            "git_dirty": False, "torch": "2.13.0", "cuda": None, "triton": "3.9.0", "copy_gbps": 10.0,
            "tf32_matmul": False, "tf32_cudnn": True}


def row(variant: str, median_us: float, baseline: bool = False, mode: str = "hot", status: str = "ok") -> dict:
    return {"family": "toy", "variant": variant, "baseline": baseline, "case": "m7.fp32", "dtype": "float32",
            "mode": mode, "status": status, "median_us": median_us, "n": 3}


def test_round_trip_with_samples_and_speedups(tmp_path):
    w = results.RunWriter(tmp_path, fingerprint(), {"argv": ["bench"]})
    w.add(row("fast", 5.0), [5e-6, 5e-6, 5e-6])
    w.add(row("base", 10.0, baseline=True), [1e-5, 1e-5, 1e-5])
    assert w.csv_path.parent.name == "test-machine" and w.csv_path.exists() and w.json_path.exists()
    run = results.Run(w.json_path)
    assert run.run_id == w.run_id and run.meta == {"argv": ["bench"]}
    assert list(run.df.columns) == results.COLUMNS
    fast = run.df[run.df.variant == "fast"].iloc[0]
    assert fast["speedup"] == pytest.approx(2.0) and fast["git_sha"] == "abc1234def"
    assert run.samples[("toy", "fast", "m7.fp32", "float32", "hot")] == [5e-6] * 3
    assert not list(tmp_path.rglob("*.tmp"))  # atomic writes leave no temp files


def test_interrupted_run_keeps_finished_rows(tmp_path):
    w = results.RunWriter(tmp_path, fingerprint(), {})
    w.add(row("a", 1.0), [1e-6] * 3)
    w.add(row("b", 2.0), [2e-6] * 3)
    del w  # the process dies here: nothing else is called
    run = results.resolve_run("latest", tmp_path)
    assert sorted(run.df.variant) == ["a", "b"]
    assert len(json.loads(run.path.read_text())["rows"]) == 2


def test_never_overwrites(tmp_path, monkeypatch):
    monkeypatch.setattr(results.secrets, "token_hex", lambda n: "beef")
    first = results.RunWriter(tmp_path, fingerprint(), {})
    first.add(row("a", 1.0), [1e-6] * 3)
    with pytest.raises(FileExistsError, match="never overwritten"):
        results.RunWriter(tmp_path, fingerprint(), {})


def test_resolve_run_specs(tmp_path):
    ids = []
    for ts in ("2026-11-21T10:00:00+00:00", "2026-11-21T11:00:00+00:00"):
        w = results.RunWriter(tmp_path, fingerprint(ts=ts), {})
        w.add(row("a", 1.0), [1e-6] * 3)
        ids.append(w.run_id)
    assert results.resolve_run("latest", tmp_path).run_id == ids[1]
    assert results.resolve_run("latest~1", tmp_path).run_id == ids[0]
    assert results.resolve_run(ids[0], tmp_path).run_id == ids[0]
    assert results.resolve_run(str(tmp_path / "test-machine" / f"{ids[0]}.csv"), tmp_path).run_id == ids[0]
    with pytest.raises(ValueError, match="only 2 stored run"):
        results.resolve_run("latest~5", tmp_path)
    with pytest.raises(ValueError, match="no match"):
        results.resolve_run("nope", tmp_path)


def test_rows_that_did_not_run_have_no_speedup(tmp_path):
    w = results.RunWriter(tmp_path, fingerprint(), {})
    w.add(row("base", 10.0, baseline=True), [1e-5] * 3)
    w.add({**row("gone", math.nan), "status": "unavailable", "reason": "needs a CUDA GPU"}, [])
    df = results.Run(w.json_path).df
    assert math.isnan(df[df.variant == "gone"].iloc[0]["speedup"])


def test_hot_mode_of_runs_with_and_without_the_cover_check(tmp_path):
    """Runs made before the fingerprint said what `hot` times are read from their rows: an `uncovered` value
    means hot calls were queued behind a spin (device time); none means the old eager-loop timing."""
    old = results.RunWriter(tmp_path, fingerprint(ts="2026-11-21T10:00:00+00:00"), {})
    old.add(row("a", 10.0), [1e-5] * 3)
    new = results.RunWriter(tmp_path, fingerprint(ts="2026-11-21T11:00:00+00:00"), {})
    new.add({**row("a", 10.0), "uncovered": 0.0}, [1e-5] * 3)
    assert results.Run(old.json_path).hot_mode() == results.HOT_EAGER
    assert results.Run(new.json_path).hot_mode() == results.HOT_DEVICE
    stated = results.RunWriter(tmp_path, fingerprint(ts="2026-11-21T12:00:00+00:00") | {"hot_mode": "x"}, {})
    stated.add(row("a", 10.0), [1e-5] * 3)
    assert results.Run(stated.json_path).hot_mode() == "x"


def test_copy_probe_warms_up_then_samples_and_the_fingerprint_keeps_its_spread(monkeypatch):
    """The roofline probe: COPY_SAMPLES sorted rates after the warm-up; the fingerprint's copy_gbps is their median
    and p10 <= median <= p90 (CPU: the same code path with 64 MiB buffers)."""
    import torch

    from dpk import env

    monkeypatch.setattr(env, "COPY_WARMUP_S", 0.02)
    env.copy_bandwidth_samples.cache_clear()
    cpu = torch.device("cpu")
    rates = env.copy_bandwidth_samples(cpu)
    assert len(rates) == env.COPY_SAMPLES and list(rates) == sorted(rates) and rates[0] > 0
    fp = env.fingerprint(cpu)
    assert fp["copy_gbps"] == rates[len(rates) // 2] == env.copy_bandwidth_gbps(cpu)
    assert fp["copy_gbps_p10"] <= fp["copy_gbps"] <= fp["copy_gbps_p90"]
    env.copy_bandwidth_samples.cache_clear()


def test_latest_is_the_last_written_of_runs_started_in_the_same_second(tmp_path, monkeypatch):
    """Run ids share the timestamp to the second; their random suffix must not decide which run is `latest`."""
    suffixes = iter(["ffff", "0000"])
    monkeypatch.setattr(results.secrets, "token_hex", lambda n: next(suffixes))
    first = results.RunWriter(tmp_path, fingerprint(), {})
    first.add(row("a", 10.0), [1e-5] * 3)
    second = results.RunWriter(tmp_path, fingerprint(), {})
    second.add(row("a", 11.0), [1.1e-5] * 3)
    os.utime(first.json_path, ns=(1, 1))  # written long before the second
    assert results.resolve_run("latest", tmp_path).run_id == second.run_id
    assert results.resolve_run("latest~1", tmp_path).run_id == first.run_id


def test_git_sha_from_the_environment_must_be_a_full_commit(monkeypatch):
    """Where the tree has no .git (a GPU box), DPK_GIT_SHA names the commit: a short or mistyped one is refused
    before anything runs, a full one is recorded as given."""
    from dpk.env import git_state

    full = "f7b3b0a71b689a8036e8d8ddcceda295ddff867f"
    monkeypatch.setenv("DPK_GIT_SHA", full)
    monkeypatch.setenv("DPK_GIT_DIRTY", "1")
    assert git_state() == {"git_sha": full, "git_dirty": True}
    for bad in ("f7b3b0a", "f7b3b0a0", full + "0", "HEAD"):
        monkeypatch.setenv("DPK_GIT_SHA", bad)
        with pytest.raises(ValueError, match="full 40-character commit"):
            git_state()


def test_bench_with_a_short_git_sha_fails_before_running(tmp_path, monkeypatch, capsys):
    from dpk import cli

    monkeypatch.setenv("DPK_GIT_SHA", "f7b3b0a0")
    rc = cli.main(["bench", "--results-dir", str(tmp_path), "--budget", "0.01"])
    assert rc != 0 and "DPK_GIT_SHA" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.csv"))
