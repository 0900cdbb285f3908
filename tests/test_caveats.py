"""`dpk compare` warns about runs timed by different engine versions, from the fingerprints (fabricated runs)."""
from __future__ import annotations

import subprocess

import pytest
import torch

from dpk import caveats, cli, env, results
from dpk.caveats import EngineChange

from .test_compare import samples
from .test_results import fingerprint, row


def store(tmp_path, ts: str, **fp) -> results.Run:
    w = results.RunWriter(tmp_path, fingerprint(ts=ts) | fp, {})
    for mode in ("cold", "graph"):
        w.add(row("a", 10.0, mode=mode), samples(1e-5))
    return results.Run(w.json_path)


def test_fingerprint_records_the_engine_version():
    fp = env.fingerprint(torch.device("cpu"), measure_bandwidth=False)
    assert fp["timing_engine"] == caveats.TIMING_ENGINE == caveats.CHANGES[-1].version


def test_recorded_versions_print_the_facts_between_them(tmp_path, capsys):
    old = store(tmp_path, "2026-11-21T10:00:00+00:00", timing_engine=2)
    new = store(tmp_path, "2026-11-21T11:00:00+00:00", timing_engine=caveats.TIMING_ENGINE)
    notes = caveats.engine_caveats(old, new)
    assert notes[0] == f"timing engines differ: A v2 (recorded), B v{caveats.TIMING_ENGINE} (recorded)"
    assert any("before 501f08b" in n and "~0.65 us slow" in n for n in notes)  # v3: cold rows
    assert any("before 657fa17" in n for n in notes)  # v4
    assert not any("2426f26" in n for n in notes)  # v2 already had it
    assert caveats.engine_caveats(new, new) == []
    assert cli.main(["compare", old.run_id, new.run_id, "--results-dir", str(tmp_path)]) == 0
    assert "warning: timing engines differ: A v2" in capsys.readouterr().err


@pytest.fixture
def engine_repo(tmp_path, monkeypatch):
    """A git repo whose commits 2..4 stand for the engine changes; returns (repo, {version: sha})."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    shas = {}
    for version in (1, 2, 3, 4):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", f"engine v{version}"], check=True)
        shas[version] = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    changes = tuple(EngineChange(c.version, shas[c.version], c.mode, c.fact) for c in caveats.CHANGES)
    monkeypatch.setattr(caveats, "CHANGES", changes)
    return repo, shas


def test_runs_without_the_field_are_placed_by_their_commit(tmp_path, engine_repo):
    repo, shas = engine_repo
    assert caveats.engine_version({"git_sha": shas[1]}, repo) == (1, f"inferred from its commit {shas[1][:10]}")
    assert caveats.engine_version({"git_sha": shas[3], "git_dirty": True}, repo)[0] == 3
    old = store(tmp_path, "2026-11-21T10:00:00+00:00", git_sha=shas[1])
    new = store(tmp_path, "2026-11-21T11:00:00+00:00", git_sha=shas[4])
    notes = caveats.engine_caveats(old, new, repo)
    assert notes[0].startswith("timing engines differ: A v1 (inferred from its commit")
    assert [c.commit[:7] for c in caveats.CHANGES if any(c.fact == n for n in notes)] == \
        [shas[2][:7], shas[3][:7], shas[4][:7]]  # graph, cold, and the precision stop: both runs have those modes


def test_an_unknown_commit_or_no_git_makes_the_version_unknown(tmp_path, engine_repo):
    repo, _ = engine_repo
    a = store(tmp_path, "2026-11-21T10:00:00+00:00", git_sha="0123456789abcdef0123456789abcdef01234567")
    b = store(tmp_path, "2026-11-21T11:00:00+00:00", git_sha=None)
    notes = caveats.engine_caveats(a, b, repo)
    assert len(notes) == 2 and all("is unknown" in n for n in notes)
    assert "git cannot place its commit 0123456789" in notes[0] and "without timing_engine or a git sha" in notes[1]
    assert caveats.engine_version({"git_sha": "abc"}, tmp_path / "not-a-repo")[0] is None
