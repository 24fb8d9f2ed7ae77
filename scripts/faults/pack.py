#!/usr/bin/env python3
"""Packs the real-fault suite's fixtures (scripts/gpu-faults runs this on the device, after the jobs).

For every answer job.py wrote (``answers.jsonl``), one fixture folder:

  <pid>.bin          the agent's recording of that process (``shim.record_dir``), trimmed to
                     (onset - 12 s) .. (end + 6 s) for a fault, onset .. end for a healthy segment
  <pid>.host.jsonl   the host-sample sidecar next to the recording, trimmed the same way (if any)
  answer.json        the answer plus ``fixture``: from_ns, to_ns, files, trimmed_by, true_steps
                     (the job's steps begun in the window), warmup_steps
  steps.json         those steps: [step, begin_ns, end_ns, warmup, host_wait_ns] (the last: the
                     main thread waiting for its batch and the loss read-back)

Trimming uses ``slo-probe recording trim IN OUT --from NS --to NS`` when ``slo-probe recording
--help`` works; otherwise this script's own cut (every string and graph-node record kept, timed
records -- kernels, graphs, memory, events, steps -- kept when their timestamp is in the window),
said so in ``fixture.trimmed_by``.

Everything goes into ``faults-<part>.tar.gz`` (and -2, -3 as the fixtures need, up to 3; ``--tars
N`` sets the number) of at most ``--max-mib`` each: when the fixtures do not fit, the largest
healthy fixtures are dropped first, then the largest fault fixtures, each listed in
``index.json`` with why (their answers stay). The first archive also holds answers.json (every
answer: done, skipped, failed), index.json and the job summaries.

  python3 scripts/faults/pack.py --part A --work /tmp/faults-work --rec /tmp/rec \\
      --bin target/release/slo-probe --out $OUT [--max-mib 15] [--tars 0]

Only the Python standard library.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import zlib
from typing import Any, Dict, List, Optional, Tuple

# Archives --tars 0 makes at most: scripts/gpu-faults writes five other files, and the device
# tool returns eight a call.
AUTO_TARS = 3

PAD_BEFORE_NS = 12_000_000_000
PAD_AFTER_NS = 6_000_000_000
# record kind -> offset of its CLOCK_MONOTONIC timestamp (common/src/gpu.rs)
TIMED = {0x0200: 8, 0x0201: 8, 0x0202: 8, 0x0205: 8, 0x0300: 16}


def log(msg: str) -> None:
    print(f"[pack {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_jsonl(path: str) -> List[Dict[str, Any]]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        log(f"{path}: bad line skipped ({e})")
    except OSError:
        pass
    return out


def window(ans: Dict[str, Any]) -> Tuple[int, int]:
    onset, end = int(ans["onset_ns"]), int(ans["end_ns"])
    if ans.get("kind") == "healthy":
        return onset, end
    end = max(end, int(ans.get("restored_ns") or 0))
    return onset - PAD_BEFORE_NS, end + PAD_AFTER_NS


def trim_tool(binary: str) -> bool:
    if not binary or not os.access(binary, os.X_OK):
        return False
    try:
        r = subprocess.run([binary, "recording", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=20)
        return r.returncode == 0 and "trim" in r.stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


def py_trim_many(src: str, cuts: List[Tuple[str, int, int]]) -> Dict[str, Dict[str, int]]:
    """One pass over a recording, writing each (dst, from, to) cut. Untimed records (strings,
    graph nodes, unknown kinds) go to every cut; a corrupt tail ends the pass."""
    stats = {dst: {"kept": 0, "timed_dropped": 0} for dst, _, _ in cuts}
    outs = {dst: open(dst, "wb") for dst, _, _ in cuts}
    try:
        with open(src, "rb") as f:
            data = f.read()
        pos, n_all = 0, len(data)
        while pos + 8 <= n_all:
            kind, _ver, length = struct.unpack_from("<HHI", data, pos)
            if length < 8 or pos + length > n_all:
                break
            rec = data[pos:pos + length]
            off = TIMED.get(kind)
            ts = struct.unpack_from("<Q", rec, off)[0] if off is not None and length >= off + 8 else None
            for dst, lo, hi in cuts:
                if ts is None or lo <= ts <= hi:
                    outs[dst].write(rec)
                    stats[dst]["kept"] += 1
                else:
                    stats[dst]["timed_dropped"] += 1
            pos += length
    finally:
        for f in outs.values():
            f.close()
    return stats


TS_KEYS = ("ts_ns", "t_ns", "at_ns", "time_ns", "start_ns", "ns", "end_ns")


def py_trim_jsonl(src: str, dst: str, lo: int, hi: int) -> int:
    kept = 0
    with open(src) as f, open(dst, "w") as g:
        for line in f:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            ts = None
            if isinstance(obj, dict):
                for k in TS_KEYS:
                    if isinstance(obj.get(k), int):
                        ts = obj[k]
                        break
            if ts is None or lo <= ts <= hi:
                g.write(line if line.endswith("\n") else line + "\n")
                kept += 1
    return kept


def gz_size(paths: List[str]) -> int:
    total = 0
    for p in paths:
        c = zlib.compressobj(6)
        n = 0
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                n += len(c.compress(b))
        n += len(c.flush())
        total += n + 512
    return total


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", required=True)
    p.add_argument("--work", required=True, help="folder with answers.jsonl, steps-*.jsonl, summary-*.json, skipped.jsonl")
    p.add_argument("--rec", default="/tmp/rec", help="the agent's shim.record_dir")
    p.add_argument("--bin", default="target/release/slo-probe")
    p.add_argument("--out", required=True)
    p.add_argument("--max-mib", type=float, default=15.0)
    p.add_argument("--tars", type=int, default=0,
                   help=f"archives at most (0, the default: as many as the fixtures need, up to {AUTO_TARS})")
    p.add_argument("--extra", action="append", default=[], help="more files for the first archive")
    a = p.parse_args(argv)

    answers = load_jsonl(os.path.join(a.work, "answers.jsonl"))
    answers += [dict(x, status=x.get("status", "skipped")) for x in load_jsonl(os.path.join(a.work, "skipped.jsonl"))]
    steps_by_pid: Dict[int, List[List[int]]] = {}
    for path in sorted(glob.glob(os.path.join(a.work, "steps-*.jsonl"))):
        for chunk in load_jsonl(path):
            steps_by_pid.setdefault(int(chunk.get("pid", 0)), []).extend(chunk.get("steps", []))
    use_tool = trim_tool(a.bin)
    log(f"{len(answers)} answers; trim with {'slo-probe recording trim' if use_tool else 'this script (slo-probe recording trim unavailable)'}")
    stage = os.path.join(a.work, f"stage-{a.part}")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)

    fixtures: List[Dict[str, Any]] = []
    py_cuts: Dict[str, List[Tuple[str, int, int, Dict[str, Any]]]] = {}
    n = 0
    for ans in answers:
        if ans.get("status") != "done" or ans.get("onset_ns") is None or not ans.get("pid"):
            continue
        n += 1
        pid = int(ans["pid"])
        name = f"{a.part}-{n:02d}-{ans.get('label', 'job')}-{ans['kind']}" + (f"-r{ans['rank']}" if ans.get("world", 1) > 1 else "")
        name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        d = os.path.join(stage, name)
        os.makedirs(d)
        lo, hi = window(ans)
        fx: Dict[str, Any] = {"from_ns": lo, "to_ns": hi, "files": [], "trimmed_by": None}
        rows = [s for s in steps_by_pid.get(pid, []) if lo <= s[1] <= hi]
        fx["true_steps"] = len(rows)
        fx["warmup_steps"] = sum(1 for s in rows if s[3])
        fx["true_steps_in_fault"] = sum(1 for s in rows if int(ans["onset_ns"]) <= s[1] < int(ans["end_ns"]))
        with open(os.path.join(d, "steps.json"), "w") as f:
            # host_wait_ns: the main thread's wait for its batch (and the loss's read-back every
            # --log-every steps), so that a loader-bound step can be told from a launch-bound one.
            json.dump({"fields": ["step", "begin_ns", "end_ns", "warmup", "host_wait_ns"],
                       "steps": [s[:4] + s[5:6] for s in rows]}, f)
        src = os.path.join(a.rec, f"{pid}.bin")
        side = os.path.join(a.rec, f"{pid}.host.jsonl")
        dst = os.path.join(d, f"{pid}.bin")
        if not os.path.exists(src):
            fx["missing"] = f"no recording {src} (the shim did not reach the agent?)"
            log(f"{name}: {fx['missing']}")
        elif use_tool:
            try:
                r = subprocess.run([a.bin, "recording", "trim", src, dst, "--from", str(lo), "--to", str(hi)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
                fx["trimmed_by"] = "slo-probe recording trim"
                fx["trim_output"] = r.stdout.strip()[-500:]
                if r.returncode != 0:
                    fx["trimmed_by"] = None
                    fx["trim_error"] = f"rc {r.returncode}"
                    log(f"{name}: trim failed rc {r.returncode}: {r.stdout.strip()[-300:]}")
            except (OSError, subprocess.TimeoutExpired) as e:
                fx["trim_error"] = str(e)
            if fx["trimmed_by"] is None:  # fall back to this script's cut
                py_cuts.setdefault(src, []).append((dst, lo, hi, fx))
        else:
            py_cuts.setdefault(src, []).append((dst, lo, hi, fx))
        if os.path.exists(side) and not os.path.exists(os.path.join(d, f"{pid}.host.jsonl")):
            fx["host_lines"] = py_trim_jsonl(side, os.path.join(d, f"{pid}.host.jsonl"), lo, hi)
        fixtures.append({"name": name, "dir": d, "answer": ans, "fixture": fx})

    for src, cuts in py_cuts.items():
        t0 = time.time()
        stats = py_trim_many(src, [(dst, lo, hi) for dst, lo, hi, _ in cuts])
        for dst, _lo, _hi, fx in cuts:
            fx["trimmed_by"] = "scripts/faults/pack.py (python cut: slo-probe recording trim unavailable)"
            fx["records"] = stats[dst]
        log(f"cut {src} ({os.path.getsize(src) / 2**20:.1f} MiB) into {len(cuts)} fixtures in {time.time() - t0:.1f} s")

    for fxr in fixtures:
        d, fx = fxr["dir"], fxr["fixture"]
        fx["files"] = sorted(f for f in os.listdir(d) if f not in ("answer.json",))
        fxr["raw_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for f in fx["files"])
        fxr["gz_bytes"] = gz_size([os.path.join(d, f) for f in fx["files"]])

    # fit: drop the largest healthy fixtures first, then the largest fault fixtures
    limit = int(a.max_mib * 2**20)
    meta_reserve = min(512 << 10, limit // 8)
    # --tars 0: as many archives as the fixtures need (10% slack for the packing), up to
    # AUTO_TARS; one archive dropped the healthy runs of a held recording (2026-12-07).
    total = sum(f["gz_bytes"] for f in fixtures)
    need = -(-total * 11 // (10 * (limit - meta_reserve)))
    tars = a.tars if a.tars > 0 else min(AUTO_TARS, max(1, need))
    budget = tars * (limit - meta_reserve)
    dropped: List[Dict[str, Any]] = []
    kept = list(fixtures)
    for healthy_first in (True, False):
        cands = sorted([f for f in kept if (f["answer"]["kind"] == "healthy") == healthy_first], key=lambda f: -f["gz_bytes"])
        for f in cands:
            if total <= budget:
                break
            kept.remove(f)
            total -= f["gz_bytes"]
            why = f"over the size limit ({tars} x {a.max_mib} MiB): {f['gz_bytes'] / 2**20:.2f} MiB compressed, the largest {'healthy' if healthy_first else 'fault'} fixture left"
            dropped.append({"name": f["name"], "reason": why})
            f["fixture"]["dropped"] = why
            log(f"DROPPED {f['name']}: {why}")
    # assign to archives: first fit, largest first
    bins: List[List[Dict[str, Any]]] = [[] for _ in range(tars)]
    sizes = [meta_reserve] + [0] * (tars - 1)
    for f in sorted(kept, key=lambda f: -f["gz_bytes"]):
        i = min(range(tars), key=lambda j: sizes[j])
        bins[i].append(f)
        sizes[i] += f["gz_bytes"]

    # answers.json and index.json
    all_answers = []
    for fxr in fixtures:
        ans = dict(fxr["answer"], fixture=dict(fxr["fixture"], name=fxr["name"], gz_bytes=fxr["gz_bytes"], raw_bytes=fxr["raw_bytes"]))
        all_answers.append(ans)
        with open(os.path.join(fxr["dir"], "answer.json"), "w") as f:
            json.dump(ans, f, indent=1, sort_keys=True)
    for ans in answers:
        if not (ans.get("status") == "done" and ans.get("onset_ns") is not None and ans.get("pid")):
            all_answers.append(ans)
    archive_of = {f["name"]: f"faults-{a.part}{'' if i == 0 else '-' + str(i + 1)}.tar.gz" for i, b in enumerate(bins) for f in b}
    index = {
        "part": a.part, "trimmed_with": "slo-probe recording trim" if use_tool else "scripts/faults/pack.py",
        "window": {"before_ns": PAD_BEFORE_NS, "after_ns": PAD_AFTER_NS},
        "fixtures": [{"name": f["name"], "kind": f["answer"]["kind"], "mode": f["answer"].get("mode"), "model": f["answer"].get("model"),
                      "pid": f["answer"].get("pid"), "rank": f["answer"].get("rank"), "gz_bytes": f["gz_bytes"], "raw_bytes": f["raw_bytes"],
                      "archive": archive_of.get(f["name"]), "dropped": f["fixture"].get("dropped")} for f in fixtures],
        "dropped": dropped,
        "not_run": [{"kind": x.get("kind"), "label": x.get("label"), "status": x.get("status"), "reason": x.get("reason")}
                    for x in answers if x.get("status") != "done"],
    }
    for path, obj in ((os.path.join(stage, "answers.json"), all_answers), (os.path.join(stage, "index.json"), index)):
        with open(path, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True, default=str)
    shutil.copy(os.path.join(stage, "answers.json"), os.path.join(a.out, f"answers-{a.part}.json"))

    extras = sorted(glob.glob(os.path.join(a.work, "summary-*.json"))) + [x for x in a.extra if os.path.exists(x)]
    root = f"faults-{a.part}"
    rc = 0
    for i, b in enumerate(bins):
        if i > 0 and not b:
            continue
        out = os.path.join(a.out, f"faults-{a.part}{'' if i == 0 else '-' + str(i + 1)}.tar.gz")
        while True:
            with tarfile.open(out, "w:gz", compresslevel=9) as tar:
                if i == 0:
                    tar.add(os.path.join(stage, "answers.json"), arcname=f"{root}/answers.json")
                    tar.add(os.path.join(stage, "index.json"), arcname=f"{root}/index.json")
                    for x in extras:
                        tar.add(x, arcname=f"{root}/jobs/{os.path.basename(x)}")
                for f in b:
                    tar.add(f["dir"], arcname=f"{root}/{f['name']}")
                # answers of dropped fixtures stay, without their recordings
                if i == 0:
                    for f in fixtures:
                        if f["fixture"].get("dropped"):
                            tar.add(os.path.join(f["dir"], "answer.json"), arcname=f"{root}/{f['name']}/answer.json")
            size = os.path.getsize(out)
            if size <= limit or not b:
                break
            big = max(b, key=lambda f: f["gz_bytes"])
            b.remove(big)
            why = f"archive {os.path.basename(out)} came to {size / 2**20:.2f} MiB (estimate too low): dropped its largest fixture"
            big["fixture"]["dropped"] = why
            dropped.append({"name": big["name"], "reason": why})
            log(f"DROPPED {big['name']}: {why}")
            with open(os.path.join(big["dir"], "answer.json"), "w") as f:
                json.dump(dict(big["answer"], fixture=big["fixture"]), f, indent=1, sort_keys=True)
            index["dropped"] = dropped
            with open(os.path.join(stage, "index.json"), "w") as f:
                json.dump(index, f, indent=1, sort_keys=True, default=str)
        log(f"{out}: {size / 2**20:.2f} MiB, {len(b)} fixtures")
    kinds: Dict[str, int] = {}
    for f in fixtures:
        if not f["fixture"].get("dropped") and not f["fixture"].get("missing"):
            kinds[f["answer"]["kind"]] = kinds.get(f["answer"]["kind"], 0) + 1
    log(f"fixtures kept by kind: {json.dumps(kinds, sort_keys=True)}; dropped {len(dropped)}; answers not run: {len(index['not_run'])}")
    for f in fixtures:
        log(f"  {f['name']}: {f['raw_bytes'] / 2**20:.2f} MiB raw, {f['gz_bytes'] / 2**20:.2f} MiB gz, true steps {f['fixture'].get('true_steps')}"
            + (f" DROPPED" if f["fixture"].get("dropped") else "") + (f" MISSING" if f["fixture"].get("missing") else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
