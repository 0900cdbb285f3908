"""asv per commit on CPU: a planted 20% slowdown in one variant is flagged (exit 1); an unchanged commit is not.

Builds a throw-away git repo holding this checkout's harness, the asv adapter and the toy family, with
three commits: base, an unrelated change, and a slowdown planted in `toy.spin` (SPIN_US 2000 -> 2400). The spin
is 2 ms here, not the toy's 200 us: between asv's processes the ~30 us of Python around each call moves by up
to 10% of a 200 us call on a busy 2-core box, which made the unchanged commit read "faster" at factor 1.1.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import ROOT, TOY_KERNELS, TOY_SUITES

pytestmark = pytest.mark.skipif(shutil.which("asv") is None and not (Path(sys.executable).parent / "asv").exists(),
                                reason="asv is not installed")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, text=True, capture_output=True).stdout.strip()


@pytest.fixture(scope="module")
def asv_repo(tmp_path_factory) -> tuple[Path, dict[str, str], list[str]]:
    repo = tmp_path_factory.mktemp("asvrepo")
    shutil.copytree(ROOT / "harness", repo / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "dpk").symlink_to("harness")
    shutil.copytree(TOY_KERNELS / "toy", repo / "kernels" / "toy", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "suites").mkdir()
    for f in ("__init__.py", "asv_benchmarks.py"):
        shutil.copy(ROOT / "suites" / f, repo / "suites" / f)
    shutil.copy(TOY_SUITES / "toy.yaml", repo / "suites" / "toy.yaml")
    shutil.copy(ROOT / "asv.conf.json", repo / "asv.conf.json")
    (repo / "ci").mkdir()
    shutil.copy(ROOT / "ci" / "asv-commits", repo / "ci" / "asv-commits")
    spin = repo / "kernels" / "toy" / "spin.py"
    spin.write_text(spin.read_text().replace("SPIN_US = 200.0", "SPIN_US = 2000.0"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    shas = []
    for msg in ("base", "unchanged", "plant"):
        if msg == "unchanged":
            (repo / "NOTES").write_text("an unrelated change\n")
        if msg == "plant":
            spin.write_text(spin.read_text().replace("SPIN_US = 2000.0", "SPIN_US = 2400.0"))
        git(repo, "add", "-A")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", msg)
        shas.append(git(repo, "rev-parse", "HEAD"))
    bindir = str(Path(sys.executable).parent)
    env = os.environ | {"HOME": str(repo / "home"), "PATH": bindir + os.pathsep + os.environ["PATH"],
                        "DPK_ASV_BUDGET": "0.3", "DPK_ASV_FAMILIES": "toy"}
    (repo / "home").mkdir()
    # Only the calibrated variant: a microsecond CPU op moves ~10% between processes on a busy 2-core box.
    run = subprocess.run([sys.executable, "ci/asv-commits", "run", *shas, "--bench", "track_spin"],
                         cwd=repo, env=env, text=True, capture_output=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    return repo, env, shas


def compare(repo: Path, env: dict[str, str], a: str, b: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "ci/asv-commits", "compare", a, b, "--factor", "1.1"], cwd=repo, env=env,
                          text=True, capture_output=True, timeout=300)


def test_results_saved_with_samples_and_published(asv_repo):
    repo, _, shas = asv_repo
    files = list((repo / "results" / "asv").glob("*/*.json"))
    saved = json.loads(next(f for f in files if f.name.startswith(shas[0][:8])).read_text())
    spin = next(v for k, v in saved["results"].items() if k.endswith("toy.track_spin"))
    samples = spin[saved["result_columns"].index("samples")]
    assert any(isinstance(s, list) and len(s) >= 3 for s in samples)  # dpk's samples, kept by --record-samples
    assert (repo / ".asv" / "html" / "index.html").exists()
    machine = next((repo / "results" / "asv").glob("*/machine.json")).read_text()
    assert ("GPU NVIDIA" in machine) if torch.cuda.is_available() else ("no GPU" in machine)


def test_unchanged_commit_reports_nothing(asv_repo):
    repo, env, shas = asv_repo
    out = compare(repo, env, shas[0], shas[1])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no significant change" in out.stdout


def test_planted_slowdown_is_flagged(asv_repo):
    repo, env, shas = asv_repo
    out = compare(repo, env, shas[1], shas[2])
    assert out.returncode == 1, out.stdout + out.stderr
    assert "SLOWER" in out.stdout
    flagged = [line for line in out.stdout.splitlines() if line.startswith("| +")]
    assert flagged and all("toy.track_spin" in line for line in flagged)
