"""`dpk ab` on CPU: the toy family against copies of itself (another folder, a git revision), two registries and
two builds side by side in one process."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from dpk import ab, build, cli, registry

from ._helpers import gpu_test
from .conftest import ROOT, TOY_KERNELS, TOY_SUITES, toy_copy

TOY = ["--kernels-dir", str(TOY_KERNELS), "--suites-dir", str(TOY_SUITES)]
# hot mode: one ~0.1-0.2 ms call per sample on CPU, hundreds of samples per side within the budget
SPIN = ["--family", "toy", "--variant", "spin", "--case", "m7_n13", "--mode", "hot", "--budget", "0.3"]


def test_identical_sources_are_same(tmp_path, capsys):
    other = toy_copy(tmp_path / "b")
    assert cli.main(["ab", "--other-dir", str(other), *SPIN, *TOY]) == 0
    out = capsys.readouterr().out
    assert re.search(r"m7_n13\.fp32\s+hot\s.*SAME", out), out


def test_a_slower_than_b_fails(tmp_path, capsys):
    other = toy_copy(tmp_path / "b", {"spin.py": ("SPIN_US = 200.0", "SPIN_US = 100.0")})  # B spins half as long
    assert cli.main(["ab", "--other-dir", str(other / "kernels"), *SPIN, *TOY]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("m7_n13.fp32"))
    assert "SLOWER" in row and "A is SLOWER than B: 1" in out
    a_us, b_us, ratio = (float(x) for x in row.split()[2:5])
    # the table's columns agree with each other (A's and B's medians and their ratio), whatever the host's speed
    assert b_us < a_us and ratio == pytest.approx(b_us / a_us, rel=0.01)


def test_parity_failure_on_side_b_is_reported_not_timed(tmp_path, capsys):
    other = toy_copy(tmp_path / "b", {"spin.py": ("return torch.mv(a, v) + c\n", "return torch.mv(a, v) + c + 1.0\n")})
    assert cli.main(["ab", "--other-dir", str(other), *SPIN, *TOY]) == 0  # A is fine: no failure of this tree
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("m7_n13.fp32"))
    assert "PARITY" in row and "B max_abs=" in row and "mismatches=" in row
    assert row.split()[2:4] == ["-", "-"]  # not timed


def test_side_b_from_a_git_revision(tmp_path, monkeypatch, capsys):
    """`dpk ab HEAD`: the working tree's uncommitted change (a slower spin) against the committed kernels."""
    repo = toy_copy(tmp_path / "repo")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    subprocess.run([*git, "add", "kernels"], check=True)
    subprocess.run([*git, "commit", "-qm", "toy"], check=True)
    spin = repo / "kernels" / "toy" / "spin.py"
    spin.write_text(spin.read_text().replace("SPIN_US = 200.0", "SPIN_US = 400.0"))
    monkeypatch.setattr(ab, "project_root", lambda: repo)
    monkeypatch.setenv("DPK_BUILD_DIR", str(tmp_path / "cache"))
    args = ["ab", "HEAD", *SPIN, "--kernels-dir", str(repo / "kernels"), "--suites-dir", str(TOY_SUITES)]
    assert cli.main(args) == 1
    assert "A is SLOWER than B: 1" in capsys.readouterr().out
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    extracted = tmp_path / "cache" / "ab" / sha / "kernels" / "toy" / "spin.py"
    assert "SPIN_US = 200.0" in extracted.read_text()  # the committed source, cached per commit
    with pytest.raises(SystemExit, match="not both"):
        cli.main([*args, "--other-dir", str(repo)])
    capsys.readouterr()
    assert cli.main(["ab", "nosuchrev", *SPIN, *TOY]) == 2
    assert "'nosuchrev' is not a commit" in capsys.readouterr().err
    assert cli.main(["ab", "HEAD~1", *SPIN, *TOY]) == 2  # a revision without kernels/
    assert "cannot extract kernels/ of HEAD~1" in capsys.readouterr().err
    assert not list((tmp_path / "cache" / "ab").glob(".*"))  # no half extraction left behind


def test_two_registries_import_side_by_side(tmp_path):
    other = toy_copy(tmp_path / "b")
    a = registry.load([TOY_KERNELS])
    b = registry.load([other / "kernels"], package="dpk.families_b", families=["toy"])
    va, vb = a.variant("toy", "spin"), b.variant("toy", "spin")
    assert va.fn.__module__ == "dpk.families.toy.spin" and vb.fn.__module__ == "dpk.families_b.toy.spin"
    assert va.fn is not vb.fn and str(other) in vb.source
    assert registry.load([other / "kernels"], package="dpk.families_b", families=["nope"]).families == {}


def test_every_binding_is_named_by_the_build():
    """Builds import each extension under a name that carries its source hash, which only works when the
    binding takes its module name from TORCH_EXTENSION_NAME."""
    bindings = [p for p in (ROOT / "kernels").rglob("*.cpp") if "PYBIND11_MODULE" in p.read_text()]
    assert bindings
    for path in bindings:
        assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME," in path.read_text(), path


def test_extension_name_carries_the_source_hash_and_headers_come_from_beside_the_family(tmp_path, monkeypatch):
    """Two versions of one extension's sources build under two module names, each against the `_cuda/` beside its
    own family folder (the project's when there is none); a byte-identical copy reuses the first build."""
    from torch.utils import cpp_extension

    loads: list[dict] = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: loads.append(kw) or object())
    monkeypatch.setattr(build, "_arch_list", lambda: "9.0")
    monkeypatch.setattr(build, "_imported", {})
    monkeypatch.setenv("DPK_BUILD_DIR", str(tmp_path / "cache"))
    sources = []
    for side, body in (("a", "// one"), ("b", "// two"), ("c", "// one")):
        fam = tmp_path / side / "kernels" / "fam"
        fam.mkdir(parents=True)
        (fam / "k.cu").write_text(body)
        sources.append(fam / "k.cu")
    for side in ("a", "c"):  # the same source and (no) shared headers: the same build
        (tmp_path / side / "kernels" / "_cuda").mkdir()
    exts = [build._load.__wrapped__("dpk_fam", (src,), ("-O3",)) for src in sources]
    names = [kw["name"] for kw in loads]
    assert len(loads) == 2 and names[0] != names[1] and all(re.fullmatch(r"dpk_fam_[0-9a-f]{12}", n) for n in names)
    assert exts[2] is exts[0] and exts[1] is not exts[0]
    assert loads[0]["extra_include_paths"] == [str(tmp_path / "a" / "kernels" / "_cuda")]
    assert loads[1]["extra_include_paths"] == [str(ROOT / "kernels" / "_cuda")]
    assert Path(loads[0]["build_directory"]).name == names[0].replace("dpk_fam_", "dpk_fam-")


def test_two_loads_of_one_plain_library_keep_their_own_argtypes():
    """Identical sources on both sides build one plain (ctypes) library: each side's load must be its own CDLL
    object, or side B's argtypes (its own ctypes structs) replace side A's and A's calls fail."""
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no libc to load")
    a, b = build._cdll(libc), build._cdll(libc)
    a.abs.argtypes = [ctypes.c_int]
    b.abs.argtypes = [ctypes.c_long]
    assert a is not b and a.abs.argtypes == [ctypes.c_int]


@gpu_test
def test_cuda_extension_of_two_versions_in_one_process(tmp_path):
    """Side B's conv1d extension (a copy of the kernels with one changed source) builds and imports beside side
    A's, and both sides' stream variant pass parity."""
    import importlib

    from dpk import parity
    from dpk.runner import Session

    shutil.copytree(ROOT / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    stream = tmp_path / "kernels" / "conv1d" / "stream.cu"
    stream.write_text(stream.read_text() + "\n// side B\n")
    s = Session()
    b = registry.load([tmp_path / "kernels"], package="dpk.families_b", families=["conv1d"])
    ext_a = importlib.import_module("dpk.families.conv1d.cuda_variants").extension()
    ext_b = importlib.import_module("dpk.families_b.conv1d.cuda_variants").extension()
    assert ext_a is not ext_b and ext_a.__name__ != ext_b.__name__
    case = s.find_case("conv1d", "c1024_c1024_l4_k5", "pusht")
    for reg in (s.registry, b):
        assert parity.check(reg, "conv1d", "stream", case, torch.device("cuda")).ok
