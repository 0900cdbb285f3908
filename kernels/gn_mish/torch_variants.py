"""gn_mish PyTorch variants: eager (the baseline) and compiled (the same formula under torch.compile).

eager: F.mish(F.group_norm(x, G, gamma, beta, eps)), on CPU or GPU. On CUDA this is four kernels (row-wise
moments, fused scale/shift params, the affine, mish); for fp16/bf16 PyTorch keeps fp32 statistics but stores the
normalised z in the input dtype before mish.

compiled: the eager formula under torch.compile (Inductor fuses it into generated Triton kernels).
needs=("cuda",): on a CPU-only machine Inductor would build C++ kernels, 10-20 s per new shape, which would
make every CPU smoke run slow while saying nothing about the GPU code path that is benchmarked.
One compiled callable per (shape, dtype, G, eps, device), each around its own code object: Dynamo keys its
cache and its recompile limit (8) on the code object, so sharing one function across the 15 Push-T shapes
would silently fall back to eager after the 8th. The first call compiles (the harness records it as the
first-call time); later calls run the cached kernels and are graph-capturable.
"""
from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch.nn.functional as F

import dpk
from dpk.lru import LRU

from ._checks import check_inputs

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE = 32  # compiled functions kept (shape x dtype x device x backend), each with its Dynamo cache
_compiled: LRU[Callable[..., torch.Tensor]] = LRU(CACHE)


@dpk.variant("gn_mish", "eager", dtypes=("float32", "float16", "bfloat16"), baseline=True, compute="float32")
def eager(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """PyTorch eager: F.group_norm then F.mish (4 kernels on CUDA)."""
    check_inputs(x, gamma, beta, groups, eps, dtypes=DTYPES)
    return F.mish(F.group_norm(x, groups, gamma, beta, eps))


def _gn_mish(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    return F.mish(F.group_norm(x, groups, gamma, beta, eps))


def _fresh_function(name: str) -> Callable[..., torch.Tensor]:
    """`_gn_mish` around a new code object named `name`, so Dynamo gives it a cache of its own."""
    code = _gn_mish.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, _gn_mish.__globals__, name)


def compiled_gn_mish(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float,
                     backend: str = "inductor") -> torch.Tensor:
    """The torch.compile'd formula; the first call per shape compiles, or raises dpk.Unavailable saying why.

    `backend` other than Inductor is for tests (backend="eager" exercises the caching without a compiler).
    """
    B, C, L = check_inputs(x, gamma, beta, groups, eps, dtypes=DTYPES)
    key = (B, C, L, groups, float(eps), x.dtype, x.device, backend)
    fn = _compiled.use(key)
    if fn is not None:
        return fn(x, gamma, beta, groups, float(eps))
    name = f"gn_mish_b{B}_c{C}_l{L}_g{groups}_{str(x.dtype).removeprefix('torch.')}"
    fn = torch.compile(_fresh_function(name), backend=backend, fullgraph=True, dynamic=False)
    try:
        out = fn(x, gamma, beta, groups, float(eps))
    except Exception as e:  # Dynamo/Inductor failures: no C++/Triton toolchain, unsupported backend, ...
        raise dpk.Unavailable(f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from e
    _compiled.put(key, fn)  # kept only once its first call has compiled
    return out


@dpk.variant("gn_mish", "compiled", needs=("cuda",), dtypes=("float32", "float16", "bfloat16"), compute="float32")
def compiled(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """torch.compile of eager (Inductor-generated fused kernels), one compile per shape."""
    return compiled_gn_mish(x, gamma, beta, groups, eps)
