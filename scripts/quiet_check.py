#!/usr/bin/env python3
"""Depth 0 as the A/B blocks saw it (issue 13): per A/B job in each blocks.jsonl of scripts/gpu-overhead (plain,
.gz, or the blocks.tar.gz of scripts/gpu-overhead-bisect), the `default` blocks without a window: how many, the
shim's callback time in them (median, µs a block), and over all default blocks the quiet switches
(SLO_PROBE_QUIET_IDLE), kernel records, correlation misses and repeats.

    python3 scripts/quiet_check.py bench/results/overhead-2026-12-06c/call4-blocks.tar.gz
"""
import gzip
import io
import json
import sys
import tarfile
from typing import Iterator, Tuple


def in_tar(t: tarfile.TarFile, prefix: str) -> Iterator[Tuple[str, str]]:
    """The blocks.jsonl files in a tar, in nested blocks tars as well."""
    for m in sorted(t.getnames()):
        f = t.extractfile(m) if m.endswith(("blocks.jsonl", "blocks.jsonl.gz", "blocks.tar.gz")) else None
        if f is None:
            continue
        data = f.read()
        if m.endswith(".tar.gz"):
            with tarfile.open(fileobj=io.BytesIO(data)) as inner:
                yield from in_tar(inner, f"{prefix}{m}:")
        else:
            yield prefix + m, (gzip.decompress(data) if m.endswith(".gz") else data).decode()


def sources(path: str) -> Iterator[Tuple[str, str]]:
    if path.endswith(".tar.gz"):
        with tarfile.open(path) as t:
            yield from in_tar(t, "")
    elif path.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            yield path, f.read()
    else:
        with open(path) as f:
            yield path, f.read()


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("| source | job | depth-0 blocks | callback µs a block (median) | quiet switches | kernel records | misses | repeats |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        for name, text in sources(path):
            for line in text.splitlines():
                u = json.loads(line)
                if u.get("kind") != "ab":
                    continue
                default = [b["counters"] for b in u["blocks"] if b["condition"] == "default"]
                idle = sorted(c.get("callback_ns", 0) for c in default if c.get("sampled_steps", 0) == 0)
                med = f"{idle[len(idle) // 2] / 1e3:.1f}" if idle else "–"
                tot = lambda k: sum(c.get(k, 0) for c in default)  # noqa: E731
                print(f"| {name} | {u.get('label')} | {len(idle)} | {med} | {tot('quiet_switches')} | "
                      f"{tot('kernel_records')} | {tot('corr_misses')} | {tot('corr_repeats')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
