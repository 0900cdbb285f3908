"""CLI smoke tests on the toy plugin folder (loaded by path) and on the project's smoke suite."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

import dpk.ncu
from dpk import cli, results, runner, timing

from .conftest import DEVICE, ROOT, TOY_KERNELS, TOY_SUITES, toy_copy
from .test_results import fingerprint, row

TOY = ["--kernels-dir", str(TOY_KERNELS), "--suites-dir", str(TOY_SUITES)]


def test_list_shows_availability_and_filters(capsys):
    assert cli.main(["list", "--family", "toy", *TOY]) == 0
    out = capsys.readouterr().out
    assert "side_stream" in out and "dpk@toy/torch/" in out
    assert ("no: needs a CUDA GPU" in out) == (DEVICE.type == "cpu")
    assert cli.main(["list", "--family", "toy,nope", *TOY]) == 2  # listing nothing of a family is an error
    assert "unknown family 'nope'" in capsys.readouterr().err


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
    # several runs make one report only when each case comes from one of them
    assert cli.main(["report", "latest~1", "latest", "--results-dir", str(tmp_path)]) == 2
    assert "case 'm7_n13.fp32' of family 'toy' is in runs" in capsys.readouterr().err


def test_report_of_one_family_from_runs_of_other_cases(tmp_path):
    """One family's runs of disjoint cases (e.g. B = 1 and B = 8) make one report holding the rows of both."""
    for case in ("m7_n13", "m64_n300"):
        assert cli.main(["bench", "--family", "toy", "--variant", "torch,rowsum", "--case", case, "--mode", "hot",
                         "--budget", "0.02", "--no-size-copy", "--results-dir", str(tmp_path), *TOY]) == 0
    out = tmp_path / "rep"
    assert cli.main(["report", "latest~1", "latest", "--results-dir", str(tmp_path), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert text.count("## toy") == 1 and "m7_n13.fp32" in text and "m64_n300.fp32" in text


def test_bench_without_size_copy_leaves_its_columns_empty(tmp_path):
    args = ["--family", "toy", "--variant", "torch", "--case", "m7_n13", "--mode", "hot", "--budget", "0.02",
            "--no-size-copy", "--results-dir", str(tmp_path), *TOY]
    assert cli.main(["bench", *args]) == 0
    df = results.resolve_run("latest", tmp_path).df
    assert (df["status"] == "ok").all() and df["size_copy_us"].isna().all() and df["pct_size_copy"].isna().all()


def test_rows_past_the_size_copy_limit_get_no_size_copy(tmp_path, monkeypatch):
    """A row of more bytes than SIZE_COPY_MAX (a chunk's 100 weight reads) is timed without allocating a copy."""
    monkeypatch.setattr(runner, "SIZE_COPY_MAX", 1)
    monkeypatch.setattr(runner, "size_matched_copies", lambda n, d: pytest.fail("a size copy was made"))
    args = ["--family", "toy", "--variant", "torch", "--case", "m7_n13", "--mode", "hot", "--budget", "0.02",
            "--results-dir", str(tmp_path), *TOY]
    assert cli.main(["bench", *args]) == 0
    df = results.resolve_run("latest", tmp_path).df
    assert (df["status"] == "ok").all() and df["size_copy_us"].isna().all()


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


def test_show_latest_is_a_stored_run_not_an_asv_or_ncu_file(tmp_path, capsys):
    """results/ also holds asv's benchmarks.json and ncu's CSVs: `latest` must only pick `<machine>/<run-id>` runs."""
    w = results.RunWriter(tmp_path, fingerprint(), {})
    w.add(row("a", 1.0), [1e-6] * 3)
    (tmp_path / "asv").mkdir()
    (tmp_path / "asv" / "benchmarks.json").write_text('{"version": 2}')  # newer, and sorts after the run id
    (tmp_path / "ncu").mkdir()
    (tmp_path / "ncu" / "conv1d-stream-x.fp32.csv").write_text("kernel\n")
    assert results.list_runs(tmp_path) == [w.json_path]
    assert cli.main(["show", "latest", "--results-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"run {w.run_id}:")
    with pytest.raises(ValueError, match="not a stored dpk run"):
        results.Run(tmp_path / "asv" / "benchmarks.json")


def test_selecting_nothing_is_an_error_that_names_the_problem(capsys):
    assert cli.main(["check", "--family", "toy", "--case", "m7_n1", *TOY]) == 2
    assert "no case 'm7_n1' of toy in suite smoke; similar: m7_n13" in capsys.readouterr().err
    assert cli.main(["bench", "--family", "toy", "--case", "m256_n1024", "--no-save", *TOY]) == 2
    assert "case 'm256_n1024' of toy is in suite pusht, not smoke" in capsys.readouterr().err
    assert cli.main(["check", "--case", "zzz_nothing_like_it", *TOY]) == 2  # every family: still an error
    assert "known: " in capsys.readouterr().err
    assert cli.main(["ncu-filter", "toy", "torch", "--case", "nosuch", *TOY]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no case 'nosuch' of toy in any suite" in err
    assert cli.main(["ncu-filter", "toy", "torch", "--case", "m7_n13", *TOY]) == 0  # a name: its case id
    assert capsys.readouterr().out.strip() == "dpk@toy/torch/m7_n13.fp32/"


FAKE_NCU = """\
#!{python}
# A stand-in for Nsight Compute: notes that it started, runs the profiled command, writes a report, and answers
# `--import` with one kernel row.
import os, subprocess, sys
args = sys.argv[1:]
if "--import" in args:
    print('"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","smsp__x.ratio"')
    print('"","","ns","byte","byte",""')
    print('"0","toy_kernel","2000","4096","1024","1.5"')
    sys.exit(0)
with open(os.environ["DPK_TOY_CALL_LOG"], "a") as log:
    log.write(f"ncu {{os.getpid()}} {{' '.join(args)}}\\n")
print("==PROF== Connected to process", flush=True)
export = args.index("--export")
subprocess.run(args[export + 2:], check=True)
print("==PROF== Profiling toy_kernel: 0%....50%....100% - 1 pass", flush=True)
open(args[export + 1], "w").write("report")
print("==PROF== Disconnected", flush=True)
"""

LOGGED_VARIANT = """\
import os

import torch

import dpk


@dpk.variant("toy", "logged")
def logged(a, v, c):
    \"\"\"torch.mv + bias; notes each call's process in $DPK_TOY_CALL_LOG.\"\"\"
    with open(os.environ["DPK_TOY_CALL_LOG"], "a") as log:
        log.write(f"call {os.getpid()}\\n")
    return torch.mv(a, v) + c
"""


def test_ncu_without_nvtx_names_the_missing_package(monkeypatch, tmp_path):
    """Without the nvtx package the ranges are no-ops and ncu would profile nothing: the error says why."""
    import dpk.ncu
    import dpk.nvtx

    monkeypatch.setattr(dpk.nvtx, "_nvtx", None)
    with pytest.raises(RuntimeError, match="nvtx package is not installed"):
        dpk.ncu.run_profile("toy", "torch", "m7_n13.fp32", tmp_path)


def _fake_ncu(tmp_path, monkeypatch) -> tuple[list[str], Path]:
    """The toy family with a `logged` variant and the fake ncu on PATH: (dpk ncu's common arguments, call log)."""
    kernels = toy_copy(tmp_path / "side") / "kernels"
    (kernels / "toy" / "logged.py").write_text(LOGGED_VARIANT)
    (tmp_path / "bin").mkdir()
    ncu = tmp_path / "bin" / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable))
    ncu.chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DPK_TOY_CALL_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return ["ncu", "toy", "logged", "--case", "m7_n13", "--kernels-dir", str(kernels), "--suites-dir",
            str(TOY_SUITES), "--results-dir", str(tmp_path / "res")], log


def test_ncu_builds_the_variant_before_profiling_and_streams_progress(tmp_path, monkeypatch, capsys):
    """`dpk ncu` calls the variant once in its own process (where a CUDA build fills the cache, with progress) and
    only then runs ncu, whose lines it passes on as they come; the child under ncu reuses what was built."""
    args, log = _fake_ncu(tmp_path, monkeypatch)
    assert cli.main(args) == 0
    events = log.read_text().splitlines()
    assert events[0] == f"call {os.getpid()}" and events[1].startswith("ncu ")  # prepared here, then profiled
    assert len(events) == 2 + 4 and all(e.startswith("call ") and e != events[0] for e in events[2:])  # child
    out, err = capsys.readouterr()
    assert re.search(r"building/warming toy\.logged on m7_n13\.fp32 \.\.\. \d+ s", err), err
    assert err.index("building/warming") < err.index("==PROF== Connected") < err.index("==PROF== Disconnected")
    assert "ran toy.logged on m7_n13.fp32 1x inside dpk@toy/logged/m7_n13.fp32/" in err  # the child's output
    assert "toy_kernel" in out and "ncu_duration_us: 2" in out
    assert (tmp_path / "res" / "ncu" / "toy-logged-m7_n13.fp32.summary.csv").exists()
    assert "--cache-control all" in events[1]  # ncu's default, stated: every kernel from flushed caches


def test_ncu_warm_caches_and_extra_metrics(tmp_path, monkeypatch):
    """`--cache-control none` reaches ncu and names the report apart (a flushed one is not overwritten); metrics
    asked for with `--metrics` are kept in the kernels csv under their own names."""
    args, log = _fake_ncu(tmp_path, monkeypatch)
    assert cli.main([*args, "--cache-control", "none", "--metrics", "smsp__x.ratio"]) == 0
    call = next(e for e in log.read_text().splitlines() if e.startswith("ncu "))
    assert "--cache-control none" in call and "smsp__x.ratio" in call
    out = tmp_path / "res" / "ncu"
    assert (out / "toy-logged-m7_n13.fp32-warm.ncu-rep").exists()
    assert pd.read_csv(out / "toy-logged-m7_n13.fp32-warm.csv")["smsp__x.ratio"].tolist() == [1.5]
    assert pd.read_csv(out / "toy-logged-m7_n13.fp32-warm.summary.csv")["cache_control"].tolist() == ["none"]
    with pytest.raises(ValueError, match="cache control 'some'"):
        dpk.ncu.profile_command("ncu", "toy", "logged", "m7_n13.fp32", out / "r", "basic", [], [], (), "some")
