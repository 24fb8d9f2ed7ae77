#!/usr/bin/env python3
"""The real-fault suite's table (issue 12): the answers job.py wrote against what slo-probe's
replay of each fixture found.

Input: the fixture folders pack.py made (a folder holding them, or the faults-<part>.tar.gz
itself), each with answer.json, and the lead's replay output of its recording, as written by
``slo-probe replay --json FILE <pid>.bin`` (a list of processes: ``slo`` -> ``violations`` with
``opened_ns``, ``causes[]`` with ``op``/``dimension``/``delta_ns``, ``host_causes[]``; and
``iterations``). Replay files are found as, for fixture NAME:

  NAME/replay.json, NAME/replay-detect.json (or replay.detect.json)     inside the fixture, or
  DIR/NAME.json, DIR/NAME.detect.json (or NAME-detect.json)            with --replay-dir DIR

``detect`` is the replay with step markers ignored (``slo-probe replay --detect``).

For each fault fixture and replay: detected (a violation opened from the onset to 6 s after the
end), the delay from the fault's own CLOCK_MONOTONIC onset to the first such violation, the top
cause of the first violation with an attribution against the expected operator, dimension and
host cause (``expect``; an expected null is not judged; ``accept`` lists alternatives, counted
separately; an expected operator X also matches "X: memcpy HtoD" style memory labels, and * is a
wildcard), and the sum check (the causes' deltas against the change of the mean iteration time,
fault vs before the onset, within +-25%). For healthy fixtures: violations (there should be
none). For every replay: iterations against the true step count (within 1%) and the largest
GPU utilisation of an iteration (at most 100%). A fault whose measured effect on the host step
time (``effect.ratio`` in the answer) is below 1.10 is flagged ``no effect`` and left out of the
top-1 bar.

  python3 scripts/faults/summary.py faults-A.tar.gz faults-B.tar.gz --replay-dir replays/ \\
      --json summary.json > summary.md
  python3 scripts/faults/summary.py --self-test

Missing fields and files are reported, never fatal. Only the Python standard library.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import math
import os
import re
import statistics
import sys
import tarfile
import tempfile
from typing import Any, Dict, List, Optional, Tuple

AFTER_END_NS = 6_000_000_000
MIN_EFFECT = 1.10
HOST_PATTERNS = [
    (r"^main threads", "host.runqueue.main"),
    (r"^data_loader threads", "host.runqueue.data_loader"),
    (r"^communication threads", "host.runqueue.communication"),
    (r"^pin_memory threads", "host.runqueue.pin_memory"),
    (r"^other threads", "host.runqueue.other"),
    (r"throttled", "host.throttling"),
    (r"retransmit", "host.retransmits"),
    (r"SM clock", "gpu.sm_clock"),
]


def host_node(h: Any) -> Optional[str]:
    """A host cause's node, from an object with "node" or from its words."""
    if isinstance(h, dict):
        if h.get("node"):
            return str(h["node"])
        h = h.get("what", "")
    if not isinstance(h, str):
        return None
    for pat, node in HOST_PATTERNS:
        if re.search(pat, h):
            return node
    return h or None


def op_matches(expected: Optional[str], actual: Optional[str]) -> bool:
    if expected is None:
        return True
    if actual is None:
        return False
    if "*" in expected:
        return fnmatch.fnmatchcase(actual, expected)
    return actual == expected or actual.startswith(expected + ": ")


def judge(expect: Dict[str, Any], top: Optional[Dict[str, Any]], host: Optional[str]) -> Dict[str, Optional[bool]]:
    """Per field: True/False, or None when the expectation does not judge it."""
    e_op, e_dim, e_host = expect.get("op"), expect.get("dimension"), expect.get("host_cause")
    a_op = top.get("op") if top else None
    a_dim = top.get("dimension") if top else None
    return {
        "op": None if e_op is None else op_matches(e_op, a_op),
        "dimension": None if e_dim is None else (a_dim == e_dim),
        "host_cause": None if e_host is None else (host == e_host),
    }


def all_true(j: Dict[str, Optional[bool]]) -> bool:
    return all(v is not False for v in j.values())


def load_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return {"_error": f"{path}: {e}"}


def pick_process(replay: Any, pid: Optional[int]) -> Optional[Dict[str, Any]]:
    procs = replay if isinstance(replay, list) else (replay.get("gpu") or replay.get("processes") or [replay]) if isinstance(replay, dict) else []
    procs = [p for p in procs if isinstance(p, dict)]
    for p in procs:
        if pid is not None and p.get("pid") == pid:
            return p
    return procs[0] if procs else None


def mean(xs: List[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def evaluate(ans: Dict[str, Any], proc: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """One fixture's answer against one replayed process."""
    r: Dict[str, Any] = {"problems": []}
    if proc is None:
        r["problems"].append("no replay")
        return r
    fx = ans.get("fixture") or {}
    onset, end = ans.get("onset_ns"), ans.get("end_ns")
    lo = fx.get("from_ns", onset)
    iters = [i for i in (proc.get("iterations") or []) if isinstance(i, dict)]
    r["iterations"] = len(iters)
    true = fx.get("true_steps")
    if true:
        r["true_steps"] = true
        r["iteration_error_pct"] = round(100.0 * (len(iters) - true) / true, 2)
    # Busy time over the iteration's period on the GPU timeline (gpu_period_ns; the host's wall
    # between markers is shorter than the GPU's when the CPU runs ahead), traced ones only.
    utils = [i["gpu_busy_ns"] / (i.get("gpu_period_ns") or i.get("step_ns") or i["wall_ns"]) for i in iters
             if i.get("gpu_busy_ns") is not None and (i.get("step_ns") or i.get("wall_ns"))
             and i.get("traced", True)]
    if utils:
        r["max_util_pct"] = round(100.0 * max(utils), 1)
        r["iterations_over_100pct"] = sum(1 for u in utils if u > 1.0)
    slo = proc.get("slo") or {}
    viols = [v for v in (slo.get("violations") or []) if isinstance(v, dict)]
    r["violations_total"] = len(viols)
    heal = proc.get("healer")
    r["shadow_actions"] = heal.get("actions") if isinstance(heal, dict) else None
    if ans.get("kind") == "healthy":
        r["violations"] = [{"node": v.get("node"), "opened_ns": v.get("opened_ns"), "chain": v.get("chain")} for v in viols]
        return r
    if onset is None or end is None:
        r["problems"].append("answer has no onset/end")
        return r
    hi = end + AFTER_END_NS
    inwin = sorted([v for v in viols if isinstance(v.get("opened_ns"), int) and onset <= v["opened_ns"] <= hi], key=lambda v: v["opened_ns"])
    early = [v for v in viols if isinstance(v.get("opened_ns"), int) and v["opened_ns"] < onset]
    r["early_violations"] = len(early)
    r["detected"] = bool(inwin)
    if inwin:
        r["delay_s"] = round((inwin[0]["opened_ns"] - onset) / 1e9, 2)
        r["first_node"] = inwin[0].get("node")
    attributed = next((v for v in inwin if v.get("causes")), None)
    if attributed is not None:
        causes = [c for c in attributed.get("causes") or [] if isinstance(c, dict)]
        top = causes[0] if causes else None
        hosts = attributed.get("host_causes") or []
        host = host_node(hosts[0]) if hosts else None
        r["node"] = attributed.get("node")
        r["top"] = {"op": top.get("op"), "dimension": top.get("dimension"), "delta_ms": round((top.get("delta_ns") or 0) / 1e6, 3)} if top else None
        r["host_cause"] = host
        r["chain"] = attributed.get("chain")
        if isinstance(attributed.get("attributed_ns"), int):
            # When its attribution first named a cause (replays from 2026-12-06 on).
            r["attributed_s"] = round((attributed["attributed_ns"] - onset) / 1e9, 2)
        r["judged"] = judge(ans.get("expect") or {}, top, host)
        r["top1"] = all_true(r["judged"])
        r["top1_accept"] = r["top1"] or any(all_true(judge(alt, top, host)) for alt in ans.get("accept") or [])
        total = sum(c.get("delta_ns") or 0 for c in causes)
        # The step's period (start to the next start, `step_ns`), as the engine and the answer's
        # effect measure it: a marked step's wall time leaves out what runs between the end marker
        # and the next begin (B-03: the pageable batch copy, +15 ms a step of which 2.5 ms showed).
        def period(i):
            return i.get("step_ns") or i.get("wall_ns")
        base = [period(i) for i in iters if period(i) and lo <= (i.get("start_ns") or 0) < onset]
        during = [period(i) for i in iters if period(i) and onset + 1_000_000_000 <= (i.get("start_ns") or 0) < end]
        mb, md = mean(base), mean(during)
        if mb and md:
            change = md - mb
            r["iteration_change_ms"] = round(change / 1e6, 3)
            r["causes_sum_ms"] = round(total / 1e6, 3)
            if change > 0:
                r["sum_ratio"] = round(total / change, 3)
                r["sum_ok"] = 0.75 <= total / change <= 1.25
        # The same sum against the change over the windows the causes were measured over (the
        # engine's `compared`: healthy windows, and the latest breaching ones): a fault whose effect
        # varies (contention in bursts, throttling periods) is attributed on the windows that
        # breached, not on the fault's average.
        cmp_ = attributed.get("compared") or {}
        it = cmp_.get("iteration_ns") or []
        if len(it) == 2 and it[1] - it[0] > 0:
            r["window_sum_ratio"] = round(total / (it[1] - it[0]), 3)
            r["window_sum_ok"] = 0.75 <= total / (it[1] - it[0]) <= 1.25
    elif inwin:
        r["problems"].append("violations without attribution")
    return r


def find_replays(name: str, fdir: str, replay_dir: Optional[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    cands = {
        "markers": [os.path.join(fdir, "replay.json")],
        "detect": [os.path.join(fdir, "replay-detect.json"), os.path.join(fdir, "replay.detect.json")],
    }
    if replay_dir:
        cands["markers"].append(os.path.join(replay_dir, f"{name}.json"))
        cands["detect"] += [os.path.join(replay_dir, f"{name}.detect.json"), os.path.join(replay_dir, f"{name}-detect.json")]
    for k, paths in cands.items():
        for p in paths:
            if os.path.exists(p):
                out[k] = p
                break
    return out


def collect(roots: List[str], replay_dir: Optional[str], tmp: str) -> List[Dict[str, Any]]:
    dirs: List[str] = []
    for root in roots:
        if os.path.isfile(root) and root.endswith((".tar.gz", ".tgz")):
            dest = os.path.join(tmp, os.path.basename(root).replace(".", "_"))
            os.makedirs(dest, exist_ok=True)
            with tarfile.open(root) as t:
                t.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(dest)
            root = dest
        for path in glob.glob(os.path.join(root, "**", "answer.json"), recursive=True):
            dirs.append(os.path.dirname(path))
    rows = []
    for d in sorted(set(dirs)):
        ans = load_json(os.path.join(d, "answer.json"))
        if not isinstance(ans, dict) or "_error" in ans:
            rows.append({"name": os.path.basename(d), "answer": {}, "problems": [str(ans)]})
            continue
        name = (ans.get("fixture") or {}).get("name") or os.path.basename(d)
        row: Dict[str, Any] = {"name": name, "answer": ans, "results": {}, "problems": []}
        if (ans.get("fixture") or {}).get("dropped"):
            row["problems"].append("dropped: " + str(ans["fixture"]["dropped"]))
        markers_only = (ans.get("fixture") or {}).get("markers_only")
        for variant, path in find_replays(name, d, replay_dir).items():
            if variant == "detect" and markers_only:
                # Stands only for a job that marks its steps (renumber.py --markers-only).
                row.setdefault("skipped", []).append("detect")
                continue
            if variant == "markers" and ans.get("markers") == "none":
                # The job marked no steps (job.py --markers none): it stands only for a job
                # without markers, and its replay with markers would be a second one of those.
                row.setdefault("skipped", []).append("markers")
                continue
            rep = load_json(path)
            if isinstance(rep, dict) and "_error" in rep:
                row["problems"].append(rep["_error"])
                continue
            row["results"][variant] = evaluate(ans, pick_process(rep, ans.get("pid")))
        if not row["results"]:
            row["problems"].append("no replay JSON found")
        rows.append(row)
    return rows


def frac(n: int, d: int) -> str:
    return f"{n}/{d}" if d else "-"


def table(rows: List[Dict[str, Any]], variant: str) -> Tuple[List[str], Dict[str, Any]]:
    groups: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for r in rows:
        a = r["answer"]
        if a.get("kind") in (None, "healthy") or variant not in r["results"]:
            continue
        groups.setdefault((a["kind"], a.get("mode", "?")), []).append(r)
    lines = [f"| fault | mode | n | detected | top-1 | top-1 (accept) | dimension | host cause | delay s (median) | sum ±25% | no effect |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    bars = {"top1": [0, 0], "detected": [0, 0], "delay_ok": [0, 0], "delay_ok_effective": [0, 0], "sum_ok": [0, 0],
            "sum_ok_effective": [0, 0], "window_sum_ok": [0, 0], "window_sum_ok_effective": [0, 0],
            "attributed_10s": [0, 0]}
    for (kind, mode), rs in sorted(groups.items()):
        res = [x["results"][variant] for x in rs]
        effective = [(x, y) for x, y in zip(rs, res) if not no_effect(x["answer"])]
        n = len(res)
        det = sum(1 for y in res if y.get("detected"))
        t1 = sum(1 for _, y in effective if y.get("top1"))
        t1a = sum(1 for _, y in effective if y.get("top1_accept"))
        dims = [y["judged"]["dimension"] for y in res if y.get("judged") and y["judged"]["dimension"] is not None]
        hosts = [y["judged"]["host_cause"] for y in res if y.get("judged") and y["judged"]["host_cause"] is not None]
        delays = [y["delay_s"] for y in res if y.get("delay_s") is not None]
        sums = [y["sum_ok"] for y in res if "sum_ok" in y]
        ne = n - len(effective)
        lines.append(f"| {kind} | {mode} | {n} | {frac(det, n)} | {frac(t1, len(effective))} | {frac(t1a, len(effective))} | "
                     f"{frac(sum(dims), len(dims))} | {frac(sum(hosts), len(hosts))} | "
                     f"{statistics.median(delays) if delays else '-'} | {frac(sum(sums), len(sums))} | {ne or ''} |")
        bars["top1"][0] += t1
        bars["top1"][1] += len(effective)
        bars["detected"][0] += sum(1 for _, y in effective if y.get("detected"))
        bars["detected"][1] += len(effective)
        # Attribution (a cause named) within 10 s of the onset, of the faults with an effect (issue 13).
        bars["attributed_10s"][0] += sum(1 for _, y in effective if (y.get("attributed_s") is not None and y["attributed_s"] <= 10.0))
        bars["attributed_10s"][1] += len(effective)
        # Delay and sums over every fault, and over those with an effect.
        for suffix, ys in (("", res), ("_effective", [y for _, y in effective])):
            for bar, oks in (("delay_ok", [y["delay_s"] <= 5.0 for y in ys if y.get("delay_s") is not None]),
                             ("sum_ok", [y["sum_ok"] for y in ys if "sum_ok" in y]),
                             ("window_sum_ok", [y["window_sum_ok"] for y in ys if "window_sum_ok" in y])):
                bars[bar + suffix][0] += sum(oks)
                bars[bar + suffix][1] += len(oks)
    return lines, bars


def no_effect(ans: Dict[str, Any]) -> bool:
    ratio = (ans.get("effect") or {}).get("ratio")
    return ratio is not None and ratio < MIN_EFFECT


def report(rows: List[Dict[str, Any]]) -> Tuple[str, Dict[str, Any]]:
    out: List[str] = ["# Real-fault suite", ""]
    summary: Dict[str, Any] = {"fixtures": len(rows), "variants": {}}
    for variant, title in (("markers", "with step markers"), ("detect", "without step markers (iterations detected)")):
        left_out = [r["name"] for r in rows if variant in r.get("skipped", [])]
        why = ("that stand only for jobs with step markers (their answers' fixture.markers_only)"
               if variant == "detect" else "of jobs that marked no steps (their answers' markers: none)")
        if not any(variant in r["results"] for r in rows):
            if left_out:
                out += [f"Left out ({title}): all {len(left_out)} fixtures, {why}", ""]
            continue
        lines, bars = table(rows, variant)
        out += [f"## Faults, {title}", ""] + lines + [""]
        healthy = [r for r in rows if r["answer"].get("kind") == "healthy" and variant in r["results"]]
        hv = [(r["name"], r["results"][variant].get("violations_total", 0)) for r in healthy]
        # Healthy runs whose steps kept their pace (the job's own step times: under 1.10x before): a
        # "healthy" segment that slowed by itself (B-12: +13% by its own step times, its loaders' run-queue wait x3) is
        # a slowdown the agent should report.
        paced = [(r["name"], r["results"][variant].get("violations_total", 0)) for r in healthy
                 if ((r["answer"].get("effect") or {}).get("ratio") or 1.0) < 1.10]
        sh = [(r["name"], r["results"][variant].get("shadow_actions")) for r in healthy]
        sh = [(n, a) for n, a in sh if a is not None]
        iters = [r["results"][variant] for r in rows if variant in r["results"] and "iteration_error_pct" in r["results"][variant]]
        it_ok = sum(1 for y in iters if abs(y["iteration_error_pct"]) <= 1.0)
        util = [y.get("max_util_pct") for r in rows if variant in r["results"] for y in [r["results"][variant]] if y.get("max_util_pct") is not None]
        b = {
            "top1": bars["top1"], "detected": bars["detected"], "attributed_le_10s": bars["attributed_10s"], "delay_le_5s": bars["delay_ok"], "delay_le_5s_with_effect": bars["delay_ok_effective"], "sum_within_25pct": bars["sum_ok"],
            "sum_within_25pct_with_effect": bars["sum_ok_effective"],
            "window_sum_within_25pct": bars["window_sum_ok"], "window_sum_within_25pct_with_effect": bars["window_sum_ok_effective"],
            "healthy_without_violations": [sum(1 for _, v in hv if v == 0), len(hv)],
            "paced_healthy_without_violations": [sum(1 for _, v in paced if v == 0), len(paced)],
            "healthy_without_shadow_actions": [sum(1 for _, a in sh if a == 0), len(sh)],
            "iterations_within_1pct": [it_ok, len(iters)],
            "max_util_pct": max(util) if util else None,
        }
        summary["variants"][variant] = b
        # Rounded down to 0.1%, so that a share under a bar never prints as the bar (35/39: 89.7%).
        pct = lambda x: f"{math.floor(1000 * x[0] / x[1]) / 10:.1f}% ({x[0]}/{x[1]})" if x[1] else "-"  # noqa: E731
        out += [f"Bars ({title}): top-1 {pct(b['top1'])} (bar 90%); detected {pct(b['detected'])}; detection <= 5 s {pct(b['delay_le_5s'])} (of faults with an effect {pct(b['delay_le_5s_with_effect'])}); attributed <= 10 s after the onset {pct(b['attributed_le_10s'])} (faults with an effect); "
                f"sums within ±25% {pct(b['sum_within_25pct'])} (of faults with an effect {pct(b['sum_within_25pct_with_effect'])}; against the change over the windows attributed {pct(b['window_sum_within_25pct'])}, with an effect {pct(b['window_sum_within_25pct_with_effect'])}); healthy fixtures without a violation {pct(b['healthy_without_violations'])} (bar 100%; "
                f"of those whose steps kept their pace {pct(b['paced_healthy_without_violations'])}); "
                f"healthy fixtures on which the shadow healer took no action {pct(b['healthy_without_shadow_actions'])} (bar 100%); "
                f"iterations within 1% of the true steps {pct(b['iterations_within_1pct'])}; largest iteration utilisation {b['max_util_pct']}% (bar 100%)", ""]
        if left_out:
            out += [f"Left out ({title}): {len(left_out)} fixtures {why}: {', '.join(left_out)}", ""]
        if hv:
            acts = dict(sh)
            out += [f"Healthy ({title}): " + ", ".join(
                f"{n}: {v} violation(s)" + (f", {acts[n]} shadow action(s)" if n in acts else "") for n, v in hv), ""]
    out += ["## Per fixture", "", "| fixture | kind | mode | effect | replay | detected | delay s (attributed) | top cause | host cause | judged | sum ratio (its windows) | iterations (true) | max util % |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["answer"]
        eff = (a.get("effect") or {}).get("ratio")
        if not r.get("results"):
            out.append(f"| {r['name']} | {a.get('kind')} | {a.get('mode')} | {eff} | - | - | - | - | - | {'; '.join(r['problems'])} | - | - | - |")
            continue
        for variant, y in sorted(r["results"].items()):
            top = y.get("top") or {}
            j = y.get("judged") or {}
            jt = " ".join(f"{k}:{'ok' if v else 'WRONG'}" for k, v in j.items() if v is not None)
            out.append(f"| {r['name']} | {a.get('kind')} | {a.get('mode')} | {eff} | {variant} | {y.get('detected', '-') if a.get('kind') != 'healthy' else str(y.get('violations_total')) + ' viol.'} | "
                       f"{y.get('delay_s', '-')} ({y.get('attributed_s', '-')}) | {top.get('op', '-')} ({top.get('dimension', '-')}, {top.get('delta_ms', '-')} ms) | {y.get('host_cause', '-')} | "
                       f"{jt or '-'}{' ' + '; '.join(y['problems'] + r['problems']) if y.get('problems') or r['problems'] else ''} | {y.get('sum_ratio', '-')} ({y.get('window_sum_ratio', '-')}) | "
                       f"{y.get('iterations', '-')} ({y.get('true_steps', '-')}) | {y.get('max_util_pct', '-')} |")
    summary["rows"] = [{"name": r["name"], "kind": r["answer"].get("kind"), "mode": r["answer"].get("mode"), "model": r["answer"].get("model"),
                        "expect": r["answer"].get("expect"), "effect": r["answer"].get("effect"), "results": r.get("results"), "problems": r["problems"]} for r in rows]
    return "\n".join(out) + "\n", summary


# ---------------------------------------------------------------------------------------------
# Self-test: synthetic answers and replays


def _self_test() -> int:
    S = 1_000_000_000
    onset, end = 100 * S, 106 * S
    iters = [{"start_ns": t * S // 10, "wall_ns": (20 if t < 1000 or t > 1060 else 25) * 1_000_000, "gpu_busy_ns": 18_000_000, "marked": True}
             for t in range(880, 1120)]
    ans = {"kind": "extra_kernel", "mode": "eager", "model": "gpt", "pid": 7, "onset_ns": onset, "end_ns": end,
           "expect": {"op": "blocks.2.attn.extra", "dimension": "execution", "host_cause": None}, "accept": [],
           "effect": {"ratio": 1.25}, "fixture": {"name": "T-01", "from_ns": onset - 12 * S, "to_ns": end + 6 * S, "true_steps": 240}}
    viol = {"node": "iteration", "opened_ns": onset + 2 * S, "causes": [
        {"op": "blocks.2.attn.extra", "dimension": "execution", "delta_ns": 4.8e6},
        {"op": "(data loading)", "dimension": "data_loading", "delta_ns": 0.1e6}],
        "host_causes": ["main threads waited 1.2 ms per iteration for a CPU (run queue; was 10 µs)"],
        "compared": {"iteration_ns": [20e6, 26e6], "iterations": [50, 10], "traced": [50, 10]}}
    rep = [{"pid": 7, "iterations": iters, "slo": {"violations": [viol]}}]
    y = evaluate(ans, pick_process(rep, 7))
    checks = [
        (y.get("detected") is True, "detected"),
        (y.get("delay_s") == 2.0, f"delay {y.get('delay_s')}"),
        (y.get("top1") is True, f"top1 {y.get('judged')}"),
        (y.get("sum_ok") is True, f"sum {y.get('sum_ratio')}"),
        (y.get("window_sum_ratio") == 0.817 and y.get("window_sum_ok") is True, f"window sum {y.get('window_sum_ratio')}"),
        (y.get("iteration_error_pct") == 0.0, f"iterations {y.get('iteration_error_pct')}"),
        (host_node(viol["host_causes"][0]) == "host.runqueue.main", "host mapping"),
        (host_node({"node": "host.throttling"}) == "host.throttling", "host node field"),
        (op_matches("data_to_device: memcpy HtoD", "data_to_device: memcpy HtoD") and op_matches("graph#*", "graph#3")
         and op_matches("data_to_device", "data_to_device: memcpy HtoD") and not op_matches("blocks.1", "blocks.1.mlp"), "op matching"),
    ]
    wrong = dict(ans, expect={"op": "blocks.1.mlp", "dimension": "execution", "host_cause": None},
                 accept=[{"op": "blocks.2.attn.extra", "dimension": "execution", "host_cause": None}])
    y2 = evaluate(wrong, pick_process(rep, 7))
    checks.append((y2.get("top1") is False and y2.get("top1_accept") is True, "accept list"))
    healthy = dict(ans, kind="healthy", expect={"op": None, "dimension": None, "host_cause": None})
    y3 = evaluate(healthy, pick_process([{"pid": 7, "iterations": iters, "slo": {"violations": []}}], 7))
    checks.append((y3.get("violations_total") == 0, "healthy"))
    y4 = evaluate(ans, {"pid": 7})
    checks.append((y4.get("detected") is False and y4["violations_total"] == 0, "missing fields"))
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "fx", "T-01")
        os.makedirs(d)
        json.dump(ans, open(os.path.join(d, "answer.json"), "w"))
        json.dump(rep, open(os.path.join(d, "replay.json"), "w"))
        rows = collect([os.path.join(tmp, "fx")], None, tmp)
        text, summ = report(rows)
        checks.append(("| extra_kernel | eager | 1 | 1/1 | 1/1 |" in text, "table row"))
        checks.append((summ["variants"]["markers"]["top1"] == [1, 1], "bars"))
        # A job that marked no steps counts only without markers.
        json.dump(dict(ans, markers="none"), open(os.path.join(d, "answer.json"), "w"))
        json.dump(rep, open(os.path.join(d, "replay-detect.json"), "w"))
        text, summ = report(collect([os.path.join(tmp, "fx")], None, tmp))
        checks.append(("markers" not in summ["variants"] and summ["variants"]["detect"]["top1"] == [1, 1]
                       and "of jobs that marked no steps" in text, "markers: none"))
    bad = [why for ok, why in checks if not ok]
    for why in bad:
        print(f"self-test FAILED: {why}", file=sys.stderr)
    print(f"summary.py self-test: {len(checks) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("roots", nargs="*", help="fixture folders or faults-<part>.tar.gz")
    p.add_argument("--replay-dir", default=None)
    p.add_argument("--json", default=None, help="write the summary as JSON here")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args(argv)
    if a.self_test:
        return _self_test()
    if not a.roots:
        p.error("give fixture folders or archives (or --self-test)")
    with tempfile.TemporaryDirectory() as tmp:
        rows = collect(a.roots, a.replay_dir, tmp)
        text, summ = report(rows)
    sys.stdout.write(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summ, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
