"""Building CUDA C++ variants, cached by a hash of everything that goes into the build.

Kernel `.cu` files include no torch headers (launchers take raw pointers and a cudaStream_t), so a CPU
machine can compile-check them with plain `nvcc -c` (see `nvcc_compile_check`). Two kinds of build:

- `cuda_extension`: a torch extension (a small `.cpp` binding does the torch plumbing), through
  `torch.utils.cpp_extension.load`; needs a CUDA build of torch, so it builds where it runs.
- `nvcc_library`: a plain shared library (C ABI, loaded with ctypes) built by `nvcc` alone. It needs no
  torch at all, so it also builds on a machine without a GPU (for `DPK_CUDA_ARCH`, default sm_90) and a
  build directory made there (`DPK_BUILD_DIR`) can travel to the GPU machine.

Every build sees `kernels/_cuda/` (helpers shared by all families; the `_cuda/` beside the family folder of
its sources, so a second copy of the kernels builds against its own) on its include path, and its hash covers
the sources, every header of the family's folder and of that `_cuda/`, the flags and the toolchain, so a
rebuild happens exactly when one of them changes. An extension is imported under its name plus that hash, so
two builds of one extension (`dpk ab`'s two sides) live in one process.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import types
from collections.abc import Sequence
from pathlib import Path

import torch

from .paths import project_root
from .registry import Unavailable

DEFAULT_CUDA_FLAGS = ("-O3", "-lineinfo", "--expt-relaxed-constexpr")
HEADER_GLOBS = ("*.cuh", "*.h")


def cache_root() -> Path:
    return Path(os.environ.get("DPK_BUILD_DIR", Path.home() / ".cache" / "dpk" / "extensions"))


def shared_include_dir(source: Path | None = None) -> Path:
    """`kernels/_cuda/`: device helpers every family includes (async copies, barriers, PDL). For a build of
    `source`, the `_cuda/` beside its family folder when there is one, else the project's."""
    if source is not None and (beside := Path(source).resolve().parent.parent / "_cuda").is_dir():
        return beside
    return project_root() / "kernels" / "_cuda"


def nvcc_path() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and Path(home, "bin", "nvcc").exists():
        return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc")


@functools.cache
def nvcc_version() -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        return ""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1] if out else ""


def _arch_list() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def library_arch() -> str:
    """The `sm_XX` a plain nvcc library is built for: the present GPU's, else `$DPK_CUDA_ARCH` (sm_90)."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return os.environ.get("DPK_CUDA_ARCH", "sm_90")


def _digest(sources: Sequence[Path], flags: Sequence[str], toolchain: str) -> str:
    h = hashlib.sha256()
    headers = [p for d in {Path(sources[0]).parent, shared_include_dir(sources[0])} for g in HEADER_GLOBS
               for p in sorted(d.glob(g))]
    for p in [*sources, *sorted(set(headers))]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(flags).encode())
    h.update(toolchain.encode())
    return h.hexdigest()[:12]


_imported: dict[str, types.ModuleType] = {}  # module name (name + source hash) -> the imported extension


@functools.cache
def _load(name: str, sources: tuple[Path, ...], cuda_flags: tuple[str, ...]) -> types.ModuleType:
    from torch.utils import cpp_extension

    digest = _digest(sources, cuda_flags, torch.__version__)
    module = f"{name}_{digest}"  # bindings define PYBIND11_MODULE(TORCH_EXTENSION_NAME, m): this name
    if module in _imported:  # the same code from another folder (`dpk ab` of an unchanged extension)
        return _imported[module]
    build_dir = cache_root() / f"{name}-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_CUDA_ARCH_LIST"] = _arch_list()
    try:
        ext = cpp_extension.load(name=module, sources=[str(s) for s in sources], build_directory=str(build_dir),
                                 extra_cflags=["-O3"], extra_cuda_cflags=list(cuda_flags),
                                 extra_include_paths=[str(shared_include_dir(sources[0]))], verbose=False)
    except Exception as e:  # compiler errors come back as RuntimeError with the log in the message
        tail = "\n".join(str(e).strip().splitlines()[-12:])
        raise Unavailable(f"building extension {name} failed: {tail}") from e
    _imported[module] = ext
    return ext


def cuda_extension(name: str, sources: Sequence[Path], cuda_flags: Sequence[str] = DEFAULT_CUDA_FLAGS
                   ) -> types.ModuleType:
    """Build (once per source hash) and import a torch CUDA extension, or raise Unavailable saying why."""
    if torch.version.cuda is None:
        raise Unavailable("torch is a CPU build: CUDA extensions cannot be built")
    if not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU")
    if nvcc_path() is None:
        raise Unavailable("nvcc not found (put it on PATH or set CUDA_HOME)")
    missing = [str(s) for s in sources if not Path(s).exists()]
    if missing:
        raise Unavailable(f"missing sources: {missing}")
    return _load(name, tuple(Path(s).resolve() for s in sources), tuple(cuda_flags))


def build_library(name: str, sources: Sequence[Path], cuda_flags: Sequence[str] = DEFAULT_CUDA_FLAGS,
                  arch: str | None = None) -> Path:
    """Build (once per hash) `lib<name>.so` from `.cu` sources with plain nvcc; returns its path.

    Works without a GPU (CI compiles it; a build dir made here can travel to a GPU machine). The library
    links the CUDA runtime shared, so it shares the runtime (and streams, graphs) of the process's torch.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise Unavailable("nvcc not found (put it on PATH or set CUDA_HOME)")
    sources = [Path(s).resolve() for s in sources]
    missing = [str(s) for s in sources if not s.exists()]
    if missing:
        raise Unavailable(f"missing sources: {missing}")
    arch = arch or library_arch()
    flags = [*cuda_flags, f"-arch={arch}"]
    out_dir = cache_root() / f"{name}-{_digest(sources, flags, nvcc_version())}"
    lib = out_dir / f"lib{name}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".lib{name}.{os.getpid()}.so"
    rpath = Path(nvcc).resolve().parent.parent / "lib64"  # libcudart.so when no torch has loaded it already
    cmd = [nvcc, *flags, "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", f"-I{shared_include_dir(sources[0])}",
           "-Xlinker", f"-rpath={rpath}", *map(str, sources), "-o", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
        raise Unavailable(f"building library {name} failed: {tail}")
    tmp.replace(lib)  # atomic: a concurrent or interrupted build never leaves a half-written library
    return lib


def _cdll(path: str) -> ctypes.CDLL:
    """A CDLL object of its own per call (the same loaded library underneath): each caller declares its own
    argtypes, so `dpk ab`'s two sides, whose identical sources build one library, do not overwrite each other's."""
    return ctypes.CDLL(path)


def nvcc_library(name: str, sources: Sequence[Path], cuda_flags: Sequence[str] = DEFAULT_CUDA_FLAGS
                 ) -> ctypes.CDLL:
    """`build_library`, then load it; Unavailable without a CUDA GPU (it could be built, not run)."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU (the library builds here, but cannot run)")
    torch.cuda.init()  # the process's CUDA runtime is loaded before the library binds to it
    return _cdll(str(build_library(name, sources, cuda_flags)))


def nvcc_compile_check(source: Path, arch: str = "sm_90", extra: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """`nvcc -c` one kernel file for `arch` without torch: how CI proves the .cu files compile."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"dpk-check-{source.stem}-{os.getpid()}.o"
    try:
        return subprocess.run([nvcc, f"-arch={arch}", "-O3", f"-I{shared_include_dir(source)}", "-c", str(source),
                               "-o", str(out), *extra], capture_output=True, text=True, timeout=600)
    finally:
        out.unlink(missing_ok=True)
