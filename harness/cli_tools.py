"""Profiling and reporting commands of `dpk`: ncu-filter, ncu, once, report, env."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from . import nvtx, paths
from .cases import Case
from .env import fingerprint
from .registry import Unavailable, Variant, unavailable_reason
from .results import resolve_run
from .runner import Selection, Session
from .table import render
from .timing import MODES


def split_csv(values: list[str] | None) -> list[str]:
    """`--x a,b --x c` -> [a, b, c]."""
    return [x for v in values or [] for x in v.split(",") if x]


def session_of(a: argparse.Namespace) -> Session:
    """The registry and suites the command line points at (project + --kernels-dir/--suites-dir)."""
    return Session(a.kernels_dir, a.suites_dir)


def selection_of(a: argparse.Namespace, s: Session) -> Selection:
    """What --family/--variant/--suite/--case/--dtype/--mode select; modes default to what the device can time."""
    suites = s.suite_names()
    if a.suite not in suites:
        raise SystemExit(f"dpk: unknown suite {a.suite!r}; suites: {', '.join(suites) or 'none'}")
    if getattr(a, "mode", None):
        modes = split_csv(a.mode)
    elif s.device.type == "cuda":
        modes = list(MODES)
    else:
        modes = [m for m in MODES if m != "graph"]
        if getattr(a, "cmd", "") == "bench":
            print("dpk bench: no GPU: timing cold and hot only (graph mode needs CUDA graphs)", file=sys.stderr)
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"dpk: unknown mode(s) {bad}; modes: {', '.join(MODES)}")
    return Selection(split_csv(a.family), split_csv(a.variant), a.suite, split_csv(a.case), split_csv(a.dtype), modes,
                     case_params(a))


def case_params(a: argparse.Namespace) -> dict:
    """--param KEY=VALUE (a YAML value) and --checkpoint PATH, for every selected case."""
    import yaml

    out = {}
    for item in getattr(a, "param", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"dpk: --param wants KEY=VALUE, got {item!r}")
        out[key] = yaml.safe_load(value)
    if getattr(a, "checkpoint", None):
        path = Path(a.checkpoint).expanduser()
        if not path.exists():
            raise SystemExit(f"dpk: --checkpoint {path}: no such file or folder")
        out["checkpoint"] = str(path.resolve())
    return out


def cmd_ncu_filter(a: argparse.Namespace) -> int:
    s = session_of(a)
    s.registry.variant(a.family_name, a.variant_name)
    case_id = s.find_case(a.family_name, a.case, a.suite).id if a.case else None  # an unknown case is an error
    print(nvtx.ncu_filter(a.family_name, a.variant_name, case_id, split_csv(a.range)))
    print(nvtx.ncu_command(a.family_name, a.variant_name, case_id, a.suite, inner=split_csv(a.range)), file=sys.stderr)
    return 0


def warm(s: Session, v: Variant, case: Case, calls: int = 3) -> tuple:
    """The case's inputs after `calls` calls of `v` on them (builds and compiles happen in the first), synced."""
    import torch

    reason = unavailable_reason(v, s.device, case.dtype)
    if reason:
        raise SystemExit(f"dpk: {v.key} is unavailable: {reason}")
    inputs = s.registry.family(v.family).make_inputs(case, s.device)
    try:
        for _ in range(calls):
            v.fn(*inputs)
    except Unavailable as e:
        raise SystemExit(f"dpk: {v.key} is unavailable: {e}") from e
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)
    return inputs


def cmd_once(a: argparse.Namespace) -> int:
    """Warm up outside dpk's ranges, then `--calls` calls inside them: what `dpk ncu` profiles."""
    import torch

    from .nvtx import Ranges

    s = session_of(a)
    v = s.registry.variant(a.family_name, a.variant_name)
    case = s.find_case(a.family_name, a.case, a.suite)
    inputs = warm(s, v, case)
    with Ranges(v.family, v.name, case.id):
        for _ in range(a.calls):
            v.fn(*inputs)
    if s.device.type == "cuda":
        torch.cuda.synchronize()
    print(f"ran {v.key} on {case.id} {a.calls}x inside {nvtx.ncu_filter(v.family, v.name, case.id)}")
    return 0


def cmd_ncu(a: argparse.Namespace) -> int:
    from . import ncu

    s = session_of(a)
    v = s.registry.variant(a.family_name, a.variant_name)
    suite = a.suite or ("pusht" if s.device.type == "cuda" else "smoke")
    case = s.find_case(a.family_name, a.case, a.suite) if a.case else s.cases(a.family_name, suite)[0]
    ncu.ncu_binary()  # no ncu: say so before building anything
    print(f"dpk ncu: building/warming {v.key} on {case.id} ...", end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    warm(s, v, case, calls=1)  # here, not under ncu: builds are cached per source hash, the child reuses them
    print(f" {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"dpk ncu: profiling {v.key} on {case.id} under ncu (--set {a.set}, --cache-control {a.cache_control})",
          file=sys.stderr, flush=True)
    extra = [f"--kernels-dir={d}" for d in a.kernels_dir or []] + [f"--suites-dir={d}" for d in a.suites_dir or []]
    out_dir = paths.results_dir(a.results_dir) / "ncu"
    report, kernels, summary = ncu.run_profile(v.family, v.name, case.id, out_dir, a.set, split_csv(a.metrics),
                                               extra, inner=split_csv(a.range), cache_control=a.cache_control)
    print(render(kernels, list(kernels.columns), max_width=70))
    harness_us = _stored_cold_median(a, s, v.family, v.name, case.id)
    summary |= {"family": v.family, "variant": v.name, "case": case.id, "cache_control": a.cache_control,
                "cold_median_us": harness_us,
                "ncu_over_cold": summary["ncu_duration_us"] / harness_us if harness_us else float("nan")}
    pd.DataFrame([summary]).to_csv(report.with_suffix(".summary.csv"), index=False)
    print("\n" + "\n".join(f"{k}: {x:.4g}" if isinstance(x, float) else f"{k}: {x}" for k, x in summary.items()))
    print(f"\nreport: {report} (open with ncu-ui); kernels: {report.with_suffix('.csv')}")
    return 0


def _stored_cold_median(a: argparse.Namespace, s: Session, family: str, variant: str, case_id: str) -> float | None:
    """The cold median of the newest stored run on this machine that has the row (joins ncu to results)."""
    from .env import fingerprint
    from .results import Run, list_runs

    machine = fingerprint(s.device, measure_bandwidth=False)["machine"]
    for path in reversed(list_runs(paths.results_dir(a.results_dir), machine)):
        df = Run(path).df
        hit = df[(df.family == family) & (df.variant == variant) & (df.case == case_id) & (df["mode"] == "cold")
                 & (df.status == "ok")]
        if len(hit):
            return float(hit.iloc[0]["median_us"])
    return None


def cmd_report(a: argparse.Namespace) -> int:
    from .report import history_for, write_report

    rd = paths.results_dir(a.results_dir)
    runs = [resolve_run(r, rd) for r in a.run]
    path = write_report(runs, history_for(runs[0], rd), Path(a.out) if a.out else rd)
    print(f"wrote {path}")
    return 0


def cmd_env(a: argparse.Namespace) -> int:
    from .runner import default_device
    print(json.dumps(fingerprint(default_device(), measure_bandwidth=not a.no_bandwidth), indent=1, default=str))
    return 0
