"""Variant registry: families and their variants, discovered by scanning plugin folders.

A family lives in `<kernels-dir>/<family>/`. Every `*.py` file there whose name does not start with `_`
is imported (as part of a package `dpk.families.<family>`, so relative imports work; `load(package=...)` picks
another parent package, so a second copy of the kernels can be imported beside the first); files register
with two decorators and no central list:

    dpk.family("conv1d", make_inputs=..., tolerance=..., work=...)  # on the reference function
    @dpk.variant("conv1d", "cudnn", needs=("cuda",), dtypes=("float32",), baseline=True)
    def cudnn(x, w, b): ...

Kernel-only modules (Triton `@jit` code, build helpers) start with `_` and are imported lazily by the
variants that use them, so a missing optional package makes only those variants unavailable.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import sys
import types
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .cases import Case, check_name
from .tolerance import DTYPES, Tolerance

if TYPE_CHECKING:  # stages imports the timing engine, which imports this module
    from .stages import Stage

PLUGIN_PACKAGE = "dpk.families"
KNOWN_NEEDS = ("cuda", "nvcc", "triton", "cpu", "sm90")


class Unavailable(Exception):
    """Raised by a variant (or its build step) when it cannot run here; the message is the reason."""


@dataclass(frozen=True)
class Work:
    """Ideal traffic and arithmetic of one call: each input read once, each output written once."""

    bytes: int
    flops: int = 0


@dataclass
class Family:
    name: str
    reference: Callable[..., Any]
    make_inputs: Callable[[Case, torch.device], tuple]
    tolerance: Callable[[Case, str], Tolerance]
    work: Callable[[Case], Work] | None = None
    description: str = ""
    source: str = ""
    params: tuple[str, ...] = ()  # case parameters a command line may set (`dpk bench --param K=V`)
    latency: bool = False  # every timed row also gets the wall latency of a call (`latency_us`)
    output_dtype: str | None = None  # the outputs' dtype whatever the case's (None: the case's dtype)


@dataclass
class Variant:
    family: str
    name: str
    fn: Callable[..., Any]
    needs: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("float32",)
    baseline: bool = False
    compute: str = "float32"
    tol: Tolerance | Callable[[Case], Tolerance] | None = None
    work: Callable[[Case], Work] | None = None
    graph: bool = True
    against: str | None = None
    info: Callable[..., dict] | None = None
    stages: Callable[..., list[Stage]] | None = None  # `(*inputs) -> [Stage]`: the parts of one call (stages.py)
    description: str = ""
    source: str = ""

    @property
    def key(self) -> str:
        return f"{self.family}.{self.name}"


@dataclass
class Registry:
    families: dict[str, Family] = field(default_factory=dict)
    variants: dict[str, dict[str, Variant]] = field(default_factory=dict)
    load_errors: dict[str, str] = field(default_factory=dict)  # module path -> error

    def add_family(self, fam: Family) -> None:
        if fam.name in self.families:
            raise ValueError(f"family {fam.name!r} declared twice: {self.families[fam.name].source} and {fam.source}")
        self.families[fam.name] = fam

    def add_variant(self, v: Variant) -> None:
        got = self.variants.setdefault(v.family, {})
        if v.name in got:
            raise ValueError(f"variant {v.key} declared twice: {got[v.name].source} and {v.source}")
        got[v.name] = v

    def family(self, name: str) -> Family:
        if name not in self.families:
            raise KeyError(f"unknown family {name!r}; known: {', '.join(sorted(self.families)) or 'none'}")
        return self.families[name]

    def variant(self, family: str, name: str) -> Variant:
        self.family(family)
        got = self.variants.get(family, {})
        if name not in got:
            raise KeyError(f"unknown variant {name!r} of {family}; known: {', '.join(got) or 'none'}")
        return got[name]

    def variants_of(self, family: str) -> list[Variant]:
        return list(self.variants.get(family, {}).values())

    def baseline(self, family: str) -> Variant | None:
        return next((v for v in self.variants_of(family) if v.baseline), None)

    def validate(self) -> None:
        for fam, vs in self.variants.items():
            if fam not in self.families:
                where = ", ".join(v.source for v in vs.values())
                raise ValueError(f"variants of unknown family {fam!r} ({where}); declare it with dpk.family")
            bases = [v.name for v in vs.values() if v.baseline]
            if len(bases) > 1:
                raise ValueError(f"family {fam!r} has several baselines {bases}; mark exactly one")
            for v in vs.values():
                if v.against is not None and (v.against not in vs or v.against == v.name):
                    raise ValueError(f"variant {v.key}: against={v.against!r} names no other variant of {fam!r}")


_active: list[Registry] = [Registry()]


def _caller_source(depth: int = 2) -> str:
    frame = inspect.stack()[depth]
    return f"{frame.filename}:{frame.lineno}"


def family(name: str, *, make_inputs: Callable, tolerance: Callable, work: Callable | None = None,
           description: str = "", params: Sequence[str] = (), latency: bool = False,
           output_dtype: str | None = None) -> Callable[[Callable], Callable]:
    """Decorate a family's reference (the float64 oracle) and declare the family around it. `params`: case
    parameters a command line may override for every selected case (e.g. a checkpoint path). `latency`: each
    timed row also gets the wall time from a call to its output on the host (for calls of milliseconds, e.g.
    a whole action chunk, where what a robot waits for matters beside device time). `output_dtype`: the dtype
    every variant returns whatever the case's dtype (e.g. float32 actions from a bf16 net), which parity holds
    them to; by default the case's dtype."""
    check_name("family", name)
    if output_dtype is not None and output_dtype not in DTYPES:
        raise ValueError(f"family {name}: unknown output_dtype {output_dtype!r}")

    def deco(ref: Callable) -> Callable:
        doc = description or (inspect.getdoc(ref) or "").split("\n")[0]
        _active[-1].add_family(Family(name, ref, make_inputs, tolerance, work, doc, _caller_source(),
                                      tuple(params), latency, output_dtype))
        return ref
    return deco


def variant(family: str, name: str, *, needs: Sequence[str] = (), dtypes: Sequence[str] = ("float32",),
            baseline: bool = False, compute: str = "float32", tol: Tolerance | Callable | None = None,
            work: Callable | None = None, graph: bool = True, against: str | None = None,
            info: Callable[..., dict] | None = None, stages: Callable[..., list[Stage]] | None = None,
            ) -> Callable[[Callable], Callable]:
    """Register `fn(*inputs) -> output` as a variant of `family`.

    needs: 'cuda' (a CUDA GPU), 'nvcc' (a CUDA compiler and a CUDA build of torch), 'triton', 'sm90',
    'cpu' (CPU runs only), or any importable module name (e.g. 'diffusers').
    compute: the arithmetic the variant uses ('tf32', 'float32', ...), fed to the family's tolerance.
    tol: a Tolerance or `case -> Tolerance` that overrides the family's derivation for this variant.
    work: `case -> Work` when the variant's ideal traffic differs from the family's.
    graph: False when the variant cannot be captured in a CUDA graph (host syncs, CPU-side state).
    against: another variant of the family whose output on the same inputs this one must also match within
        the family's tolerance for that variant's arithmetic (e.g. a CUDA graph or a compiled form of it).
    info: `(*inputs) -> {column: value}` merged into each timed row after the first call, e.g. `resident_mb`
        (device memory the variant holds: weights as laid out, workspaces, graph pools) and `prepare_s` (one-off
        work before the first call could run: packing, graph capture, torch.compile).
    stages: `(*inputs) -> [dpk.Stage(name, fn, count)]`, called after the first call: the parts of one call, each
        runnable alone as the call runs it, timed separately in each cold and hot row (`stages` column).
    """
    check_name("variant", name)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"variant {family}.{name}: unknown dtypes {bad}")

    def deco(fn: Callable) -> Callable:
        doc = (inspect.getdoc(fn) or "").split("\n")[0]
        _active[-1].add_variant(Variant(family, name, fn, tuple(needs), tuple(dtypes), baseline, compute,
                                        tol, work, graph, against, info, stages, doc, _caller_source()))
        return fn
    return deco


def _need_reason(need: str, device: torch.device) -> str | None:
    if need == "cuda":
        return None if device.type == "cuda" else f"needs a CUDA GPU (this run is on {device.type})"
    if need == "cpu":
        return None if device.type == "cpu" else f"runs on CPU only (this run is on {device.type})"
    if need == "sm90":
        if device.type != "cuda":
            return "needs a Hopper (sm_90) GPU"
        cc = torch.cuda.get_device_capability(device)
        return None if cc >= (9, 0) else f"needs sm_90, this GPU is sm_{cc[0]}{cc[1]}"
    if need == "nvcc":
        if torch.version.cuda is None:
            return "needs a CUDA build of torch to build extensions (this torch is a CPU build)"
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if not (shutil.which("nvcc") or (home and Path(home, "bin", "nvcc").exists())):
            return "nvcc not found (put it on PATH or set CUDA_HOME)"
        return None
    if need == "triton":
        if importlib.util.find_spec("triton") is None:
            return "python package 'triton' is not installed"
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return "triton on CPU needs TRITON_INTERPRET=1 before the kernels are imported"
        return None
    if importlib.util.find_spec(need) is None:
        return f"python package {need!r} is not installed"
    return None


def unavailable_reason(v: Variant, device: torch.device, dtype: str | None = None) -> str | None:
    """Why `v` cannot run on `device` (and `dtype`), or None when it can."""
    for need in v.needs:
        reason = _need_reason(need, device)
        if reason:
            return reason
    if dtype is not None and dtype not in v.dtypes:
        return f"dtype {dtype} not supported (supports {', '.join(v.dtypes)})"
    return None


def _load_module(name: str, path: Path, package_path: Path | None = None) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(package_path)] if package_path else None)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _ensure_parent_package(package: str) -> None:
    if package not in sys.modules:
        pkg = types.ModuleType(package)
        pkg.__path__ = []  # namespace for plugin families, filled by path
        sys.modules[package] = pkg


def load(kernel_dirs: Iterable[Path], strict: bool = False, package: str = PLUGIN_PACKAGE,
         families: Collection[str] | None = None) -> Registry:
    """Import every family folder under `kernel_dirs` (only those named in `families`, if given) into a fresh
    Registry, as modules of `package` (`dpk.families.<family>.<file>`): two registries loaded under different
    packages (`dpk ab`'s two sides) import side by side.

    A module that fails to import is recorded in `load_errors` (shown by `dpk list`) rather than raised,
    unless `strict` (tests use it to prove the shipped families import cleanly).
    """
    _ensure_parent_package(package)
    fam_dirs = []
    for kdir in map(Path, kernel_dirs):
        if not kdir.is_dir():
            raise FileNotFoundError(f"kernels dir {kdir} does not exist")
        fam_dirs += sorted(p for p in kdir.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    seen: dict[str, Path] = {}
    for fam_dir in fam_dirs:
        if fam_dir.name in seen:
            raise ValueError(f"family folder {fam_dir.name!r} is in two kernels dirs: {seen[fam_dir.name]} and "
                             f"{fam_dir}; rename one")
        seen[fam_dir.name] = fam_dir
    for fam_dir in fam_dirs:  # every package first: a family may import a sibling's `_` modules (policy: unet1d)
        _fresh_package(f"{package}.{fam_dir.name}", fam_dir)
    reg = Registry()
    _active.append(reg)
    try:
        for fam_dir in fam_dirs:
            if families is None or fam_dir.name in families:
                _load_family_dir(reg, fam_dir, strict, package)
    finally:
        _active.pop()
    reg.validate()
    return reg


def _fresh_package(pkg_name: str, fam_dir: Path) -> None:
    """Drop a previous load's modules of the package (a fresh load re-runs the decorators), then create it."""
    for mod in [m for m in sys.modules if m == pkg_name or m.startswith(pkg_name + ".")]:
        del sys.modules[mod]
    init = fam_dir / "__init__.py"
    if init.exists():
        _load_module(pkg_name, init, fam_dir)
    else:
        pkg = types.ModuleType(pkg_name)
        pkg.__path__ = [str(fam_dir)]
        sys.modules[pkg_name] = pkg


def _load_family_dir(reg: Registry, fam_dir: Path, strict: bool, package: str) -> None:
    pkg_name = f"{package}.{fam_dir.name}"
    for path in sorted(fam_dir.glob("*.py")):
        name = f"{pkg_name}.{path.stem}"
        if path.name.startswith("_") or name in sys.modules:  # already pulled in by a sibling's import
            continue
        try:
            _load_module(name, path)
        except Exception as e:  # keep going: one broken file must not hide the other families
            if strict:
                raise
            reg.load_errors[str(path)] = f"{type(e).__name__}: {e}"
