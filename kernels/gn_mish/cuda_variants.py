"""gn_mish CUDA variant: fused, one CUDA kernel for GroupNorm+Mish (gn_mish.cu, bound by binding.cpp), fp32 math.

Small groups (every Push-T GroupNorm): the group in the registers of a warp ... a CTA. Large groups: a
thread-block cluster (sm_90) per group combining (count, mean, M2) through distributed shared memory, so x is
read from DRAM once; beyond the cluster's register capacity it streams (re-read from L2). Tier 2: up to 32 CTAs
per group meeting through global memory in a resident grid, slices in registers plus shared memory. Tier 3 (B = 1,
x on chip): every CTA of a resident grid holds a piece of every group and the groups are pipelined through the chip,
so one group's stores overlap the next one's loads. `Tuning`
selects the CTA shapes of the tiers at run time (kernels/gn_mish/_tune.py sweeps them); the defaults are the
variant's.
"""
from __future__ import annotations

import dataclasses
import functools
import types
from pathlib import Path

import torch

import dpk
import dpk.build

from ._checks import check_inputs

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "binding.cpp", HERE / "gn_mish.cu")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_GROUP_ELEMENTS = 2**30  # gn_mish.cuh kMaxGroupElements: 32-bit indexing inside a group
MAX_GROUPS = 2**27  # B * G: the grid holds up to 16 CTAs per group (tier 2 takes <= 2**31 / 32 groups, else tier 1)


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Plan knobs of the fused kernel (gn_mish.cuh `Limits`, same order); 0 = the planner decides.

    max_threads, max_cluster: caps on tier 1's CTA size and CTAs per group (tests force the cluster and
    streaming paths with them). t0_threads: tier 0 threads per group, a power of two in 32..1024 (32 = a warp
    per group, up to one CTA per group); t0_groups_per_cta: tier 0 groups per CTA. t1_threads: tier 1 CTA
    size (a multiple of 32); t1_items: tier 1 vectors per thread per chunk (rounded to 8 or 4 vectors of 16 bytes);
    t1_ctas_per_sm: at most this many tier 1 CTAs per SM (padding with dynamic shared memory); t1_persistent:
    1 = resident clusters loop over the groups, loading the next group while reducing and storing the current
    one (used when a group fits in half of the cluster's registers; otherwise the plan is the usual one).
    t1_stash: a streaming tier 1 CTA keeps at most this many 16-byte vectors per thread of its oldest chunks in
    shared memory instead of re-reading them, as many as fit without losing residency (0: only where the re-reads
    would outgrow half the L2, the measured rule; -1: none); it also caps tier 2's stash.
    t2: 1 = tier 2 wherever it can be resident (a group over up to 32 CTAs that meet through global memory, the grid
    resident and looping over groups, slices in registers plus a shared-memory stash), -1 = never, 0 = the rule;
    t2_ctas: tier 2 CTAs per group, 1..32 (0: the rule).
    t1_smem: a one-chunk tier 1 plan of <= 256-thread CTAs copies its slices to shared memory instead of holding them
    in registers (40 registers per thread: more CTAs and bytes in flight per SM): 1 = with the same CTAs, 2 = with half
    the CTAs per group and twice the vectors each, -1 = never, 0 = the rule.
    t3: 1 = tier 3 wherever it fits (sm_90, 16-byte vectors, <= 32 groups, x in the chip's shared memory: every CTA of
    a resident grid holds a piece of every group and the groups are pipelined through the chip), -1 = never, 0 = the
    rule; t3_ctas: its CTAs (0: the largest power of two <= SMs; at most one per SM and 256); t3_reducers: its group
    warps (reduce, publish, collect), 1..16 (0: one per group, up to 8; the rest store; t1_threads sets the CTA size);
    t3_depth: groups requested ahead per CTA (0: 4).
    """

    max_threads: int = 1024
    max_cluster: int = 16
    t0_threads: int = 0
    t0_groups_per_cta: int = 0
    t1_threads: int = 0
    t1_items: int = 0
    t1_ctas_per_sm: int = 0
    t1_persistent: int = 0
    t1_stash: int = 0
    t2: int = 0
    t2_ctas: int = 0
    t1_smem: int = 0
    t3: int = 0
    t3_ctas: int = 0
    t3_reducers: int = 0
    t3_depth: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"gn_mish: Tuning.{f.name} must be an int, got {type(v).__name__}")
        problems = []
        if self.max_threads < 32:
            problems.append(f"max_threads={self.max_threads} < 32")
        if self.max_cluster < 1:
            problems.append(f"max_cluster={self.max_cluster} < 1")
        t0 = self.t0_threads
        if t0 and (t0 < 32 or t0 > 1024 or t0 & (t0 - 1)):
            problems.append(f"t0_threads={t0} is not a power of two in 32..1024 (or 0)")
        if not 0 <= self.t0_groups_per_cta <= 32 or (t0 and t0 * self.t0_groups_per_cta > 1024):
            problems.append(f"t0_groups_per_cta={self.t0_groups_per_cta}: 0..32 with t0_threads * it <= 1024")
        t1 = self.t1_threads
        if t1 and (t1 < 32 or t1 > 1024 or t1 % 32):
            problems.append(f"t1_threads={t1} is not a multiple of 32 in 32..1024 (or 0)")
        if self.t1_items < 0:
            problems.append(f"t1_items={self.t1_items} < 0")
        if not 0 <= self.t1_ctas_per_sm <= 32:
            problems.append(f"t1_ctas_per_sm={self.t1_ctas_per_sm} not in 0..32")
        if self.t1_persistent not in (0, 1):
            problems.append(f"t1_persistent={self.t1_persistent} is not 0 or 1")
        if self.t1_stash < -1:
            problems.append(f"t1_stash={self.t1_stash} < -1")
        if self.t2 not in (-1, 0, 1):
            problems.append(f"t2={self.t2} is not -1, 0 or 1")
        if not 0 <= self.t2_ctas <= 32:
            problems.append(f"t2_ctas={self.t2_ctas} not in 0..32")
        if self.t1_smem not in (-1, 0, 1, 2):
            problems.append(f"t1_smem={self.t1_smem} is not -1, 0, 1 or 2")
        if self.t3 not in (-1, 0, 1):
            problems.append(f"t3={self.t3} is not -1, 0 or 1")
        if not 0 <= self.t3_ctas <= 256:
            problems.append(f"t3_ctas={self.t3_ctas} not in 0..256")
        if not 0 <= self.t3_reducers <= 16:
            problems.append(f"t3_reducers={self.t3_reducers} not in 0..16")
        if self.t3_depth < 0:
            problems.append(f"t3_depth={self.t3_depth} < 0")
        if problems:
            raise ValueError("gn_mish: bad Tuning: " + "; ".join(problems))

    def as_list(self) -> list[int]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def label(self) -> str:
        """The knobs that differ from the defaults, e.g. 't0_threads=128' ('default' if none)."""
        default = Tuning()
        diff = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)]
        return ",".join(diff) or "default"


DEFAULT = Tuning()


@functools.cache
def extension() -> types.ModuleType:
    """The built extension (cached per source hash by dpk.build); raises dpk.Unavailable if it cannot build."""
    return dpk.build.cuda_extension("dpk_gn_mish", SOURCES)


def _check(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float) -> None:
    """Bad input: TypeError / ValueError (_checks.py); a valid shape beyond the kernel's limits: dpk.Unavailable."""
    B, C, L = check_inputs(x, gamma, beta, groups, eps, dtypes=DTYPES, device_type="cuda")
    if (C // groups) * L > MAX_GROUP_ELEMENTS:
        raise dpk.Unavailable(f"gn_mish: a group of {(C // groups) * L} elements exceeds the kernel's "
                              f"{MAX_GROUP_ELEMENTS}")
    if B * groups > MAX_GROUPS:
        raise dpk.Unavailable(f"gn_mish: B*G = {B * groups} groups exceeds the kernel's {MAX_GROUPS}")


def _tuning(tuning: Tuning | None) -> Tuning:
    if tuning is None:
        return DEFAULT
    if not isinstance(tuning, Tuning):
        raise TypeError(f"gn_mish: tuning must be a cuda_variants.Tuning, got {type(tuning).__name__}")
    return tuning


def fused_gn_mish(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float,
                  tuning: Tuning | None = None) -> torch.Tensor:
    """The fused kernel with the plan knobs of `tuning` (None: the defaults)."""
    tuning = _tuning(tuning)
    _check(x, gamma, beta, groups, eps)
    return extension().forward(x, gamma, beta, groups, float(eps), tuning.as_list())


def fused_plan(x: torch.Tensor, groups: int, tuning: Tuning | None = None) -> dict[str, int]:
    """How the kernel maps x on this GPU: tier, vec, threads, group_threads, groups_per_cta, cluster, items, grid,
    slice_vecs, chunks, persistent, stage, smem_bytes, stash, counter_bytes, partial_bytes, smem_slice, reducers, depth,
    resident_ctas (CTAs of this plan that fit at once)."""
    return dict(extension().plan(x, groups, _tuning(tuning).as_list()))


@dpk.variant("gn_mish", "fused", needs=("cuda", "nvcc"), dtypes=("float32", "float16", "bfloat16"), compute="float32")
def fused(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """Fused CUDA kernel: a warp..CTA per small group, a thread-block cluster per large group, up to 32 CTAs
    meeting through global memory (few large groups, or groups a cluster would re-read from DRAM), or, for B = 1
    groups whose x fits on chip, every SM holding a piece of every group with the groups pipelined."""
    return fused_gn_mish(x, gamma, beta, groups, eps)
