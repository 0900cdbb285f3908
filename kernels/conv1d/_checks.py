"""Input checks shared by every conv1d variant (and the reference).

y = conv1d(x, w, b) with padding K//2 and stride 1 needs x: B x Cin x L, w: Cout x Cin x K (K odd, so the
output keeps length L), b: Cout, all on one device, one dtype, contiguous. Bad input raises a
ValueError (shape, device, layout) or TypeError (type, dtype) that names the tensor and the problem, before
any kernel is launched: the CUDA kernels index raw pointers and would read out of bounds otherwise. Valid input
beyond the kernels' 32-bit indexing (on a GPU) raises dpk.Unavailable: a limit of the kernels, not an error.
"""
from __future__ import annotations

import torch

import dpk
from dpk.validate import require_tensors, same_kind

INT32_MAX = 2**31 - 1  # the CUDA and Triton kernels index with 32-bit ints


def check_conv1d_inputs(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, *, variant: str,
                        dtypes: tuple[torch.dtype, ...], device_type: str | None = None
                        ) -> tuple[int, int, int, int, int]:
    """Validate conv1d inputs for `variant`; return (B, Cin, L, Cout, K).

    dtypes: the dtypes the variant implements. device_type: 'cuda' for GPU-only variants, None for any.
    """
    where = f"conv1d.{variant}"
    require_tensors(where, x=x, w=w, b=b)
    for name, t, rank, layout in (("x", x, 3, "B x Cin x L"), ("w", w, 3, "Cout x Cin x K"), ("b", b, 1, "Cout")):
        if t.dim() != rank:
            raise ValueError(f"{where}: {name} must be {rank}-D ({layout}), got shape {tuple(t.shape)}")
    bsz, cin, length = x.shape
    cout, cin_w, k = w.shape
    if cin_w != cin:
        raise ValueError(f"{where}: channel mismatch: x has Cin={cin} channels but w expects Cin={cin_w} "
                         f"(x {tuple(x.shape)}, w {tuple(w.shape)})")
    if b.shape[0] != cout:
        raise ValueError(f"{where}: bias length {b.shape[0]} does not match Cout={cout} of w {tuple(w.shape)}")
    if k % 2 == 0:
        raise ValueError(f"{where}: kernel size K={k} is even; padding K//2 keeps the length L only for odd K")
    if min(bsz, cin, length, cout, k) == 0:
        raise ValueError(f"{where}: empty tensor (x {tuple(x.shape)}, w {tuple(w.shape)})")
    same_kind(where, {"x": x, "w": w, "b": b}, dtypes, device_type)
    if x.device.type == "cuda" and max(x.numel(), w.numel(), bsz * cout * length) > INT32_MAX:
        raise dpk.Unavailable(f"{where}: tensors with more than {INT32_MAX} elements are not supported")
    return bsz, cin, length, cout, k
