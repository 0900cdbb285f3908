"""The policy family on CPU: parity of the CPU variants, the noise identity with diffusers, the kernels loop on the
emulated layer kernels, the derived tolerance, broken loops caught, bad input named. GPU variants: `-m gpu`."""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from dpk import registry
from dpk.runner import Selection, Session

from ._helpers import ROOT, gpu_test

REG = registry.load([ROOT / "kernels"], strict=True)
REF = importlib.import_module("dpk.families.policy.reference")
CHUNK = importlib.import_module("dpk.families.policy._chunk")
ORACLE = importlib.import_module("dpk.families.policy._oracle")
TV = importlib.import_module("dpk.families.policy.torch_variants")
CV = importlib.import_module("dpk.families.policy.cuda_variants")
STEPS = importlib.import_module("dpk.families.denoise._steps")
PROGRAM = importlib.import_module("dpk.families.unet1d._program")
EMULATE = importlib.import_module("dpk.families.unet1d._emulate")
NET = importlib.import_module("dpk.families.unet1d._net")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def session() -> Session:
    return Session(strict=True, device=CPU)


def smoke_ids(session: Session) -> list[str]:
    return [c.id for c in session.cases("policy", "smoke")]


def inputs_of(session: Session, name: str, suite: str = "smoke", **params) -> tuple:
    case = session.find_case("policy", name, suite)
    if params:
        case = dataclasses.replace(case, params=tuple((dict(case.params) | params).items()))
    return case, REF.make_inputs(case, CPU)


def usage(out: torch.Tensor, ref: torch.Tensor, tol) -> float:
    return float(((out.double() - ref).abs() / (tol.atol + tol.rtol * ref.abs())).max())


@pytest.mark.parametrize("name", ["tiny_k3_b2_ddpm10.fp32", "tiny_k3_b1_ddim16.fp32", "tiny_nocond_b1_ddim16_eta05",
                                  "tiny_k3_b1_ddpm10_devgen", "tiny_k3_b2_ddpm10.bf16", "tiny_k3_b1_ddim16.bf16"])
def test_cpu_variants_pass_parity(session, name):
    results = list(session.check(Selection(families=["policy"], cases=[name])))
    got = {r.variant: r.status for r in results}
    assert got["eager_diffusers"] == "pass" and got["eager_loop"] == "pass", [r.summary() for r in results]
    assert {got[v] for v in ("compiled", "graph_loop", "graph_per_step", "kernels_loop")} == {"unavailable"}


@pytest.mark.parametrize("name", ["tiny_k3_b2_ddpm10.fp32", "tiny_nocond_b1_ddim16_eta05", "tiny_k3_b1_ddpm10_devgen"])
def test_diffusers_draws_exactly_the_predrawn_noise(session, name, monkeypatch):
    """Every draw diffusers makes (the initial trajectory, each step's z) is the stacked noise's row."""
    import diffusers.schedulers.scheduling_ddim as ddim
    import diffusers.schedulers.scheduling_ddpm as ddpm
    import diffusers.utils.torch_utils as tu

    drawn = []
    real = tu.randn_tensor

    def spy(*a, **kw):
        out = real(*a, **kw)
        drawn.append(out.clone())
        return out
    for mod in (tu, ddpm, ddim):
        monkeypatch.setattr(mod, "randn_tensor", spy)
    _, inputs = inputs_of(session, name)
    noise, chunk = inputs[3], inputs[4]
    TV.eager_diffusers(*inputs)
    rows = [0] + [k + 1 for k in range(chunk.steps) if STEPS.draws_noise(chunk.schedule, k)]
    assert len(drawn) == len(rows)
    for got, row in zip(drawn, rows):
        assert torch.equal(got, noise[row])
    assert all(not noise[k + 1].any() for k in range(chunk.steps) if not STEPS.draws_noise(chunk.schedule, k))


def emulated_kernels_loop(inputs: tuple) -> torch.Tensor:
    """kernels_loop's step_form_loop with unet1d's CPU emulation of the layer kernels and the torch step."""
    global_cond, image, agent_pos, noise, chunk = inputs
    B, T = noise.shape[1], noise.shape[2]
    program = PROGRAM.build_program(chunk.net.module, B, T, "step", sms=7)
    table = chunk.net.table(chunk.schedule.num_train_timesteps)
    io = {"sample": noise[0].clone(), "t": torch.zeros(B, dtype=torch.int64),
          "obs": torch.zeros(B, table.shape[1])}

    def forward() -> torch.Tensor:
        return EMULATE.emulate(program, io | {"table": table}).float()

    def step(eps, x, z, i, schedule, out):
        return out.copy_(STEPS.fused_step(eps, x, z, i, schedule))
    with torch.no_grad():
        return CV.step_form_loop(chunk, CHUNK.condition(chunk, global_cond, image, agent_pos), noise, io, forward,
                                 step)


@pytest.mark.parametrize("name", ["tiny_k3_b2_ddpm10.fp32", "tiny_k3_b1_ddim16.fp32", "tiny_nocond_b1_ddim16_eta05",
                                  "tiny_k3_b2_ddpm10.bf16", "tiny_k3_b1_ddim16.bf16"])
def test_kernels_loop_on_emulated_kernels_matches_the_reference(session, name):
    """On a bf16 net too, within the float32 bound: the kernels' only bf16 numbers are the weights."""
    case, inputs = inputs_of(session, name)
    ref = REF.reference(*inputs)
    got = emulated_kernels_loop(inputs)
    assert got.dtype == torch.float32
    assert usage(got, ref, REF.tolerance(case, "float32")) <= 1


def test_bf16_chunk_is_the_bf16_nets_and_needs_its_bound(session):
    """A bf16 case runs the bf16 weights (the oracle too); its PyTorch loop (bf16 activations) passes the bf16
    bound and not the float32 one; broken loops still fail the bf16 bound."""
    case, inputs = inputs_of(session, "tiny_k3_b2_ddpm10.bf16")
    global_cond, _, _, noise, chunk = inputs
    assert chunk.net.dtype == torch.bfloat16 and noise.dtype == torch.float32
    assert torch.equal(chunk.net.reference_module().final_conv[1].weight,
                       chunk.net.module.final_conv[1].weight.double())
    ref = REF.reference(*inputs)
    loose, tight = REF.tolerance(case, "tf32"), REF.tolerance(case, "float32")
    assert "bfloat16 activations" in loose.why and tight.atol < loose.atol / 100
    ts, idx = chunk.timesteps(CPU), chunk.step_indices(CPU)
    unclipped = dataclasses.replace(chunk.schedule, clip_sample=False)

    def loop(row_shift=1, schedule=chunk.schedule):
        x = noise[0]
        with torch.no_grad():
            for k in range(chunk.steps):
                x = STEPS.fused_step(chunk.unet(x, ts[k], global_cond), x, noise[k + row_shift], idx[k], schedule)
        return x
    assert usage(loop(), ref, loose) <= 1 < usage(loop(), ref, tight)
    for broken in (loop(row_shift=0), loop(schedule=unclipped)):
        assert usage(broken, ref, loose) > 1


def test_broken_loops_are_caught(session):
    """Off-by-one noise rows, timesteps shifted by one, a missing clip: each fails the float32 tolerance."""
    case, inputs = inputs_of(session, "tiny_k3_b2_ddpm10.fp32")
    global_cond, _, _, noise, chunk = inputs
    ref, tol = REF.reference(*inputs), REF.tolerance(case, "float32")
    module, s = chunk.net.module, chunk.schedule
    ts, idx = chunk.timesteps(CPU), chunk.step_indices(CPU)
    unclipped = dataclasses.replace(s, clip_sample=False)

    def loop(row_shift=1, t_shift=0, schedule=s):
        x = noise[0]
        with torch.no_grad():
            for k in range(chunk.steps):
                eps = module(x, ts[k] + t_shift, global_cond)
                x = STEPS.fused_step(eps, x, noise[k + row_shift], idx[k], schedule)
        return x
    assert usage(loop(), ref, tol) <= 1
    for broken in (loop(row_shift=0), loop(t_shift=1), loop(schedule=unclipped)):
        assert usage(broken, ref, tol) > 1


def test_tolerance_follows_the_injected_error(session):
    """The shadow gap scales with the per-step error it injects; DDIM eta 0 in float32 is the tightest."""
    case, inputs = inputs_of(session, "tiny_k3_b1_ddim16.fp32")
    chunk = inputs[4]
    clean = ORACLE.loop64(chunk, *inputs[:4])
    gaps = []
    for sigma in (1e-7, 2e-7):
        shadow = ORACLE.loop64(chunk, *inputs[:4], perturb=ORACLE._shadow_perturb(1, sigma, 0.0))
        gaps.append(float((shadow - clean).pow(2).mean().sqrt()))
    assert gaps[0] > 0 and gaps[1] / gaps[0] == pytest.approx(2.0, rel=0.05)
    fp32, tf32 = REF.tolerance(case, "float32"), REF.tolerance(case, "tf32")
    assert fp32.atol < tf32.atol and "shadow" in fp32.why


def test_bad_input_is_named(session):
    global_cond, image, agent_pos, noise, chunk = inputs_of(session, "tiny_k3_b2_ddpm10.fp32")[1]
    with pytest.raises(ValueError, match=r"global_cond must be \(2, 5\)"):
        TV.eager_loop(global_cond[:, :4], image, agent_pos, noise, chunk)
    with pytest.raises(ValueError, match="noise must be"):
        TV.eager_loop(global_cond, image, agent_pos, noise[:-1], chunk)
    with pytest.raises(ValueError, match="no encoder stage"):
        TV.eager_loop(global_cond, torch.zeros(2, 2, 3, 8, 8), agent_pos, noise, chunk)
    with pytest.raises(TypeError, match="float64"):
        TV.eager_loop(global_cond.double(), image, agent_pos, noise, chunk)
    with pytest.raises(TypeError, match="policy Chunk"):
        TV.eager_loop(global_cond, image, agent_pos, noise, object())
    with pytest.raises(ValueError, match="prediction_type 'sample' is not supported"):
        inputs_of(session, "tiny_k3_b2_ddpm10.fp32", prediction_type="sample")
    with pytest.raises(ValueError, match="not a multiple of 2"):
        inputs_of(session, "tiny_k3_b2_ddpm10.fp32", T=7)


def test_work_is_steps_times_the_conv_floor(session):
    case = session.find_case("policy", "blog_b1_ddpm100", "pusht")
    ddim = session.find_case("policy", "blog_b1_ddim16", "pusht")
    per_forward = NET.conv_bytes(NET.case_config(case.p), torch.float32)
    assert REF.work(case).bytes == 100 * per_forward and REF.work(ddim).bytes == 16 * per_forward


def staged(variant: str, inputs: tuple) -> dict:
    hook = REG.variant("policy", variant).stages
    return {s.name: (s.count, s.fn()) for s in hook(*inputs)}


@pytest.mark.parametrize("name", ["tiny_k3_b2_ddpm10.fp32", "tiny_enc_b2_ddim16", "tiny_k3_b2_ddpm10.bf16"])
def test_eager_stages_are_the_parts_of_the_call(session, name):
    """encoder (when on) once, unet and step S times, each the loop's own part at the middle step."""
    _case, inputs = inputs_of(session, name)
    chunk, S = inputs[-1], inputs[-1].steps
    want = {"unet": S, "step": S} | ({"encoder": 1} if chunk.encoder is not None else {})
    p = importlib.import_module("dpk.families.policy._stages").probe(*inputs)
    for variant in ("eager_diffusers", "eager_loop"):
        got = staged(variant, inputs)
        assert {n: c for n, (c, _) in got.items()} == want and list(got)[-2:] == ["unet", "step"]
        assert torch.allclose(got["unet"][1], p.eps, atol=1e-5) and got["step"][1].shape == p.x.shape
        if chunk.encoder is not None:
            assert next(iter(got)) == "encoder" and torch.equal(got["encoder"][1], p.cond)
    x_next = STEPS.fused_step(p.eps, p.x, inputs[3][p.k + 1], chunk.step_indices(CPU)[p.k], chunk.schedule)
    assert torch.equal(staged("eager_loop", inputs)["step"][1], x_next)


@gpu_test
@pytest.mark.parametrize("name", ["tiny_k3_b2_ddpm10.fp32", "tiny_enc_b2_ddim16"])
def test_graph_stages_replay_the_parts(name):
    """Each graph variant's stages replay (after its first call, as the runner calls the hook) and leave the
    variant's next call's answer unchanged."""
    dev = torch.device("cuda")
    s = Session(strict=True, device=dev)
    inputs = REF.make_inputs(s.find_case("policy", name, "smoke"), dev)
    for variant in ("graph_loop", "graph_per_step", "kernels_loop"):
        fn = REG.variant("policy", variant).fn
        want = fn(*inputs)
        stages = REG.variant("policy", variant).stages(*inputs)
        assert [st.name for st in stages][-2:] == ["unet", "step"], variant
        for st in stages:
            st.fn()
        assert torch.equal(fn(*inputs), want), variant


@gpu_test
@pytest.mark.parametrize("name", ["tiny_k3_b2_ddpm10.fp32", "tiny_k3_b1_ddim16.fp32", "tiny_k3_b2_ddpm10.bf16"])
def test_graph_variants_replay_fresh_inputs(name):
    """A second call with other inputs gives that call's answer (captured buffers are refilled every call)."""
    dev = torch.device("cuda")
    s = Session(strict=True, device=dev)
    case = s.find_case("policy", name, "smoke")
    a = REF.make_inputs(case, dev)
    b = REF.make_inputs(dataclasses.replace(case, seed=case.seed + 1), dev)
    for fn in (TV.graph_loop, CV.graph_per_step):
        want_b = TV.eager_loop(*b)
        fn(*a)
        got_b = fn(*b)
        assert float((got_b - want_b).abs().max()) < 1e-3
        assert not torch.equal(fn(*a), got_b)
