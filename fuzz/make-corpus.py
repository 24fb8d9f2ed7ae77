#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/) from the recorded H200
traces in tests/fixtures/gpu/ and the shipped config. Deterministic; rerun after a record
layout change. Keeps every seed small (the committed corpus stays under 200 KB)."""
import os, struct

ROOT = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(ROOT, "..", "tests", "fixtures", "gpu")
OUT = os.path.join(ROOT, "corpus")


def records(path):
    d = open(path, "rb").read()
    off = 0
    while off + 8 <= len(d):
        kind, _, ln = struct.unpack_from("<HHI", d, off)
        if ln < 8:
            break
        yield kind, d[off:off + ln]
        off += ln


def write(target, name, data):
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data)


for fixture in ("h200-eager", "h200-graphs"):
    recs = list(records(os.path.join(FIX, fixture + ".bin")))
    seen = {}
    for kind, r in recs:
        seen.setdefault(kind, r)
    # decode: one record of each kind, and the first records end to end.
    for kind, r in sorted(seen.items()):
        write("decode", f"{fixture}-kind-{kind:04x}", r)
    prefix = b""
    for _, r in recs:
        if len(prefix) + len(r) > 4096:
            break
        prefix += r
    write("decode", f"{fixture}-first-4k", prefix)
    # replay: the first ~48 KB of records (several iterations with their step markers).
    prefix = b""
    for _, r in recs:
        if len(prefix) + len(r) > 48 * 1024:
            break
        prefix += r
    write("replay", f"{fixture}-first-48k", prefix)
    # ring: a valid region holding some of those records, as the shim leaves it.
    capacity = 512
    shape, fix = 0xC0 | 3, 0  # capacity 64 << 3, a 4 KiB copy buffer, header fixed up
    header = bytearray(4096)
    struct.pack_into("<QIIQI", header, 0, 0x31474E49524F4C53, 1, 4096, capacity, 4242)
    data = bytearray(capacity)
    head = 0
    for _, r in recs[:8]:
        ln = (len(r) + 7) // 8 * 8
        if head + ln > capacity:
            break
        data[head:head + len(r)] = r
        head += ln
    struct.pack_into("<QQ", header, 64, head, 8)
    write("ring", f"{fixture}-records", bytes([shape, fix]) + bytes(header) + bytes(data))
    # The same with the producer wrapped: a padding record then records at 0.
    struct.pack_into("<Q", header, 64, capacity + head)
    struct.pack_into("<Q", header, 128, capacity)
    write("ring", f"{fixture}-wrapped", bytes([shape, fix]) + bytes(header) + bytes(data))

# hello: a valid hello (magic, version 1, pid, ring_len, cupti version, status).
MAGIC = int.from_bytes(b"SLOHELO1", "little")
write("hello", "valid", struct.pack("<QIIQII", MAGIC, 1, 4242, 4096 + (1 << 20), 12060, 3))
write("hello", "wrong-version", struct.pack("<QIIQII", MAGIC, 2, 1, 8192, 0, 0))

# config: the shipped default and small variants.
shipped = open(os.path.join(ROOT, "..", "agent", "slo-probe.toml"), "rb").read()
write("config", "shipped", shipped)
write("config", "empty", b"")
write("config", "agent", b"[agent]\ntick_ms = 250\nretention_s = 30\n")
write("config", "probes", b"[probes.tcp]\nenabled = false\n[probes.runqueue]\nmax_threads = 1024\n")
write("config", "slo", b"[slo]\nwindow_ms = 500\nlearn_windows = 3\n")
