"""Plain-text tables for the terminal (no dependency beyond pandas)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd


def _num(x: Any, fmt: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, fmt)


FORMATS: dict[str, Callable[[Any], str]] = {
    "median_us": lambda x: _num(x, ".2f"),
    "latency_us": lambda x: _num(x, ".1f"),
    "host_us": lambda x: _num(x, ".1f"),
    "rel_spread": lambda x: "-" if x is None or x != x else f"±{100 * x:.1f}%",
    "gbps": lambda x: _num(x, ".0f"),
    "pct_peak_bw": lambda x: "-" if x is None or x != x else f"{x:.0f}%",
    "pct_size_copy": lambda x: "-" if x is None or x != x else f"{x:.0f}%",
    "speedup": lambda x: "-" if x is None or x != x else f"{x:.2f}x",
    "max_abs": lambda x: _num(x, ".2e"),
    "tol_usage": lambda x: _num(x, ".3f"),
    "ratio": lambda x: _num(x, ".3f"),
    "p": lambda x: _num(x, ".1e"),
    "threshold": lambda x: "-" if x is None or x != x else f"{100 * x:.0f}%",
    "median_us_a": lambda x: _num(x, ".2f"),
    "median_us_b": lambda x: _num(x, ".2f"),
    "x_floor": lambda x: "-" if x is None or x != x else f"{x:.2f}x",
    "rel_err": lambda x: _num(x, ".1e"),
    "resident_mb": lambda x: _num(x, ".0f"),
    "peak_mem_mb": lambda x: _num(x, ".0f"),
}
HEADERS = {"median_us": "median us", "host_us": "host us", "rel_spread": "±ci", "gbps": "GB/s",
           "pct_peak_bw": "%copyBW", "pct_size_copy": "%sizecopy", "latency_us": "latency us",
           "median_us_a": "A us", "median_us_b": "B us", "tol_usage": "tol used", "x_floor": "xfloor",
           "rel_err": "rel err", "resident_mb": "resident MB", "peak_mem_mb": "peak MB"}


OPTIONAL = {"latency_us"}  # columns only some families fill: shown only when a row has a value


def render(df: pd.DataFrame, columns: Sequence[str], max_width: int = 60) -> str:
    """Fixed-width table of `columns`; long text cells are cut to `max_width`."""
    cols = [c for c in columns if c in df.columns and not (c in OPTIONAL and df[c].isna().all())]
    cells = []
    for _, row in df.iterrows():
        line = []
        for c in cols:
            val = row[c]
            text = FORMATS[c](val) if c in FORMATS else ("-" if val is None or val != val else str(val))
            line.append(text if len(text) <= max_width else text[: max_width - 1] + "…")
        cells.append(line)
    heads = [HEADERS.get(c, c) for c in cols]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    numeric = [c in FORMATS for c in cols]

    def fmt(parts: list[str]) -> str:
        return "  ".join(p.rjust(w) if n else p.ljust(w) for p, w, n in zip(parts, widths, numeric)).rstrip()
    return "\n".join([fmt(heads), fmt(["-" * w for w in widths]), *(fmt(r) for r in cells)])


BENCH_COLUMNS = ["family", "variant", "case", "mode", "median_us", "rel_spread", "n", "host_us", "latency_us", "gbps",
                 "pct_peak_bw", "x_floor", "pct_size_copy", "speedup", "status", "reason"]
CHECK_COLUMNS = ["family", "variant", "case", "status", "max_abs", "tol_usage", "mismatches", "detail"]
COMPARE_COLUMNS = ["family", "variant", "case", "mode", "median_us_a", "median_us_b", "ratio", "p", "threshold",
                   "verdict", "note"]
