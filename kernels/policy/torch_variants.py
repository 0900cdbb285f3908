"""eager_diffusers, compiled, eager_loop, graph_loop: one action chunk as PyTorch and diffusers run it.

eager_diffusers (baseline) is upstream Diffusion Policy's `conditional_sample`: the eager U-Net, then
diffusers' `scheduler.step(..., generator=g)` per step, the initial trajectory from the same generator (as
diffusers' randn_tensor draws it), `t` the CPU 0-d tensor `for t in scheduler.timesteps` yields. compiled is
LeRobot's loop with `compile_model`: the U-Net under torch.compile(mode="reduce-overhead"), `t` made on the
device with torch.full per step, diffusers' step. Both run PyTorch's default math (cuDNN convs in TF32).

eager_loop is the loop graph_loop captures: the same U-Net with the timesteps and step indices in device
memory and denoise's torch_fused step on the pre-drawn noise (no host sync, no generator, no host scalar), so
it runs on CPU too. graph_loop captures every step of the chunk (and the encoder) in one CUDA graph: per call,
copy the inputs in, replay, clone the actions out; no host work per step. Every variant calls the U-Net
through `Chunk.unet`: a bf16 net (bfloat16 case) in bf16, the rest of the chunk in float32.
"""
from __future__ import annotations

import time
from typing import Any

import torch

import dpk
from dpk.nvtx import Ranges

from ..denoise._noise import generator
from ..denoise._steps import fused_step, scheduler_for
from ..unet1d._net import DTYPES, compile_reduce_overhead
from ._checks import check_inputs
from ._chunk import Chunk, capture, condition, copy_in, static_copies
from ._stages import Probe, probe, stages

TORCH_COMPUTE = "tf32" if torch.backends.cudnn.allow_tf32 else "float32"
ENCODER, UNET, STEP = Ranges("encoder"), Ranges("unet"), Ranges("step")  # the stages, for nsys / ncu filters


def _cond(chunk: Chunk, global_cond: torch.Tensor | None, image: torch.Tensor | None,
          agent_pos: torch.Tensor | None) -> torch.Tensor | None:
    with ENCODER:
        return condition(chunk, global_cond, image, agent_pos)


def diffusers_loop(chunk: Chunk, cond: torch.Tensor | None, noise: torch.Tensor, forward: Any) -> torch.Tensor:
    """Upstream's sampling loop with diffusers' scheduler and generator; `forward(x, t, cond)` runs the U-Net."""
    from diffusers.utils.torch_utils import randn_tensor

    s, sch = chunk.schedule, scheduler_for(chunk.schedule)
    gen = generator(chunk.noise, noise.device)
    x = randn_tensor(tuple(noise.shape[1:]), generator=gen, device=noise.device, dtype=noise.dtype)
    kw = {"eta": s.eta} if s.scheduler == "ddim" else {}
    for t in sch.timesteps:
        with UNET:
            eps = forward(x, t, cond)
        with STEP:
            x = sch.step(eps, t, x, generator=gen, **kw).prev_sample
    return x


def diffusers_stages(p: Probe, forward: Any) -> list[dpk.Stage]:
    """The U-Net through `forward(x, t, cond)` at diffusers' host timestep, and diffusers' step with its
    generator, both eager."""
    s, sch = p.chunk.schedule, scheduler_for(p.chunk.schedule)
    gen, t = generator(p.chunk.noise, p.device), sch.timesteps[p.k]
    kw = {"eta": s.eta} if s.scheduler == "ddim" else {}
    return stages(p, lambda: forward(p.x, t, p.cond),
                  lambda: sch.step(p.eps, t, p.x, generator=gen, **kw).prev_sample, graphed=False)


def _eager_diffusers_stages(*inputs: Any) -> list[dpk.Stage]:
    p = probe(*inputs)
    return diffusers_stages(p, p.chunk.unet)


@dpk.variant("policy", "eager_diffusers", needs=("diffusers",), dtypes=DTYPES, baseline=True, compute=TORCH_COMPUTE,
             graph=False, stages=_eager_diffusers_stages)
def eager_diffusers(global_cond: torch.Tensor | None, image: torch.Tensor | None, agent_pos: torch.Tensor | None,
                    noise: torch.Tensor, chunk: Chunk) -> torch.Tensor:
    """Upstream Diffusion Policy: eager U-Net + diffusers' scheduler.step with a seeded generator."""
    check_inputs(global_cond, image, agent_pos, noise, chunk, "eager_diffusers")
    with torch.no_grad():
        return diffusers_loop(chunk, _cond(chunk, global_cond, image, agent_pos), noise, chunk.unet)


def _compiled(chunk: Chunk) -> dict:
    return {"fn": compile_reduce_overhead(chunk.unet)}


def _compiled_key(noise: torch.Tensor) -> tuple:
    """One compiled function per net, shape and device, whatever the schedule: it does not reach the U-Net."""
    return ("policy", "compiled", tuple(noise.shape[1:]), str(noise.device))


def _compiled_forward(chunk: Chunk, noise: torch.Tensor) -> Any:
    """`(x, t, cond) -> eps` as LeRobot calls the compiled U-Net: t made on the device per step. Its first call
    compiles and records the graphs: its time is kept (`compile_s`, the rows' prepare_s)."""
    B, dev = noise.shape[1], noise.device
    st = chunk.net.prepare(_compiled_key(noise), lambda: _compiled(chunk))

    def forward(x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        t_dev = torch.full((B,), int(t), dtype=torch.long, device=dev)
        if "compile_s" in st:
            return st["fn"](x, t_dev, cond)
        t0 = time.perf_counter()
        eps = st["fn"](x, t_dev, cond)
        torch.cuda.synchronize(dev)
        st["compile_s"] = time.perf_counter() - t0
        return eps
    return forward


def _compiled_info(*inputs: Any) -> dict:
    """resident_mb: the weights (the compiled graphs' pool is torch's); prepare_s: the first compiled call."""
    noise, chunk = inputs[-2], inputs[-1]
    st = chunk.net.prepared.get(_compiled_key(noise), {})
    return {"resident_mb": chunk.net.weight_bytes() / 1e6} | (
        {"prepare_s": st["compile_s"]} if "compile_s" in st else {})


def _compiled_stages(*inputs: Any) -> list[dpk.Stage]:
    p = probe(*inputs)
    return diffusers_stages(p, _compiled_forward(p.chunk, inputs[3]))


@dpk.variant("policy", "compiled", needs=("cuda", "triton", "diffusers"), dtypes=DTYPES, compute=TORCH_COMPUTE,
             graph=False, against="eager_diffusers", stages=_compiled_stages, info=_compiled_info)
def compiled(global_cond: torch.Tensor | None, image: torch.Tensor | None, agent_pos: torch.Tensor | None,
             noise: torch.Tensor, chunk: Chunk) -> torch.Tensor:
    """LeRobot's loop with compile_model: torch.compile(reduce-overhead) U-Net, diffusers' step; the first U-Net
    call compiles (the rows' prepare_s)."""
    check_inputs(global_cond, image, agent_pos, noise, chunk, "compiled")
    forward = _compiled_forward(chunk, noise)
    with torch.no_grad():
        return diffusers_loop(chunk, _cond(chunk, global_cond, image, agent_pos), noise, forward)


def fused_loop(chunk: Chunk, cond: torch.Tensor | None, noise: torch.Tensor) -> torch.Tensor:
    """S steps with the timesteps and step indices read on the device and denoise's torch_fused step."""
    sched, dev = chunk.schedule, noise.device
    ts, idx = chunk.timesteps(dev), chunk.step_indices(dev)
    x = noise[0]
    for k in range(chunk.steps):
        with UNET:
            eps = chunk.unet(x, ts[k], cond)
        with STEP:
            x = fused_step(eps, x, noise[k + 1], idx[k], sched)
    return x


def fused_stages(*inputs: Any, graphed: bool) -> list[dpk.Stage]:
    """fused_loop's parts at the middle step: the U-Net at the device timestep, torch_fused's step."""
    p = probe(*inputs)
    chunk, noise = p.chunk, inputs[3]
    ts, idx = chunk.timesteps(p.device), chunk.step_indices(p.device)
    return stages(p, lambda: chunk.unet(p.x, ts[p.k], p.cond),
                  lambda: fused_step(p.eps, p.x, noise[p.k + 1], idx[p.k], chunk.schedule), graphed=graphed)


@dpk.variant("policy", "eager_loop", dtypes=DTYPES, compute=TORCH_COMPUTE, against="eager_diffusers",
             stages=lambda *inputs: fused_stages(*inputs, graphed=False))
def eager_loop(global_cond: torch.Tensor | None, image: torch.Tensor | None, agent_pos: torch.Tensor | None,
               noise: torch.Tensor, chunk: Chunk) -> torch.Tensor:
    """The loop graph_loop captures, run eagerly: device timesteps, torch_fused step, pre-drawn noise."""
    check_inputs(global_cond, image, agent_pos, noise, chunk, "eager_loop")
    with torch.no_grad():
        return fused_loop(chunk, _cond(chunk, global_cond, image, agent_pos), noise)


def _capture_loop(chunk: Chunk, *inputs: torch.Tensor | None) -> dict:
    static = static_copies(*inputs)

    def body() -> torch.Tensor:
        cond = condition(chunk, static.get("global_cond"), static.get("image"), static.get("agent_pos"))
        return fused_loop(chunk, cond, static["noise"])
    before = torch.cuda.memory_allocated(chunk.net.device)
    graph, out = capture(body, chunk.net.device)
    return {"graph": graph, "static": static, "out": out,
            "bytes": torch.cuda.memory_allocated(chunk.net.device) - before}


def graph_state(variant: str, inputs: tuple, make: Any) -> dict:
    """A graph variant's call up to its replay: the inputs checked, its state (graphs, buffers) prepared once by
    `make(chunk, *inputs)`, this call's inputs copied into the captured buffers."""
    chunk = inputs[-1]
    check_inputs(*inputs, variant)
    st = chunk.prepare(variant, inputs[3], lambda: make(chunk, *inputs[:4]))
    copy_in(st["static"], *inputs[:4])
    return st


@dpk.variant("policy", "graph_loop", needs=("cuda",), dtypes=DTYPES, compute=TORCH_COMPUTE, graph=False,
             against="eager_diffusers", stages=lambda *inputs: fused_stages(*inputs, graphed=True))
def graph_loop(global_cond: torch.Tensor | None, image: torch.Tensor | None, agent_pos: torch.Tensor | None,
               noise: torch.Tensor, chunk: Chunk) -> torch.Tensor:
    """Every step of the chunk (and the encoder) in one CUDA graph: copy in, replay, clone the actions out."""
    st = graph_state("graph_loop", (global_cond, image, agent_pos, noise, chunk), _capture_loop)
    st["graph"].replay()
    return st["out"].clone()
