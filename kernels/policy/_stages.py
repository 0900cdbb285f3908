"""The stages of one action chunk (encoder, unet, step) for each variant's `stages=` hook.

Each stage runs one part alone as the variant's call runs it, on a state from the middle of the chunk (step
k = S // 2: its timestep, its noise row, the trajectory and the U-Net's output there), and counts how often one
call runs it: the encoder once (only with the encoder stage on), the U-Net and the scheduler step S times. The
graph variants replay each part from a small CUDA graph of its own, as the call's graph runs it, so a stage's
time holds no host launch cost; the eager variants run it eagerly, host launch cost included, as their call
pays it. The row's latency minus the stages is what the report draws as host / other.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import dpk

from ._chunk import Chunk, capture, condition

Part = Callable[[], Any]


@dataclass(frozen=True)
class Probe:
    """The chunk's state at step k = S // 2, for running one stage alone."""

    chunk: Chunk
    inputs: tuple  # (global_cond, image, agent_pos, noise)
    cond: torch.Tensor | None
    x: torch.Tensor  # (B, T, D) trajectory before step k
    eps: torch.Tensor  # (B, T, D) the U-Net's output at step k
    k: int

    @property
    def device(self) -> torch.device:
        return self.x.device

    def encode(self, compiled: bool = False) -> torch.Tensor | None:
        return condition(self.chunk, *self.inputs[:3], compiled=compiled)


def probe(global_cond: torch.Tensor | None, image: torch.Tensor | None, agent_pos: torch.Tensor | None,
          noise: torch.Tensor, chunk: Chunk) -> Probe:
    """The state at the middle step of the chunk (the U-Net run once there, eagerly)."""
    k = chunk.steps // 2
    inputs = (global_cond, image, agent_pos, noise)
    with torch.no_grad():
        cond = condition(chunk, global_cond, image, agent_pos)
        x = noise[0].clone()
        eps = chunk.unet(x, chunk.timesteps(noise.device)[k], cond).contiguous()  # as the kernels read it
    return Probe(chunk, inputs, cond, x, eps, k)


def _eager(fn: Part) -> Part:
    def run() -> Any:
        with torch.no_grad():
            return fn()
    return run


def _graphed(fn: Part, device: torch.device) -> Part:
    """A replay of `fn` captured; it keeps `fn` (and so the tensors its closure holds) and the graph's output
    alive: the graph reads and writes their addresses, which a freed tensor would hand to the next allocation."""
    graph, out = capture(fn, device)
    return functools.partial(_replay, graph, fn, out)


def _replay(graph: torch.cuda.CUDAGraph, *_alive: Any) -> None:
    graph.replay()


def stages(p: Probe, unet: Part, step: Part, *, graphed: bool, encoder: Part | None = None) -> list[dpk.Stage]:
    """[encoder (with the encoder stage on)], unet x S, step x S; `encoder` defaults to the conditioning alone."""
    wrap = (lambda f: _graphed(f, p.device)) if graphed else _eager
    parts = [dpk.Stage("encoder", wrap(encoder or p.encode))] if p.chunk.encoder is not None else []
    return [*parts, dpk.Stage("unet", wrap(unet), p.chunk.steps), dpk.Stage("step", wrap(step), p.chunk.steps)]
