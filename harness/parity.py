"""The one parity engine: every non-reference variant against the family's float64 reference.

For one (variant, case) it reports max abs/rel error, the share of the tolerance used, mismatch and
NaN/Inf-mismatch counts and the first mismatching indices, and runs the guards of `guards.py`:

  run 1  plain call (allocator pre-poisoned with 0x7F blocks): the errors reported, inputs modified?, output aliasing
         an input?, lazy output?, threads left running / output still changing after return?
  run 1b a second plain call: threads it starts and leaves running are reported (a first call may start a
         library's worker pool, as torch.compile does)
  run 2  fresh allocations hold NaN instead of run 1's 0x7F bytes (guards.poisoned_allocator): elements
         that differ between the runs were never written
  run 3  (GPU) queued behind a spin on the current stream, on inputs of another seed (an output buffer the variant
         owns still holds run 2's answer): does the output appear early (side stream)?
  run 4  (GPU, graph-capturable variants) an eager call on fresh inputs (another seed) must pass too;
         then capture once, copy the fresh inputs into the captured buffers and replay: the replay must
         match that eager call, or the variant captured state (pointers, host scalars; gpu-mode "recheck")
  against  a variant declared `against=<other>` must also match that variant's output on the same inputs
         within the family's tolerance for the arithmetic they share (`compute`: a graph or a compiled form of
         the same module; two TF32 evaluations with different kernels differ by TF32 rounding, not fp32's)
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import guards
from .cases import Case
from .nvtx import Ranges
from .registry import Family, Registry, Unavailable, Variant, unavailable_reason
from .timing_aids import graph_of
from .tolerance import Tolerance, torch_dtype

MAX_FIRST_BAD = 5


@dataclass
class ParityResult:
    family: str
    variant: str
    case: str
    dtype: str
    status: str = "pass"  # pass | fail | unavailable | error
    reason: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    max_abs: float = math.nan
    max_rel: float = math.nan
    tol_usage: float = math.nan  # max |err| / (atol + rtol |ref|): <= 1 passes
    rel_err: float = math.nan  # ||out - ref||_2 / ||ref||_2 over all outputs
    mismatches: int = 0
    numel: int = 0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    first_bad: list[str] = field(default_factory=list)
    atol: float = math.nan
    rtol: float = math.nan
    tol_why: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def summary(self) -> str:
        if self.status in ("unavailable", "error"):
            return f"{self.status}: {self.reason}"
        text = f"max_abs={self.max_abs:.3g} tol_usage={self.tol_usage:.3g}"
        if self.mismatches:
            text += f" mismatches={self.mismatches}/{self.numel} first={self.first_bad[:2]}"
        return "; ".join([text, *self.problems])


@contextlib.contextmanager
def exact_math() -> Iterator[None]:
    """TF32 off for the reference (it runs in float64, but a family may upcast only to float32)."""
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def upcast(inputs: Sequence[Any]) -> tuple:
    return tuple(t.detach().to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                 for t in inputs)


def reference_output(fam: Family, case: Case, device: torch.device) -> list[torch.Tensor]:
    """The oracle's output(s) for `case`, in float64, inside the `family > reference > case` range."""
    inputs = fam.make_inputs(case, device)
    with exact_math(), Ranges(fam.name, "reference", case.id):
        out = fam.reference(*upcast(inputs))
    outs = guards.tensors(out)
    if not outs:
        raise TypeError(f"reference of {fam.name} returned {type(out).__name__}, expected tensor(s)")
    return outs


def resolve_tolerance(fam: Family, v: Variant, case: Case) -> Tolerance:
    if isinstance(v.tol, Tolerance):
        return v.tol
    if callable(v.tol):
        return v.tol(case)
    return fam.tolerance(case, v.compute)


def compare(outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor], tol: Tolerance, res: ParityResult) -> None:
    """Fill the error metrics of `res`; element i passes when |out-ref| <= atol + rtol |ref| (NaN-aware)."""
    res.atol, res.rtol, res.tol_why = tol.atol, tol.rtol, tol.why
    res.max_abs = res.max_rel = res.tol_usage = 0.0
    err2 = ref2 = 0.0
    for k, (o, r) in enumerate(zip(outs, refs)):
        o64 = o.detach().to(torch.float64)
        nan_o, nan_r = o64.isnan(), r.isnan()
        inf_o, inf_r = o64.isinf(), r.isinf()
        nan_bad = nan_o ^ nan_r
        inf_bad = (inf_o | inf_r) & ~(inf_o & inf_r & (o64.sign() == r.sign())) & ~nan_o & ~nan_r
        finite = ~(nan_o | nan_r | inf_o | inf_r)
        diff = torch.where(finite, (o64 - r).abs(), torch.zeros_like(r))
        bound = tol.atol + tol.rtol * torch.where(finite, r.abs(), torch.zeros_like(r))
        bad = (diff > bound) | nan_bad | inf_bad
        res.numel += r.numel()
        res.nan_mismatch += int(nan_bad.sum())
        res.inf_mismatch += int(inf_bad.sum())
        res.mismatches += int(bad.sum())
        err2 += float(diff.pow(2).sum())
        ref2 += float(torch.where(finite, r, torch.zeros_like(r)).pow(2).sum())
        if r.numel():
            res.max_abs = max(res.max_abs, float(diff.max()))
            res.max_rel = max(res.max_rel, float((diff / (r.abs() + tol.atol).clamp_min(1e-300)).max()))
            res.tol_usage = max(res.tol_usage, float((diff / bound.clamp_min(1e-300)).max()))
        for idx in torch.nonzero(bad)[: MAX_FIRST_BAD - len(res.first_bad)].tolist():
            at = tuple(idx)
            where = f"out{k}" if len(outs) > 1 else "out"
            res.first_bad.append(f"{where}{at}: got {float(o64[at]):.6g} want {float(r[at]):.6g}")
    res.rel_err = math.sqrt(err2 / ref2) if ref2 > 0 else (0.0 if err2 == 0 else math.inf)
    if res.nan_mismatch or res.inf_mismatch:
        res.tol_usage = res.rel_err = math.inf


def _shape_problems(outs: list[torch.Tensor], refs: list[torch.Tensor], case: Case, out_dtype: str | None
                    ) -> list[str]:
    if len(outs) != len(refs):
        return [f"returned {len(outs)} tensor(s), the reference returns {len(refs)}"]
    want = torch_dtype(out_dtype or case.dtype)
    problems = []
    for k, (o, r) in enumerate(zip(outs, refs)):
        if tuple(o.shape) != tuple(r.shape):
            problems.append(f"output #{k} has shape {tuple(o.shape)}, expected {tuple(r.shape)}")
        if o.is_floating_point() and o.dtype != want:
            problems.append(f"output #{k} is {o.dtype}, expected {want} (precision downgrade or upcast)")
    return problems


def check(reg: Registry, family: str, variant: str, case: Case, device: torch.device,
          refs: list[torch.Tensor] | None = None, deep: bool = True) -> ParityResult:
    """Parity of one variant on one case. Never raises for a misbehaving variant: it reports."""
    fam, v = reg.family(family), reg.variant(family, variant)
    res = ParityResult(family, variant, case.id, case.dtype)
    reason = unavailable_reason(v, device, case.dtype)
    if reason:
        res.status, res.reason = "unavailable", reason
        return res
    try:
        refs = refs if refs is not None else reference_output(fam, case, device)
        other = reg.variant(family, v.against) if v.against else None
        _run_checks(fam, v, case, device, refs, res, deep, other)
    except Unavailable as e:
        res.status, res.reason = "unavailable", str(e)
    except Exception as e:  # the variant raised: report it, keep the run going
        res.status, res.reason = "error", f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
    return res


def other_seed(case: Case) -> Case:
    """The same case with inputs of another seed (runs 3 and 4: values no earlier call has seen)."""
    return dataclasses.replace(case, seed=case.seed ^ 0x5EED)


def _call(fam: Family, v: Variant, case: Case, device: torch.device) -> tuple[tuple, Any]:
    """Fresh inputs and a zero-argument call of the variant on them, inside its NVTX ranges."""
    inputs = fam.make_inputs(case, device)
    ranges = Ranges(fam.name, v.name, case.id)

    def call() -> Any:
        with ranges:
            return v.fn(*inputs)
    return inputs, call


def _run_checks(fam: Family, v: Variant, case: Case, device: torch.device, refs: list[torch.Tensor],
                res: ParityResult, deep: bool, other: Variant | None = None) -> None:
    want = torch_dtype(fam.output_dtype or case.dtype)
    sizes = [r.numel() * torch.empty((), dtype=want).element_size() for r in refs]
    tol = resolve_tolerance(fam, v, case)

    inputs, call = _call(fam, v, case, device)  # run 1
    snaps = guards.snapshot(inputs)
    with guards.poisoned_allocator(device, sizes):
        out, late = guards.background_work(call, device)
    lazy = guards.lazy_output(out)
    outs = guards.tensors(out)
    shape_problems = [lazy] if lazy else _shape_problems(outs, refs, case, fam.output_dtype)
    res.problems += shape_problems + late
    if shape_problems:
        res.status = "fail"
        return
    compare(outs, refs, tol, res)
    res.problems += guards.modified_inputs(inputs, snaps) + guards.aliases(outs, inputs)
    if other is not None:
        _against(fam, other, case, device, inputs, outs, res)
    outs1 = [o.detach().clone() for o in outs]
    del out, outs, inputs
    if deep:  # run 1b: a second plain call must not start threads (a first call may start a library's pool)
        _, threads = guards.threads_started(_call(fam, v, case, device)[1])
        if threads:
            res.problems.append(threads)
            late = [*late, threads]

    if deep:
        _, call2 = _call(fam, v, case, device)  # run 2: same inputs, other poison (NaN instead of 0x7F/garbage)
        with guards.poisoned_allocator(device, sizes, byte=0xFF), guards.nan_filled_empty():
            outs2 = guards.tensors(call2())  # (deterministic mode makes torch.compile recompile: no thread check)
        differ = ParityResult(res.family, res.variant, res.case, res.dtype)
        compare(outs2, [o.detach().to(torch.float64) for o in outs1], tol, differ)
        if not late and differ.mismatches:
            res.problems.append(f"output depends on uninitialised memory: {differ.mismatches} element(s) change "
                                "with the contents of fresh allocations")
        if device.type == "cuda":  # run 3, on other values: a buffer the variant owns holds run 2's answer
            _, call3 = _call(fam, v, other_seed(case), device)
            with guards.poisoned_allocator(device, sizes):
                side = guards.side_stream(call3, device, [(tuple(r.shape), want) for r in refs])
            if side:
                res.problems.append(side)
            if v.graph and not (res.problems or res.mismatches):
                _graph_recheck(fam, v, case, device, res)
    res.status = "fail" if (res.problems or res.mismatches) else "pass"


def _against(fam: Family, other: Variant, case: Case, device: torch.device, inputs: tuple,
              outs: list[torch.Tensor], res: ParityResult) -> None:
    """The outputs against `other`'s on the same inputs, within the tolerance of the shared arithmetic."""
    if unavailable_reason(other, device, case.dtype):
        res.notes.append(f"not checked against {other.name}: {unavailable_reason(other, device, case.dtype)}")
        return
    theirs = [t.detach().to(torch.float64) for t in guards.tensors(other.fn(*inputs))]
    probe = ParityResult(res.family, res.variant, res.case, res.dtype)
    compare(outs, theirs, fam.tolerance(case, other.compute), probe)
    note = f"vs {other.name}: max_abs={probe.max_abs:.3g} rel_err={probe.rel_err:.3g} tol_usage={probe.tol_usage:.3g}"
    if probe.mismatches:
        res.problems.append(f"differs from {other.name} beyond {other.compute} rounding ({note})")
    else:
        res.notes.append(note)


def _graph_recheck(fam: Family, v: Variant, case: Case, device: torch.device, res: ParityResult) -> None:
    static = fam.make_inputs(case, device)
    try:
        with Ranges(fam.name, v.name, case.id):
            graph, out = graph_of(lambda: v.fn(*static), device, warmup=1)
    except Exception as e:
        torch.cuda.synchronize(device)
        res.notes.append(f"not graph-capturable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return
    fresh_case = other_seed(case)
    fresh = fam.make_inputs(fresh_case, device)
    tol = resolve_tolerance(fam, v, fresh_case)  # a family may derive it from the case's data
    eager = guards.tensors(v.fn(*fresh))
    on_fresh = ParityResult(res.family, res.variant, res.case, res.dtype)
    compare(eager, reference_output(fam, fresh_case, device), tol, on_fresh)
    if on_fresh.mismatches:  # a result cached from earlier calls, or a tolerance too tight for other data
        res.problems.append(f"fails on fresh inputs (seed {fresh_case.seed}): {on_fresh.summary()}")
    for s, f in zip(static, fresh):
        if isinstance(s, torch.Tensor):
            s.copy_(f)
    graph.replay()
    torch.cuda.synchronize(device)
    probe = ParityResult(res.family, res.variant, res.case, res.dtype)
    compare(guards.tensors(out), [t.detach().to(torch.float64) for t in eager], tol, probe)
    if probe.mismatches:
        res.problems.append(f"CUDA graph replay on fresh inputs disagrees with an eager call on them "
                            f"({probe.mismatches} mismatches): the variant captured state from its capture inputs")
