"""Registry discovery, plugin loading by path, availability reasons."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dpk import registry
from dpk.registry import unavailable_reason


def test_toy_family_discovered(toy_registry):
    assert "toy" in toy_registry.families
    names = [v.name for v in toy_registry.variants_of("toy")]
    assert {"torch", "rowsum", "wrong", "uninit", "side_stream"} <= set(names)
    assert toy_registry.baseline("toy").name == "torch"
    assert toy_registry.variant("toy", "torch").description.startswith("torch.mv")


def test_unknown_names_say_what_exists(toy_registry):
    with pytest.raises(KeyError, match="known: toy"):
        toy_registry.family("nope")
    with pytest.raises(KeyError, match="torch"):
        toy_registry.variant("toy", "nope")


def test_availability_reasons(toy_registry):
    cpu = torch.device("cpu")
    assert "CUDA GPU" in unavailable_reason(toy_registry.variant("toy", "side_stream"), cpu)
    assert "no_such_package_dpk" in unavailable_reason(toy_registry.variant("toy", "needs_pkg"), cpu)
    assert "bfloat16 not supported" in unavailable_reason(toy_registry.variant("toy", "rowsum"), cpu, "bfloat16")
    assert unavailable_reason(toy_registry.variant("toy", "torch"), cpu, "float32") is None


def _family(tmp: Path, name: str, body: str) -> None:
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "fam.py").write_text(textwrap.dedent(body))


FAMILY = '''
import dpk, torch
@dpk.family("{name}", make_inputs=lambda c, d: (torch.ones(2, device=d),), tolerance=lambda c, k: dpk.Tolerance(0, 0))
def ref(x):
    return x
'''


def test_user_folder_and_broken_module_do_not_crash(tmp_path):
    _family(tmp_path, "good", FAMILY.format(name="good"))
    _family(tmp_path, "broken", "import dpk\nraise RuntimeError('boom at import')\n")
    reg = registry.load([tmp_path])
    assert "good" in reg.families
    assert any("boom at import" in e for e in reg.load_errors.values())
    with pytest.raises(RuntimeError, match="boom"):
        registry.load([tmp_path], strict=True)


def test_duplicates_and_orphans_are_errors(tmp_path):
    _family(tmp_path / "a", "one", FAMILY.format(name="dup"))
    _family(tmp_path / "b", "two", FAMILY.format(name="dup"))
    with pytest.raises(ValueError, match="declared twice"):
        registry.load([tmp_path / "a", tmp_path / "b"], strict=True)
    _family(tmp_path / "d", "dup", FAMILY.format(name="dup2"))
    _family(tmp_path / "e", "dup", FAMILY.format(name="dup3"))
    with pytest.raises(ValueError, match="family folder 'dup' is in two kernels dirs"):
        registry.load([tmp_path / "d", tmp_path / "e"])
    _family(tmp_path / "c", "orphan", "import dpk\n@dpk.variant('ghost', 'v')\ndef v(x):\n    return x\n")
    with pytest.raises(ValueError, match="unknown family 'ghost'"):
        registry.load([tmp_path / "c"])


def test_bad_names_rejected():
    with pytest.raises(ValueError, match="must match"):
        registry.variant("toy", "has/slash")
    with pytest.raises(ValueError, match="unknown dtypes"):
        registry.variant("toy", "ok", dtypes=("float8",))


def test_project_families_load_cleanly(project_session):
    assert not project_session.registry.load_errors
    for fam in project_session.registry.families:
        assert project_session.registry.baseline(fam) is not None, f"{fam} has no baseline"
        for suite in ("smoke", "pusht", "sweep"):
            assert project_session.cases(fam, suite), f"{fam} has no {suite} cases"


def test_family_imports_a_later_siblings_private_module(tmp_path):
    """Families load in name order; every package exists first, so `aaa` can use `zzz`'s `_` modules."""
    _family(tmp_path, "zzz", FAMILY.format(name="zzz"))
    (tmp_path / "zzz" / "_shared.py").write_text("VALUE = 41\n")
    _family(tmp_path, "aaa", FAMILY.format(name="aaa") + "\nfrom ..zzz._shared import VALUE\nANSWER = VALUE + 1\n")
    reg = registry.load([tmp_path], strict=True)
    assert set(reg.families) >= {"aaa", "zzz"}
    assert sys.modules["dpk.families.aaa.fam"].ANSWER == 42
    assert registry.load([tmp_path], strict=True, families=["aaa"]).families.keys() == {"aaa"}
