"""NVTX ranges `family > variant > case` (domain `dpk`) around every checked or timed call.

Nsight Compute selects a variant's kernels with `--nvtx --nvtx-include "dpk@<family>/<variant>/"`:
`@` names the domain, `/` separates nested push/pop ranges and the trailing `/` marks them as push/pop
ranges, which is why range names may not contain '/'. Without a profiler attached the `nvtx` package
hands out a dummy domain whose push/pop cost ~100 ns, and nothing here touches torch.cuda.nvtx (which
raises on CPU builds of torch).
"""
from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import Any

DOMAIN = "dpk"

try:
    import nvtx as _nvtx
except ImportError:  # ranges become no-ops; `dpk list` reports it
    _nvtx = None


def available() -> bool:
    return _nvtx is not None


def _check(name: str) -> str:
    if "/" in name or "@" in name:
        raise ValueError(f"NVTX range name {name!r} may not contain '/' or '@' (ncu filter syntax)")
    return name


class Ranges:
    """Nested push/pop ranges, pushed outermost first; reusable and cheap (attributes are pre-built)."""

    def __init__(self, *names: str):
        self.names = [_check(n) for n in names]
        if _nvtx is not None:
            self._domain = _nvtx.get_domain(DOMAIN)
            self._attrs = [self._domain.get_event_attributes(message=n) for n in self.names]
        else:
            self._domain = None

    def push(self) -> None:
        if self._domain is not None:
            for a in self._attrs:
                self._domain.push_range(a)

    def pop(self) -> None:
        if self._domain is not None:
            for _ in self._attrs:
                self._domain.pop_range()

    def __enter__(self) -> Ranges:
        self.push()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.pop()


def ranged(fn: Callable[[], Any], *names: str) -> Callable[[], Any]:
    """`fn` wrapped so that each call runs inside the nested ranges `names`."""
    r = Ranges(*names)

    def call() -> Any:
        r.push()
        try:
            return fn()
        finally:
            r.pop()
    return call


def ncu_filter(family: str, variant: str, case_id: str | None = None, inner: Sequence[str] = ()) -> str:
    """The `--nvtx-include` expression that selects exactly this variant's kernels (optionally one case, and
    inside it the ranges a variant opens itself, e.g. one layer of a U-Net: `down1.res0.conv1`)."""
    if inner and not case_id:
        raise ValueError("a range inside the variant needs a case")
    parts = [_check(family), _check(variant)] + ([_check(case_id)] if case_id else []) + [_check(r) for r in inner]
    return f"{DOMAIN}@" + "".join(p + "/" for p in parts)


def ncu_command(family: str, variant: str, case_id: str | None = None, suite: str | None = None,
                out: str | None = None, inner: Sequence[str] = ()) -> str:
    """A ready-to-run ncu command profiling only this variant: one call of one case (`dpk once`), or every
    call `dpk check` makes of it."""
    flt = ncu_filter(family, variant, case_id, inner)
    cmd = ["ncu", "--nvtx", "--nvtx-include", flt, "--clock-control", "none"]
    if out:
        cmd += ["-o", out]
    if case_id:
        cmd += ["python", "-m", "dpk", "once", family, variant, "--case", case_id]
    else:
        cmd += ["python", "-m", "dpk", "check", "--family", family, "--variant", variant]
    if suite:
        cmd += ["--suite", suite]
    return shlex.join(cmd)
