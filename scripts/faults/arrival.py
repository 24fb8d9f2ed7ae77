#!/usr/bin/env python3
"""How late the shim's GPU records reached the agent, read from recordings (issue 12).

A recording keeps records in the order the agent received them; step markers go into the ring
as they happen. So the newest step marker received before a GPU record is a clock of when it
arrived, and ``arrival lag = newest step before it - the record's end`` says how long after its
work ended the agent had it (a lower bound: markers come every step, tens of ms apart).

    scripts/faults/arrival.py tests/fixtures/faults/faults-A.tar.gz [more.tar.gz | dirs | .bin]

prints one line per recording: GPU records, the share received within 1 s and 5 s of their end,
the lag's median and 90th percentile, and the share received after the recording's last step
marker (at the job's exit, or after the fixture's cut).
"""
from __future__ import annotations

import glob
import io
import os
import struct
import sys
import tarfile
from typing import Iterator, List, Tuple

KERNEL, MEM, GRAPH, STEP = 0x0200, 0x0201, 0x0202, 0x0300


def records(data: bytes) -> Iterator[Tuple[int, bytes]]:
    pos = 0
    while pos + 8 <= len(data):
        kind, _ver, length = struct.unpack_from("<HHI", data, pos)
        if length < 8 or pos + length > len(data):
            return
        yield kind, data[pos:pos + length]
        pos += length


def lags(data: bytes) -> Tuple[List[float], int]:
    """Arrival lags (s) of the GPU records, and how many came after the last step marker."""
    newest = 0
    out: List[Tuple[int, int]] = []  # (index of the newest marker before it, end)
    marks: List[int] = []
    for kind, rec in records(data):
        if kind == STEP and len(rec) >= 24:
            ts = struct.unpack_from("<Q", rec, 16)[0]
            newest = max(newest, ts)
            marks.append(newest)
        elif kind in (KERNEL, MEM, GRAPH) and len(rec) >= 24:
            end = struct.unpack_from("<Q", rec, 16)[0]
            if end:
                out.append((len(marks), end))
    after_last = sum(1 for i, _ in out if i == len(marks))
    res = [(marks[i - 1] - end) / 1e9 for i, end in out if i > 0]
    return res, after_last


def pct(v: List[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def report(name: str, data: bytes) -> None:
    v, late = lags(data)
    n = len(v)
    if n == 0:
        print(f"{name}: no GPU records")
        return
    within = lambda s: sum(1 for x in v if x <= s) / n  # noqa: E731
    print(f"{name}: {n} GPU records; within 1 s {within(1.0):.0%}, within 5 s {within(5.0):.0%}; "
          f"lag p50 {pct(v, 0.5):.2f} s p90 {pct(v, 0.9):.2f} s; after the last step marker {late / n:.0%}")


def main(argv: List[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    for a in argv:
        if a.endswith(".tar.gz"):
            with tarfile.open(a) as t:
                for m in sorted(t.getmembers(), key=lambda m: m.name):
                    if m.name.endswith(".bin") and m.isfile():
                        f = t.extractfile(m)
                        if f is not None:
                            report(m.name, f.read())
        elif os.path.isdir(a):
            for p in sorted(glob.glob(os.path.join(a, "**", "*.bin"), recursive=True)):
                with open(p, "rb") as f:
                    report(p, f.read())
        else:
            with open(a, "rb") as f:
                report(a, f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
