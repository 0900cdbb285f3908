"""conv1d family tests that run on a CPU: suite shapes, bad-input errors, Triton parity under the interpreter,
the tolerance's power to catch broken outputs, and NumPy models of the CUDA kernels' index math
(kernels/conv1d/_models*.py) checked against the reference and, with nvcc, against the
compiled host planners."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dpk
from dpk import parity
from dpk.build import nvcc_path
from dpk.cases import load_suite_file, make_case
from dpk.registry import Registry, load

from ._helpers import CUDA_TESTS, ROOT, gpu_test, nvcc_build, pusht_unet

CONV = ROOT / "kernels" / "conv1d"
SUITES = load_suite_file(ROOT / "suites" / "conv1d.yaml").suites
REG = load([ROOT / "kernels"], strict=True)
FAM = REG.family("conv1d")
models = importlib.import_module("dpk.families.conv1d._models")
tmodels = importlib.import_module("dpk.families.conv1d._models_tiled")
rmodels = importlib.import_module("dpk.families.conv1d._models_rows")
omodels = importlib.import_module("dpk.families.conv1d._models_optimized")
checks = importlib.import_module("dpk.families.conv1d._checks")
cuda_variants = importlib.import_module("dpk.families.conv1d.cuda_variants")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def shape(c) -> tuple[int, int, int, int, int]:
    return c["B"], c["Cin"], c["Cout"], c["L"], c.get("K", 5)


def random_inputs(B, Cin, Cout, L, K, seed=0):
    rng = np.random.default_rng(seed)
    bound = 1 / np.sqrt(Cin * K)
    return (rng.standard_normal((B, Cin, L)), rng.uniform(-bound, bound, (Cout, Cin, K)),
            rng.uniform(-bound, bound, Cout))


def torch_conv(x, w, b):
    return F.conv1d(*(torch.as_tensor(t) for t in (x, w, b)), padding=w.shape[2] // 2).numpy()


# ---- suites ----
def test_pusht_suite_is_the_unet_walk_plus_batched_largest():
    convs, _ = pusht_unet().walk()
    walk_shapes = {(c.cin, c.cout, c.length, c.k) for c in convs}
    cases = [shape(c) for c in SUITES["pusht"]]
    assert len(cases) == len(set(cases))
    assert {s[1:] for s in cases if s[0] == 1} == walk_shapes
    largest = sorted(walk_shapes, key=lambda s: (-s[0] * s[1] * s[3], s))[:3]
    assert {s for s in cases if s[0] != 1} == {(bsz, *s) for bsz in (8, 64) for s in largest}
    assert all(c.dtype == "float32" for c in SUITES["pusht"])


def test_smoke_is_small_and_sweep_bounded():
    tk = importlib.import_module("dpk.families.conv1d._triton_kernels") if importlib.util.find_spec("triton") else None
    for c in SUITES["smoke"]:
        B, Cin, Cout, L, K = shape(c)
        assert B * Cin * Cout * L * K < 10**6, c.id
        if tk is not None:
            bco, bl, _ = tk.block_sizes(B, Cout, L, Cin * K, target_programs=1)
            assert B * -(-Cout // bco) * -(-L // bl) <= 6, c.id
    assert len(SUITES["sweep"]) <= 40


# ---- bad input ----
def good(B=1, Cin=3, Cout=5, L=7, K=3, dtype=torch.float32):
    return torch.randn(B, Cin, L, dtype=dtype), torch.randn(Cout, Cin, K, dtype=dtype), torch.randn(Cout, dtype=dtype)


BAD = {
    "rank": ((lambda x, w, b: (x[0], w, b)), ValueError, "x must be 3-D"),
    "channels": ((lambda x, w, b: (x, w[:, :2].contiguous(), b)), ValueError, "channel mismatch"),
    "bias": ((lambda x, w, b: (x, w, b[:4])), ValueError, "bias length 4"),
    "even_k": ((lambda x, w, b: (x, torch.randn(5, 3, 4), b)), ValueError, "K=4 is even"),
    "noncontig": ((lambda x, w, b: (x.transpose(1, 2).contiguous().transpose(1, 2), w, b)), ValueError, "contiguous"),
    "device": ((lambda x, w, b: (x, w.to("meta"), b)), ValueError, "different devices"),
    "mixed": ((lambda x, w, b: (x, w.double(), b)), TypeError, "mixed dtypes"),
    "dtype": ((lambda x, w, b: (x.double(), w.double(), b.double())), TypeError, "unsupported dtype"),
    "int": ((lambda x, w, b: (x.int(), w.int(), b.int())), TypeError, "unsupported dtype"),
    "not_tensor": ((lambda x, w, b: (x.numpy(), w, b)), TypeError, "must be a torch.Tensor"),
    "empty": ((lambda x, w, b: (x[:, :, :0], w, b)), ValueError, "empty"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_shared_validation_names_the_problem(bad):
    make, exc, msg = BAD[bad]
    with pytest.raises(exc, match=msg):
        checks.check_conv1d_inputs(*make(*good()), variant="t", dtypes=(torch.float32, torch.bfloat16))


@pytest.mark.parametrize("bad", sorted(BAD))
def test_triton_variant_rejects_bad_input(bad):
    if not INTERPRETED:
        pytest.skip("the Triton variant takes CPU tensors only under TRITON_INTERPRET=1")
    make, exc, msg = BAD[bad]
    with pytest.raises(exc, match=msg):
        REG.variant("conv1d", "triton").fn(*make(*good()))


@pytest.mark.parametrize("name", ["naive", "optimized", "stream", "cudnn"])
def test_gpu_variants_validate_before_launch(name):
    fn = REG.variant("conv1d", name).fn
    with pytest.raises(ValueError, match="channel mismatch"):
        fn(*BAD["channels"][0](*good()))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs cuda tensors"):
            fn(*good())


def test_optimized_limits_are_unavailable_not_errors():
    """Valid shapes the seed kernel cannot run are a capability limit (dpk.Unavailable), not bad input."""
    for cin, k, msg in ((64, 9, "K=9 not supported"), (4096, 5, "Cin=4096 not supported")):
        with pytest.raises(dpk.Unavailable, match=msg):
            cuda_variants.check_optimized_shape(cin, k)
    for c in [*SUITES["pusht"], *SUITES["smoke"], *SUITES["sweep"]]:  # every suite shape runs on optimized
        cuda_variants.check_optimized_shape(c["Cin"], c.get("K", 5))
        assert omodels.optimized_config(c["Cin"], c["L"], c.get("K", 5)) is not None, c.id
    if INTERPRETED:  # the Triton grid's z limit, checked before launch
        with pytest.raises(dpk.Unavailable, match="batch 65536 exceeds the grid's z limit"):
            REG.variant("conv1d", "triton").fn(*good(B=65536, Cin=1, Cout=1, L=1, K=1))


CIN_4096 = make_case("conv1d", "c4096_c64_l4_k5", B=1, Cin=4096, Cout=64, L=4, K=5)  # B*L <= 16: the seed kernel


def test_parity_reports_optimized_cin_4096_as_unavailable(monkeypatch):
    """dpk.parity.check of conv1d.optimized at Cin = 4096 reports `unavailable: <reason>`, not `error`. Without a GPU
    the variant runs here with its device requirement lifted (CPU tensors pass its input checks; the extension must not
    be reached): the classification is decided before launch, in the variant's own checks."""
    if torch.cuda.is_available():
        pytest.skip("test_parity_optimized_cin_4096_on_gpu runs the real variant")
    monkeypatch.setattr(cuda_variants, "check_conv1d_inputs",
                        lambda *a, **kw: checks.check_conv1d_inputs(*a, **{**kw, "device_type": None}))
    monkeypatch.setattr(cuda_variants, "extension", lambda: pytest.fail("launched past the Cin limit"))
    optimized = dataclasses.replace(REG.variant("conv1d", "optimized"), needs=())
    reg = Registry(families={"conv1d": FAM}, variants={"conv1d": {"optimized": optimized}})
    res = parity.check(reg, "conv1d", "optimized", CIN_4096, torch.device("cpu"))
    assert res.status == "unavailable", res.summary()
    assert "Cin=4096 not supported (supports Cin <= 2048)" in res.reason


@gpu_test
def test_parity_optimized_cin_4096_on_gpu():
    res = parity.check(REG, "conv1d", "optimized", CIN_4096, torch.device("cuda"))
    assert res.status == "unavailable" and "Cin=4096 not supported" in res.reason, res.summary()


# ---- numerics ----
@pytest.mark.parametrize("case_id", ["odd_c3_c5_l13_k3.fp32", "split_c130_c40_l6_k3.fp32", "l1_c4_c6_k5.bf16",
                                     "b2_c64_c33_l4_k7.fp16"])
def test_triton_parity_on_cpu(case_id):
    if not INTERPRETED:
        pytest.skip("CPU parity needs TRITON_INTERPRET=1 (the GPU run is the generic parity test)")
    case = next(c for c in SUITES["smoke"] if c.id == case_id)
    v = REG.variant("conv1d", "triton")
    inputs = FAM.make_inputs(case, torch.device("cpu"))
    out = v.fn(*inputs)
    ref = FAM.reference(*(t.double() for t in inputs))
    tol = FAM.tolerance(case, v.compute)
    assert out.dtype == inputs[0].dtype and out.shape == ref.shape
    assert ((out.double() - ref).abs() <= tol.atol + tol.rtol * ref.abs()).all(), tol.why


def test_tolerance_passes_fp32_and_tf32_and_catches_broken_outputs():
    case = make_case("conv1d", "c1024_c1024_l4_k5", B=1, Cin=1024, Cout=1024, L=4, K=5)
    x, w, b = FAM.make_inputs(case, torch.device("cpu"))
    ref = FAM.reference(x.double(), w.double(), b.double())

    def ok(out, compute):
        tol = FAM.tolerance(case, compute)
        return bool(((out.double() - ref).abs() <= tol.atol + tol.rtol * ref.abs()).all())

    def tf32(t):  # truncate to 10 mantissa bits, as some tensor-core paths do
        return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)
    assert ok(F.conv1d(x, w, b, padding=2), "float32")
    assert ok(F.conv1d(tf32(x), tf32(w), b, padding=2), "tf32")
    assert not ok(F.conv1d(tf32(x), tf32(w), b, padding=2), "float32")  # a TF32 result is not fp32-accurate
    (xb, xs), (wb, ws) = (map(torch.from_numpy, tmodels.split_tf32(t.numpy())) for t in (x, w))
    assert not ok(F.conv1d(xb, wb, b, padding=2), "float32")  # the big parts alone: a TF32 conv, not fp32
    three = F.conv1d(xs, wb, None, padding=2) + F.conv1d(xb, ws, None, padding=2) + F.conv1d(xb, wb, b, padding=2)
    assert ok(three, "float32")  # tiled.cu's 3xTF32 tensor-core engine keeps the fp32 bound
    assert not ok(F.conv1d(x, w, None, padding=2), "float32")           # bias forgotten
    w_dropped = w.clone()
    w_dropped[:, :, 4] = 0
    assert not ok(F.conv1d(x, w_dropped, b, padding=2), "tf32")         # one tap lost
    assert not ok(F.conv1d(x, w, b, padding=2).roll(1, dims=2), "tf32")  # positions shifted


# ---- models of the CUDA kernels ----
# ---- models of the CUDA kernels (kernels/conv1d/_models*.py) ----
@pytest.mark.parametrize("n", [16, 32, 64])
def test_reduce_scatter_model(n):
    v = np.random.default_rng(n).standard_normal((32, n))
    kept = models.reduce_scatter(v)
    total = v.sum(axis=0)
    writers = models.stream_writers(n)
    assert sorted(idx for _, _, idx in writers) == list(range(n))  # every (row, output) written once
    for lane in range(32):
        for i in range(kept.shape[1]):
            assert np.isclose(kept[lane, i], total[models.kept_index(lane, i, n)])


def suite_shapes(*names):
    return sorted({shape(c) for n in names for c in SUITES[n]})


ALL_SHAPES = suite_shapes("pusht", "sweep", "smoke")
RING = {"rows": 0}  # stream.cu's own kernel (with `rows` set, stream_rows.cu runs wherever its plan fits)
# stream knob sets the tuner tries on the 21 MB batch-1 shapes (every compiled (RPW, V), both grids)
STREAM_KNOBS = [{**RING, **k} for k in [{}, {"ctas_per_sm": 0, "stages": 2}, {"ctas_per_sm": 2, "stages": 3}] + [
    {"rows_per_warp": r, "vecs_per_row": v} for r, v in models.STREAM_COMBOS] + [
    {"bulk": 1}, {"bulk": 1, "ctas_per_sm": 2, "stages": 4}, {"bulk": 1, "rows_per_warp": 4, "vecs_per_row": 2}]]


def stream_runs(bsz, length, elem_bytes):
    """Whether the stream kernel (not tiled.cu) runs this case with the default knobs."""
    return elem_bytes == 2 or bsz * length <= models.STREAM_DEFAULTS["tiled_min_bl"]


def test_stream_partition_covers_every_weight_once():
    seen = set()
    for B, Cin, Cout, L, K in ALL_SHAPES:
        for elem_bytes in (4, 2):
            knob_sets = STREAM_KNOBS if (B, L, Cin * Cout * K) == (1, 4, 5 << 20) else [RING]
            for knobs in knob_sets if stream_runs(B, L, elem_bytes) else []:
                p = models.stream_plan(B, Cin, Cout, L, K, elem_bytes, knobs)
                key = (Cin, Cout, K, elem_bytes, p.splits, p.chunks, p.rows_per_warp, p.vecs_per_row)
                if key not in seen:  # the partition depends on B and L only through the plan
                    seen.add(key)
                    owners = models.stream_weight_owners(Cin, Cout, K, elem_bytes, p)
                    assert (owners == 1).all(), (B, Cin, Cout, L, K, elem_bytes, knobs)


def test_stream_plans_cover_every_output_once_in_one_wave():
    for B, Cin, Cout, L, K in ALL_SHAPES:
        for elem_bytes in (4, 2):
            for knobs in STREAM_KNOBS if stream_runs(B, L, elem_bytes) else []:
                p = models.stream_plan(B, Cin, Cout, L, K, elem_bytes, knobs)
                assert p.ok, (B, Cin, Cout, L, K, knobs)
                rpc = 8 * p.rows_per_warp
                assert p.row_groups * rpc >= Cout > (p.row_groups - 1) * rpc
                assert p.passes * p.outputs_per_pass >= B * L > (p.passes - 1) * p.outputs_per_pass
                ranges = [models.chunk_range(s, p.splits, p.chunks) for s in range(p.splits)]
                assert [c for a, b in ranges for c in range(a, b)] == list(range(p.chunks))  # a partition
                assert all(b > a for a, b in ranges) and max(b - a for a, b in ranges) == p.chunks_per_cta
                assert p.stages >= 2 and p.smem_bytes <= models.MAX_DYNAMIC_SMEM
                cta = models.knobs_with_defaults(knobs, models.STREAM_DEFAULTS)["ctas_per_sm"]
                if cta and p.splits > 1 and p.passes == 1:  # the grid fits one wave of SMs x ctas_per_sm
                    assert p.splits * p.row_groups * p.passes <= 132 * cta
                assert (models.stream_output_writes(B, Cin, Cout, L, K, elem_bytes, knobs) == 1).all()
                assert p.workspace_floats == (p.splits * Cout * B * L if p.splits > 1 else 0)
                assert p.counters == (p.row_groups * p.passes if p.splits > 1 else 0)
    for cin, cout in ((1024, 1024), (2048, 512)):  # the 21 MB targets: 128 CTAs of 5 chunks (32 KB each)
        p = models.stream_plan(1, cin, cout, 4, 5, 4, RING)
        assert (p.splits * p.row_groups, p.chunks_per_cta, p.stages) == (128, 5, 3)
        assert (p.rows_per_warp, p.vecs_per_row) == (8, 1)


def test_tiled_default_rule_picks_the_measured_bests():
    """The H200 sweep's best (tile, stages, policy, engine) per batch-8/64 Push-T shape, up to noise (NOTES.md)."""
    want = {(8, 1024, 1024): (0, 4, 1, 1), (8, 2048, 512): (0, 4, 1, 1), (8, 512, 1024): (0, 4, 1, 1),
            (64, 1024, 1024): (2, 4, 1, 1), (64, 2048, 512): (2, 4, 1, 1), (64, 512, 1024): (2, 4, 1, 1)}
    for (B, Cin, Cout), (tile, stages, policy, mma) in want.items():
        p = tmodels.tiled_plan(B, Cin, Cout, 4, 5)
        assert (p.tile, p.stages, p.cache_policy, p.mma) == (tile, stages, policy, mma), (B, Cin, Cout)
        assert p.splits * p.n_tiles * p.m_tiles <= 2 * 132  # one wave at the default 2 CTAs per SM
    explicit = tmodels.tiled_plan(8, 1024, 1024, 4, 5, {"tile": 1, "stages": 6, "cache_policy": 2})
    assert (explicit.tile, explicit.stages, explicit.cache_policy) == (1, 6, 2)  # a set knob overrides the rule


@pytest.mark.parametrize("tile", range(len(tmodels.TILES)))
def test_mma_engine_fragments_cover_the_tile_without_bank_conflicts(tile):
    """MmaTile (tiled_engines.cuh): each warp instruction's 32 shared-memory reads hit 32 distinct banks, the A and B
    fragments of a warp cover its rows x 8 k (8 k x its columns) once per k8 step, and the accumulators of all
    threads cover the BM x BN tile once."""
    p = tmodels.tiled_plan(64, 64, 256, 4, 5, {"tile": tile, "mma": 1})
    warps_n, wm, wn, sb = tmodels.mma_warp_tile(p)
    a, b = tmodels.mma_fragment_offsets(p)
    for offsets in (a, b):
        per_instruction = np.sort(offsets.reshape(-1, 32) % 32, axis=1)
        assert (per_instruction == np.arange(32)).all()
    sa = p.bk + 4
    for warp in range(p.threads // 32):
        m_rows = range((warp // warps_n) * wm, (warp // warps_n + 1) * wm)
        n_cols = range((warp % warps_n) * wn, (warp % warps_n + 1) * wn)
        for s, k8 in enumerate(range(0, p.bk, 8)):
            rows, cols = np.divmod(a[warp, s].ravel(), sa)
            assert sorted(zip(rows, cols, strict=True)) == [(r, c) for r in m_rows for c in range(k8, k8 + 8)]
            ks, ns = np.divmod(b[warp, s].ravel(), sb)
            assert sorted(zip(ks, ns, strict=True)) == [(k, n) for k in range(k8, k8 + 8) for n in n_cols]
    rows, cols = tmodels.thread_elements(p)
    assert np.bincount((rows * p.bn + cols).ravel(), minlength=p.bm * p.bn).tolist() == [1] * (p.bm * p.bn)


def test_tiled_emulation_catches_a_wrong_mma_operand_split():
    """The 3xTF32 emulation is fp32-accurate only with all three products: dropping a correction term fails."""
    x, w, b = random_inputs(9, 200, 70, 4, 5)
    ref = torch_conv(x, w, b)
    p = tmodels.tiled_plan(9, 200, 70, 4, 5, {"tile": 1, "mma": 1})
    y = tmodels.emulate_tiled(x, w, b, {"tile": 1, "mma": 1})[0]
    assert p.mma == 1 and np.abs(y - ref).max() < 1e-6
    keep = tmodels.split_tf32
    try:  # a big-only split (1xTF32): the small parts vanish
        tmodels.split_tf32 = lambda v: (keep(v)[0], np.zeros_like(keep(v)[1]))
        assert np.abs(tmodels.emulate_tiled(x, w, b, {"tile": 1, "mma": 1})[0] - ref).max() > 1e-4
    finally:
        tmodels.split_tf32 = keep


def tiled_runs(bsz, length):
    return bsz * length > models.STREAM_DEFAULTS["tiled_min_bl"]


def test_tiled_plans_read_every_weight_once_per_column_tile_and_write_every_output_once():
    seen = set()
    for B, Cin, Cout, L, K in ALL_SHAPES:
        if not tiled_runs(B, L):
            continue
        tiles = range(len(tmodels.TILES)) if (B, L, Cin * Cout * K) in {(8, 4, 5 << 20), (64, 4, 5 << 20)} else [-1]
        for tile in tiles:
            p = tmodels.tiled_plan(B, Cin, Cout, L, K, {"tile": tile})
            assert p.ok and p.smem_bytes <= models.MAX_DYNAMIC_SMEM and p.splits <= p.k_steps
            assert p.workspace_floats == (p.splits * p.n_tiles * p.m_tiles * p.bm * p.bn if p.splits > 1 else 0)
            key = (Cin, Cout, K, p.tile, p.splits)
            if key not in seen:
                seen.add(key)
                assert (tmodels.tiled_weight_reads(Cin, Cout, K, B, L, {"tile": tile}) == 1).all(), (B, Cin, Cout, K)
            assert (tmodels.tiled_output_writes(B, Cin, Cout, L, K, {"tile": tile}) == 1).all(), (B, Cin, Cout, L)


# bulk ring: deep rings with several wraps (parity flips), a partial last warp, rows of 16-byte and odd lengths
BULK_KNOBS = ({**RING, "bulk": 1, "stages": 2}, {**RING, "bulk": 1, "stages": 3, "ctas_per_sm": 0},
              {**RING, "bulk": 1, "rows_per_warp": 2, "vecs_per_row": 4, "stages": 8})
# plus: 3 row groups; several chunks per CTA with ring reuse; 3 passes; whole-row staging with L < LT (optimized);
# 2 tiles along Cout and along N with splits
EMULATED = [shape(c) for c in SUITES["smoke"] if c.dtype == "float32"] + [
    (2, 9, 70, 3, 5), (1, 600, 3, 8, 3), (5, 3, 2, 7, 1), (2, 5, 3, 12, 3), (1, 300, 70, 4, 5), (9, 20, 70, 4, 5)]


@pytest.mark.parametrize("dims", EMULATED, ids=lambda d: "b{}_c{}_c{}_l{}_k{}".format(*d))
def test_kernel_models_compute_the_convolution(dims):
    x, w, b = random_inputs(*dims)
    ref = torch_conv(x, w, b)
    for knobs in (None, RING, {**RING, "stages": 2, "ctas_per_sm": 2},
                  {**RING, "rows_per_warp": 8, "vecs_per_row": 1, "stages": 3}, *BULK_KNOBS):
        assert np.allclose(models.emulate_stream(x, w, b, 4, knobs, num_sms=4), ref, atol=1e-12), knobs
    for knobs in (None, RING, {**RING, "bulk": 1, "stages": 3}):
        assert np.allclose(models.emulate_stream(x, w, b, 2, knobs), ref, atol=1e-12)  # bf16/fp16 layout
    for knobs, avec in ((None, None), ({"tile": 1, "stages": 2, "ctas_per_sm": 1}, False), ({"tile": 2}, None),
                        ({"tile": 0, "mma": 1}, None), ({"tile": 2, "mma": 1}, False), ({"tile": 3, "mma": 0}, None)):
        y, writes, reads = tmodels.emulate_tiled(x, w, b, knobs, num_sms=8, avec=avec)
        mma = tmodels.tiled_plan(*dims, knobs, 8).mma
        assert np.allclose(y, ref, atol=1e-6 if mma else 1e-12) and (writes == 1).all(), knobs  # 3xTF32: ~2^-22
        assert (reads == tmodels.tiled_plan(*dims, knobs, 8).n_tiles).all()
    y, worst_writes = omodels.emulate_optimized(x, w, b)
    assert np.allclose(y, ref, atol=1e-12) and worst_writes == 1


@pytest.mark.parametrize("dims", [(1, 248, 20, 4, 5), (3, 248, 70, 2, 5), (1, 96, 130, 4, 3)],
                         ids=lambda d: "b{}_c{}_c{}_l{}_k{}".format(*d))
def test_bulk_ring_model_computes_the_convolution(dims):
    """The TMA bulk ring (stream.cu issue_chunk_bulk) on one or two SMs: many chunks per CTA (the mbarrier parity
    wraps several times), a last chunk with a partial 16-byte-multiple copy and zeroed lanes, warps wholly past
    Cout (expect_tx of 0 bytes), fp32 and 16-bit rows; bulk_fill checks sizes, alignment and zero/copy overlap."""
    x, w, b = random_inputs(*dims)
    ref = torch_conv(x, w, b)
    most_wraps = 0
    for elem_bytes in (4, 2):
        for sms in (1, 2):
            for knobs in ({**RING, "bulk": 1, "stages": st, "rows_per_warp": rpw, "vecs_per_row": v}
                          for st in (2, 3, 5) for rpw, v in ((8, 1), (4, 2), (2, 4))):
                p = models.stream_plan(*dims, elem_bytes, knobs, sms)
                assert p.ok and p.bulk == 1, (elem_bytes, knobs, p)
                most_wraps = max(most_wraps, p.chunks_per_cta // p.stages)
                y = models.emulate_stream(x, w, b, elem_bytes, knobs, num_sms=sms)
                assert np.allclose(y, ref, atol=1e-12), (elem_bytes, sms, knobs)
    assert most_wraps >= (3 if dims == (1, 248, 20, 4, 5) else 1)  # slot barriers through phases 0, 1, 0, ...


def test_bulk_plan_flag_and_shared_memory():
    """bulk is on only for rows of whole 16-byte vectors; it adds one 8-byte mbarrier per warp and stage."""
    for knobs in ({"stages": 3}, {"stages": 6}, {"stages": 8, "rows_per_warp": 4, "vecs_per_row": 2}):
        cp, bk = (models.stream_plan(1, 1024, 1024, 4, 5, 4, {**RING, **knobs, "bulk": bulk}) for bulk in (0, 1))
        assert cp.bulk == 0 and bk.bulk == 1 and bk.stages == cp.stages and bk.splits == cp.splits
        assert bk.smem_bytes == cp.smem_bytes + bk.stages * 64, knobs
    p = models.stream_plan(1, 1024, 1024, 4, 5, 4, {**RING, "bulk": 1, "stages": 6})
    assert (p.stages, p.chunks_per_cta, p.smem_bytes) == (5, 5, 5 * (32768 + 64) + 5 * 128 * 4 * 4)  # capped at 5
    assert models.stream_plan(1, 3, 5, 13, 3, 4, {**RING, "bulk": 1}).bulk == 0   # R = 9: 36-byte rows
    assert models.stream_plan(1, 1020, 8, 4, 1, 2, {**RING, "bulk": 1}).bulk == 0  # 2040-byte rows (16-bit)
    assert models.stream_plan(1, 1020, 8, 4, 1, 4, {**RING, "bulk": 1}).bulk == 1  # 4080-byte rows (fp32)
    assert not models.stream_plan(1, 64, 64, 4, 5, 4, {"bulk": 2}).ok


def test_broken_models_are_caught():
    x, w, b = random_inputs(1, 130, 40, 6, 3)  # 2 stream splits; 13 tiled splits
    ref = torch_conv(x, w, b)
    broken = w.copy()
    broken.reshape(40, -1)[:, 256:] = 0  # as if the second split's partials never arrived
    case = make_case("conv1d", "split", B=1, Cin=130, Cout=40, L=6, K=3)
    tol = FAM.tolerance(case, "float32")
    assert np.abs(models.emulate_stream(x, broken, b) - ref).max() > 100 * tol.atol
    assert np.abs(tmodels.emulate_tiled(x, broken, b)[0] - ref).max() > 100 * tol.atol


def test_optimized_config_fits_every_supported_shape():
    for K in (1, 3, 5, 7):
        for Cin in range(1, 2049):
            for L in (1, 4, 8, 13, 16, 256):
                cpt, lt, threads, smem = omodels.optimized_config(Cin, L, K)
                assert threads % 32 == 0 and threads * cpt >= Cin > (threads - 32) * cpt
                assert threads <= omodels.max_threads_for(cpt) and omodels.regs_fit(K, cpt, lt)
                assert smem <= omodels.OPT_MAX_SMEM
    assert omodels.optimized_config(1024, 4, 5)[:2] == (4, 4)  # the seed's CPT for its demo shape
    assert omodels.optimized_config(1024, 8, 5) is not None    # the shape the seed's dispatch skipped


# ---- stream_rows.cu (the stream config's `rows` path; _models_rows.py) ----
def rows_rule(Cout, no, sms) -> int:
    """RC: the least power of two >= ceil(Cout / SMs), at most 32 / NO."""
    want = math.ceil(Cout / sms)
    return min(32 // no, 1 << max(0, want - 1).bit_length())


def rows_fit_expected(B, Cin, Cout, L, K, elem_bytes, chunks, threads, sms) -> bool:
    """Whether conv1d_rows_plan should fit, from the kernel's preconditions: B*L <= 16, rows of whole 16-byte
    vectors, and RC rows (the least power of two >= Cout / SMs, at most 32 / NO) + x + barriers + warp totals (one
    row of 32 fp32 per warp) in shared memory (the plan does not lower RC to fit)."""
    no = 4 if B * L <= 4 else (8 if B * L <= 8 else 16)
    vec, R = 16 // elem_bytes, Cin * K
    cols = math.ceil(math.ceil(R / chunks) / vec) * vec
    n = math.ceil(R / cols)
    smem = 16 * ((n + 1) // 2) + threads // 32 * 128 + rows_rule(Cout, no, sms) * R * elem_bytes + B * L * Cin * 4
    return B * L <= 16 and Cin * K * elem_bytes % 16 == 0 and smem <= models.MAX_DYNAMIC_SMEM


ROWS_THREADS = (256, 512, 1024)  # the row_threads knob's values (stream_rows.cu's THREADS instantiations)


def test_rows_plan_on_suite_shapes():
    """Every suite shape (pusht, smoke, sweep) x fp32/16-bit x chunks x threads per CTA x SMs: the rows plan fits
    where the kernel's preconditions hold, covers Cout with CTAs of RC rows, every column with whole-vector chunks,
    and fits shared memory; stream_plan takes it exactly where rows = 1 and it fits."""
    fitted = 0
    for B, Cin, Cout, L, K in ALL_SHAPES:
        for eb in (4, 2):
            for chunks, threads in ((c, t) for c in (1, 2, 3, 4, 32) for t in ROWS_THREADS):
                for sms in (132, 114):
                    p = rmodels.rows_plan(B, Cin, Cout, L, K, eb, chunks, threads, sms)
                    sp = models.stream_plan(B, Cin, Cout, L, K, eb,
                                            {"rows": 1, "row_chunks": chunks, "row_threads": threads}, sms)
                    assert sp.rows == p.ok and sp.ok, (B, Cin, Cout, L, K, eb, chunks, threads)
                    assert p.ok == rows_fit_expected(B, Cin, Cout, L, K, eb, chunks, threads, sms), (
                        B, Cin, Cout, L, K, eb, threads)
                    if not p.ok:
                        continue
                    fitted += 1
                    R, NO, RC = Cin * K, p.outputs, p.rows_per_cta
                    assert NO >= B * L and NO in (4, 8, 16) and RC in (1, 2, 4, 8) and RC * NO <= 32
                    assert p.ctas * RC >= Cout > (p.ctas - 1) * RC
                    assert rows_rule(Cout, NO, sms) == RC and p.threads == threads
                    assert p.chunk_cols % (16 // eb) == 0 and p.chunks <= chunks
                    assert p.chunks * p.chunk_cols >= R > (p.chunks - 1) * p.chunk_cols
                    assert p.smem_bytes <= models.MAX_DYNAMIC_SMEM == 227 * 1024 - 256
                    assert p.smem_bytes == (16 * ((p.chunks + 1) // 2) + threads // 32 * 32 * 4 + RC * R * eb
                                            + B * L * Cin * 4)
                    assert (sp.row_groups, sp.chunks, sp.smem_bytes, sp.splits, sp.passes, sp.bulk) == (
                        p.ctas, p.chunks, p.smem_bytes, 1, 1, 1)
                    assert sp.workspace_floats == sp.counters == 0
    assert fitted > 900, fitted
    for cin, cout, rc in ((1024, 1024, 8), (2048, 512, 4)):  # the 21 MB shapes: 128 CTAs, about one per SM
        for chunks, threads in ((c, t) for c in (1, 2, 3, 4) for t in ROWS_THREADS):
            p = rmodels.rows_plan(1, cin, cout, 4, 5, 4, chunks, threads, 132)
            assert (p.ok, p.ctas, p.rows_per_cta, p.outputs, p.chunks, p.threads) == (1, 128, rc, 4, chunks,
                                                                                      threads), (cin, chunks)
        assert models.stream_plan(1, cin, cout, 4, 5, 4, {"rows": 1}, 132).row_groups == 128
    assert rmodels.rows_plan(1, 64, 64, 4, 5, 4, 2, 256, 132).ok
    assert not rmodels.rows_plan(1, 64, 64, 4, 5, 4, -1, 256, 132).ok
    # 0 = the rule, by the bytes of w per CTA: >= 128 KB (the 21 MB fp32 convs) 4 chunks, 2 in flight, 512 threads
    for dims, eb, want in (((1, 1024, 1024, 4, 5), 4, (4, 512, 2)), ((1, 2048, 512, 4, 5), 4, (4, 512, 2)),
                           ((1, 1024, 1024, 4, 5), 2, (1, 256, 1)), ((1, 512, 512, 4, 5), 4, (1, 256, 1))):
        p = rmodels.rows_plan(*dims, eb, 0, 0, 132, 0)
        assert (p.chunks, p.threads, p.ahead) == want, (dims, eb, p)
        assert rmodels.rows_plan(*dims, eb, 4, 256, 132, 0).ahead == (2 if want[0] == 4 else 4)  # each knob alone
    assert not rmodels.rows_plan(1, 64, 64, 4, 5, 4, 33, 256, 132).ok
    for threads in (-1, 32, 128, 384, 768, 2048):  # only the instantiated THREADS plan (0: the rule picks one)
        assert not rmodels.rows_plan(1, 64, 64, 4, 5, 4, 2, threads, 132).ok, threads
    assert not models.stream_plan(1, 64, 64, 4, 5, 4, {"rows": 2}).ok
    for bad in ({"row_chunks": -3}, {"row_chunks": 33}, {"row_threads": 384}, {"row_threads": 128},
                {"row_ahead": -2}, {"row_ahead": 33}):
        # validated even when rows = 0 (conv1d_stream_plan checks every knob)
        assert not models.stream_plan(1, 64, 64, 4, 5, 4, bad).ok, bad
        assert not models.stream_plan(1, 64, 64, 4, 5, 4, {**RING, **bad}).ok, bad
    assert models.stream_plan(1, 3, 5, 13, 3, 4, {"rows": 1}).ok  # rows that do not fit: the ring kernel runs
    assert not models.stream_plan(1, 3, 5, 13, 3, 4, {"rows": 1}).rows


# B=2, L=5 (B*L = 10 -> NO 16); L = 1; K = 1; K = 3 with 16-byte rows; Cout not a multiple of RC (at 2 SMs);
# long rows (many columns per thread, several (ci, k) carries); 16-bit rows of whole vectors
ROWS_EMULATED = [(2, 8, 7, 5, 1), (1, 8, 6, 1, 5), (1, 16, 33, 8, 3), (3, 24, 10, 5, 3), (1, 300, 70, 4, 5),
                 (1, 248, 20, 4, 5), (4, 64, 9, 4, 1), (1, 40, 3, 16, 5)]


def rows_close(y, ref) -> bool:
    return bool(np.allclose(y, ref, atol=1e-12))


@pytest.mark.parametrize("threads", ROWS_THREADS)
@pytest.mark.parametrize("dims", ROWS_EMULATED, ids=lambda d: "b{}_c{}_c{}_l{}_k{}".format(*d))
def test_rows_model_computes_the_convolution(dims, threads):
    x, w, b = random_inputs(*dims)
    ref = torch_conv(x, w, b)
    _, Cin, _, _, K = dims
    runs = 0
    for eb in (4, 2):
        if Cin * K * eb % 16:
            continue
        for chunks in (1, 3, 32):
            for sms in (132, 2):
                assert rmodels.rows_plan(*dims, eb, chunks, threads, sms).ok, (eb, chunks, sms)
                for ahead in ((0,) if chunks == 1 else (0, 1, 2)):  # row_ahead: chunks in flight
                    out = rmodels.emulate_rows(x, w, b, eb, chunks, threads, sms, ahead=ahead)
                    assert rows_close(out, ref), (eb, chunks, sms, ahead)
                runs += 1
        # through stream.cu's dispatch: emulate_stream with rows = 1 is emulate_rows
        knobs = {"rows": 1, "row_chunks": 3, "row_threads": threads}
        assert rows_close(models.emulate_stream(x, w, b, eb, knobs, 2), ref)
    assert runs >= 6  # fp32 at least


@pytest.mark.parametrize("threads", ROWS_THREADS)
def test_broken_rows_models_are_caught(threads):
    """The k carry dropped (long rows: K = 5 and THREADS % 5 != 0, so k wraps for the threads that take a second
    column) or the x bounds check one past L (reads the next channel's first value, or past x): the comparison
    above fails."""
    for dims, chunks in (((1, 248, 20, 4, 5), 1), ((2, 300, 70, 2, 5), 1), ((1, 16, 33, 8, 3), 32)):
        x, w, b = random_inputs(*dims)
        ref = torch_conv(x, w, b)
        assert rows_close(rmodels.emulate_rows(x, w, b, 4, chunks, threads, 2), ref)
        assert not rows_close(rmodels.emulate_rows(x, w, b, 4, chunks, threads, 2, broken="bounds"), ref), dims
        if dims != (1, 16, 33, 8, 3):  # 48 columns: no thread takes a second column, so no carry to drop
            broken = rmodels.emulate_rows(x, w, b, 4, chunks, threads, 2, broken="k_carry")
            assert not rows_close(broken, ref), dims


STREAM_KEYS = ("rows_per_warp", "vecs_per_row", "stages", "ctas_per_sm", "cache_policy", "bulk", "rows", "row_chunks",
               "row_threads", "row_ahead")
TILED_KEYS = ("tile", "stages", "ctas_per_sm", "cache_policy", "mma")


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_compiled_host_logic_matches_models(tmp_path):
    """Build the real planners (host code of stream.cu/stream_rows.cu/tiled.cu/optimized.cu; device code only to
    unoptimized PTX, which keeps the build ~10 s), run them: stream plans (rows path included) and conv1d_rows_plan
    itself at the knobs' row_chunks and row_threads (384: not instantiated, both planners reject it), both element
    sizes."""
    sources = [CUDA_TESTS / "conv1d_host_plans.cpp", *(CONV / f for f in ("stream.cu", "stream_rows.cu", "tiled.cu",
                                                                          "optimized.cu"))]
    exe = tmp_path / "plans"
    nvcc_build(exe, sources, ["-gencode", "arch=compute_90,code=compute_90", "-Xcicc", "-O0"], "conv1d")
    rng = np.random.default_rng(0)
    shapes = ALL_SHAPES + [
        (b, cin, cout, ln, k) for b, cout in ((1, 33), (3, 1000)) for cin in (1, 2, 31, 257, 1100, 2048, 2049, 4096)
        for ln in (1, 4, 8, 13, 16, 300) for k in (1, 3, 5, 7, 9)]
    lines = []
    for i, s in enumerate(shapes):  # defaults, then random knob sets (some out of range: plans must agree too)
        sk = [-1] * len(STREAM_KEYS) if i % 3 == 0 else [int(rng.choice(v)) for v in (
            (2, 4, 8), (1, 2, 4), (1, 2, 4, 8, 9), (0, 1, 2, 3), (0, 1, 3, 4), (0, 1, 1, 2), (0, 1, 1, 1, 2),
            (0, 1, 2, 3, 4, 7, 32, 33), (256, 512, 512, 1024, 1024, 384), (0, 0, 1, 2, 3, 32, 33, -2))]
        tk = [-1] * 5 if i % 3 == 0 else [int(rng.choice(v)) for v in ((-1, 0, 1, 2, 3, 4), (-1, 2, 3, 6, 8),
                                                                         (0, 1, 2, 3), (-1, 0, 2), (-1, 0, 1, 2))]
        lines.append((s, int(rng.choice((132, 114, 7))) if i % 3 else 132, sk, tk))
    defaults = [*models.STREAM_DEFAULTS.values(), *tmodels.TILED_DEFAULTS.values()]
    rows_seen = [0, 0]  # plans with the rows path, and fitting rows plans at the knobs' row_chunks and row_threads
    threads_seen = set()  # row_threads of the plans with the rows path

    def fill(knobs, keys, dflt):
        return [dflt[k] if v == -1 else v for k, v in zip(keys, knobs, strict=True)]
    text = "\n".join(" ".join(map(str, [*s, sms, *fill(sk, STREAM_KEYS, models.STREAM_DEFAULTS),
                                        *fill(tk, TILED_KEYS, tmodels.TILED_DEFAULTS)])) for s, sms, sk, tk in lines)
    run = subprocess.run([str(exe)], input=text, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = run.stdout.splitlines()
    assert list(map(int, out[0].split())) == [*defaults, cuda_variants.OPTIMIZED_TILED_MIN_BL, rmodels.ROWS_MAX_CHUNKS]
    for (s, sms, sk, tk), line in zip(lines, out[1:], strict=True):
        got = list(map(int, line.split()))
        sknobs, tknobs = dict(zip(STREAM_KEYS, sk, strict=True)), dict(zip(TILED_KEYS, tk, strict=True))
        opt = omodels.optimized_config(s[1], s[3], s[4])
        filled = dict(zip(STREAM_KEYS, fill(sk, STREAM_KEYS, models.STREAM_DEFAULTS), strict=True))
        chunks, threads, ahead = filled["row_chunks"], filled["row_threads"], filled["row_ahead"]
        plans = [(models.stream_plan(*s, eb, sknobs, sms), rmodels.rows_plan(*s, eb, chunks, threads, sms, ahead))
                 for eb in (4, 2)]
        want = [v for sp, rp in plans for v in (*sp, *rp)]
        want += [*tmodels.tiled_plan(*s, tknobs, sms), *([1, *opt] if opt else [0, 0, 0, 0, 0])]
        assert got == want, (s, sms, sk, tk)
        rows_seen[0] += sum(sp.rows for sp, _ in plans)
        rows_seen[1] += sum(rp.ok for _, rp in plans)
        threads_seen.update(rp.threads for sp, rp in plans if sp.rows)
        if threads == 384:  # not a THREADS instantiation: no rows plan, and no stream plan at all
            assert not any(sp.ok or rp.ok for sp, rp in plans), (s, sk)
    assert min(rows_seen) > 50, rows_seen  # the rows path was really compared
    assert threads_seen == set(ROWS_THREADS), threads_seen


@gpu_test
def test_extension_plans_match_models():
    ext = cuda_variants.extension()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert list(ext.default_knobs("stream")) == [*models.STREAM_DEFAULTS.values(), *tmodels.TILED_DEFAULTS.values()]
    for B, Cin, Cout, L, K in ALL_SHAPES:
        assert tuple(ext.stream_plan(B, Cin, Cout, L, K, 4, None, sms)) == models.stream_plan(B, Cin, Cout, L, K, 4,
                                                                                              None, sms)
        assert tuple(ext.tiled_plan(B, Cin, Cout, L, K, None, sms)) == tmodels.tiled_plan(B, Cin, Cout, L, K, None, sms)
        assert tuple(ext.optimized_config(B, Cin, Cout, L, K)) == omodels.optimized_config(Cin, L, K)


ROWS_GPU_CASES = [c for n in ("smoke", "pusht", "sweep") for c in SUITES[n] if c["B"] * c["L"] <= 16]


@gpu_test
@pytest.mark.parametrize("ahead", [0, 1, 3])
@pytest.mark.parametrize("threads", ROWS_THREADS)
@pytest.mark.parametrize("chunks", [1, 4, 32])
def test_stream_rows_parity_on_gpu(chunks, threads, ahead):
    """stream_rows.cu through the stream binding (rows = 1) on every suite case with B*L <= 16, each dtype it
    declares, at each threads per CTA: the family's parity check and tolerance; the rows kernel is planned exactly
    where the model fits."""
    from dpk.parity import ParityResult, compare, reference_output, resolve_tolerance

    ext = cuda_variants.extension()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    variant = REG.variant("conv1d", "stream")
    knobs = cuda_variants.StreamKnobs(rows=1, row_chunks=chunks, row_threads=threads, row_ahead=ahead)
    planned = 0
    assert ROWS_GPU_CASES
    for case in ROWS_GPU_CASES:
        x, w, b = FAM.make_inputs(case, dev)
        B, Cin, Cout, L, K = shape(case)
        eb = x.element_size()
        plan = tuple(ext.stream_plan(B, Cin, Cout, L, K, eb, knobs.as_list()[:len(models.STREAM_DEFAULTS)], sms))
        fits = rmodels.rows_plan(B, Cin, Cout, L, K, eb, chunks, threads, sms).ok
        assert plan == tuple(models.stream_plan(B, Cin, Cout, L, K, eb,
                                                {"rows": 1, "row_chunks": chunks, "row_threads": threads,
                                                 "row_ahead": ahead}, sms))
        assert plan[-1] == fits, case.id
        planned += fits
        out = cuda_variants.run_stream(x, w, b, knobs)
        torch.cuda.synchronize()
        res = ParityResult("conv1d", f"stream rows chunks{chunks} t{threads} ahead{ahead}", case.id, case.dtype)
        compare([out], reference_output(FAM, case, dev), resolve_tolerance(FAM, variant, case), res)
        assert out.dtype == x.dtype and out.shape == (B, Cout, L), case.id
        assert res.mismatches == 0, (case.id, res.summary())
    assert planned >= 10, planned
