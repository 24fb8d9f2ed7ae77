#!/usr/bin/env python3
"""A real PyTorch training job for slo-probe on GPU nodes (and, with --device cpu, anywhere).

DDP (world size from the usual torchrun variables; 1 when run directly), a small transformer-style
MLP stack, a synthetic dataset behind a DataLoader with worker processes and pinned memory, and
three execution modes:

  --mode eager            plain PyTorch
  --mode compile          torch.compile (Inductor kernels)
  --mode reduce-overhead  torch.compile(mode="reduce-overhead"): CUDA-graph replay

Step markers: when the `slo_probe` package is importable (python/ in this repo), each step is
wrapped in `slo_probe.step()`; otherwise the job runs unchanged.

Prints one JSON line per run with the per-step wall times (CUDA-event timed on GPU) so that
scripts can compare runs. --dump-threads FILE writes the process tree and thread names (comm) of
the job at the middle step, which is what slo-probe's thread-role classifier reads.
"""

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

try:  # optional step markers
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import slo_probe  # type: ignore
except ImportError:  # pragma: no cover - the job runs without it
    slo_probe = None


class Synthetic(Dataset):
    """Random regression data, made on the fly by the loader workers (real CPU work)."""

    def __init__(self, n, dim, seed=0):
        self.n, self.dim, self.seed = n, dim, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(self.dim, generator=g)
        y = torch.tanh(x.roll(1) * 0.5)
        return x, y


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dim, depth):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, dim)

    def forward(self, x):
        return self.head(self.blocks(x))


def dump_threads(path):
    """Writes pid, ppid, comm of the job's processes and the comm of each of their threads."""
    root = os.getpid()
    procs = [root]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == root:
                procs.append(int(entry))
    with open(path, "w") as out:
        for pid in procs:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
                out.write(f"process {pid} {cmd}\n")
                for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        out.write(f"  thread {tid} {f.read().strip()}\n")
            except OSError:
                continue


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["eager", "compile", "reduce-overhead"], default="eager")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the statistics")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--share-gpu", action="store_true",
                   help="put every rank on GPU 0 (with --backend gloo: several ranks on one GPU)")
    p.add_argument("--backend", default=None, help="torch.distributed backend (default nccl on GPU, gloo on CPU)")
    p.add_argument("--dump-threads", default=None, help="write the job's threads to FILE at the middle step")
    p.add_argument("--json", default=None, help="append the run's result as a JSON line to FILE")
    p.add_argument("--label", default=None, help="label of the run in the JSON line")
    p.add_argument("--steps-out", default=None,
                   help="write every step's CUDA-event time (ms) as JSON to FILE")
    p.add_argument("--steps-live", default=None,
                   help="append 'CLOCK_MONOTONIC-ns step wall-ms' to FILE as each step ends")
    p.add_argument("--diagnostic", default=None, metavar="STEP:N",
                   help="at STEP ask the shim for node-level graph tracing during N steps")
    p.add_argument("--profile", action="store_true",
                   help="run under torch.profiler (CUDA activity) and count kernels per step")
    p.add_argument("--handover", default=None, metavar="STEP:N",
                   help="at STEP hand CUPTI to torch.profiler for N steps (slo_probe.cupti_released)")
    p.add_argument("--instrument", action="store_true",
                   help="attribute kernels to modules with slo_probe.instrument (eager mode)")
    args = p.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    dist.init_process_group(backend)
    rank = dist.get_rank()
    if args.device == "cuda":
        # --share-gpu: every rank on GPU 0 (several ranks on a one-GPU machine; NCCL refuses
        # that, use --backend gloo).
        index = 0 if args.share_gpu else int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")

    torch.manual_seed(0)
    model = Model(args.dim, args.depth).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.mode == "compile":
        step_model = torch.compile(ddp)
    elif args.mode == "reduce-overhead":
        step_model = torch.compile(ddp, mode="reduce-overhead")
    else:
        step_model = ddp
    if args.instrument and slo_probe is not None:
        slo_probe.instrument(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.MSELoss()

    data = Synthetic(args.batch * (args.steps + 1), args.dim, seed=rank)
    loader = DataLoader(
        data,
        batch_size=args.batch,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
        drop_last=True,
    )

    on_gpu = device.type == "cuda"
    times_ms = []
    per_step = []
    it = iter(loader)
    diag_at, diag_n = (int(x) for x in args.diagnostic.split(":")) if args.diagnostic else (-1, 0)
    hand_at, hand_n = (int(x) for x in args.handover.split(":")) if args.handover else (-1, 0)
    prof = None
    handover = None
    handover_events = None
    live = open(args.steps_live, "a", buffering=1) if args.steps_live else None
    for step in range(args.steps):
        if args.profile and step == args.warmup:
            # Profile the steady state only: the first steps launch one-off kernels.
            from torch.profiler import ProfilerActivity, profile
            torch.cuda.synchronize()
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        if step == diag_at and slo_probe is not None:
            slo_probe._request_diagnostic(diag_n)
        if step == hand_at and slo_probe is not None:
            from torch.profiler import ProfilerActivity, profile
            handover = contextlib.ExitStack()
            handover.enter_context(slo_probe.cupti_released())
            hprof = handover.enter_context(profile(activities=[ProfilerActivity.CUDA]))
        if handover is not None and step == hand_at + hand_n:
            handover.close()
            handover_events = sum(1 for e in hprof.events() if e.device_type.name == "CUDA")
            handover = None
        marker = slo_probe.step(step) if slo_probe else contextlib.nullcontext()
        if on_gpu:
            start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        with marker:
            x, y = next(it)
            # The CUDA events bracket the step's GPU work: from just before the batch's copy to
            # the device (the step's first GPU operation) to after the optimizer's last kernel.
            if on_gpu:
                start_ev.record()
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            if args.mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            out = step_model(x)
            loss = loss_fn(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if on_gpu:
                end_ev.record()
                end_ev.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
        if live is not None:
            live.write(f"{time.monotonic_ns()} {step} {wall_ms:.3f}\n")
        gpu_ms = start_ev.elapsed_time(end_ev) if on_gpu else wall_ms
        per_step.append({"step": step, "cuda_event_ms": gpu_ms, "wall_ms": wall_ms})
        if step >= args.warmup:
            times_ms.append(gpu_ms)
        if args.dump_threads and step == args.steps // 2:
            dump_threads(args.dump_threads)

    kernels_per_step = None
    if prof is not None:
        torch.cuda.synchronize()
        prof.__exit__(None, None, None)
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        kernels_per_step = len(kernels) / max(1, args.steps - args.warmup)
    shim_counters = slo_probe._debug_counters() if slo_probe is not None else None
    if args.steps_out:
        with open(args.steps_out, "w") as f:
            json.dump(per_step, f)
    times_ms.sort()
    n = len(times_ms)
    result = {
        "label": args.label or args.mode,
        "mode": args.mode,
        "device": str(device),
        "backend": backend,
        "steps": n,
        "median_ms": times_ms[n // 2] if n else None,
        "p99_ms": times_ms[min(n - 1, n * 99 // 100)] if n else None,
        "final_loss": float(loss.detach()),
        "step_markers": slo_probe is not None,
        "shim": slo_probe.status() if slo_probe is not None else None,
        "shim_counters": shim_counters,
        "profiler_cuda_events_per_step": kernels_per_step,
        "handover_profiler_cuda_events": handover_events,
    }
    print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
