"""Toy variants: one correct baseline, one correct alternative, and deliberately broken ones.

Every broken variant must be flagged by the parity engine (tests/test_parity.py).
"""
from __future__ import annotations

import threading
import time

import torch

import dpk


@dpk.variant("toy", "torch", dtypes=("float32", "bfloat16"), baseline=True)
def torch_mv(a, v, c):
    """torch.mv + bias (the baseline)."""
    return torch.mv(a, v) + c


@dpk.variant("toy", "rowsum", dtypes=("float32",))
def rowsum(a, v, c):
    """Elementwise product then row sums: correct, different summation order."""
    return (a * v).sum(dim=1) + c


@dpk.variant("toy", "wrong")
def wrong(a, v, c):
    """Off by a constant: plain numeric mismatch."""
    return torch.mv(a, v) + c + 1e-2


@dpk.variant("toy", "one_nan")
def one_nan(a, v, c):
    """A single NaN where the reference is finite."""
    y = torch.mv(a, v) + c
    y[0] = float("nan")
    return y


@dpk.variant("toy", "uninit")
def uninit(a, v, c):
    """Writes only the first half of its output and leaves the rest as torch.empty gave it."""
    y = torch.empty_like(c)
    half = c.numel() // 2
    y[:half] = torch.mv(a[:half], v) + c[:half]
    return y


@dpk.variant("toy", "reuse_freed")
def reuse_freed(a, v, c):
    """KernelBench's hack: compute, free, return torch.empty that may land on the freed result."""
    y = torch.mv(a, v) + c
    ptr_size = y.shape
    del y
    return torch.empty(ptr_size, dtype=c.dtype, device=c.device)


@dpk.variant("toy", "mutates")
def mutates(a, v, c):
    """Correct output, but scribbles on an input."""
    y = torch.mv(a, v) + c
    v.mul_(2.0)
    return y


@dpk.variant("toy", "aliases")
def aliases(a, v, c):
    """Computes in place into the bias input and returns it."""
    return c.add_(torch.mv(a, v))


@dpk.variant("toy", "downcast")
def downcast(a, v, c):
    """Returns float16: a precision downgrade disguised as a result."""
    return (torch.mv(a, v) + c).half()


@dpk.variant("toy", "bad_shape")
def bad_shape(a, v, c):
    """Returns a column vector instead of a vector."""
    return (torch.mv(a, v) + c)[:, None]


@dpk.variant("toy", "thread")
def thread(a, v, c):
    """Returns at once and fills the output from a background thread (CPU analogue of a side stream)."""
    y = torch.zeros_like(c)

    def work() -> None:  # 0.2 s: the thread must still be alive when run 1b looks, even on a loaded CI box
        time.sleep(0.2)
        y.copy_(torch.mv(a, v) + c)
    threading.Thread(target=work, name="toy-background", daemon=True).start()
    return y


@dpk.variant("toy", "lazy")
def lazy(a, v, c):
    """Returns a tensor subclass instead of a plain tensor."""
    class Deferred(torch.Tensor):
        pass
    return (torch.mv(a, v) + c).as_subclass(Deferred)


@dpk.variant("toy", "side_stream", needs=("cuda",))
def side_stream(a, v, c):
    """Launches its work on a side stream and returns without joining it (cheats event timing)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = torch.mv(a, v) + c
    return y


_owned: dict[tuple[int, ...], torch.Tensor] = {}


@dpk.variant("toy", "owned_buffer", needs=("cuda",))
def owned_buffer(a, v, c):
    """Correct: writes into an output buffer it owns, one per shape, overwritten by the next call (as a graph
    replayed into its static output does), all on the caller's stream. An earlier call on the same values leaves
    the right answer there before this call runs: the side-stream probe must not take that for side-stream work."""
    if tuple(a.shape) not in _owned:
        _owned[tuple(a.shape)] = torch.empty(a.shape[0], device=a.device, dtype=a.dtype)
    out = _owned[tuple(a.shape)]
    torch.mv(a, v, out=out)
    return out.add_(c)


@dpk.variant("toy", "raises")
def raises(a, v, c):
    """Raises a ValueError: reported as an error row, never a crash."""
    raise ValueError("toy: refusing to compute")


@dpk.variant("toy", "unavailable")
def unavailable(a, v, c):
    """Raises dpk.Unavailable at call time (like a failed extension build)."""
    raise dpk.Unavailable("toy extension failed to build: no compiler")


@dpk.variant("toy", "needs_pkg", needs=("no_such_package_dpk",))
def needs_pkg(a, v, c):
    """Needs a package that is not installed."""
    return torch.mv(a, v) + c


_memo: dict[tuple[int, ...], torch.Tensor] = {}


@dpk.variant("toy", "stale_cache", needs=("cuda",))
def stale_cache(a, v, c):
    """Caches results by input pointers: right in eager use, stale inside a CUDA graph replayed on new data."""
    key = (a.data_ptr(), v.data_ptr(), c.data_ptr())
    if key not in _memo:
        _memo[key] = torch.mv(a, v) + c
    return _memo[key].clone()
