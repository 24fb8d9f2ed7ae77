#!/usr/bin/env python3
"""Summary of a scripts/gpu-heal run: SRT, step time and GPU utilisation before / during / after
the fault, the restored share of the baseline, side effects on the other SLO nodes, and what the
healer did (from its journal). Prints markdown; --json writes the figures.

Windows (CLOCK_MONOTONIC): before = the 30 s before the fault; during = the first 5 s of the fault
(before any action could take effect); after = the last 30 s of the fault (healed, fault still
there). SRT = from the fault's onset to the first step from which the median of 10 consecutive
steps is within 10% of the baseline median.
"""

import argparse
import datetime
import glob
import json
import os
import re
import statistics
import sys

RUN = 10


def read_steps(path):
    out = []
    for line in open(path):
        f = line.split()
        if len(f) == 3:
            out.append((int(f[0]), float(f[2])))
    return out


def read_gpu(path, clock):
    mono0, wall0 = clock
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            util = float(parts[1])
        except ValueError:
            continue
        wall_ns = int(t.replace(tzinfo=datetime.timezone.utc).timestamp() * 1e9)
        out.append((wall_ns - wall0 + mono0, util))
    return out


def window(series, lo, hi):
    return [v for t, v in series if lo <= t < hi]


def med(v):
    return statistics.median(v) if v else None


def mean(v):
    return statistics.fmean(v) if v else None


def srt(steps, fault, base):
    after = [(t, ms) for t, ms in steps if t > fault]
    for i in range(len(after) - RUN + 1):
        if statistics.median(ms for _, ms in after[i:i + RUN]) <= base * 1.10:
            return (after[i][0] - fault) / 1e9
    return None


NODE = re.compile(r'^slo_probe_slo_value\{[^}]*node="([^"]+)"[^}]*\} (\S+)$')


def read_scrapes(d, start_ns):
    """(CLOCK_MONOTONIC ns, node, value) of every scrape (file names: seconds since start_ns)."""
    out = []
    for f in sorted(glob.glob(os.path.join(d, "*.prom"))):
        t = start_ns + int(os.path.basename(f).split(".")[0]) * 1_000_000_000
        for line in open(f):
            m = NODE.match(line.strip())
            if m:
                out.append((t, m.group(1), float(m.group(2))))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--scrapes", required=True)
    p.add_argument("--json")
    a = p.parse_args()
    o = a.out
    steps = read_steps(os.path.join(o, "steps.txt"))
    fault = int(open(os.path.join(o, "fault_at.txt")).read())
    fault_end = int(open(os.path.join(o, "fault_end.txt")).read())
    mono0, wall0 = (int(x) for x in open(os.path.join(o, "clock.txt")).read().split())
    gpu = read_gpu(os.path.join(o, "gpu.csv"), (mono0, wall0))
    s30 = 30_000_000_000
    base = med(window(steps, fault - s30, fault))
    during = med(window(steps, fault, fault + 5_000_000_000))
    after = med(window(steps, fault_end - s30, fault_end))
    g_before = mean(window(gpu, fault - s30, fault))
    g_during = mean(window(gpu, fault, fault + 5_000_000_000))
    g_after = mean(window(gpu, fault_end - s30, fault_end))
    events = []
    for line in open(os.path.join(o, "heal.jsonl")):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("kind") == "audit":
            e = d["event"]
            events.append(((e["at_ns"] - fault) / 1e9, e))
    tried = [f'{e["strategy"]}/{e["level"]}' for _, e in events if e["event"] == "apply"]
    kept = [e["strategy"] for _, e in events if e["event"] == "kept"]
    reverted = [(e["strategy"], e["reason"]["why"]) for _, e in events if e["event"] == "revert"]
    first_apply = next((t for t, e in events if e["event"] == "applied" and t > 0), None)
    first_kept = next((t for t, e in events if e["event"] == "kept" and t > 0), None)
    diagnosed = next((e for t, e in events if e["event"] == "diagnosed" and t > 0), None)
    # Side effects: each SLO node's mean value in the 30 s before the fault against the last
    # 30 s of it (healed, fault still there).
    start = int(open(os.path.join(o, "scrapes_start.txt")).read())
    scr = read_scrapes(a.scrapes, start)
    side = {}
    for n in sorted({n for _, n, _ in scr}):
        b = mean([v for t, nn, v in scr if nn == n and fault - s30 <= t < fault])
        af = mean([v for t, nn, v in scr if nn == n and fault_end - s30 <= t < fault_end])
        if b is not None and af is not None:
            side[n] = {"before": b, "healed": af, "change": (af - b) / abs(b) if b else None}
    # The healer's own side-effect test, per kept action: the other guarded nodes' windows
    # judged before the action against those after it (the kept event carries them).
    side_kept = [(t, e) for t, e in events if e["event"] == "kept" and e.get("side_effects")]

    def worst_of(gpu):
        return max((c["worse_by"] for _, e in side_kept for c in e["side_effects"]
                    if (c["node"] == "gpu_utilisation") == gpu), default=None)

    result = {
        "kept_side_effects": [{"at_s": t, "strategy": e["strategy"], "nodes": e["side_effects"]}
                              for t, e in side_kept],
        "kept_worst_side_effect": worst_of(False),
        "kept_worst_gpu_drop": worst_of(True),
        "baseline_step_ms": base, "faulty_step_ms": during, "healed_step_ms": after,
        "srt_s": srt(steps, fault, base) if base else None,
        "first_action_s": first_apply, "kept_s": first_kept,
        "gpu_util_before": g_before, "gpu_util_during": g_during, "gpu_util_after": g_after,
        "gpu_util_restored": (g_after / g_before) if g_before and g_after is not None else None,
        "diagnosed": diagnosed and {k: diagnosed.get(k) for k in ("node", "dimension", "host", "detail")},
        "tried": tried, "kept": kept, "reverted": reverted, "healer_recovered": bool(kept),
        "nodes": side,
        "undo": open(os.path.join(o, "undo.txt")).read() if os.path.exists(os.path.join(o, "undo.txt")) else None,
    }
    if a.json:
        json.dump(result, open(a.json, "w"), indent=2)
    f = lambda v, fmt="{:.2f}": "n/a" if v is None else fmt.format(v)
    print("# Healing on the GPU: a host fault on a live training job\n")
    print("| | before | during the fault | healed |")
    print("|---|---|---|---|")
    print(f"| step time, median ms | {f(base)} | {f(during)} | {f(after)} |")
    print(f"| GPU utilisation, mean % | {f(g_before, '{:.1f}')} | {f(g_during, '{:.1f}')} | {f(g_after, '{:.1f}')} |")
    print()
    if not kept:
        # Without an action kept the figures below are the job's own (the scheduler's, the
        # fault's effect fading), not the healer's: say so before them.
        print("- **no action was kept during the fault: the recovery figures below are not the healer's**")
    print(f"- SRT (fault onset → median of 10 steps within 10% of the baseline): **{f(result['srt_s'], '{:.1f}')} s**")
    print(f"- GPU utilisation restored: **{f(result['gpu_util_restored'] and 100 * result['gpu_util_restored'], '{:.1f}')}%** of the baseline (aim ≥ 92%)")
    print(f"- first action applied {f(first_apply, '{:.1f}')} s after the onset; kept {f(first_kept, '{:.1f}')} s")
    if diagnosed:
        print(f"- diagnosed: node `{diagnosed.get('node')}`, dimension `{diagnosed.get('dimension')}`, host cause `{diagnosed.get('host')}`")
    print(f"- tried {tried}; kept {kept}; rolled back {reverted}")
    if side_kept:
        print("\nSide effects of each kept action (the healer's verification: the other guarded SLO nodes' "
              "windows judged before the action against those after it; worse by more than 0.5% rolls back):\n")
        print("| kept at s | strategy | node | before | after | worse by | windows before / after |")
        print("|---|---|---|---|---|---|---|")
        for t, e in side_kept:
            for c in e["side_effects"]:
                w = c.get("windows") or [0, 0]
                print(f"| {t:.1f} | {e['strategy']} | {c['node']} | {c['before']:.3f} | {c['after']:.3f} | "
                      f"{100 * c['worse_by']:+.2f}% | {w[0]} / {w[1]} |")
        worst, gpu = result["kept_worst_side_effect"], result["kept_worst_gpu_drop"]
        print(f"\nWorst side effect of a kept action on another SLO node: {f(worst and 100 * worst, '{:+.2f}%')} "
              f"(budget +0.5%); GPU utilisation against its bound (the baseline, or the before window where "
              f"lower): {f(gpu and 100 * gpu, '{:+.2f}%')} (constraint: at most 5% below).")
    print("\nPhases of the run (scrapes, whole phases: the fault's last 30 s against the 30 s before it, "
          "not the healer's test):")
    print("\n| SLO node | before | healed | change |")
    print("|---|---|---|---|")
    for n, v in side.items():
        print(f"| {n} | {v['before']:.3f} | {v['healed']:.3f} | {f(v['change'] and 100 * v['change'], '{:+.2f}%')} |")
    print("\nTimeline (s from the fault's onset):\n")
    for t, e in events:
        if t > -5:
            what = {k: v for k, v in e.items() if k in ("strategy", "level", "host", "reason")}
            print(f"- {t:7.2f} {e['event']} {what}")


if __name__ == "__main__":
    sys.exit(main())
