#!/usr/bin/env python3
"""One variant of the shim's buffer check (scripts/gpu-buffer-check runs several): an eager
loop under the injected shim for --seconds, kernel tracing asked for 40 steps in every 200
(plus the default tier's own windows), then the shim's counters as one JSON line.
--load launch: small layers, the CPU is the bottleneck; --load gpu: large matmuls, the CPU
runs ahead of the GPU (work queued, as in a GPU-bound training job).
Kernel records should carry as many distinct correlation ids as kernels (one launch each):
``corr_repeats`` counts records with the id of the record before them. Records should reach
the shim while the loop runs: ``kernel_records_live`` is the count read once a second, the
last read before the loop ended; ``live_fraction`` that over the count after the final flush."""
import argparse
import json
import os
import time

import torch

import slo_probe

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=15.0)
p.add_argument("--label", default="")
p.add_argument("--load", choices=["launch", "gpu"], default="launch")
a = p.parse_args()
dev = torch.device("cuda")
width, depth, batch = (256, 24, 64) if a.load == "launch" else (4096, 8, 8192)
layers = [torch.nn.Linear(width, width).to(dev) for _ in range(depth)]
x = torch.randn(batch, width, device=dev)


def kernels_now():
    return int((slo_probe._debug_counters() or {}).get("kernel_records", 0))


live = []
next_read = time.monotonic() + 1.0
opt = torch.optim.SGD([q for l in layers for q in l.parameters()], lr=1e-3)
t0 = time.monotonic()
steps = 0
while time.monotonic() - t0 < a.seconds:
    if steps % 200 == 100:
        slo_probe.request_depth(1, steps=40)
    with slo_probe.step():
        h = x
        for l in layers:
            h = torch.relu(l(h))
        loss = h.square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    steps += 1
    if time.monotonic() >= next_read:
        live.append(kernels_now())
        next_read += 1.0
live_end = kernels_now()
torch.cuda.synchronize()
time.sleep(1.0)
slo_probe.flush() if hasattr(slo_probe, "flush") else None
c = slo_probe._debug_counters() or {}
final = int(c.get("kernel_records", 0))
print(json.dumps({"label": a.label, "load": a.load,
                  "env": {k: v for k, v in os.environ.items() if k.startswith("SLO_PROBE_")},
                  "steps": steps, "kernel_records_each_second": live, "kernel_records_live": live_end,
                  "live_fraction": round(live_end / final, 3) if final else None,
                  "counters": c}), flush=True)
