"""Selection and orchestration shared by the CLI, pytest and asv: what to run, parity, then timing."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import cases as cases_mod
from . import parity, paths, registry
from .cases import Case
from .env import copy_bandwidth_gbps
from .nvtx import ranged
from .registry import Registry, Unavailable, Variant, Work, unavailable_reason
from .stages import STAGED, latency_fields, stages_of, with_stages
from .timing import MODES, Measurement, Timer, TimingConfig
from .timing_aids import size_matched_copies

US = 1e6
SIZE_COPY_MAX = 1 << 30  # bytes: larger copies run at the fingerprint's copy bandwidth (its probe moves 512 MiB)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@dataclass
class Selection:
    families: list[str] = field(default_factory=list)  # empty = all
    variants: list[str] = field(default_factory=list)
    suite: str = "smoke"
    cases: list[str] = field(default_factory=list)  # case names or ids
    dtypes: list[str] = field(default_factory=list)
    modes: list[str] = field(default_factory=lambda: list(MODES))
    params: dict[str, Any] = field(default_factory=dict)  # case parameters set for every selected case


class Session:
    """A loaded registry + suites on one device."""

    def __init__(self, kernels_dirs: list[Path] | None = None, suites_dirs: list[Path] | None = None,
                 device: torch.device | None = None, strict: bool = False, project: bool = True):
        self.registry: Registry = registry.load(paths.kernel_dirs(kernels_dirs, project), strict=strict)
        self.suites = cases_mod.load_suites(paths.suite_dirs(suites_dirs, project))
        self.device = device or default_device()
        # Time a size-matched copy right after each row (`size_copy_us`, `pct_size_copy`); `dpk bench` turns it on.
        self.size_copy = False

    def suite_names(self) -> list[str]:
        return sorted({s for sf in self.suites.values() for s in sf.suites})

    def cases(self, family: str, suite: str, names: list[str] | None = None,
              dtypes: list[str] | None = None) -> list[Case]:
        sf = self.suites.get(family)
        if sf is None or suite not in sf.suites:
            return []
        got = sf.suites[suite]
        if names:
            got = [c for c in got if c.name in names or c.id in names]
        if dtypes:
            got = [c for c in got if c.dtype in dtypes]
        return got

    def find_case(self, family: str, name: str, suite: str | None = None) -> Case:
        """A case by name or id, searched in `suite` or else in every suite of the family."""
        self.registry.family(family)
        sf = self.suites.get(family)
        for s in [suite] if suite else sorted(sf.suites) if sf else []:
            for c in self.cases(family, s, [name]):
                return c
        raise KeyError(cases_mod.unknown_case([sf] if sf else [], name, suite))

    def plan(self, sel: Selection) -> list[tuple[str, Case, list[Variant]]]:
        """(family, case, variants) groups, so each case's reference is computed once."""
        fams = sel.families or sorted(self.registry.families)
        for f in fams:
            self.registry.family(f)  # unknown family: a clear KeyError
        out = []
        for f in fams:
            vs = self.registry.variants_of(f)
            if sel.variants:
                for name in sel.variants:
                    if name not in {v.name for v in vs} and len(fams) == 1:
                        self.registry.variant(f, name)  # raises with the known names
                vs = [v for v in vs if v.name in sel.variants]
            for c in self.cases(f, sel.suite, sel.cases, sel.dtypes):
                c = cases_mod.with_params(c, sel.params, self.registry.family(f).params) if sel.params else c
                if vs:
                    out.append((f, c, vs))
        files = [self.suites[f] for f in fams if f in self.suites]
        for name in sel.cases:  # a case name that selects nothing is a typo, not an empty selection
            if not any(self.cases(f, sel.suite, [name]) for f in fams):
                raise KeyError(cases_mod.unknown_case(files, name, sel.suite))
        return out

    def check(self, sel: Selection, deep: bool = True) -> Iterator[parity.ParityResult]:
        for fam, case, vs in self.plan(sel):
            refs = None
            for v in vs:
                if unavailable_reason(v, self.device, case.dtype) is None and refs is None:
                    refs = parity.reference_output(self.registry.family(fam), case, self.device)
                yield parity.check(self.registry, fam, v.name, case, self.device, refs, deep)
                cuda_alive(self.device)

    def bench(self, sel: Selection, cfg: TimingConfig,
              on_row: Callable[[dict[str, Any], list[float]], None]) -> None:
        timer = Timer(self.device, cfg)
        modes = [m for m in sel.modes if m in MODES]
        for fam_name, case, vs in self.plan(sel):
            refs: list[torch.Tensor] | None = None
            for v in vs:
                if unavailable_reason(v, self.device, case.dtype) is None and refs is None:
                    refs = parity.reference_output(self.registry.family(fam_name), case, self.device)
                for row, samples in self.run_one(v, case, modes, timer, refs):
                    on_row(row, samples)
                cuda_alive(self.device)

    def run_one(self, v: Variant, case: Case, modes: list[str], timer: Timer,
                refs: list[torch.Tensor] | None = None) -> Iterator[tuple[dict[str, Any], list[float]]]:
        """Parity first; then, if it passed, one timed row per mode. The unit every adapter runs.

        After the first call: a family with `latency` gets its wall latency measured once, into every row; a variant
        with `stages` gets each stage timed in each cold and hot row's mode (`stages.with_stages`). Graph rows get
        no stages: a replay of K whole calls has no stage boundaries to time apart."""
        base = self._row_base(v, case, copy_bandwidth_gbps(self.device))
        res = parity.check(self.registry, v.family, v.name, case, self.device, refs)
        base |= {"parity": res.status, "max_abs": res.max_abs, "max_rel": res.max_rel, "rel_err": res.rel_err,
                 "tol_usage": res.tol_usage, "mismatches": res.mismatches}
        if not res.ok:
            status = {"fail": "parity_fail"}.get(res.status, res.status)
            for m in modes:
                yield base | {"mode": m, "status": status, "reason": res.reason or res.summary()}, []
            return
        fam = self.registry.family(v.family)
        inputs = fam.make_inputs(case, self.device)
        fn = ranged(lambda: v.fn(*inputs), v.family, v.name, case.id)
        first = timer.first_call(fn)
        if v.info is not None:
            base |= v.info(*inputs)
        if fam.latency and modes:
            base |= latency_fields(timer, fn)
        # a hook may capture graphs of each part: only when a cold or hot row will time them
        parts, note = stages_of(v.stages, inputs) if set(modes) & set(STAGED) else ([], "")
        for m in modes:
            row = base | {"mode": m, "first_call_s": first}
            if m == "graph" and not v.graph:
                yield row | {"status": "unavailable", "reason": "variant is not graph-capturable"}, []
                continue
            try:
                with peak_memory(self.device) as peak:
                    meas = timer.measure(fn, m)
            except Unavailable as e:
                yield row | {"status": "unavailable", "reason": str(e)}, []
                continue
            row |= measurement_fields(meas, base) | peak | self._size_copy_fields(timer, base["bytes"], m, meas)
            yield with_stages(row, timer, parts, note, (v.family, v.name, case.id)), meas.samples

    def _size_copy_fields(self, timer: Timer, nbytes: int, mode: str, meas: Measurement) -> dict[str, Any]:
        """The row's time against a copy of its bytes (the faster of two copy kernels: `size_matched_copies`),
        timed in the same mode right after the row, not once per size: two measurements of one small copy made
        far apart can differ by more than the effect the ratio is meant to show. Past SIZE_COPY_MAX bytes (e.g. a
        whole chunk's 100 reads of the weights) a copy runs at the fingerprint's copy bandwidth, which `x_floor`
        already compares with, and may not fit in memory: the columns stay empty."""
        if not self.size_copy or not nbytes or nbytes > SIZE_COPY_MAX:
            return {}
        nbytes = int(nbytes)
        try:
            copies = [ranged(c, "dpk", "size_copy", f"{nbytes}B") for c in size_matched_copies(nbytes, self.device)]
        except torch.OutOfMemoryError:  # beside what the variant keeps resident: not the row's failure
            return {}
        copy_us = min(timer.measure(c, mode).stats.median for c in copies) * US
        return {"size_copy_us": copy_us, "pct_size_copy": 100 * copy_us / (meas.stats.median * US)}

    def _row_base(self, v: Variant, case: Case, copy_gbps: float) -> dict[str, Any]:
        fam = self.registry.family(v.family)
        work_fn = v.work or fam.work
        work = work_fn(case) if work_fn else Work(0, 0)
        return {"family": v.family, "variant": v.name, "baseline": v.baseline, "case": case.id,
                "suite": case.suite, "params": json.dumps(case.p, sort_keys=True), "dtype": case.dtype,
                "bytes": work.bytes, "flops": work.flops, "copy_gbps": copy_gbps, "status": "ok", "reason": ""}


def measurement_fields(meas: Measurement, base: dict[str, Any]) -> dict[str, Any]:
    s = meas.stats
    med = s.median
    gbps = base["bytes"] / med / 1e9 if base.get("bytes") and med > 0 else float("nan")
    tflops = base["flops"] / med / 1e12 if base.get("flops") and med > 0 else float("nan")
    copy = base.get("copy_gbps") or float("nan")
    floor = base["bytes"] / (copy * 1e9) if base.get("bytes") and copy == copy else float("nan")
    return {"timer": meas.timer, "n": s.n, "median_us": med * US, "iqr_us": s.iqr * US, "min_us": s.min * US,
            "mean_us": s.mean * US, "std_us": s.std * US, "p10_us": s.p10 * US, "p90_us": s.p90 * US,
            "rel_spread": s.rel_spread, "stopped": meas.stopped,
            "host_us": _nan(meas.host_s) * US,
            "calls_per_sample": meas.calls_per_sample, "uncovered": _nan(meas.uncovered),
            "host_probe_us": _nan(meas.host_probe_s) * US, "gbps": gbps, "tflops": tflops,
            "pct_peak_bw": 100 * gbps / copy, "floor_us": floor * US, "x_floor": med / floor if floor > 0 else
            float("nan"), "throttled": meas.throttled, **meas.clocks}


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[dict[str, float]]:
    """{"peak_mem_mb": the process's peak of allocated device memory while the block ran} (GPU only)."""
    out: dict[str, float] = {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    yield out
    if device.type == "cuda":
        out["peak_mem_mb"] = torch.cuda.max_memory_allocated(device) / 1e6


def _nan(v: float | None) -> float:
    return float("nan") if v is None else v


def cuda_alive(device: torch.device) -> None:
    """After a variant failed, make sure the CUDA context survived; a sticky error ends the run clearly."""
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize(device)
    except Exception as e:
        raise RuntimeError(f"the CUDA context is broken ({e}); rows written so far are kept") from e
