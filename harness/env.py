"""Environment fingerprint of a run, including the measured copy bandwidth used as the roofline."""
from __future__ import annotations

import datetime as dt
import functools
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from .clocks import nvml_for
from .paths import project_root
from .results import HOT_DEVICE
from .timing import TIMING_ENGINE
from .timing_aids import flush_bytes, flush_method, host_probe_s

COPY_BYTES = 512 << 20  # per buffer: far beyond any L2, so the copy streams from DRAM


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_state() -> dict[str, Any]:
    """HEAD and whether tracked files differ from it; DPK_GIT_SHA/DPK_GIT_DIRTY stand in where a copy of
    the tree has no .git (e.g. a working tree shipped to a GPU box)."""
    if os.environ.get("DPK_GIT_SHA"):
        sha = os.environ["DPK_GIT_SHA"].strip().lower()
        if not re.fullmatch(r"[0-9a-f]{40}", sha):  # a short or hand-typed sha cannot be checked where there is no .git
            raise ValueError(f"DPK_GIT_SHA={os.environ['DPK_GIT_SHA']!r}: give the full 40-character commit "
                             "(git rev-parse HEAD), so that runs name their commit exactly")
        return {"git_sha": sha, "git_dirty": os.environ.get("DPK_GIT_DIRTY", "0") == "1"}
    root = project_root()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10).stdout
    try:
        sha = git("rev-parse", "--verify", "-q", "HEAD").strip() or None
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip()) if sha else None
    except (OSError, subprocess.SubprocessError):
        sha, dirty = None, None
    return {"git_sha": sha, "git_dirty": dirty}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


COPY_WARMUP_S = 0.1  # of copies before sampling (a couple of warm-up copies leave probes of one machine apart)
COPY_SAMPLES = 25


@functools.cache
def copy_bandwidth_samples(device: torch.device) -> tuple[float, ...]:
    """Device-to-device (or RAM-to-RAM) copy rates in GB/s counting bytes read + written, sorted: COPY_SAMPLES
    copies after COPY_WARMUP_S seconds of copies (clocks and page tables settle first, so two probes of one
    machine agree)."""
    n = COPY_BYTES if device.type == "cuda" else 64 << 20
    src = torch.randn(n // 4, device=device)
    dst = torch.empty_like(src)

    def one_copy() -> float:
        if device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            dst.copy_(src)
            e1.record()
            e1.synchronize()
            secs = e0.elapsed_time(e1) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            secs = time.perf_counter() - t0
        return secs
    t_end = time.perf_counter() + COPY_WARMUP_S
    warm = 0
    while warm < 2 or time.perf_counter() < t_end:
        one_copy()
        warm += 1
    return tuple(sorted(2 * n / one_copy() / 1e9 for _ in range(COPY_SAMPLES)))


def copy_bandwidth_gbps(device: torch.device) -> float:
    """The roofline of the `% of copy` columns: median of copy_bandwidth_samples."""
    rates = copy_bandwidth_samples(device)
    return rates[len(rates) // 2]


def host_op_us(device: torch.device) -> float:
    """Host cost of issuing one tiny torch op (median of 25 host probes): how fast this host drives the device.
    Host-bound rows scale with it, so `dpk compare` warns when two runs' values differ."""
    return sorted(host_probe_s(device) for _ in range(25))[12] * 1e6


def fingerprint(device: torch.device, measure_bandwidth: bool = True) -> dict[str, Any]:
    now = dt.datetime.now(dt.timezone.utc)
    fp: dict[str, Any] = {
        "timestamp": now.isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "device": device.type,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "diffusers": _version("diffusers"),
        "nvtx": _version("nvtx"),
        "dpk": _version("dpk-bench"),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "flush_bytes": flush_bytes(device),
        "l2_flush": flush_method(device),
        "cold_launch": "stream held by a spin of 2x the call's host cost + 10 us, doubled while it falls short "
                       "(cover check): host launch cost excluded",
        "timing_engine": TIMING_ENGINE,
        "hot_mode": HOT_DEVICE if device.type == "cuda" else "back-to-back calls, one per sample (perf_counter)",
        **git_state(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        cc = torch.cuda.get_device_capability(device)
        fp |= {
            "gpu": props.name,
            "compute_capability": f"{cc[0]}.{cc[1]}",
            "sm_count": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "gpu_mem_bytes": props.total_memory,
            "cudnn": torch.backends.cudnn.version(),
            **{f"nvml_{k}": v for k, v in nvml_for(device).info().items()},
        }
        fp["machine"] = slug(props.name)
    else:
        fp |= {"gpu": None, "cudnn": None}
        fp["machine"] = "cpu-" + slug(fp["cpu"])[:40]
    fp["copy_gbps"] = copy_bandwidth_gbps(device) if measure_bandwidth else None
    if measure_bandwidth:  # the probe's own spread: how far a "% of copy" can move from it alone
        rates = copy_bandwidth_samples(device)
        fp["copy_gbps_p10"], fp["copy_gbps_p90"] = rates[len(rates) // 10], rates[len(rates) * 9 // 10]
    fp["host_op_us"] = host_op_us(device)
    return fp
