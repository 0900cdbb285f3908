"""CLI smoke tests on the toy plugin folder (loaded by path) and on the project's smoke suite."""
from __future__ import annotations

import pytest

from dpk import cli, results, runner, timing

from .conftest import DEVICE, TOY_KERNELS, TOY_SUITES

TOY = ["--kernels-dir", str(TOY_KERNELS), "--suites-dir", str(TOY_SUITES)]


def test_list_shows_availability_and_filters(capsys):
    assert cli.main(["list", "--family", "toy", *TOY]) == 0
    out = capsys.readouterr().out
    assert "side_stream" in out and "dpk@toy/torch/" in out
    assert ("no: needs a CUDA GPU" in out) == (DEVICE.type == "cpu")


def test_check_reports_broken_variants_and_fails(capsys):
    code = cli.main(["check", "--family", "toy", "--variant", "torch,wrong,mutates", "--case", "m7_n13", *TOY])
    out = capsys.readouterr().out
    assert code == 1
    assert "modified input" in out and "fail" in out and "pass" in out


def test_bench_show_compare_round_trip(tmp_path, capsys, monkeypatch):
    made: list[int] = []  # the size-matched copies made, one pair per timed row
    real = runner.size_matched_copies
    monkeypatch.setattr(runner, "size_matched_copies", lambda n, d: made.append(n) or real(n, d))
    args = ["--family", "toy", "--variant", "torch,rowsum", "--suite", "smoke", "--mode", "hot,cold",
            "--budget", "0.05", "--results-dir", str(tmp_path), *TOY]
    assert cli.main(["bench", *args]) == 0
    out = capsys.readouterr().out
    assert "rowsum" in out and "saved" in out
    run = results.resolve_run("latest", tmp_path)
    df = run.df
    assert set(df["mode"]) == {"hot", "cold"} and set(df["status"]) == {"ok", "unavailable"}  # bf16: rowsum
    ok = df[df.status == "ok"]
    assert (ok["n"] >= 3).all() and (ok["gbps"] > 0).all() and ok["speedup"].notna().all()
    assert run.fingerprint["device"] == DEVICE.type and run.fingerprint["copy_gbps"] > 0
    # the size-matched copy: timed right after each row, not once per (bytes, mode)
    assert (ok["size_copy_us"] > 0).all() and sorted(made) == sorted(ok["bytes"])
    assert ((ok["pct_size_copy"] - 100 * ok["size_copy_us"] / ok["median_us"]).abs() < 1e-6).all()
    assert cli.main(["report", "latest", "--results-dir", str(tmp_path), "--out", str(tmp_path / "rep")]) == 0
    assert "cold % of a copy of the same bytes in the same mode" in (tmp_path / "rep" / "report.md").read_text()
    assert cli.main(["bench", *args]) == 0
    assert cli.main(["show", "latest", "--results-dir", str(tmp_path)]) == 0
    assert cli.main(["compare", "latest~1", "latest", "--results-dir", str(tmp_path), "--all"]) in (0, 1)
    assert "A = " in capsys.readouterr().out


def test_bench_without_size_copy_leaves_its_columns_empty(tmp_path):
    args = ["--family", "toy", "--variant", "torch", "--case", "m7_n13", "--mode", "hot", "--budget", "0.02",
            "--no-size-copy", "--results-dir", str(tmp_path), *TOY]
    assert cli.main(["bench", *args]) == 0
    df = results.resolve_run("latest", tmp_path).df
    assert (df["status"] == "ok").all() and df["size_copy_us"].isna().all() and df["pct_size_copy"].isna().all()


@pytest.mark.skipif(DEVICE.type == "cuda", reason="graph mode runs on a GPU")
def test_bench_graph_mode_on_cpu_is_unavailable_not_an_error(tmp_path):
    assert cli.main(["bench", "--family", "toy", "--variant", "torch", "--case", "m7_n13", "--mode", "graph",
                     "--results-dir", str(tmp_path), *TOY]) == 0
    df = results.resolve_run("latest", tmp_path).df
    assert list(df.status) == ["unavailable"] and "CUDA GPU" in df.reason[0]


def test_interrupted_bench_keeps_finished_rows(tmp_path, monkeypatch, capsys):
    real = timing.Timer.measure
    calls = {"n": 0}

    def dying(self, fn, mode):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, fn, mode)
    monkeypatch.setattr(timing.Timer, "measure", dying)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["bench", "--family", "toy", "--variant", "torch", "--mode", "hot", "--budget", "0.02",
                  "--no-size-copy", "--results-dir", str(tmp_path), *TOY])  # measure: the variant's only
    run = results.resolve_run("latest", tmp_path)
    assert len(run.df) == 2
    assert run.meta["complete"] is False and run.incomplete().startswith("is incomplete (2 of ")
    assert cli.main(["bench", "--family", "toy", "--variant", "torch", "--mode", "hot", "--budget", "0.02",
                     "--case", "m7_n13", "--results-dir", str(tmp_path), *TOY]) == 0
    assert results.resolve_run("latest", tmp_path).incomplete() is None
    capsys.readouterr()
    assert cli.main(["compare", "latest~1", "latest", "--results-dir", str(tmp_path)]) in (0, 1)
    assert "is incomplete (2 of " in capsys.readouterr().err


def test_bad_input_gives_clear_errors(capsys, tmp_path):
    assert cli.main(["bench", "--family", "nope", "--results-dir", str(tmp_path), *TOY]) == 2
    assert "unknown family 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="unknown suite"):
        cli.main(["bench", "--suite", "nope", *TOY])
    with pytest.raises(SystemExit, match="unknown mode"):
        cli.main(["bench", "--mode", "warm", *TOY])
    assert cli.main(["show", "nope", "--results-dir", str(tmp_path)]) == 2
    assert cli.main(["ncu-filter", "toy", "nope", *TOY]) == 2


def test_ncu_filter(capsys):
    assert cli.main(["ncu-filter", "toy", "torch", "--case", "m7_n13.fp32", *TOY]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "dpk@toy/torch/m7_n13.fp32/"
    assert "--nvtx-include dpk@toy/torch/m7_n13.fp32/" in err and "--clock-control none" in err
