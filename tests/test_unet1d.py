"""unet1d family on CPU: the model's configs, the kernels path's program (emulated in float64 against the model),
its plans against the kernel's limits, the C ABI and shared-memory carve against the built library, the step
form, the tolerance's power to separate fp32 from TF32 and from bugs, bad input, checkpoints through the family."""
from __future__ import annotations

import ctypes
import importlib
import math

import pytest
import torch

import dpk
from dpk import parity, registry
from dpk.build import nvcc_path

from .conftest import ROOT

registry.load([ROOT / "kernels"], strict=True)
M = importlib.import_module("dpk.families.unet1d._unet")
P = importlib.import_module("dpk.families.unet1d._program")
PLAN = importlib.import_module("dpk.families.unet1d._plan")
OPS = importlib.import_module("dpk.families.unet1d._ops")
PACK = importlib.import_module("dpk.families.unet1d._pack")
E = importlib.import_module("dpk.families.unet1d._emulate")
FILM = importlib.import_module("dpk.families.unet1d._film")
REF = importlib.import_module("dpk.families.unet1d.reference")
NET = importlib.import_module("dpk.families.unet1d._net")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def session():
    from dpk.runner import Session

    return Session(strict=True)


def smoke_configs(session) -> dict[str, object]:
    return {c.name.split("_b")[0]: M.UNetConfig.from_params(c.p) for c in session.cases("unet1d", "smoke")}


def meta_model(cfg) -> M.ConditionalUnet1D:
    with torch.device("meta"):
        return M.ConditionalUnet1D(cfg)


def test_real_configs_have_the_published_sizes(session):
    sizes = {}
    for name in ("blog", "pusht_image"):
        case = session.find_case("unet1d", f"{name}_b1_step", "pusht")
        model = meta_model(M.UNetConfig.from_params(case.p))
        sizes[name] = sum(p.numel() for p in model.parameters())
    assert round(sizes["blog"] / 1e6, 2) == 79.95
    assert round(sizes["pusht_image"] / 1e6, 1) == 251.5


def emulation_case(cfg, seed: int, batch: int, T: int, form: str) -> tuple[object, dict, torch.Tensor]:
    """A model with seeded weights, the emulation's inputs in `form`, and its float64 twin's output."""
    model, ref = M.build(cfg, seed), M.build(cfg, seed).double()
    g = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, T, cfg.input_dim, generator=g)
    gc = torch.randn(batch, cfg.global_cond_dim, generator=g)
    t = torch.randint(0, 100, (batch,), generator=g)
    with torch.no_grad():
        want = ref(x.double(), t.double(), gc.double() if cfg.global_cond_dim else None)
    io = {"sample": x, "t": t}
    if form == "plain":
        io["global_cond"] = gc
    else:
        io["obs"] = FILM.observe(ref, gc.double() if cfg.global_cond_dim else None, batch)
        io["table"] = FILM.step_table(ref, 100).double()
    return model, io, want


@pytest.mark.parametrize("form", ["plain", "step"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", ["tiny_k3", "tiny_l12", "tiny_nocond"])
def test_emulated_program_is_the_model(session, name, batch, form):
    """The op program (packing, phases of the transposed conv, FiLM offsets, stored skips) computes the model."""
    cfg = smoke_configs(session)[name]
    T = 2 * cfg.horizon_multiple * (3 if name == "tiny_l12" else 2)
    model, io, want = emulation_case(cfg, 1, batch, T, form)
    got = E.emulate(P.build_program(model, batch, T, form, sms=7), io)
    scale = float(want.detach().abs().max())
    limit = 1e-12 if form == "plain" else 1e-6  # the step table is stored in float32
    assert float((got - want).abs().max()) <= limit * max(scale, 1.0)


@pytest.mark.parametrize("form", ["plain", "step"])
def test_a_riding_residual_conv_is_the_model(session, form):
    """Where a block's 1x1 residual conv rides on its first conv's CTAs (taps k + 1 packed together), the program
    still computes the model; with the rider's tap taken from the carrier's first tap instead, it does not."""
    model, io, want = emulation_case(smoke_configs(session)["tiny_k3"], 4, 1, 8, form)
    prog = P.build_program(model, 1, 8, form, sms=3)  # 16 rows at L = 8, 24 at L = 4: CTAs of 8 fill the SMs
    carriers = [op for op in prog.ops if op.segs[-1].rider]
    assert [op.name for op in carriers] == ["down0.res0.conv1", "down1.res0.conv1", "up0.res0.conv1"]
    assert all(op.segs[0].simt == 2 and op.grid == op.segs[0].ncta for op in carriers)
    got = E.emulate(prog, io)
    assert float((got - want).abs().max()) <= 1e-6 * max(float(want.abs().max()), 1.0)
    a = carriers[-1].segs[0]
    W = prog.params.parts[list(prog.params.offsets).index(a.w.name)][1].view(a.ncta, a.nstages, -1, a.cb, 2, a.taps)
    W[..., a.k] = W[..., 0]  # the rider reads a conv tap
    assert float((E.emulate(prog, io) - want).abs().max()) > 1e-3


def test_a_wrong_program_is_caught_by_the_emulation(session):
    """The emulation can fail: the transposed conv's phases swapped, or a skip left out, change the output."""
    cfg = smoke_configs(session)["tiny_l12"]
    model = M.build(cfg, 2)
    x, t, gc = torch.randn(1, 12, 3), torch.tensor([5]), torch.randn(1, 7)
    with torch.no_grad():
        want = M.build(cfg, 2).double()(x.double(), t.double(), gc.double())
    prog = P.build_program(model, 1, 12, "plain", sms=5)
    up = next(op for op in prog.ops if op.name.endswith("upsample"))
    up.segs[0].ophase, up.segs[1].ophase = 1, 0
    got = E.emulate(prog, {"sample": x, "t": t, "global_cond": gc})
    assert float((got - want).detach().abs().max()) > 1e-3


def test_groupnorm_partials_of_16_outputs_are_the_model(session):
    """Where a producer's CTAs hold 16 outputs (2 rows at L = 8), its GroupNorm partials cover 16 and the reader
    combines them as such; read or written as partials of 8, the statistics and the output go wrong."""
    model, io, want = emulation_case(smoke_configs(session)["tiny_k3"], 3, 1, 8, "step")
    prog = P.build_program(model, 1, 8, "step", sms=7)
    readers = [op for op in prog.ops if op.stat_in is not None and op.stat_in_n == 16]
    assert readers, "no op reads partials of 16 outputs"
    assert float((E.emulate(prog, io) - want).abs().max()) <= 1e-6 * max(float(want.abs().max()), 1.0)
    readers[0].stat_in_n = 8
    assert float((E.emulate(prog, io) - want).abs().max()) > 1e-3
    readers[0].stat_in_n = 16  # and the writer: its stat_out_n (unet1d.h) is the one count both sides use
    writer = next(op for op in prog.ops if op.stat_out == readers[0].stat_in)
    assert writer.stat_out_n == 16 == PLAN.partial_outputs(writer.segs[0])
    writer.stat_out_n = 8
    assert float((E.emulate(prog, io) - want).abs().max()) > 1e-3


@pytest.mark.parametrize("form", ["plain", "step"])
def test_bf16_weights_are_the_bf16_model(session, form):
    """A bf16 net's program: its SIMT segments (riders included) hold bf16 weights, two per fp32 slot, the tensor-core
    ones fp32; emulated, it computes the float64 model of the same bf16 weights. With each pair's halves swapped
    (the kernel reading element 2i + 1 for 2i), it does not."""
    cfg = smoke_configs(session)["tiny_k3"]
    model = M.build(cfg, 4).to(torch.bfloat16)
    ref = M.build(cfg, 4).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    g = torch.Generator().manual_seed(1)
    x, gc, t = torch.randn(1, 8, cfg.input_dim, generator=g), torch.randn(1, cfg.global_cond_dim, generator=g), \
        torch.tensor([17])
    with torch.no_grad():
        want = ref(x.double(), t.double(), gc.double())
    io = {"sample": x, "t": t}
    if form == "plain":
        io["global_cond"] = gc
    else:
        io["obs"], io["table"] = FILM.observe(ref, gc.double(), 1), FILM.step_table(ref, 100).double()
    prog = P.build_program(model, 1, 8, form, sms=3)
    segs = [s for op in prog.ops for s in op.segs]
    assert any(s.rider and s.wbf16 for s in segs)
    assert all(s.wbf16 == bool(s.simt or s.rider) for s in segs) and any(not s.simt for s in segs)
    a = next(s for s in segs if s.wbf16 and not s.rider)
    packed = prog.params.parts[list(prog.params.offsets).index(a.w.name)][1]
    assert packed.dtype == torch.float32 and packed.numel() == a.ncta * a.nstages * a.stage_elems // 2
    limit = 1e-12 if form == "plain" else 1e-6  # the step table is stored in float32
    assert float((E.emulate(prog, io) - want).abs().max()) <= limit * max(float(want.abs().max()), 1.0)
    pairs = packed.view(torch.bfloat16).view(-1, 2)
    pairs.copy_(pairs.flip(1))
    assert float((E.emulate(prog, io) - want).abs().max()) > 1e-3


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["plain", "step"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", ["blog", "pusht_image"])
def test_plans_respect_the_kernel(session, name, batch, form, wdtype):
    case = session.find_case("unet1d", f"{name}_b1_step", "pusht")
    prog = P.build_program(meta_model(M.UNetConfig.from_params(case.p)).to(wdtype), batch, 16, form)
    produced: dict[str, int] = {}
    for j, op in enumerate(prog.ops):
        assert op.smem_bytes == PLAN.smem_bytes(op) <= PLAN.SMEM_MAX
        assert op.threads == PLAN.threads_for(max(s.nb for s in op.segs))
        assert op.grid == op.batch_grid * sum(s.ncta for s in op.segs if not s.rider)
        assert op.cin_pad >= op.cin and 1 <= op.ring <= PLAN.MAX_RING
        if batch == 1 and op.smem_bytes > PLAN.SMEM_BUDGET:  # one CTA per SM: one wave, no second one
            assert op.grid <= PLAN.SMS, (op.name, op.grid)
        for s in op.segs:
            assert s.nb <= (PLAN.MAX_NB if op.cols <= 16 else 2)
            assert s.rc == 8 * s.nb or (s.simt and s.rc % 2 == 0 and s.nb == -(-s.rc // 8)), (op.name, s.rc)
            assert bool(s.simt) == PLAN.simt_fits(op, s)
            assert s.ncta * s.rc >= s.rows and s.nstages * s.cb >= s.cin and s.cb % 8 == 0
            assert s.stage_bytes % 16 == 0, "bulk copies move multiples of 16 bytes"
            # a bf16 net's weights are bf16 where the SIMT form reads them, fp32 where tensor cores do
            assert s.wbf16 == int(wdtype == torch.bfloat16 and bool(s.simt or s.rider)), (op.name, s.wbf16)
        for s in op.srcs:  # nothing the previous op wrote is read before the dependency wait
            for buf, flag in ((s.raw, s.early), (s.res, s.res_early), (s.film_a, s.coef_early)):
                if flag and buf is not None:
                    assert produced.get(buf.name, -1) <= j - 2, (op.name, buf.name)
        for s in op.segs:
            produced[s.out.name] = j
        if op.mat is not None:
            produced[op.mat.name] = j
    assert 0.999 < prog.conv_bytes() / REF.work(case).bytes <= 1  # the floor also counts biases and affines
    # GroupNorm statistics from the producer's partials wherever an op normalises its predecessor's output (all 25)
    linked = [(a, o) for a, o in zip(prog.ops, prog.ops[1:]) if o.stat_in is not None]
    assert all(a.stat_out == o.stat_in and PLAN.partials_fit(a, o) for a, o in linked)
    assert len(linked) == sum(1 for o in prog.ops if o.srcs[0].gamma is not None) == 25
    # every block's residual conv at 4 and 8 columns rides on its first conv's CTAs at B = 1 where those fill the SMs
    riders = [op.name for op in prog.ops if op.segs[-1].rider]
    assert all(op.segs[0].simt == 2 and op.segs[1].cta0 * op.batch_grid == op.grid for op in prog.ops
               if op.segs[-1].rider)
    assert len(riders) == (0 if batch > 1 else 4), riders
    # at 4 and 8 columns the same convs run as fp32 FMAs (SIMT): 94% of the weight bytes at B = 1, 77-87% at B = 8
    simt = sum(s.weight_bytes for op in prog.ops for s in op.segs if s.simt)
    assert simt / prog.conv_bytes() > (0.9 if batch == 1 else 0.75)


@pytest.mark.parametrize("simt", [0, 1])
def test_weight_packing_is_the_kernels_layout(simt):
    """pack_weight puts each weight where unet1d_stages.cuh reads it: the SIMT form's thread (pair g, channel c)
    reads its 2 K weights contiguously at ((g cb + c) 2 + row) K + tap of the stage; a tensor-core lane reads (row,
    channel c % 4 and c % 4 + 4) of one tap as one float2. unpack_weight inverts it, padding included."""
    s = OPS.Segment(rows=7, cin=13, k=3, out=OPS.Buf("y"), ob=0, oc=0, ol=0, l_out=4, rc=8, cb=8, nstages=2,
                    ncta=1, nb=1, simt=simt)
    w = torch.arange(7 * 13 * 3, dtype=torch.float64).reshape(7, 13, 3) + 1
    flat = PACK.pack_weight(w, s)
    stage = s.stage_elems
    for row, ci, t in [(0, 0, 0), (6, 12, 2), (3, 9, 1), (5, 4, 2)]:
        st, c = divmod(ci, s.cb)
        if simt:
            g, rr = divmod(row, PLAN.SIMT_RPT)
            at = st * stage + ((g * s.cb + c) * PLAN.SIMT_RPT + rr) * s.k + t
        else:  # [channel block][tap][row block][lane = 4 row + c % 4][c // 4 within the block]
            at = st * stage + (((c // 8) * s.k + t) * s.nb * 32 + 4 * row + c % 4) * 2 + (c % 8) // 4
        assert float(flat[at]) == float(w[row, ci, t]), (simt, row, ci, t)
    full = PACK.unpack_weight(flat, s)
    assert torch.equal(full[:7, :13], w) and not full[7:].any() and not full[:, 13:].any()


@pytest.fixture(scope="module")
def library():
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    L = importlib.import_module("dpk.families.unet1d._launch")
    return L, L.declare(ctypes.CDLL(str(L.library_path())))


@pytest.mark.slow
def test_library_and_planner_agree(session, library):
    """The ctypes structs are the C structs, and the kernel's shared-memory carve is the planner's."""
    L, lib = library
    sizes = [ctypes.c_int() for _ in range(3)]
    lib.dpk_unet1d_struct_sizes(*sizes)
    assert [s.value for s in sizes] == [ctypes.sizeof(L.CSource), ctypes.sizeof(L.CSegment), ctypes.sizeof(L.COp)]
    case = session.find_case("unet1d", "pusht_image_b1_plain", "pusht")
    for batch, wdtype in ((1, torch.float32), (8, torch.float32), (1, torch.bfloat16)):
        # B = 1 has riders (a carrier's reduction holds its rider's sums too); bf16 weights halve SIMT stages
        prog = P.build_program(meta_model(M.UNetConfig.from_params(case.p)).to(wdtype), batch, 16, "plain")
        for op in prog.ops:  # addresses play no part in the carve
            c = L.c_op(op, lambda buf: None)
            assert lib.dpk_unet1d_smem_bytes(ctypes.byref(c)) == op.smem_bytes, (batch, wdtype, op.name)


def test_step_form_is_the_plain_forward():
    cfg = M.UNetConfig(2, 9, 16, (16, 24), 5, 8, True)
    model = M.build(cfg, 3).double()
    x, gc, t = torch.randn(2, 8, 2).double(), torch.randn(2, 9).double(), torch.tensor([3, 77])
    film = FILM.step_film(FILM.step_table(model, 100).double(), FILM.observe(model, gc, 2), t)
    assert torch.allclose(model(x, t.double(), gc), model(x, t, film=film), atol=1e-6)


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to TF32 (10 mantissa bits), as cuDNN's TF32 convolutions round their operands."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).to(x.dtype)


def test_tolerance_separates_fp32_tf32_and_bugs(session):
    case = session.find_case("unet1d", "tiny_k3_b3_plain", "smoke")
    fam = session.registry.family("unet1d")
    inputs = fam.make_inputs(case, CPU)
    refs = parity.reference_output(fam, case, CPU)
    call = inputs[-1]
    model = call.net.module

    def run(prepare) -> parity.ParityResult:
        m = M.ConditionalUnet1D(call.net.config).eval()
        m.load_state_dict(model.state_dict())
        prepare(m)
        with torch.no_grad():
            out = m(*inputs[:3])
        res = parity.ParityResult("unet1d", "probe", case.id, case.dtype)
        parity.compare([out], refs, REF.tolerance(case, "float32"), res)
        tf = parity.ParityResult("unet1d", "probe", case.id, case.dtype)
        parity.compare([out], refs, REF.tolerance(case, "tf32"), tf)
        return res, tf

    def tf32_convs(m: torch.nn.Module) -> None:
        for conv in m.modules():
            if isinstance(conv, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                conv.weight.data = _tf32(conv.weight.data)
                conv.register_forward_pre_hook(lambda _, args: (_tf32(args[0]),))

    def small_film_error(m: torch.nn.Module) -> None:  # every FiLM shift off by 1e-3: fp32 must notice
        for _, blk in m.res_blocks():
            blk.cond_encoder[1].bias.data[blk.out_channels // 2:] += 1e-3

    def no_film_bias(m: torch.nn.Module) -> None:  # one block's FiLM bias dropped: any tolerance must notice
        _, blk = next(m.res_blocks())
        blk.cond_encoder[1].bias.data.zero_()

    fp32, _ = run(lambda m: None)
    tf32_fp, tf32_tf = run(tf32_convs)
    small_fp, _ = run(small_film_error)
    bug_fp, bug_tf = run(no_film_bias)
    assert fp32.mismatches == 0 and fp32.tol_usage < 0.2, fp32.summary()
    assert tf32_fp.mismatches > 0 and tf32_tf.mismatches == 0, (tf32_fp.summary(), tf32_tf.summary())
    assert small_fp.mismatches > 0
    assert bug_fp.mismatches > 0 and bug_tf.mismatches > 0


@pytest.mark.parametrize("bad, message", [
    (lambda s, t, g, o: (s[:, :, :1], t, g, o), "sample must be"),
    (lambda s, t, g, o: (s[:, :7], t, g, o), "horizon"),
    (lambda s, t, g, o: (s, t, g[:, :2], o), "global_cond must be"),
    (lambda s, t, g, o: (s.double(), t, g, o), "sample is torch.float64"),
    (lambda s, t, g, o: (s, t[:1].repeat(5), g, o), "timestep must be"),
    (lambda s, t, g, o: (s, t.float(), g, o), "int64"),
    (lambda s, t, g, o: (s, t, g, o[:, :3]), "obs must be"),
])
def test_bad_input_names_the_problem(session, bad, message):
    case = session.find_case("unet1d", "tiny_k3_b3_step", "smoke")
    *tensors, call = session.registry.family("unet1d").make_inputs(case, CPU)
    eager = session.registry.variant("unet1d", "eager").fn
    with pytest.raises((ValueError, TypeError), match=message):
        eager(*bad(*tensors), call)


def test_configs_that_cannot_be_built_are_named():
    with pytest.raises(ValueError, match="not divisible by n_groups"):
        M.UNetConfig(2, 4, 8, (12, 20), 3, 8, True).check()
    with pytest.raises(ValueError, match="kernel_size 4 must be odd"):
        M.UNetConfig(2, 4, 8, (16,), 4, 8, True).check()


def test_kernels_path_limits_are_named():
    """A config the kernel has no instantiation for is refused while planning (the variant turns it into
    `unavailable: <reason>`), not at launch."""
    cfg = M.UNetConfig(2, 4, 8, (16, 32), 7, 8, True)
    with pytest.raises(ValueError, match="kernel sizes other than"):
        P.build_program(M.build(cfg, 0), 1, 8, "step")
    with pytest.raises(ValueError, match="64 output columns"):
        P.build_program(M.build(M.UNetConfig(2, 4, 8, (16,), 5, 8, True), 0), 1, 64, "step")


def test_checkpoint_case_runs_the_checkpoint(session, tmp_path):
    """`--checkpoint`: a diffusion_policy .ckpt of the smoke config runs through make_inputs and eager."""
    fmt = importlib.import_module("dpk.families.unet1d._checkpoint_formats")
    case = session.find_case("unet1d", "tiny_k3_b1_plain", "smoke")
    cfg = M.UNetConfig.from_params(case.p)
    model = M.build(cfg, 42)
    path = tmp_path / "latest.ckpt"
    fmt.save_diffusion_policy_ckpt(M.build(cfg, 7), path, ema_model=model, cfg=cfg)  # EMA weights are preferred
    ck = dpk.cases.with_params(case, {"checkpoint": str(path)}, session.registry.family("unet1d").params)
    assert ck.name.endswith("-ckpt_latest")
    *tensors, call = session.registry.family("unet1d").make_inputs(ck, CPU)
    assert call.net.weights.startswith("diffusion_policy:ema_model sha256:") and vars(call.net.config) == vars(cfg)
    with torch.no_grad():
        want = model(*tensors[:3])
    got = session.registry.variant("unet1d", "eager").fn(*tensors, call)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="takes no parameter 'nope'"):
        dpk.cases.with_params(case, {"nope": 1}, session.registry.family("unet1d").params)


def test_floor_is_the_streamed_weights(session):
    case = session.find_case("unet1d", "blog_b1_step", "pusht")
    assert REF.work(case).bytes == 4 * 60_999_938
    assert math.isclose(REF.work(case).bytes / 4.22e12 * 1e6, 57.8, abs_tol=0.1)  # unet-anchors: 57.9 us


def test_compiled_variants_are_not_sent_to_eager_by_the_recompile_limit(session):
    """Each (config, form, dtype) compiles the module's shared code objects again: a run of more than 8 cases must not
    exhaust torch's per-code-object limit (past it, torch.compile runs the rest eager without a word)."""
    dyn = torch._dynamo.config
    saved = dyn.recompile_limit, dyn.accumulated_recompile_limit
    try:
        dyn.recompile_limit, dyn.accumulated_recompile_limit = 8, 256
        NET.compile_reduce_overhead(lambda x: x + 1)
        cases = session.cases("unet1d", "pusht")
        assert dyn.recompile_limit >= len(cases) * 2 and dyn.accumulated_recompile_limit >= dyn.recompile_limit
    finally:
        dyn.recompile_limit, dyn.accumulated_recompile_limit = saved
