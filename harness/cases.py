"""Cases and suites: named, seeded shapes read from `suites/<family>.yaml`.

A suite file is data, read by the CLI, pytest and asv alike:

    family: conv1d
    suites:
      smoke:
        dtypes: [float32]            # default dtypes for the suite's cases
        cases:
          - {name: odd_c3_c5_l13, B: 1, Cin: 3, Cout: 5, L: 13, K: 3}
          - {name: tiny_bf16, B: 1, Cin: 8, Cout: 8, L: 4, K: 5, dtypes: [bfloat16], seed: 7}
          - name: "b{B}_c{C}"             # a grid expands into the cartesian product,
            grid: {B: [1, 8, 64], C: [256, 512]}   # the name formatted from each point
            L: 16
          - {name: "t{t}", grid: {t: {range: [0, 100]}}}   # range: [start, stop(, step)]

Every case expands into one `Case` per dtype. The seed defaults to a stable hash of family and name, so
the same case draws the same inputs on every machine.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .tolerance import DTYPES, SHORT

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")  # no '/' etc: names become NVTX ranges and file names
RESERVED_KEYS = {"name", "dtypes", "seed", "grid"}


class SuiteError(ValueError):
    """A suite file is malformed; the message names the file and the entry."""


def check_name(kind: str, name: str, where: str = "") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SuiteError(f"{where}{kind} name {name!r} must match {NAME_RE.pattern} "
                         "(it is used in NVTX ranges, where '/' means nesting, and in file names)")
    return name


@dataclass(frozen=True)
class Case:
    """One named, seeded shape + dtype of one family."""

    family: str
    name: str
    dtype: str
    seed: int
    params: tuple[tuple[str, Any], ...]
    suite: str = ""

    @property
    def id(self) -> str:
        """Unique within a family: `<name>.<dtype>`, e.g. `c1024_c1024_l4.fp32`."""
        return f"{self.name}.{SHORT.get(self.dtype, self.dtype)}"

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    def __getitem__(self, key: str) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(f"case {self.family}:{self.id} has no parameter {key!r} (has {[k for k, _ in self.params]})")

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params)


def default_seed(family: str, name: str) -> int:
    return zlib.crc32(f"{family}:{name}".encode()) & 0x7FFFFFFF


def make_case(family: str, name: str, dtype: str = "float32", seed: int | None = None, suite: str = "",
              **params: Any) -> Case:
    """Build a case in code (tests, adapters); suites normally come from YAML."""
    check_name("case", name)
    if dtype not in DTYPES:
        raise SuiteError(f"case {name!r}: unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    return Case(family, name, dtype, default_seed(family, name) if seed is None else int(seed),
                tuple(params.items()), suite)


@dataclass
class SuiteFile:
    """The suites of one family: from one file (`load_suite_file`) or merged from several (`load_suites`)."""

    family: str
    path: Path  # the first file read
    suites: dict[str, list[Case]] = field(default_factory=dict)
    sources: dict[str, Path] = field(default_factory=dict)  # suite -> the file that declares it


def _grid_values(key: str, spec: Any, where: str) -> list[Any]:
    if isinstance(spec, Mapping) and set(spec) == {"range"}:
        return list(range(*spec["range"]))
    if isinstance(spec, list) and spec:
        return spec
    raise SuiteError(f"{where}: grid axis {key!r} needs a non-empty list or {{range: [start, stop]}}")


def _expand_grid(entry: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    grid = entry.get("grid")
    if grid is None:
        return [dict(entry)]
    if not isinstance(grid, Mapping) or not grid:
        raise SuiteError(f"{where}: 'grid' must map parameter names to value lists")
    axes = {k: _grid_values(k, v, where) for k, v in grid.items()}
    points = []
    for values in itertools.product(*axes.values()):
        point = {k: v for k, v in entry.items() if k != "grid"} | dict(zip(axes, values))
        try:
            point["name"] = str(entry["name"]).format(**point)
        except KeyError as e:
            raise SuiteError(f"{where}: name template {entry['name']!r} uses unknown parameter {e}") from None
        points.append(point)
    return points


def _expand(family: str, suite: str, entry: Mapping[str, Any], dtypes: list[str], where: str) -> list[Case]:
    if not isinstance(entry, Mapping) or "name" not in entry:
        raise SuiteError(f"{where}: each case needs a mapping with a 'name', got {entry!r}")
    if "grid" in entry:
        return [c for point in _expand_grid(entry, where) for c in _expand(family, suite, point, dtypes, where)]
    name = check_name("case", entry["name"], f"{where}: ")
    case_dtypes = entry.get("dtypes", dtypes)
    if isinstance(case_dtypes, str) or not case_dtypes:
        raise SuiteError(f"{where}: case {name!r}: 'dtypes' must be a non-empty list")
    bad = [d for d in case_dtypes if d not in DTYPES]
    if bad:
        raise SuiteError(f"{where}: case {name!r}: unknown dtype(s) {bad}; known: {', '.join(DTYPES)}")
    params = {k: v for k, v in entry.items() if k not in RESERVED_KEYS}
    seed = entry.get("seed")
    return [make_case(family, name, d, seed, suite, **params) for d in case_dtypes]


def load_suite_file(path: Path) -> SuiteFile:
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SuiteError(f"{where}: not valid YAML: {e}") from e
    if not isinstance(data, Mapping) or "family" not in data or "suites" not in data:
        raise SuiteError(f"{where}: needs top-level keys 'family' and 'suites'")
    family = check_name("family", data["family"], f"{where}: ")
    out = SuiteFile(family, path)
    if not isinstance(data["suites"], Mapping):
        raise SuiteError(f"{where}: 'suites' must map suite names to {{dtypes, cases}}")
    for suite, body in data["suites"].items():
        check_name("suite", suite, f"{where}: ")
        if not isinstance(body, Mapping) or not isinstance(body.get("cases"), list):
            raise SuiteError(f"{where}: suite {suite!r} needs a 'cases' list")
        dtypes = body.get("dtypes", ["float32"])
        cases: list[Case] = []
        for i, entry in enumerate(body["cases"]):
            cases += _expand(family, suite, entry, dtypes, f"{where}: suite {suite!r} case #{i}")
        ids = [c.id for c in cases]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise SuiteError(f"{where}: suite {suite!r} declares {dupes} more than once")
        out.suites[suite] = cases
        out.sources[suite] = path
    return out


def unknown_case(files: list[SuiteFile], name: str, suite: str | None = None) -> str:
    """Why no case of `files`' families (in `suite`, or in any) is called `name`: the suites it is in instead,
    or the similar names (with their suite when it is another) and else the known ones."""
    fams = "/".join(sf.family for sf in files) or "the selected families"
    suites_of: dict[str, set[str]] = {}  # case name or id -> suites that have it
    for sf in files:
        for s, cs in sf.suites.items():
            for c in cs:
                suites_of.setdefault(c.name, set()).add(s)
                suites_of.setdefault(c.id, set()).add(s)
    if suite and name in suites_of:
        return f"case {name!r} of {fams} is in suite {', '.join(sorted(suites_of[name]))}, not {suite}"
    names = sorted({c.name for sf in files for cs in sf.suites.values() for c in cs})
    similar = [n for n in names if n.startswith(name.split(".")[0])]
    similar += [n for n in difflib.get_close_matches(name, names, n=6, cutoff=0.6) if n not in similar]
    similar.sort(key=lambda n: suite not in suites_of[n])  # the selected suite's first
    where = f"suite {suite}" if suite else "any suite"
    if similar:
        return f"no case {name!r} of {fams} in {where}; similar: " + ", ".join(
            n if not suite or suite in suites_of[n] else f"{n} (suite {'/'.join(sorted(suites_of[n]))})"
            for n in similar[:8])
    known = [n for n in names if not suite or suite in suites_of[n]]
    more = f" (+{len(known) - 12} more)" if len(known) > 12 else ""
    return f"no case {name!r} of {fams} in {where}; known: {', '.join(known[:12]) or 'none'}{more}"


def load_suites(dirs: Iterable[Path]) -> dict[str, SuiteFile]:
    """All `<family>.yaml` files in `dirs`, merged per family: several files may add suites to one family (a
    user's `--suites-dir` beside the project's); the same suite of one family in two files is an error."""
    found: dict[str, SuiteFile] = {}
    for d in dirs:
        for path in sorted(Path(d).glob("*.yaml")):
            sf = load_suite_file(path)
            have = found.setdefault(sf.family, SuiteFile(sf.family, path))
            for suite, cases in sf.suites.items():
                if suite in have.suites:
                    raise SuiteError(f"suite {suite!r} of family {sf.family!r} is declared in both "
                                     f"{have.sources[suite]} and {path}")
                have.suites[suite] = cases
                have.sources[suite] = path
    return found


def with_params(case: Case, params: Mapping[str, Any], allowed: Iterable[str]) -> Case:
    """`case` with `params` set (a command line's --param / --checkpoint), renamed so that its rows never pair
    with the suite's own: `<name>-<key><value>`, a checkpoint as `<name>-ckpt_<file stem>`."""
    allowed = set(allowed)
    bad = sorted(set(params) - allowed)
    if bad:
        raise SuiteError(f"family {case.family!r} takes no parameter {', '.join(map(repr, bad))} from the command "
                         f"line; it takes: {', '.join(sorted(allowed)) or 'none'}")
    suffix = []
    for k, v in sorted(params.items()):
        text = f"ckpt_{Path(str(v)).stem}" if k == "checkpoint" else f"{k}{v}"
        suffix.append(re.sub(r"[^A-Za-z0-9_.-]", "_", text))
    merged = dict(case.params) | dict(params)
    return dataclasses.replace(case, name=f"{case.name}-{'-'.join(suffix)}", params=tuple(merged.items()))
