"""Tuning sweep of the fused GroupNorm+Mish kernel's plan knobs (cuda_variants.Tuning) on one GPU.

    PYTHONPATH=<repo> python3 kernels/gn_mish/_tune.py [--only pusht|large|b8|half|stash|wide|grid|spread]
        [--budget 0.15] [--json out.json]

Builds the extension, checks every configuration against the float64 reference with the family tolerance,
then times it with dpk's engine: `graph` mode (device time without launch overhead) on the Push-T shapes
(tier 0), `cold` mode (L2 flushed before each sample) on the large shapes (tier 1), next to eager and triton
in the same modes. Configurations whose plan equals one already timed on that shape are not timed again.
Prints one row per (shape, config) as it goes, then the best configuration per shape.
Not imported by the family loader (leading underscore); tests import its configuration lists.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (suite, case name, timing mode): the 5 Push-T shapes at batch 1, 2 at batch 64 (n = 512 and 256) and the
# large sweep shapes of the 70 %-of-copy-bandwidth goal.
# The last ones (b8 Push-T, b1/b8_c512_l1024, b16_c1024_l2048) check the default rule where it extrapolates.
PUSHT_SHAPES = [("pusht", name, "graph") for name in (
    "b1_c256_l16_g8", "b1_c512_l8_g8", "b1_c1024_l4_g8", "b1_c512_l4_g8", "b1_c256_l8_g8",
    "b64_c256_l16_g8", "b64_c512_l4_g8", "b8_c256_l16_g8", "b8_c512_l4_g8")]
LARGE_SHAPES = [("sweep", name, "cold") for name in (
    "b64_c512_l1024_g8", "b64_c1024_l1024_g8", "b64_c2048_l1024_g8", "b8_c2048_l1024_g8", "b1_c2048_l1024_g8",
    "b8_c512_l1024_g8", "b1_c512_l1024_g8", "b16_c1024_l2048_g8")]
# Few large groups (64 at B = 8): where the default rule was furthest from 70 % of copy bandwidth.
B8_SHAPES = [("sweep", name, "cold") for name in (
    "b8_c256_l1024_g8", "b8_c512_l1024_g8", "b8_c1024_l1024_g8", "b8_c2048_l1024_g8", "b8_c512_l4096_g8",
    "b8_c2048_l4096_g8", "b16_c1024_l2048_g8")]
# The 16-bit sweep cases (the suite's dtypes for them): half the bytes per element of fp32.
HALF_SHAPES = [("sweep", "b64_c512_l1024_g8", "cold", "bfloat16"), ("sweep", "b64_c512_l1024_g8", "cold", "float16"),
               ("sweep", "b8_c2048_l4096_g8", "cold", "bfloat16"), ("sweep", "b1_c2048_l4096_g8", "cold", "bfloat16")]
# Every streaming sweep shape (chunks > 1: the stash's A/B) and the 16-bit one-chunk ones.
STASH_SHAPES = [("sweep", name, "cold") for name in (
    "b8_c1024_l1024_g8", "b8_c2048_l1024_g8", "b8_c512_l4096_g8", "b8_c2048_l4096_g8", "b64_c1024_l1024_g8",
    "b64_c2048_l1024_g8", "b16_c1024_l2048_g8", "b1_c2048_l4096_g8")] + HALF_SHAPES
# Groups beyond the on-chip capacity (B = 8, L = 4096) and the latency-bound B = 1 ones: wider clusters + stash.
WIDE_SHAPES = [("sweep", "b8_c2048_l4096_g8", "cold"), ("sweep", "b8_c2048_l4096_g8", "cold", "bfloat16"),
               ("sweep", "b1_c2048_l4096_g8", "cold"), ("sweep", "b1_c2048_l1024_g8", "cold"),
               ("sweep", "b8_c1024_l1024_g8", "cold")]
# Tier 2 against tier 1: every sweep shape that tier 1 left below 70 % of a same-size copy, and neighbours.
GRID_SHAPES = [("sweep", name, "cold") for name in (
    "b1_c512_l1024_g8", "b1_c1024_l1024_g8", "b1_c2048_l1024_g8", "b1_c512_l4096_g8", "b1_c2048_l4096_g8",
    "b8_c1024_l1024_g8", "b8_c2048_l1024_g8", "b8_c2048_l4096_g8", "b16_c1024_l2048_g8", "b64_c1024_l1024_g8")] + [
    ("sweep", "b8_c2048_l4096_g8", "cold", "bfloat16"), ("sweep", "b1_c2048_l4096_g8", "cold", "bfloat16")]
# Tier 3 against tiers 1 and 2: the B = 1 sweep shapes (x on chip) and a few more groups.
SPREAD_SHAPES = [("sweep", name, "cold") for name in (
    "b1_c256_l1024_g8", "b1_c512_l1024_g8", "b1_c1024_l1024_g8", "b1_c2048_l1024_g8", "b1_c512_l4096_g8")] + [
    ("sweep", "b1_c2048_l4096_g8", "cold", "bfloat16"), ("sweep", "b8_c256_l1024_g8", "cold")]
PRESETS = {"pusht": PUSHT_SHAPES, "large": LARGE_SHAPES, "b8": B8_SHAPES, "half": HALF_SHAPES, "stash": STASH_SHAPES,
           "wide": WIDE_SHAPES, "grid": GRID_SHAPES, "spread": SPREAD_SHAPES}

# Tier 0 (groups <= 256 vectors): threads per group (32 = a warp per group ... a CTA per group), groups per CTA.
# "default" is the variant's rule (NOTES.md); a later configuration with the same plan is not timed again.
TIER0_CONFIGS: dict[str, dict[str, int]] = {
    "default": {},
    "warp": {"t0_threads": 32},
    "warp,1/cta": {"t0_threads": 32, "t0_groups_per_cta": 1},
    "t0=64": {"t0_threads": 64},
    "t0=128": {"t0_threads": 128},
    "t0=64,2/cta": {"t0_threads": 64, "t0_groups_per_cta": 2},
    "t0=128,2/cta": {"t0_threads": 128, "t0_groups_per_cta": 2},
}
# Tier 1 (clusters): CTA size (a small CTA whose cluster cannot hold the group streams: chunks re-read from L2),
# elements per thread (t1_items counts vectors: 4 fp32 vectors = 16 elements), cluster cap, residency cap,
# persistent double-buffered clusters, the slice in shared memory (same CTAs, half the CTAs) or always in registers.
TIER1_CONFIGS: dict[str, dict[str, int]] = {
    "default": {},
    "t1=128": {"t1_threads": 128},
    "t1=256": {"t1_threads": 256},
    "t1=512": {"t1_threads": 512},
    "t1=1024": {"t1_threads": 1024},
    "t1=1024,16el": {"t1_threads": 1024, "t1_items": 4},
    "t1=256,16el": {"t1_threads": 256, "t1_items": 4},
    "k<=8": {"max_cluster": 8},
    "k<=1,t1=1024": {"max_cluster": 1, "t1_threads": 1024},
    "k<=2,t1=1024": {"max_cluster": 2, "t1_threads": 1024},
    "k<=8,t1=256": {"max_cluster": 8, "t1_threads": 256},
    "k<=2,t1=512": {"max_cluster": 2, "t1_threads": 512},
    "k<=4,t1=256": {"max_cluster": 4, "t1_threads": 256},
    "k<=4,t1=512": {"max_cluster": 4, "t1_threads": 512},
    "k<=8,t1=512": {"max_cluster": 8, "t1_threads": 512},
    "k<=16,t1=256": {"max_cluster": 16, "t1_threads": 256},
    "default,2cta/sm": {"t1_ctas_per_sm": 2},
    "persist": {"t1_persistent": 1},
    "persist,t1=512": {"t1_persistent": 1, "t1_threads": 512},
    "persist,2cta/sm": {"t1_persistent": 1, "t1_ctas_per_sm": 2},  # padded past the 48 KB default
    "nostash": {"t1_stash": -1},
    "regs": {"t1_smem": -1},
    "smem": {"t1_smem": 1},
    "smem/2": {"t1_smem": 2},
    "t1=128,smem": {"t1_threads": 128, "t1_smem": 1},
}
# --only stash: the default rule against no stash, the most that fits, and 4 vectors; 8 x 128-thread CTAs for 16-bit.
STASH_CONFIGS: dict[str, dict[str, int]] = {
    "default": {}, "nostash": {"t1_stash": -1}, "stash:max": {"t1_stash": 1000}, "stash<=4": {"t1_stash": 4},
    "t1=128": {"t1_threads": 128}}
# --only wide: more CTAs per group (several waves of one CTA per SM), so that a wave's re-reads fit the stash and L2.
WIDE_CONFIGS: dict[str, dict[str, int]] = {
    "default": {}, "k<=8,t1=1024": {"max_cluster": 8, "t1_threads": 1024},
    "k<=8,t1=1024,stash:max": {"max_cluster": 8, "t1_threads": 1024, "t1_stash": 1000},
    "k<=4,t1=1024,stash:max": {"max_cluster": 4, "t1_threads": 1024, "t1_stash": 1000},
    "k<=16,t1=1024": {"max_cluster": 16, "t1_threads": 1024}, "k<=16,t1=512": {"max_cluster": 16, "t1_threads": 512},
    "k<=8,t1=512,stash:max": {"max_cluster": 8, "t1_threads": 512, "t1_stash": 1000}}

# --only grid: tier 2's rule, CTA sizes, CTAs per group, without the stash, 16 elements per thread in registers.
GRID_CONFIGS: dict[str, dict[str, int]] = {
    "default": {}, "t2": {"t2": 1}, "t2,t1=1024": {"t2": 1, "t1_threads": 1024},
    "t2,t1=512": {"t2": 1, "t1_threads": 512}, "t2,t1=256": {"t2": 1, "t1_threads": 256},
    "t2,s=2": {"t2": 1, "t2_ctas": 2}, "t2,s=4": {"t2": 1, "t2_ctas": 4}, "t2,s=8": {"t2": 1, "t2_ctas": 8},
    "t2,s=16": {"t2": 1, "t2_ctas": 16}, "t2,s=32": {"t2": 1, "t2_ctas": 32},
    "t2,t1=1024,s=16": {"t2": 1, "t1_threads": 1024, "t2_ctas": 16},
    "t2,nostash": {"t2": 1, "t1_stash": -1}, "t2,16el": {"t2": 1, "t1_items": 4}}

# --only spread: tier 3 (every CTA holds a piece of every group), its group warps, CTAs, request depth, CTA size.
SPREAD_CONFIGS: dict[str, dict[str, int]] = {
    "default": {}, "t1,no-t3": {"t2": -1, "t3": -1}, "t2,no-t3": {"t2": 1, "t3": -1}, "t3": {"t3": 1},
    "t3,r4": {"t3": 1, "t3_reducers": 4}, "t3,r16": {"t3": 1, "t3_reducers": 16}, "t3,64cta": {"t3": 1, "t3_ctas": 64},
    "t3,d2": {"t3": 1, "t3_depth": 2}, "t3,d4": {"t3": 1, "t3_depth": 4},
    "t3,t1=512": {"t3": 1, "t1_threads": 512}}


def _family():
    """(family, fused module, eager fn, triton fn or None) through the registry, as the harness loads them."""
    import dpk

    registry = dpk.registry.load([ROOT / "kernels"], strict=True)
    fam = registry.family("gn_mish")
    fused = importlib.import_module("dpk.families.gn_mish.cuda_variants")
    eager = registry.variant("gn_mish", "eager").fn
    try:
        triton = registry.variant("gn_mish", "triton").fn
    except KeyError:
        triton = None
    return fam, fused, eager, triton


def _error_ratio(out, ref, tol) -> float:
    """max |out - ref| / (atol + rtol |ref|), in slices so a 1 GB case needs little extra memory."""
    worst = 0.0
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    step = 1 << 24
    for i in range(0, flat_ref.numel(), step):
        o, r = flat_out[i:i + step].double(), flat_ref[i:i + step]
        ratio = ((o - r).abs() / (tol.atol + tol.rtol * r.abs())).max().item()
        if ratio != ratio or not (o == o).all().item():  # NaN anywhere fails
            return float("inf")
        worst = max(worst, ratio)
    return worst


def _plan_text(plan: dict[str, int]) -> str:
    if plan["tier"] == 0:
        return (f"t0 {plan['group_threads']}thr/grp x{plan['groups_per_cta']}/cta items{plan['items']} "
                f"grid{plan['grid']} res{plan['resident_ctas']}")
    if plan["tier"] == 3:
        return (f"t3 {plan['grid']}x{plan['threads']}thr piece{plan['slice_vecs']} warps{plan['reducers']} "
                f"depth{plan['depth']} stage{plan['stage']} res{plan['resident_ctas']} smem{plan['smem_bytes']}")
    if plan["tier"] == 2:
        return (f"t2 {plan['cluster']}x{plan['threads']}thr items{plan['items']} ch{plan['chunks']} "
                f"stash{plan['stash']} grid{plan['grid']} res{plan['resident_ctas']} smem{plan['smem_bytes']}")
    return (f"t1{'p' if plan['persistent'] else ''} {plan['cluster']}x{plan['threads']}thr items{plan['items']} "
            f"ch{plan['chunks']} stash{plan['stash']} grid{plan['grid']} res{plan['resident_ctas']} "
            f"smem{plan['smem_bytes']}")


def _time_shape(case, mode: str, configs: dict[str, dict[str, int]], fam, fused, baselines: dict, timer,
                copy_bw: float, rows: list[dict]) -> int:
    """Check, then time, the baselines and every configuration with a new plan on one case; returns failures."""
    import torch

    name = case.id if case.dtype != "float32" else case.name
    inputs = fam.make_inputs(case, timer.device)
    ref = fam.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    tol = fam.tolerance(case, "float32")
    nbytes = fam.work(case).bytes
    contenders = [(label, (lambda fn=fn: fn(*inputs)), "") for label, fn in baselines.items() if fn is not None]
    seen_plans: dict[str, str] = {}
    for label, knobs in configs.items():
        tuning = fused.Tuning(**knobs)
        plan = fused.fused_plan(inputs[0], inputs[3], tuning)
        key = json.dumps(plan, sort_keys=True)
        if key in seen_plans:
            print(f"{name:20} {mode:5} {label:16} {'':>9} same plan as {seen_plans[key]}")
            continue
        seen_plans[key] = label
        contenders.append((label, (lambda tuning=tuning: fused.fused_gn_mish(*inputs, tuning=tuning)),
                           _plan_text(plan)))
    failures = 0
    times: dict[str, float] = {}
    for label, fn, plan_text in contenders:
        try:
            err = _error_ratio(fn(), ref, tol)
        except Exception as e:  # report it and go on with the other configurations
            print(f"{name:20} {mode:5} {label:16} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            failures += 1
            continue
        if err > 1.0:
            print(f"{name:20} {mode:5} {label:16} PARITY FAIL err/limit={err:.3g}  {plan_text}")
            failures += 1
            continue
        try:
            median = timer.measure(fn, mode).stats.median
        except Exception as e:  # report it and go on
            print(f"{name:20} {mode:5} {label:16} TIMING FAILED: {type(e).__name__}: {str(e)[:120]}")
            failures += 1
            continue
        times[label] = median
        gbs = nbytes / median / 1e9
        row = {"shape": name, "mode": mode, "config": label, "median_us": median * 1e6, "gbs": gbs,
               "pct_copy": 100 * gbs / copy_bw, "x_eager": times.get("eager", float("nan")) / median,
               "x_triton": times.get("triton", float("nan")) / median, "err": err, "plan": plan_text}
        rows.append(row)
        print(f"{name:20} {mode:5} {label:16} {median * 1e6:9.2f} {gbs:7.0f} {row['pct_copy']:6.1f} "
              f"{row['x_eager']:7.2f} {row['x_triton']:8.2f} {err:5.2f}  {plan_text}", flush=True)
    return failures


def run(only: str | None, budget_s: float, json_path: str | None) -> int:
    import torch

    import dpk
    from dpk.cases import load_suite_file
    from dpk.env import copy_bandwidth_gbps
    from dpk.timing import Timer, TimingConfig

    if not torch.cuda.is_available():
        print("_tune.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    fam, fused, eager, triton = _family()
    t0 = time.perf_counter()
    try:
        fused.extension()
    except dpk.Unavailable as e:
        print(f"extension build failed: {e}", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name(device)}; extension ready in {time.perf_counter() - t0:.1f} s")
    copy_bw = copy_bandwidth_gbps(device)
    print(f"# copy bandwidth {copy_bw:.0f} GB/s (read + write); timing budget {budget_s} s per row")
    timer = Timer(device, TimingConfig(budget_s=budget_s))
    suites = load_suite_file(ROOT / "suites" / "gn_mish.yaml").suites
    shapes = PRESETS.get(only, PUSHT_SHAPES + LARGE_SHAPES)
    rows: list[dict] = []
    header = (f"{'shape':20} {'mode':5} {'config':16} {'median_us':>9} {'GB/s':>7} {'%copy':>6} {'x_eager':>7} "
              f"{'x_triton':>8} {'err':>5}  plan")
    print(header)
    failures = 0
    for suite, name, mode, *dtype in shapes:
        case = next(c for c in suites[suite] if c.name == name and c.dtype == (dtype or ["float32"])[0])
        configs = (TIER0_CONFIGS if (suite, name, mode) in PUSHT_SHAPES else
                   STASH_CONFIGS if only == "stash" else WIDE_CONFIGS if only == "wide" else
                   GRID_CONFIGS if only == "grid" else SPREAD_CONFIGS if only == "spread" else TIER1_CONFIGS)
        failures += _time_shape(case, mode, configs, fam, fused, {"eager": eager, "triton": triton}, timer,
                                copy_bw, rows)
        torch.cuda.empty_cache()
    _summary(rows)
    if json_path:
        Path(json_path).write_text(json.dumps({"copy_gbps": copy_bw, "rows": rows}, indent=1))
    return 1 if failures else 0


def _summary(rows: list[dict]) -> None:
    print("\n# best fused configuration per shape (goal: pusht >= 3x eager in graph mode; large >= 70 % of copy)")
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape and r["config"] not in ("eager", "triton")]
        if not mine:
            continue
        best = min(mine, key=lambda r: r["median_us"])
        first = mine[0]
        print(f"{shape:20} best {best['config']:16} {best['median_us']:8.2f} us  {best['x_eager']:5.2f}x eager  "
              f"{best['x_triton']:5.2f}x triton  {best['pct_copy']:5.1f} %copy   "
              f"({first['config']}: {first['median_us']:.2f} us)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=tuple(PRESETS), help="time only these shapes")
    parser.add_argument("--budget", type=float, default=0.15, help="timing budget per row, seconds")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    return run(args.only, args.budget, args.json)


if __name__ == "__main__":
    sys.exit(main())
