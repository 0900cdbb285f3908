"""`dpk report`: results/report.md with PNG plots of stored runs of one machine and that machine's history.

Plots (matplotlib, Agg): speedup over the family baseline per case, latency against bytes moved,
% of measured copy bandwidth, parity error as a share of the tolerance, history over commits, and for families
whose rows have `stages` where one call's time goes (report_stages.py).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .report_stages import plot_stages, stages_table
from .results import Run, list_runs
from .table import render

MODES_ORDER = ["cold", "hot", "graph"]
OLD_COLD = "the flush only (runs before the spin cover: host cost leaks into cold times when it exceeds the flush)"


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df.status == "ok") & df.median_us.notna()]


def _variant_colors(variants: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {v: cmap(i % 10) for i, v in enumerate(variants)}


def plot_speedup(df: pd.DataFrame, family: str, path: Path) -> Path | None:
    d = _ok(df[df.family == family])
    d = d[~d.baseline.astype(bool)]
    if d.empty or d.speedup.isna().all():
        return None
    modes = [m for m in MODES_ORDER if d[d["mode"] == m].speedup.notna().any()]  # no baseline row: no panel
    cases = list(dict.fromkeys(d.case))
    variants = list(dict.fromkeys(d.variant))
    colors = _variant_colors(variants)
    size = (max(8, 0.55 * len(cases) * len(variants) ** 0.5), 3.2 * len(modes))
    fig, axes = plt.subplots(len(modes), 1, figsize=size, squeeze=False, sharex=True)
    width = 0.8 / max(len(variants), 1)
    for ax, mode in zip(axes[:, 0], modes):
        dm = d[d["mode"] == mode].set_index(["case", "variant"])["speedup"]
        for i, v in enumerate(variants):
            ys = [dm.get((c, v), np.nan) for c in cases]
            ax.bar(np.arange(len(cases)) + (i - (len(variants) - 1) / 2) * width, ys, width, label=v,
                   color=colors[v])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylabel(f"speedup vs baseline\n({mode}, log)")
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[-1, 0].set_xticks(range(len(cases)), cases, rotation=60, ha="right", fontsize=8)
    axes[0, 0].legend(ncol=min(len(variants), 5), fontsize=8, loc="best")
    base = df[(df.family == family) & df.baseline.astype(bool)].variant.unique()
    missing = [m for m in MODES_ORDER if m in set(d["mode"]) and m not in modes]
    note = f"; no {', '.join(missing)} panel: the baseline has no timed row there" if missing else ""
    fig.suptitle(f"{family}: speedup over baseline {base[0] if len(base) else '?'} (>1 is faster){note}")
    return _save(fig, path)


def plot_latency(df: pd.DataFrame, family: str, path: Path, mode: str = "cold") -> Path | None:
    d = _ok(df[(df.family == family) & (df["mode"] == mode)])
    d = d[d.bytes > 0]
    if d.empty:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for v, g in d.groupby("variant", sort=False):
        g = g.sort_values("bytes")
        ax.plot(g.bytes / 1e6, g.median_us, "o-", label=v, ms=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ideal bytes moved per call (MB, log)")
    ax.set_ylabel(f"median latency, {mode} (us, log)")
    ax.set_title(f"{family}: latency vs size ({mode} L2)")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_bandwidth(df: pd.DataFrame, path: Path, copy_gbps: float, mode: str = "cold") -> Path | None:
    d = _ok(df[df["mode"] == mode])
    d = d[d.pct_peak_bw.notna() & (d.bytes > 0)]
    if d.empty:
        return None
    families = list(dict.fromkeys(d.family))
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 4.5), squeeze=False, sharey=True)
    for ax, fam in zip(axes[0], families):
        for v, g in d[d.family == fam].groupby("variant", sort=False):
            ax.scatter(g.bytes / 1e6, g.pct_peak_bw, label=v, s=18)
        ax.axhline(100, color="black", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("ideal bytes per call (MB, log)")
        ax.set_title(fam)
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0, 0].set_ylabel(f"% of measured copy bandwidth ({copy_gbps:.0f} GB/s)")
    fig.suptitle(f"Achieved bandwidth, {mode} L2 (100% = device-to-device copy)")
    return _save(fig, path)


def plot_parity(df: pd.DataFrame, path: Path) -> Path | None:
    d = df.drop_duplicates(["family", "variant", "case"])
    d = d[d.tol_usage.notna() & np.isfinite(d.tol_usage.astype(float))]
    if d.empty:
        return None
    labels = list(dict.fromkeys(d.family + "." + d.variant))
    fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(labels)), 4.5))
    for i, lab in enumerate(labels):
        ys = d[(d.family + "." + d.variant) == lab].tol_usage.clip(lower=1e-6)
        ax.scatter(np.full(len(ys), i) + np.random.default_rng(i).uniform(-0.15, 0.15, len(ys)), ys, s=12)
    ax.axhline(1.0, color="red", lw=1, label="tolerance")
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("max |err| / (atol + rtol |ref|)  (log; <1 passes)")
    ax.set_title("Parity error per variant, one dot per case")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_history(runs: list[Run], path: Path, mode: str = "cold") -> Path | None:
    """Per (family, variant): geometric mean over cases of median / the first run's median, per run."""
    frames = []
    for i, r in enumerate(runs):
        d = _ok(r.df[r.df["mode"] == mode])[["family", "variant", "case", "median_us"]].copy()
        d["run"] = i
        d["label"] = f"{(r.fingerprint.get('git_sha') or '?')[:7]}\n{r.fingerprint.get('timestamp', '')[5:16]}"
        frames.append(d)
    if len(frames) < 2:
        return None
    d = pd.concat(frames)
    first = d.sort_values("run").groupby(["family", "variant", "case"]).median_us.transform("first")
    d["rel"] = np.log(d.median_us / first)
    g = d.groupby(["family", "variant", "run"]).rel.mean().apply(math.exp).reset_index()
    labels = d.drop_duplicates("run").sort_values("run").label.tolist()
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(labels)), 4.5))
    cmap, styles = plt.get_cmap("tab20"), ["-", "--", ":", "-."]
    families = list(dict.fromkeys(g.family))
    for i, ((fam, var), s) in enumerate(g.groupby(["family", "variant"])):
        ax.plot(s.run, s.rel, marker="o", ls=styles[families.index(fam) % 4], color=cmap(i % 20),
                label=f"{fam}.{var}", ms=4)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel(f"latency relative to first run\n(geomean over cases, {mode})")
    ax.set_title("History over runs on this machine (lower is faster; 1 = a row's first run)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # CPU runs may have no timed row in common
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _header(run: Run) -> list[str]:
    fp = run.fingerprint
    return [f"GPU **{fp.get('gpu') or 'none (CPU: ' + str(fp.get('cpu')) + ')'}**, torch {fp.get('torch')}, "
            f"CUDA {fp.get('cuda')}, triton {fp.get('triton')}, git `{(fp.get('git_sha') or '?')[:10]}`"
            f"{' (dirty)' if fp.get('git_dirty') else ''}, {fp.get('timestamp')}. Measured copy bandwidth "
            f"{fp.get('copy_gbps', 0):.0f} GB/s; TF32 cuDNN={fp.get('tf32_cudnn')} matmul={fp.get('tf32_matmul')}.",
            "", f"Times are medians in microseconds ({'CUDA events' if fp.get('gpu') else 'perf_counter'}). "
            f"`cold`: L2 flushed before every sample ({fp.get('l2_flush', 'write flush')}); launch hiding: "
            f"{fp.get('cold_launch', OLD_COLD)}. "
            f"`hot`: {run.hot_mode()}. `graph`: CUDA-graph replay / calls (launch overhead "
            "removed). Speedup is against the family's baseline variant.", ""]


def combined(runs: Sequence[Run]) -> pd.DataFrame:
    """The rows of several runs of one machine, each case of a family from one run only (its speedups are that
    run's): e.g. a family's B = 1 run beside its B = 8 run."""
    machines = {r.fingerprint.get("machine") for r in runs}
    if len(machines) != 1:
        raise ValueError(f"runs of different machines ({', '.join(sorted(map(str, machines)))}): report them apart")
    seen: dict[tuple[str, str], str] = {}
    for r in runs:
        for fam, case in dict.fromkeys(zip(r.df.family, r.df.case)):
            if (fam, case) in seen:
                raise ValueError(f"case {case!r} of family {fam!r} is in runs {seen[fam, case]} and {r.run_id}: "
                                 "report them apart")
            seen[fam, case] = r.run_id
    return pd.concat([r.df for r in runs], ignore_index=True)


def write_report(runs: Sequence[Run], history: list[Run], out_dir: Path) -> Path:
    """report.md and plots/ of one run, or of several runs of one machine (e.g. a baseline of the kernel
    families and a run of a whole-model family), each with its own header."""
    plots = out_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    df, fp = combined(runs), runs[0].fingerprint
    lines = [f"# dpk report: run{'s' if len(runs) > 1 else ''} {', '.join(r.run_id for r in runs)}", ""]
    for r in runs:
        fams = ", ".join(dict.fromkeys(r.df.family))
        lines += ([f"Run `{r.run_id}` ({fams}):", ""] if len(runs) > 1 else []) + _header(r)
    made = [plot_parity(df, plots / "parity.png"),
            plot_bandwidth(df, plots / "bandwidth.png", fp.get("copy_gbps") or float("nan")),
            plot_history(history, plots / "history.png")]
    for fam in dict.fromkeys(df.family):
        lines += [f"## {fam}", ""]
        d = df[df.family == fam]
        for mode in [m for m in MODES_ORDER if m in set(_ok(d)["mode"])]:
            t = _ok(d[d["mode"] == mode]).pivot_table(index="case", columns="variant", values="median_us", sort=False)
            lines += [f"{mode} median (us):", "", "```", t.round(2).to_string(), "```", ""]
            sized = _ok(d[d["mode"] == mode]).dropna(subset=["pct_size_copy"])
            if len(sized):  # the roofline at each row's own size (dpk bench's size-matched copy)
                t = sized.pivot_table(index="case", columns="variant", values="pct_size_copy", sort=False)
                lines += [f"{mode} % of a copy of the same bytes in the same mode:", "", "```",
                          t.round(1).to_string(), "```", ""]
        lines += stages_table(df, fam)
        bad = d[d.status != "ok"].drop_duplicates(["variant", "case"])
        if len(bad):
            lines += ["Not timed:", "", "```", render(bad, ["variant", "case", "status", "reason"], 100), "```", ""]
        for p in (plot_speedup(df, fam, plots / f"speedup_{fam}.png"),
                  plot_latency(df, fam, plots / f"latency_{fam}.png"), *plot_stages(df, fam, plots)):
            if p:
                lines += [f"![{p.stem}](plots/{p.name})", ""]
    lines += ["## All families", ""] + [f"![{p.stem}](plots/{p.name})" for p in made if p]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def history_for(run: Run, results_dir: Path) -> list[Run]:
    return [Run(p) for p in list_runs(results_dir, run.fingerprint.get("machine"))]
