#!/usr/bin/env python3
"""Renumbers a fixture archive from scripts/gpu-faults so that it can sit beside the committed ones.

Each run of scripts/gpu-faults numbers its fixtures from 01 (``A-01-gpt-ro-gpu-healthy``), and
scripts/faults/replay-all and summary.py key the replays by that name, so a second recording of
the same jobs would overwrite the first one's replays. This rewrites every fixture's number
(``A-01-…`` → ``A-21-…`` with ``--first 21``) in its folder name and in answer.json,
answers.json and index.json, renames the archive's top folder, and records where it was made
(``--recorded-on``, kept in each answer's ``fixture.recorded_on``). ``--markers-only REASON`` keeps
REASON in each answer's ``fixture.markers_only``: the recording stands only for a job that marks its
steps (made with a shim that traces such jobs otherwise than it would a job without markers), so the
replays without markers (``--detect``) leave it out. The recordings themselves are not touched.

  python3 scripts/faults/renumber.py IN.tar.gz OUT.tar.gz --first 21 --top faults-A-ro-h100 \\
      --recorded-on "NVIDIA H100 80GB HBM3, 2026-12-06"

Only the Python standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
from typing import Any, Dict, List, Optional

NAME = re.compile(r"^([A-Z])-(\d+)-(.+)$")


def renamed(name: str, mapping: Dict[str, str]) -> str:
    return mapping.get(name, name)


def rewrite_names(value: Any, mapping: Dict[str, str]) -> Any:
    """Every string that is a fixture's old name, anywhere in a JSON value, becomes its new name."""
    if isinstance(value, str):
        return renamed(value, mapping)
    if isinstance(value, list):
        return [rewrite_names(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: rewrite_names(v, mapping) for k, v in value.items()}
    return value


def stamp(fixture: Dict[str, Any], a: argparse.Namespace) -> None:
    """Where the fixture was made (``--recorded-on``) and what it stands for (``--markers-only``)."""
    if a.recorded_on:
        fixture["recorded_on"] = a.recorded_on
    if a.markers_only:
        fixture["markers_only"] = a.markers_only


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--first", type=int, required=True, help="the number the lowest-numbered fixture gets")
    p.add_argument("--top", required=True, help="the archive's new top folder (e.g. faults-A-ro-h100)")
    p.add_argument("--recorded-on", default="", help="the machine, kept in each answer's fixture.recorded_on")
    p.add_argument("--markers-only", default="", help="why the recordings stand only for jobs with step markers "
                   "(kept in each answer's fixture.markers_only; the replays without markers leave them out)")
    a = p.parse_args(argv)
    if os.path.exists(a.output):
        print(f"renumber: {a.output} exists; not overwritten", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(a.input) as t:
            t.extractall(tmp, filter="data")
        tops = [d for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d))]
        if len(tops) != 1:
            print(f"renumber: {a.input} has {len(tops)} top folders, expected one", file=sys.stderr)
            return 2
        root = os.path.join(tmp, tops[0])
        olds = sorted(d for d in os.listdir(root) if NAME.match(d) and os.path.isdir(os.path.join(root, d)))
        if not olds:
            print(f"renumber: no fixture folders (X-NN-…) in {a.input}", file=sys.stderr)
            return 2
        base = min(int(NAME.match(d).group(2)) for d in olds)
        mapping = {}
        for d in olds:
            letter, num, rest = NAME.match(d).groups()
            mapping[d] = f"{letter}-{int(num) - base + a.first:02d}-{rest}"
        for old, new in mapping.items():
            os.rename(os.path.join(root, old), os.path.join(root, new))
            ans = os.path.join(root, new, "answer.json")
            if os.path.exists(ans):
                with open(ans) as f:
                    v = rewrite_names(json.load(f), mapping)
                if a.recorded_on or a.markers_only:
                    stamp(v.setdefault("fixture", {}), a)
                with open(ans, "w") as f:
                    json.dump(v, f, indent=1)
        for meta in ("answers.json", "index.json"):
            path = os.path.join(root, meta)
            if os.path.exists(path):
                with open(path) as f:
                    v = rewrite_names(json.load(f), mapping)
                if meta == "answers.json" and isinstance(v, list):
                    for ans in v:
                        if isinstance(ans, dict) and isinstance(ans.get("fixture"), dict):
                            stamp(ans["fixture"], a)
                with open(path, "w") as f:
                    json.dump(v, f, indent=1)
        new_root = os.path.join(tmp, a.top)
        if new_root != root:
            shutil.move(root, new_root)
        with tarfile.open(a.output, "w:gz") as t:
            t.add(new_root, arcname=a.top)
    for old, new in mapping.items():
        print(f"{old} -> {new}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
