#!/usr/bin/env python3
"""One variant of the shim's buffer check (scripts/gpu-buffer-check runs several): an eager
launch-bound loop under the injected shim for --seconds, kernel tracing asked for 40 steps in
every 200 (plus the default tier's own windows), then the shim's counters as one JSON line.
Kernel records should carry as many distinct correlation ids as kernels (one launch each):
``corr_repeats`` counts records with the id of the record before them."""
import argparse
import json
import os
import time

import torch

import slo_probe

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=15.0)
p.add_argument("--label", default="")
a = p.parse_args()
dev = torch.device("cuda")
layers = [torch.nn.Linear(256, 256).to(dev) for _ in range(24)]
x = torch.randn(64, 256, device=dev)
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
torch.cuda.synchronize()
time.sleep(1.0)
slo_probe.flush() if hasattr(slo_probe, "flush") else None
c = slo_probe._debug_counters() or {}
print(json.dumps({"label": a.label, "env": {k: v for k, v in os.environ.items() if k.startswith("SLO_PROBE_")},
                  "steps": steps, "counters": c}), flush=True)
