"""The results store: one long-format row per family x variant x case x dtype x mode.

A run is `results/<machine>/<run-id>.csv` (the table) plus `<run-id>.json` (fingerprint, CLI arguments,
every row with all its timing samples). Both files are rewritten atomically (temp file + rename) after
every finished row, so an interrupted run keeps what finished; a run id is never reused, so nothing is
overwritten.
"""
from __future__ import annotations

import json
import math
import os
import re
import secrets
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

KEY = ["family", "variant", "case", "dtype", "mode"]
COLUMNS = [
    "run_id", "timestamp", "machine", "gpu", "device", "git_sha", "git_dirty", "torch", "cuda", "triton",
    "family", "variant", "baseline", "case", "suite", "params", "dtype", "mode", "timer",
    "status", "reason", "parity", "max_abs", "max_rel", "rel_err", "tol_usage", "mismatches",
    "n", "median_us", "iqr_us", "min_us", "mean_us", "std_us", "p10_us", "p90_us", "rel_spread", "stopped",
    "host_us", "first_call_s", "calls_per_sample", "uncovered", "host_probe_us",
    "latency_us", "latency_p90_us", "stages",
    "bytes", "flops", "gbps", "tflops", "pct_peak_bw", "floor_us", "x_floor", "copy_gbps", "size_copy_us",
    "pct_size_copy", "speedup", "resident_mb", "prepare_s", "peak_mem_mb",
    "sm_mhz_start", "sm_mhz_min", "sm_mhz_end", "temp_c_start", "temp_c_end", "slowdown", "throttled",
    "tf32_matmul", "tf32_cudnn",
]
FINGERPRINT_COLUMNS = ["timestamp", "machine", "gpu", "device", "git_sha", "git_dirty", "torch", "cuda", "triton",
                       "copy_gbps", "tf32_matmul", "tf32_cudnn"]  # the rest of the fingerprint is in the JSON


HOT_DEVICE = "M back-to-back calls queued behind the same spin: device time per call, warm L2"
HOT_EAGER = "back-to-back calls with a warm L2, the per-call time of an eager loop (host cost when it dominates)"


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stage_times(value: Any) -> dict[str, float]:
    """A row's `stages` as {name: us per call}: the one reader of the column, whether it holds a dict (rows in
    memory, the JSON) or a JSON string (the CSV); {} when the row has none. A stage that failed (NaN, stored as
    null) reads back as NaN."""
    if isinstance(value, str):
        value = json.loads(value) if value else {}
    if not isinstance(value, dict):
        return {}
    return {str(k): math.nan if v is None else float(v) for k, v in value.items()}


def _stages_json(value: Any) -> Any:
    """The CSV cell of `stages`: a JSON object (NaN as null), or empty."""
    got = stage_times(value)
    return json.dumps({k: None if v != v else v for k, v in got.items()}) if got else None


def with_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """speedup = baseline median / median, within the same family, case, dtype and mode."""
    if df.empty:
        return df
    df = df.copy()
    base = df[df["baseline"].astype(bool) & (df["status"] == "ok")]
    base = base.set_index(["family", "case", "dtype", "mode"])["median_us"]
    keys = list(zip(df["family"], df["case"], df["dtype"], df["mode"]))
    df["speedup"] = [base.get(k, math.nan) / m if m and m == m else math.nan for k, m in zip(keys, df["median_us"])]
    return df


class RunWriter:
    """Accumulates rows of one run and keeps both files on disk current after every row."""

    def __init__(self, results_dir: Path, fingerprint: dict[str, Any], meta: dict[str, Any]):
        self.fingerprint = fingerprint
        stamp = fingerprint["timestamp"].replace("-", "").replace(":", "").split("+")[0]
        sha = (fingerprint.get("git_sha") or "nogit")[:7]
        self.run_id = f"{stamp}-{sha}-{secrets.token_hex(2)}"
        self.dir = Path(results_dir) / fingerprint["machine"]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.dir / f"{self.run_id}.csv"
        self.json_path = self.dir / f"{self.run_id}.json"
        for p in (self.csv_path, self.json_path):
            if p.exists():
                raise FileExistsError(f"{p} exists: results are never overwritten")
        self.meta = meta
        self.rows: list[dict[str, Any]] = []
        self.samples: list[list[float]] = []

    def add(self, row: dict[str, Any], samples: Iterable[float] = ()) -> None:
        fp = {k: self.fingerprint.get(k) for k in FINGERPRINT_COLUMNS}
        self.rows.append({"run_id": self.run_id, **fp, **row})
        self.samples.append([float(f"{s:.6g}") for s in samples])  # events resolve ~0.5 us: 6 digits is exact
        self.flush()

    def frame(self) -> pd.DataFrame:
        return with_speedups(pd.DataFrame(self.rows, columns=COLUMNS))

    def flush(self) -> None:
        df = self.frame()
        _atomic_write(self.csv_path, df.assign(stages=df["stages"].map(_stages_json)).to_csv(index=False))
        records = json.loads(df.to_json(orient="records"))
        for rec, samples in zip(records, self.samples):
            rec["samples_s"] = samples
        doc = {"run_id": self.run_id, "fingerprint": self.fingerprint, "meta": self.meta, "rows": records}
        _atomic_write(self.json_path, json.dumps(doc, separators=(",", ":"), default=str))


class Run:
    """A stored run: its table, fingerprint and per-row samples."""

    def __init__(self, json_path: Path):
        self.path = Path(json_path)
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read run {self.path}: {e}") from e
        if not isinstance(doc, dict) or not {"run_id", "fingerprint", "rows"} <= set(doc):
            raise ValueError(f"{self.path} is not a stored dpk run (no run_id, fingerprint and rows)")
        self.run_id: str = doc["run_id"]
        self.fingerprint: dict[str, Any] = doc["fingerprint"]
        self.meta: dict[str, Any] = doc.get("meta", {})
        rows = doc["rows"]
        self.samples = {tuple(r[k] for k in KEY): r.get("samples_s", []) for r in rows}
        self.df = pd.DataFrame([{k: v for k, v in r.items() if k != "samples_s"} for r in rows], columns=COLUMNS)
        self.df["stages"] = self.df["stages"].map(lambda v: stage_times(v) or None)  # a dict per row, or None

    def hot_mode(self) -> str:
        """What this run's `hot` rows time: the fingerprint says so since it was recorded; before that, runs
        with the cover check (an `uncovered` value) queued hot calls behind a spin, older ones did not."""
        if text := self.fingerprint.get("hot_mode"):
            return text
        return HOT_DEVICE if self.df["uncovered"].notna().any() else HOT_EAGER

    def incomplete(self) -> str | None:
        """Why this run is partial (stopped before its last planned row), or None: complete, or stored before
        runs recorded it."""
        if self.meta.get("complete", True):
            return None
        planned = self.meta.get("planned_rows")
        return f"is incomplete ({len(self.df)} of {planned} planned rows: interrupted)" if planned else \
            "is incomplete (interrupted)"


RUN_ID_RE = re.compile(r"^\d{8}T\d{6}-.+-[0-9a-f]{4}$")  # RunWriter's `<stamp>-<sha7>-<hex4>`


def is_run(json_path: Path) -> bool:
    """Whether a path is a stored dpk run: `<machine>/<run-id>.json` with its `.csv` beside it (not asv's or
    ncu's files, which also live under results/)."""
    return bool(RUN_ID_RE.match(json_path.stem)) and json_path.with_suffix(".csv").is_file()


def list_runs(results_dir: Path, machine: str | None = None) -> list[Path]:
    """Stored runs (their JSON files), oldest first: by the run id's timestamp (to the second), then by when the
    file was last written (two runs started in the same second; the id's random suffix says nothing of order)."""
    pattern = f"{machine}/*.json" if machine else "*/*.json"
    runs = [p for p in Path(results_dir).glob(pattern) if is_run(p)]
    return sorted(runs, key=lambda p: (p.name.split("-", 1)[0], p.stat().st_mtime_ns))


def resolve_run(spec: str, results_dir: Path, machine: str | None = None) -> Run:
    """A run from a path (.csv or .json), a run id, or `latest` / `latest~N` (N runs before the latest)."""
    p = Path(spec)
    if p.suffix in (".csv", ".json") and p.exists():
        return Run(p.with_suffix(".json"))
    runs = list_runs(results_dir, machine)
    if spec.startswith("latest"):
        back = int(spec.partition("~")[2] or 0)
        if back >= len(runs):
            where = f"{results_dir}/{machine or '*'}"
            raise ValueError(f"{spec}: only {len(runs)} stored run(s) under {where}")
        return Run(runs[-1 - back])
    hits = [r for r in runs if r.stem == spec or r.stem.startswith(spec)]
    if len(hits) != 1:
        raise ValueError(f"run {spec!r}: {'no' if not hits else len(hits)} match(es) under {results_dir}")
    return Run(hits[0])
