"""kernels, kernels_graph: one forward as ~30 launches of unet1d.cu's layer kernel (fp32 activations; a bf16 net's
weights stay bf16 where the SIMT form reads them, its input and output are widened and narrowed in the graph).

The program (_program.py) fuses each Conv1dBlock's GroupNorm, Mish, FiLM and residual add into the next
conv's prologue, holds a block's 1x1 residual conv in its first conv's launch and both phases of the
transposed conv in one launch; weights are packed once per (net, batch, horizon, form) at first use, and
each launch requests its weights before waiting on its predecessor (programmatic dependent launch).
kernels issues the launches from Python, each in an NVTX range named for its layer (`dpk ncu --range`);
kernels_graph replays the whole forward as one CUDA graph, captured per set of input addresses, so a
denoising loop that reuses its buffers pays no host work per step. Both return an output buffer they own
(overwritten by the next call with the same inputs).
"""
from __future__ import annotations

import torch

import dpk

from ._checks import check_inputs
from ._launch import compiled_program
from ._net import DTYPES, Call  # bf16: a bf16 net's weights and I/O; activations and sums stay fp32 inside

NEEDS = ("cuda", "nvcc", "sm90")


def _io(sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor, obs: torch.Tensor, call: Call,
        variant: str) -> dict[str, torch.Tensor]:
    check_inputs(sample, timestep, global_cond, obs, call, variant, integer_timesteps=True, contiguous=True)
    if timestep.dim() == 0:  # an expanded copy would be a new address every call: a new graph every call
        raise ValueError(f"unet1d.{variant}: timestep must be a ({sample.shape[0]},) int64 tensor, not 0-d")
    io = {"sample": sample, "t": timestep}
    if call.form == "plain":
        if call.net.config.global_cond_dim:
            io["global_cond"] = global_cond
    else:
        io["obs"] = obs
    return io


def _info(*inputs: object) -> dict:
    """resident_mb: packed weights, workspace, output buffers; prepare_s: planning and packing the program."""
    sample, call = inputs[0], inputs[-1]
    key = ("kernels", call.form, call.num_t, sample.shape[0], sample.shape[1])
    prog = compiled_program(call, sample.shape[0], sample.shape[1])
    return {"resident_mb": prog.resident_bytes() / 1e6, "prepare_s": call.net.prepare_s.get(key, float("nan"))}


@dpk.variant("unet1d", "kernels", needs=NEEDS, dtypes=DTYPES, compute="float32", info=_info)
def kernels(sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor, obs: torch.Tensor,
            call: Call) -> torch.Tensor:
    """The project's layer kernel, ~30 launches with PDL, one NVTX range per layer."""
    io = _io(sample, timestep, global_cond, obs, call, "kernels")
    return compiled_program(call, sample.shape[0], sample.shape[1]).launch(io)


@dpk.variant("unet1d", "kernels_graph", needs=NEEDS, dtypes=DTYPES, compute="float32", graph=False, info=_info)
def kernels_graph(sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor, obs: torch.Tensor,
                  call: Call) -> torch.Tensor:
    """`kernels` captured once into one CUDA graph (PDL edges kept) and replayed."""
    io = _io(sample, timestep, global_cond, obs, call, "kernels_graph")
    return compiled_program(call, sample.shape[0], sample.shape[1]).replay(io)
