"""Triton conv1d kernel (imported lazily by triton_variants.py, so a missing triton only disables that variant).

y[b, co, l] = bias[co] + sum_{r < Cin*K} w[co, r] * x[b, r // K, l + r % K - K//2]: one program per
(L tile, Cout tile, batch); it walks the flattened reduction axis r = (ci, k) in BLOCK_R chunks, loading a
BLOCK_CO x BLOCK_R weight tile (rows of w are contiguous) and the matching BLOCK_R x BLOCK_L im2col tile of x
(masked to zero outside [0, L)), and accumulates their broadcast product summed over r in fp32. The
broadcast-multiply-sum has no 16-wide minimum tile for the tiny L of Diffusion Policy and runs under
TRITON_INTERPRET=1 for any dtype (bf16/fp16 tiles are upcast on load); on Hopper the compiler may still turn it
into a TF32 MMA for large tiles (see triton_variants.py).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def conv1d_kernel(
    x_ptr,  # [B, Cin, L] contiguous, fp32/bf16/fp16
    w_ptr,  # [Cout, Cin * K] contiguous (w: Cout x Cin x K), dtype of x
    b_ptr,  # [Cout], dtype of x
    y_ptr,  # [B, Cout, L] contiguous, dtype of x
    Cin, Cout, L,
    K: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
):
    pid_l = tl.program_id(0)
    pid_co = tl.program_id(1)
    b = tl.program_id(2)
    R = Cin * K
    co = pid_co * BLOCK_CO + tl.arange(0, BLOCK_CO)  # [BLOCK_CO]
    out_l = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)  # [BLOCK_L] output positions
    co_ok = co < Cout
    x_b = x_ptr + b * Cin * L
    acc = tl.zeros((BLOCK_CO, BLOCK_L), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)               # [BLOCK_R] flattened (ci, k)
        r_ok = r < R
        ci = r // K
        k = r - ci * K
        w = tl.load(w_ptr + co[:, None] * R + r[None, :], mask=co_ok[:, None] & r_ok[None, :], other=0.0)
        pos = out_l[None, :] + k[:, None] - K // 2   # [BLOCK_R, BLOCK_L] input positions
        x_ok = r_ok[:, None] & (pos >= 0) & (pos < L)
        xv = tl.load(x_b + ci[:, None] * L + pos, mask=x_ok, other=0.0)
        acc += tl.sum(w.to(tl.float32)[:, :, None] * xv.to(tl.float32)[None, :, :], axis=1)
    bias = tl.load(b_ptr + co, mask=co_ok, other=0.0).to(tl.float32)
    acc += bias[:, None]
    y_mask = co_ok[:, None] & (out_l < L)[None, :]
    tl.store(y_ptr + b * Cout * L + co[:, None] * L + out_l[None, :], acc, mask=y_mask)


def block_sizes(bsz: int, cout: int, length: int, r: int, target_programs: int) -> tuple[int, int, int]:
    """(BLOCK_CO, BLOCK_L, BLOCK_R): power-of-two tiles, the r-chunk filling ~8K elements of product per step.

    BLOCK_CO shrinks (down to 4) until the grid has `target_programs` programs: 1 under the interpreter (few,
    fat programs), about two per SM on a GPU so a batch-1 conv still spreads its weight stream over the SMs.
    """
    block_l = min(triton.next_power_of_2(length), 32)
    block_co = min(triton.next_power_of_2(cout), 16)
    while block_co > 4 and bsz * triton.cdiv(cout, block_co) * triton.cdiv(length, block_l) < target_programs:
        block_co //= 2
    block_r = max(16, min(triton.next_power_of_2(r), 8192 // (block_co * block_l)))
    return block_co, block_l, block_r
