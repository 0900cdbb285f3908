"""eager, cuda_graph, compiled: the U-Net module as PyTorch runs it (fp32 and bf16 weights and activations).

eager uses PyTorch's default math settings, declared: cuDNN runs the convs in TF32 when
`torch.backends.cudnn.allow_tf32` is on (the default), so its tolerance is the TF32 one; cuda_graph and
compiled are also checked against eager on the same inputs, within the rounding of that shared arithmetic
(cuda_graph replays eager's kernels: it matches bit for bit; torch.compile picks its own kernels, so with TF32
on it differs from eager by TF32 rounding, ~4e-4 here, not by float32 rounding).
Both forms (reference.py): plain calls forward(sample, timestep, global_cond); step reads FiLM as
table[timestep] + obs (two small ops inside the captured or compiled region).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

import dpk
from dpk.timing_aids import graph_of

from ._checks import check_inputs
from ._net import DTYPES, Call, compile_reduce_overhead

TORCH_COMPUTE = "tf32" if torch.backends.cudnn.allow_tf32 else "float32"


def _info_of(kind: str) -> Callable[..., dict]:
    def info(*inputs: object) -> dict:
        """resident_mb: the weights plus what this variant prepared for this form (graph pools, measured as the
        allocator's growth); prepare_s: capture, or compile and record (the first call of torch.compile)."""
        call = inputs[-1]
        mine = [(k, s) for k, s in call.net.prepared.items() if k[0] == kind and k[1] == call.form]
        extra = sum(max(0, s.get("bytes", 0)) for _, s in mine)
        prep = sum(s.get("first_call_s", call.net.prepare_s.get(k, 0.0)) for k, s in mine)
        return {"resident_mb": (call.net.weight_bytes() + extra) / 1e6} | ({"prepare_s": prep} if mine else {})
    return info


@dpk.variant("unet1d", "eager", baseline=True, compute=TORCH_COMPUTE, dtypes=DTYPES, info=_info_of("eager"))
def eager(sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor, obs: torch.Tensor,
          call: Call) -> torch.Tensor:
    """The module in PyTorch eager (default TF32 settings: cuDNN convs in TF32)."""
    check_inputs(sample, timestep, global_cond, obs, call, "eager")
    with torch.no_grad():
        return call.torch_forward(call.net.module, sample, timestep, global_cond, obs)


def _capture(call: Call, sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor,
             obs: torch.Tensor) -> dict:
    before = torch.cuda.memory_allocated(sample.device)
    static = [t.clone() for t in (sample, timestep, global_cond, obs)]
    with torch.no_grad():  # two warm-up calls outside the capture: cuDNN picks its algorithms
        graph, out = graph_of(lambda: call.torch_forward(call.net.module, *static), sample.device)
    torch.cuda.synchronize(sample.device)
    return {"graph": graph, "static": static, "out": out,
            "bytes": torch.cuda.memory_allocated(sample.device) - before}


@dpk.variant("unet1d", "cuda_graph", needs=("cuda",), compute=TORCH_COMPUTE, dtypes=DTYPES, graph=False,
             against="eager", info=_info_of("cuda_graph"))
def cuda_graph(sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor, obs: torch.Tensor,
               call: Call) -> torch.Tensor:
    """One forward captured in a torch.cuda.CUDAGraph with static buffers: copy in, replay, copy out."""
    check_inputs(sample, timestep, global_cond, obs, call, "cuda_graph")
    key = ("cuda_graph", call.form, call.num_t, tuple(sample.shape), sample.dtype)
    st = call.net.prepare(key, lambda: _capture(call, sample, timestep, global_cond, obs))
    for dst, src in zip(st["static"], (sample, timestep, global_cond, obs)):
        dst.copy_(src)
    st["graph"].replay()
    return st["out"].clone()  # the static output holds the previous replay's values until this one lands


def _compiled(call: Call) -> dict:
    module, form, net, num_t = call.net.module, call.form, call.net, call.num_t

    def forward(sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor, obs: torch.Tensor
                ) -> torch.Tensor:
        with torch.no_grad():
            return Call(net, form, num_t).torch_forward(module, sample, timestep, global_cond, obs)
    return {"fn": compile_reduce_overhead(forward)}


@dpk.variant("unet1d", "compiled", needs=("cuda", "triton"), compute=TORCH_COMPUTE, dtypes=DTYPES, graph=False,
             against="eager", info=_info_of("compiled"))
def compiled(sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor, obs: torch.Tensor,
             call: Call) -> torch.Tensor:
    """torch.compile(mode="reduce-overhead"), as LeRobot's compile_model; the first call (first_call_s) compiles.
    The output is cloned out of the CUDA-graph pool that the next replay overwrites."""
    check_inputs(sample, timestep, global_cond, obs, call, "compiled")
    st = call.net.prepare(("compiled", call.form, call.num_t), lambda: _compiled(call))
    if "bytes" not in st:  # the first call compiles and records the graphs: its time and memory are the variant's
        before, t0 = torch.cuda.memory_allocated(sample.device), time.perf_counter()
        out = st["fn"](sample, timestep, global_cond, obs).clone()
        torch.cuda.synchronize(sample.device)
        st["first_call_s"] = time.perf_counter() - t0
        st["bytes"] = torch.cuda.memory_allocated(sample.device) - before - out.numel() * out.element_size()
        return out
    return st["fn"](sample, timestep, global_cond, obs).clone()
