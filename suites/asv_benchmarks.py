"""asv adapter, generated from the registry: class <family>, method track_<variant>, params = suite cases.

Each class measures its whole family once in `setup_cache` (one process: CUDA and extension builds are
paid once) with dpk's parity and timing engines, and every `track_<variant>(case)` returns that case's
samples as `{"samples": [...], "number": 1}` -- asv's own timing-result format, which asv recognises by
its shape -- so `asv compare` and `asv continuous` apply their statistics (Mann-Whitney on the samples
with --record-samples, confidence intervals otherwise) to device time.

Environment: DPK_ASV_SUITE (default pusht on a GPU, smoke on CPU), DPK_ASV_MODE (cold on a GPU, hot on
CPU), DPK_ASV_BUDGET (seconds per row, default 1), DPK_ASV_FAMILIES, DPK_ASV_VARIANTS and DPK_ASV_CASES
(comma-separated subsets, cases by name or id: setup_cache measures only these).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path as _Path

# asv forks benchmarks from a server process: keep CUDA uninitialised there (NVML-based availability check).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
ROOT = _Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's dpk: the commit under test, not whatever is installed

from dpk.runner import Session as _Session  # noqa: E402  (underscored: asv scans module globals)
from dpk.timing import Timer as _Timer  # noqa: E402
from dpk.timing import TimingConfig as _TimingConfig  # noqa: E402

_session = _Session()
_cuda = _session.device.type == "cuda"
SUITE = os.environ.get("DPK_ASV_SUITE") or ("pusht" if _cuda else "smoke")
MODE = os.environ.get("DPK_ASV_MODE") or ("cold" if _cuda else "hot")
BUDGET = float(os.environ.get("DPK_ASV_BUDGET", "1.0"))
FAMILIES = [f for f in os.environ.get("DPK_ASV_FAMILIES", "").split(",") if f] or sorted(_session.registry.families)
VARIANTS = [v for v in os.environ.get("DPK_ASV_VARIANTS", "").split(",") if v]
CASES = [c for c in os.environ.get("DPK_ASV_CASES", "").split(",") if c]  # case names or ids; empty: all


def _cases(family: str) -> list:
    return [c for c in _session.cases(family, SUITE) if not CASES or c.id in CASES or c.name in CASES]


def _variants(family: str) -> list:
    return [v for v in _session.registry.variants_of(family) if not VARIANTS or v.name in VARIANTS]


def measure_family(family: str) -> dict[str, dict[str, dict]]:
    """{variant: {case_id: {"samples": [...]} | {"skip": reason} | {"fail": reason}}} for the whole family."""
    timer = _Timer(_session.device, _TimingConfig(budget_s=BUDGET))
    out: dict[str, dict[str, dict]] = {}
    for v in _variants(family):
        for case in _cases(family):
            [(row, samples)] = _session.run_one(v, case, [MODE], timer)
            if row["status"] == "ok":
                res = {"samples": samples}
            elif row["status"] == "unavailable":
                res = {"skip": row["reason"]}
            else:
                res = {"fail": f"{row['status']}: {row['reason']}"}
            out.setdefault(v.name, {})[case.id] = res
    return out


def _track(variant: str):
    def track(self, cache: dict, case: str) -> dict | float:
        res = cache[variant][case]
        if "fail" in res:  # a parity failure fails the benchmark, with the reason in asv's log
            raise AssertionError(res["fail"])
        if "skip" in res:  # cannot run on this machine: asv shows n/a
            return float("nan")
        return {"samples": res["samples"], "number": 1}
    track.__name__ = f"track_{variant}"
    return track


def _benchmark_class(family: str) -> type:
    cases = [c.id for c in _cases(family)]
    attrs = {
        "params": [cases], "param_names": ["case"], "unit": "seconds", "timeout": 3600,
        "setup_cache": lambda self, family=family: measure_family(family),
    }
    for v in _variants(family):
        attrs[f"track_{v.name}"] = _track(v.name)
    return type(family, (), attrs)


for _family in FAMILIES:
    if _session.cases(_family, SUITE):
        globals()[_family] = _benchmark_class(_family)
