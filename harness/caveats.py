"""What `dpk compare` warns about two runs made with different versions of the timing engine.

Each run's fingerprint records `timing_engine` (timing.TIMING_ENGINE). Runs stored before that field existed
get the version their `git_sha` had, found with `git merge-base --is-ancestor` against the commits that
changed the engine, when git and those commits are at hand; otherwise their version is unknown.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .paths import project_root
from .results import Run
from .timing import TIMING_ENGINE


@dataclass(frozen=True)
class EngineChange:
    version: int  # the engine version this commit started
    commit: str
    mode: str | None  # the timing mode whose rows it moved (None: every mode)
    fact: str  # what rows made before it are like


CHANGES = (
    EngineChange(2, "2426f26", "graph", "graph rows made before 2426f26 also timed the host's submission of each "
                 "replay (up to ~3x on microsecond kernels when the host stalled)"),
    EngineChange(3, "501f08b", "cold", "cold rows of microsecond kernels made before 501f08b (an engine without "
                 "one sample in flight) are ~0.65 us slow, and their %sizecopy with them"),
    EngineChange(4, "657fa17", None, "rows made before 657fa17 may stop on precision after ~2 ms of sampling, so a "
                 "whole measurement of a microsecond kernel can land slow"),
)
assert CHANGES[-1].version == TIMING_ENGINE, "a new engine version needs its entry in CHANGES"


def _is_ancestor(commit: str, sha: str, repo: Path) -> bool | None:
    """Whether `commit` is in the history of `sha`; None when git or either commit is not available."""
    try:
        proc = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", commit, sha],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(proc.returncode)


def engine_version(fingerprint: dict, repo: Path | None = None) -> tuple[int | None, str]:
    """(version, how it is known): recorded in the fingerprint, inferred from its git sha, or (None, why not)."""
    if isinstance(fingerprint.get("timing_engine"), int):
        return fingerprint["timing_engine"], "recorded"
    sha = fingerprint.get("git_sha")
    if not sha:
        return None, "stored without timing_engine or a git sha"
    version = 1
    for change in CHANGES:
        has = _is_ancestor(change.commit, sha, repo or project_root())
        if has is None:
            return None, f"stored without timing_engine; git cannot place its commit {sha[:10]} here"
        if not has:
            break
        version = change.version
    dirty = " plus uncommitted changes" if fingerprint.get("git_dirty") else ""
    return version, f"inferred from its commit {sha[:10]}{dirty}"


def _modes(run: Run) -> set[str]:
    return set(run.df.loc[run.df["status"] == "ok", "mode"])


def engine_caveats(a: Run, b: Run, repo: Path | None = None) -> list[str]:
    """Warnings for two runs timed by different engine versions: the known facts about the older one's rows
    (only for modes both runs timed), or that a version is unknown."""
    (va, how_a), (vb, how_b) = engine_version(a.fingerprint, repo), engine_version(b.fingerprint, repo)
    out = [f"timing engine of {r.run_id} is unknown ({how}); the current engine is v{TIMING_ENGINE}"
           for r, v, how in ((a, va, how_a), (b, vb, how_b)) if v is None]
    if va is None or vb is None or va == vb:
        return out
    old, new = sorted((va, vb))
    modes = _modes(a) & _modes(b)
    facts = [c.fact for c in CHANGES if old < c.version <= new and (c.mode is None or c.mode in modes)]
    return [*out, f"timing engines differ: A v{va} ({how_a}), B v{vb} ({how_b})", *facts]
