#!/usr/bin/env python3
"""Kernel records whose correlation id repeats the one before them, per burst of kernel records,
in recordings (<pid>.bin as the agent writes them, or the fixtures' copies). An eager launch has
one kernel, so a repeat means the record does not carry its own launch's id: the shim then joins
it to another launch (its operator, its launch time). A burst is a run of kernel records with no
gap of GAP_MS (default 300) between their GPU starts: a sample window, a hold or a request.

    python3 scripts/faults/corr-repeats.py [--gap-ms N] DIR/*/*.bin

One line per file: kernel records, repeats, and per burst "records/repeats".
"""
import struct, sys

from arrival import records  # scripts/faults/arrival.py: the recording's records

args = sys.argv[1:]
gap_ms = 300.0
if args[:1] == ["--gap-ms"]:
    gap_ms = float(args[1]); args = args[2:]
if not args:
    sys.exit(__doc__)
for f in args:
    ks = []
    for kind, rec in records(open(f, "rb").read()):
        if kind == 0x0200:  # GpuKernel: start, end, launch, graph node, correlation id
            start, _end, _launch, _node, corr = struct.unpack_from("<QQQQI", rec, 8)
            ks.append((start, corr))
    # The file's order (as records arrived) is what CUPTI handed over; repeats are counted in it.
    repeats = sum(1 for a, b in zip(ks, ks[1:]) if a[1] == b[1])
    bursts = []
    order = sorted(range(len(ks)), key=lambda i: ks[i][0])
    last_start = None
    for i in order:
        start = ks[i][0]
        if last_start is None or start - last_start > gap_ms * 1e6:
            bursts.append([0, 0])
        bursts[-1][0] += 1
        if i > 0 and ks[i - 1][1] == ks[i][1]:
            bursts[-1][1] += 1
        last_start = start
    print(f"{f}: {len(ks)} kernel records, {repeats} repeats ({100.0 * repeats / max(1, len(ks)):.1f}%); bursts "
          + " ".join(f"{n}/{r}" for n, r in bursts))
