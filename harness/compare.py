"""Regression verdicts between two stored runs, from their samples.

Per row: FASTER / SLOWER when a Mann-Whitney test says the sample distributions differ (p < alpha) AND
the median moved by more than the effect threshold; SAME otherwise; UNKNOWN when a side is missing,
did not run, or has too few samples. The threshold is noise-aware: at least `min_effect`, and at least
the rows' own spread (half the relative IQRs added), so two runs of the same code land on SAME.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from .results import KEY, Run
from .stats import mann_whitney_p, summarize

VERDICTS = ("FASTER", "SLOWER", "SAME", "UNKNOWN")


@dataclass(frozen=True)
class CompareConfig:
    alpha: float = 0.01
    min_effect: float = 0.05


def verdict(a: Sequence[float], b: Sequence[float], cfg: CompareConfig = CompareConfig()) -> dict:
    """Compare samples of a baseline run `a` with a new run `b` (seconds); ratio = median(b) / median(a)."""
    if len(a) < 3 or len(b) < 3:
        return {"verdict": "UNKNOWN", "ratio": math.nan, "p": math.nan, "threshold": math.nan,
                "note": "too few samples"}
    sa, sb = summarize(a), summarize(b)
    ratio = sb.median / sa.median if sa.median > 0 else math.nan
    noise = 0.5 * (sa.iqr / sa.median + sb.iqr / sb.median) if sa.median > 0 and sb.median > 0 else math.inf
    threshold = max(cfg.min_effect, noise)
    p = mann_whitney_p(a, b)
    if p < cfg.alpha and ratio > 1 + threshold:
        v = "SLOWER"
    elif p < cfg.alpha and ratio < 1 / (1 + threshold):
        v = "FASTER"
    else:
        v = "SAME"
    return {"verdict": v, "ratio": ratio, "p": p, "threshold": threshold, "note": ""}


def compare_runs(a: Run, b: Run, cfg: CompareConfig = CompareConfig()) -> pd.DataFrame:
    """One row per key present in either run, with medians, ratio, p-value and verdict."""
    ia = a.df.set_index(KEY)
    ib = b.df.set_index(KEY)
    keys = list(dict.fromkeys([*ia.index, *ib.index]))
    out = []
    for key in keys:
        row = dict(zip(KEY, key))
        ra = ia.loc[key] if key in ia.index else None
        rb = ib.loc[key] if key in ib.index else None
        row["median_us_a"] = ra["median_us"] if ra is not None else math.nan
        row["median_us_b"] = rb["median_us"] if rb is not None else math.nan
        if ra is None or rb is None:
            row |= {"verdict": "UNKNOWN", "note": f"missing in run {'A' if ra is None else 'B'}"}
        elif ra["status"] != "ok" or rb["status"] != "ok":
            row |= {"verdict": "UNKNOWN", "note": f"status A={ra['status']} B={rb['status']}"}
        else:
            row |= verdict(a.samples.get(key, []), b.samples.get(key, []), cfg)
            if bool(ra.get("throttled")) or bool(rb.get("throttled")):
                row["note"] = (row.get("note") or "") + " throttled"
            if row["mode"] == "hot" and (host_bound(ra) or host_bound(rb)):  # this row times the host
                row["note"] = (row.get("note") or "") + f" host-bound ({_f(ra['host_us'])}/{_f(rb['host_us'])} us host)"
        out.append(row)
    cols = [*KEY, "median_us_a", "median_us_b", "ratio", "p", "threshold", "verdict", "note"]
    return pd.DataFrame(out, columns=cols)


HOST_BOUND = 0.8  # a hot-mode row whose host cost per call is >= this fraction of its median times the host


def host_bound(row: pd.Series) -> bool:
    """Whether a hot-mode row's time is mostly the host's (back-to-back calls of a launch-bound variant: the
    device waits for the next launch): such rows move with the host's speed, not with the kernel. (Cold mode
    hides the launch behind a spin; graph mode has no host.)"""
    host, med = row.get("host_us"), row.get("median_us")
    return bool(pd.notna(host) and pd.notna(med) and med > 0 and host >= HOST_BOUND * med)


def _f(v: object) -> str:
    return f"{v:.1f}" if pd.notna(v) else "-"


HOST_DRIFT = 0.10  # host_op_us differing by more than this moves host-bound rows (hot mode, Python-heavy calls)


def different_environments(a: Run, b: Run) -> list[str]:
    """Fingerprint fields that make a comparison of timings questionable."""
    fields = ("machine", "gpu", "torch", "cuda", "triton", "tf32_matmul", "tf32_cudnn", "l2_flush", "cold_launch")
    out = [f"{f}: {a.fingerprint.get(f)} vs {b.fingerprint.get(f)}" for f in fields
           if a.fingerprint.get(f) != b.fingerprint.get(f)]
    ha, hb = a.fingerprint.get("host_op_us"), b.fingerprint.get("host_op_us")
    if ha and hb and abs(hb / ha - 1) > HOST_DRIFT:
        out.append(f"host speed: one torch op costs {ha:.1f} vs {hb:.1f} us on the host; host-bound rows "
                   "(hot mode, host_us close to the median) move with it")
    return out
