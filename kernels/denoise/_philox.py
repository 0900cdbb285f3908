"""Python reimplementation of the in-kernel noise of denoise.cu (NOISE_PHILOX, philox_normal_kernel).

Philox4x32-10 (Salmon et al. 2011, the Random123/cuRAND constants) with key = (seed_lo, seed_hi) and, for the
group g of elements 4g..4g+3 of the flattened sample, counter = (g, step, offset_lo, offset_hi). Its four
words become two Box-Muller pairs from 24-bit uniforms u1 = ((w >> 8) + 1) 2^-24 in (0, 1] and
u2 = (w >> 8) 2^-24 in [0, 1): z = sqrt(-2 ln u1) (cos 2 pi u2, sin 2 pi u2). The uniforms are exact in
float32, so this float64 version differs from the kernel's float32 logf/sqrtf/sincospif by a few ulp only.
Checked against the Random123 known-answer vectors in tests/test_denoise.py.
"""
from __future__ import annotations

import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def philox4x32_10(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """counter: (..., 4) uint32 words; key: two uint32 words. Returns (..., 4) uint32."""
    c = [counter[..., i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0] & MASK), np.uint64(key[1] & MASK)
    mask = np.uint64(MASK)
    for _ in range(10):
        p0 = np.uint64(M0) * c[0]
        p1 = np.uint64(M1) * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & mask
        hi1, lo1 = p1 >> np.uint64(32), p1 & mask
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0 = (k0 + np.uint64(W0)) & mask
        k1 = (k1 + np.uint64(W1)) & mask
    return np.stack(c, axis=-1).astype(np.uint32)


def normals(n: int, step: int, seed: int, offset: int = 0) -> np.ndarray:
    """The n float64 normals the kernel adds (before sigma) at inference step `step`."""
    groups = (n + 3) // 4
    ctr = np.zeros((groups, 4), dtype=np.uint64)
    ctr[:, 0] = np.arange(groups, dtype=np.uint64) & MASK
    ctr[:, 1] = step & MASK
    ctr[:, 2] = offset & MASK
    ctr[:, 3] = (offset >> 32) & MASK
    w = philox4x32_10(ctr, (seed & MASK, (seed >> 32) & MASK)).astype(np.float64)
    scale = 2.0**-24
    out = np.empty((groups, 4))
    for pair in (0, 1):
        u1 = (np.floor(w[:, 2 * pair] / 256) + 1) * scale
        u2 = np.floor(w[:, 2 * pair + 1] / 256) * scale
        rad = np.sqrt(-2.0 * np.log(u1))
        out[:, 2 * pair] = rad * np.cos(2 * np.pi * u2)
        out[:, 2 * pair + 1] = rad * np.sin(2 * np.pi * u2)
    return out.reshape(-1)[:n]
