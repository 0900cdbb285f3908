"""Suite files: valid, one per registered family, each with smoke/pusht/sweep; the YAML loader's errors."""
from __future__ import annotations

import pytest

from dpk import cases, cli
from dpk.cases import SuiteError

from .conftest import ROOT


def test_every_suite_file_belongs_to_a_family(project_session):
    assert set(project_session.suites) == set(project_session.registry.families)
    for fam, sf in project_session.suites.items():
        assert {"smoke", "pusht", "sweep"} <= set(sf.suites), f"{sf.path}: missing suites"
        for suite, cs in sf.suites.items():
            assert cs, f"{fam}/{suite} is empty"
            assert len({c.seed for c in cs if c.dtype == cs[0].dtype}) == len({c.name for c in cs}), "seeds collide"


@pytest.mark.parametrize("text, message", [
    ("family: x\nsuites: {smoke: {cases: [{B: 1}]}}", "needs a mapping with a 'name'"),
    ("family: x\nsuites: {smoke: {cases: [{name: a/b}]}}", "must match"),
    ("family: x\nsuites: {smoke: {cases: [{name: a, dtypes: [float8]}]}}", "unknown dtype"),
    ("family: x\nsuites: {smoke: {cases: [{name: a}, {name: a}]}}", "more than once"),
    ("family: x\nsuites: {smoke: {cases: [{name: 'b{B}', grid: {B: []}}]}}", "non-empty list"),
    ("family: x\nsuites: {smoke: {cases: [{name: 'b{C}', grid: {B: [1]}}]}}", "unknown parameter"),
    ("family: x\nsuites: {smoke: []}", "needs a 'cases' list"),
    ("suites: {}", "needs top-level keys"),
    ("family: x\nsuites: [", "not valid YAML"),
])
def test_bad_suite_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(SuiteError, match=message):
        cases.load_suite_file(path)


def test_grid_and_defaults(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("family: x\nsuites:\n  s:\n    dtypes: [float32, bfloat16]\n    cases:\n"
                    "      - {name: 'b{B}_t{t}', grid: {B: [1, 8], t: {range: [0, 3]}}, L: 4}\n")
    got = cases.load_suite_file(path).suites["s"]
    assert len(got) == 2 * 3 * 2
    assert got[0].id == "b1_t0.fp32" and got[0]["L"] == 4 and got[0].seed == got[1].seed
    assert ROOT.exists()


def test_a_suites_dir_adds_suites_to_a_family_and_one_suite_twice_is_an_error(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "conv1d.yaml").write_text("family: conv1d\nsuites:\n  mine:\n    cases:\n"
                                      "      - {name: my_c8_c8_l4_k3, B: 1, Cin: 8, Cout: 8, L: 4, K: 3}\n")
    sf = cases.load_suites([ROOT / "suites", mine])["conv1d"]
    assert {"smoke", "pusht", "sweep", "mine"} <= set(sf.suites)
    assert sf.sources["mine"] == mine / "conv1d.yaml" and sf.sources["smoke"] == ROOT / "suites" / "conv1d.yaml"
    assert [c.id for c in sf.suites["mine"]] == ["my_c8_c8_l4_k3.fp32"]
    assert cli.main(["check", "--family", "conv1d", "--variant", "triton", "--suite", "mine", "--quick",
                     "--suites-dir", str(mine)]) == 0
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / "conv1d.yaml").write_text("family: conv1d\nsuites:\n  smoke:\n    cases:\n      - {name: a, B: 1}\n")
    with pytest.raises(SuiteError, match=f"suite 'smoke' of family 'conv1d' is declared in both "
                                         f"{ROOT / 'suites' / 'conv1d.yaml'} and {twice / 'conv1d.yaml'}"):
        cases.load_suites([ROOT / "suites", twice])
