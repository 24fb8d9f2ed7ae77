#!/usr/bin/env python3
"""Figures of scripts/gpu-overhead: what slo-probe's CUPTI shim costs a training job.

    python3 scripts/overhead_summary.py DIR [--json F] [--md F] [--bench bench/results/gpu-overhead-h200.md]
    python3 scripts/overhead_summary.py --self-test

DIR holds what scripts/gpu-overhead wrote: blocks.jsonl (one line per measured unit, from
scripts/gpu_overhead.py) and run.json (machine, date, command, stages run and skipped, errors).
Writes the figures as JSON (--json, default DIR/overhead.json) and a markdown report (--md,
default DIR/overhead.md); --bench writes the same report where the repository keeps results.

In-process A/B: every round runs each condition once, in rotated order; a block's overhead is
its step time against the `released` block of the same round (paired, so that slow drift of the
machine cancels); the table gives the median of those ratios and their spread (min..max).
Process pairs: median step time of each process, with and without CUDA_INJECTION64_PATH.

The default tier is duty-cycled, so the median of its blocks shows mostly the depth-0 cost;
the table also gives the mean of the blocks, the blocks without a sample window, and an
estimate of the long-run average: depth-0 cost + the kernel-depth cost × the duty cycle the
shim published (window+1 steps of every period). The process pairs measure that average
directly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
from typing import Any, Dict, List, Optional, Tuple

BUDGET_PCT = 0.5


def load(path: str) -> List[Dict[str, Any]]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        out.append({"kind": "error", "error": f"unreadable line: {line[:200]}"})
    except OSError:
        pass
    return out


def median_ci(xs: List[float], level: float = 0.90, resamples: int = 2000) -> Optional[Tuple[float, float]]:
    """A bootstrap confidence interval of the median of xs (percentile method, fixed seed so a
    report reads the same every time); None under 5 values."""
    if len(xs) < 5:
        return None
    rng = random.Random(1)
    n = len(xs)
    meds = sorted(statistics.median(rng.choices(xs, k=n)) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * (resamples - 1))]
    hi = meds[int((1 + level) / 2 * (resamples - 1))]
    return lo, hi


def spread(xs: List[float], ci: bool = False) -> Dict[str, Any]:
    """n, median, mean, min and max of xs; with `ci`, the median's 90% interval too."""
    xs = sorted(x for x in xs if x is not None and not math.isnan(x))
    if not xs:
        return {"n": 0}
    out: Dict[str, Any] = {
        "n": len(xs),
        "median": statistics.median(xs),
        "mean": statistics.fmean(xs),
        "min": xs[0],
        "max": xs[-1],
    }
    interval = median_ci(xs) if ci else None
    if interval:
        out["ci90"] = list(interval)
    return out


def verdict(s: Dict[str, Any], shift: float = 0.0) -> str:
    """Is the cost within the budget, resolved? From the 90% interval of the median ratio
    (shifted by `shift`, a ratio − 1 added, for a long-run estimate): 'yes' when the whole
    interval is at or under the budget, 'no' when all of it is over, else 'not resolved'."""
    ci = s.get("ci90")
    if not ci:
        return "–"
    lo, hi = ((c - 1 + shift) * 100 for c in ci)
    if hi <= BUDGET_PCT:
        return "yes"
    if lo > BUDGET_PCT:
        return "**no**"
    return "not resolved"


def ci_pct(s: Dict[str, Any], shift: float = 0.0) -> str:
    ci = s.get("ci90")
    if not ci:
        return "–"
    m = (s["median"] - 1 + shift) * 100
    return f"{m:+.2f}% (90% CI {(ci[0] - 1 + shift) * 100:+.2f} .. {(ci[1] - 1 + shift) * 100:+.2f})"


def pct(s: Dict[str, float]) -> str:
    """'+0.12% [-0.10, +0.31]' from a spread of ratios."""
    if not s.get("n"):
        return "–"
    m = (s["median"] - 1) * 100
    return f"{m:+.2f}% [{(s['min'] - 1) * 100:+.2f}, {(s['max'] - 1) * 100:+.2f}]"


def ab_figures(rec: Dict[str, Any], prof: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    blocks = rec.get("blocks", [])
    by_round: Dict[int, Dict[str, Dict[str, Any]]] = {}
    by_cond: Dict[str, List[Dict[str, Any]]] = {}
    for b in blocks:
        by_cond.setdefault(b["condition"], []).append(b)
        if "round" in b:
            by_round.setdefault(b["round"], {})[b["condition"]] = b
    f: Dict[str, Any] = {"label": rec["label"], "mode": rec["mode"], "batch": rec.get("batch"),
                         "seq": rec.get("seq"), "device": rec.get("device"),
                         "simulated": rec.get("simulated"), "warm_s": rec.get("warm_s")}
    f["step_ms"] = {c: spread([b["step_s"] * 1e3 for b in bs]) for c, bs in by_cond.items()}

    def paired(cond: str, keep=lambda b: True, key: str = "step_s") -> Dict[str, float]:
        return spread([r[cond][key] / r["released"][key] for r in by_round.values()
                       if cond in r and "released" in r and keep(r[cond])
                       and r[cond].get(key) and r["released"].get(key)], ci=True)

    no_window = lambda b: b.get("counters", {}).get("sampled_steps", 0) == 0  # noqa: E731

    def ratios(key: str) -> Dict[str, Dict[str, float]]:
        return {
            "default": paired("default", key=key),
            "default_no_window": paired("default", no_window, key=key),
            "kernels": paired("kernels", key=key),
            # A/A: released against released, the method's noise and bias in the same rounds.
            "control": paired("control", key=key),
        }

    # Per block: its synchronised wall time per step; the main thread's CPU time per step (blocks
    # that carry it); the median of its host step times (the host's spikes left out); the main
    # thread's retired instructions per step (a perf_event counter).
    for name, key in (("ratio", "step_s"), ("cpu_ratio", "cpu_s"), ("med_ratio", "step_med_s"),
                      ("instr_ratio", "instr")):
        f[name] = ratios(key)
    # What the host did to the blocks: stolen ticks and the main thread's preemptions per step.
    f["host_noise"] = {
        c: {k: spread([b[k] / b["steps"] for b in bs if b.get(k) is not None]) for k in ("steal_ticks", "preemptions")}
        for c, bs in by_cond.items()
    }
    f["instr_per_step"] = {c: spread([b["instr"] for b in bs if b.get("instr")]) for c, bs in by_cond.items()}
    rel = f["step_ms"].get("released", {}).get("median")
    pblocks = (prof or {}).get("blocks", [])
    if pblocks and rel:
        f["ratio"]["profiler"] = spread([b["step_s"] * 1e3 / rel for b in pblocks])
        f["profiler_cuda_events_per_step"] = statistics.median(
            b.get("profiler_cuda_events", 0) / max(1, b["steps"]) for b in pblocks)
    # The default tier's windows and its long-run average.
    dflt = by_cond.get("default", [])
    steps = sum(b["steps"] for b in dflt)
    sampled = sum(b.get("counters", {}).get("sampled_steps", 0) for b in dflt)
    f["default_sampled_share"] = sampled / steps if steps else None
    f["default_windows"] = sum(1 for b in dflt if not no_window(b))
    d = rec.get("depth_end") or {}
    f["published"] = {k: d.get(k) for k in ("window", "period", "unit")}
    duty = None
    if d.get("period") and d.get("unit") == "steps":
        duty = (d["window"] + 1) / d["period"]
    f["duty"] = duty
    t0 = f["ratio"]["default_no_window"].get("median") or f["ratio"]["default"].get("median")
    # Depth 1's cost: the forced blocks, else the default blocks a sample window covered whole.
    f["ratio"]["default_windowed"] = paired(
        "default", lambda b: b.get("counters", {}).get("sampled_steps", 0) >= b.get("steps", 1) > 0)
    k = f["ratio"]["kernels"].get("median") or f["ratio"]["default_windowed"].get("median")
    f["depth1_ratio"] = k
    f["default_estimated_ratio"] = (t0 + (k - 1) * duty) if (t0 and k and duty is not None) else None
    # Depth 1 per kernel: CUPTI's cost per record = measured extra time per record less the
    # shim's measured callback time (the figure SHIM_COST_PER_KERNEL_RECORD_NS stands for).
    kb = by_cond.get("kernels", [])
    ksteps = sum(b["steps"] for b in kb)
    c = lambda key: sum(b.get("counters", {}).get(key, 0) for b in kb)  # noqa: E731
    if ksteps and rel:
        rec_per_step = c("kernel_records") / ksteps
        cb_ns_per_step = c("callback_ns") / ksteps
        launches_per_step = (c("launches_driver") + c("launches_runtime") - c("graph_launches")) / ksteps
        extra_ns = ((f["step_ms"]["kernels"]["median"]) - rel) * 1e6
        f["kernels_per_step"] = rec_per_step
        f["kernel_launch_callbacks_per_step"] = launches_per_step
        f["callback_ns_per_step"] = cb_ns_per_step
        f["extra_ns_per_step"] = extra_ns
        if rec_per_step > 0:
            f["extra_ns_per_kernel"] = extra_ns / rec_per_step
            f["callback_ns_per_kernel"] = cb_ns_per_step / rec_per_step
            f["implied_cupti_ns_per_record"] = (extra_ns - cb_ns_per_step) / rec_per_step
    end = rec.get("counters_end") or {}
    f["launch"] = {k: end.get(k) for k in ("launch_domains", "corr_hits_driver", "corr_hits_runtime",
                                             "corr_hits", "corr_misses", "launches_driver",
                                             "launches_runtime", "graph_launches")}
    if "toggles" in rec:
        f["toggles"] = rec["toggles"]
    bad = [b for b in kb if b.get("depth_reached") is False]
    if bad:
        f["warnings"] = [f"{len(bad)} kernels blocks did not reach depth 1 within the wait"]
    return f


def pair_figures(recs: List[Dict[str, Any]]) -> Dict[str, Any]:
    side: Dict[bool, List[float]] = {True: [], False: []}
    for r in recs:
        bs = r.get("block_step_s") or []
        if bs:
            side[bool(r.get("injected"))].append(statistics.median(bs) * 1e3)
    out: Dict[str, Any] = {"label": recs[0]["label"], "with_shim_ms": spread(side[True]),
                           "without_ms": spread(side[False]),
                           "order": [str(r.get("tag") or ("B" if r.get("injected") else "A")) for r in recs]}
    a, b = out["without_ms"].get("median"), out["with_shim_ms"].get("median")
    if a and b:
        out["ratio"] = b / a
        # Spread: every with/without combination of process medians.
        out["ratio_range"] = [min(side[True]) / max(side[False]), max(side[True]) / min(side[False])]
    return out


def domain_figures(r: Dict[str, Any]) -> Dict[str, Any]:
    """A run forced to depth 1 with one launch-domain setting: do kernel records match it?"""
    c = r.get("counters") or {}
    bs = r.get("block_step_s") or []
    steps = max(1, r.get("steps") or 1)
    return {
        "label": r["label"],
        "step_ms": statistics.median(bs) * 1e3 if bs else None,
        "kernel_records_per_step": c.get("kernel_records", 0) / steps,
        "corr_hits": c.get("corr_hits"),
        "corr_misses": c.get("corr_misses"),
        "hits_driver": c.get("corr_hits_driver"),
        "hits_runtime": c.get("corr_hits_runtime"),
        "launch_callbacks_per_step": (c.get("launches_driver", 0) + c.get("launches_runtime", 0)) / steps,
        "callback_ns_per_step": c.get("callback_ns", 0) / steps,
    }


def fmt_ms(s: Dict[str, float]) -> str:
    return f"{s['median']:.3f} ms" if s.get("n") else "–"


def report(run: Dict[str, Any], ab: List[Dict[str, Any]], pairs: List[Dict[str, Any]],
           errors: List[Dict[str, Any]], skipped: List[str], domains: List[Dict[str, Any]]) -> str:
    L: List[str] = ["# What the CUPTI shim costs a training job (scripts/gpu-overhead)", ""]
    env = run.get("env") or next((a.get("env") for a in ab if a.get("env")), {}) or {}
    L.append(f"Run: `{run.get('command', 'scripts/gpu-overhead')}` on {run.get('date', '?')}: "
             f"{run.get('gpu', env.get('gpu', '?'))}, driver {run.get('driver', '?')}, torch {env.get('torch', '?')}"
             f" (CUDA {env.get('cuda', '?')}), {run.get('cpus', '?')} CPUs; "
             f"{run.get('elapsed_s', '?')} s of a {run.get('budget_s', '?')} s budget; agent: {run.get('agent', '?')}"
             f"{'; ' + run['pinned'] if run.get('pinned') else ''}.")
    L.append("")
    L.append("Job: a GPT-style transformer LM in plain PyTorch (scripts/gpu_overhead.py: "
             f"{run.get('model', 'dim 512, 8 layers, 8 heads, vocab 8192')}), AdamW, random tokens. "
             f"In-process A/B: rounds of {run.get('block_steps', 50)}-step blocks, each condition once per round in rotated order; "
             "overhead = block step time / the `released` block of the same round − 1: median of rounds "
             "[min, max]. `released` = `slo_probe.cupti_released()` (the shim unsubscribed).")
    L.append("")
    L.append("| job | step (released) | default tier: blocks | default: blocks without a window "
             "| default: long-run estimate | kernels (depth 1) | torch.profiler | kernels/step | ≤ 0.5%? |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for f in ab:
        est = f.get("default_estimated_ratio")
        est_s = f"{(est - 1) * 100:+.2f}% (duty {f['duty']:.3f})" if est else "–"
        worst = max([x for x in (est, f["ratio"]["default"].get("mean")) if x], default=None)
        ok = "–" if worst is None else ("yes" if (worst - 1) * 100 <= BUDGET_PCT else "**no**")
        kps = f.get("kernels_per_step")
        L.append(f"| {f['label']}{' (simulated)' if f.get('simulated') else ''} | "
                 f"{fmt_ms(f['step_ms'].get('released', {}))} | {pct(f['ratio']['default'])} "
                 f"(mean {((f['ratio']['default'].get('mean') or 1) - 1) * 100:+.2f}%, "
                 f"{f['default_windows']} blocks with a window) | {pct(f['ratio']['default_no_window'])} | "
                 f"{est_s} | {pct(f['ratio']['kernels'])} | {pct(f['ratio'].get('profiler', {}))} | "
                 f"{'–' if kps is None else f'{kps:.0f}'} | {ok} |")
    L.append("")
    if any(f["ratio"]["default"].get("ci90") for f in ab):
        L += ["Resolution: a 90% bootstrap interval of each median over the rounds. `control` is an A/A pair "
              "(CUPTI released in both blocks, `--conditions ...,control`): where its interval is wide or off "
              "zero, the host's noise or the design's bias is that large. The long-run estimate's interval is "
              "the interval of the blocks without a window shifted by (depth 1 − 1) × duty (depth 1: the forced blocks, else the default blocks a window covered whole). The verdict is "
              "'yes' only when the whole interval is within the budget, '**no**' when all of it is over.", "",
              "| job | rounds | control (A/A) | default: blocks | default: blocks without a window "
              "| default: long-run | ≤ 0.5%, resolved? |",
              "|---|---|---|---|---|---|---|"]
        for f in ab:
            r = f["ratio"]
            k, duty = f.get("depth1_ratio"), f.get("duty")
            nw = r["default_no_window"] if r["default_no_window"].get("ci90") else r["default"]
            if k and duty is not None:
                shift, long_run = (k - 1) * duty, nw
            else:
                shift, long_run = 0.0, r["default"]
            L.append(f"| {f['label']} | {r['default'].get('n', 0)} | {ci_pct(r['control'])} | "
                     f"{ci_pct(r['default'])} | {ci_pct(r['default_no_window'])} | "
                     f"{ci_pct(long_run, shift)} | {verdict(long_run, shift)} |")
        L.append("")
    if any(f.get("med_ratio", {}).get("default", {}).get("n") for f in ab):
        L += ["The same rounds on the median of each block's step times (host time per step, no sync between "
              "steps: the host's spikes — preemption, a neighbour, stolen time — left out, which the block's mean "
              "keeps); the verdict is on the median of rounds, the spread beside it:", "",
              "| job | default tier: blocks | default: blocks without a window | kernels (depth 1) "
              "| stolen ticks / preemptions per step (released) | ≤ 0.5%? |",
              "|---|---|---|---|---|---|"]
        for f in ab:
            c = f.get("med_ratio", {})
            m = c.get("default", {}).get("median")
            ok = "–" if m is None else ("yes" if (m - 1) * 100 <= BUDGET_PCT else "**no**")
            hn = f.get("host_noise", {}).get("released", {})
            st, pr = hn.get("steal_ticks", {}).get("median"), hn.get("preemptions", {}).get("median")
            noise = "–" if st is None and pr is None else (
                f"{'–' if st is None else f'{st:.2f}'} / {'–' if pr is None else f'{pr:.2f}'}")
            L.append(f"| {f['label']} | {pct(c.get('default', {}))} | {pct(c.get('default_no_window', {}))} | "
                     f"{pct(c.get('kernels', {}))} | {noise} | {ok} |")
        L.append("")
    ratio_tables = (
        ("cpu_ratio", None, "The same rounds on the main thread's CPU time per step (`time.thread_time()`, "
                            "before the block's final sync: preemption and waits left out):"),
        ("instr_ratio", "instructions per step (released)",
         "The same rounds on the main thread's retired instructions per step (a perf_event counter: counted, "
         "not timed, so the host's noise stays out; what CUPTI and the shim add on the launching thread, not "
         "what they cost the GPU):"),
    )
    for key, first, title in ratio_tables:
        if not any(f.get(key, {}).get("default", {}).get("n") for f in ab):
            continue
        L += [title, "", "| job | " + (f"{first} | " if first else "") + "default tier: blocks | "
              "default: blocks without a window | kernels (depth 1) |",
              "|---|" + ("---|" if first else "") + "---|---|---|"]
        for f in ab:
            c = f.get(key, {})
            rel = f.get("instr_per_step", {}).get("released", {})
            lead = f"{rel.get('median', 0) / 1e6:.2f} M | " if first else ""
            L.append(f"| {f['label']} | {lead}{pct(c.get('default', {}))} | "
                     f"{pct(c.get('default_no_window', {}))} | {pct(c.get('kernels', {}))} |")
        L.append("")
    L.append("Depth 1 per kernel (the calibration of `SHIM_COST_PER_KERNEL_RECORD_NS` in common/src/ring.rs):")
    L.append("")
    L.append("| job | extra ns per kernel | shim callback ns per kernel | implied CUPTI ns per record "
             "| launch callbacks per kernel | launch domains (1 driver, 2 runtime) | kernel hits driver / runtime |")
    L.append("|---|---|---|---|---|---|---|")
    for f in ab:
        if "extra_ns_per_kernel" not in f:
            continue
        lc = f["kernel_launch_callbacks_per_step"] / f["kernels_per_step"] if f.get("kernels_per_step") else 0
        la = f["launch"]
        L.append(f"| {f['label']} | {f['extra_ns_per_kernel']:.0f} | {f['callback_ns_per_kernel']:.0f} | "
                 f"{f['implied_cupti_ns_per_record']:.0f} | {lc:.2f} | {la.get('launch_domains')} | "
                 f"{la.get('corr_hits_driver')} / {la.get('corr_hits_runtime')} (misses {la.get('corr_misses')}) |")
    tog = [f for f in ab if "toggles" in f]
    if tog:
        L.append("")
        L.append("Switching kernel tracing at run time (raise = request until `depth()` shows it):")
        L.append("")
        for f in tog:
            t = f["toggles"]
            g = lambda k: t.get(k, {}).get("median")  # noqa: E731
            ms = lambda x: "–" if x is None else f"{x * 1e3:.3f} ms"  # noqa: E731
            L.append(f"- {f['label']}, {t.get('cycles')} cycles: raise applied in {ms(g('apply_raise_s'))}, "
                     f"lower in {ms(g('apply_lower_s'))} (medians); the shim's thread spent "
                     f"{t.get('shim_toggle_ns_per_change', 0) / 1e3:.1f} µs per change; step right after a raise "
                     f"{ms(g('step_after_raise_s'))} vs {ms(g('steady_kernels_step_s'))} steady at depth 1; "
                     f"right after a lower {ms(g('step_after_lower_s'))} vs {ms(g('steady_timing_step_s'))} "
                     f"steady at depth 0 (synchronised per step).")
    if pairs:
        L.append("")
        L.append("Process pairs (the default tier over whole runs, with and without `CUDA_INJECTION64_PATH`; "
                 "median step of each process, processes alternated):")
        L.append("")
        L.append("| job | without | with the shim | ratio | range | order |")
        L.append("|---|---|---|---|---|---|")
        for p in pairs:
            r = p.get("ratio")
            rr = p.get("ratio_range")
            L.append(f"| {p['label']} | {fmt_ms(p['without_ms'])} | {fmt_ms(p['with_shim_ms'])} | "
                     f"{'–' if r is None else f'{(r - 1) * 100:+.2f}%'} | "
                     f"{'–' if not rr else f'{(rr[0] - 1) * 100:+.2f}% .. {(rr[1] - 1) * 100:+.2f}%'} | "
                     f"{' '.join(p['order'])} |")
    if domains:
        L.append("")
        L.append("Launch-callback domain (eager, forced to depth 1 from the start, `SLO_PROBE_LAUNCH_DOMAIN`): "
                 "a domain is enough when the kernel records' correlation ids match its callbacks (few misses):")
        L.append("")
        L.append("| run | step | kernels/step | launch callbacks/step | callback ns/step | hits (driver / runtime) | misses |")
        L.append("|---|---|---|---|---|---|---|")
        for d in domains:
            st = "–" if d["step_ms"] is None else f"{d['step_ms']:.3f} ms"
            L.append(f"| {d['label']} | {st} | {d['kernel_records_per_step']:.0f} | "
                     f"{d['launch_callbacks_per_step']:.0f} | {d['callback_ns_per_step']:.0f} | "
                     f"{d['hits_driver']} / {d['hits_runtime']} | {d['corr_misses']} |")
    if skipped or errors:
        L.append("")
        L.append("Not measured:")
        L.append("")
        for s in skipped:
            L.append(f"- skipped: {s}")
        for e in errors:
            L.append(f"- error: {e.get('label', '')} {e.get('error', '')}".rstrip())
    warnings = [f"{f['label']}: {w}" for f in ab for w in f.get("warnings", [])]
    for w in warnings:
        L.append(f"- warning: {w}")
    L.append("")
    return "\n".join(L)


def self_test() -> int:
    """The intervals, the verdicts and the long-run estimate on synthetic rounds with known
    answers (run by scripts/test)."""
    checks: List[Tuple[str, bool]] = []
    checks.append(("no interval under 5 values", median_ci([1.0, 1.1, 1.2, 1.3]) is None))
    checks.append(("a constant's interval is itself", median_ci([1.01] * 9) == (1.01, 1.01)))
    lo, hi = median_ci([1.0 + i / 1000 for i in range(21)]) or (0, 0)
    checks.append(("the interval holds the median", lo <= 1.010 <= hi and hi - lo < 0.01))
    checks.append(("within the budget", verdict({"ci90": [0.999, 1.004]}) == "yes"))
    checks.append(("over the budget", verdict({"ci90": [1.006, 1.01]}) == "**no**"))
    checks.append(("not resolved", verdict({"ci90": [0.99, 1.01]}) == "not resolved"))
    checks.append(("a shift moves the verdict", verdict({"ci90": [0.999, 1.004]}, 0.002) == "not resolved"))
    # 12 rounds: released 10 ms ± 1%, control as released, default +0.2% without a window and
    # +2% in the rounds a window covered whole (every fourth); the shim published a window of 4
    # steps in 100.
    blocks = []
    for r in range(12):
        base = 0.010 * (1 + 0.01 * ((r * 7) % 5 - 2) / 2)
        windowed = r % 4 == 0
        blocks += [
            {"condition": "released", "round": r, "step_s": base, "steps": 20},
            {"condition": "control", "round": r, "step_s": base, "steps": 20},
            {"condition": "default", "round": r, "step_s": base * (1.02 if windowed else 1.002), "steps": 20,
             "counters": {"sampled_steps": 20 if windowed else 0}},
        ]
    rec = {"kind": "ab", "label": "eager 16x512", "mode": "eager", "blocks": blocks,
           "depth_end": {"window": 4, "period": 100, "unit": "steps"}}
    f = ab_figures(rec, None)
    near = lambda a, b: a is not None and abs(a - b) < 1e-9  # noqa: E731
    checks.append(("A/A control at zero", near(f["ratio"]["control"]["median"], 1.0)))
    checks.append(("blocks without a window", near(f["ratio"]["default_no_window"]["median"], 1.002)))
    checks.append(("blocks a window covered", near(f["ratio"]["default_windowed"]["median"], 1.02)))
    checks.append(("long-run estimate", near(f["default_estimated_ratio"], 1.002 + 0.02 * 0.05)))
    md = report({}, [f], [], [], [], [])
    row = next((line for line in md.splitlines() if line.startswith("| eager 16x512 | 12 |")), "")
    checks.append(("the resolution row says yes", row.endswith("| yes |")))
    bad = [name for name, ok in checks if not ok]
    for name in bad:
        print(f"self-test FAILED: {name}", file=sys.stderr)
    print(f"overhead_summary.py self-test: {len(checks) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--bench", help="also write the report here (bench/results/gpu-overhead-h200.md)")
    a = p.parse_args()
    recs = load(os.path.join(a.dir, "blocks.jsonl"))
    try:
        with open(os.path.join(a.dir, "run.json")) as f:
            run = json.load(f)
    except (OSError, ValueError):
        run = {}
    profs = {r["label"]: r for r in recs if r.get("kind") == "profiler"}
    ab = [ab_figures(r, profs.get(r["label"])) for r in recs if r.get("kind") == "ab"]
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for r in recs:
        if r.get("kind") == "pair":
            groups.setdefault(r["label"], []).append(r)
    pairs = [pair_figures(g) for g in groups.values()]
    errors = [r for r in recs if r.get("kind") == "error"] + [{"error": e} for e in run.get("errors", [])]
    skipped = [r.get("label", "") + ": " + r.get("why", "") for r in recs if r.get("kind") == "skipped"]
    skipped += run.get("skipped", [])
    domains = [domain_figures(r) for r in recs if r.get("kind") == "domain"]
    md = report(run, ab, pairs, errors, skipped, domains)
    out = {"run": run, "ab": ab, "pairs": pairs, "domains": domains, "errors": errors, "skipped": skipped}
    with open(a.json or os.path.join(a.dir, "overhead.json"), "w") as f:
        json.dump(out, f, indent=1)
    for path in filter(None, [a.md or os.path.join(a.dir, "overhead.md"), a.bench]):
        with open(path, "w") as f:
            f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
