"""Per-call cost of the slo_probe API, without a shim and against the compiled stub shim; why the
hot-path functions keep the GIL (a call through ctypes.CDLL, which drops it, vs ctypes.PyDLL,
which keeps it, while another Python thread is busy); and, where torch is installed, what
instrument() adds to a forward pass. Needs a C compiler.

Run: cd python && python3 tests/bench_overhead.py
"""

from __future__ import annotations

import ctypes
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import slo_probe  # noqa: E402


def ns_per_call(stmt: str, n: int = 200_000) -> float:
    g = {"sp": slo_probe}
    return min(timeit.repeat(stmt, number=n, repeat=5, globals=g)) / n * 1e9


def api_costs(label: str) -> None:
    print(f"{label}:")
    for stmt in ("with sp.step(): pass", "with sp.op('attention'): pass"):
        print(f"  {stmt:32} {ns_per_call(stmt):6.0f} ns")


def contended(f: Callable[[], None], seconds: float = 1.0) -> int:
    """Calls of f completed in `seconds` while another thread runs Python code."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=spin)
    t.start()
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        f()
        n += 1
    stop.set()
    t.join()
    return n


def torch_hooks() -> None:
    """Forward time of a 151-module model with and without instrument() (stub shim loaded)."""
    try:
        torch: Any = importlib.import_module("torch")
        nn = torch.nn
    except ImportError:
        print("instrument(): torch is not installed, skipped")
        return
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    net = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(50)]).to(dev)
    x = torch.randn(8, 64, device=dev)
    modules = sum(1 for _ in net.modules())

    def forward() -> Any:
        with torch.no_grad():
            return net(x)

    def seconds() -> float:
        forward()
        if dev == "cuda":
            torch.cuda.synchronize()
        t = min(timeit.repeat(forward, number=200, repeat=5)) / 200
        if dev == "cuda":
            torch.cuda.synchronize()
        return t

    plain = seconds()
    handle = slo_probe.instrument(net)
    hooked = seconds()
    handle.remove()
    plain = min(plain, seconds())
    print(
        f"instrument() on {dev}, torch {torch.__version__}: forward of {modules} modules "
        f"{plain * 1e6:.0f} µs plain, {hooked * 1e6:.0f} µs instrumented "
        f"({(hooked - plain) / modules * 1e9:.0f} ns per module)"
    )


def main() -> None:
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        sys.exit("needs a C compiler (cc) to build tests/stub_shim.c")
    slo_probe._set_backend(None)
    api_costs("no shim")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "libslo_probe_stub.so")
        subprocess.run(
            [cc, "-shared", "-fPIC", "-O2", "-o", path, os.path.join(HERE, "stub_shim.c")], check=True
        )
        slo_probe._install(slo_probe._load_shim(path))
        api_costs("stub shim (logs each call into a 64 KiB buffer)")
        funcs = {}
        for kind in (ctypes.PyDLL, ctypes.CDLL):
            f = kind(path).slo_probe_op_pop
            f.restype, f.argtypes = None, []
            funcs[kind.__name__] = f
        print(
            "one op_pop() call, alone / with another Python thread busy (switch interval "
            f"{sys.getswitchinterval() * 1e3:.0f} ms):"
        )
        for name, f in funcs.items():
            alone = min(timeit.repeat(f, number=300_000, repeat=5)) / 300_000 * 1e9
            n = contended(f)
            print(f"  {name:6} {alone:5.0f} ns alone; {n:9d} calls/s contended ({1e6 / n:8.2f} µs per call)")
        torch_hooks()


if __name__ == "__main__":
    main()
