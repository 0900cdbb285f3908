"""Every `dpk ...` command line of README.md's ```bash blocks runs (in-process, through `dpk.cli.main`) and exits 0.

Blocks whose first line is `# GPU only` are skipped. Each command runs on the `smoke` suite (a `--suite X` is
replaced; check/bench/ab default to smoke anyway) against a temp copy of a results folder that holds two small runs
(for `show`, `compare` and `report`). Commands that select nothing fail: every dpk command makes that an error.
What the test changes in a line, and why, is said where it does so (`normalise`).
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpk import cli
from dpk.ncu import ncu_binary
from dpk.runner import Session

from .conftest import ROOT

README = ROOT / "README.md"
TINY_BUDGET = "0.01"
DEFAULT_FAMILY = "gn_mish"  # the family added to a bench/ab line that names none (see normalise)
NO_RESULTS_DIR = {"env"}  # subcommands without --results-dir
SUITE_FORCED = {"check", "bench", "ab"}  # subcommands that check or time every case of the suite


def bash_blocks(text: str) -> list[list[str]]:
    """The lines of each ```bash block, without blocks whose first line is `# GPU only`."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    return [b.splitlines() for b in blocks if b.strip() and b.splitlines()[0].strip() != "# GPU only"]


def dpk_commands(text: str) -> list[list[str]]:
    """The argument lists of every `dpk ...` / `python -m dpk ...` command in the bash blocks, in order, once each.
    `[...]` (optional arguments in the README's notation) is dropped; `&&`, `;` and `|` separate commands."""
    out: list[list[str]] = []
    for block in bash_blocks(text):
        for line in block:
            line = re.sub(r"\[[^\]]*\]", "", line)
            for part in re.split(r"&&|;|\|", line):
                words = shlex.split(part, comments=True)
                for prefix in (["dpk"], ["python", "-m", "dpk"], ["python3", "-m", "dpk"]):
                    args = words[len(prefix):] if words[:len(prefix)] == prefix else []
                    if args and args[0] != "..." and args not in out:
                        out.append(args)
    return out


def _opt(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _set(args: list[str], name: str, value: str) -> list[str]:
    """`args` with option `name` set to `value` (replaced where given, else appended)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return [*out, name, value]


def _drop(args: list[str], name: str) -> list[str]:
    return [a for i, a in enumerate(args) if a != name and not a.startswith(name + "=")
            and not (i and args[i - 1] == name)]


def _resolves(rev: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True).returncode == 0


def normalise(args: list[str], results_dir: Path, session: Session) -> list[str]:
    cmd = args[0]
    if cmd in SUITE_FORCED or (_opt(args, "--suite") and cmd != "once"):
        args = _set(args, "--suite", "smoke")
    if cmd in ("bench", "ab"):
        # Timing every row of smoke takes ~3 min on a 2-core CPU (each row: parity, a warm-up and a size-matched
        # copy) and ~1 min per family: a line that names no family is run on one, and on one case of it.
        args = _set(args, "--budget", TINY_BUDGET)
        if not _opt(args, "--family"):
            args = [*args, "--family", DEFAULT_FAMILY]
        if not _opt(args, "--case"):
            families = _opt(args, "--family").split(",")
            args = [*args, "--case", session.cases(families[0], "smoke")[0].name]
    if cmd == "ab" and len(args) > 1 and not args[1].startswith("-") and not _resolves(args[1]):
        # a shallow clone (CI) lacks older commits: side B is then this checkout's own kernels/
        args = [args[0], *args[2:], "--other-dir", str(ROOT)]
    if cmd == "ncu" and not (torch.cuda.is_available() and _has_ncu()):
        # no GPU or no Nsight Compute here: check what the line selects (family, variant, case) instead
        args = _drop(_drop(["ncu-filter", *args[1:]], "--set"), "--metrics")
    if cmd not in NO_RESULTS_DIR:
        args = _set(args, "--results-dir", str(results_dir))
    return args


def _has_ncu() -> bool:
    try:
        return bool(ncu_binary())
    except FileNotFoundError:
        return False


COMMANDS = dpk_commands(README.read_text())


def test_the_readme_has_commands():
    assert len(COMMANDS) >= 5 and {"list", "check", "show", "compare"} <= {c[0] for c in COMMANDS}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with two small runs of the smoke suite (what show, compare and report read)."""
    rd = tmp_path_factory.mktemp("readme-results")
    case = Session().cases(DEFAULT_FAMILY, "smoke")[0].name
    for _ in range(2):
        assert cli.main(["bench", "--family", DEFAULT_FAMILY, "--variant", "eager", "--case", case, "--mode", "hot",
                         "--budget", TINY_BUDGET, "--no-size-copy", "--results-dir", str(rd)]) == 0
    return rd


@pytest.fixture(scope="module")
def session() -> Session:
    return Session()


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_readme_command_runs(args, two_runs, session, tmp_path, monkeypatch, capsys):
    results_dir = tmp_path / "results"
    shutil.copytree(two_runs, results_dir)
    if not torch.cuda.is_available():
        monkeypatch.setenv("DPK_BUILD_DIR", str(tmp_path / "build"))  # `dpk ab` extracts side B there
    argv = normalise(list(args), results_dir, session)
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse errors and the commands' own refusals (e.g. nothing selected)
        code = e.code if isinstance(e.code, int) else 2
        print(e.code, file=sys.stderr)
    out, err = capsys.readouterr()
    if code == 1 and argv[0] == "compare" and re.search(r"^A = .*\nB = ", out, re.M):
        code = 0  # a SLOWER verdict between two tiny CPU runs is compare's answer, not a failing command
    if code == 1 and argv[0] == "ab" and "A is SLOWER than B" in out and "PARITY" not in out:
        code = 0  # the same: noise on a CPU can reach ab's threshold; parity failures still fail
    assert code == 0, f"dpk {shlex.join(argv)} exited {code}\n{out[-3000:]}\n{err[-3000:]}"
