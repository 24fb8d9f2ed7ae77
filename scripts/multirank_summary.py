#!/usr/bin/env python3
"""Summarises the agent's /metrics scrapes of a multi-rank run (scripts/gpu-multirank-check).

Each file in DIR is one scrape, named by the second it was taken (0002.prom, 0004.prom, ...).
Prints a markdown report: per rank, before the fault and at the end, iteration time P50,
communication P50/P99 and jitter (P99 - P50), comm/compute overlap, host delay (ms/s), the
agent's straggler scores; when the agent first named the faulty rank the straggler and with what
cause; what each rank's SLO tree says (states, top attribution); the GPU topology families.
Exits 1 when the faulty rank was never named, or another rank was named after the fault.
"""

import argparse
import json
import os
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            m = SAMPLE.match(line.strip())
            if not m:
                continue
            labels = dict(LABEL.findall(m.group(2) or ""))
            try:
                value = float(m.group(3))
            except ValueError:
                continue
            out.append((m.group(1), labels, value))
    return out


def pick(samples, name, **want):
    return [(l, v) for n, l, v in samples if n == name and all(l.get(k) == w for k, w in want.items())]


def one(samples, name, **want):
    got = pick(samples, name, **want)
    return got[0][1] if got else None


def per_rank(samples):
    ranks = sorted({l["rank"] for n, l, v in samples if n == "slo_probe_iterations_total" and l.get("rank")}, key=int)
    rows = {}
    for r in ranks:
        q = lambda name, **k: one(samples, name, rank=r, **k)
        comm50 = q("slo_probe_iteration_phase_seconds", phase="communication", quantile="0.5")
        comm99 = q("slo_probe_iteration_phase_seconds", phase="communication", quantile="0.99")
        overlap = q("slo_probe_iteration_phase_seconds", phase="comm_overlap", quantile="0.5")
        host = sum(v for l, v in pick(samples, "slo_probe_slo_value", rank=r)
                   if l.get("node", "").startswith("host.runqueue.") or l.get("node") == "host.throttling")
        states = {l["node"]: l["state"] for l, v in pick(samples, "slo_probe_slo_state", rank=r) if v == 1}
        top = [(l["node"], l["op"], l["dimension"], v) for l, v in
               pick(samples, "slo_probe_attribution_seconds", rank=r, cause_rank="1")]
        rows[r] = {
            "iterations": q("slo_probe_iterations_total"),
            "iteration_p50_s": q("slo_probe_iteration_duration_seconds", quantile="0.5"),
            "iteration_p99_s": q("slo_probe_iteration_duration_seconds", quantile="0.99"),
            "comm_p50_s": comm50,
            "comm_p99_s": comm99,
            "comm_jitter_s": None if comm50 is None or comm99 is None else comm99 - comm50,
            "comm_overlap_p50_s": overlap,
            "host_wait_p50_s": q("slo_probe_iteration_phase_seconds", phase="host_wait", quantile="0.5"),
            "host_delay_ms_per_s": host,
            "score_noncomm": q("slo_probe_straggler_score", signal="noncomm"),
            "score_host_delay": q("slo_probe_straggler_score", signal="host_delay"),
            "straggler_cause": next((l["cause"] for l, v in pick(samples, "slo_probe_straggler", rank=r)), None),
            "slo_not_ok": {n: s for n, s in states.items() if s not in ("ok", "unknown")},
            "top_attribution": top,
        }
    return rows


def fmt(v, scale=1.0, unit=""):
    return "-" if v is None else f"{v * scale:.2f}{unit}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--fault-at", type=int, required=True, help="second the fault started")
    ap.add_argument("--faulty-rank", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    files = sorted((f for f in os.listdir(a.dir) if f.endswith(".prom")), key=lambda f: int(f.split(".")[0]))
    scrapes = [(int(f.split(".")[0]), parse(os.path.join(a.dir, f))) for f in files]
    if not scrapes:
        print("no scrapes", file=sys.stderr)
        return 1
    before = [s for t, s in scrapes if t <= a.fault_at]
    healthy = per_rank(before[-1]) if before else {}
    end = per_rank(scrapes[-1][1])
    named = None
    wrong = []
    for t, s in scrapes:
        for l, v in pick(s, "slo_probe_straggler"):
            if t <= a.fault_at:
                continue
            if l.get("rank") == a.faulty_rank and named is None:
                named = {"at_s": t, "after_fault_s": t - a.fault_at, "cause": l.get("cause")}
            elif l.get("rank") != a.faulty_rank:
                wrong.append({"at_s": t, "rank": l.get("rank"), "cause": l.get("cause")})
    topo = [(n, l, v) for n, l, v in scrapes[-1][1]
            if n.startswith(("slo_probe_gpu_numa", "slo_probe_gpu_cpu_affinity", "slo_probe_gpu_pcie_link",
                             "slo_probe_gpu_nvlink_active", "slo_probe_gpu_peer_path"))]
    print(f"# Multi-rank run: fault on rank {a.faulty_rank} from {a.fault_at} s, {len(scrapes)} scrapes\n")
    for title, rows in (("Before the fault", healthy), ("At the end (fault in force)", end)):
        print(f"## {title}\n")
        print("| rank | iterations | iteration P50 | comm P50 | comm P99 | jitter | overlap P50 | host wait P50 "
              "| host delay | score noncomm | score host | straggler |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r, x in rows.items():
            print(f"| {r} | {fmt(x['iterations'])} | {fmt(x['iteration_p50_s'], 1e3, ' ms')} "
                  f"| {fmt(x['comm_p50_s'], 1e3, ' ms')} | {fmt(x['comm_p99_s'], 1e3, ' ms')} "
                  f"| {fmt(x['comm_jitter_s'], 1e3, ' ms')} | {fmt(x['comm_overlap_p50_s'], 1e3, ' ms')} "
                  f"| {fmt(x['host_wait_p50_s'], 1e3, ' ms')} | {fmt(x['host_delay_ms_per_s'], 1, ' ms/s')} "
                  f"| {fmt(x['score_noncomm'])} | {fmt(x['score_host_delay'])} | {x['straggler_cause'] or ''} |")
        print()
        for r, x in rows.items():
            if x["slo_not_ok"] or x["top_attribution"]:
                print(f"- rank {r}: SLO nodes not ok {x['slo_not_ok']}; top attribution "
                      f"{[(n, op, d, round(v * 1e3, 2)) for n, op, d, v in x['top_attribution']]} (ms/iteration)")
        print()
    if named:
        print(f"The agent named rank {a.faulty_rank} the straggler {named['after_fault_s']} s after the fault, "
              f"cause `{named['cause']}`.")
    else:
        print(f"The agent never named rank {a.faulty_rank} the straggler.")
    if wrong:
        print(f"Other ranks named after the fault: {wrong[:5]}")
    print("\n## GPU topology (agent)\n")
    for n, l, v in topo:
        lab = ",".join(f"{k}={val}" for k, val in l.items() if k not in ("name",))
        print(f"- `{n}{{{lab}}}` {v:g}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"healthy": healthy, "end": end, "named": named, "wrong": wrong,
                       "topology": [[n, l, v] for n, l, v in topo]}, f, indent=1)
    return 0 if named and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
