"""`dpk ab`: one variant of this checkout (side A) against the same variant from a git revision or another
folder (side B), timed in one process.

Side B's `kernels/` is extracted from the revision (`git archive REV kernels`) into a folder kept per commit
(`$DPK_BUILD_DIR/ab/<sha>/`), or taken from `--other-dir`, and imported as a second registry under its own
package (`dpk.families_b`), so both sides' modules, Triton kernels and CUDA extensions (imported under
names that carry their source hash) live side by side. Each case is checked for parity on both sides against
this checkout's reference; a side that fails is reported and not timed. The rest is timed by one
`Timer.measure_interleaved` per case and mode (samples A, B, A, B, ... in the same loop) and judged with
`dpk compare`'s statistics, from A's point of view: "A is FASTER than B". Exit 1 when A is SLOWER anywhere
or fails parity.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from . import parity, registry
from .build import cache_root
from .cases import Case
from .cli_tools import selection_of, session_of
from .compare import CompareConfig, judge
from .nvtx import ranged
from .paths import project_root
from .registry import Registry, Unavailable, Variant
from .runner import Session, measurement_fields
from .table import render
from .timing import Timer, TimingConfig

SIDE_B_PACKAGE = "dpk.families_b"
AB_COLUMNS = ["case", "mode", "median_us_a", "median_us_b", "ratio", "n", "p", "threshold", "verdict", "note"]


def _git(*args: str, repo: Path) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode:
        raise ValueError(f"git {' '.join(args)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc.stdout.strip()


def revision_kernels(rev: str, repo: Path | None = None) -> tuple[Path, str]:
    """(the `kernels/` folder of git revision `rev`, its commit sha), extracted once per commit."""
    repo = repo or project_root()
    try:
        sha = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", repo=repo)
    except ValueError:
        raise ValueError(f"{rev!r} is not a commit of the git repository {repo}") from None
    dest = cache_root() / "ab" / sha
    if not (dest / "kernels").is_dir():
        tmp = dest.with_name(f".{sha}.{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            archive = subprocess.Popen(["git", "-C", str(repo), "archive", sha, "kernels"], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
            tar = subprocess.run(["tar", "-x", "-C", str(tmp)], stdin=archive.stdout, capture_output=True, text=True)
            _, why = archive.communicate()
            if archive.returncode or tar.returncode or not (tmp / "kernels").is_dir():
                raise ValueError(f"cannot extract kernels/ of {rev} ({sha[:10]}): "
                                 f"{why.decode(errors='replace').strip() or tar.stderr.strip()}")
            if not dest.exists():
                tmp.rename(dest)  # whole or not at all: a half extraction is never taken for a finished one
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest / "kernels", sha


def other_kernels(folder: Path) -> Path:
    """`--other-dir`: a folder that holds a `kernels/` dir, or a kernels dir itself."""
    folder = Path(folder)
    kdir = folder / "kernels" if (folder / "kernels").is_dir() else folder
    if not kdir.is_dir():
        raise FileNotFoundError(f"--other-dir {folder} does not exist")
    return kdir


def load_side_b(kernels_dir: Path, family: str) -> Registry:
    """Side B's registry: only `family`'s folder when its name says which, else every family."""
    reg = registry.load([kernels_dir], package=SIDE_B_PACKAGE, families=[family])
    if family not in reg.families:
        reg = registry.load([kernels_dir], package=SIDE_B_PACKAGE)
    for path, err in reg.load_errors.items():
        print(f"side B: LOAD ERROR {path}: {err}", file=sys.stderr)
    return reg


def _timed_call(reg: Registry, v: Variant, case: Case, s: Session, label: str) -> Callable[[], Any]:
    """A zero-argument call of `v` on the case's inputs (made by `reg`'s family), inside its NVTX ranges."""
    inputs = reg.family(v.family).make_inputs(case, s.device)
    return ranged(lambda: v.fn(*inputs), v.family, label, case.id)


def ab_rows(s: Session, reg_b: Registry, family: str, variant: str, cases: list[Case], modes: list[str],
            timer: Timer, cfg: CompareConfig) -> list[dict[str, Any]]:
    """Parity on both sides, then per mode one interleaved measurement and a verdict from A's side."""
    va, vb = s.registry.variant(family, variant), reg_b.variant(family, variant)
    rows: list[dict[str, Any]] = []
    for case in cases:
        refs = parity.reference_output(s.registry.family(family), case, s.device) \
            if registry.unavailable_reason(va, s.device, case.dtype) is None else None
        checks = {side: parity.check(reg, family, variant, case, s.device, refs)
                  for side, reg in (("A", s.registry), ("B", reg_b))}
        if not all(res.ok for res in checks.values()):
            a_res, b_res = checks["A"], checks["B"]
            same = a_res.summary() == b_res.summary()  # e.g. both unavailable for one reason: say it once
            note = a_res.summary() if same else "; ".join(f"{k} {r.summary()}" for k, r in checks.items() if not r.ok)
            verdict = "UNAVAILABLE" if {a_res.status, b_res.status} == {"unavailable"} else "PARITY"
            rows += [{"case": case.id, "mode": m, "verdict": verdict, "note": note,
                      "a_ok": a_res.status in ("pass", "unavailable")} for m in modes]
            print(f"  {case.id}: not timed: {note}", file=sys.stderr)
            continue
        fa = _timed_call(s.registry, va, case, s, va.name)
        fb = _timed_call(reg_b, vb, case, s, f"{vb.name}.B")
        timer.first_call(fa)
        timer.first_call(fb)
        for mode in modes:
            row = {"case": case.id, "mode": mode, "a_ok": True}
            try:
                if mode == "graph" and not (va.graph and vb.graph):
                    raise Unavailable("variant is not graph-capturable")
                ma, mb = timer.measure_interleaved([fa, fb], mode)
            except Unavailable as e:
                rows.append(row | {"verdict": "UNAVAILABLE", "note": str(e)})
                continue
            fa_row, fb_row = measurement_fields(ma, {}), measurement_fields(mb, {})
            v = judge(mode, fb_row, fa_row, mb.samples, ma.samples, cfg)  # baseline B: the verdict is A's
            rows.append(row | {"median_us_a": fa_row["median_us"], "median_us_b": fb_row["median_us"],
                               "ratio": fb_row["median_us"] / fa_row["median_us"], "p": v["p"],
                               "threshold": v["threshold"], "verdict": v["verdict"], "note": v["note"],
                               "n": f"{ma.stats.n}/{mb.stats.n}"})
            print(f"  {case.id} {mode}: A {fa_row['median_us']:.2f} us, B {fb_row['median_us']:.2f} us: "
                  f"{v['verdict']}", file=sys.stderr, flush=True)
    return rows


def cmd_ab(a: argparse.Namespace) -> int:
    if bool(a.rev) == bool(a.other_dir):
        raise SystemExit("dpk ab: give a git revision (dpk ab REV ...) or --other-dir DIR, not both")
    s = session_of(a)
    sel = selection_of(a, s)
    if len(sel.families) != 1 or len(sel.variants) != 1:
        raise SystemExit("dpk ab: name one --family and one --variant")
    family, variant = sel.families[0], sel.variants[0]
    plan = s.plan(sel)
    if not plan:
        raise SystemExit(f"dpk ab: nothing selected in suite {sel.suite!r}")
    if a.other_dir:
        kdir_b, label_b = other_kernels(a.other_dir), str(a.other_dir)
    else:
        kdir_b, sha = revision_kernels(a.rev)
        label_b = f"{a.rev} ({sha[:10]})"
    reg_b = load_side_b(kdir_b, family)
    try:
        reg_b.variant(family, variant)
    except KeyError as e:
        raise KeyError(f"side B ({label_b}): {e.args[0]}") from None
    budget = a.budget if a.budget is not None else (1.0 if s.device.type == "cuda" else 0.3)
    timer = Timer(s.device, TimingConfig(target_rel=a.target_rel, budget_s=budget))
    print(f"dpk ab: {family}.{variant}: A = this checkout ({project_root()}), B = {label_b}; "
          f"{len(plan)} case(s) x {','.join(sel.modes)} on {s.device}", file=sys.stderr, flush=True)
    cfg = CompareConfig(alpha=a.alpha, min_effect=a.threshold, floor_us=a.floor_us)
    rows = ab_rows(s, reg_b, family, variant, [c for _, c, _ in plan], sel.modes, timer, cfg)
    df = pd.DataFrame(rows, columns=[*AB_COLUMNS, "a_ok"])
    print(f"A = this checkout, B = {label_b}; ratio = B/A; verdict from A's side (FASTER: A is faster than B)")
    print(render(df, AB_COLUMNS, max_width=90))
    print("\n" + ", ".join(f"A is {v} than B: {n}" if v in ("FASTER", "SLOWER") else f"{v}: {n}"
                           for v, n in df["verdict"].value_counts().items()))
    return 1 if (df["verdict"] == "SLOWER").any() or not df["a_ok"].all() else 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`dpk ab`'s arguments (parents: the common, selection and verdict options)."""
    sp = sub.add_parser("ab", parents=parents, help="time a variant against itself at a git revision (or "
                        "another folder), interleaved in one process; exit 1 if this checkout is SLOWER")
    sp.add_argument("rev", nargs="?", help="git revision of side B (e.g. HEAD~1, main)")
    sp.add_argument("--other-dir", type=Path, help="side B from a folder (holding kernels/, or a kernels dir)")
    sp.add_argument("--mode", action="append", help="timing modes (default: all the device can time)")
    sp.add_argument("--budget", type=float, default=None,
                    help="seconds of sampling per case and mode, both sides together (default: 1 GPU, 0.3 CPU)")
    sp.add_argument("--target-rel", type=float, default=0.01, help="stop when both medians' CI is this tight")
    sp.set_defaults(fn=cmd_ab)
