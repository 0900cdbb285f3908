"""`dpk`: list, check, bench, compare, ab, show, ncu, ncu-filter, once, report, env."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from . import ab, nvtx, paths
from .caveats import engine_caveats
from .cli_tools import cmd_env, cmd_ncu, cmd_ncu_filter, cmd_once, cmd_report, selection_of, session_of, split_csv
from .compare import CompareConfig, compare_runs, different_environments
from .env import fingerprint
from .ncu import CACHE_CONTROL
from .registry import unavailable_reason
from .results import RunWriter, resolve_run
from .table import BENCH_COLUMNS, CHECK_COLUMNS, COMPARE_COLUMNS, render
from .timing import MODES, TimingConfig


def cmd_list(a: argparse.Namespace) -> int:
    s = session_of(a)
    rows = []
    for fam in split_csv(a.family):
        s.registry.family(fam)  # an unknown family is an error, not an empty list
    for fam in sorted(s.registry.families):
        if a.family and fam not in split_csv(a.family):
            continue
        for v in s.registry.variants_of(fam):
            reason = unavailable_reason(v, s.device)
            rows.append({"family": fam, "variant": v.name, "baseline": "yes" if v.baseline else "",
                         "needs": ",".join(v.needs) or "-", "dtypes": ",".join(v.dtypes),
                         "available": "yes" if reason is None else f"no: {reason}",
                         "ncu filter": nvtx.ncu_filter(fam, v.name), "about": v.description})
    print(f"device: {s.device}; suites: {', '.join(s.suite_names())}; nvtx: "
          f"{'on' if nvtx.available() else 'missing (pip install nvtx): ranges are no-ops'}")
    print(render(pd.DataFrame(rows), ["family", "variant", "baseline", "needs", "dtypes", "available", "ncu filter",
                                      "about"], max_width=70))
    for path, err in s.registry.load_errors.items():
        print(f"LOAD ERROR {path}: {err}", file=sys.stderr)
    return 1 if s.registry.load_errors else 0


def cmd_check(a: argparse.Namespace) -> int:
    s = session_of(a)
    rows = []
    for r in s.check(selection_of(a, s), deep=not a.quick):
        detail = r.reason or "; ".join(r.problems + r.first_bad[:2] + r.notes)
        rows.append(vars(r) | {"detail": detail})
        print(f"  {r.family}.{r.variant} {r.case}: {r.status}", file=sys.stderr)
    if not rows:
        raise SystemExit("dpk check: nothing selected (check --family/--variant/--suite/--case)")
    df = pd.DataFrame(rows)
    print(render(df, CHECK_COLUMNS, max_width=90))
    bad = df[df["status"].isin(["fail", "error"])]
    print(f"\n{len(df)} checks: " + ", ".join(f"{k} {v}" for k, v in df["status"].value_counts().items()))
    return 1 if len(bad) else 0


def cmd_bench(a: argparse.Namespace) -> int:
    s = session_of(a)
    s.size_copy = not a.no_size_copy
    sel = selection_of(a, s)
    plan = s.plan(sel)
    if not plan:
        raise SystemExit(f"dpk bench: nothing selected in suite {sel.suite!r}")
    total = sum(len(vs) for _, _, vs in plan) * len(sel.modes)
    budget = a.budget if a.budget is not None else (1.0 if s.device.type == "cuda" else 0.3)
    cfg = TimingConfig(target_rel=a.target_rel, budget_s=budget, min_samples=a.min_samples)
    fp = fingerprint(s.device)
    meta = {"argv": sys.argv[1:], "planned_rows": total, "complete": False}  # complete: set after the last row
    writer = None if a.no_save else RunWriter(paths.results_dir(a.results_dir), fp, meta)
    rows: list[dict[str, Any]] = []
    start = time.time()

    def on_row(row: dict[str, Any], samples: list[float]) -> None:
        rows.append(row)
        if writer:
            writer.add(row, samples)
        med = f"{row['median_us']:.2f} us" if row.get("status") == "ok" else f"{row['status']}: {row['reason']}"
        print(f"[{len(rows):>4}/{total}] {row['family']}.{row['variant']} {row['case']} {row['mode']}: "
              f"{med[:100]}", file=sys.stderr, flush=True)

    print(f"dpk bench: {total} rows on {fp.get('gpu') or fp['cpu']} (copy {fp['copy_gbps']:.0f} GB/s), "
          f"suite {sel.suite}", file=sys.stderr)
    s.bench(sel, cfg, on_row)
    if writer:
        writer.meta["complete"] = True
        writer.flush()
    df = writer.frame() if writer else pd.DataFrame(rows)
    print(render(df, BENCH_COLUMNS, max_width=60))
    print(f"\n{len(df)} rows in {time.time() - start:.0f} s" +
          (f"; saved {writer.csv_path} (+ .json with samples)" if writer else ""))
    return 1 if df["status"].isin(["parity_fail", "error"]).any() else 0


def cmd_show(a: argparse.Namespace) -> int:
    run = resolve_run(a.run, paths.results_dir(a.results_dir))
    df = run.df
    if a.family:
        df = df[df["family"].isin(split_csv(a.family))]
    fp = run.fingerprint
    print(f"run {run.run_id}: {fp.get('gpu') or fp.get('cpu')}, torch {fp.get('torch')}, git {fp.get('git_sha')}"
          f"{' (dirty)' if fp.get('git_dirty') else ''}, copy {fp.get('copy_gbps', 0):.0f} GB/s, {fp.get('timestamp')}")
    print(render(df, split_csv(a.columns) or BENCH_COLUMNS))
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    rd = paths.results_dir(a.results_dir)
    ra, rb = resolve_run(a.run_a, rd), resolve_run(a.run_b, rd)
    df = compare_runs(ra, rb, CompareConfig(alpha=a.alpha, min_effect=a.threshold, floor_us=a.floor_us))
    if a.family:
        df = df[df["family"].isin(split_csv(a.family))]
    for warning in different_environments(ra, rb):
        print(f"warning: environments differ: {warning}", file=sys.stderr)
    for warning in engine_caveats(ra, rb):
        print(f"warning: {warning}", file=sys.stderr)
    for run in (ra, rb):
        if note := run.incomplete():
            print(f"warning: {run.run_id} {note}: rows it lacks compare as UNKNOWN", file=sys.stderr)
    if skipped := df.attrs.get("not_timed"):
        print(f"{len(skipped)} rows timed in neither run, for the same reason, not compared "
              f"(e.g. {skipped[0]})", file=sys.stderr)
    shown = df if a.all else df[df["verdict"] != "SAME"]
    print(f"A = {ra.run_id}\nB = {rb.run_id}")
    if len(shown):
        print(render(shown, COMPARE_COLUMNS))
    print("\n" + ", ".join(f"{v} {n}" for v, n in df["verdict"].value_counts().items()))
    return 1 if (df["verdict"] == "SLOWER").any() else 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kernels-dir", type=Path, action="append", help="extra folder of kernel families")
    common.add_argument("--suites-dir", type=Path, action="append", help="extra folder of suite YAML files")
    common.add_argument("--results-dir", type=Path, help="where runs are stored (default: results/)")
    select = argparse.ArgumentParser(add_help=False)
    select.add_argument("--family", action="append", help="family name(s), comma-separated or repeated")
    select.add_argument("--variant", action="append", help="variant name(s)")
    select.add_argument("--suite", default="smoke", help="suite name (default: smoke)")
    select.add_argument("--case", action="append", help="case name(s) or id(s) (name.fp32)")
    select.add_argument("--dtype", action="append", help="dtype(s): float32, bfloat16, float16")
    select.add_argument("--param", action="append", metavar="KEY=VALUE",
                        help="set a case parameter the family declares for every selected case")
    select.add_argument("--checkpoint", help="run the selected cases on these weights (unet1d: a state dict, a "
                                             "diffusion_policy .ckpt or a LeRobot folder)")
    verdict = argparse.ArgumentParser(add_help=False)
    verdict.add_argument("--threshold", type=float, default=0.05, help="minimum effect size (default 0.05 = 5%%)")
    verdict.add_argument("--alpha", type=float, default=0.01, help="Mann-Whitney significance level")
    verdict.add_argument("--floor-us", type=float, default=None,
                         help="absolute noise floor of cold/hot GPU rows in us (default 2.5: the measured "
                              "run-to-run shift of one call's device time)")

    p = argparse.ArgumentParser(prog="dpk", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("list", parents=[common], help="families, variants, availability and why")
    sp.add_argument("--family", action="append")
    sp.set_defaults(fn=cmd_list)
    sp = sub.add_parser("check", parents=[common, select], help="parity of every variant against the reference")
    sp.add_argument("--quick", action="store_true", help="skip the uninitialised/side-stream/graph guards")
    sp.set_defaults(fn=cmd_check)
    sp = sub.add_parser("bench", parents=[common, select], help="parity, then timing; stores the run")
    sp.add_argument("--mode", action="append", help=f"timing modes (default: all of {','.join(MODES)})")
    sp.add_argument("--budget", type=float, default=None,
                    help="seconds of sampling per row (default: 1 on a GPU, 0.3 on CPU)")
    sp.add_argument("--target-rel", type=float, default=0.01, help="stop at this median CI half-width (0.01)")
    sp.add_argument("--min-samples", type=int, default=10)
    sp.add_argument("--no-save", action="store_true", help="print only, store nothing")
    sp.add_argument("--no-size-copy", action="store_true",
                    help="do not time a copy of each row's bytes in the row's mode (pct_size_copy)")
    sp.set_defaults(fn=cmd_bench)
    sp = sub.add_parser("show", parents=[common], help="a stored run as a table")
    sp.add_argument("run", nargs="?", default="latest", help="path, run id, latest or latest~N")
    sp.add_argument("--family", action="append")
    sp.add_argument("--columns", action="append", help="columns to show")
    sp.set_defaults(fn=cmd_show)
    sp = sub.add_parser("compare", parents=[common, verdict],
                        help="FASTER/SLOWER/SAME/UNKNOWN per row; exit 1 on SLOWER")
    sp.add_argument("run_a", help="baseline run: path, run id, latest~N")
    sp.add_argument("run_b", help="new run")
    sp.add_argument("--all", action="store_true", help="also list SAME rows")
    sp.add_argument("--family", action="append", help="compare only these families")
    sp.set_defaults(fn=cmd_compare)
    ab.add_parser(sub, [common, select, verdict])
    sp = sub.add_parser("ncu-filter", parents=[common], help="the ncu --nvtx-include filter of a variant")
    sp.add_argument("family_name")
    sp.add_argument("variant_name")
    sp.add_argument("--case", default="")
    sp.add_argument("--suite", default=None)
    sp.add_argument("--range", action="append", help="a range the variant opens inside the case (one layer)")
    sp.set_defaults(fn=cmd_ncu_filter)
    sp = sub.add_parser("ncu", parents=[common], help="Nsight Compute report of one variant, joined to results")
    sp.add_argument("family_name")
    sp.add_argument("variant_name")
    sp.add_argument("--case", default="", help="case name or id (default: the suite's first case)")
    sp.add_argument("--suite", default=None, help="suite to look the case up in (default: pusht on GPU)")
    sp.add_argument("--set", default="basic", choices=["basic", "detailed", "full"], help="ncu section set")
    sp.add_argument("--metrics", action="append", help="extra ncu metrics, comma-separated (kept in the csv)")
    sp.add_argument("--cache-control", default="all", choices=CACHE_CONTROL,
                    help="all: every kernel from flushed caches (ncu's default, as `cold`); none: caches as the "
                         "previous pass left them, as inside a whole model (report named ...-warm)")
    sp.add_argument("--range", action="append", help="a range the variant opens inside the case (e.g. one U-Net "
                                                      "layer of unet1d.kernels: down1.res0.conv1); nested if repeated")
    sp.set_defaults(fn=cmd_ncu)
    sp = sub.add_parser("once", parents=[common], help="warm up, then call a variant inside its NVTX ranges")
    sp.add_argument("family_name")
    sp.add_argument("variant_name")
    sp.add_argument("--case", required=True)
    sp.add_argument("--suite", default=None)
    sp.add_argument("--calls", type=int, default=1)
    sp.set_defaults(fn=cmd_once)
    sp = sub.add_parser("report", parents=[common], help="results/report.md with plots of stored runs")
    sp.add_argument("run", nargs="*", default=["latest"],
                    help="path, run id, latest or latest~N; several runs of one machine go into one report")
    sp.add_argument("--out", help="folder for report.md and plots/ (default: the results dir)")
    sp.set_defaults(fn=cmd_report)
    sp = sub.add_parser("env", help="print this machine's environment fingerprint")
    sp.add_argument("--no-bandwidth", action="store_true")
    sp.set_defaults(fn=cmd_env)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (KeyError, ValueError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"dpk {args.cmd}: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
