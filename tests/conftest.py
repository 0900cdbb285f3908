"""Shared fixtures. Importing dpk first sets TRITON_INTERPRET=1 on machines without a GPU."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import dpk  # noqa: F401  (must precede any Triton kernel import)
from dpk import cases, registry
from dpk.runner import Session

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
TOY_KERNELS = PLUGINS / "kernels"
TOY_SUITES = PLUGINS / "suites"
DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@pytest.fixture(scope="module")
def one_thread():
    """For modules of tiny models: a second intra-op thread only adds hand-off cost (seconds on a busy 2-core
    runner). Use: `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def toy_registry() -> registry.Registry:
    return registry.load([TOY_KERNELS], strict=True)


@pytest.fixture(scope="session")
def toy_cases() -> dict[str, list[cases.Case]]:
    return cases.load_suites([TOY_SUITES])["toy"].suites


@pytest.fixture(scope="session")
def toy_session() -> Session:
    return Session([TOY_KERNELS], [TOY_SUITES], project=False, strict=True)


@pytest.fixture(scope="session")
def project_session() -> Session:
    return Session(strict=True)


def toy_copy(dest: Path, edits: dict[str, tuple[str, str]] | None = None) -> Path:
    """A copy of the toy family under `dest/kernels/toy`, with `file: (old, new)` text edits; returns `dest`."""
    shutil.copytree(TOY_KERNELS / "toy", dest / "kernels" / "toy", ignore=shutil.ignore_patterns("__pycache__"))
    for name, (old, new) in (edits or {}).items():
        path = dest / "kernels" / "toy" / name
        assert old in path.read_text(), (name, old)
        path.write_text(path.read_text().replace(old, new))
    return dest
