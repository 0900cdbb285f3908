"""One U-Net forward as a program of ops for unet1d.cu (what each op computes: unet1d.h).

Per residual block (in -> out channels, input value V: 1 or 2 sources, concatenated):
  conv1  X = V                       -> raw1 = conv1(X) [, r = residual_conv(X) when in != out]; stores X when
                                        the block's identity residual or a skip needs it later
  conv2  X = film(mish(gn1(raw1)))   -> raw2 = conv2(X)
  the block's output is the value mish(gn2(raw2)) + (r or X): never stored by itself, it becomes the first
  source of the next op, which transforms it in its prologue (and stores it when it is a skip).
Downsample: a stride-2 conv op; Upsample: one op with the transposed conv's two output phases as segments
(even outputs: taps 3 and 1 of the weight, odd: taps 2 and 0); final: conv op, then the 1x1 projection op
whose output is the (B, T, input_dim) result. The plain form first runs the step encoder and all FiLM linears
as three ops with the batch folded into l (Linear = K=1 conv over l = batch): their output `embed` (B, F)
holds every block's FiLM. The step form reads FiLM from `obs` (B, F) + `table` (num_t, F) rows at t instead.
I/O buffer names: sample (B, T, D), t (B,) int64, global_cond (B, G), obs (B, F), table (num_t, F), out.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dpk.tolerance import torch_dtype

from ._net import DTYPES
from ._ops import Buf, Op, Segment, Source, Store
from ._pack import pack_bias, pack_weight
from ._plan import SMS, link_stats, plan_op
from ._unet import ConditionalUnet1D

FORMS = ("plain", "step")


@dataclass
class Program:
    ops: list[Op]
    params: Store  # packed weights, biases, GroupNorm affines (one fp32 tensor; bf16 weights as pairs)
    work: Store  # activations (one fp32 tensor)
    batch: int
    horizon: int
    form: str
    film_width: int

    def conv_bytes(self) -> int:
        return sum(s.weight_bytes for op in self.ops for s in op.segs if not op.name.startswith(("step.", "film")))


class _Builder:
    def __init__(self, model: ConditionalUnet1D, batch: int, horizon: int, form: str, sms: int, wbf16: bool):
        cfg = model.cfg
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        if horizon % cfg.horizon_multiple:
            raise ValueError(f"horizon {horizon} is not a multiple of {cfg.horizon_multiple} (2^(levels-1))")
        self.m, self.cfg, self.B, self.T, self.form, self.sms = model, cfg, batch, horizon, form, sms
        self.wbf16 = wbf16
        self.params, self.work, self.ops = Store(), Store(), []
        self.film_slices = iter(model.film_slices())
        self.F = sum(w for _, w in model.film_slices())

    # -- parameters and ops --------------------------------------------------------------------------
    @staticmethod
    def _host(t: torch.Tensor) -> torch.Tensor:
        """float32 on the CPU, where packing happens (a meta tensor stays meta: plans without weights)."""
        t = t.detach().float()
        return t if t.is_meta else t.cpu()

    def _param(self, name: str, t: torch.Tensor) -> Buf:
        return self.params.add(name, self._host(t))

    def _act(self, name: str, n: int) -> Buf:
        return self.work.add(name, n)

    def _op(self, name: str, srcs: list[Source], segs: list[tuple[Segment, torch.Tensor, torch.Tensor]],
            l_in: int, batch_grid: int, mat: Buf | None = None) -> None:
        op = Op(name, srcs, [s for s, _, _ in segs], l_in, batch_grid, mat)
        plan_op(op, self.sms, self.wbf16)
        for i, (s, w, b) in enumerate(segs):
            if s.simt == 2:  # the rider's 1x1 weights as tap k of this segment's
                w = torch.cat([self._host(w), self._host(segs[i + 1][1])], dim=2)
            if not s.rider:
                packed = pack_weight(self._host(w), s)
                if s.wbf16:  # bf16 values (exact: a bf16 net's), two per fp32 slot of the store
                    packed = packed.to(torch.bfloat16).view(torch.float32)
                s.w = self.params.add(f"{name}.w{i}", packed)
            s.bias = self._param(f"{name}.b{i}", pack_bias(self._host(b), s))
        self.ops.append(op)

    @staticmethod
    def _conv_seg(out: Buf, rows: int, cin: int, k: int, l_out: int, ltot: int | None = None, **kw: int
                  ) -> Segment:
        """A segment writing columns of a (B, rows, ltot) activation (ltot = l_out unless phases interleave)."""
        ltot = ltot or l_out
        return Segment(rows, cin, k, out, ob=rows * ltot, oc=ltot, ol=1, l_out=l_out, **kw)

    def _gn(self, raw: Buf, block: nn.Sequential, L: int, **kw: object) -> Source:
        """The value mish(GroupNorm(raw)) of a Conv1dBlock (block = its .block: Conv1d, GroupNorm, Mish)."""
        norm = block[1]
        p = norm.weight.shape[0]
        name = raw.name
        return Source(p, raw=raw, sb=p * L, sc=L, sl=1, gamma=self._param(f"{name}.gamma", norm.weight),
                      beta=self._param(f"{name}.beta", norm.bias), groups=norm.num_groups, act=1, **kw)

    def _film(self, width: int, out: int) -> dict:
        off, w = next(self.film_slices)
        assert w == width
        kw = {"film": 1 if width == 2 * out else 2, "film_off": off, "film_ld": self.F}
        if self.form == "plain":
            return kw | {"film_a": Buf("embed")}
        return kw | {"film_a": Buf("obs"), "film_b": Buf("table"), "t": Buf("t")}

    # -- the walk ------------------------------------------------------------------------------------
    def res_block(self, name: str, blk: nn.Module, V: list[Source], L: int, store: Buf | None) -> list[Source]:
        cin, cout, k = sum(s.channels for s in V), blk.out_channels, self.cfg.kernel_size
        identity = isinstance(blk.residual_conv, nn.Identity)
        mat = store or (self._act(f"{name}.in", self.B * cin * L) if identity else None)
        raw1 = self._act(f"{name}.raw1", self.B * cout * L)
        conv1 = blk.blocks[0].block[0]
        segs = [(self._conv_seg(raw1, cout, cin, k, L, pad=k // 2), conv1.weight, conv1.bias)]
        res = mat
        if not identity:
            res = self._act(f"{name}.res", self.B * cout * L)
            rc = blk.residual_conv
            segs.append((self._conv_seg(res, cout, cin, 1, L), rc.weight, rc.bias))
        self._op(f"{name}.conv1", V, segs, L, self.B, mat)
        raw2 = self._act(f"{name}.raw2", self.B * cout * L)
        conv2 = blk.blocks[1].block[0]
        src = self._gn(raw1, blk.blocks[0].block, L, **self._film(blk.film_width, cout))
        self._op(f"{name}.conv2", [src], [(self._conv_seg(raw2, cout, cout, k, L, pad=k // 2), conv2.weight,
                                            conv2.bias)], L, self.B)
        return [self._gn(raw2, blk.blocks[1].block, L, res=res)]

    def step_ops(self) -> None:
        """Plain form: step encoder and FiLM linears, batch folded into l (out (B, n): oc = 1, ol = n)."""
        enc, B, dsed, G = self.m.diffusion_step_encoder, self.B, self.cfg.diffusion_step_embed_dim, \
            self.cfg.global_cond_dim
        h1, emb, embed = self._act("step.h1", B * 4 * dsed), self._act("step.emb", B * dsed), \
            self._act("embed", B * self.F)
        lin = lambda out, rows, cin: Segment(rows, cin, 1, out, ob=0, oc=1, ol=rows, l_out=B)  # noqa: E731
        sin = Source(dsed, kind=1, t=Buf("t"))
        self._op("step.lin1", [sin], [(lin(h1, 4 * dsed, dsed), enc[1].weight[..., None], enc[1].bias)], B, 1)
        self._op("step.lin2", [Source(4 * dsed, raw=h1, sc=1, sl=4 * dsed, act=1)],
                 [(lin(emb, dsed, 4 * dsed), enc[3].weight[..., None], enc[3].bias)], B, 1)
        srcs = [Source(dsed, raw=emb, sc=1, sl=dsed, act=1)]
        if G:
            srcs.append(Source(G, raw=Buf("global_cond"), sc=1, sl=G, act=1))
        lins = [blk.cond_encoder[1] for _, blk in self.m.res_blocks()]
        w = torch.cat([m.weight for m in lins])[..., None]
        b = torch.cat([m.bias for m in lins])
        self._op("film", srcs, [(lin(embed, self.F, self.cfg.cond_dim), w, b)], B, 1)

    def build(self) -> Program:
        cfg, m, B, T = self.cfg, self.m, self.B, self.T
        if self.form == "plain":
            self.step_ops()
        D = cfg.input_dim
        V = [Source(D, raw=Buf("sample"), sb=T * D, sc=1, sl=D)]
        L, skips, store = T, [], None
        for i, (res0, res1, down) in enumerate(m.down_modules):
            V = self.res_block(f"down{i}.res0", res0, V, L, store)
            V = self.res_block(f"down{i}.res1", res1, V, L, None)
            C = V[0].channels
            skip = self._act(f"down{i}.out", B * C * L)
            skips.append((skip, C))
            if isinstance(down, nn.Identity):
                store = skip  # the next op (mid0.conv1) stores the level's output: the skip
                continue
            out = self._act(f"down{i}.ds", B * C * (L // 2))
            seg = self._conv_seg(out, C, C, 3, L // 2, pad=1, stride=2)
            self._op(f"down{i}.downsample", V, [(seg, down.conv.weight, down.conv.bias)], L, B, skip)
            L //= 2
            V, store = [Source(C, raw=out, sb=C * L, sc=L, sl=1)], None
        for i, blk in enumerate(m.mid_modules):
            V = self.res_block(f"mid{i}", blk, V, L, store)
            store = None
        for i, (res0, res1, up) in enumerate(m.up_modules):
            skip, C = skips.pop()
            V = [*V, Source(C, raw=skip, sb=C * L, sc=L, sl=1)]
            V = self.res_block(f"up{i}.res0", res0, V, L, None)
            V = self.res_block(f"up{i}.res1", res1, V, L, None)
            if isinstance(up, nn.Identity):
                continue
            C = V[0].channels
            out = self._act(f"up{i}.us", B * C * 2 * L)
            wt = up.conv.weight.permute(1, 0, 2)  # (cout, cin, 4)
            segs = [(self._conv_seg(out, C, C, 2, L, 2 * L, pad=1, ostep=2, ophase=0), wt[:, :, [3, 1]], up.conv.bias),
                    (self._conv_seg(out, C, C, 2, L, 2 * L, pad=0, ostep=2, ophase=1), wt[:, :, [2, 0]], up.conv.bias)]
            self._op(f"up{i}.upsample", V, segs, L, B)
            L *= 2
            V = [Source(C, raw=out, sb=C * L, sc=L, sl=1)]
        d0 = cfg.down_dims[0]
        raw = self._act("final.raw", B * d0 * L)
        conv = m.final_conv[0].block[0]
        self._op("final.conv", V, [(self._conv_seg(raw, d0, sum(s.channels for s in V), cfg.kernel_size, L,
                                                   pad=cfg.kernel_size // 2), conv.weight, conv.bias)], L, B)
        proj = m.final_conv[1]
        seg = Segment(D, d0, 1, Buf("out"), ob=T * D, oc=1, ol=D, l_out=L)
        self._op("final.proj", [self._gn(raw, m.final_conv[0].block, L)], [(seg, proj.weight, proj.bias)], L, B)
        link_stats(self.ops, self.work)
        mark_early(self.ops)
        return Program(self.ops, self.params, self.work, B, T, self.form, self.F)


def mark_early(ops: list[Op]) -> None:
    """Flag what each op may read before its dependency wait. An op releases its dependents only after its own
    wait, so when op j starts, every op before j - 1 has finished: buffers they wrote, inputs written before the
    forward and parameters are safe to read; the previous op's outputs are not."""
    producer: dict[str, int] = {}

    def old(buf: Buf | None, j: int) -> bool:
        return buf is None or producer.get(buf.name, -1) <= j - 2

    for j, op in enumerate(ops):
        for s in op.srcs:
            s.early = int(j >= 1 and (old(s.raw, j) if s.kind == 0 else old(s.t, j)))
            s.res_early = int(j >= 1 and s.res is not None and old(s.res, j))
            s.coef_early = int(j >= 1 and old(s.film_a, j) and old(s.film_b, j))
        for seg in op.segs:
            producer[seg.out.name] = j
        if op.mat is not None:
            producer[op.mat.name] = j


def build_program(model: ConditionalUnet1D, batch: int, horizon: int, form: str = "step", sms: int = SMS
                  ) -> Program:
    """The op program of one forward of `model` at (batch, horizon), weights packed on the CPU: fp32, or for a
    bf16 model bf16 where a segment runs in the SIMT form (the rest widened to fp32 exactly)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if form == "plain" and batch > 32:
        raise ValueError(f"the plain form folds the batch into the FiLM linears' length: batch {batch} > 32")
    dtype = next(model.parameters()).dtype
    if dtype not in [torch_dtype(d) for d in DTYPES]:
        raise ValueError(f"the kernels path runs {' or '.join(DTYPES)} weights, not {dtype}")
    return _Builder(model, batch, horizon, form, sms, dtype == torch.bfloat16).build()
