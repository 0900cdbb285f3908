"""chain family: the reference and its tolerance, bad input, broken chains that parity must catch, and (GPU) the
four CUDA orders against the reference, the grid barrier's state carried across launches."""
from __future__ import annotations

import importlib

import pytest
import torch

from dpk import parity, registry
from dpk.cases import load_suite_file, make_case

from ._helpers import ROOT, gpu_test

REG = registry.load([ROOT / "kernels"], strict=True)
CHECKS = importlib.import_module("dpk.families.chain._checks")
REF = importlib.import_module("dpk.families.chain.reference")
CPU = torch.device("cpu")
SMOKE = load_suite_file(ROOT / "suites" / "chain.yaml").suites["smoke"]
CUDA_VARIANTS = ("stream", "pdl", "grid_barrier", "grid_counter")


@pytest.mark.parametrize("case", SMOKE, ids=[c.id for c in SMOKE])
def test_eager_passes_far_inside_the_tolerance(case):
    res = parity.check(REG, "chain", "eager", case, CPU)
    assert res.ok and res.max_abs < 0.05 * REF.tolerance(case, "float32").atol, res.summary()


def test_reference_is_the_written_recurrence():
    x = torch.tensor([1.0, -1.0, 0.5, 0.25], dtype=torch.float64)
    y = REF.reference(x, CHECKS.ChainSpec(ops=1, ctas=1))
    mean = x.mean()  # gather (5 i + 1) mod 4 = 1, 2, 3, 0
    assert torch.equal(y, 0.5 * x[[1, 2, 3, 0]] + 0.5 * mean)


def test_tolerance_grows_with_ops_and_sqrt_n():
    tol = {(n, ops): REF.tolerance(make_case("chain", "t", n=n, ops=ops, ctas=1), "float32").atol
           for n in (100, 400) for ops in (1, 2)}
    assert tol[(100, 2)] == pytest.approx(2 * tol[(100, 1)])
    assert tol[(400, 1)] / tol[(100, 1)] == pytest.approx((0.5 * 20 + 3) / (0.5 * 10 + 3))


# --- broken chains the parity check must catch --------------------------------------------------------------

def off_by_one_gather(x, spec):
    """x[5 i mod n] instead of x[(5 i + 1) mod n]."""
    idx = (torch.arange(x.numel()) * 5) % x.numel()
    for _ in range(spec.ops):
        x = 0.5 * x[idx] + 0.5 * x.mean()
    return x


def one_op_short(x, spec):
    return REG.variant("chain", "eager").fn(x, CHECKS.ChainSpec(ops=spec.ops - 1, ctas=spec.ctas)) \
        if spec.ops > 1 else x


def no_exchange(x, spec):
    """Each CTA's mean over its own slice only: what a kernel that skipped the all-to-all read would compute."""
    n = x.numel()
    per = -(-n // spec.ctas)
    idx = REF.gather_index(n)
    for _ in range(spec.ops):
        local = torch.cat([x[i:i + per].mean().expand(min(per, n - i)) for i in range(0, n, per)])
        x = 0.5 * x[idx] + 0.5 * local
    return x


@pytest.mark.parametrize("broken", [off_by_one_gather, one_op_short, no_exchange])
def test_broken_chains_fail_parity(broken):
    REG.add_variant(registry.Variant("chain", broken.__name__, broken))
    try:
        case = make_case("chain", "broken", n=4096, ctas=7, ops=4)
        res = parity.check(REG, "chain", broken.__name__, case, CPU)
        assert res.status == "fail" and res.mismatches > 0, res.summary()
    finally:
        del REG.variants["chain"][broken.__name__]


# --- bad input ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("x,spec,err,msg", [
    (torch.zeros(8, dtype=torch.float64), CHECKS.ChainSpec(2, 2), TypeError, "unsupported dtype"),
    (torch.zeros(2, 4), CHECKS.ChainSpec(2, 2), ValueError, "1-d"),
    (torch.zeros(0), CHECKS.ChainSpec(2, 2), ValueError, "non-empty"),
    ([1.0, 2.0], CHECKS.ChainSpec(2, 2), TypeError, "torch.Tensor"),
    (torch.zeros(8), (2, 2), TypeError, "ChainSpec"),
    (torch.zeros(8)[::2], CHECKS.ChainSpec(2, 2), ValueError, "contiguous"),
])
def test_bad_input_raises_clearly(x, spec, err, msg):
    with pytest.raises(err, match=msg):
        REG.variant("chain", "eager").fn(x, spec)


@pytest.mark.parametrize("kwargs", [{"ops": 0, "ctas": 1}, {"ops": 2, "ctas": -1}, {"ops": 1.5, "ctas": 1}])
def test_bad_spec_raises(kwargs):
    with pytest.raises(ValueError, match="integer >= 1"):
        CHECKS.ChainSpec(**kwargs)


def test_bf16_case_is_refused():
    with pytest.raises(ValueError, match="float32 only"):
        REF.make_inputs(make_case("chain", "b", dtype="bfloat16", n=8, ops=1, ctas=1), CPU)


# --- the CUDA orders on a GPU -------------------------------------------------------------------------------

GPU_CASES = [(4096, 128, 30), (8192, 256, 7), (100, 3, 5), (36, 64, 2), (4096, 1, 3)]


@gpu_test
@pytest.mark.parametrize("variant", CUDA_VARIANTS)
@pytest.mark.parametrize("n,ctas,ops", GPU_CASES)
def test_cuda_orders_match_the_reference(variant, n, ctas, ops):
    case = make_case("chain", "gpu", n=n, ctas=ctas, ops=ops)
    res = parity.check(REG, "chain", variant, case, torch.device("cuda"))
    assert res.ok, res.summary()


@gpu_test
@pytest.mark.parametrize("variant", ["grid_barrier", "grid_counter"])
def test_grid_barrier_state_carries_across_launches(variant):
    """The barrier's words end every launch as they began: many replays (and a fresh input) stay exact."""
    x, spec = REF.make_inputs(make_case("chain", "g", n=4096, ctas=132, ops=30), torch.device("cuda"))
    fn, ref = REG.variant("chain", variant).fn, REF.reference(x.cpu(), spec)
    for _ in range(50):
        out = fn(x, spec)
    tol = REF.tolerance(make_case("chain", "g", n=4096, ctas=132, ops=30), "float32").atol
    assert (out.cpu().double() - ref).abs().max().item() <= tol
    x2 = x.flip(0).contiguous()
    assert torch.allclose(fn(x2, spec).cpu().double(), REF.reference(x2.cpu(), spec), atol=tol, rtol=0)


@gpu_test
def test_unsupported_shapes_are_unavailable():
    import dpk
    x = torch.zeros(99, device="cuda")
    with pytest.raises(dpk.Unavailable, match="multiple of 4"):
        REG.variant("chain", "pdl").fn(x, CHECKS.ChainSpec(2, 2))
    with pytest.raises(dpk.Unavailable, match="resident"):
        REG.variant("chain", "grid_barrier").fn(torch.zeros(4096, device="cuda"), CHECKS.ChainSpec(2, 100000))


def test_graph_start_separates_from_the_per_op_cost():
    """The pusht suite pairs ops 1 and 30 at equal n and ctas, so (t30 - t1) / 29 is the cost of one op."""
    cases = load_suite_file(ROOT / "suites" / "chain.yaml").suites["pusht"]
    pairs = {(c["n"], c["ctas"]) for c in cases if c["ops"] == 1}
    assert pairs and all(any(c["ops"] == 30 and (c["n"], c["ctas"]) == p for c in cases) for p in pairs)
    assert min(c["ops"] for c in cases) == 1
