"""gn_mish family checks: suite shapes vs the U-Net, bad input, Triton parity, tolerance tightness, numerics.

The generic tests (every variant on every smoke case through the parity engine) live elsewhere; these are the
family-specific ones. The fused kernel's planner is compiled for the host with nvcc and checked here; GPU-only
tests (every tier-0 design and tier-1 knob set, extreme z, graph capture) skip on a CPU machine.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

import dpk
from dpk.build import nvcc_path
from dpk.cases import load_suite_file
from dpk.tolerance import unit_roundoff

from ._helpers import CUDA_TESTS, ROOT, gpu_test, nvcc_build, ptxas_build, pusht_unet

FAMILY = "gn_mish"
HOST_FLAGS = ["-O2", "-std=c++17"]  # tests/cuda/gn_mish_plan_*.cu: the planner built for the host
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()


def _load_tune():
    """kernels/gn_mish/_tune.py by path (it imports only the standard library at import time)."""
    spec = importlib.util.spec_from_file_location("gn_mish_tune", ROOT / "kernels" / FAMILY / "_tune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TUNE = _load_tune()


@pytest.fixture(scope="module")
def registry() -> dpk.registry.Registry:
    return dpk.registry.load([ROOT / "kernels"], strict=True)


@pytest.fixture(scope="module")
def fam(registry):
    return registry.family(FAMILY)


@pytest.fixture(scope="module")
def suites() -> dict[str, list[dpk.Case]]:
    return load_suite_file(ROOT / "suites" / f"{FAMILY}.yaml").suites


def family_module(registry, name: str):
    return importlib.import_module(f"dpk.families.{FAMILY}.{name}")


def smoke_case(suites, name: str, dtype: str = "float32") -> dpk.Case:
    return next(c for c in suites["smoke"] if c.name == name and c.dtype == dtype)


def assert_within(out: torch.Tensor, ref: torch.Tensor, tol: dpk.Tolerance) -> None:
    err = (out.double().cpu() - ref.cpu()).abs()
    limit = tol.atol + tol.rtol * ref.cpu().abs()
    assert bool(torch.isfinite(out).all()), "non-finite output"
    worst = (err / limit).max().item()
    assert worst <= 1.0, f"max error/limit = {worst:.3g} ({tol.why})"


def _reference(fam, inputs: tuple) -> torch.Tensor:
    """The float64 oracle on a case's inputs (tensors upcast, G and eps as they are)."""
    return fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])


def exceeds(out: torch.Tensor, ref: torch.Tensor, tol: dpk.Tolerance) -> bool:
    return bool(((out.double() - ref).abs() > tol.atol + tol.rtol * ref.abs()).any())


# ---- suites ------------------------------------------------------------------------------------------------

def test_registry_has_all_variants(registry):
    names = {v.name for v in registry.variants_of(FAMILY)}
    assert names == {"eager", "compiled", "fused", "triton"}
    assert registry.baseline(FAMILY).name == "eager"


def test_pusht_suite_is_unet_groupnorms_at_batches_1_8_64(suites):
    _, norms = pusht_unet().walk()
    expected = {(b, n.channels, n.length, n.groups) for n in norms for b in (1, 8, 64)}
    cases = suites["pusht"]
    got = {(c["B"], c["C"], c["L"], c.get("G", 8)) for c in cases}
    assert got == expected
    assert len(cases) == len(expected), "a Push-T shape is listed twice"
    assert all(c.name.startswith(f"b{c['B']}_") for c in cases), "batch must be visible in the case name"


def test_smoke_triton_grids_are_tiny(suites):
    assert all(c["B"] * c.get("G", 8) <= 16 for c in suites["smoke"])


# ---- bad input ---------------------------------------------------------------------------------------------

def _good(B: int = 2, C: int = 8, L: int = 5, dtype: torch.dtype = torch.float32):
    return torch.randn(B, C, L, dtype=dtype), torch.randn(C, dtype=dtype), torch.randn(C, dtype=dtype)


def _bad_inputs():
    x, g, b = _good()
    return {
        "C not divisible by G": ((x, g, b, 3, 1e-5), ValueError, "divisible"),
        "gamma length": ((x, g[:7].contiguous(), b, 4, 1e-5), ValueError, "gamma must have shape"),
        "beta length": ((x, g, torch.randn(9), 4, 1e-5), ValueError, "beta must have shape"),
        "rank 2": ((x[0], g, b, 4, 1e-5), ValueError, "3-D"),
        "rank 4": ((x[..., None], g, b, 4, 1e-5), ValueError, "3-D"),
        "non-contiguous x": ((torch.randn(2, 5, 8).transpose(1, 2), g, b, 4, 1e-5), ValueError, "contiguous"),
        "non-contiguous gamma": ((x, torch.randn(16)[::2], b, 4, 1e-5), ValueError, "contiguous"),
        "mixed dtypes": ((x, g.double(), b, 4, 1e-5), TypeError, "mixed dtypes"),
        "unsupported dtype": ((x.double(), g.double(), b.double(), 4, 1e-5), TypeError, "unsupported dtype"),
        "integer dtype": ((x.int(), g.int(), b.int(), 4, 1e-5), TypeError, "unsupported dtype"),
        "wrong device": ((x, g.to("meta"), b, 4, 1e-5), ValueError, "different devices: x on cpu, gamma on meta"),
        "not a tensor": ((x.tolist(), g, b, 4, 1e-5), TypeError, "must be a torch.Tensor"),
        "groups not int": ((x, g, b, 4.0, 1e-5), TypeError, "groups must be an int"),
        "eps not positive": ((x, g, b, 4, 0.0), ValueError, "eps must be positive"),
        "empty batch": ((torch.randn(0, 8, 5), g, b, 4, 1e-5), ValueError, "non-empty"),
    }


BAD = _bad_inputs()


@pytest.mark.parametrize("what", list(BAD))
def test_shared_validator_rejects(registry, what):
    check_inputs = family_module(registry, "_checks").check_inputs
    args, exc, msg = BAD[what]
    with pytest.raises(exc, match=msg):
        check_inputs(*args, dtypes=(torch.float32, torch.float16, torch.bfloat16))


def _cpu_entry_points(registry) -> dict:
    points = {"eager": registry.variant(FAMILY, "eager").fn,
              # compiled validates before it compiles, so bad input fails fast even without a GPU
              "compiled": family_module(registry, "torch_variants").compiled_gn_mish}
    if HAS_TRITON and not HAS_CUDA:
        points["triton"] = registry.variant(FAMILY, "triton").fn
    return points


@pytest.mark.parametrize("what", list(BAD))
def test_cpu_variants_reject(registry, what):
    args, exc, msg = BAD[what]
    for fn in _cpu_entry_points(registry).values():
        with pytest.raises(exc, match=msg):
            fn(*args)


def test_gpu_variants_reject_cpu_tensors(registry):
    fused = family_module(registry, "cuda_variants")
    x, g, b = _good()
    with pytest.raises(ValueError, match="needs cuda tensors"):
        fused.fused_gn_mish(x, g, b, 4, 1e-5)
    if HAS_TRITON and HAS_CUDA:
        with pytest.raises(ValueError, match="needs cuda tensors"):
            registry.variant(FAMILY, "triton").fn(x, g, b, 4, 1e-5)


@pytest.mark.parametrize("shape,groups,msg", [((1, 8, 2**30 + 1), 8, "a group of 1073741825 elements"),
                                              ((2**27 + 1, 1, 1), 1, "B\\*G = 134217729 groups")])
def test_fused_limits_are_unavailable_not_errors(registry, monkeypatch, shape, groups, msg):
    """A valid shape beyond the fused kernel's indexing limits is a capability limit (dpk.Unavailable), checked
    before launch (meta tensors: the device check is lifted, the shapes are real)."""
    fused = _fused_module()
    checks = family_module(registry, "_checks")
    monkeypatch.setattr(fused, "check_inputs", lambda *a, **kw: checks.check_inputs(*a, **{**kw, "device_type": None}))
    x = torch.empty(shape, device="meta")
    gamma = torch.empty(shape[1], device="meta")
    with pytest.raises(dpk.Unavailable, match=msg):
        fused._check(x, gamma, gamma, groups, 1e-5)


# ---- Triton under the interpreter (or on the GPU) ----------------------------------------------------------

TRITON_CASES = [("b2_c24_l7_g8", "float32"), ("b2_c32_l1_g8", "bfloat16"), ("b1_c64_l16_g8", "float16"),
                ("b1_c16_l8_g4_smallvar", "float32")]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("name,dtype", TRITON_CASES)
@pytest.mark.parametrize("max_tile", [4096, 16])  # 16 forces the multi-tile (Chan merge) loop
def test_triton_matches_reference(registry, fam, suites, name, dtype, max_tile):
    kernel = family_module(registry, "_triton_kernels")
    case = smoke_case(suites, name, dtype)
    device = torch.device("cuda" if HAS_CUDA else "cpu")
    inputs = fam.make_inputs(case, device)
    out = kernel.gn_mish_triton(*inputs, max_tile=max_tile)
    assert out.dtype == inputs[0].dtype and out.shape == inputs[0].shape
    ref = _reference(fam, inputs)
    assert_within(out, ref, fam.tolerance(case, "float32"))


EXTREME_Z = [-1e4, -100.0, -30.0, -20.5, -5.0, -1e-3, 0.0, 1e-3, 2.5, 19.9, 20.1, 40.0, 89.0, 1e4]


def _extreme_z_inputs(device: torch.device):
    """gamma = 0 makes z = beta exactly: mish at extreme arguments (overflow, cut-off, underflow)."""
    C = len(EXTREME_Z)
    x = torch.randn(2, C * 2, 3, device=device)
    beta = torch.tensor(EXTREME_Z * 2, device=device)
    return x, torch.zeros(C * 2, device=device), beta, 2, 1e-5


def _check_extreme(out: torch.Tensor) -> None:
    z = torch.tensor(EXTREME_Z * 2, dtype=torch.float64)[None, :, None].expand(2, -1, 3)
    ref = F.mish(z)
    assert bool(torch.isfinite(out).all())
    assert torch.allclose(out.double().cpu(), ref, rtol=1e-5, atol=1e-30)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_triton_mish_is_stable_for_extreme_z(registry):
    kernel = family_module(registry, "_triton_kernels")
    _check_extreme(kernel.gn_mish_triton(*_extreme_z_inputs(torch.device("cuda" if HAS_CUDA else "cpu"))))


# ---- tolerance ---------------------------------------------------------------------------------------------

def _broken_gn_mish(x, gamma, beta, groups, eps, bug):
    """Plausible fp32 GroupNorm+Mish bugs: Bessel-corrected variance, eps outside the sqrt, E[x^2] - mean^2."""
    B, C, L = x.shape
    g = x.float().reshape(B, groups, -1)
    mean = g.mean(-1, keepdim=True)
    if bug == "one_pass_variance":
        var = (g * g).mean(-1, keepdim=True) - mean * mean
    else:
        var = g.var(-1, unbiased=(bug == "bessel"), keepdim=True)
    rstd = 1 / (var.sqrt() + eps) if bug == "eps_outside_sqrt" else torch.rsqrt(var + eps)
    z = ((g - mean) * rstd).reshape(B, C, L) * gamma[:, None] + beta[:, None]
    return F.mish(z)


@pytest.mark.parametrize("suite,names,bug", [
    ("pusht", ["b1_c256_l16_g8", "b1_c512_l8_g8", "b1_c1024_l4_g8", "b1_c512_l4_g8", "b1_c256_l8_g8"], "bessel"),
    ("smoke", ["b1_c16_l5_g4", "b2_c24_l7_g8", "b1_c6_l16_g6", "b1_c64_l16_g8"], "bessel"),
    ("smoke", ["b1_c16_l8_g4_smallvar", "b2_c32_l1_g8"], "eps_outside_sqrt"),
    ("smoke", ["b1_c16_l8_g4_offset"], "one_pass_variance"),
])
def test_tolerance_catches_plausible_bugs(fam, suites, registry, suite, names, bug):
    eager = registry.variant(FAMILY, "eager").fn
    for name in names:
        case = next(c for c in suites[suite] if c.name == name and c.dtype == "float32")
        inputs = fam.make_inputs(case, torch.device("cpu"))
        ref = fam.reference(*inputs)
        tol = fam.tolerance(case, "float32")
        assert_within(eager(*inputs), ref, tol)
        assert exceeds(_broken_gn_mish(*inputs, bug=bug), ref, tol), f"{bug} passes {case.id}: tolerance too loose"


def test_tolerance_grows_with_group_size_and_dtype(fam):
    small = dpk.make_case(FAMILY, "t", B=1, C=256, L=16, G=8)
    large = dpk.make_case(FAMILY, "t", B=1, C=2048, L=4096, G=8)
    bf16 = dpk.make_case(FAMILY, "t", "bfloat16", B=1, C=256, L=16, G=8)
    assert fam.tolerance(small, "float32").atol < fam.tolerance(large, "float32").atol
    assert fam.tolerance(small, "float32").rtol < fam.tolerance(bf16, "float32").rtol


def test_inputs_exercise_the_affine(fam):
    case = dpk.make_case(FAMILY, "t", B=1, C=64, L=4, G=8)
    _, gamma, beta, groups, eps = fam.make_inputs(case, torch.device("cpu"))
    assert gamma.std() > 0.3 and (gamma < 0).any() and beta.abs().max() > 0.3
    assert (groups, eps) == (8, 1e-5)


# ---- compiled ----------------------------------------------------------------------------------------------

def test_compiled_keeps_one_cache_per_shape(registry, fam):
    """More shapes than Dynamo's recompile limit must not fall back to eager (each shape has its own code)."""
    compiled = family_module(registry, "torch_variants")
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        for B, C, L in [(1, 16, 5), (2, 24, 7), (1, 32, 3)]:
            case = dpk.make_case(FAMILY, "t", B=B, C=C, L=L, G=4)
            inputs = fam.make_inputs(case, torch.device("cpu"))
            out = compiled.compiled_gn_mish(*inputs, backend="eager")
            assert_within(out, fam.reference(*inputs), fam.tolerance(case, "float32"))


# ---- fused: plan knobs and the host-compiled planner (CPU) ----------------------------------------------------

def _fused_module():
    return importlib.import_module(f"dpk.families.{FAMILY}.cuda_variants")




@pytest.mark.parametrize("knobs,exc,msg", [
    ({"t0_threads": 48}, ValueError, "power of two"),
    ({"t0_threads": 2048}, ValueError, "power of two"),
    ({"t0_threads": 256, "t0_groups_per_cta": 8}, ValueError, "t0_groups_per_cta"),
    ({"t1_threads": 100}, ValueError, "multiple of 32"),
    ({"t1_items": -1}, ValueError, "t1_items"),
    ({"t1_ctas_per_sm": 33}, ValueError, "t1_ctas_per_sm"),
    ({"max_threads": 16}, ValueError, "max_threads"),
    ({"max_cluster": 0}, ValueError, "max_cluster"),
    ({"t1_persistent": 2}, ValueError, "t1_persistent"),
    ({"t1_stash": -2}, ValueError, "t1_stash"),
    ({"t2": 2}, ValueError, "t2=2"),
    ({"t2_ctas": 33}, ValueError, "t2_ctas"),
    ({"t3": 2}, ValueError, "t3=2"),
    ({"t3_ctas": 257}, ValueError, "t3_ctas"),
    ({"t3_reducers": 17}, ValueError, "t3_reducers"),
    ({"t3_depth": -1}, ValueError, "t3_depth"),
    ({"t0_threads": 64.0}, TypeError, "must be an int"),
])
def test_tuning_rejects_bad_knobs(registry, knobs, exc, msg):
    with pytest.raises(exc, match=msg):
        _fused_module().Tuning(**knobs)


def test_tuning_labels_and_order(registry):
    tuning = _fused_module().Tuning
    assert tuning().label() == "default"
    assert tuning(t0_threads=128, t1_ctas_per_sm=2).label() == "t0_threads=128,t1_ctas_per_sm=2"
    # the binding reads the list in the field order of gn_mish.cuh's Limits
    header = (ROOT / "kernels" / FAMILY / "gn_mish.cuh").read_text()
    body = header[header.index("struct Limits {"):]
    body = body[:body.index("};")]
    fields = [line.split("=")[0].split()[-1] for line in body.splitlines()[1:] if "=" in line.split("//")[0]]
    assert fields == [f.name for f in dataclasses.fields(tuning)]
    knobs = [64, 2, 32, 1, 128, 4, 3, 1, -1, 1, 7, 2, 1, 64, 4, 2]
    assert tuning(*knobs).as_list() == knobs
    binding = (ROOT / "kernels" / FAMILY / "binding.cpp").read_text()
    assert re.findall(r"&lim\.(\w+)", binding) == fields, "the binding reads the knobs in Limits order"



def test_tune_configs_are_valid(registry):
    tune, tuning = TUNE, _fused_module().Tuning
    for knobs in [*tune.TIER0_CONFIGS.values(), *tune.TIER1_CONFIGS.values(), *tune.GRID_CONFIGS.values(),
                  *tune.SPREAD_CONFIGS.values()]:
        tuning(**knobs)
    assert all(suite in ("pusht", "sweep") for suite, _, _ in tune.PUSHT_SHAPES + tune.LARGE_SHAPES + tune.B8_SHAPES)


def test_fused_rejects_a_non_tuning(registry):
    x, g, b = _good()
    with pytest.raises(TypeError, match=r"cuda_variants\.Tuning"):
        _fused_module().fused_gn_mish(x, g, b, 4, 1e-5, tuning={"t0_threads": 64})


def _plan_knobs(tune) -> list[list[int]]:
    """Every knob set the variant, the tests and _tune.py use, plus a grid over each knob's range."""
    tuning = _fused_module().Tuning
    configs = (tune.TIER0_CONFIGS, tune.TIER1_CONFIGS, tune.STASH_CONFIGS, tune.WIDE_CONFIGS, tune.GRID_CONFIGS,
               tune.SPREAD_CONFIGS)
    sets = [tuning(), *(tuning(**k) for c in configs for k in c.values())]
    sets += [tuning(max_threads=t, max_cluster=c, t2=t2) for _, _, t, c, t2, *_ in FUSED_PATHS]
    sets += [tuning(t0_threads=t, t0_groups_per_cta=g) for t in (32, 64, 128, 256, 512, 1024) for g in (0, 1, 3, 4)
             if t * g <= 1024]
    sets += [tuning(max_threads=mt, max_cluster=mc, t1_threads=t, t1_items=i, t1_ctas_per_sm=r)
             for mt in (1024, 256) for mc in (16, 4, 1) for t in (0, 96, 512, 1024) for i in (0, 4) for r in (0, 3)]
    sets += [tuning(max_cluster=mc, t1_threads=t, t1_ctas_per_sm=r, t1_persistent=1)
             for mc in (16, 8, 1) for t in (0, 128, 512) for r in (0, 2)]
    sets += [tuning(max_threads=mt, max_cluster=mc, t1_threads=t, t1_ctas_per_sm=r, t1_stash=st)
             for mt in (1024, 256) for mc in (16, 2, 1) for t in (0, 96, 1024) for r in (0, 2) for st in (-1, 1, 5)]
    sets += [tuning(max_threads=mt, t1_threads=t, t1_items=i, t1_ctas_per_sm=r, t1_stash=st, t2=t2, t2_ctas=s)
             for mt in (1024, 256) for t in (0, 96, 512) for i in (0, 4) for r in (0, 2) for st in (-1, 0, 3)
             for t2 in (-1, 1) for s in (0, 1, 3, 32)]
    sets += [tuning(max_threads=mt, max_cluster=mc, t1_threads=t, t1_ctas_per_sm=r, t1_smem=m, t2=t2)
             for mt in (1024, 256) for mc in (16, 4, 1) for t in (0, 64, 96, 256) for r in (0, 3) for m in (-1, 1, 2)
             for t2 in (-1, 0)]
    sets += [tuning(max_threads=mt, t1_threads=t, t3=t3, t3_ctas=c, t3_reducers=r, t3_depth=d)
             for mt in (1024, 128) for t in (0, 96, 512) for t3 in (-1, 1) for c in (0, 1, 7, 64, 256)
             for r in (0, 1, 3, 16) for d in (0, 2)]
    return [s.as_list() for s in dict.fromkeys(sets)]


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_planner_covers_every_vector_once(suites, registry, tmp_path):
    """The real planner (gn_mish_plan.cuh) compiled for the host; the kernels' index loops replayed on its plans."""
    exe = tmp_path / "plan_check"
    nvcc_build(exe, [CUDA_TESTS / "gn_mish_plan_check.cu"], HOST_FLAGS, FAMILY)
    shapes = {(c["B"], c["C"], c["L"], c.get("G", 8)) for cases in suites.values() for c in cases}
    shapes |= {(3, 1000, 1, 1), (2, 48, 7, 3), (1, 4096, 1, 4096), (5, 12, 1001, 2), (1, 8, 131075, 1)}
    knobs = _plan_knobs(TUNE)
    lines = [f"{len(shapes)} {len(knobs)}", *(" ".join(map(str, s)) for s in sorted(shapes)),
             *(" ".join(map(str, k)) for k in knobs)]
    run = subprocess.run([str(exe)], input="\n".join(lines), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]
    counts = re.search(r"checked (\d+) plans \((\d+) persistent, (\d+) streaming, (\d+) stashed, (\d+) tier 2, "
                       r"(\d+) in shared memory, (\d+) tier 3", run.stdout)
    checked, persistent, streaming, stashed, grid, in_smem, spread = map(int, counts.groups())
    assert checked >= len(shapes) * len(knobs) * 5 and min(persistent, streaming, stashed, grid, in_smem) > 1000, \
        run.stdout
    assert spread > 500, run.stdout


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_static_shared_memory_within_the_planner_bounds():
    """Every kernel's static shared memory (ptxas, sm_90) stays within the bound the planner subtracts from the opt-in
    maximum before sizing dynamic shared memory (a larger static part makes cudaFuncSetAttribute refuse the size and
    the launch fail). One extern array's alignment pads every kernel of the file: tier 3's first __align__(128) put
    the cluster kernel at 768 B, past kStaticSmemBound = 672, and 3 tier-1 GPU tests failed to launch."""
    run = ptxas_build(ROOT / "kernels" / FAMILY / "gn_mish.cu")
    assert run.returncode == 0, run.stderr[-3000:]
    plan = (ROOT / "kernels" / FAMILY / "gn_mish_plan_base.cuh").read_text()
    bound = {name: int(re.search(rf"constexpr int {name} = (\d+);", plan).group(1))
             for name in ("kStaticSmemBound", "kPersistentStaticSmem", "kSpreadStaticSmem")}
    kernel_bound = {"gn_mish_cluster_kernel": "kStaticSmemBound", "gn_mish_grid_kernel": "kStaticSmemBound",
                    "gn_mish_smem_kernel": "kStaticSmemBound", "gn_mish_persistent_kernel": "kPersistentStaticSmem",
                    "gn_mish_spread_kernel": "kSpreadStaticSmem"}
    seen = set()
    for kernel, smem in re.findall(r"entry function '_ZN7gn_mish6detail\d+(\w+?)I.*?(\d+) bytes smem", run.stderr,
                                   flags=re.S):
        if kernel in kernel_bound:
            seen.add(kernel)
            assert int(smem) <= bound[kernel_bound[kernel]], (kernel, smem, kernel_bound[kernel])
    assert seen == set(kernel_bound), seen


# The default plan on the H200 vs _tune.py's measurements there (graph mode for tier 0, cold for tier 1; us):
# shape -> (the _tune.py configuration whose plan the default must equal, its time, the best time and config),
# then the plan (tier, threads, group threads, groups per CTA, cluster, items, chunks, grid, stash, smem_slice).
# Rule: NOTES.md.
H200_DEFAULTS = {
    "b1_c256_l16_g8": ("t0=128", 1.81, 1.81, "t0=128", (0, 128, 128, 1, 1, 1, 1, 8, 0, 0)),
    "b1_c512_l8_g8": ("t0=128", 1.77, 1.77, "t0=128", (0, 128, 128, 1, 1, 1, 1, 8, 0, 0)),
    "b1_c1024_l4_g8": ("t0=128", 1.86, 1.79, "t0=128,2/cta", (0, 128, 128, 1, 1, 1, 1, 8, 0, 0)),
    "b1_c512_l4_g8": ("t0=64,2/cta", 1.74, 1.71, "t0=64", (0, 128, 64, 2, 1, 1, 1, 4, 0, 0)),
    "b1_c256_l8_g8": ("t0=64,2/cta", 1.67, 1.67, "t0=64,2/cta", (0, 128, 64, 2, 1, 1, 1, 4, 0, 0)),
    "b64_c256_l16_g8": ("t0=64,2/cta", 2.25, 2.25, "t0=64,2/cta", (0, 128, 64, 2, 1, 2, 1, 256, 0, 0)),
    "b64_c512_l4_g8": ("warp", 2.01, 2.01, "warp", (0, 128, 32, 4, 1, 2, 1, 128, 0, 0)),
    "b64_c512_l1024_g8": ("t1=256", 86.94, 86.94, "default", (1, 256, 0, 1, 8, 8, 1, 4096, 0, 1)),
    "b64_c1024_l1024_g8": ("k<=4,t1=512", 166.98, 166.98, "k<=4,t1=512", (1, 512, 0, 1, 4, 8, 2, 2048, 0, 0)),
    "b64_c2048_l1024_g8": ("k<=8,t1=512", 329.70, 329.70, "k<=8,t1=512", (1, 512, 0, 1, 8, 8, 2, 4096, 0, 0)),
    "b16_c1024_l2048_g8": ("k<=8,t1=512", 92.74, 92.74, "k<=8,t1=512", (1, 512, 0, 1, 8, 8, 2, 1024, 0, 0)),
    # tier 2 (_tune.py --only grid at 55c48d4, H200): 8 CTAs per group, 16 groups in flight, 4 rounds
    "b8_c2048_l4096_g8": ("t2,s=8", 177.50, 177.50, "t2,s=8", (2, 1024, 0, 1, 8, 8, 4, 128, 14, 0)),
    "b8_c256_l1024_g8": ("k<=2,t1=512", 11.01, 11.01, "k<=2,t1=512", (1, 512, 0, 1, 2, 8, 1, 128, 0, 0)),
    "b8_c512_l1024_g8": ("k<=2,t1=1024", 14.85, 14.85, "k<=2,t1=1024", (1, 1024, 0, 1, 2, 8, 1, 128, 0, 0)),
    "b8_c1024_l1024_g8": ("k<=2,t1=1024", 25.86, 25.86, "k<=2,t1=1024", (1, 1024, 0, 1, 2, 8, 2, 128, 0, 0)),
    "b8_c2048_l1024_g8": ("default", 41.50, 41.50, "default", (1, 1024, 0, 1, 2, 8, 4, 128, 14, 0)),  # stash
    # tier 3 (gn_mish_ab_spread.py on an H100, cold, against tier 2's 12.43 us): every CTA a piece of every group;
    # since then on 128 CTAs, not 132 (gn_mish_ab_overlay.py, H100s: 0.994-1.000 of 132 here)
    "b1_c2048_l1024_g8": ("t3", 11.78, 11.78, "t3", (3, 1024, 0, 1, 1, 6, 1, 128, 0, 0)),
}


H200_L2, H100_L2 = 62914560, 52428800  # bytes, as torch reports them on the lent machines


@pytest.fixture(scope="module")
def plan_printer(tmp_path_factory):
    """The host-compiled planner as a function ((B, C, L, G), vec, knobs) -> plan tuple (H200-like device; l2_bytes
    H100_L2 for an H100's L2)."""
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    exe = tmp_path_factory.mktemp("plan_print") / "plan_print"
    nvcc_build(exe, [CUDA_TESTS / "gn_mish_plan_print.cu"], HOST_FLAGS, FAMILY)

    def plans(queries: list[tuple[tuple[int, int, int, int], int, list[int]]], l2_bytes: int = H200_L2) \
            -> list[tuple[int, ...]]:
        lines = [" ".join(map(str, [*shape, vec, *knobs])) for shape, vec, knobs in queries]
        run = subprocess.run([str(exe), str(l2_bytes)], input="\n".join(lines), capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
        return [tuple(map(int, line.split())) for line in run.stdout.splitlines()]

    return plans


def _shape(name: str) -> tuple[int, int, int, int]:
    B, C, L, G = map(int, re.fullmatch(r"b(\d+)_c(\d+)_l(\d+)_g(\d+)", name).groups())
    return B, C, L, G


def test_default_plan_is_the_h200_tune_best(registry, plan_printer):
    """The default plan (the registered variant's) equals the plan of the _tune.py configuration that was best on
    the H200, or within 4 % of the best (b1_c1024_l4: 1.86 vs 1.79 us), on every tuned shape; fp32, 16-byte vectors."""
    tuning = _fused_module().Tuning
    tuned = [name for _, name, _ in TUNE.PUSHT_SHAPES + TUNE.LARGE_SHAPES + TUNE.B8_SHAPES]
    assert set(H200_DEFAULTS) <= set(tuned)
    configs = {**TUNE.TIER0_CONFIGS, **TUNE.TIER1_CONFIGS, **TUNE.GRID_CONFIGS, **TUNE.SPREAD_CONFIGS}
    queries = []
    for name, (label, *_rest) in H200_DEFAULTS.items():
        queries += [(_shape(name), 4, tuning().as_list()), (_shape(name), 4, tuning(**configs[label]).as_list())]
    plans = plan_printer(queries)
    for i, (name, (label, us, best_us, best_label, expected)) in enumerate(H200_DEFAULTS.items()):
        default, measured = plans[2 * i], plans[2 * i + 1]
        assert default == expected, (name, default)
        if label != "default":
            assert default == measured, (name, label, default, measured)
        assert us <= 1.04 * best_us, (name, label, best_label)


def test_default_plan_rule_beyond_the_tuned_shapes(registry, plan_printer):
    """The rule's regimes (NOTES.md): tier 0 one vector per thread up to 132 groups, two beyond, 128-thread CTAs;
    tier 1 with 2 * groups <= SMs: clusters of <= 8, <= one CTA per SM (streaming as many chunks as it takes); else
    256-thread CTAs in clusters of <= 8 holding the group, or clusters of <= 8 CTAs of 512 threads streaming (2 chunks
    where 8 CTAs suffice); tier 2's regimes, including 16-bit 1024-thread CTAs in half chunks, 16-bit plans that
    tier 1 would stream and one-wave plans whose clusters do not fit, where tier 2 holds every group at once."""
    default = _fused_module().Tuning().as_list()
    # (B, C, L, G), vec -> plan (tier, threads, group threads, groups per CTA, cluster, items, chunks, grid, stash,
    # smem_slice)
    cases = {
        ((8, 256, 16, 8), 4): (0, 128, 128, 1, 1, 1, 1, 64, 0, 0),      # 64 groups <= 132 SMs: 1 vector per thread
        ((17, 256, 16, 8), 4): (0, 128, 64, 2, 1, 2, 1, 68, 0, 0),      # 136 groups > 132: 2 per thread
        ((1, 64, 16, 8), 4): (0, 128, 32, 4, 1, 1, 1, 2, 0, 0),         # n = 128: a warp per group, 4 per CTA
        ((1, 1024, 8, 8), 4): (0, 256, 256, 1, 1, 1, 1, 8, 0, 0),       # n = 1024 (256 vectors): a 256-thread CTA
        ((64, 512, 1024, 8), 8): (1, 256, 0, 1, 4, 8, 1, 2048, 0, 1),  # bf16: 64 elements, fp32's 128 bytes per
        # thread; 2048 CTAs > one wave of 528 register-kernel CTAs: the slice in shared memory
        ((64, 256, 1024, 8), 4): (1, 256, 0, 1, 4, 8, 1, 2048, 0, 1),  # fp32, the same
        ((66, 256, 256, 8), 4): (1, 256, 0, 1, 1, 8, 1, 528, 0, 0),    # 528 CTAs: one wave, registers
        ((67, 256, 256, 8), 4): (1, 256, 0, 1, 1, 8, 1, 536, 0, 1),    # 536: more than one wave
        ((8, 512, 1024, 8), 4): (1, 1024, 0, 1, 2, 8, 1, 128, 0, 0),    # 64 groups: 2 x 1024 on 128 SMs
        ((1, 256, 1024, 8), 4): (1, 256, 0, 1, 8, 4, 1, 64, 0, 0),      # few, < 64K vectors: tier 1 in half chunks,
        ((1, 512, 1024, 8), 4): (1, 512, 0, 1, 8, 4, 1, 64, 0, 0),      # 8 x 256 / 8 x 512 hold it; 8 x 1024 would be
        ((1, 1024, 1024, 8), 4): (1, 512, 0, 1, 8, 8, 1, 64, 0, 0),     # needed: full chunks, 16 x 256 > K: 8 x 512
        ((8, 256, 1024, 8), 4): (1, 512, 0, 1, 2, 8, 1, 128, 0, 0),     # 64 groups, K <= 2: full chunks
        ((1, 2048, 1024, 8), 4): (3, 1024, 0, 1, 1, 6, 1, 128, 0, 0),  # 64K vectors, 8 groups <= SMs / 16, 8 MB on
        # chip: tier 3, 128 CTAs of 1024 threads (8 group warps, 24 store warps: 3 per group, 6 vectors each)
        ((1, 2048, 1024, 8), 8): (1, 512, 0, 1, 8, 8, 1, 64, 0, 0),     # bf16: 32K vectors, tier 1
        ((8, 2048, 4096, 8), 4): (2, 1024, 0, 1, 8, 8, 4, 128, 14, 0),  # fp32, tier 1 would re-read 251 MB: tier 2,
        # S = 8: 10 of 32 vectors per thread re-read (21 MB in flight <= L2 / 2), 16 groups in flight
        ((8, 2048, 4096, 8), 8): (2, 1024, 0, 1, 4, 4, 8, 132, 14, 0),  # bf16, tier 1 would re-read 117 MB: tier
        # 2, S = 4 (33 slots, 2 rounds), 4 vectors of 8 per chunk, 14 of 32 slots stashed
        ((16, 1024, 2048, 8), 8): (2, 1024, 0, 1, 1, 4, 8, 128, 14, 0),  # bf16: tier 1 would stream 2 chunks and
        # tier 2 holds all 128 groups at once (S = 1, one round): tier 2
        ((16, 1024, 4096, 8), 8): (1, 512, 0, 1, 8, 8, 2, 1024, 0, 0),  # bf16, tier 2 would take 2 rounds: tier 1
        ((8, 1024, 1024, 8), 8): (1, 1024, 0, 1, 2, 8, 1, 128, 0, 0),   # bf16, one chunk: tier 1
        ((6, 1024, 2048, 8), 8): (1, 1024, 0, 1, 2, 8, 2, 96, 0, 0),    # bf16 streaming, but tier 2's one round would
        # fill 96 of 132 SMs: tier 1
        ((4, 1024, 4096, 8), 4): (2, 1024, 0, 1, 4, 8, 4, 128, 14, 0),  # fp32: 32 clusters of 4 x 1024 meant as one
        # wave, but only 120 of the 128 CTAs fit at once; tier 2 holds them all: tier 2
        ((3, 1024, 4096, 8), 4): (1, 1024, 0, 1, 4, 8, 4, 96, 14, 0),   # fp32, 96 CTAs fit: tier 1
        ((1, 2048, 4096, 8), 4): (2, 1024, 0, 1, 16, 8, 2, 128, 8, 0),  # 32 MB not on chip: tier 2, 16 x 1024,
        # registers + 8 stash slots
        ((1, 2048, 4096, 8), 8): (3, 1024, 0, 1, 1, 11, 1, 128, 0, 0),  # bf16, 16 MB on chip: tier 3
        ((16, 1024, 2048, 8), 4): (1, 512, 0, 1, 8, 8, 2, 1024, 0, 0),  # 128 groups: many, streaming 8 x 512
        ((64, 2048, 2048, 8), 4): (1, 512, 0, 1, 8, 8, 4, 4096, 14, 0),  # beyond 8 x 512 x 2 chunks: K = 8, 4 chunks;
        # 264 CTAs in flight re-read 52 MB > L2 / 2 and keep 30 MB of it in shared memory: stash 14 of 24 (not timed)
        ((64, 256, 256, 8), 4): (1, 256, 0, 1, 1, 8, 1, 512, 0, 0),     # n = 8192: one 256-thread CTA per group
        ((12, 256, 256, 8), 4): (1, 256, 0, 1, 2, 8, 1, 192, 0, 0),     # 96 groups < SMs, one CTA each: split in two
        ((8, 512, 4096, 8), 4): (1, 1024, 0, 1, 2, 8, 4, 128, 14, 0),  # re-reads 50 MB > L2 / 2: stash 14 of 24
    }
    plans = plan_printer([(shape, vec, default) for shape, vec in cases])
    for (key, expected), plan in zip(cases.items(), plans):
        assert plan == expected, (key, plan)
    # an explicit t1_items keeps its chunks: 8 vectors per thread asked, 4 of them used
    full = _fused_module().Tuning(t1_items=8).as_list()
    assert plan_printer([((1, 256, 1024, 8), 4, full)]) == [(1, 256, 0, 1, 8, 8, 1, 64, 0, 0)]


def test_tier2_rounds_balanced_over_the_slots(registry, plan_printer):
    """Tier 2 over several rounds takes, from the L2 rule's S up to 2 S, the S with the fewest rounds per CTA of the
    group (NOTES.md, "Round balance"): on an H100's 50 MB L2 the rule's S = 5 for bf16 b8_c2048_l4096 (26 slots, 3
    rounds: 0.6) becomes S = 6 (22 slots, 3 rounds: 0.5; 132.3 -> 121.2 us measured); on the H200's 60 MB the rule's
    S = 4 (33 slots, 2 rounds) and fp32's S = 8 stay, as do one-round plans and an explicit t2_ctas; beyond the suite,
    fp32 b5_c1024_l4096 moves from S = 4 to 6 on both (H100: 84.3 -> 68.6 us)."""
    default = _fused_module().Tuning().as_list()
    s5 = _fused_module().Tuning(t2_ctas=5).as_list()
    no_t3 = _fused_module().Tuning(t3=-1).as_list()
    cases = [  # (shape, vec, knobs, L2) -> plan (tier, threads, group threads, groups per CTA, S, items, chunks, grid,
        # stash, smem_slice)
        (((8, 2048, 4096, 8), 8, default, H100_L2), (2, 1024, 0, 1, 6, 4, 6, 132, 14, 0)),
        (((8, 2048, 4096, 8), 8, s5, H100_L2), (2, 1024, 0, 1, 5, 4, 7, 130, 14, 0)),  # t2_ctas: as given
        (((8, 2048, 4096, 8), 8, default, H200_L2), (2, 1024, 0, 1, 4, 4, 8, 132, 14, 0)),
        (((8, 2048, 4096, 8), 4, default, H100_L2), (2, 1024, 0, 1, 8, 8, 4, 128, 14, 0)),
        (((1, 2048, 1024, 8), 4, no_t3, H100_L2), (2, 512, 0, 1, 16, 8, 1, 128, 0, 0)),  # one round
        # fp32 b5_c1024_l4096, either L2: S = 4 (33 slots, 2 rounds of 40 groups: 0.5) -> 6 (22 slots, 2 rounds: 0.33)
        (((5, 1024, 4096, 8), 4, default, H200_L2), (2, 1024, 0, 1, 6, 8, 3, 132, 14, 0)),
    ]
    for l2 in (H100_L2, H200_L2):
        mine = [(query, expected) for (*query, size), expected in cases if size == l2]
        plans = plan_printer([query for query, _ in mine], l2)
        for ((shape, vec, _), expected), plan in zip(mine, plans, strict=True):
            assert plan == expected, (shape, vec, l2, plan)


def test_tier3_default_rule(registry, plan_printer):
    """Tier 3 by default (NOTES.md, "Tier 3"): B = 1 (8 groups on 132 SMs) of >= 64K vectors per group whose x fits
    in shared memory; not for smaller groups (tier 1), more groups (B = 2), x beyond the chip (fp32 b1_c2048_l4096,
    32 MB), scalar vectors, or where t2 or t3 is set; t3 = 1 forces it wherever it fits, with its knobs."""
    tuning = _fused_module().Tuning
    cases = [  # (shape, vec, knobs) -> (tier, threads, group threads, groups per CTA, cluster, items, chunks, grid,
        # stash, smem_slice)
        (((1, 2048, 1024, 8), 4, {}), (3, 1024, 0, 1, 1, 6, 1, 128, 0, 0)),  # 128 CTAs: a power of two <= SMs
        (((1, 512, 4096, 8), 4, {}), (3, 1024, 0, 1, 1, 6, 1, 128, 0, 0)),
        (((1, 2048, 4096, 8), 8, {}), (3, 1024, 0, 1, 1, 11, 1, 128, 0, 0)),
        (((1, 1024, 1024, 8), 4, {}), (1, 512, 0, 1, 8, 8, 1, 64, 0, 0)),     # 32K vectors: tier 1
        (((2, 2048, 1024, 8), 4, {}), (2, 1024, 0, 1, 8, 8, 1, 128, 0, 0)),   # 16 groups: tier 2
        (((1, 2048, 4096, 8), 4, {}), (2, 1024, 0, 1, 16, 8, 2, 128, 8, 0)),  # 32 MB: tier 2
        (((1, 2048, 1024, 8), 1, {}), (2, 1024, 0, 1, 16, 8, 2, 128, 0, 0)),  # scalar: tier 2
        (((1, 2048, 1024, 8), 4, {"t2": 1}), (2, 512, 0, 1, 16, 8, 1, 128, 0, 0)),
        (((1, 2048, 1024, 8), 4, {"t3": -1}), (2, 512, 0, 1, 16, 8, 1, 128, 0, 0)),
        (((1, 2048, 1024, 8), 4, {"t2": -1}), (1, 1024, 0, 1, 8, 8, 1, 64, 0, 0)),
        (((1, 1024, 1024, 8), 4, {"t3": 1}), (3, 1024, 0, 1, 1, 3, 1, 128, 0, 0)),
        (((1, 1024, 1024, 8), 4, {"t3": 1, "t3_ctas": 132}), (3, 1024, 0, 1, 1, 3, 1, 132, 0, 0)),  # one per SM
        (((4, 512, 1024, 8), 4, {"t3": 1, "t3_ctas": 64, "t3_reducers": 4}), (3, 1024, 0, 1, 1, 8, 1, 64, 0, 0)),
        (((1, 2048, 1024, 8), 4, {"t3": 1, "t1_threads": 512}), (3, 512, 0, 1, 1, 16, 1, 128, 0, 0)),
        (((5, 2048, 1024, 8), 4, {"t3": 1}), (1, 1024, 0, 1, 2, 8, 4, 80, 0, 0)),  # 40 groups > 32: not tier 3
    ]
    plans = plan_printer([(shape, vec, tuning(**knobs).as_list()) for (shape, vec, knobs), _ in cases])
    for ((shape, vec, knobs), expected), plan in zip(cases, plans, strict=True):
        assert plan == expected, (shape, vec, knobs, plan)


# ---- fused CUDA kernel (GPU only) --------------------------------------------------------------------------

FUSED_PATHS = [  # (case name, dtype, max_threads, max_cluster, t2, expected tier, expect chunks > 1)
    ("b1_c64_l16_g8", "float32", 1024, 16, 0, 0, False),
    ("b2_c24_l7_g8", "bfloat16", 1024, 16, 0, 0, False),
    ("b1_c8_l600_g1", "float32", 1024, 16, 1, 2, False),  # tier 2: one group over 32 CTAs
    ("b1_c8_l600_g1", "float32", 1024, 16, 0, 1, False),  # the default: 1200 vectors, tier 1
    ("b1_c8_l600_g1", "float16", 1024, 1, -1, 1, False),
    ("b1_c8_l600_g1", "float32", 32, 2, -1, 1, True),
    ("b1_c8_l600_g1", "bfloat16", 64, 1, -1, 1, True),
    ("b1_c8_l600_g1", "float32", 32, 16, 1, 2, False),  # 32 one-warp CTAs
]


def _run_fused(fam, case, tuning):
    fused = _fused_module()
    inputs = fam.make_inputs(case, torch.device("cuda"))
    plan = fused.fused_plan(inputs[0], inputs[3], tuning)
    out = fused.fused_gn_mish(*inputs, tuning=tuning)
    assert_within(out, _reference(fam, inputs), fam.tolerance(case, "float32"))
    return plan


def _back_to_back(fam, runs, seed: int) -> None:
    """Launches (B, knobs, stream) one after another, C = 64, L = 2000, fresh inputs each (seed + i, offset i): each
    takes the tier its knobs ask for (3 with t3, else 2) and matches the reference."""
    fused = _fused_module()
    for i, (B, knobs, stream) in enumerate(runs):
        case = dpk.make_case(FAMILY, f"r{i}", B=B, C=64, L=2000, G=8, seed=seed + i, xoffset=float(i))
        inputs = fam.make_inputs(case, torch.device("cuda"))
        tuning = fused.Tuning(**knobs)
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            out = fused.fused_gn_mish(*inputs, tuning=tuning)
        torch.cuda.synchronize()
        assert fused.fused_plan(inputs[0], inputs[3], tuning)["tier"] == (3 if "t3" in knobs else 2)
        assert_within(out, _reference(fam, inputs), fam.tolerance(case, "float32"))


@gpu_test
@pytest.mark.parametrize("name,dtype,threads,cluster,t2,tier,streams", FUSED_PATHS)
def test_fused_paths_match_reference(registry, fam, suites, name, dtype, threads, cluster, t2, tier, streams):
    plan = _run_fused(fam, smoke_case(suites, name, dtype), _fused_module().Tuning(max_threads=threads,
                                                                                   max_cluster=cluster, t2=t2))
    assert plan["tier"] == tier and (plan["chunks"] > 1) == streams, plan


TIER0_DESIGNS = [(32, 0), (32, 1), (64, 0), (128, 0), (64, 2), (128, 2), (256, 1), (1024, 1), (32, 8)]


@gpu_test
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("threads,per_cta", TIER0_DESIGNS)
def test_fused_tier0_designs_match_reference(registry, fam, suites, threads, per_cta, dtype):
    """Every tier-0 CTA shape on every smoke and Push-T shape (tier 0 ones), in each dtype."""
    tuning = _fused_module().Tuning(t0_threads=threads, t0_groups_per_cta=per_cta)
    cases = [c for c in suites["smoke"] if c.dtype == dtype] + [
        dpk.make_case(FAMILY, c.name, dtype, seed=c.seed, **dict(c.params)) for c in suites["pusht"]]
    tier0 = 0
    for case in cases:
        plan = _run_fused(fam, case, tuning)
        if plan["tier"] == 0:
            tier0 += 1
            assert plan["group_threads"] == threads, plan
    assert tier0 >= len(suites["pusht"]), "the Push-T shapes must all take tier 0"


@gpu_test
@pytest.mark.parametrize("label", list(TUNE.TIER1_CONFIGS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_tier1_knobs_match_reference(registry, fam, label, dtype):
    """_tune.py's tier-1 configurations on groups of 4K-64K elements: clusters, streaming, staged affine, vectors
    straddling channels (L = 250), and more groups than resident clusters (persistent loops over groups).
    Tier 1 means more than 256 vectors per group in every dtype: n > 2048 elements (fp16/bf16 vectors hold 8)."""
    fused = _fused_module()
    tuning = fused.Tuning(**TUNE.TIER1_CONFIGS[label], t2=-1)  # tier 1 whatever the default rule says
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    persistent = 0
    for B, C, L in [(2, 512, 256), (1, 1024, 512), (3, 64, 1000), (2, 128, 250), (64, 128, 256), (40, 256, 512)]:
        assert C // 8 * L > 2048
        plan = _run_fused(fam, dpk.make_case(FAMILY, f"b{B}_c{C}_l{L}", dtype, B=B, C=C, L=L, G=8), tuning)
        assert plan["tier"] == 1, plan
        persistent += plan["persistent"]
        if tuning.t1_ctas_per_sm:
            assert plan["resident_ctas"] <= tuning.t1_ctas_per_sm * sms, plan
    assert (persistent > 0) == bool(tuning.t1_persistent)


@gpu_test
@pytest.mark.parametrize("stash", [0, -1, 1, 5, 1000])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_stash_matches_reference(registry, fam, stash, dtype):
    """Streaming CTAs (256 threads, no cluster: 2-4 chunks) keeping 1, 5 or as many vectors per thread as fit (1000)
    in shared memory instead of re-reading them; none (-1); the default (0) keeps none here, where the re-reads fit
    in L2."""
    tuning = _fused_module().Tuning(max_threads=256, max_cluster=1, t1_stash=stash, t2=-1)
    for B, C, L in [(2, 64, 4000), (3, 16, 12288)]:
        plan = _run_fused(fam, dpk.make_case(FAMILY, f"b{B}_c{C}_l{L}", dtype, B=B, C=C, L=L, G=8), tuning)
        assert plan["tier"] == 1 and plan["chunks"] > 1 and plan["vec"] > 1, plan
        useful = (plan["chunks"] - 1) * plan["items"]
        if stash == 1000:  # 4 CTAs of 256 threads per SM: 13 slots of 4 KB fit on Hopper
            assert 0 < plan["stash"] <= useful and plan["smem_bytes"] >= plan["stash"] * 256 * 16, plan
        else:
            assert plan["stash"] == (0 if stash <= 0 else min(stash, useful)), plan


SMEM_KNOBS = {  # label -> knobs: the slice in shared memory with the plan's CTAs, half of them (twice the vectors
    # per thread), 128-thread CTAs, 3-warp CTAs (the CTA merge's unequal-width path) with half the CTAs
    "same": {"t1_smem": 1}, "half": {"t1_smem": 2}, "t=128": {"t1_smem": 1, "t1_threads": 128},
    "t=96,half": {"t1_smem": 2, "t1_threads": 96}}


@gpu_test
@pytest.mark.parametrize("label", list(SMEM_KNOBS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fused_smem_slice_matches_reference(registry, fam, label, dtype):
    """Tier 1 with the slices copied to shared memory (cp.async): clusters of 1-8 CTAs, slices that do not divide
    evenly over the threads (unequal counts in the symmetric merges), vectors straddling channels (L = 250, 1001), one
    CTA per group, and 320 groups (several waves)."""
    tuning = _fused_module().Tuning(**SMEM_KNOBS[label], t2=-1)
    shapes = [(2, 512, 256), (3, 64, 1000), (2, 128, 250), (64, 128, 256), (40, 256, 520), (4, 64, 1001)]
    in_smem = set()
    for B, C, L in shapes:
        plan = _run_fused(fam, dpk.make_case(FAMILY, f"b{B}_c{C}_l{L}", dtype, B=B, C=C, L=L, G=8), tuning)
        assert plan["tier"] == 1, plan
        if plan["smem_slice"]:
            in_smem.add((B, C, L))
            assert plan["chunks"] == 1 and plan["threads"] <= 256 and plan["vec"] > 1, plan
            assert plan["smem_bytes"] >= plan["slice_vecs"] * 16 and plan["items"] <= 16, plan
    assert len(in_smem) >= 4, in_smem


TIER2_KNOBS = {  # label -> knobs: the rule's plan, odd S, 32 CTAs of one warp, small CTAs streaming past a 3-slot
    # stash (re-reads), no stash, 16 elements per thread, more groups than resident slots (each CTA loops)
    "t2": {"t2": 1}, "s=3": {"t2": 1, "t2_ctas": 3}, "s=32,t=32": {"t2": 1, "t2_ctas": 32, "t1_threads": 32},
    "s=3,t=128,stash<=3": {"t2": 1, "t2_ctas": 3, "t1_threads": 128, "t1_stash": 3},
    "t=128,nostash": {"t2": 1, "t1_threads": 128, "t1_stash": -1}, "16el": {"t2": 1, "t1_items": 4},
    "s=5,t=1024": {"t2": 1, "t2_ctas": 5, "t1_threads": 1024}}


@gpu_test
@pytest.mark.parametrize("label", list(TIER2_KNOBS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_tier2_matches_reference(registry, fam, label, dtype):
    """Tier 2 (groups over S CTAs meeting through global memory) on B = 1..64 shapes: vectors straddling channels
    (L = 250), 8 groups over the SMs, stash plus re-reads, and slots looping over more groups than fit at once."""
    tuning = _fused_module().Tuning(**TIER2_KNOBS[label])
    seen = {"persistent": 0, "stash": 0, "chunks": 0}
    for B, C, L in [(1, 512, 256), (2, 128, 250), (3, 64, 1000), (2, 64, 4000), (64, 128, 256)]:
        plan = _run_fused(fam, dpk.make_case(FAMILY, f"b{B}_c{C}_l{L}", dtype, B=B, C=C, L=L, G=8), tuning)
        assert plan["tier"] == 2 and plan["counter_bytes"] == B * 8 * 8, plan
        assert plan["partial_bytes"] == B * 8 * 16 * plan["cluster"], plan
        if "t2_ctas" in TIER2_KNOBS[label]:
            assert plan["cluster"] == tuning.t2_ctas, plan
        seen["persistent"] += plan["persistent"]
        seen["stash"] += plan["stash"] > 0
        seen["chunks"] += plan["chunks"] > 1
    if label == "s=5,t=1024":
        assert seen["persistent"] > 0, seen  # 512 groups, 5 CTAs each, 1-2 CTAs of 1024 threads per SM
    if label == "s=3,t=128,stash<=3":
        assert seen["stash"] > 0 and seen["chunks"] > 0, seen


TIER3_KNOBS = {  # label -> knobs: the default CTAs, few group warps (several groups each), more group warps than
    # groups, 40 CTAs, requests two groups ahead or all at once, 128-thread CTAs (fewer storer warps than groups)
    "t3": {"t3": 1}, "w=3": {"t3": 1, "t3_reducers": 3}, "w=16": {"t3": 1, "t3_reducers": 16},
    "p=40": {"t3": 1, "t3_ctas": 40}, "d=2": {"t3": 1, "t3_depth": 2}, "d=32": {"t3": 1, "t3_depth": 32},
    "t=128": {"t3": 1, "t1_threads": 128}}


@gpu_test
@pytest.mark.parametrize("label", list(TIER3_KNOBS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_fused_tier3_matches_reference(registry, fam, label, dtype):
    """Tier 3 (every CTA holds a piece of every group; the groups pipelined through the chip): 8 to 32 groups, vectors
    straddling channels (L = 250, 1001), pieces of one vector and CTAs with no vector (C = 8, L = 600, G = 1: 150-300
    vectors over up to 132 CTAs), gamma/beta staged or read through L1 (L = 4: a piece spans too many channels)."""
    tuning = _fused_module().Tuning(**TIER3_KNOBS[label])
    stages = set()
    for B, C, L, G in [(1, 512, 256, 8), (2, 128, 250, 8), (4, 64, 1001, 8), (1, 8, 600, 1), (1, 2048, 1024, 8),
                       (1, 278528, 2, 8)]:
        plan = _run_fused(fam, dpk.make_case(FAMILY, f"b{B}_c{C}_l{L}", dtype, B=B, C=C, L=L, G=G), tuning)
        assert plan["tier"] == 3 and plan["partial_bytes"] == 0, plan
        assert plan["counter_bytes"] == (B * G + 1) * 128 + B * G * plan["grid"] * 8, plan
        stages.add(plan["stage"] > 0)
        if "t3_ctas" in TIER3_KNOBS[label]:
            assert plan["grid"] == tuning.t3_ctas, plan
    assert stages == {True, False}, stages


@gpu_test
def test_fused_tier3_slots_reset_between_plans_and_streams(registry, fam):
    """Every tier-3 launch leaves its counts, departures and slots at zero, in the counters buffer it shares with tier
    2: plans of both tiers and several group and CTA counts back to back on one stream and on a second one, fresh
    inputs each time. A slot left marked from an earlier launch would be merged in before its CTA publishes."""
    side = torch.cuda.Stream()
    _back_to_back(fam, [(1, {"t3": 1}, None), (2, {"t3": 1, "t3_ctas": 40}, None), (2, {"t2": 1, "t2_ctas": 3}, None),
                        (1, {"t3": 1}, side), (4, {"t3": 1, "t3_reducers": 2}, None),
                        (1, {"t3": 1, "t3_ctas": 9}, side), (1, {"t2": 1}, None), (1, {"t3": 1}, None)], seed=200)


@gpu_test
@pytest.mark.parametrize("stash", [3, 6, 11])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_tier2_multi_round_stash_matches_reference(registry, fam, dtype, stash):
    """Slots that loop over more groups than fit at once with a stash (fp32: the kernel with L2 evict_first hints;
    bf16 in half chunks: whole-vector normalise where L % 8 == 0): a stash ending mid-chunk (3 or 6 of 8 / 4
    vectors) or covering the first chunk, 2-5 rounds with slots that run out of groups early, vectors straddling
    channels (L = 15998) or not (L = 16000)."""
    for B, ctas, L in [(16, 2, 15998), (24, 3, 16000)]:
        tuning = _fused_module().Tuning(t2=1, t2_ctas=ctas, t1_threads=1024, t1_stash=stash)
        plan = _run_fused(fam, dpk.make_case(FAMILY, f"b{B}_c64_l{L}", dtype, B=B, C=64, L=L, G=8), tuning)
        assert plan["tier"] == 2 and plan["persistent"] and plan["chunks"] == 2, plan
        assert plan["stash"] == min(stash, plan["items"]) and plan["grid"] < B * 8 * ctas, plan


@gpu_test
@pytest.mark.parametrize("xoffset", [30.0, 1000.0])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_16bit_offset_data_within_fp32_budget(registry, fam, dtype, xoffset):
    """The 16-bit kernels fold the mean into the log2-domain shift (one FFMA per element: AffineMish), whose extra
    error grows with |mean| / std. On data far from zero the fused error must stay within what fp32 statistics and
    pointwise math plus one rounding of y allow (the same data's fp32 budget + 2 u_out relative): far tighter than
    the family's 16-bit budget, which also covers eager's mean and rstd stored in the input dtype (at |mean| / std
    ~ 30 or 1000 too loose to catch a fold done in low precision). Tier 0, tier 1, the smem slice and tier 2."""
    fused = _fused_module()
    seen = set()
    for B, C, L, knobs in [(1, 64, 16, {}), (2, 64, 512, {"t1_smem": -1}), (8, 64, 512, {"t1_smem": 1}),
                           (2, 64, 512, {"t2": 1})]:
        case = dpk.make_case(FAMILY, f"b{B}_c{C}_l{L}", dtype, B=B, C=C, L=L, G=8, xoffset=xoffset)
        inputs = fam.make_inputs(case, torch.device("cuda"))
        tuning = fused.Tuning(**knobs)
        plan = fused.fused_plan(inputs[0], inputs[3], tuning)
        seen.add((plan["tier"], plan["smem_slice"]))
        out = fused.fused_gn_mish(*inputs, tuning=tuning)
        ref = _reference(fam, inputs)
        fp32 = fam.tolerance(dpk.make_case(FAMILY, "fp32", "float32", B=B, C=C, L=L, G=8, xoffset=xoffset), "float32")
        u_out = unit_roundoff(dtype)
        assert_within(out, ref, dpk.Tolerance(atol=fp32.atol, rtol=fp32.rtol + 2 * u_out,
                                              why=f"fp32 statistics and pointwise, one {dtype} rounding"))
    assert seen == {(0, 0), (1, 0), (1, 1), (2, 0)}, seen


@gpu_test
def test_fused_tier2_counters_reset_between_plans_and_streams(registry, fam):
    """Every launch leaves the group counters at zero: plans of different S and group counts run back to back on one
    stream and on a second stream (its own buffers) on fresh inputs each time. A counter left at a multiple of the
    previous S, or counters where an earlier plan kept partials (the first version shared one buffer, counters
    first: 16 groups' counters overlapped 8 groups' partials), release a barrier early and mix stale partials in."""
    side = torch.cuda.Stream()
    runs = [(1, 4, None), (2, 3, None), (5, 32, None), (2, 1, side), (1, 4, side), (3, 3, None), (2, 4, None)]
    _back_to_back(fam, [(B, {"t2": 1, "t2_ctas": ctas, "t1_threads": 128}, stream) for B, ctas, stream in runs],
                  seed=100)


@gpu_test
@pytest.mark.parametrize("L,knobs", [(16, {}), (16, {"t0_threads": 128}), (4000, {}), (4000, {"t2": 1})])
def test_fused_unaligned_input_takes_scalar_path(registry, fam, L, knobs):
    """x one element off 16-byte alignment: every tier reads and writes it element by element."""
    fused = _fused_module()
    case = dpk.make_case(FAMILY, "t", B=2, C=64, L=L, G=8)
    x, gamma, beta, groups, eps = fam.make_inputs(case, torch.device("cuda"))
    shifted = torch.empty(x.numel() + 1, device="cuda")[1:].view_as(x).copy_(x)  # contiguous, 4-byte aligned
    ref = fam.reference(x.double(), gamma.double(), beta.double(), groups, eps)
    tuning = fused.Tuning(**knobs)
    plan = fused.fused_plan(shifted, groups, tuning)
    assert plan["vec"] == 1 and plan["tier"] == (0 if L == 16 else 2 if knobs else 1), plan
    assert_within(fused.fused_gn_mish(shifted, gamma, beta, groups, eps, tuning), ref, fam.tolerance(case, "float32"))


@gpu_test
def test_fused_mish_is_stable_for_extreme_z(registry):
    fused = _fused_module()
    for tuning in (fused.Tuning(), fused.Tuning(t0_threads=64)):
        _check_extreme(fused.fused_gn_mish(*_extreme_z_inputs(torch.device("cuda")), tuning=tuning))


@gpu_test
@pytest.mark.parametrize("C,L,knobs", [(256, 1024, {}), (256, 16, {"t0_threads": 128}), (256, 16, {}),
                                        (256, 1024, {"t2": 1}), (256, 1024, {"t3": 1}), (2048, 1024, {})])
def test_fused_replays_in_a_cuda_graph(registry, fam, C, L, knobs):
    fused = _fused_module()
    tuning = fused.Tuning(**knobs)
    case = dpk.make_case(FAMILY, "t", B=1, C=C, L=L, G=8)
    x, gamma, beta, groups, eps = fam.make_inputs(case, torch.device("cuda"))
    fused.fused_gn_mish(x, gamma, beta, groups, eps, tuning)  # build and plan outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused.fused_gn_mish(x, gamma, beta, groups, eps, tuning)
    x.copy_(fam.make_inputs(dpk.make_case(FAMILY, "u", B=1, C=C, L=L, G=8), torch.device("cuda"))[0])
    graph.replay()
    torch.cuda.synchronize()
    assert_within(out, fam.reference(x.double(), gamma.double(), beta.double(), groups, eps),
                  fam.tolerance(case, "float32"))
