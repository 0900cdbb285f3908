"""`dpk ncu`: profile one variant under Nsight Compute, selected by its NVTX range, and join the metrics.

`dpk ncu` first calls the variant in its own process (outside ncu: a CUDA extension build or a Triton or
torch.compile compilation fills its cache there, with progress shown, instead of running slowly and silently
under the profiler). The child process (`dpk once`) warms the variant up outside any dpk range, then makes
exactly one call inside `family > variant > case`, so `--nvtx-include dpk@family/variant/case/` profiles that call's
kernels and nothing else (not the reference, the inputs, or the warm-up). ncu's default
`--cache-control all` flushes caches before each kernel (code included), which matches dpk's `cold` mode
for a one-kernel call; `none` leaves them as the previous pass left them (the report is named `...-warm`):
what a kernel inside a whole forward or a denoising loop sees of its code and small operands. Clocks are
left alone (`--clock-control none`): by default ncu locks them to base, which makes durations longer
than what `dpk bench` measures at boost clocks.
"""
from __future__ import annotations

import collections
import glob
import io
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from . import nvtx
from .nvtx import ncu_filter

METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_throughput_pct",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
    "launch__registers_per_thread": "registers",
}


def ncu_binary() -> str:
    found = shutil.which("ncu") or next(iter(sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))), None) \
        or next(iter(glob.glob("/usr/local/cuda*/bin/ncu")), None)
    if not found:
        raise FileNotFoundError("ncu (Nsight Compute) not found: install it or put it on PATH")
    return found


CACHE_CONTROL = ("all", "none")


def profile_command(ncu: str, family: str, variant: str, case_id: str, report: Path, section_set: str,
                    extra_metrics: list[str], dpk_args: list[str], inner: Sequence[str] = (),
                    cache_control: str = "all") -> list[str]:
    if cache_control not in CACHE_CONTROL:
        raise ValueError(f"cache control {cache_control!r}: expected one of {', '.join(CACHE_CONTROL)}")
    metrics = ",".join([*METRICS, *extra_metrics])
    return [ncu, "--nvtx", "--nvtx-include", ncu_filter(family, variant, case_id, inner), "--clock-control", "none",
            "--cache-control", cache_control,
            "--set", section_set, "--metrics", metrics, "--force-overwrite", "--export", str(report),
            sys.executable, "-m", "dpk", "once", family, variant, "--case", case_id, *dpk_args]


def read_raw_csv(ncu: str, report: Path, extra_metrics: Sequence[str] = ()) -> pd.DataFrame:
    """One row per profiled kernel with the key metrics and the extra ones asked for, under their own names
    (base units: ns, bytes, %)."""
    out = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"],
                         capture_output=True, text=True, check=True).stdout
    raw = pd.read_csv(io.StringIO(out))
    raw = raw[pd.to_numeric(raw["ID"], errors="coerce").notna()]  # drop the units row
    named = {**METRICS, **{m: m for m in extra_metrics if m not in METRICS}}
    keep = {"Kernel Name": "kernel", **{m: c for m, c in named.items() if m in raw.columns}}
    df = raw[list(keep)].rename(columns=keep)
    for col in df.columns:
        if col != "kernel":
            df[col] = pd.to_numeric(df[col].astype(str).str.replace(",", ""), errors="coerce")
    return df.reset_index(drop=True)


def summarize(kernels: pd.DataFrame) -> dict[str, float]:
    dur = kernels["duration_ns"].sum()
    moved = kernels.get("dram_read_bytes", pd.Series(dtype=float)).sum() + \
        kernels.get("dram_write_bytes", pd.Series(dtype=float)).sum()
    return {"kernels": len(kernels), "ncu_duration_us": dur / 1e3, "dram_bytes": moved,
            "ncu_dram_gbps": moved / dur if dur else float("nan"),
            "sm_throughput_pct": kernels.get("sm_throughput_pct", pd.Series([float("nan")])).max(),
            "memory_throughput_pct": kernels.get("memory_throughput_pct", pd.Series([float("nan")])).max()}


def _echo(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def run_profile(family: str, variant: str, case_id: str, out_dir: Path, section_set: str = "basic",
                extra_metrics: list[str] | None = None, dpk_args: list[str] | None = None,
                echo: Callable[[str], None] = _echo, inner: Sequence[str] = (), cache_control: str = "all"
                ) -> tuple[Path, pd.DataFrame, dict[str, float]]:
    """Run ncu on a child `dpk once`, passing each line ncu and the child print to `echo` as it comes (ncu's
    `==PROF==` progress), then read the report's kernels."""
    if not nvtx.available():  # ncu would profile nothing and say only "No kernels were profiled"
        raise RuntimeError("dpk ncu selects kernels by their NVTX ranges, but the nvtx package is not installed here "
                           "(its ranges are no-ops): pip install nvtx")
    ncu = ncu_binary()
    out_dir.mkdir(parents=True, exist_ok=True)
    warm = ["warm"] if cache_control == "none" else []
    report = out_dir / f"{'-'.join([family, variant, case_id, *inner, *warm])}.ncu-rep"
    cmd = profile_command(ncu, family, variant, case_id, report, section_set, extra_metrics or [], dpk_args or [],
                          inner, cache_control)
    tail: collections.deque[str] = collections.deque(maxlen=15)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            echo(tail[-1])
    if proc.returncode or not report.exists():
        raise RuntimeError(f"ncu failed (exit {proc.returncode}):\n" + "\n".join(tail))
    kernels = read_raw_csv(ncu, report, extra_metrics or [])
    if kernels.empty:
        raise RuntimeError(f"ncu profiled no kernel inside {ncu_filter(family, variant, case_id, inner)}")
    kernels.to_csv(report.with_suffix(".csv"), index=False)
    return report, kernels, summarize(kernels)
