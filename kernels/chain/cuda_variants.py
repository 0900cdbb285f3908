"""chain CUDA variants: stream, pdl, grid_barrier, grid_counter (chain.cu's four orders of the same op body).

Each replays one CUDA graph of the whole chain, captured once per (input address, n, ops, ctas) as unet1d's
kernels_graph is: stream and pdl hold `ops` kernel nodes (pdl's with programmatic dependent launch edges),
grid_barrier and grid_counter one cooperative kernel node. Each returns an output buffer it owns (overwritten by
the next call with the same input). The persistent two need all their CTAs resident at once: more than the
device holds is unavailable.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

import dpk
import dpk.build
from dpk.lru import LRU
from dpk.timing_aids import graph_of

from ._checks import ChainSpec, check_chain_inputs

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "chain.cu",)
ORDERS = {  # variant: (chain.cu dpk_chain_launch's mode, what it is)
    "stream": (0, "`ops` plain launches in one graph: each op starts when its predecessor has finished."),
    "pdl": (1, "`ops` launches with programmatic dependent launch in one graph (unet1d's ordering of its layers)."),
    "grid_barrier": (2, "One persistent cooperative kernel, the ops separated by grid-wide barriers (a megakernel's)."),
    "grid_counter": (3, "grid_barrier with a leaner barrier: one release add per CTA to a growing counter, polled."),
}
MAX_FLOATS = 12288  # chain.cu kMaxFloats
NEEDS = ("cuda", "nvcc", "sm90")
CACHE = 8  # graphs kept (input address sets x shapes x modes)

P, I32 = ctypes.c_void_p, ctypes.c_int
_lib: ctypes.CDLL | None = None
_graphs: LRU[tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = LRU(CACHE)


def library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = dpk.build.nvcc_library("dpk_chain", SOURCES)
        lib.dpk_chain_launch.argtypes = [P, P, P, P, I32, I32, I32, I32, P, P]
        lib.dpk_chain_max_coresident.argtypes = [I32, ctypes.POINTER(I32)]
        lib.dpk_chain_error_string.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def _fail(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"chain: {what} failed: {lib.dpk_chain_error_string(code).decode()}")


def _launcher(x: torch.Tensor, spec: ChainSpec, mode: str
              ) -> tuple[Callable[[], torch.Tensor], dict[str, torch.Tensor]]:
    lib, n = library(), x.numel()
    if n % 4 or n > MAX_FLOATS:
        raise dpk.Unavailable(f"chain.cu takes n a multiple of 4 up to {MAX_FLOATS} (float4 loads, 48 KB of "
                              f"shared memory), got {n}")
    if mode.startswith("grid_"):
        most = I32()
        _fail(lib, lib.dpk_chain_max_coresident(n, ctypes.byref(most)), "occupancy query")
        if spec.ctas > most.value:
            raise dpk.Unavailable(f"{mode} needs all {spec.ctas} CTAs resident; the device holds {most.value}")
    bufs = {name: torch.empty(n, device=x.device) for name in ("ws0", "ws1", "out")}
    bufs["bar"] = torch.zeros(3, dtype=torch.int32, device=x.device)

    def launch() -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        code = lib.dpk_chain_launch(x.data_ptr(), bufs["ws0"].data_ptr(), bufs["ws1"].data_ptr(),
                                    bufs["out"].data_ptr(), n, spec.ops, spec.ctas, ORDERS[mode][0],
                                    bufs["bar"].data_ptr(), stream)
        _fail(lib, code, f"{mode} launch")
        return bufs["out"]
    return launch, bufs


def _capture(x: torch.Tensor, spec: ChainSpec, mode: str) -> tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]:
    launch, bufs = _launcher(x, spec, mode)
    try:
        graph, _ = graph_of(launch, x.device, warmup=1)
    except RuntimeError as e:
        raise dpk.Unavailable(f"chain.{mode}: capture failed: {e}") from e
    return graph, bufs


def replay(x: torch.Tensor, spec: ChainSpec, mode: str) -> torch.Tensor:
    """The chain as one CUDA graph, captured on first use of this input address and shape."""
    check_chain_inputs(x, spec, variant=mode, device_type="cuda")
    graph, bufs = _graphs.get_or_make((x.device, x.data_ptr(), x.numel(), spec, mode), lambda: _capture(x, spec, mode))
    graph.replay()
    return bufs["out"]


def _register(name: str, doc: str) -> None:
    def order(x: torch.Tensor, spec: ChainSpec) -> torch.Tensor:
        return replay(x, spec, name)
    order.__name__ = order.__qualname__ = name
    order.__doc__ = doc
    dpk.variant("chain", name, needs=NEEDS, graph=False)(order)


for _name, (_, _doc) in ORDERS.items():
    _register(_name, _doc)
