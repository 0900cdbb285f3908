"""What one call is made of, and what a caller waits for: the `stages` and `latency_us` columns of a row.

A variant that runs several parts per call (an encoder, then 100 x U-Net forward + scheduler step) declares them with
`@dpk.variant(..., stages=hook)`, `hook(*inputs) -> [dpk.Stage(name, fn, count), ...]`: each part runnable alone
exactly as the call runs it (e.g. one U-Net forward graph replay) and how many times one call runs it. Each cold or hot
row then times every stage alone in the row's mode and stores `stages` = {name: median x count}, microseconds of one
call. These are separate measurements: a part timed alone does not overlap with its neighbours as it does inside the
call (nor pay the same launch gaps), so the stages need not add up to the row's median.

A family declared with `latency=True` also gets the action latency a robot sees: host wall time from the call to its
output on the host (`Timer.latency`), measured once per variant and case and put into each of its rows.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .cases import check_name
from .nvtx import ranged
from .timing import Measurement, Timer

US = 1e6
STAGED = ("cold", "hot")  # a graph row replays K whole calls: its stages would need graphs of their own


@dataclass(frozen=True)
class Stage:
    """One part of a variant's call, runnable alone as the call runs it, and how many times one call runs it."""

    name: str
    fn: Callable[[], Any]
    count: int = 1

    def __post_init__(self) -> None:
        check_name("stage", self.name)  # it becomes an NVTX range inside the row's
        if not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"stage {self.name!r}: count must be a positive int, got {self.count!r}")


def stages_of(hook: Callable[..., Sequence[Stage]] | None, inputs: tuple) -> tuple[list[Stage], str]:
    """(the variant's stages on `inputs`, ''), or ([], why not): a hook that fails leaves its rows ok."""
    if hook is None:
        return [], ""
    try:
        got = list(hook(*inputs))
        names = [s.name if isinstance(s, Stage) else repr(s) for s in got]
        if not all(isinstance(s, Stage) for s in got) or len(set(names)) != len(names):
            raise ValueError(f"the hook must return dpk.Stages with distinct names, got {names}")
    except Exception as e:
        return [], f"stages: {type(e).__name__}: {e}"
    return got, ""


def per_call_us(meas: Measurement, stage: Stage) -> float:
    """Microseconds one call spends in `stage`: its median times how often the call runs it."""
    return meas.stats.median * stage.count * US


def with_stages(row: dict[str, Any], timer: Timer, stages: Sequence[Stage], note: str,
                ranges: Sequence[str]) -> dict[str, Any]:
    """`row` with its `stages`: each stage timed in the row's mode inside the row's NVTX `ranges` plus its own
    name, on the row's budget split evenly. A stage that raises gets NaN and its error appended to the reason."""
    if row["mode"] not in STAGED or not (stages or note):
        return row
    each = copy.copy(timer)
    each.cfg = replace(timer.cfg, budget_s=timer.cfg.budget_s / max(len(stages), 1))
    times: dict[str, float] = {}
    notes = [n for n in (row.get("reason"), note) if n]
    for st in stages:
        try:
            times[st.name] = per_call_us(each.measure(ranged(st.fn, *ranges, st.name), row["mode"]), st)
        except Exception as e:  # one broken stage must not cost the row or the other stages
            times[st.name] = math.nan
            notes.append(f"stage {st.name}: {type(e).__name__}: {e}")
    return row | ({"stages": times} if stages else {}) | {"reason": "; ".join(notes)}


def latency_fields(timer: Timer, fn: Callable[[], Any]) -> dict[str, float]:
    """`latency_us` (median) and `latency_p90_us` of `fn`: wall time to its output on the host (`Timer.latency`)."""
    m = timer.latency(fn)
    return {"latency_us": m.stats.median * US, "latency_p90_us": m.stats.p90 * US}
