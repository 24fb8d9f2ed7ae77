#!/usr/bin/env python3
"""The training job of slo-probe's real-fault suite (issue 12): real models, real faults, known answers.

Not the project's example: two models of different kinds, written in plain PyTorch --

  * ``gpt``: a GPT-style transformer LM (token and position embeddings, pre-LayerNorm blocks with
    causal scaled-dot-product attention and a GELU MLP, a vocabulary head, cross-entropy);
  * ``convnet``: a ResNet-style convolutional net (a stem, four stages of BasicBlocks with batch
    norm and shortcut projections, global pooling, a classifier).

Both train for real (forward, backward, fused AdamW) on data made on the host by a DataLoader with
2-3 worker processes (tokens from an n-gram hashing "tokenizer" over synthetic text; uint8 images
cropped out of a pool of "decoded" images), handed to a pin-memory thread (``pt_data_pin``, as
PyTorch names its own) that copies each batch into one of a ring of pinned buffers, then copied
host -> device by the main thread with ``non_blocking=True``. Every iteration is marked with
``slo_probe.step()`` (the lead replays the recording with markers ignored for the "without
markers" case; ``--markers none`` marks none, so that the shim traces the job as it would one
that sends no markers, and the answers say ``"markers": "none"``), the host->device copy is
``slo_probe.op("data_to_device")`` and the optimizer ``slo_probe.op("optimizer")``; in eager
mode ``slo_probe.instrument(model)`` names every module.

Modes: ``eager``; ``compile`` (``torch.compile``); ``reduce-overhead`` (``torch.compile(mode=
"reduce-overhead")``: CUDA graphs, the optimizer outside them). Sizes: ``launch`` (a small batch:
the CPU's launches are the bottleneck) and ``gpu`` (a large batch: the GPU is).

The job runs a *schedule*: healthy segments (baselines), then each fault for F seconds followed by
H seconds of recovery. It injects every fault itself, at a step boundary, and writes the exact
CLOCK_MONOTONIC onset and end (``time.clock_gettime_ns(time.CLOCK_MONOTONIC)``, the agent's clock)
with the expected answer to ``--answers`` (JSON lines, one object per segment, appended as each
segment ends). Faults:

  more_work        ``blocks.1.mlp`` (a labelled custom op, forward and backward) does its matmuls
                   3x, shapes unchanged                          -> that op, execution
  extra_kernel     ``blocks.2.attn.extra`` / ``layer3.0.extra`` launches an extra matmul sized to
                   take max(3 ms, 35% of a step)                 -> that op, execution
  host_sync        ``blocks.3.sync`` / ``layer4.0.sync``: torch.cuda.synchronize() in the module's
                   forward (eager, compile); reduce-overhead: between backward and the optimizer
                                                                 -> that op / "optimizer", launch_latency
  low_occupancy    ``blocks.2.mlp.act`` / ``layer1.0.act1``: a Triton GELU switched from
                   BLOCK=1024/num_warps=4/one program per block to BLOCK=32/num_warps=1 on a few
                   programs (theoretical occupancy 50% instead of 75-100%, and slower)
                                                                 -> that op, occupancy
  pageable_copy    the batch copied host->device from pageable instead of pinned memory
                                                                 -> data_to_device, memory_bandwidth
  cpu_contention   stopped busy processes, pre-spawned on the main thread's CPU, resumed
                                                                 -> (kernel launches) <- host.runqueue.main
  loader_starvation  the same on the loader workers' CPUs        -> (data loading) <- host.runqueue.data_loader
  throttling       the job's own cgroup v2 cpu.max lowered       -> <- host.throttling
  gpu_clocks       nvidia-smi -lgc; refused unless --allow-gpu-clock-change (the device machine's
                   rules forbid changing clocks), recorded as skipped
  comm_loss        (2 ranks, --ddp) rank 0 puts netem loss on the ranks' link -> communication <- host.retransmits

In compile modes every fault variant that changes the model is compiled (and, with CUDA graphs,
captured) during warm-up, switched back and forth once more, and Dynamo's counters are compared
before and after the timed run: a recompilation mid-run is logged and recorded in the answers.
The fault intensities (extra kernel size, low-occupancy grid, busy process counts, cgroup quota,
loader work) are calibrated on the machine before the timed run and recorded.

Also written: ``--steps-out`` (JSON lines: every step's index, CLOCK_MONOTONIC begin/end, warm-up
flag, segment; warm-up covers compilation, autotuning and capture) and ``--summary-out`` (the
job: configuration, CPUs, calibration, compile counters, shim counters).

Run (on a GPU machine; scripts/gpu-faults does this under the agent):

  CUDA_INJECTION64_PATH=$PWD/target/release/libslo_probe_cupti.so PYTHONPATH=$PWD/python \\
    python3 scripts/faults/job.py --model gpt --mode eager --size gpu \\
      --schedule healthy:20,extra_kernel,more_work --fault-s 6 --recover-s 12.5 \\
      --main-cpu 2 --pin-cpu 3 --loader-cpus 4,5,6 --answers /tmp/answers.jsonl

  python3 scripts/faults/job.py --dry-run     # no GPU: tiny CPU models, short segments

Only the Python standard library, torch and triton.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

T0_NS = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
LABEL = "job"


def mono_ns() -> int:
    """CLOCK_MONOTONIC in ns: the clock the agent, the shim and eBPF use."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def log(msg: str) -> None:
    print(f"[{LABEL} {time.strftime('%H:%M:%S')} +{(mono_ns() - T0_NS) / 1e9:7.2f}s] {msg}", flush=True)


KINDS = (
    "more_work", "extra_kernel", "host_sync", "low_occupancy", "pageable_copy",
    "cpu_contention", "loader_starvation", "throttling", "gpu_clocks", "comm_loss",
)
# Faults that change the model: in compile modes each is a variant compiled during warm-up.
VARIANT_KINDS = ("more_work", "extra_kernel", "host_sync", "low_occupancy")
DIMENSIONS = ("execution", "occupancy", "memory_bandwidth", "launch_latency", "communication", "data_loading")
LAUNCHES_OP = "(kernel launches)"
DATA_LOADING_OP = "(data loading)"
MORE_WORK_REPS = 3

# ---------------------------------------------------------------------------------------------
# Command line and schedule


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("gpt", "convnet"), default="gpt")
    p.add_argument("--mode", choices=("eager", "compile", "reduce-overhead"), default="eager")
    p.add_argument("--size", choices=("launch", "gpu"), default="gpu")
    p.add_argument("--markers", choices=("explicit", "none"), default="explicit",
                   help="explicit: slo_probe.step() around every iteration; none: no step markers "
                        "(operator and module names stay), as a job that sends none")
    p.add_argument("--schedule", default="healthy:20,more_work,extra_kernel",
                   help="comma-separated segments KIND[:F[:H]] or healthy:SECONDS (default F/H: --fault-s/--recover-s)")
    p.add_argument("--schedule-json", default="", help="a JSON list of {kind, fault_s, recover_s} (or a file holding one); wins over --schedule")
    p.add_argument("--fault-s", type=float, default=6.0)
    p.add_argument("--recover-s", type=float, default=12.5)
    p.add_argument("--budget-s", type=float, default=0.0, help="wall seconds for the whole process (0: none); segments that would not fit are skipped and recorded")
    p.add_argument("--label", default="")
    p.add_argument("--answers", default="", help="JSON lines file the answers are appended to")
    p.add_argument("--steps-out", default="", help="JSON lines file for the per-step record")
    p.add_argument("--summary-out", default="", help="JSON file for the job summary")
    p.add_argument("--main-cpu", type=int, default=-1, help="CPU for the main (launching) thread and its other threads, after warm-up")
    p.add_argument("--pin-cpu", type=int, default=-1, help="CPU for the pin-memory thread")
    p.add_argument("--loader-cpus", default="", help="CPUs for the DataLoader workers, one each (comma-separated)")
    p.add_argument("--helper-cpus", default="", help="CPUs for helper commands (tc, nvidia-smi)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--cgroup", default="", help="the job's own cgroup v2 directory (for throttling)")
    p.add_argument("--busy-cgroup", default="", help="cgroup v2 directory to put the busy processes in")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel over gloo from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; every rank on GPU 0")
    p.add_argument("--stop-file", default="", help="--ddp: the file rank 0 writes the last step to (default /tmp/slo-faults-stop-<MASTER_PORT>)")
    p.add_argument("--netem", default="", help="comm_loss: the ranks' link as NS:DEV,NS:DEV (network namespaces) or DEV (this one)")
    p.add_argument("--netem-loss", type=float, default=5.0, help="comm_loss: percent of TCP segments lost")
    p.add_argument("--loss-method", choices=("netem", "nft", "iptables", "tbf"), default="netem",
                   help="comm_loss: tc netem loss; nftables or iptables random drop of TCP on the link's egress "
                        "(kernels without sch_netem); tbf, a rate limit with a short queue (drops when full)")
    p.add_argument("--allow-gpu-clock-change", action="store_true", help="let gpu_clocks run nvidia-smi -lgc (forbidden on the lent device machines)")
    p.add_argument("--gpu-low-clock", type=int, default=0, help="gpu_clocks: MHz (0: the supported clock nearest 45%% of the maximum)")
    p.add_argument("--gpu-fault-frac", type=float, default=0.35, help="extra_kernel and low_occupancy add this share of a step (at least --gpu-fault-ms)")
    p.add_argument("--gpu-fault-ms", type=float, default=3.0)
    p.add_argument("--loader-util", type=float, default=0.35, help="target share of the loader workers' time spent producing batches")
    p.add_argument("--busy-main", type=int, default=0, help="cpu_contention: busy processes (0: from the measured launch share)")
    p.add_argument("--busy-loader", type=int, default=0, help="loader_starvation: busy processes per loader CPU (0: from the measured loader share)")
    p.add_argument("--throttle-cpus", type=float, default=0.0, help="throttling: cpu.max quota in CPUs (0: from the measured demand)")
    p.add_argument("--throttle-period-us", type=int, default=100000)
    p.add_argument("--batch", type=int, default=0, help="override the size's batch")
    p.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                   help="override a size setting (gpt: batch seq d heads layers vocab; convnet: batch image width classes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="read the loss (a host sync) every N steps")
    p.add_argument("--dry-run", action="store_true", help="no GPU needed: tiny CPU models, no compile, short segments")
    p.add_argument("--dry-run-compile", action="store_true", help="with --dry-run: keep --mode (Inductor on the CPU; tests the variant switching)")
    a = p.parse_args(argv)
    if a.dry_run and not a.dry_run_compile:
        a.mode = "eager"
    return a


def parse_schedule(a: argparse.Namespace) -> List[Dict[str, Any]]:
    segs: List[Dict[str, Any]] = []
    if a.schedule_json:
        text = a.schedule_json
        if os.path.isfile(text):
            with open(text) as f:
                text = f.read()
        for s in json.loads(text):
            kind = s["kind"]
            if kind == "healthy":
                segs.append({"kind": "healthy", "fault_s": float(s.get("seconds", s.get("fault_s", 20))), "recover_s": 0.0})
            else:
                segs.append({"kind": kind, "fault_s": float(s.get("fault_s", a.fault_s)), "recover_s": float(s.get("recover_s", a.recover_s))})
    else:
        for item in [x.strip() for x in a.schedule.split(",") if x.strip()]:
            parts = item.split(":")
            kind = parts[0]
            if kind == "healthy":
                segs.append({"kind": "healthy", "fault_s": float(parts[1]) if len(parts) > 1 else 20.0, "recover_s": 0.0})
            else:
                f = float(parts[1]) if len(parts) > 1 and parts[1] else a.fault_s
                h = float(parts[2]) if len(parts) > 2 and parts[2] else a.recover_s
                segs.append({"kind": kind, "fault_s": f, "recover_s": h})
    for s in segs:
        if s["kind"] != "healthy" and s["kind"] not in KINDS:
            raise SystemExit(f"unknown fault kind {s['kind']!r}; known: {', '.join(KINDS)}")
    return segs


# ---------------------------------------------------------------------------------------------
# Small helpers: CPUs, thread names, subprocesses


def cpu_list(text: str) -> List[int]:
    out: List[int] = []
    for part in [x for x in text.split(",") if x.strip()]:
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def set_thread_name(name: str) -> None:
    """The OS name of the calling thread (what the agent's role patterns read)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass


def pin_thread(cpus: List[int]) -> None:
    """Pin the calling thread (Linux: sched_setaffinity(0) is per thread)."""
    if cpus:
        try:
            os.sched_setaffinity(0, set(cpus))
        except OSError as e:
            log(f"cannot pin a thread to {cpus}: {e}")


def pin_all_threads(cpus: List[int]) -> int:
    """Pin every thread of this process; returns how many."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), set(cpus))
            n += 1
        except OSError:
            pass
    return n


def run_cmd(cmd: List[str], timeout: float = 15.0, cpus: Optional[List[int]] = None) -> Tuple[int, str]:
    """Runs a helper command with a timeout; (rc, output). Never raises."""
    full = list(cmd)
    if cpus and shutil.which("taskset"):
        full = ["taskset", "-c", ",".join(map(str, cpus))] + full
    try:
        r = subprocess.run(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True)
        return r.returncode, (r.stdout or "").strip()
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s: {' '.join(full)}"
    except OSError as e:
        return 127, f"{e}: {' '.join(full)}"


class Async:
    """A helper command run in a thread (so that the training loop never waits on it)."""

    def __init__(self, fn, name: str, cpus: List[int]):
        self.result: Any = None
        self.error: Optional[str] = None
        self.started_ns = mono_ns()
        self.done_ns: Optional[int] = None

        def body():
            pin_thread(cpus)
            try:
                self.result = fn()
            except Exception as e:  # recorded, never raised into the loop
                self.error = f"{type(e).__name__}: {e}"
            self.done_ns = mono_ns()

        self.thread = threading.Thread(target=body, name=name, daemon=True)
        self.thread.start()

    def done(self) -> bool:
        return self.done_ns is not None


# ---------------------------------------------------------------------------------------------
# torch-side code (everything below needs torch; imported lazily so that --help works without it)

torch = None  # type: ignore
nn = None  # type: ignore
F = None  # type: ignore
slo_probe = None  # type: ignore
triton = None  # type: ignore
tl = None  # type: ignore
OPS: Dict[str, Any] = {}
TRITON_ERR: Optional[str] = None


def import_torch() -> None:
    global torch, nn, F, slo_probe, triton, tl
    import torch as _torch  # noqa: F401
    import torch.nn as _nn
    import torch.nn.functional as _F
    torch, nn, F = _torch, _nn, _F
    try:
        import slo_probe as _sp
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
        import slo_probe as _sp  # type: ignore
    slo_probe = _sp


def label_ctx(label: str):
    return slo_probe.op(label) if label else contextlib.nullcontext()


_TRITON_KERNELS: Dict[str, Any] = {}


def load_triton() -> None:
    """The Triton GELU kernels (forward, backward); sets TRITON_ERR when unavailable."""
    global triton, tl, TRITON_ERR
    if not torch.cuda.is_available():
        TRITON_ERR = "no CUDA"
        return
    try:
        import triton as _triton
        import triton.language as _tl
    except Exception as e:
        TRITON_ERR = f"triton not importable: {e}"
        return
    triton, tl = _triton, _tl

    @triton.jit
    def gelu_fwd_kernel(X, Y, N, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        for i in range(0, tl.cdiv(N, nprog * BLOCK)):  # grid-stride loop (one pass when the grid covers N)
            offs = (i * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
            m = offs < N
            x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
            u = 1.5957691216057308 * (x + 0.044715 * x * x * x)
            y = x * tl.sigmoid(u)
            tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def gelu_bwd_kernel(G, X, DX, N, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        for i in range(0, tl.cdiv(N, nprog * BLOCK)):
            offs = (i * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
            m = offs < N
            x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
            g = tl.load(G + offs, mask=m, other=0.0).to(tl.float32)
            u = 1.5957691216057308 * (x + 0.044715 * x * x * x)
            s = tl.sigmoid(u)
            du = 1.5957691216057308 * (1.0 + 3.0 * 0.044715 * x * x)
            d = s + x * s * (1.0 - s) * du
            tl.store(DX + offs, (g * d).to(DX.dtype.element_ty), mask=m)

    _TRITON_KERNELS["fwd"] = gelu_fwd_kernel
    _TRITON_KERNELS["bwd"] = gelu_bwd_kernel
    # Every model holds a Triton GELU: check both kernels in both launch configurations now, so
    # that a Triton problem turns low_occupancy off (torch's GELU instead) rather than failing
    # the job at its first step.
    try:
        x = torch.randn(5000, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(5000, device="cuda", dtype=torch.bfloat16)
        xr = x.float().requires_grad_()
        ref = F.gelu(xr, approximate="tanh")
        ref.backward(g.float())
        for cfg, grid in ((0, 0), (1, 3)):
            y = torch.empty_like(x)
            _launch_gelu("fwd", (x, y), x.numel(), cfg, grid)
            dx = torch.empty_like(x)
            _launch_gelu("bwd", (g, x, dx), x.numel(), cfg, grid)
            torch.cuda.synchronize()
            ey = (y.float() - ref.detach()).abs().max().item()
            ed = (dx.float() - xr.grad).abs().max().item()
            if not (ey < 0.05 and ed < 0.1):
                raise RuntimeError(f"Triton GELU config {cfg} differs from torch: forward {ey:.3g}, backward {ed:.3g}")
    except Exception as e:
        TRITON_ERR = f"Triton GELU self-test failed: {type(e).__name__}: {e}"
        _TRITON_KERNELS.clear()


NORMAL_BLOCK, NORMAL_WARPS = 1024, 4
LOW_BLOCK, LOW_WARPS = 32, 1


def _launch_gelu(which: str, args: Tuple[Any, ...], n: int, cfg: int, grid: int) -> None:
    k = _TRITON_KERNELS[which]
    if cfg == 0:
        k[(triton.cdiv(n, NORMAL_BLOCK),)](*args, n, BLOCK=NORMAL_BLOCK, num_warps=NORMAL_WARPS)
    else:
        k[(max(1, grid),)](*args, n, BLOCK=LOW_BLOCK, num_warps=LOW_WARPS)


def register_ops() -> None:
    """Custom ops whose bodies run at run time in every mode (opaque to Dynamo and Inductor), so
    that the kernels they launch carry their module's label in eager, compile and CUDA graphs
    (pushed on the launching thread, the autograd thread for backward)."""
    from torch.library import custom_op

    # --- the labelled MLP (more_work): y = gelu(x W1^T + b1) W2^T + b2, each matmul `reps` times
    @custom_op("slo_faults::mlp_fwd", mutates_args=(), schema="(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int reps, str label) -> (Tensor, Tensor)")
    def mlp_fwd(x, w1, b1, w2, b2, reps, label):
        with label_ctx(label):
            h = torch.addmm(b1, x, w1.t())
            for _ in range(reps - 1):
                h = torch.addmm(b1, x, w1.t())
            a = F.gelu(h, approximate="tanh")
            y = torch.addmm(b2, a, w2.t())
            for _ in range(reps - 1):
                y = torch.addmm(b2, a, w2.t())
            return y, h

    @mlp_fwd.register_fake
    def _(x, w1, b1, w2, b2, reps, label):
        return x.new_empty(x.shape[0], w2.shape[0]), x.new_empty(x.shape[0], w1.shape[0])

    @custom_op("slo_faults::mlp_bwd", mutates_args=(), schema="(Tensor gy, Tensor x, Tensor w1, Tensor w2, Tensor h, int reps, str label) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
    def mlp_bwd(gy, x, w1, w2, h, reps, label):
        with label_ctx(label):
            gy = gy.contiguous()
            a = F.gelu(h, approximate="tanh")
            dw2 = gy.t().mm(a)
            da = gy.mm(w2)
            for _ in range(reps - 1):
                dw2 = gy.t().mm(a)
                da = gy.mm(w2)
            db2 = gy.sum(0)
            dh = torch.ops.aten.gelu_backward(da, h, approximate="tanh")
            dw1 = dh.t().mm(x)
            dx = dh.mm(w1)
            for _ in range(reps - 1):
                dw1 = dh.t().mm(x)
                dx = dh.mm(w1)
            db1 = dh.sum(0)
            return dx, dw1, db1, dw2, db2

    @mlp_bwd.register_fake
    def _(gy, x, w1, w2, h, reps, label):
        return (torch.empty_like(x), torch.empty_like(w1), w1.new_empty(w1.shape[0]),
                torch.empty_like(w2), w2.new_empty(w2.shape[0]))

    def mlp_setup(ctx, inputs, output):
        x, w1, b1, w2, b2, reps, label = inputs
        _y, h = output
        ctx.save_for_backward(x, w1, w2, h)
        ctx.reps = reps
        ctx.label = label

    def mlp_backward(ctx, gy, _gh):
        x, w1, w2, h = ctx.saved_tensors
        dx, dw1, db1, dw2, db2 = mlp_bwd(gy, x, w1, w2, h, ctx.reps, ctx.label)
        return dx, dw1, db1, dw2, db2, None, None

    mlp_fwd.register_autograd(mlp_backward, setup_context=mlp_setup)

    # --- the extra kernel: a fixed-size matmul whose result is used negligibly
    @custom_op("slo_faults::extra_mm", mutates_args=(), schema="(Tensor a, Tensor b, str label) -> Tensor")
    def extra_mm(a, b, label):
        with label_ctx(label):
            c = torch.mm(a, b)
            return c[:1, :1].float().reshape(1) * 1e-30

    @extra_mm.register_fake
    def _(a, b, label):
        return a.new_empty(1, dtype=torch.float32)

    # --- the host synchronisation
    @custom_op("slo_faults::sync_point", mutates_args=(), schema="(Tensor x, str label) -> Tensor")
    def sync_point(x, label):
        if x.is_cuda:
            torch.cuda.synchronize()
        with label_ctx(label):
            return torch.zeros(1, device=x.device, dtype=x.dtype)

    @sync_point.register_fake
    def _(x, label):
        return x.new_empty(1)

    # --- the Triton GELU (low_occupancy): cfg 0 = normal launch, 1 = low occupancy on `grid` programs
    @custom_op("slo_faults::act_fwd", mutates_args=(), schema="(Tensor x, int cfg, int grid, str label) -> Tensor")
    def act_fwd(x, cfg, grid, label):
        with label_ctx(label):
            if TRITON_ERR is not None or not x.is_cuda:
                return F.gelu(x, approximate="tanh")
            x = x.contiguous()
            y = torch.empty_like(x)
            _launch_gelu("fwd", (x, y), x.numel(), cfg, grid)
            return y

    @act_fwd.register_fake
    def _(x, cfg, grid, label):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @custom_op("slo_faults::act_bwd", mutates_args=(), schema="(Tensor g, Tensor x, int cfg, int grid, str label) -> Tensor")
    def act_bwd(g, x, cfg, grid, label):
        with label_ctx(label):
            if TRITON_ERR is not None or not x.is_cuda:
                return torch.ops.aten.gelu_backward(g, x, approximate="tanh")
            g = g.contiguous()
            x = x.contiguous()
            dx = torch.empty_like(x)
            _launch_gelu("bwd", (g, x, dx), x.numel(), cfg, grid)
            return dx

    @act_bwd.register_fake
    def _(g, x, cfg, grid, label):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    def act_setup(ctx, inputs, output):
        x, cfg, grid, label = inputs
        ctx.save_for_backward(x)
        ctx.cfg, ctx.grid, ctx.label = cfg, grid, label

    def act_backward(ctx, g):
        (x,) = ctx.saved_tensors
        return act_bwd(g, x, ctx.cfg, ctx.grid, ctx.label), None, None, None

    act_fwd.register_autograd(act_backward, setup_context=act_setup)
    OPS.update(mlp_fwd=mlp_fwd, mlp_bwd=mlp_bwd, extra_mm=extra_mm, sync_point=sync_point, act_fwd=act_fwd, act_bwd=act_bwd)


# ---------------------------------------------------------------------------------------------
# Fault sites: modules whose behaviour an attribute switches (a Dynamo guard under compile)


def fault_modules():
    class LabelledMLP(nn.Module):
        """An MLP computed by a labelled custom op; variant "more_work" does its matmuls 3x."""
        fault_site = "more_work"

        def __init__(self, d: int, hidden: int):
            super().__init__()
            self.fc = nn.Linear(d, hidden)
            self.proj = nn.Linear(hidden, d)
            self.label = ""
            self.variant = "normal"

        def forward(self, x):
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            reps = MORE_WORK_REPS if self.variant == "more_work" else 1
            y, _h = OPS["mlp_fwd"](x2, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias, reps, self.label)
            return y.reshape(shape)

    class ExtraKernel(nn.Module):
        """Adds a fixed-size matmul (result scaled by 1e-30) when enabled."""
        fault_site = "extra_kernel"

        def __init__(self, dtype):
            super().__init__()
            self.label = ""
            self.enabled = False
            self.dtype = dtype
            self.register_buffer("a", torch.zeros(1, 1, dtype=dtype), persistent=False)
            self.register_buffer("b", torch.zeros(1, 1, dtype=dtype), persistent=False)

        def resize(self, n: int, device) -> None:
            g = torch.Generator(device="cpu").manual_seed(7)
            self.a = (torch.randn(n, n, generator=g) / math.sqrt(n)).to(device=device, dtype=self.dtype)
            self.b = (torch.randn(n, n, generator=g) / math.sqrt(n)).to(device=device, dtype=self.dtype)

        def forward(self, x):
            if not self.enabled:
                return x
            return x + OPS["extra_mm"](self.a, self.b, self.label).to(x.dtype)

    class SyncPoint(nn.Module):
        """torch.cuda.synchronize() in forward when enabled, then a small kernel of its own."""
        fault_site = "host_sync"

        def __init__(self):
            super().__init__()
            self.label = ""
            self.enabled = False

        def forward(self, x):
            if not self.enabled:
                return x
            return x + OPS["sync_point"](x.detach(), self.label)

    class TritonAct(nn.Module):
        """GELU (tanh) by a Triton kernel; variant "low_occupancy" launches it 1 warp per block."""
        fault_site = "low_occupancy"

        def __init__(self):
            super().__init__()
            self.label = ""
            self.variant = "normal"
            self.grid_low = 132
            self.last_numel = 0

        def forward(self, x):
            if not torch.compiler.is_compiling():
                self.last_numel = x.numel()
            cfg = 1 if self.variant == "low_occupancy" else 0
            return OPS["act_fwd"](x, cfg, self.grid_low, self.label)

    return LabelledMLP, ExtraKernel, SyncPoint, TritonAct


def build_gpt(cfg: Dict[str, int], dtype, sites):
    LabelledMLP, ExtraKernel, SyncPoint, TritonAct = sites
    d, h, L, V, T = cfg["d"], cfg["heads"], cfg["layers"], cfg["vocab"], cfg["seq"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.extra = None

        def forward(self, x):
            B, Tq, C = x.shape
            q, k, v = self.qkv(x).split(C, dim=2)
            q = q.view(B, Tq, h, C // h).transpose(1, 2)
            k = k.view(B, Tq, h, C // h).transpose(1, 2)
            v = v.view(B, Tq, h, C // h).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = self.proj(y.transpose(1, 2).contiguous().view(B, Tq, C))
            if self.extra is not None:
                y = self.extra(y)
            return y

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(d, 4 * d)
            self.act = nn.GELU(approximate="tanh")
            self.proj = nn.Linear(4 * d, d)

        def forward(self, x):
            return self.proj(self.act(self.fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(d)
            self.mlp = MLP()
            self.sync = None

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            if self.sync is not None:
                x = self.sync(x)
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, d)
            self.wpe = nn.Embedding(T, d)
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, V, bias=False)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    m = GPT()
    site = lambda i: m.blocks[min(i, L - 1)]  # noqa: E731
    site(1).mlp = LabelledMLP(d, 4 * d)
    site(2).attn.extra = ExtraKernel(dtype)
    site(2).mlp.act = TritonAct()
    site(3).sync = SyncPoint()
    return m


def build_convnet(cfg: Dict[str, int], dtype, sites):
    _LabelledMLP, ExtraKernel, SyncPoint, TritonAct = sites
    w, classes = cfg["width"], cfg["classes"]

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.act1 = nn.ReLU()
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            self.extra = None
            self.sync = None

        def forward(self, x):
            out = self.act1(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.extra is not None:
                out = self.extra(out)
            idn = x if self.down is None else self.down(x)
            out = F.relu(out + idn)
            if self.sync is not None:
                out = self.sync(out)
            return out

    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            chans = [w, 2 * w, 4 * w, 8 * w]
            layers, cin = [], w
            for i, c in enumerate(chans):
                stride = 1 if i == 0 else 2
                layers.append(nn.Sequential(BasicBlock(cin, c, stride), BasicBlock(c, c, 1)))
                cin = c
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.fc = nn.Linear(cin, classes)
            self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255, persistent=False)
            self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255, persistent=False)

        def forward(self, images, labels):
            x = (images.to(self.mean.dtype) - self.mean) / self.std
            x = self.stem(x)
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
            return F.cross_entropy(logits.float(), labels)

    m = ConvNet()
    m.layer1[0].act1 = TritonAct()
    m.layer3[0].extra = ExtraKernel(dtype)
    m.layer4[0].sync = SyncPoint()
    return m


def find_sites(model) -> Dict[str, Any]:
    """Fault-site modules by kind, each given its qualified name as label."""
    sites: Dict[str, Any] = {}
    for name, mod in model.named_modules():
        kind = getattr(type(mod), "fault_site", None)
        if kind:
            mod.label = name
            sites[kind] = mod
    return sites


SIZES = {
    ("gpt", "launch"): dict(batch=4, seq=128, d=256, heads=4, layers=4, vocab=8192),
    ("gpt", "gpu"): dict(batch=64, seq=512, d=1024, heads=16, layers=4, vocab=8192),
    ("convnet", "launch"): dict(batch=16, image=64, width=32, classes=100),
    ("convnet", "gpu"): dict(batch=1024, image=160, width=64, classes=1000),
    ("gpt", "dry"): dict(batch=2, seq=16, d=32, heads=2, layers=4, vocab=128),
    ("convnet", "dry"): dict(batch=4, image=32, width=8, classes=10),
}

# ---------------------------------------------------------------------------------------------
# Data: DataLoader workers make batches; a pin-memory thread copies them into pinned buffers


def make_datasets():
    from torch.utils.data import Dataset, Sampler

    class Forever(Sampler):
        def __init__(self):  # noqa: D401 - no data source
            pass

        def __iter__(self):
            i = 0
            while True:
                yield i
                i += 1

    def shared_empty(shape, dtype):
        """A tensor allocated in shared memory in a worker (as default_collate does), so that
        handing it to the main process copies nothing."""
        numel = 1
        for s in shape:
            numel *= s
        if torch.utils.data.get_worker_info() is not None:
            try:
                proto = torch.empty(0, dtype=dtype)
                storage = proto._typed_storage()._new_shared(numel, device="cpu")
                return proto.new(storage).resize_(*shape)
            except Exception:
                pass
        return torch.empty(*shape, dtype=dtype)

    class Stats:
        """Per-worker CPU seconds and batches, in shared memory."""

        def __init__(self, workers: int):
            import multiprocessing as mp
            self.arr = mp.Array("d", 2 * max(1, workers), lock=False)
            self.work = mp.Value("i", 1, lock=False)

        def add(self, cpu_s: float) -> None:
            info = torch.utils.data.get_worker_info()
            w = info.id if info is not None else 0
            self.arr[2 * w] += cpu_s
            self.arr[2 * w + 1] += 1

        def snapshot(self) -> Tuple[float, float]:
            vals = list(self.arr)
            return sum(vals[0::2]), sum(vals[1::2])

    class TokenData(Dataset):
        """Token batches from an n-gram hashing tokenizer over synthetic text; `work` = n."""

        def __init__(self, B, T, V, seed, stats):
            self.B, self.T, self.V, self.seed, self.stats = B, T, V, seed, stats
            g = torch.Generator().manual_seed(seed)
            n = max(1 << 20, 8 * B * (T + 1))
            # "text": bytes with some structure (runs of a drifting alphabet)
            base = torch.randint(0, 64, (n + 4096,), generator=g, dtype=torch.int64)
            drift = torch.randint(0, 4, (n + 4096,), generator=g, dtype=torch.int64).cumsum(0) % 192
            self.text = (base + drift).to(torch.uint8)
            self.n = n

        def __len__(self):
            return 1 << 62

        def __getitem__(self, i):
            t0 = time.thread_time()
            out = self.make(i, max(1, int(self.stats.work.value)))
            self.stats.add(time.thread_time() - t0)
            return out

        def make(self, i, k):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(i))
            starts = torch.randint(0, self.n - (self.T + 1) - min(k, 4000), (self.B,), generator=g)
            idx = starts[:, None] + torch.arange(self.T + 1)[None, :]
            h = torch.zeros(self.B, self.T + 1, dtype=torch.int64)
            for j in range(k):
                h = (h * 257 + self.text[idx + (j % 4000)].to(torch.int64)) % 1_000_000_007
            tok = h % self.V
            x = shared_empty((self.B, self.T), torch.int64)
            y = shared_empty((self.B, self.T), torch.int64)
            x.copy_(tok[:, :-1])
            y.copy_(tok[:, 1:])
            return x, y

    class ImageData(Dataset):
        """uint8 image batches: random crops (and flips) out of a pool of "decoded" images, plus
        `work` passes of brightness jitter over a 4 MiB slice (the decode cost knob)."""

        def __init__(self, B, S, classes, seed, stats):
            self.B, self.S, self.classes, self.seed, self.stats = B, S, classes, seed, stats
            g = torch.Generator().manual_seed(seed)
            self.pad = max(2, S // 8)
            P = 48
            lo = torch.randint(0, 256, (P, 3, (S + self.pad) // 8 + 1, (S + self.pad) // 8 + 1), generator=g).float()
            img = F.interpolate(lo, size=(S + self.pad, S + self.pad), mode="bilinear", align_corners=False)
            noise = torch.randint(-20, 21, img.shape, generator=g).float()
            self.pool = (img + noise).clamp(0, 255).to(torch.uint8)

        def __len__(self):
            return 1 << 62

        def __getitem__(self, i):
            t0 = time.thread_time()
            out = self.make(i, max(0, int(self.stats.work.value)))
            self.stats.add(time.thread_time() - t0)
            return out

        def make(self, i, k):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(i))
            B, S, pad = self.B, self.S, self.pad
            pick = torch.randint(0, self.pool.shape[0], (B,), generator=g).tolist()
            oy = torch.randint(0, pad + 1, (B,), generator=g).tolist()
            ox = torch.randint(0, pad + 1, (B,), generator=g).tolist()
            flip = torch.randint(0, 4, (B,), generator=g).tolist()
            out = shared_empty((B, 3, S, S), torch.uint8)
            for b in range(B):
                crop = self.pool[pick[b], :, oy[b]:oy[b] + S, ox[b]:ox[b] + S]
                if flip[b] == 0:
                    crop = crop.flip(-1)
                out[b].copy_(crop)
            flat = out.view(-1)
            chunk = min(flat.numel(), 4 << 20)
            for j in range(k):
                off = (j * 7919 * 4096) % max(1, flat.numel() - chunk + 1)
                flat[off:off + chunk].add_(1)
            labels = shared_empty((B,), torch.int64)
            labels.copy_(torch.randint(0, self.classes, (B,), generator=g))
            return out, labels

    return Forever, Stats, TokenData, ImageData


class Slot:
    """One pinned buffer pair; `free` is set once the main thread has issued its copy."""

    def __init__(self, x, y):
        self.x, self.y = x, y
        self.event = None
        self.free = threading.Event()
        self.free.set()


class Pinner(threading.Thread):
    """The pin-memory thread (named pt_data_pin like PyTorch's): takes batches from the
    DataLoader, copies them into a ring of pinned buffers (a buffer is reused only after the
    GPU has read it), queues them for the main thread. With `pageable` set it queues the
    DataLoader's (pageable, shared-memory) batches as they are."""

    def __init__(self, it, device, depth: int, cpu: int, pinned: bool):
        super().__init__(name="pt_data_pin", daemon=True)
        self.it, self.device, self.cpu, self.pinned = it, device, cpu, pinned
        self.q: "queue.Queue[Any]" = queue.Queue(maxsize=depth)
        self.ring: List[Slot] = []
        self.ring_n = depth + 2
        self.pageable = False
        self.stop_flag = False
        self.error: Optional[str] = None
        self.cpu_s = 0.0
        self.batches = 0

    def run(self):
        set_thread_name("pt_data_pin")
        if self.cpu >= 0:
            pin_thread([self.cpu])
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        j = 0
        try:
            while not self.stop_flag:
                x, y = next(self.it)
                t0 = time.thread_time()
                if self.pageable or not self.pinned:
                    item = ("pageable", x, y, None)
                else:
                    if len(self.ring) < self.ring_n:
                        self.ring.append(Slot(torch.empty(x.shape, dtype=x.dtype).pin_memory(),
                                              torch.empty(y.shape, dtype=y.dtype).pin_memory()))
                    s = self.ring[j % self.ring_n]
                    j += 1
                    s.free.wait()
                    if s.event is not None:
                        s.event.synchronize()
                    s.free.clear()
                    s.x.copy_(x)
                    s.y.copy_(y)
                    item = ("pinned", s.x, s.y, s)
                self.cpu_s += time.thread_time() - t0
                self.batches += 1
                while not self.stop_flag:
                    try:
                        self.q.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            self.q.put(("error", None, None, None))

    def get(self, timeout: float = 60.0):
        item = self.q.get(timeout=timeout)
        if item[0] == "error":
            raise RuntimeError(f"pin-memory thread failed: {self.error}")
        return item


# ---------------------------------------------------------------------------------------------
# Busy processes, cgroup, netem: the host-side faults


class BusyPool:
    """Stopped busy loops pinned to one CPU, resumed (SIGCONT) at a fault's onset and stopped
    again (SIGSTOP) at its end: both take effect at once. Each loop exits when the job dies."""

    def __init__(self, cpu: int, n: int, cgroup: str):
        self.cpu, self.pids = cpu, []
        me = os.getpid()
        env = {k: v for k, v in os.environ.items() if k not in ("CUDA_INJECTION64_PATH", "SLO_PROBE_SHIM")}
        script = f"kill -STOP $$; while kill -0 {me} 2>/dev/null; do :; done"
        for _ in range(n):
            cmd = ["sh", "-c", script]
            if shutil.which("taskset"):
                cmd = ["taskset", "-c", str(cpu)] + cmd
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True, env=env)
            self.pids.append(p)
            if cgroup:
                try:
                    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                        f.write(str(p.pid))
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for p in self.pids:
            while time.monotonic() < deadline and proc_state(p.pid) not in ("T", "t", "Z", "?"):
                time.sleep(0.005)

    def resume(self, k: int) -> List[int]:
        out = []
        for p in self.pids[:k]:
            try:
                os.kill(p.pid, signal.SIGCONT)
                out.append(p.pid)
            except OSError:
                pass
        return out

    def pause(self) -> None:
        for p in self.pids:
            try:
                os.kill(p.pid, signal.SIGSTOP)
            except OSError:
                pass

    def kill(self) -> None:
        for p in self.pids:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except OSError:
                pass
        for p in self.pids:
            try:
                p.wait(timeout=2)
            except Exception:
                pass


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def read_file(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_stat(cgroup: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for line in (read_file(os.path.join(cgroup, "cpu.stat")) or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def nvml_clocks() -> Dict[str, Any]:
    """SM/memory clocks and throttle reasons as NVML reports them (pynvml, else nvidia-smi)."""
    try:
        import pynvml  # type: ignore
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out = {
            "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        }
        try:
            out["reasons"] = int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
        except Exception:
            pass
        return out
    except Exception:
        rc, text = run_cmd(["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm",
                            "--format=csv,noheader,nounits"], timeout=10)
        if rc == 0 and text:
            parts = [x.strip() for x in text.splitlines()[0].split(",")]
            try:
                return {"sm_mhz": int(parts[0]), "mem_mhz": int(parts[1]), "max_sm_mhz": int(parts[2])}
            except (ValueError, IndexError):
                pass
        return {"error": text}


# ---------------------------------------------------------------------------------------------
# The job


class Job:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.segments = parse_schedule(a)
        self.kinds = {s["kind"] for s in self.segments}
        self.t_start = mono_ns()
        self.deadline = self.t_start + int(a.budget_s * 1e9) if a.budget_s > 0 else None
        self.pid = os.getpid()
        self.rank = int(os.environ.get("RANK", "0")) if a.ddp else 0
        self.world = int(os.environ.get("WORLD_SIZE", "1")) if a.ddp else 1
        self.pids = [self.pid]
        self.steps: List[List[int]] = []
        self.steps_flushed = 0
        self.seg_name = "warmup"
        self.warm = True
        self.errors: List[str] = []
        self.calib: Dict[str, Any] = {}
        self.cleanups: List[Any] = []
        self.busy_main: Optional[BusyPool] = None
        self.busy_loader: List[BusyPool] = []
        self.opt_sync = False
        self.netem_on = False
        self.cpu_max_orig: Optional[str] = None
        self.compile_info: Dict[str, Any] = {}
        self.loader_cpus = cpu_list(a.loader_cpus)
        self.helper_cpus = cpu_list(a.helper_cpus)
        self.stop_step: Optional[int] = None
        self.step_idx = 0
        self.seg_code = -1  # warm-up; 0 = recovery; k >= 1: seg_names[k]
        self.seg_names: List[str] = ["recovery"]
        self.pageable_first_ns: Optional[int] = None
        self.loader_mark: Optional[Tuple[int, float]] = None
        self.last_loss: Optional[float] = None
        self.dist = None
        self.cuda = False

    # --- bookkeeping ---------------------------------------------------------------------
    def time_left(self) -> float:
        return math.inf if self.deadline is None else (self.deadline - mono_ns()) / 1e9

    def write_answer(self, ans: Dict[str, Any]) -> None:
        log("answer: " + json.dumps({k: ans.get(k) for k in ("kind", "status", "onset_ns", "end_ns", "reason") if k in ans}))
        if not self.a.answers or self.rank != 0:
            return
        with open(self.a.answers, "a") as f:
            f.write(json.dumps(ans, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def flush_steps(self, final: bool = False) -> None:
        if not self.a.steps_out:
            return
        new = self.steps[self.steps_flushed:]
        if not new and not final:
            return
        with open(self.a.steps_out, "a") as f:
            f.write(json.dumps({"pid": self.pid, "rank": self.rank, "label": self.a.label,
                                "fields": ["step", "begin_ns", "end_ns", "warmup", "segment", "host_wait_ns"],
                                "steps": new, "final": final}) + "\n")
        self.steps_flushed = len(self.steps)

    # --- setup -----------------------------------------------------------------------------
    def setup(self) -> None:
        a = self.a
        import_torch()
        self.cuda = torch.cuda.is_available() and not a.dry_run
        if not self.cuda and not a.dry_run:
            raise SystemExit("no CUDA device (use --dry-run to run on the CPU)")
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        torch.manual_seed(a.seed + self.rank)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        if self.cuda:
            torch.cuda.set_device(self.device)
        torch.set_num_threads(1 if a.main_cpu >= 0 else torch.get_num_threads())
        if self.cuda:
            load_triton()
        else:
            global TRITON_ERR
            TRITON_ERR = "dry run (CPU)"
        register_ops()
        size = "dry" if a.dry_run else a.size
        self.cfg = dict(SIZES[(a.model, size)])
        if a.batch:
            self.cfg["batch"] = a.batch
        for kv in a.set:
            k, _, v = kv.partition("=")
            if k not in self.cfg:
                raise SystemExit(f"--set {kv}: {a.model} has no setting {k!r} (settings: {', '.join(self.cfg)})")
            self.cfg[k] = int(v)
        sites = fault_modules()
        model = build_gpt(self.cfg, self.dtype, sites) if a.model == "gpt" else build_convnet(self.cfg, self.dtype, sites)
        model = model.to(device=self.device, dtype=self.dtype)
        if a.model == "convnet":
            model.mean.data = model.mean.data.to(self.dtype)
            model.std.data = model.std.data.to(self.dtype)
        self.model = model
        self.sites = find_sites(model)
        self.labels = {k: m.label for k, m in self.sites.items()}
        log(f"model {a.model} {size}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
            f"config {self.cfg}, fault sites {self.labels}, triton: {TRITON_ERR or 'ok'}")
        if a.ddp:
            import datetime
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
            self.dist = dist
            mine = torch.tensor([self.pid], dtype=torch.int64)
            gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
            dist.all_gather(gathered, mine)  # CPU tensors over gloo
            self.pids = [int(t.item()) for t in gathered]
            log(f"ddp: rank {self.rank} of {self.world}, pids {self.pids}")
            self.train_model = DDP(model, device_ids=[0] if self.cuda else None)
            self.stop_file = a.stop_file or f"/tmp/slo-faults-stop-{os.environ.get('MASTER_PORT', '0')}"
            if self.rank == 0 and os.path.exists(self.stop_file):
                os.unlink(self.stop_file)
            dist.barrier()
        else:
            self.dist = None
            self.train_model = model
        fused = self.cuda
        try:
            self.opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=fused)
        except (TypeError, RuntimeError):
            self.opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        if a.mode == "eager":
            self.handle = slo_probe.instrument(model)
        self.fwd = self.train_model
        self.setup_data()
        self.setup_busy()

    def setup_data(self) -> None:
        a = self.a
        Forever, Stats, TokenData, ImageData = make_datasets()
        W = max(0, a.workers)
        self.stats = Stats(W)
        B = self.cfg["batch"]
        if a.model == "gpt":
            ds = TokenData(B, self.cfg["seq"], self.cfg["vocab"], a.seed * 10 + self.rank, self.stats)
            self.stats.work.value = 8
        else:
            ds = ImageData(B, self.cfg["image"], self.cfg["classes"], a.seed * 10 + self.rank, self.stats)
            self.stats.work.value = 0
        loader_cpus = self.loader_cpus

        def worker_init(wid: int) -> None:
            torch.set_num_threads(1)
            if loader_cpus:
                cpu = loader_cpus[wid % len(loader_cpus)]
                for tid in os.listdir("/proc/self/task"):
                    try:
                        os.sched_setaffinity(int(tid), {cpu})
                    except OSError:
                        pass

        from torch.utils.data import DataLoader
        kw: Dict[str, Any] = dict(batch_size=None, sampler=Forever(), num_workers=W, pin_memory=False)
        if W > 0:
            kw.update(persistent_workers=True, prefetch_factor=2, worker_init_fn=worker_init, multiprocessing_context="fork")
        self.loader = DataLoader(ds, **kw)
        self.loader_it = iter(self.loader)
        self.pinner = Pinner(self.loader_it, self.device, depth=2, cpu=a.pin_cpu, pinned=self.cuda)
        self.pinner.start()
        log(f"data: {W} workers on CPUs {loader_cpus or 'any'}, pin-memory thread on CPU {a.pin_cpu if a.pin_cpu >= 0 else 'any'}")

    def setup_busy(self) -> None:
        a = self.a
        if "cpu_contention" in self.kinds and a.main_cpu >= 0:
            n = a.busy_main or 24
            self.busy_main = BusyPool(a.main_cpu, n, a.busy_cgroup)
            log(f"busy: {n} stopped loops on CPU {a.main_cpu} (main)")
        if "loader_starvation" in self.kinds and self.loader_cpus:
            n = a.busy_loader or 16
            self.busy_loader = [BusyPool(c, n, a.busy_cgroup) for c in self.loader_cpus]
            log(f"busy: {n} stopped loops on each loader CPU {self.loader_cpus}")

    # --- one iteration ---------------------------------------------------------------------
    def mark_step(self) -> Any:
        """``slo_probe.step()``, or with ``--markers none`` the step's index and no marker."""
        if self.a.markers == "none":
            return contextlib.nullcontext(self.step_idx)
        return slo_probe.step()

    def step(self) -> None:
        a = self.a
        t_begin = mono_ns()
        wait = 0
        with self.mark_step() as idx:
            tq = mono_ns()
            kind, x, y, slot = self.pinner.get()
            wait += mono_ns() - tq
            if kind == "pageable" and self.pageable_first_ns is None and self.pinner.pageable:
                self.pageable_first_ns = mono_ns()
            with slo_probe.op("data_to_device"):
                xd = x.to(self.device, non_blocking=True)
                yd = y.to(self.device, non_blocking=True)
                if slot is not None:
                    if self.cuda:
                        ev = torch.cuda.Event()
                        ev.record()
                        slot.event = ev
                    slot.free.set()
            if a.mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            loss = self.fwd(xd, yd)
            loss.backward()
            if self.opt_sync and self.cuda:
                torch.cuda.synchronize()
            with slo_probe.op("optimizer"):
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            if a.log_every and idx % a.log_every == 0:
                tq = mono_ns()
                self.last_loss = float(loss.detach())
                wait += mono_ns() - tq
        t_end = mono_ns()
        seg = self.seg_code
        self.steps.append([int(idx), t_begin, t_end, 1 if self.warm else 0, seg, wait])
        self.step_idx = int(idx) + 1
        if len(self.steps) - self.steps_flushed >= 2000:
            self.flush_steps()

    def steps_n(self, n: int, what: str) -> float:
        """n warm-up steps; returns the median host step time in ms."""
        t = []
        for _ in range(n):
            t0 = mono_ns()
            self.step()
            t.append((mono_ns() - t0) / 1e6)
        t.sort()
        med = t[len(t) // 2] if t else 0.0
        log(f"{what}: {n} steps, median {med:.2f} ms, max {max(t) if t else 0:.1f} ms")
        return med

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def measured_step_ms(self, n: int) -> float:
        """Median step time over n steps with the device synchronised after each (calibration)."""
        t = []
        for _ in range(n):
            self.sync()
            t0 = mono_ns()
            self.step()
            self.sync()
            t.append((mono_ns() - t0) / 1e6)
        t.sort()
        return t[len(t) // 2]

    # --- calibration -----------------------------------------------------------------------
    def time_ms(self, fn, reps: int = 5) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) * 1e3 / reps
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / reps

    def calibrate_gpu_faults(self, step_ms: float) -> None:
        a = self.a
        target = max(a.gpu_fault_ms, a.gpu_fault_frac * step_ms)
        self.calib["gpu_fault_target_ms"] = round(target, 3)
        self.calib["eager_step_ms"] = round(step_ms, 3)
        if "extra_kernel" in self.kinds and "extra_kernel" in self.sites:
            n, t = 2048, 0.0
            tries = []
            for _ in range(5):
                A = torch.randn(n, n, device=self.device, dtype=self.dtype)
                Bm = torch.randn(n, n, device=self.device, dtype=self.dtype)
                t = self.time_ms(lambda: torch.mm(A, Bm), reps=3)
                tries.append((n, round(t, 3)))
                del A, Bm
                if t > 0 and abs(t - target) / target < 0.15:
                    break
                n = int(max(256, min(32768, n * (target / max(t, 1e-3)) ** (1 / 3))) // 128 * 128)
            self.sites["extra_kernel"].resize(n, self.device)
            self.calib["extra_kernel"] = {"n": n, "ms": round(t, 3), "tries": tries}
            log(f"calibration: extra kernel {n}x{n} matmul, {t:.2f} ms (target {target:.2f} ms)")
        if "low_occupancy" in self.kinds and "low_occupancy" in self.sites:
            act = self.sites["low_occupancy"]
            if TRITON_ERR is not None:
                self.calib["low_occupancy"] = {"error": TRITON_ERR}
                return
            numel = act.last_numel or 1 << 20
            x = torch.randn(numel, device=self.device, dtype=self.dtype)
            g = torch.randn(numel, device=self.device, dtype=self.dtype)

            def both(cfg, grid):
                return lambda: (OPS["act_fwd"](x, cfg, grid, ""), OPS["act_bwd"](g, x, cfg, grid, ""))

            t_norm = self.time_ms(both(0, 0), reps=5)
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            chosen, tries = None, []
            for m in (64, 32, 16, 8, 4, 2, 1):
                grid = sms * m
                t_low = self.time_ms(both(1, grid), reps=2)
                tries.append((grid, round(t_low, 3)))
                chosen = grid
                if t_low - t_norm >= 0.8 * target:
                    break
                if t_low > 20 * target:
                    break
            act.grid_low = int(chosen)
            self.calib["low_occupancy"] = {"numel": numel, "normal_ms": round(t_norm, 3), "grid": act.grid_low,
                                           "tries": tries, "normal": [NORMAL_BLOCK, NORMAL_WARPS],
                                           "low": [LOW_BLOCK, LOW_WARPS], "sms": sms}
            log(f"calibration: low occupancy grid {act.grid_low} (fwd+bwd normal {t_norm:.3f} ms; tries {tries})")
            del x, g

    def calibrate_loader(self, step_ms: float) -> None:
        """Sets the loader's work (n-gram length / jitter passes) so that the workers spend
        --loader-util of their time making batches, from two timings of a batch in this process."""
        a = self.a
        W = max(1, a.workers)
        ds = self.loader.dataset
        lo, hi = (4, 36) if a.model == "gpt" else (0, 8)

        def t_batch(k: int) -> float:
            best = math.inf
            for r in range(2):
                t0 = time.thread_time()
                ds.make(10_000_000 + r, k)
                best = min(best, time.thread_time() - t0)
            return best * 1e3

        # The work's cost per unit must stand above the batch's own timing noise (a few ms on a
        # 30-80 ms convnet batch): with 8 units it did not, once (2026-12-07, H100), and a slope of
        # ~0 gave a work of 100000 units -- batches of minutes, a job that never stepped again. So
        # the second timing moves out until its difference is clear, and the result is checked.
        t_lo, t_hi = t_batch(lo), t_batch(hi)
        while t_hi - t_lo < max(5.0, 0.2 * t_lo) and hi < 1024:
            hi *= 4
            t_hi = t_batch(hi)
        slope = max(1e-3, (t_hi - t_lo) / (hi - lo))
        base = max(0.0, t_lo - slope * lo)
        target_ms = min(a.loader_util * W * step_ms, 250.0 * W)
        k_min = 1 if a.model == "gpt" else 0
        k = max(k_min, min(int(round((target_ms - base) / slope)), 16 * hi))
        if k > k_min:
            t_k = t_batch(k)
            if t_k > 1.25 * target_ms and t_k > base:
                k = max(k_min, int(k * max(0.0, target_ms - base) / (t_k - base)))
        self.stats.work.value = k
        note = ""
        if base > target_ms:
            note = f"a batch costs {base:.1f} ms at the least, above the target {target_ms:.1f} ms: the loader may bound the step"
            self.errors.append("loader: " + note)
        self.calib["loader"] = {"base_ms": round(base, 3), "ms_per_unit": round(slope, 4), "work": k, "target_ms": round(target_ms, 3),
                                "per_batch_ms": round(base + slope * k, 3), "step_ms": round(step_ms, 3), "workers": W,
                                "util_target": a.loader_util, "note": note}
        log(f"calibration: loader batch {base:.2f} ms + {slope:.4f} ms per unit; target {target_ms:.1f} ms -> work {k} {note}")

    def loader_util(self) -> Optional[float]:
        """The workers' busy share since the last call (CPU seconds over workers x wall)."""
        s, _n = self.stats.snapshot()
        now = mono_ns()
        prev, self.loader_mark = self.loader_mark, (now, s)
        if prev is None or now <= prev[0]:
            return None
        return (s - prev[1]) / (max(1, self.a.workers) * (now - prev[0]) / 1e9)

    def calibrate_clock(self) -> None:
        rc, text = run_cmd(["nvidia-smi", "-i", "0", "--query-supported-clocks=graphics", "--format=csv,noheader,nounits"], 15)
        clocks = sorted({int(x) for x in text.split() if x.strip().isdigit()}) if rc == 0 else []
        if clocks:
            want = 0.45 * clocks[-1]
            self.calib["gpu_low_clock"] = min(clocks, key=lambda c: abs(c - want))
        self.calib["gpu_supported_clocks"] = {"rc": rc, "n": len(clocks), "max": clocks[-1] if clocks else None}

    def host_measure(self, since_ns: int) -> Dict[str, float]:
        """Per-step host figures over the steps begun since `since_ns`."""
        rows = [s for s in self.steps if s[1] >= since_ns and s[3] == 0] or self.steps[-20:]
        if len(rows) < 2:
            return {}
        walls = [(rows[i + 1][1] - rows[i][1]) / 1e6 for i in range(len(rows) - 1)]
        busy = [(r[2] - r[1] - r[5]) / 1e6 for r in rows]
        walls.sort()
        busy.sort()
        return {"step_ms": walls[len(walls) // 2], "main_busy_ms": busy[len(busy) // 2], "steps": len(rows)}

    # --- compile and warm-up ------------------------------------------------------------------
    def set_variant(self, kind: Optional[str]) -> None:
        for k, m in self.sites.items():
            on = k == kind
            if k in ("more_work", "low_occupancy"):
                m.variant = k if on else "normal"
            elif k == "extra_kernel":
                m.enabled = on
            elif k == "host_sync":
                m.enabled = on and self.a.mode != "reduce-overhead"
        self.opt_sync = kind == "host_sync" and self.a.mode == "reduce-overhead"

    def compile_counters(self) -> Dict[str, Dict[str, int]]:
        try:
            from torch._dynamo.utils import counters
        except Exception:
            return {}
        out: Dict[str, Dict[str, int]] = {}
        for grp in ("stats", "frames", "aot_autograd", "recompiles", "graph_break"):
            if grp in counters:
                out[grp] = {str(k): int(v) for k, v in counters[grp].items()}
        return out

    def warmup(self) -> None:
        a = self.a
        self.set_variant(None)
        n_eager = 4 if a.dry_run else 10
        self.steps_n(3, "first steps (eager)")
        step_ms = self.measured_step_ms(n_eager)
        log(f"eager step (synchronised): {step_ms:.2f} ms")
        gpu_kinds = [k for k in VARIANT_KINDS if k in self.kinds and k in self.sites]
        if self.cuda:
            self.calibrate_gpu_faults(step_ms)
        # faults that need a site the model lacks are recorded as skipped later
        variants = [k for k in gpu_kinds if not (k == "host_sync" and a.mode == "reduce-overhead")]
        if a.mode != "eager":
            dc = torch._dynamo.config
            for name, val in (("recompile_limit", 64), ("cache_size_limit", 64), ("accumulated_recompile_limit", 512), ("accumulated_cache_size_limit", 512)):
                if hasattr(dc, name):
                    setattr(dc, name, val)
            try:
                torch._logging.set_logs(recompiles=True, graph_breaks=True)
            except Exception:
                pass
            self.fwd = torch.compile(self.train_model, mode="reduce-overhead" if a.mode == "reduce-overhead" else None)
            n = 5 if a.mode == "reduce-overhead" else 3
            t_c = mono_ns()
            for v in [None] + variants + [None]:
                if self.time_left() < 30:
                    self.errors.append(f"warm-up stopped at variant {v}: time budget")
                    break
                self.set_variant(v)
                t0 = mono_ns()
                self.steps_n(n, f"compile/capture variant {v or 'normal'}")
                self.compile_info.setdefault("variant_s", {})[v or "normal"] = round((mono_ns() - t0) / 1e9, 2)
            self.compile_info["compile_s"] = round((mono_ns() - t_c) / 1e9, 2)
            before = self.compile_counters()
            for v in variants + [None]:
                self.set_variant(v)
                self.steps_n(2, f"switch check {v or 'normal'}")
            after = self.compile_counters()
            self.compile_info["recompiled_on_switch"] = before != after
            self.compile_info["counters_after_warmup"] = after
            try:
                from torch._dynamo.utils import counters as _c
                self.compile_info["inductor"] = {str(k): int(v) for k, v in _c.get("inductor", {}).items()}
                skips = {k: v for k, v in self.compile_info["inductor"].items() if "cudagraph" in k and "skip" in k}
                if a.mode == "reduce-overhead" and any(skips.values()):
                    self.errors.append(f"CUDA graphs skipped for some graphs: {skips} (see the log's cudagraph messages)")
                    log(f"WARNING: CUDA graphs skipped: {skips}")
            except Exception:
                pass
            log(f"compile: {self.compile_info['compile_s']} s; switching variants recompiled: {before != after}")
            if before != after:
                self.errors.append(f"switching variants recompiled: {before} -> {after}")
        else:
            for v in variants:
                self.set_variant(v)
                self.steps_n(2, f"variant {v}")
        self.set_variant(None)
        step_ms = self.measured_step_ms(6)
        self.calib["step_ms"] = round(step_ms, 3)
        self.calibrate_loader(step_ms)
        if "gpu_clocks" in self.kinds and a.allow_gpu_clock_change and self.cuda:
            self.calibrate_clock()
        self.steps_n(20 if not a.dry_run else 6, "settle")
        if a.main_cpu >= 0:
            n = pin_all_threads([a.main_cpu])
            # the pin-memory thread keeps its own CPU
            log(f"pinned {n} threads of the main process to CPU {a.main_cpu}")
            if self.pinner.cpu >= 0:
                try:
                    os.sched_setaffinity(self.pinner.native_id, {self.pinner.cpu})
                except (OSError, AttributeError):
                    pass
        self.steps_n(10 if not a.dry_run else 4, "after pinning")
        self.compile_info["counters_before_run"] = self.compile_counters()

    # --- faults ------------------------------------------------------------------------------
    def expectation(self, kind: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]], str]:
        mode = self.a.mode
        lab = self.labels
        e = lambda op, dim, host: {"op": op, "dimension": dim, "host_cause": host}  # noqa: E731
        if kind == "more_work":
            return e(lab.get(kind), "execution", None), [], f"{lab.get(kind)} does its matmuls {MORE_WORK_REPS}x (forward and backward), same shapes"
        if kind == "extra_kernel":
            c = self.calib.get("extra_kernel", {})
            return e(lab.get(kind), "execution", None), [], f"{lab.get(kind)} adds a {c.get('n')}x{c.get('n')} matmul, {c.get('ms')} ms"
        if kind == "host_sync":
            if mode == "reduce-overhead":
                return (e("optimizer", "launch_latency", None), [e(LAUNCHES_OP, "launch_latency", None)],
                        "torch.cuda.synchronize() between backward and the optimizer (a sync inside a captured graph is impossible)")
            return (e(lab.get(kind), "launch_latency", None), [e(LAUNCHES_OP, "launch_latency", None)],
                    f"torch.cuda.synchronize() in {lab.get(kind)}.forward, then its own small kernel")
        if kind == "low_occupancy":
            c = self.calib.get("low_occupancy", {})
            return (e(lab.get(kind), "occupancy", None), [],
                    f"Triton GELU BLOCK={NORMAL_BLOCK}/num_warps={NORMAL_WARPS}/one program per block -> BLOCK={LOW_BLOCK}/num_warps={LOW_WARPS} on {c.get('grid')} programs")
        if kind == "pageable_copy":
            # memory operations are labelled "<op>: memcpy HtoD" (core/src/gputrace.rs)
            small = " (token batches are a few hundred KiB: expect little effect)" if self.a.model == "gpt" else ""
            return (e("data_to_device: memcpy HtoD", "memory_bandwidth", None), [e("memcpy HtoD", "memory_bandwidth", None)],
                    "batch copied host->device from pageable (shared) memory instead of the pinned ring" + small)
        if kind == "cpu_contention":
            return (e(LAUNCHES_OP, "launch_latency", "host.runqueue.main"), [e(None, "launch_latency", "host.runqueue.main")],
                    f"busy loops on the main thread's CPU {self.a.main_cpu}")
        if kind == "loader_starvation":
            return e(DATA_LOADING_OP, "data_loading", "host.runqueue.data_loader"), [], f"busy loops on the loader CPUs {self.loader_cpus}"
        if kind == "throttling":
            return (e(LAUNCHES_OP, "launch_latency", "host.throttling"), [e(DATA_LOADING_OP, "data_loading", "host.throttling")],
                    "the job's cgroup cpu.max lowered")
        if kind == "gpu_clocks":
            return e(None, "execution", "gpu.sm_clock"), [], "SM clock locked low with nvidia-smi -lgc"
        if kind == "comm_loss":
            return (e(None, "communication", "host.retransmits"), [],
                    f"{self.a.netem_loss}% TCP loss ({self.a.loss_method}) on the ranks' link ({self.a.netem}); gloo all-reduces on the CPU, so no GPU collective kernel")
        return e(None, None, None), [], ""

    def answer_base(self, kind: str) -> Dict[str, Any]:
        a = self.a
        expect, accept, notes = self.expectation(kind) if kind != "healthy" else ({"op": None, "dimension": None, "host_cause": None}, [], "healthy: no fault")
        if a.mode == "reduce-overhead" and kind in ("more_work", "extra_kernel", "low_occupancy"):
            # graph launches traced at graph level are labelled graph#<id> (the op active at the
            # launch, none here); the module's name shows only with node-level (diagnostic) tracing
            accept = accept + [dict(expect, op="graph#*")]
            notes += "; inside the CUDA graph: graph-level records say graph#<id>, node-level (diagnostic) records name the module"
        return {
            "kind": kind, "pid": self.pid, "rank": self.rank, "world": self.world, "model": a.model, "mode": a.mode,
            "size": "dry" if a.dry_run else a.size, "label": a.label, "markers": a.markers, "expect": expect, "accept": accept, "notes": notes,
            "job": {"main_cpu": a.main_cpu, "pin_cpu": a.pin_cpu, "loader_cpus": self.loader_cpus, "workers": a.workers,
                    "cgroup": a.cgroup, "pids": self.pids, "batch": self.cfg.get("batch")},
        }

    def skip(self, kind: str, reason: str, seg: Optional[Dict[str, Any]] = None) -> None:
        for r, pid in enumerate(self.pids):
            ans = self.answer_base(kind)
            ans.update(status="skipped", reason=reason, onset_ns=None, end_ns=None, pid=pid, rank=r)
            self.write_answer(ans)

    def can_run(self, kind: str) -> Optional[str]:
        """None when the fault can run here, else why not."""
        a = self.a
        if kind in VARIANT_KINDS and kind not in self.sites:
            return f"the {a.model} model has no {kind} site"
        if kind == "low_occupancy" and TRITON_ERR is not None:
            return f"no Triton kernel: {TRITON_ERR}"
        if kind == "host_sync" and not self.cuda:
            return "no CUDA (dry run): nothing to synchronise"
        if kind == "pageable_copy" and not self.cuda:
            return "no CUDA (dry run): no pinned memory"
        if kind == "cpu_contention" and self.busy_main is None:
            return "no --main-cpu: the main thread is not pinned"
        if kind == "loader_starvation" and not self.busy_loader:
            return "no --loader-cpus: the workers are not pinned"
        if kind == "throttling":
            if not a.cgroup:
                return "no --cgroup: the job is not in a cgroup of its own"
            if read_file(os.path.join(a.cgroup, "cpu.max")) is None:
                return f"{a.cgroup}/cpu.max is not there (cpu controller not enabled for this cgroup)"
        if kind == "gpu_clocks":
            if not a.allow_gpu_clock_change:
                return ("changing GPU clocks is forbidden on the lent device machines (no nvidia-smi -lgc); "
                        "run with --allow-gpu-clock-change on a machine of your own")
            if not shutil.which("nvidia-smi"):
                return "no nvidia-smi"
        if kind == "comm_loss":
            if not a.ddp or self.world < 2:
                return "needs --ddp with 2 ranks"
            if not a.netem:
                return "no --netem link given"
        return None

    def start_fault(self, kind: str) -> Dict[str, Any]:
        """Injects the fault now (a step boundary). Returns its state: onset_ns, params, and an
        Async for faults applied by a helper command."""
        a = self.a
        st: Dict[str, Any] = {"kind": kind, "params": {}, "async": None}
        hm = self.host_measure(mono_ns() - int(5e9))
        st["params"]["host_before"] = hm
        if kind in VARIANT_KINDS:
            self.set_variant(kind)
        elif kind == "pageable_copy":
            self.pageable_first_ns = None
            self.pinner.pageable = True
        elif kind == "cpu_contention":
            step, busy = hm.get("step_ms", 50.0), max(0.05, hm.get("main_busy_ms", 5.0))
            k = a.busy_main or int(min(len(self.busy_main.pids), max(2, math.ceil(2 * step / busy) - 1)))
            st["params"].update(busy=k, cpu=a.main_cpu, pids=self.busy_main.resume(k))
        elif kind == "loader_starvation":
            s, n = self.stats.snapshot()
            st["loader_snapshot"] = (s, n)
            util = self.loader_util()
            util = min(0.95, max(0.05, util if util is not None else a.loader_util))
            k = a.busy_loader or int(min(len(self.busy_loader[0].pids), max(2, math.ceil(2 / util) - 1)))
            pids = []
            for pool in self.busy_loader:
                pids += pool.resume(k)
            st["params"].update(busy_per_cpu=k, cpus=self.loader_cpus, loader_util=round(util, 3), pids=pids)
        elif kind == "throttling":
            path = os.path.join(a.cgroup, "cpu.max")
            self.cpu_max_orig = read_file(path) or "max 100000"
            if a.throttle_cpus > 0:
                q = a.throttle_cpus
            else:
                step, busy = hm.get("step_ms", 50.0), hm.get("main_busy_ms", 5.0)
                main_util = min(1.0, busy / max(step, 1e-3))
                pin_util = min(1.0, self.pinner.cpu_s / max(1e-3, (mono_ns() - self.t_start) / 1e9))
                lu = self.loader_util()
                demand = main_util + pin_util + (lu if lu is not None else a.loader_util) * max(1, a.workers)
                # the group runs q/demand of the time: the main thread then gets half what it needs
                q = max(0.05, min(demand / 2, demand * main_util / 2))
                st["params"].update(demand_cpus=round(demand, 3), main_util=round(main_util, 3), pin_util=round(pin_util, 3))
            quota = max(1000, int(q * a.throttle_period_us))
            st["params"].update(cpu_max=f"{quota} {a.throttle_period_us}", cpus=round(q, 3), before=self.cpu_max_orig,
                                cpu_stat_before=cpu_stat(a.cgroup))
            with open(path, "w") as f:
                f.write(f"{quota} {a.throttle_period_us}")
        elif kind == "gpu_clocks":
            low = a.gpu_low_clock or self.calib.get("gpu_low_clock", 0)
            st["params"]["clocks_before"] = nvml_clocks()
            st["params"]["low_mhz"] = low
            st["async"] = Async(lambda: run_cmd(["nvidia-smi", "-i", "0", "-lgc", f"{low},{low}"], 20, self.helper_cpus),
                                "lgc", self.helper_cpus)
        elif kind == "comm_loss":
            cmds = self.netem_cmds(add=True)
            st["params"]["commands"] = [" ".join(c) for c in cmds]
            st["async"] = Async(lambda: [run_cmd(c, 15, self.helper_cpus) for c in cmds], "netem", self.helper_cpus)
            self.netem_on = True
        st["onset_ns"] = mono_ns()
        return st

    def netem_cmds(self, add: bool) -> List[List[str]]:
        """The commands that put loss on (or take it off) every end of the ranks' link."""
        a = self.a
        pct = a.netem_loss
        out: List[List[str]] = []
        for item in [x for x in a.netem.split(",") if x]:
            ns, _, dev = item.rpartition(":")
            pre = ["ip", "netns", "exec", ns] if ns else []
            tc = ["tc"] + (["-n", ns] if ns else [])
            if a.loss_method == "netem":
                out.append(tc + (["qdisc", "replace", "dev", dev, "root", "netem", "loss", f"{pct}%"] if add else ["qdisc", "del", "dev", dev, "root"]))
            elif a.loss_method == "tbf":
                out.append(tc + (["qdisc", "replace", "dev", dev, "root", "tbf", "rate", "4gbit", "burst", "64kb", "limit", "128kb"] if add else ["qdisc", "del", "dev", dev, "root"]))
            elif a.loss_method == "nft":
                if add:
                    out += [pre + ["nft", "add", "table", "inet", "slo_faults"],
                            pre + ["nft", "add", "chain", "inet", "slo_faults", "out", "{ type filter hook output priority 0 ; }"],
                            pre + ["nft", "add", "rule", "inet", "slo_faults", "out", "oifname", f'"{dev}"', "meta", "l4proto", "tcp",
                                   "numgen", "random", "mod", "100", "<", str(max(1, int(round(pct)))), "drop"]]
                else:
                    out.append(pre + ["nft", "delete", "table", "inet", "slo_faults"])
            else:
                rule = ["OUTPUT", "-o", dev, "-p", "tcp", "-m", "statistic", "--mode", "random", "--probability", f"{pct / 100:.4f}", "-j", "DROP"]
                out.append(pre + ["iptables", "-A" if add else "-D"] + rule)
        return out

    def stop_fault(self, st: Dict[str, Any]) -> None:
        a = self.a
        kind = st["kind"]
        if kind in VARIANT_KINDS:
            self.set_variant(None)
        elif kind == "pageable_copy":
            self.pinner.pageable = False
            st["params"]["first_pageable_copy_ns"] = self.pageable_first_ns
        elif kind == "cpu_contention":
            self.busy_main.pause()
        elif kind == "loader_starvation":
            for pool in self.busy_loader:
                pool.pause()
            s0, n0 = st.get("loader_snapshot", (0.0, 0.0))
            s1, n1 = self.stats.snapshot()
            st["params"]["batches_during"] = int(n1 - n0)
        elif kind == "throttling":
            path = os.path.join(a.cgroup, "cpu.max")
            with open(path, "w") as f:
                f.write(self.cpu_max_orig or "max 100000")
            self.cpu_max_orig = None
            st["params"]["cpu_stat_after"] = cpu_stat(a.cgroup)
        elif kind == "gpu_clocks":
            st["params"]["clocks_during"] = st.get("clocks_during")
            st["end_async"] = Async(lambda: run_cmd(["nvidia-smi", "-i", "0", "-rgc"], 20, self.helper_cpus), "rgc", self.helper_cpus)
        elif kind == "comm_loss":
            cmds = self.netem_cmds(add=False)
            st["end_async"] = Async(lambda: [run_cmd(c, 15, self.helper_cpus) for c in cmds], "netem-del", self.helper_cpus)
            self.netem_on = False
        st["end_ns"] = mono_ns()

    def effect(self, onset: int, end: int) -> Dict[str, Any]:
        before = [s for s in self.steps if onset - int(5e9) <= s[1] < onset]
        during = [s for s in self.steps if onset + int(1e9) <= s[1] < end]

        def mean_wall(rows):
            if len(rows) < 2:
                return None
            return (rows[-1][1] - rows[0][1]) / (len(rows) - 1) / 1e6

        b, d = mean_wall(before), mean_wall(during)
        return {"before_ms": b and round(b, 3), "during_ms": d and round(d, 3),
                "ratio": round(d / b, 3) if b and d else None, "steps_before": len(before), "steps_during": len(during)}

    # --- the timed run ---------------------------------------------------------------------
    def run(self) -> None:
        a = self.a
        self.warm = False
        self.seg_code = 0
        seg_names = self.seg_names
        self.loader_util()  # start the loader measurement
        i = 0
        segs = self.segments
        t_run0 = mono_ns()
        log(f"timed run: {len(segs)} segments, {self.time_left():.0f} s left")
        while i < len(segs):
            seg = segs[i]
            kind = seg["kind"]
            if self.rank != 0:  # other ranks follow rank 0 (their steps are in lockstep)
                break
            if kind == "healthy":
                need = seg["fault_s"]
                if self.time_left() < need + 2:
                    self.skip("healthy", f"time budget: {self.time_left():.0f} s left, needs {need:.0f} s")
                    i += 1
                    continue
                self.seg_code = len(seg_names)
                seg_names.append(f"healthy{i}")
                t0 = mono_ns()
                while mono_ns() < t0 + int(need * 1e9):
                    self.step()
                t1 = mono_ns()
                hm = self.host_measure(t0)
                hm["loader_util"] = self.loader_util()
                for r, pid in enumerate(self.pids):
                    ans = self.answer_base("healthy")
                    ans.update(status="done", onset_ns=t0, end_ns=t1, pid=pid, rank=r, steps=self.count_steps(t0, t1),
                               params={"host": hm}, effect=self.effect(t0 + int(5e9), t1))
                    self.write_answer(ans)
                i += 1
                continue
            why = self.can_run(kind)
            if why:
                self.skip(kind, why)
                i += 1
                continue
            need = seg["fault_s"] + seg["recover_s"] + 1
            if self.time_left() < need:
                for s in segs[i:]:
                    self.skip(s["kind"], f"time budget: {self.time_left():.0f} s left, needs {need:.0f} s")
                break
            self.seg_code = len(seg_names)
            seg_names.append(kind)
            ok, err = True, None
            try:
                st = self.start_fault(kind)
            except Exception as e:
                ok, err = False, f"{type(e).__name__}: {e}"
                log(f"fault {kind} failed to start: {err}\n{traceback.format_exc()}")
                self.set_variant(None)
            if not ok:
                for r, pid in enumerate(self.pids):
                    ans = self.answer_base(kind)
                    ans.update(status="failed", reason=f"could not inject: {err}", onset_ns=None, end_ns=None, pid=pid, rank=r)
                    self.write_answer(ans)
                self.seg_code = 0
                i += 1
                continue
            log(f"fault {kind}: onset {st['onset_ns']} params {json.dumps(st['params'], default=str)[:400]}")
            applied = st["onset_ns"]
            asy: Optional[Async] = st.get("async")
            fault_end_at = st["onset_ns"] + int(seg["fault_s"] * 1e9)
            sampled = False
            while True:
                self.step()
                now = mono_ns()
                if asy is not None and asy.done() and "applied_ns" not in st:
                    st["applied_ns"] = asy.done_ns
                    st["params"]["command_result"] = asy.result if asy.error is None else asy.error
                    fault_end_at = asy.done_ns + int(seg["fault_s"] * 1e9)
                    log(f"fault {kind}: applied at {asy.done_ns} ({(asy.done_ns - applied) / 1e6:.0f} ms): {st['params']['command_result']}")
                if kind == "gpu_clocks" and not sampled and now > st["onset_ns"] + int(2e9):
                    sampled = True
                    Async(lambda: st.__setitem__("clocks_during", nvml_clocks()), "nvml", self.helper_cpus)
                if asy is not None and not asy.done() and now > st["onset_ns"] + int(30e9):
                    st["params"]["command_result"] = "did not return in 30 s"
                    break
                if now >= fault_end_at and (asy is None or asy.done()):
                    break
            try:
                self.stop_fault(st)
            except Exception as e:
                self.errors.append(f"stopping {kind}: {e}")
                log(f"fault {kind} failed to stop: {e}\n{traceback.format_exc()}")
                st["end_ns"] = mono_ns()
            end_asy: Optional[Async] = st.get("end_async")
            self.seg_code = 0
            rec_end = st["end_ns"] + int(seg["recover_s"] * 1e9)
            while mono_ns() < rec_end or (end_asy is not None and not end_asy.done() and mono_ns() < rec_end + int(20e9)):
                self.step()
            if end_asy is not None:
                st["restored_ns"] = end_asy.done_ns
                st["params"]["restore_result"] = end_asy.result if end_asy.error is None else end_asy.error
            if kind == "gpu_clocks":
                st["params"]["clocks_during"] = st.get("clocks_during")
                st["params"]["clocks_after"] = nvml_clocks()
            counters_now = self.compile_counters() if a.mode != "eager" else {}
            recompiled = a.mode != "eager" and counters_now != self.compile_info.get("counters_before_run")
            status, reason = "done", None
            res = st["params"].get("command_result")
            results = res if isinstance(res, list) else [res] if res is not None else []
            bad = [r for r in results if not (isinstance(r, (list, tuple)) and len(r) == 2 and r[0] == 0)]
            if asy is not None and (bad or not results):
                status, reason = "failed", f"the command that injects it failed: {results}"
            for r, pid in enumerate(self.pids):
                ans = self.answer_base(kind)
                ans.update(status=status, reason=reason, onset_ns=st["onset_ns"], end_ns=st["end_ns"], pid=pid, rank=r,
                           applied_ns=st.get("applied_ns"), restored_ns=st.get("restored_ns"),
                           params=st["params"], effect=self.effect(st.get("applied_ns") or st["onset_ns"], st["end_ns"]),
                           steps=self.count_steps(st["onset_ns"], st["end_ns"]), recompiled_so_far=recompiled)
                if recompiled:
                    ans["notes"] += "; WARNING: Dynamo recompiled during the timed run"
                self.write_answer(ans)
            i += 1
        # ranks other than 0 run until rank 0 says which step is the last
        if a.ddp:
            self.ddp_finish()
        log(f"timed run done in {(mono_ns() - t_run0) / 1e9:.1f} s")

    def ddp_finish(self) -> None:
        if self.rank == 0:
            last = self.step_idx + 3
            with open(self.stop_file + ".tmp", "w") as f:
                f.write(str(last))
            os.replace(self.stop_file + ".tmp", self.stop_file)
            while self.step_idx <= last:
                self.step()
        else:
            last = None
            while last is None or self.step_idx <= last:
                self.step()
                if last is None:
                    txt = read_file(self.stop_file)
                    if txt and txt.strip().isdigit():
                        last = int(txt)
                if self.time_left() < 5:
                    log("rank: time budget ran out waiting for rank 0's stop")
                    break

    def count_steps(self, t0: int, t1: int) -> Dict[str, Any]:
        rows = [s for s in self.steps if t0 <= s[1] < t1]
        return {"count": len(rows), "first": rows[0][0] if rows else None, "last": rows[-1][0] if rows else None}

    # --- teardown --------------------------------------------------------------------------
    def cleanup(self) -> None:
        a = self.a
        if self.cpu_max_orig is not None and a.cgroup:
            try:
                with open(os.path.join(a.cgroup, "cpu.max"), "w") as f:
                    f.write(self.cpu_max_orig)
            except OSError:
                pass
        if self.netem_on:
            for c in self.netem_cmds(add=False):
                run_cmd(c, 10)
        for pool in ([self.busy_main] if self.busy_main else []) + self.busy_loader:
            pool.kill()
        try:
            self.pinner.stop_flag = True
        except AttributeError:
            pass

    def summary(self) -> Dict[str, Any]:
        a = self.a
        walls = [(self.steps[i + 1][1] - self.steps[i][1]) / 1e6 for i in range(len(self.steps) - 1) if self.steps[i][3] == 0]
        walls.sort()
        shim = None
        try:
            shim = {"available": slo_probe.available(), "status": slo_probe.status(), "counters": slo_probe._debug_counters()}
        except Exception as e:
            shim = {"error": str(e)}
        return {
            "label": a.label, "pid": self.pid, "rank": self.rank, "world": self.world, "pids": self.pids,
            "model": a.model, "mode": a.mode, "size": "dry" if a.dry_run else a.size, "config": getattr(self, "cfg", None),
            "schedule": self.segments, "cpus": {"main": a.main_cpu, "pin": a.pin_cpu, "loader": self.loader_cpus, "helper": self.helper_cpus},
            "cgroup": a.cgroup, "calibration": self.calib, "compile": self.compile_info,
            "compile_counters_end": self.compile_counters() if a.mode != "eager" and torch is not None else {},
            "steps_total": len(self.steps), "steps_warmup": sum(1 for s in self.steps if s[3]),
            "step_ms_p50": walls[len(walls) // 2] if walls else None, "step_ms_p99": walls[min(len(walls) - 1, len(walls) * 99 // 100)] if walls else None,
            "pinner": {"batches": getattr(getattr(self, "pinner", None), "batches", None), "cpu_s": getattr(getattr(self, "pinner", None), "cpu_s", None)},
            "loader_stats": self.stats.snapshot() if hasattr(self, "stats") else None,
            "shim": shim, "errors": self.errors, "elapsed_s": round((mono_ns() - self.t_start) / 1e9, 2),
            "segments_seen": getattr(self, "seg_names", None), "last_loss": getattr(self, "last_loss", None),
        }


def dry_run_defaults(a: argparse.Namespace) -> None:
    """Short segments for --dry-run unless given."""
    if a.schedule == "healthy:20,more_work,extra_kernel":
        a.schedule = "healthy:2,more_work:1:1,extra_kernel:1:1,host_sync:1:1,low_occupancy:1:1,pageable_copy:1:1,cpu_contention:1:1,loader_starvation:1:1,throttling:1:1,gpu_clocks:1:1,comm_loss:1:1"
    if a.workers > 2:
        a.workers = 2


def main(argv: Optional[List[str]] = None) -> int:
    global LABEL
    a = parse_args(argv)
    if a.dry_run:
        dry_run_defaults(a)
    LABEL = a.label or f"{a.model}-{a.mode}-{a.size}"
    if not a.label:
        a.label = LABEL
    job = Job(a)
    log(f"pid {job.pid}, args {vars(a)}")

    def on_term(signum, _frame):
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    rc = 0
    try:
        job.setup()
        job.warmup()
        job.run()
    except SystemExit as e:
        job.errors.append(f"exit: {e}")
        log(f"stopping: {e}")
        rc = 1
    except Exception as e:
        job.errors.append(f"{type(e).__name__}: {e}")
        log(f"failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        rc = 1
    finally:
        job.cleanup()
        try:
            if job.cuda and torch is not None:
                torch.cuda.synchronize()
        except Exception:
            pass
        try:
            job.flush_steps(final=True)
        except Exception as e:
            log(f"cannot write steps: {e}")
        summ = job.summary()
        log("summary: " + json.dumps({k: summ[k] for k in ("steps_total", "steps_warmup", "step_ms_p50", "step_ms_p99", "errors", "elapsed_s")}, default=str))
        if a.summary_out:
            with open(a.summary_out, "w") as f:
                json.dump(summ, f, indent=1, default=str)
        if job.dist is not None:
            try:
                job.dist.destroy_process_group()
            except Exception:
                pass
    # A normal exit runs the shim's atexit flush (its last records reach the agent); SIGALRM's
    # default action ends the process should the interpreter's shutdown hang (DataLoader
    # workers, the pin-memory thread blocked on them).
    try:
        job.pinner.stop_flag = True
        job.loader_it._shutdown_workers()
    except Exception:
        pass
    sys.stdout.flush()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(30)
    sys.exit(rc)


if __name__ == "__main__":
    main()
