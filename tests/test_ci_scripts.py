"""The GPU-box scripts under ci/: shell syntax, and ci/device-run's step loop on the toy family (CPU)."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from .conftest import ROOT, TOY_KERNELS, TOY_SUITES

SHA = "0123456789abcdef0123456789abcdef01234567"  # ci/device-run takes a full commit
SHELL_SCRIPTS = ["bootstrap", "gate-selftest", "gpu-check", "offline-env", "device-run"]


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_shell_syntax(name):
    assert subprocess.run(["bash", "-n", str(ROOT / "ci" / name)]).returncode == 0


def test_device_run_packs_after_every_step(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = os.environ | {"DPK_OFFLINE_ENV": "0", "OUT": str(out), "PYTHONPATH": str(ROOT),
                        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    bench = ",".join(["bench:--family", "toy", "--variant", "torch", "--case", "m7_n13", "--budget", "0.02",
                      "--kernels-dir", str(TOY_KERNELS), "--suites-dir", str(TOY_SUITES),
                      "--results-dir", str(tmp_path / "res")]) + "=120"
    run = subprocess.run([str(ROOT / "ci" / "device-run"), SHA, bench, "check:no_such_suite=60"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    steps = (out / "logs" / "steps.txt").read_text().splitlines()
    assert len(steps) == 2 and steps[0].endswith("exit 0 (limit 120s)") and "check:no_such_suite: exit 1" in steps[1]
    with tarfile.open(out / "device.tgz") as tar:
        names = tar.getnames()
    # only what the call wrote under results/ travels: this one wrote its run elsewhere, so no stored run of the
    # checkout (hundreds of files, tens of MB) may be in the archive
    assert "logs/steps.txt" in names and not any(n.startswith("results/") for n in names)
    assert any((tmp_path / "res").rglob("*.csv"))
    bad = subprocess.run([str(ROOT / "ci" / "device-run"), SHA, "nope"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown step 'nope'" in bad.stderr
    short = subprocess.run([str(ROOT / "ci" / "device-run"), SHA[:7], bench], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert short.returncode == 2 and "full 40-character commit" in short.stderr
