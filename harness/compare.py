"""Regression verdicts between two stored runs, from their samples.

Per row: FASTER / SLOWER when a Mann-Whitney test says the sample distributions differ (p < alpha) AND
the median moved by more than the effect threshold; SAME otherwise; UNKNOWN when a side is missing,
did not run, or has too few samples. The threshold is noise-aware, the largest of: `min_effect`; the rows'
own spread (half the relative IQRs added); and, for `cold`/`hot` GPU rows, `floor_us` over the smaller median:
the device time of one call of microsecond kernels moves by up to ~2 us between two processes running the same
code on the same GPU (measured with A/A pairs of runs), a per-process shift that no within-run spread shows.
`graph` rows average K calls: no floor.
Host-bound rows (the spin did not cover the call: it waits for the device, so its time is the host's) are
judged on samples divided by the row's host probe, so a host CPU that runs slower in one run does not read
as a regression while a slower call on the same host still does.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .results import KEY, Run
from .stats import mann_whitney_p, summarize

VERDICTS = ("FASTER", "SLOWER", "SAME", "UNKNOWN")


FLOOR_US = {"cold": 2.5, "hot": 2.5}  # A/A shift of one call's device time; graph averages K calls


@dataclass(frozen=True)
class CompareConfig:
    alpha: float = 0.01
    min_effect: float = 0.05
    floor_us: float | None = None  # None: FLOOR_US of the row's mode


def verdict(a: Sequence[float], b: Sequence[float], cfg: CompareConfig = CompareConfig(), floor: float = 0.0
            ) -> dict:
    """Compare samples of a baseline run `a` with a new run `b` (seconds); ratio = median(b) / median(a);
    `floor`: a relative threshold below which no change counts (the absolute noise floor over the median)."""
    if len(a) < 3 or len(b) < 3:
        return {"verdict": "UNKNOWN", "ratio": math.nan, "p": math.nan, "threshold": math.nan,
                "note": "too few samples"}
    sa, sb = summarize(a), summarize(b)
    ratio = sb.median / sa.median if sa.median > 0 else math.nan
    noise = 0.5 * (sa.iqr / sa.median + sb.iqr / sb.median) if sa.median > 0 and sb.median > 0 else math.inf
    threshold = max(cfg.min_effect, noise, floor)
    p = mann_whitney_p(a, b)
    if p < cfg.alpha and ratio > 1 + threshold:
        v = "SLOWER"
    elif p < cfg.alpha and ratio < 1 / (1 + threshold):
        v = "FASTER"
    else:
        v = "SAME"
    return {"verdict": v, "ratio": ratio, "p": p, "threshold": threshold, "note": ""}


def compare_runs(a: Run, b: Run, cfg: CompareConfig = CompareConfig()) -> pd.DataFrame:
    """One row per key present in either run, with medians, ratio, p-value and verdict; rows that neither run
    timed, with the same status and reason, are left out and listed in `df.attrs["not_timed"]`."""
    ia = a.df.set_index(KEY)
    ib = b.df.set_index(KEY)
    keys = list(dict.fromkeys([*ia.index, *ib.index]))
    out, not_timed = [], []
    for key in keys:
        row = dict(zip(KEY, key))
        ra = ia.loc[key] if key in ia.index else None
        rb = ib.loc[key] if key in ib.index else None
        row["median_us_a"] = ra["median_us"] if ra is not None else math.nan
        row["median_us_b"] = rb["median_us"] if rb is not None else math.nan
        if ra is None or rb is None:
            row |= {"verdict": "UNKNOWN", "note": f"missing in run {'A' if ra is None else 'B'}"}
        elif ra["status"] != "ok" and (ra["status"], ra["reason"]) == (rb["status"], rb["reason"]):
            not_timed.append(f"{key[0]}.{key[1]} {key[4]}: {ra['status']}: {ra['reason']}")
            continue  # nothing was measured on either side, for the same reason: no verdict to give
        elif ra["status"] != "ok" or rb["status"] != "ok":
            row |= {"verdict": "UNKNOWN", "note": f"status A={ra['status']} B={rb['status']}"}
        else:
            row |= judge(row["mode"], ra, rb, a.samples.get(key, []), b.samples.get(key, []), cfg)
            if bool(ra.get("throttled")) or bool(rb.get("throttled")):
                row["note"] = (row.get("note") or "") + " throttled"
        out.append(row)
    cols = [*KEY, "median_us_a", "median_us_b", "ratio", "p", "threshold", "verdict", "note"]
    df = pd.DataFrame(out, columns=cols)
    df.attrs["not_timed"] = not_timed  # rows neither run timed, for the same reason (e.g. not graph-capturable)
    return df


def judge(mode: str, ra: Mapping[str, Any], rb: Mapping[str, Any], sa: list[float], sb: list[float],
          cfg: CompareConfig) -> dict:
    """The verdict of one row timed on both sides (a stored row or `runner.measurement_fields`; B against the
    baseline A): the floor rule for GPU cold/hot rows, host-bound rows on host-normalised samples."""
    floor_us = FLOOR_US.get(mode, 0.0) if cfg.floor_us is None else cfg.floor_us
    small = min(ra["median_us"], rb["median_us"])
    gpu = ra.get("timer") == "cuda_event" and rb.get("timer") == "cuda_event"  # the floor is a GPU start effect
    floor = floor_us / small if gpu and small > 0 else 0.0
    if not (host_bound(ra, mode) or host_bound(rb, mode)):
        return verdict(sa, sb, cfg, floor)
    pa, pb = ra.get("host_probe_us"), rb.get("host_probe_us")
    if not (pd.notna(pa) and pd.notna(pb) and pa > 0 and pb > 0):
        v = verdict(sa, sb, cfg, floor)
        return v | {"note": f"host-bound ({_f(ra['host_us'])}/{_f(rb['host_us'])} us host)"}
    v = verdict([x / pa for x in sa], [x / pb for x in sb], cfg, floor)
    return v | {"note": f"host-bound: per host op ({_f(pa)}/{_f(pb)} us op)"}


HOST_BOUND = 0.8  # runs without the cover check: a hot row whose host cost is >= this fraction of its median
UNCOVERED = 0.5  # a row whose spin failed to cover at least this fraction of its samples times the host


def host_bound(row: Mapping[str, Any], mode: str) -> bool:
    """Whether a row's time is mostly the host's: its calls wait for the device (a host sync inside the call),
    so no spin can queue them ahead (`uncovered`); for runs made before that check, a hot row whose host cost
    per call is close to its median (hot mode then timed an eager loop)."""
    if mode == "graph":
        return False  # a replay never waits for the host; its `uncovered` only says the spin was short
    unc = row.get("uncovered")
    if pd.notna(unc):
        return bool(unc >= UNCOVERED)
    host, med = row.get("host_us"), row.get("median_us")
    return bool(mode == "hot" and pd.notna(host) and pd.notna(med) and med > 0
                and host >= HOST_BOUND * med)


def _f(v: object) -> str:
    return f"{v:.1f}" if pd.notna(v) else "-"


HOST_DRIFT = 0.10  # host_op_us differing by more than this moves host-bound rows (hot mode, Python-heavy calls)


def different_environments(a: Run, b: Run) -> list[str]:
    """Fingerprint fields that make a comparison of timings questionable."""
    fields = ("machine", "gpu", "torch", "cuda", "triton", "tf32_matmul", "tf32_cudnn", "l2_flush", "cold_launch")
    out = [f"{f}: {a.fingerprint.get(f)} vs {b.fingerprint.get(f)}" for f in fields
           if a.fingerprint.get(f) != b.fingerprint.get(f)]
    if a.hot_mode() != b.hot_mode():
        out.append(f"hot mode: {a.hot_mode()} vs {b.hot_mode()}")
    if a.meta.get("argv") and b.meta.get("argv") and a.meta["argv"] != b.meta["argv"]:
        out.append(f"commands: dpk {' '.join(a.meta['argv'])} vs dpk {' '.join(b.meta['argv'])}")
    ha, hb = a.fingerprint.get("host_op_us"), b.fingerprint.get("host_op_us")
    if ha and hb and abs(hb / ha - 1) > HOST_DRIFT:
        out.append(f"host speed: one torch op costs {ha:.1f} vs {hb:.1f} us on the host; host_us moves "
                   "with it; host-bound rows (uncovered) are judged per host op")
    return out
