"""Weights of a planned segment in the order unet1d.cu reads them (`pack_weight`), its inverse for the CPU
emulation, and biases padded to the segment's CTAs."""
from __future__ import annotations

import torch

from ._ops import Segment
from ._plan import SIMT_RPT


def pack_weight(w: torch.Tensor, s: Segment) -> torch.Tensor:
    """(rows, cin, taps) -> flat, per CTA and stage in MMA B-fragment order [channel block][tap][row block][lane][2]
    (lane = 4 row + c % 4, element = c // 4 for row, c within the blocks of 8), or for the SIMT form
    [row group][channel][row][tap] (a thread's weights of one channel contiguous; a carrier's tap k is its rider's
    1x1 weight): zero rows and channels where padded."""
    rows, cin, k = w.shape
    if (rows, cin, k) != (s.rows, s.cin, s.taps):
        raise ValueError(f"weight {tuple(w.shape)} does not match the segment ({s.rows}, {s.cin}, {s.taps})")
    full = w.new_zeros(s.ncta * s.rc, s.nstages * s.cb, k)
    full[:rows, :cin] = w
    if s.simt:  # [cta, g, rr, st, c, t] -> [cta, st, g, c, rr, t]
        v = full.reshape(s.ncta, s.rc // SIMT_RPT, SIMT_RPT, s.nstages, s.cb, k)
        return v.permute(0, 3, 1, 4, 2, 5).reshape(-1)
    ncb = s.cb // 8
    # [cta, rb, n, st, cbk, half, q, t] -> [cta, st, cbk, t, rb, n, q, half]
    v = full.reshape(s.ncta, s.nb, 8, s.nstages, ncb, 2, 4, k)
    return v.permute(0, 3, 4, 7, 1, 2, 6, 5).reshape(-1)


def unpack_weight(flat: torch.Tensor, s: Segment) -> torch.Tensor:
    """The inverse of pack_weight, padding kept: (ncta * rc, nstages * cb, k)."""
    if s.simt:
        v = flat.reshape(s.ncta, s.nstages, s.rc // SIMT_RPT, s.cb, SIMT_RPT, s.taps)
        return v.permute(0, 2, 4, 1, 3, 5).reshape(s.ncta * s.rc, s.nstages * s.cb, s.taps)
    v = flat.reshape(s.ncta, s.nstages, s.cb // 8, s.k, s.nb, 8, 4, 2)
    return v.permute(0, 4, 5, 1, 2, 7, 6, 3).reshape(s.ncta * s.rc, s.nstages * s.cb, s.k)


def pack_bias(b: torch.Tensor, s: Segment) -> torch.Tensor:
    full = b.new_zeros(s.ncta * s.rc)
    full[: b.numel()] = b
    return full
