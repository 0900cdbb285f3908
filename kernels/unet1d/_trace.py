"""Phase trace of the kernels path (GPU script): where each op's time goes, from %globaltimer marks per CTA.

    python kernels/unet1d/_trace.py --case blog_b1_step.fp32 [--suite pusht] [--runs 3]

Per op: its start after the forward's first op, the median over its CTAs of each phase's end (us after the
op's first CTA started: weights requested, dependency met, sources in, statistics, transform, first stage
landed, all stages done) and its span. Runs after a warm-up; the last of `--runs` forwards is printed. Each
forward is replayed from a CUDA graph, as kernels_graph runs it (`--direct`: launched from the host, whose launch
cost paces the first ops; `--forwards N`: N back to back in the graph, the last traced), with L2 as the previous
forward left it (`--flush`: flushed first, as a cold row). Beside the span, the timing engine's median of the same
call: kernels_graph's replay (`cold` with --flush, else `hot`), the host launches (--direct), or `graph` mode's
per-forward time of forwards captured back to back (--forwards > 1).
DPK_UNET1D_PDL=0 chains the ops by plain stream order (no op's CTAs start before its predecessor has finished).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    import pandas as pd
    import torch

    from dpk.runner import Session
    from dpk.table import render
    from dpk.timing import Timer, TimingConfig
    from dpk.timing_aids import flush_cache

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", required=True)
    p.add_argument("--suite", default="pusht")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--direct", action="store_true", help="launch each op from the host instead of a graph")
    p.add_argument("--flush", action="store_true", help="flush L2 before each traced forward")
    p.add_argument("--forwards", type=int, default=1, help="forwards back to back in the graph; the last is traced")
    p.add_argument("--touch", default="", help="after --flush, read into L2 (a diagnostic of what the cold L2 "
                   "costs): small (biases, GroupNorm affines, FiLM table and observation part), work (activations), "
                   "head (the first ops' weights, up to 30 MB)")
    a = p.parse_args(argv)
    s = Session()
    case = s.find_case("unet1d", a.case, a.suite)
    inputs = s.registry.family("unet1d").make_inputs(case, s.device)
    cv = importlib.import_module("dpk.families.unet1d.cuda_variants")
    sample, timestep, global_cond, obs, call = inputs
    prog = cv.compiled_program(call, sample.shape[0], sample.shape[1])
    io = cv._io(sample, timestep, global_cond, obs, call, "trace")
    for _ in range(3):
        prog.launch(io, ranges=False)
    torch.cuda.synchronize()
    touched = _touched(prog, io, {x for x in a.touch.split(",") if x})

    def flush_and_touch() -> None:
        flush_cache(s.device)
        for t in touched:
            t.sum()
    rows = [prog.phase_trace(io, graph=not a.direct, forwards=a.forwards, before=flush_and_touch if a.flush else None)
            for _ in range(a.runs)][-1]
    mode = "graph" if a.forwards > 1 else "cold" if a.flush else "hot"
    forward = (lambda: prog.replay(io)) if not a.direct and a.forwards == 1 else (lambda: prog.launch(io, ranges=False))
    timed = Timer(s.device, TimingConfig(budget_s=2.0)).measure(forward, mode).stats.median * 1e6
    df = pd.DataFrame(rows)
    landed = df.pop("landed")
    # release: from the last CTA's store of an op to the median CTA of the next op passing its dependency wait
    df["release_us"] = (df["dep_abs_us"] - df["end_abs_us"].shift()).fillna(0)
    df = df.drop(columns=["end_abs_us", "dep_abs_us"])
    cols = list(df.columns)
    print(render(df.round(2), cols, max_width=24))
    end = df["start_us"] + df["span_us"]
    what = "the host launches" if a.direct else "forwards captured back to back, per forward" if a.forwards > 1 \
        else "kernels_graph's replay"
    print(f"\nforward: {float(end.max()):.1f} us from the first op's start to the last op's last stage; the timing "
          f"engine's {mode} median of {what}: {timed:.1f} us" + (" (touched data not read there)" if touched else ""))
    print("\nstage s landed (median over CTAs, us after the op's first start):")
    for name, stages in zip(df["op"], landed):
        print(f"  {name:18s} {' '.join(f'{x:.1f}' for x in stages)}")
    return 0


def _touched(prog: object, io: dict, what: set[str]) -> list:
    """The tensors `--touch` reads after the flush: regions of the packed parameters that are not weights (name
    `<op>.w<i>`), the FiLM table and io's observation part ('small'), the activations' workspace ('work'), the
    first ops' weights ('head')."""
    kinds = {"small", "work", "head"}
    if what - kinds:
        raise SystemExit(f"--touch takes {sorted(kinds)}, not {sorted(what - kinds)}")
    out, store, head = [], prog.program.params, 30e6 / 4
    for name, data in store.parts:
        tail, o = name.rsplit(".", 1)[-1], store.offsets[name]
        n = data if isinstance(data, int) else data.numel()
        weight = tail[:1] == "w" and tail[1:].isdigit()
        if weight and "head" in what and head > 0:
            head -= n
            out.append(prog.params[o:o + n])
        if not weight and "small" in what:
            out.append(prog.params[o:o + n])
    if "small" in what:
        out += [t for t in (prog.table, io.get("obs")) if t is not None]
    if "work" in what:
        out.append(prog.work)
    return out


if __name__ == "__main__":
    sys.exit(main())
