"""Triton kernel for gn_mish: y = mish(group_norm(x; G, eps) * gamma + beta), x and y (B, C, L) contiguous.

One program per (batch, group); group pid is the contiguous span [pid*N, (pid+1)*N) of x, N = C/G * L.
N <= MAX_TILE: the whole group is one register tile; two-pass statistics (mean, then sum of squared
deviations) on the tile, then the affine and mish, one read of x. Larger N: a loop over tiles merges
per-tile (count, mean, M2) with Chan's formula, then a second loop re-reads the group (from L2 on a GPU:
one group is at most a few MB) to normalise. fp32 math for every input dtype. Only tl.exp / tl.log /
tl.sqrt, no libdevice, so the same code runs under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import dpk

MAX_TILE = 4096  # elements of one register tile (8 warps: 16 fp32 per thread)
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # PyTorch's softplus cut-off: above it tanh(softplus(z)) == 1 in fp32


@triton.jit
def _mish(z):
    # tanh(log1p(e)) = n / (n + 2) with n = e * (e + 2), e = exp(z): no overflow below the cut-off, no
    # cancellation for very negative z (n -> 0 smoothly).
    e = tl.exp(tl.minimum(z, SOFTPLUS_THRESHOLD))
    n = e * (e + 2.0)
    return tl.where(z > SOFTPLUS_THRESHOLD, z, z * (n / (n + 2.0)))


@triton.jit
def _normalize_store(x_ptr, gamma_ptr, beta_ptr, y_ptr, base, c0, idx, mask, x, mean, rstd, L):
    c = c0 + idx // L
    gamma = tl.load(gamma_ptr + c, mask=mask, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + c, mask=mask, other=0.0).to(tl.float32)
    z = (x - mean) * (rstd * gamma) + beta
    tl.store(y_ptr + base + idx, _mish(z).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gn_mish_kernel(x_ptr,      # [B, C, L] contiguous; group pid = elements [pid*N, (pid+1)*N)
                   gamma_ptr,  # [C]
                   beta_ptr,   # [C]
                   y_ptr,      # [B, C, L] contiguous, x's dtype
                   G, CG, L, N, eps,
                   BLOCK: tl.constexpr, ONE_TILE: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * N
    c0 = (pid % G) * CG
    offs = tl.arange(0, BLOCK)
    if ONE_TILE:
        mask = offs < N
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / N
        d = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / N + eps)
        _normalize_store(x_ptr, gamma_ptr, beta_ptr, y_ptr, base, c0, offs, mask, x, mean, rstd, L)
    else:
        count = tl.zeros((), dtype=tl.float32)
        mean = tl.zeros((), dtype=tl.float32)
        m2 = tl.zeros((), dtype=tl.float32)
        for start in range(0, N, BLOCK):
            idx = start + offs
            mask = idx < N
            x = tl.load(x_ptr + base + idx, mask=mask, other=0.0).to(tl.float32)
            n_tile = tl.minimum(N - start, BLOCK).to(tl.float32)
            mean_tile = tl.sum(x, axis=0) / n_tile
            d = tl.where(mask, x - mean_tile, 0.0)
            total = count + n_tile
            delta = mean_tile - mean
            frac = n_tile / total
            mean = mean + delta * frac
            m2 = m2 + tl.sum(d * d, axis=0) + delta * delta * count * frac
            count = total
        rstd = 1.0 / tl.sqrt(m2 / N + eps)
        for start in range(0, N, BLOCK):
            idx = start + offs
            mask = idx < N
            x = tl.load(x_ptr + base + idx, mask=mask, other=0.0).to(tl.float32)
            _normalize_store(x_ptr, gamma_ptr, beta_ptr, y_ptr, base, c0, idx, mask, x, mean, rstd, L)


def gn_mish_triton(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float,
                   max_tile: int = MAX_TILE) -> torch.Tensor:
    """Launch on validated inputs; `max_tile` (a power of two) lets tests force the looped path."""
    B, C, L = x.shape
    n = (C // groups) * L
    if n >= 2**31:
        raise dpk.Unavailable(f"gn_mish: a group of {n} elements exceeds the kernel's int32 indexing")
    one_tile = n <= max_tile
    block = triton.next_power_of_2(n) if one_tile else max_tile
    y = torch.empty_like(x)
    gn_mish_kernel[(B * groups,)](x, gamma, beta, y, groups, C // groups, L, n, float(eps),
                                  BLOCK=block, ONE_TILE=one_tile, num_warps=max(1, min(8, block // 512)))
    return y
