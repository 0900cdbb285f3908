"""`dpk report`'s stage breakdown, for families whose rows have `stages`: where one call's time goes.

Per (case, dtype) a panel with one horizontal stacked bar per variant: each stage's time per call (stage x count,
timed alone), then "host / other" = latency - sum of the stages when the row has a larger latency, so the bar ends at
the action latency (labelled "rest" when a stage failed: it then holds that stage too); a variant without stages draws
its whole call. The same numbers go into a table of report.md.
The rows of one mode are drawn: cold when the family has cold rows with stages (the latency also starts on a cold L2),
else hot.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from .results import stage_times
from .stages import STAGED

HOST = "host / other"
WHOLE = "whole call (no stages)"
REST = "rest (a stage failed)"
STYLE = {HOST: {"color": "0.8"}, WHOLE: {"color": "0.5"}, REST: {"color": "white", "edgecolor": "0.5", "hatch": "//"}}
PANELS = 8  # panels per figure; more (case, dtype) pairs go to further figures


def staged_rows(df: pd.DataFrame, family: str) -> tuple[str | None, pd.DataFrame]:
    """(mode, the family's ok rows of that mode) for the breakdown, or (None, empty) when no row has stages."""
    d = df[(df.family == family) & (df.status == "ok") & df.median_us.notna()]
    with_stages = d[d.stages.notna()]
    mode = next((m for m in STAGED if (with_stages["mode"] == m).any()), None)
    return mode, d[d["mode"] == mode]


def _names(d: pd.DataFrame) -> list[str]:
    """Every stage name of the rows, in call order (a name first seen in a later row goes before the next name it
    precedes there, e.g. an encoder only some cases run): one colour per name across panels."""
    out: list[str] = []
    for v in d.stages:
        names = list(stage_times(v))
        for i, n in enumerate(names):
            if n not in out:
                after = next((m for m in names[i + 1:] if m in out), None)
                out.insert(out.index(after) if after else len(out), n)
    return out


def segments(row: pd.Series) -> list[tuple[str, float]]:
    """(label, us) of one bar: the stages that were timed, then what the latency leaves over them."""
    times = stage_times(row.stages)
    segs = [(n, us) for n, us in times.items() if not math.isnan(us)]
    lat = row.latency_us
    if not segs:
        return [(WHOLE, lat if lat == lat else row.median_us)]
    total = sum(us for _, us in segs)
    rest = REST if len(segs) < len(times) else HOST
    return segs + ([(rest, lat - total)] if lat == lat and lat > total else [])


def _label(row: pd.Series, total: float, scale: float, unit: str) -> str:
    stages = sum(us for n, us in segments(row) if n not in STYLE)
    lat = row.latency_us
    if lat == lat and stages > lat:  # stages timed alone outlast the whole call (overlap, launch gaps)
        return f" stages {stages / scale:.3g} {unit} > latency {lat / scale:.3g} {unit}"
    return f" {total / scale:.3g} {unit}" + ("" if lat == lat else " (stages; no latency)")


def plot_stages(df: pd.DataFrame, family: str, plots: Path) -> list[Path]:
    """plots/stages_<family>.png (and stages_<family>_2.png, ... past PANELS panels); [] without stages."""
    mode, d = staged_rows(df, family)
    if mode is None:
        return []
    cmap = plt.get_cmap("tab10")
    style = {n: {"color": cmap(i % 10)} for i, n in enumerate(_names(d))} | STYLE
    panels = list(dict.fromkeys(zip(d.case, d.dtype)))
    variants = list(dict.fromkeys(d.variant))
    longest = max(sum(us for _, us in segments(r)) for _, r in d.iterrows())
    unit, scale = ("ms", 1e3) if longest >= 1e3 else ("us", 1.0)
    out = []
    for first in range(0, len(panels), PANELS):
        part = panels[first:first + PANELS]
        cols = min(2, len(part))
        rows = math.ceil(len(part) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, rows * (0.45 * len(variants) + 1.4)), squeeze=False)
        for ax, (case, dtype) in zip(axes.flat, part):
            g = d[(d.case == case) & (d.dtype == dtype)].set_index("variant")
            shown = [v for v in variants if v in g.index]
            for y, v in enumerate(shown):
                left = 0.0
                for name, us in segments(g.loc[v]):
                    ax.barh(y, us / scale, left=left, label=name, height=0.6, **style[name])
                    left += us / scale
                ax.text(left, y, _label(g.loc[v], left * scale, scale, unit), va="center", fontsize=8)
            ax.set_yticks(range(len(shown)), shown, fontsize=8)
            ax.invert_yaxis()
            widest = max(sum(us for _, us in segments(g.loc[v])) for v in shown)
            ax.set_xlim(0, 1.45 * widest / scale)  # per panel: a 16-step chunk beside a 100-step one stays readable
            ax.set_xlabel(f"time per call ({unit})")
            ax.set_title(f"{case} ({dtype})", fontsize=9)
            ax.grid(axis="x", alpha=0.3)
        for ax in axes.flat[len(part):]:
            ax.axis("off")
        legend = {}
        for ax in axes.flat:
            legend |= dict(zip(*reversed(ax.get_legend_handles_labels())))
        legend = {n: legend[n] for n in style if n in legend}  # call order, then host / other
        fig.legend(legend.values(), legend.keys(), loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
        more = f", panels {first + 1}-{first + len(part)} of {len(panels)}" if len(panels) > PANELS else ""
        fig.suptitle(f"{family}: where one call's time goes ({mode}{more})\nstages timed alone x count; "
                     "the bar ends at the action latency", fontsize=10)
        fig.tight_layout()
        name = f"stages_{family}.png" if not first else f"stages_{family}_{first // PANELS + 1}.png"
        fig.savefig(plots / name, dpi=110, bbox_inches="tight")  # the legend sits right of the panels
        plt.close(fig)
        out.append(plots / name)
    return out


def stages_table(df: pd.DataFrame, family: str) -> list[str]:
    """report.md lines: variant x case with latency, device median, each stage (us per call), x_floor, speedup."""
    mode, d = staged_rows(df, family)
    if mode is None:
        return []
    names = _names(d)
    order = {v: i for i, v in enumerate(dict.fromkeys(d.variant))}
    recs = [{"variant": r.variant, "case": r.case, "latency_us": r.latency_us, "median_us": r.median_us,
             **{n: stage_times(r.stages).get(n, math.nan) for n in names}, "x_floor": r.x_floor,
             "speedup": r.speedup} for _, r in d.iterrows()]
    t = pd.DataFrame(recs).sort_values("variant", key=lambda s: s.map(order), kind="stable")
    t[t.columns[2:]] = t[t.columns[2:]].astype(float)  # a column all null in the JSON reads back as None
    return [f"Where a call's time goes ({mode}, us per call; `latency_us`: wall time to the output on the host; "
            "`median_us`: device time; each stage timed alone x its count, so they need not add up):", "", "```",
            t.set_index(["variant", "case"]).round(2).to_string(), "```", ""]
