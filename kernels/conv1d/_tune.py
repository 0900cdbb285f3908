"""Sweep the knobs of the conv1d stream and tiled kernels on a GPU (a script, not a variant).

    PYTHONPATH=/path/to/repo python3 kernels/conv1d/_tune.py [--budget 0.3] [--quick] [--csv out.csv]

Builds the extension, then for each configuration and target shape: parity against the float64 reference
(the family's fp32 tolerance, as `dpk parity`), then the cold-L2 median with dpk's timing engine (the L2 flush
before every sample, CUDA events; what `dpk bench --mode cold` reports). Targets: the two 21 MB batch-1 shapes
(stream kernel: structure, then L2 policy, then ring depth around the best, then the TMA bulk ring: ring depth
x policy on the best cp.async structure and rpw 4/8 x v 1/2 x cta 1/2) and the batch-8/64 Push-T shapes (tiled
kernel: engine (fp32 FMAs or 3xTF32 tensor cores) x tile x stages x CTAs per SM, then L2 policy). The variants'
defaults and cuDNN are timed as reference rows. Prints one row per measurement as it goes (so a cut-off run still
reports), then the best configuration per shape. About 2-3 minutes of GPU time on an H200, the extension build
(~1 min) excluded.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dpk.cases import load_suite_file  # noqa: E402
from dpk.env import copy_bandwidth_gbps  # noqa: E402
from dpk.parity import ParityResult, compare, reference_output  # noqa: E402
from dpk.registry import load  # noqa: E402
from dpk.timing import Timer, TimingConfig  # noqa: E402

REG = load([ROOT / "kernels"], strict=True)
FAM = REG.family("conv1d")
ck = importlib.import_module("dpk.families.conv1d.cuda_variants")
PUSHT = {c.name: c for c in load_suite_file(ROOT / "suites" / "conv1d.yaml").suites["pusht"]}
STREAM_SHAPES = ["c1024_c1024_l4_k5", "c2048_c512_l4_k5"]
TILED_SHAPES = [f"b{b}_{s}" for b in (8, 64) for s in ("c1024_c1024_l4_k5", "c2048_c512_l4_k5", "c512_c1024_l4_k5")]
# batch-1 fp32 Push-T convs stream_rows.cu fits (B*L <= 16, K = 5: rows of whole 16-byte vectors)
ROWS_SHAPES = ["c512_c1024_l4_k5", "c512_c512_l8_k5", "c1024_c256_l8_k5", "c256_c512_l8_k5", "c256_c256_l16_k5",
               "c512_c512_l4_k5"]
COMBOS = ((4, 2), (4, 1), (2, 2), (2, 4), (4, 4), (8, 1), (8, 2))  # stream.cu kCombos (RPW, V)
N_STREAM_KNOBS = 11  # binding.cpp kStreamKnobs: the stream part of StreamKnobs.as_list(), the tiled knobs follow


def shape_of(name: str) -> tuple[int, int, int, int, int]:
    c = PUSHT[name]
    return c["B"], c["Cin"], c["Cout"], c["L"], c.get("K", 5)


def stream_name(k: ck.StreamKnobs) -> str:
    if k.rows == 1:
        if k.row_chunks <= 0 and k.row_threads <= 0 and k.row_ahead <= 0:
            return f"stream rows auto pol{k.cache_policy}"  # the plan's rule (conv1d_rows_plan)
        ahead = f" ahead{k.row_ahead}" if k.row_ahead > 0 else ""
        return f"stream rows chunks{k.row_chunks} t{k.row_threads}{ahead} pol{k.cache_policy}"
    return (f"stream rpw{k.rows_per_warp} v{k.vecs_per_row} st{k.stages} cta{k.ctas_per_sm} pol{k.cache_policy}"
            f" bulk{k.bulk}")


def tiled_name(k: ck.TiledKnobs) -> str:
    def v(x: int) -> str:  # -1: conv1d.h's rule (the plan column shows what it chose)
        return "auto" if x == -1 else str(x)
    return f"tiled t{v(k.tile)} st{v(k.stages)} cta{k.ctas_per_sm} pol{v(k.cache_policy)} mma{v(k.mma)}"


class Bench:
    def __init__(self, budget_s: float, csv_path: str | None, device: str = "cuda"):
        self.device = torch.device(device)
        self.timer = Timer(self.device, TimingConfig(budget_s=budget_s))
        self.copy_gbps = copy_bandwidth_gbps(self.device)
        self.inputs: dict[str, tuple] = {}
        self.refs: dict[str, list[torch.Tensor]] = {}
        self.rows: list[dict] = []
        self.csv = csv_path
        print(f"# {torch.cuda.get_device_name()}  copy bandwidth {self.copy_gbps:.0f} GB/s  "
              f"SMs {torch.cuda.get_device_properties(0).multi_processor_count}", flush=True)
        print(f"{'config':44s} {'shape':24s} {'us':>8s} {'%copy':>6s} {'tol':>5s}  plan", flush=True)

    def case_data(self, shape: str) -> tuple[tuple, list[torch.Tensor]]:
        if shape not in self.inputs:
            case = PUSHT[shape]
            self.inputs[shape] = FAM.make_inputs(case, self.device)
            self.refs[shape] = reference_output(FAM, case, self.device)
        return self.inputs[shape], self.refs[shape]

    def run(self, name: str, shape: str, fn: Callable[..., torch.Tensor], compute: str = "float32",
            plan: str = "") -> float:
        """Parity, then the cold median (us); inf when the configuration fails or is rejected."""
        case = PUSHT[shape]
        inputs, refs = self.case_data(shape)
        res = ParityResult("conv1d", name, case.id, case.dtype)
        try:
            out = fn(*inputs)
            torch.cuda.synchronize()
            compare([out], refs, FAM.tolerance(case, compute), res)
            if res.mismatches or res.nan_mismatch:
                raise RuntimeError(f"parity FAILED: {res.summary()}")
            median = self.timer.measure(lambda: fn(*inputs), "cold").stats.median * 1e6
        except Exception as e:  # a rejected config or a failed check is a row, not the end of the sweep
            print(f"{name:44s} {shape:24s} {'-':>8s} {'':6s} {'':5s} {str(e).splitlines()[0][:90]}", flush=True)
            self.rows.append({"config": name, "shape": shape, "us": float("inf"), "error": str(e)[:200]})
            return float("inf")
        pct = 100 * FAM.work(case).bytes / (median * 1e-6) / (self.copy_gbps * 1e9)
        print(f"{name:44s} {shape:24s} {median:8.2f} {pct:5.1f}% {res.tol_usage:5.2f}  {plan}", flush=True)
        self.rows.append({"config": name, "shape": shape, "us": median, "pct_copy": pct, "tol_usage": res.tol_usage,
                          "plan": plan})
        return median

    def sms(self) -> int:
        return torch.cuda.get_device_properties(self.device).multi_processor_count

    def stream_plans(self, k: ck.StreamKnobs, shapes: list[str]) -> tuple[tuple[int, ...], ...]:
        """The plans (binding.cpp stream_plan) k runs with on the fp32 shapes."""
        return tuple(tuple(ck.extension().stream_plan(*shape_of(s), 4, k.as_list()[:N_STREAM_KNOBS], self.sms()))
                     for s in shapes)

    def stream(self, k: ck.StreamKnobs, shapes: list[str]) -> float:
        total = 0.0
        for s, p in zip(shapes, self.stream_plans(k, shapes), strict=True):
            plan = (f"rows: {p[6]} CTAs, {p[7]} chunks, {p[10] // 1024} KB" if p[14] else
                    f"{p[5]}x{p[6]} CTAs, {p[8]} chunks/CTA, st{p[9]}, {p[10] // 1024} KB{', bulk' if p[13] else ''}")
            total += self.run(stream_name(k), s, lambda x, w, b: ck.run_stream(x, w, b, k), plan=plan)
        return total

    def tiled(self, k: ck.TiledKnobs, shape: str) -> float:
        knobs = ck.OptimizedKnobs(tiled_min_bl=0, tiled=k)
        p = ck.extension().tiled_plan(*shape_of(shape), k.as_list(), self.sms())
        plan = f"{p[2]}x{p[3]}x{p[4]}: {p[8]}x{p[9]}x{p[10]} CTAs, st{p[12]}, {p[13] // 1024} KB, pol{p[16]} mma{p[17]}"
        return self.run(tiled_name(k), shape, lambda x, w, b: ck.run_optimized(x, w, b, knobs), plan=plan)

    def save(self) -> None:
        if self.csv:
            with open(self.csv, "w", newline="") as f:
                out = csv.DictWriter(f, ["config", "shape", "us", "pct_copy", "tol_usage", "plan", "error"])
                out.writeheader()
                out.writerows(self.rows)


def defaults() -> tuple[ck.StreamKnobs, ck.TiledKnobs]:
    """The compiled defaults (conv1d.h), as explicit knobs (tiled tile/stages/policy stay -1: the rule)."""
    s = ck.extension().default_knobs("stream")
    tiled = ck.TiledKnobs(*s[N_STREAM_KNOBS:])
    return ck.StreamKnobs(*s[:N_STREAM_KNOBS], tiled=tiled), tiled


def sweep_stream(bench: Bench, quick: bool) -> None:
    base = replace(defaults()[0], bulk=0)  # steps 1-3: the cp.async ring; step 4: the bulk ring

    def d(**kw: int) -> ck.StreamKnobs:
        return ck.StreamKnobs(**{**base.__dict__, **kw})
    # 1. structure (rows per warp, vector loads, grid) at the default policy; first: the first version's grid
    first = d(rows_per_warp=4, vecs_per_row=2, ctas_per_sm=0, stages=2, cache_policy=0)
    scores = {first: bench.stream(first, STREAM_SHAPES)}
    for (rpw, v), cta, st in ((c, cta, st) for c in COMBOS for cta in (1, 2) for st in ((4,) if quick else (3, 5))):
        k = d(rows_per_warp=rpw, vecs_per_row=v, stages=st, ctas_per_sm=cta)
        scores[k] = bench.stream(k, STREAM_SHAPES)
    top = sorted(scores, key=scores.get)[: 2 if quick else 3]
    # 2. L2 policy of the weight loads on the best structures
    for k in top:
        for pol in (0, 1, 2, 3):
            kp = ck.StreamKnobs(**{**k.__dict__, "cache_policy": pol})
            if kp not in scores:
                scores[kp] = bench.stream(kp, STREAM_SHAPES)
    # 3. ring depth around the best
    best = min(scores, key=scores.get)
    for st in (2, 3, 4, 6, 8):
        ks = ck.StreamKnobs(**{**best.__dict__, "stages": st})
        if ks not in scores:
            scores[ks] = bench.stream(ks, STREAM_SHAPES)
    best = min(scores, key=scores.get)
    print(f"# best cp.async stream config over {STREAM_SHAPES}: {stream_name(best)}  (sum {scores[best]:.2f} us)",
          flush=True)
    # 4. TMA bulk ring: ring depth x L2 policy (bulk copies know evict_first or nothing: 0/1) on the best cp.async
    # structure and on rpw 4/8 x v 1/2 x cta 1/2; a configuration whose plans (stages capped to the chunks per CTA
    # and to shared memory) and policy repeat a measured one is skipped
    if quick:
        structures = [base, d(rows_per_warp=4, vecs_per_row=2)]
        depths, policies = (3, 6), (base.cache_policy,)
    else:
        structures = [best] + [d(rows_per_warp=r, vecs_per_row=v, ctas_per_sm=cta)
                               for r in (4, 8) for v in (1, 2) for cta in (1, 2)]
        depths, policies = (2, 3, 4, 6, 8), (0, 1)
    bulk_scores: dict[ck.StreamKnobs, float] = {}
    seen = set()
    for k in structures:
        for st in depths:
            for pol in policies:
                kb = ck.StreamKnobs(**{**k.__dict__, "bulk": 1, "stages": st, "cache_policy": pol})
                key = (bench.stream_plans(kb, STREAM_SHAPES), pol)
                if key not in seen:
                    seen.add(key)
                    bulk_scores[kb] = bench.stream(kb, STREAM_SHAPES)
    scores.update(bulk_scores)
    if bulk_scores:
        bb = min(bulk_scores, key=bulk_scores.get)
        print(f"# best bulk stream config over {STREAM_SHAPES}: {stream_name(bb)}  (sum {bulk_scores[bb]:.2f} us)",
              flush=True)
    best = min(scores, key=scores.get)
    print(f"# best stream config over {STREAM_SHAPES}: {stream_name(best)}  (sum {scores[best]:.2f} us)", flush=True)


def sweep_rows(bench: Bench, quick: bool) -> None:
    """stream_rows.cu (whole rows per CTA) against the split kernel on every batch-1 Push-T conv it fits: the
    default (the plan's rule), then explicit (chunks per row, threads per CTA, chunks in flight): one chunk (both L2
    policies), every copy at launch (2 and 4 chunks, 256 / 512 / 1024 threads), 4-16 chunks 1-3 in flight at 256
    and 512 threads (fewer with --quick), then the best per shape and over the two 21 MB shapes."""
    base = replace(defaults()[0], rows=0)
    shapes = STREAM_SHAPES + [s for s in ROWS_SHAPES if s not in STREAM_SHAPES]
    scores: dict[ck.StreamKnobs, float] = {base: bench.stream(base, shapes)}

    def rows(chunks: int, threads: int, ahead: int, pol: int = 1) -> ck.StreamKnobs:
        return replace(base, rows=1, row_chunks=chunks, row_threads=threads, row_ahead=ahead, cache_policy=pol)
    configs = [replace(base, rows=1), rows(1, 256, 1, 0), rows(1, 256, 1), rows(2, 256, 2), rows(4, 512, 4)]
    if quick:
        configs += [rows(4, t, 2) for t in (256, 512)] + [rows(8, 512, a) for a in (2, 3)]
    else:
        configs += [rows(c, t, c) for t in (256, 512, 1024) for c in (2, 4)]
        configs += [rows(c, t, a) for t in (256, 512) for c in (4, 8, 16) for a in (1, 2, 3)]
    for k in configs:
        if k not in scores:
            scores[k] = bench.stream(k, shapes)
    for shape in shapes:
        timed = [r for r in bench.rows if r["shape"] == shape and r["config"].startswith("stream")]
        best = min(timed, key=lambda r: r["us"])
        print(f"# best stream path for {shape}: {best['config']}  ({best['us']:.2f} us)", flush=True)
    big = {k: sum(r["us"] for r in bench.rows if r["config"] == stream_name(k) and r["shape"] in STREAM_SHAPES)
           for k in scores}
    best = min(big, key=big.get)
    print(f"# best over {STREAM_SHAPES}: {stream_name(best)}  (sum {big[best]:.2f} us)", flush=True)


def sweep_tiled(bench: Bench, quick: bool) -> None:
    base = defaults()[1]

    def d(**kw: int) -> ck.TiledKnobs:
        return ck.TiledKnobs(**{**base.__dict__, **kw})
    for shape in TILED_SHAPES:
        scores = {}
        for mma, tile in ((m, t) for m in (0, 1) for t in range(4)):
            # tile 3 (256 threads, ~170 / 215 registers) fits once per SM; the mma engine's 128-thread tiles 0-1
            # fit 3 times (its 256-thread tile 2 twice: cta3 then runs 1.5 waves)
            for cta in ((1,) if tile == 3 else (1, 2, 3) if mma else (1, 2)):
                for st in ((4,) if quick else (3, 4, 6)):
                    k = d(tile=tile, stages=st, ctas_per_sm=cta, cache_policy=0, mma=mma)  # policy: swept below
                    scores[k] = bench.tiled(k, shape)
        best = min(scores, key=scores.get)
        for pol in (0, 1, 2):
            kp = d(**{**best.__dict__, "cache_policy": pol})
            if kp not in scores:
                scores[kp] = bench.tiled(kp, shape)
        best = min(scores, key=scores.get)
        print(f"# best tiled config for {shape}: {tiled_name(best)}  ({scores[best]:.2f} us)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=0.3, help="timing budget per measurement, s")
    ap.add_argument("--quick", action="store_true", help="fewer configurations (about half)")
    ap.add_argument("--only", choices=("stream", "tiled", "rows"), help="one sweep only")
    ap.add_argument("--csv", help="also write every row here")
    args = ap.parse_args()
    t0 = time.time()
    ck.extension()
    print(f"# extension ready in {time.time() - t0:.0f} s", flush=True)
    bench = Bench(args.budget, args.csv)
    cudnn = REG.variant("conv1d", "cudnn")
    if args.only == "rows":
        try:
            sweep_rows(bench, args.quick)
        finally:
            bench.save()
        print(f"# done in {time.time() - t0:.0f} s", flush=True)
        return
    for shape in STREAM_SHAPES + TILED_SHAPES:  # reference rows: the variants as registered, and the baseline
        for name in ("stream", "optimized"):
            bench.run(f"variant {name} (defaults)", shape, REG.variant("conv1d", name).fn)
        bench.run("variant cudnn", shape, cudnn.fn, cudnn.compute)
    try:
        if args.only != "tiled":
            sweep_stream(bench, args.quick)
        if args.only != "stream":
            sweep_tiled(bench, args.quick)
    finally:
        bench.save()
    print(f"# done in {time.time() - t0:.0f} s", flush=True)
    finite = [r for r in bench.rows if r["us"] != float("inf")]
    for shape in STREAM_SHAPES + TILED_SHAPES:
        rows = [r for r in finite if r["shape"] == shape and not r["config"].startswith("variant")]
        if rows:
            best = min(rows, key=lambda r: r["us"])
            print(f"# best {shape:24s} {best['us']:8.2f} us  {best['pct_copy']:5.1f}%  {best['config']}")


if __name__ == "__main__":
    main()
