"""graph_per_step, kernels_loop: action chunks with the project's CUDA kernels.

graph_per_step is the design of Desai's blog, Part V: one CUDA graph of one denoising step (the PyTorch U-Net
forward + denoise's one-launch step kernel, in place), replayed S times; the step index lives in device memory
and the graph advances it, so the host only replays. A prologue graph computes the conditioning (and runs the
encoder) and resets the trajectory and the index.

kernels_loop runs the whole chunk in one CUDA graph: the encoder (with the encoder stage on) under torch.compile
(each normalisation fused with its ReLU and residual add), the FiLM's observation part once per chunk (unet1d's step
form: W_g mish(g) + b), then per step the timestep copied into the forward's (B,) buffer, the unet1d family's layer
kernels (~30 launches with programmatic dependent launch, weights packed once), and the denoise kernel writing the
next trajectory in place. No host work per step, no FiLM or step-encoder weights streamed per step. With a bf16
net (a bfloat16 case) the layer kernels read bf16 weights and keep fp32 activations (unet1d's bf16 form), the FiLM's
observation part is made from the FiLM weights widened to float32 once, and the trajectory stays float32: the
weights are the chunk's only bf16 numbers.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import dpk

from ..denoise._extension import step_cuda
from ..unet1d._film import film_weight, observe
from ..unet1d._launch import compiled_program
from ..unet1d._net import DTYPES, Call
from ._chunk import Chunk, capture, condition, info_of, static_copies
from ._stages import Part, Probe, probe, stages
from .torch_variants import TORCH_COMPUTE, graph_state

KERNEL_NEEDS = ("cuda", "nvcc", "sm90")
StepFn = Callable[..., torch.Tensor]  # (eps, x, z, step, schedule, out=) -> x of the next step, as step_cuda


def _capture_per_step(chunk: Chunk, *inputs: torch.Tensor | None) -> dict:
    dev, sched = chunk.net.device, chunk.schedule
    before = torch.cuda.memory_allocated(dev)
    static = static_copies(*inputs)
    noise = static["noise"]
    x, k, ts = noise[0].clone(), torch.zeros((), dtype=torch.int64, device=dev), chunk.timesteps(dev)

    def prologue() -> torch.Tensor | None:
        x.copy_(noise[0])
        k.zero_()
        return condition(chunk, static.get("global_cond"), static.get("image"), static.get("agent_pos"))
    start, cond = capture(prologue, dev)

    def one_step() -> None:
        # (1,) timestep, expanded to the batch; the U-Net's output is a transposed view: the kernel reads rows
        eps = chunk.unet(x, ts.index_select(0, k.view(1)), cond).contiguous()
        step_cuda(eps, x, noise.index_select(0, (k + 1).view(1))[0], k, sched, out=x)
        k.add_(1)
    step, _ = capture(one_step, dev)
    # the graphs hold raw addresses: every tensor they read or write must live as long as they do
    return {"start": start, "step": step, "static": static, "x": x, "keep": (k, ts, cond),
            "bytes": torch.cuda.memory_allocated(dev) - before}


def kernel_step(p: Probe) -> Part:
    """denoise's kernel for the middle step, into a buffer of its own (the call writes x in place)."""
    z, k, out = p.inputs[3][p.k + 1], p.chunk.step_indices(p.device)[p.k], torch.empty_like(p.x)
    return lambda: step_cuda(p.eps, p.x, z, k, p.chunk.schedule, out=out)


def _per_step_stages(*inputs: Any) -> list[dpk.Stage]:
    p = probe(*inputs)
    k = torch.tensor([p.k], device=p.device)
    ts = p.chunk.timesteps(p.device)
    return stages(p, lambda: p.chunk.unet(p.x, ts.index_select(0, k), p.cond).contiguous(), kernel_step(p),
                  graphed=True)


@dpk.variant("policy", "graph_per_step", needs=("cuda", "nvcc"), compute=TORCH_COMPUTE, dtypes=DTYPES,
             graph=False, against="eager_diffusers", info=info_of("graph_per_step"), stages=_per_step_stages)
def graph_per_step(global_cond: torch.Tensor | None, image: torch.Tensor | None, agent_pos: torch.Tensor | None,
                   noise: torch.Tensor, chunk: Chunk) -> torch.Tensor:
    """One CUDA graph per step (forward + denoise kernel, step index in device memory), replayed S times."""
    st = graph_state("graph_per_step", (global_cond, image, agent_pos, noise, chunk), _capture_per_step)
    st["start"].replay()
    for _ in range(chunk.steps):
        st["step"].replay()
    return st["x"].clone()


def film32(chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
    """The stacked FiLM weights in float32 (a bf16 net's widened exactly), made once per net."""
    return chunk.net.prepare(("policy.film32",), lambda: tuple(t.float() for t in film_weight(chunk.net.module)))


def observe32(chunk: Chunk, cond: torch.Tensor | None, batch: int) -> torch.Tensor:
    """(B, F) float32: FiLM's observation part W_g mish(g) + b from film32's weights."""
    return observe(chunk.net.module, cond, batch, film32(chunk))


def step_form_loop(chunk: Chunk, cond: torch.Tensor | None, noise: torch.Tensor, io: dict[str, torch.Tensor],
                   forward: Callable[[], torch.Tensor], step: StepFn) -> torch.Tensor:
    """kernels_loop's chunk on the buffers of `io` (sample, t, obs): FiLM's observation part once, then per step
    the timestep into io["t"], `forward()` (the forward of io's buffers) and `step` writing io["sample"]."""
    dev = noise.device
    x, t, B = io["sample"], io["t"], noise.shape[1]
    ts, idx = chunk.timesteps(dev), chunk.step_indices(dev)
    io["obs"].copy_(observe32(chunk, cond, B))
    x.copy_(noise[0])
    for k in range(chunk.steps):
        t.copy_(ts[k].expand(B))
        step(forward(), x, noise[k + 1], idx[k], chunk.schedule, out=x)
    return x


def _capture_kernels(chunk: Chunk, *inputs: torch.Tensor | None) -> dict:
    dev = chunk.net.device
    before = torch.cuda.memory_allocated(dev)
    static = static_copies(*inputs)
    noise = static["noise"]
    B, T = noise.shape[1], noise.shape[2]
    program = compiled_program(Call(chunk.net, "step", chunk.schedule.num_train_timesteps), B, T)
    io = {"sample": noise[0].clone(), "t": torch.zeros(B, dtype=torch.int64, device=dev),
          "obs": observe32(chunk, None, B).contiguous()}

    def body() -> torch.Tensor:
        cond = condition(chunk, static.get("global_cond"), static.get("image"), static.get("agent_pos"),
                         compiled=True)
        return step_form_loop(chunk, cond, noise, io, lambda: program.launch(io, ranges=False), step_cuda)
    graph, out = capture(body, dev)
    return {"graph": graph, "static": static, "out": out, "io": io, "program": program,
            "bytes": torch.cuda.memory_allocated(dev) - before}


def _kernels_stages(*inputs: Any) -> list[dpk.Stage]:
    """encoder: the (compiled) encoder and FiLM's observation part; unet: the timestep copy and the layer kernels.
    They run on the buffers of the chunk's graph, which rewrites all of them at the start of every call."""
    p = probe(*inputs)
    st = graph_state("kernels_loop", inputs, _capture_kernels)
    io, program, B = st["io"], st["program"], p.x.shape[0]
    t_k = p.chunk.timesteps(p.device)[p.k]

    def unet() -> torch.Tensor:
        io["t"].copy_(t_k.expand(B))
        return program.launch(io, ranges=False)
    return stages(p, unet, kernel_step(p), graphed=True,
                  encoder=lambda: io["obs"].copy_(observe32(p.chunk, p.encode(compiled=True), B)))


@dpk.variant("policy", "kernels_loop", needs=KERNEL_NEEDS, compute="float32", dtypes=DTYPES, graph=False,
             against="eager_diffusers", info=info_of("kernels_loop"), stages=_kernels_stages)
def kernels_loop(global_cond: torch.Tensor | None, image: torch.Tensor | None, agent_pos: torch.Tensor | None,
                 noise: torch.Tensor, chunk: Chunk) -> torch.Tensor:
    """The whole chunk in one CUDA graph: unet1d's layer kernels in the step form + the denoise kernel."""
    st = graph_state("kernels_loop", (global_cond, image, agent_pos, noise, chunk), _capture_kernels)
    st["graph"].replay()
    return st["out"].clone()
