"""Checks that catch variants which pass a naive comparison but cheat or break (KernelBench/gpu-mode style).

- uninitialised output: two runs whose fresh allocations hold different poisons (0x7F bytes: the CUDA
  caching allocator pre-poisoned, or torch.empty & co. filling on CPU; then NaN, torch's deterministic
  fill) must agree, so unwritten elements show up;
- inputs modified by the call: byte-exact snapshots of every input tensor;
- output aliasing an input: storage ranges compared;
- work on a side stream (GPU): the call is queued behind a ~2 ms spin on the current stream while an
  independent stream copies the output out; correctly ordered work cannot have written it yet;
- work in a background thread (the CPU analogue): an output that still changes after the call returned,
  and threads started by every call (not just the first: torch.compile starts its worker pool once);
- lazy outputs: the output must be a plain torch.Tensor.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

SPIN_CYCLES = 20_000_000  # ~10 ms at Hopper clocks: far longer than launching any variant
JOIN_S = 0.5  # how long run 1 waits for threads the call started before comparing its output again
POISON_COPIES = 4  # blocks per output size: multi-kernel variants allocate intermediates of the same size


def tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors of an output: a tensor, or a tuple/list of them."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for t in obj if isinstance(t, torch.Tensor)]
    return []


def lazy_output(out: Any) -> str | None:
    outs = out if isinstance(out, (tuple, list)) else [out]
    for i, t in enumerate(outs):
        if type(t) is not torch.Tensor:
            return f"output #{i} is a {type(t).__name__}, not a plain torch.Tensor (lazy or wrapped result)"
    return None


def snapshot(inputs: Sequence[Any]) -> dict[int, torch.Tensor]:
    return {i: t.detach().clone() for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)}


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN positions included (torch.equal alone treats NaN != NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point():
        return bool(torch.equal(a.isnan(), b.isnan())) and bool(torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))
    return bool(torch.equal(a, b))


def modified_inputs(inputs: Sequence[Any], snaps: dict[int, torch.Tensor]) -> list[str]:
    return [f"modified input #{i} {tuple(inputs[i].shape)}" for i, s in snaps.items() if not _same_bytes(inputs[i], s)]


def _span(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + st.nbytes()


def aliases(outs: Sequence[torch.Tensor], inputs: Sequence[Any]) -> list[str]:
    found = []
    for o, out in enumerate(outs):
        lo, hi = _span(out)
        for i, t in enumerate(inputs):
            if isinstance(t, torch.Tensor) and t.device == out.device and t.numel() and out.numel():
                a, b = _span(t)
                if lo < b and a < hi:
                    found.append(f"output #{o} shares memory with input #{i}")
    return found


@contextlib.contextmanager
def poisoned_allocator(device: torch.device, nbytes: Sequence[int], byte: int = 0x7F) -> Iterator[None]:
    """Make the call's fresh allocations hold `byte` (0x7F: a huge finite float, unlike the NaN of
    `nan_filled_empty`, so the two runs disagree wherever the output was not written).

    CUDA: the caching allocator is left holding only blocks of the output sizes filled with the poison, so the
    variant's allocations hold it *before* anything it queues runs, without changing how torch computes
    (unlike deterministic mode) and without any fill queued behind the call, which the side-stream probe must
    not depend on. CPU: malloc gives no such control (aligned allocations do not reuse freed chunks in order),
    so torch.empty, empty_like, empty_strided and Tensor.new_empty fill what they return for the duration;
    memory that C++ code allocates itself holds whatever malloc gives.
    """
    if device.type != "cuda":
        with _poisoned_cpu_empty(byte):
            yield
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    blocks = [torch.full((max(n, 1),), byte, dtype=torch.uint8, device=device)
              for n in nbytes for _ in range(POISON_COPIES)]
    torch.cuda.synchronize(device)
    del blocks
    yield


_EMPTY_FNS = ("empty", "empty_like", "empty_strided")


@contextlib.contextmanager
def _poisoned_cpu_empty(byte: int) -> Iterator[None]:
    saved, saved_new = {name: getattr(torch, name) for name in _EMPTY_FNS}, torch.Tensor.new_empty

    def poisoning(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.device.type == "cpu":
                out.untyped_storage().fill_(byte)
            return out
        return wrapper
    try:
        for name, fn in saved.items():
            setattr(torch, name, poisoning(fn))
        torch.Tensor.new_empty = poisoning(saved_new)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = saved_new


@contextlib.contextmanager
def nan_filled_empty() -> Iterator[None]:
    """torch.empty & co. return NaN-filled memory (ints: their max value), on CPU and CUDA alike."""
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
            torch.utils.deterministic.fill_uninitialized_memory = prev_fill


def new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def background_work(call: Callable[[], Any], device: torch.device) -> tuple[Any, list[str]]:
    """Call once; report an output that still changes after the call returned (work finishing on another
    thread or an unjoined stream). Threads the call started get up to JOIN_S to finish first."""
    before = set(threading.enumerate())
    out = call()
    early = [t.detach().clone() for t in tensors(out)]  # queued on the current stream, right after the call
    deadline = time.monotonic() + JOIN_S
    for t in new_threads(before):  # long-lived pools (torch.compile's workers) just run out the clock once
        t.join(max(0.0, deadline - time.monotonic()))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    else:
        time.sleep(0.01)
    if any(not _same_bytes(e, t) for e, t in zip(early, tensors(out))):
        return out, ["output changed after the call returned: work finishes outside the caller's stream/thread"]
    return out, []


def threads_started(call: Callable[[], Any]) -> tuple[Any, str | None]:
    """Call (not for the first time) and report threads it started that are still running: a variant that
    returns before its work is done. Libraries start their worker pools on a first call, not on every call."""
    before = set(threading.enumerate())
    out = call()
    left = new_threads(before)
    if left:
        return out, f"starts a background thread on every call ({left[0].name}) that outlives the call"
    return out, None


def side_stream(call: Callable[[], Any], device: torch.device,
                out_specs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> str | None:
    """GPU: does the call produce its output without waiting for work queued before it on the current stream?

    `out_specs` (shape, dtype) of the expected outputs lets the pinned probe buffers exist before the spin.
    Returns a problem, or None when the work is ordered (or the check is inconclusive: host-syncing call).
    """
    if device.type != "cuda":
        return None
    early = [torch.empty(shape, dtype=dtype, pin_memory=True) for shape, dtype in out_specs]
    probe = torch.cuda.Stream(device)
    spin_done = torch.cuda.Event()
    torch.cuda.synchronize(device)
    torch.cuda._sleep(SPIN_CYCLES)
    spin_done.record(torch.cuda.current_stream(device))
    out = call()
    outs = tensors(out)
    if spin_done.query() or [(tuple(t.shape), t.dtype) for t in outs] != [(tuple(s), d) for s, d in out_specs]:
        torch.cuda.synchronize(device)
        return None  # blocked on the GPU (host sync) or wrong outputs (reported elsewhere): nothing to detect
    with torch.cuda.stream(probe):  # runs now, concurrently with the spin, ordered after nothing
        for dst, t in zip(early, outs):
            dst.copy_(t, non_blocking=True)
    probe.synchronize()
    conclusive = not spin_done.query()
    torch.cuda.synchronize(device)
    if conclusive and all(_same_bytes(e, t.cpu()) for e, t in zip(early, outs)):
        return "output was complete before the caller's stream reached the call: work ran on a side stream"
    return None
