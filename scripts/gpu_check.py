#!/usr/bin/env python3
"""Checks and figures of the GPU tier, from the files scripts/gpu-check produced.

Reads OUT/*.json and OUT/runs.jsonl; writes OUT/summary.md and OUT/results.json; exits 1 when a
check fails. The checks (issue 4 of slo-probe):

1. every kernel is recorded: per-step kernels + memory operations seen by the shim against
   torch.profiler's CUDA events per step in a separate run of the same job (independent count);
   also the shim's own launch callbacks against its kernel records, and zero drops;
2. iteration times from the shim's step markers against CUDA-event timings of the same steps:
   95th percentile of the per-step difference within 1%;
3. CUDA-graph kernel nodes resolve to operators in diagnostic (node-level) mode;
4. overhead: median step time without the shim, with the shim always on, with torch.profiler,
   eager and CUDA-graph modes; target at most 1% for the shim.
"""

import json
import os
import statistics
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/slo-gpu")


def load(name):
    try:
        with open(os.path.join(OUT, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def runs():
    out = {}
    try:
        with open(os.path.join(OUT, "runs.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                out[r["label"]] = r
    except OSError:
        pass
    return out


def gpu_proc(obs):
    """The shim process with the most records in an observe JSON."""
    procs = (obs or {}).get("gpu", [])
    return max(procs, key=lambda p: p["records"], default=None)


results = {"checks": {}, "figures": {}}
lines = ["# GPU check (scripts/gpu-check)", ""]
ok_all = True


def check(name, ok, text):
    global ok_all
    ok_all &= bool(ok)
    results["checks"][name] = {"ok": bool(ok), "detail": text}
    lines.append(f"- [{'x' if ok else ' '}] **{name}**: {text}")


R = runs()
eager = load("eager.json")
graphs = load("graphs.json")
pe, pg = gpu_proc(eager), gpu_proc(graphs)

# 1. kernel accounting
if pe and "profile-eager" in R:
    its = [i for i in pe["iterations"] if i["marked"]][20:-2]
    shim_per_step = statistics.median(i["kernels"] + i["memory_ops"] for i in its) if its else 0
    prof = R["profile-eager"]["profiler_cuda_events_per_step"] or 0
    c = R.get("eager", {}).get("shim_counters") or {}
    check(
        "eager kernels recorded",
        its and abs(shim_per_step - prof) <= max(1, 0.01 * prof)
        and pe["dropped"] == 0 and pe["cupti_dropped"] == 0,
        f"shim {shim_per_step} kernels+memory ops per step (median of {len(its)} steps) vs "
        f"torch.profiler {prof:.1f} CUDA events per step; launch callbacks "
        f"driver {c.get('launches_driver')} / runtime {c.get('launches_runtime')}, kernel records "
        f"{c.get('kernel_records')}, correlation hits {c.get('corr_hits')} misses "
        f"{c.get('corr_misses')}; dropped {pe['dropped']} (ring) {pe['cupti_dropped']} (CUPTI)",
    )
    results["figures"]["eager_kernels_per_step"] = {"shim": shim_per_step, "profiler": prof}
if pg and "profile-graphs" in R:
    diag = [i for i in pg["iterations"] if i["marked"] and i["graph_launches"] == 0 and i["kernels"] > 0]
    normal = [i for i in pg["iterations"] if i["marked"] and i["graph_launches"] > 0][10:]
    prof = R["profile-graphs"]["profiler_cuda_events_per_step"] or 0
    d = statistics.median(i["kernels"] + i["memory_ops"] for i in diag) if diag else 0
    check(
        "graph kernels recorded (diagnostic mode)",
        diag and abs(d - prof) <= max(1, 0.02 * prof),
        f"{len(diag)} node-level steps: {d} kernels+memory ops per step vs torch.profiler {prof:.1f}; "
        f"{len(normal)} graph-level steps with "
        f"{statistics.median(i['graph_launches'] for i in normal) if normal else 0} graph launches each",
    )

# 2. iteration times vs CUDA events. The example records its CUDA events around the step's GPU
# work (before the batch's copy to the device, after the optimizer): compared with each step's
# GPU time from the shim's records (first activity start to last activity end, CLOCK_MONOTONIC).
# The host wall time between the step markers is reported too: it also holds host time outside
# the events (fetching the batch, waiting for the GIL between the marker and the event record).
for label, p in (("eager", pe), ("graphs", pg)):
    steps = load(f"{label}-steps.json")
    if not (p and steps):
        continue
    ev = {s["step"]: s["cuda_event_ms"] for s in steps}
    span, wall = [], []
    for i in p["iterations"]:
        if i["marked"] and i["step"] in ev and i["step"] >= 20:
            e = ev[i["step"]]
            span.append(abs(i["gpu_span_ns"] / 1e6 - e) / e * 100)
            wall.append((i["wall_ns"] / 1e6 - e) / e * 100)
    span.sort()
    wall.sort()
    if span:
        p95 = span[int(0.95 * (len(span) - 1))]
        med = lambda xs: statistics.median(xs)
        spans = [i["gpu_span_ns"] / 1e6 for i in p["iterations"] if i["marked"] and i["step"] in ev and i["step"] >= 20]
        evs = [ev[i["step"]] for i in p["iterations"] if i["marked"] and i["step"] in ev and i["step"] >= 20]
        dmed = abs(med(spans) - med(evs)) / med(evs) * 100
        check(
            f"{label} median iteration GPU time vs CUDA events",
            dmed <= 1.0,
            f"median {med(spans):.3f} ms (shim) vs {med(evs):.3f} ms (events): {dmed:.2f}%",
        )
        within = sum(1 for d in span if d <= 1.0)
        check(
            f"{label} iteration GPU time vs CUDA events, per step",
            span[-1] <= 1.0,
            f"{within}/{len(span)} steps within 1%: |difference| median {statistics.median(span):.4f}%, "
            f"p95 {p95:.4f}%, max {span[-1]:.4f}%; host wall between markers minus events: "
            f"median {statistics.median(wall):+.3f}%, p95 {wall[int(0.95 * (len(wall) - 1))]:+.3f}%",
        )
        results["figures"][f"{label}_iteration_gpu_diff_pct"] = {
            "median": statistics.median(span), "p95": p95, "max": span[-1], "n": len(span)}
        results[f"{label}_per_step"] = [
            {"step": i["step"], "wall_ms": i["wall_ns"] / 1e6, "gpu_span_ms": i["gpu_span_ns"] / 1e6,
             "cuda_event_ms": ev[i["step"]], "kernels": i["kernels"]}
            for i in p["iterations"] if i["marked"] and i["step"] in ev]
        results["figures"][f"{label}_iteration_wall_minus_events_pct"] = {
            "median": statistics.median(wall), "p95": wall[int(0.95 * (len(wall) - 1))]}

# 3. graph nodes -> operators
if pg:
    diag = [i for i in pg["iterations"] if i["marked"] and i["graph_launches"] == 0 and i["kernels"] > 0]
    ops = [o for i in diag for o in i["ops"]]
    named = [o for o in ops if not o["op"].startswith(("kernel#", "graph#"))]
    gpu_named = sum(o["gpu_ns"] for o in named)
    gpu_all = sum(o["gpu_ns"] for o in ops) or 1
    check(
        "graph nodes resolve to operators",
        diag and gpu_named / gpu_all >= 0.95 and pg["seen"]["graph_nodes"] > 0,
        f"{pg['seen']['graph_nodes']} graph-node records; in node-level steps "
        f"{100 * gpu_named / gpu_all:.1f}% of kernel time has an operator; top: "
        + ", ".join(f"{o['op']}" for o in sorted(named, key=lambda o: -o["gpu_ns"])[:6]),
    )

# 4. overhead
for mode in ("eager", "graphs"):
    base = R.get(f"base-{mode}", {}).get("median_ms")
    shim = R.get(f"shim-{mode}", {}).get("median_ms")
    prof = R.get(f"prof-{mode}", {}).get("median_ms")
    if base and shim:
        ov = (shim - base) / base * 100
        pov = (prof - base) / base * 100 if prof else None
        check(
            f"{mode} overhead of the always-on shim",
            ov <= 1.0,
            f"median step {base:.3f} ms without, {shim:.3f} ms with the shim ({ov:+.2f}%), "
            + (f"{prof:.3f} ms with torch.profiler ({pov:+.2f}%)" if prof else "profiler run missing"),
        )
        results["figures"][f"{mode}_overhead_pct"] = {
            "base_ms": base, "shim_ms": shim, "profiler_ms": prof, "shim_pct": ov, "profiler_pct": pov}

# 5. hand-over to torch.profiler and the lost race
h = R.get("handover")
if h:
    check(
        "CUPTI handed to torch.profiler and taken back",
        (h.get("handover_profiler_cuda_events") or 0) > 0 and (h.get("shim") or {}).get("tracing"),
        f"profiler saw {h.get('handover_profiler_cuda_events')} CUDA events inside "
        f"slo_probe.cupti_released(); shim status after: {h.get('shim')}",
    )
race = os.path.join(OUT, "race.txt")
if os.path.exists(race):
    text = open(race).read()
    check(
        "clear message when the shim loses the CUPTI race",
        "CUPTI already has a subscriber" in text and "'lost_race': True" in text,
        " | ".join(l for l in text.splitlines() if "slo-probe shim" in l or "status" in l)[:600],
    )

lines += ["", "```", json.dumps(results["figures"], indent=1), "```"]
with open(os.path.join(OUT, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
with open(os.path.join(OUT, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
print("\n".join(lines))
sys.exit(0 if ok_all else 1)
