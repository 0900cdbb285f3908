"""pytest-benchmark gate: autosave, then --benchmark-compare-fail=median:10% passes unchanged and fails a
planted 20% slowdown of one variant (toy.spin via DPK_TOY_SPIN_US, 2000 -> 2400 us: at the toy's 200 us the
Python around each call moves ~10% between processes on a busy 2-core box); stats are dpk's own samples."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .conftest import ROOT, TOY_KERNELS, TOY_SUITES


def pytest_run(tmp_path, *extra: str, spin_us: str = "2000") -> subprocess.CompletedProcess:
    env = os.environ | {"DPK_KERNELS_DIR": str(TOY_KERNELS), "DPK_SUITES_DIR": str(TOY_SUITES),
                        "DPK_TOY_SPIN_US": spin_us}
    cmd = [sys.executable, "-m", "pytest", "suites/test_benchmarks.py", "-q", "-p", "no:cacheprovider",
           "-k", "toy-spin", "--benchmark-enable", f"--benchmark-storage=file://{tmp_path}", "--dpk-budget", "0.3",
           *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)


def test_autosave_compare_and_planted_slowdown(tmp_path):
    first = pytest_run(tmp_path, "--benchmark-autosave")
    assert first.returncode == 0, first.stdout + first.stderr
    saved = json.loads(next(tmp_path.rglob("*.json")).read_text())
    bench = saved["benchmarks"][0]
    assert bench["options"]["timer"].endswith("device_clock")
    assert bench["stats"]["median"] * 1e6 == __import__("pytest").approx(bench["extra_info"]["median_us"])
    assert bench["stats"]["rounds"] == bench["extra_info"]["n"]  # one round per dpk sample, replayed

    gate = ["--benchmark-compare", "--benchmark-compare-fail=median:10%"]
    same = pytest_run(tmp_path, *gate)
    assert same.returncode == 0, same.stdout + same.stderr
    slow = pytest_run(tmp_path, *gate, spin_us="2400")
    assert slow.returncode != 0
    assert "Performance has regressed" in slow.stdout + slow.stderr


def test_parity_only_run_is_the_default(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pytest", "suites/test_benchmarks.py", "-q", "-p", "no:cacheprovider",
                          "-k", "toy-spin or toy-wrong"],
                         cwd=ROOT, env=os.environ | {"DPK_KERNELS_DIR": str(TOY_KERNELS),
                                                     "DPK_SUITES_DIR": str(TOY_SUITES)},
                         text=True, capture_output=True, timeout=600)
    assert out.returncode == 1  # toy.wrong fails parity; nothing is timed
    assert "toy.wrong on m7_n13.fp32" in out.stdout and "mismatches=" in out.stdout
    assert "benchmark:" not in out.stdout.lower() or "disabled" in out.stdout.lower()
