#!/usr/bin/env python3
"""The training job of scripts/gpu-overhead: a small GPT-style transformer LM in plain PyTorch,
trained on random tokens (--model gpt, sizes batch x sequence), or a ResNet-18-shaped
convolutional net trained on random images (--model convnet, sizes batch x image side: the real-
fault suite's other kind of model, without its data loader), that measures what slo-probe's
CUPTI shim costs it. Data stays on the GPU in both.

Modes (--run):
  ab       in-process A/B for one execution mode and one or more sizes: blocks of --block-steps
           steps, rotated among the conditions
             default   the shim at its default tier (depth 0 + duty-cycled sample windows)
             released  CUPTI released (slo_probe.cupti_released()): the baseline
             kernels   the shim forced to depth 1 (slo_probe.request_depth("kernels"))
             control   CUPTI released again: an A/A pair with `released`, the method's own noise
                       and bias measured in the same rounds (--conditions picks the set)
           then --profiler-blocks blocks under torch.profiler (CUPTI released to it), and with
           --toggles N, N raise/lower cycles of kernel tracing with the steps around them timed.
  pair     one process of a process pair: --steps steps at whatever the environment gives (the
           shim injected with CUDA_INJECTION64_PATH or not), timed in blocks.

Each finished unit (one size of an A/B, the toggle set, a pair run) is appended at once as one
JSON line to --out, so that a run stopped by its deadline keeps what it measured. Block times
are synchronised wall times (torch.cuda.synchronize before and after) divided by the steps;
each block also keeps its steps' host times (no sync between steps) and their median, the
main thread's CPU time, its involuntary context switches and the host's stolen time.

--dry-run: tiny sizes, few steps, CPU; without torch the steps are simulated (sleeps), which
still exercises the blocks, the rotation, the shim calls and the output for the summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import slo_probe  # noqa: E402

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    HAVE_TORCH = True
except ImportError:  # the dry run here, without torch
    torch = None  # type: ignore[assignment]
    HAVE_TORCH = False

CONDITIONS = ("default", "released", "kernels", "control")
# Labels begin with the model where it is not the GPT (the results before the convnet have none).
MODEL_LABELS = {"gpt": "", "convnet": "convnet "}
DEFAULT_CONDITIONS = "default,released,kernels"


def log(*a: Any) -> None:
    print(f"[gpu_overhead {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The model


if HAVE_TORCH:

    class Block(nn.Module):
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.up = nn.Linear(d, 4 * d)
            self.down = nn.Linear(4 * d, d)

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab: int, ctx: int, d: int, layers: int, heads: int) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight  # tied

        def forward(self, idx: "torch.Tensor") -> "torch.Tensor":
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(out + (x if self.down is None else self.down(x)))

    class ConvNet(nn.Module):
        """ResNet-18's shape (four stages of two basic blocks), width `w`; returns the loss."""

        def __init__(self, w: int, classes: int) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            stages, cin = [], w
            for i, c in enumerate((w, 2 * w, 4 * w, 8 * w)):
                stages.append(nn.Sequential(BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)))
                cin = c
            self.stages = nn.Sequential(*stages)
            self.fc = nn.Linear(cin, classes)

        def forward(self, images: "torch.Tensor", labels: "torch.Tensor") -> "torch.Tensor":
            x = self.stages(self.stem(images.float() / 255.0))
            return F.cross_entropy(self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)), labels)


class Job:
    """One (mode, batch, seq) training setup: `step()` runs one iteration; `sync()` waits for
    the device."""

    def __init__(self, mode: str, batch: int, seq: int, args: argparse.Namespace) -> None:
        self.mode, self.batch, self.seq = mode, batch, seq
        if not getattr(args, "compile_modes", True):
            self.mode = mode = "eager"
        self.simulated = not HAVE_TORCH
        if self.simulated:
            self.step = lambda: time.sleep(0.002)  # type: ignore[assignment]
            self.sync = lambda: None  # type: ignore[assignment]
            self.device = "simulated"
            return
        cuda = torch.cuda.is_available() and not args.dry_run
        self.device = "cuda" if cuda else "cpu"
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        self.convnet = args.model == "convnet"
        if self.convnet:
            model: "nn.Module" = ConvNet(args.width, args.classes).to(self.device)
        else:
            model = GPT(args.vocab, max(seq, 16), args.dim, args.layers, args.heads).to(self.device)
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.fwd: Callable[..., Any] = model
        if mode == "compile":
            self.fwd = torch.compile(model)
        elif mode == "reduce-overhead":
            self.fwd = torch.compile(model, mode="reduce-overhead")
        g = torch.Generator(device=self.device).manual_seed(1)
        # A few batches rotated, so that no step reuses the previous one's input buffer.
        if self.convnet:
            # `seq` is the image side here; images as a loader hands them over (uint8).
            self.data = [
                (torch.randint(0, 256, (batch, 3, seq, seq), device=self.device, generator=g, dtype=torch.uint8),
                 torch.randint(0, args.classes, (batch,), device=self.device, generator=g))
                for _ in range(4)
            ]
        else:
            self.data = [
                torch.randint(0, args.vocab, (batch, seq + 1), device=self.device, generator=g) for _ in range(4)
            ]
        self.i = 0
        self.vocab = args.vocab
        self.sync = torch.cuda.synchronize if cuda else (lambda: None)  # type: ignore[assignment]

    def step(self) -> None:  # replaced in simulated mode
        d = self.data[self.i % len(self.data)]
        self.i += 1
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        if self.convnet:
            loss = self.fwd(*d)
        else:
            logits = self.fwd(d[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, self.vocab), d[:, 1:].reshape(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------
# Measurement helpers


def counters() -> Dict[str, int]:
    return slo_probe._debug_counters() or {}


def delta(a: Dict[str, int], b: Dict[str, int]) -> Dict[str, int]:
    return {k: b[k] - a.get(k, 0) for k in b if k != "launch_domains"}


def wait_depth(pred: Callable[[Dict[str, Any]], bool], timeout: float) -> bool:
    """Polls slo_probe.depth() until pred holds (the shim applies requests on its own thread)."""
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        d = slo_probe.depth()
        if d is not None and pred(d):
            return True
        time.sleep(0.0005)
    return False


class Instructions:
    """The calling thread's retired instructions (user and kernel), from a perf_event counter
    (Linux, x86_64): what CUPTI and the shim add on the launching thread, counted, not timed, so
    the host's noise (frequency, neighbours, preemption) does not enter. None where the
    kernel or the machine gives no hardware counter."""

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        try:
            import ctypes
            import struct

            libc = ctypes.CDLL(None, use_errno=True)
            # struct perf_event_attr (128 bytes): type 0 (hardware), config 1 (instructions),
            # flags: exclude_hv (bit 6); counting from now on, this thread, any CPU.
            attr = struct.pack("<IIQQQQQ", 0, 128, 1, 0, 0, 0, 1 << 6).ljust(128, b"\0")
            buf = ctypes.create_string_buffer(attr, 128)
            fd = libc.syscall(298, buf, 0, -1, -1, 0)
            if fd >= 0:
                self.fd = fd
        except Exception:  # no counter: the blocks carry no instruction count
            self.fd = None

    def read(self) -> Optional[int]:
        if self.fd is None:
            return None
        try:
            return int.from_bytes(os.read(self.fd, 8), "little")
        except OSError:
            return None


_INSTR: Optional[Instructions] = None


def instructions() -> Optional[int]:
    global _INSTR
    if _INSTR is None:
        _INSTR = Instructions()
    return _INSTR.read()


def _steal_ticks() -> Optional[int]:
    """The host's stolen CPU time so far (all CPUs, clock ticks; /proc/stat): time a hypervisor
    gave to other guests while this one wanted to run."""
    try:
        with open("/proc/stat") as f:
            v = f.readline().split()
        return int(v[8]) if v[0] == "cpu" and len(v) > 8 else None
    except (OSError, ValueError, IndexError):
        return None


def _preemptions() -> Optional[int]:
    """The calling thread's involuntary context switches so far."""
    try:
        import resource

        return resource.getrusage(getattr(resource, "RUSAGE_THREAD", 1)).ru_nivcsw
    except (ImportError, OSError, ValueError):
        return None


# --markers: how steps are marked, and the label's suffix.
MARKER_LABELS = {"explicit": "", "none": " (no markers)", "auto": " (automatic markers)"}
MARKED = True


def run_steps(job: Job, n: int, per_step_sync: bool = False) -> Dict[str, Any]:
    """n marked steps; the block's synchronised wall time, and per-step times. Without
    per_step_sync the per-step times are the host's (no sync between steps): a launch-bound job
    steps at the host's pace, a GPU-bound one blocks in the allocator or at the queue's bound and
    so steps at the GPU's; their median leaves out the host's spikes (preemption, a neighbour),
    which the block's mean keeps."""
    times: List[float] = []
    job.sync()
    t0 = time.perf_counter()
    c0 = time.thread_time()
    i0 = instructions()
    s0, p0 = _steal_ticks(), _preemptions()
    last = t0
    for _ in range(n):
        if MARKED:
            with slo_probe.step():
                job.step()
        else:  # --markers none or auto (the latter: slo-probe's bootstrap marks optimizer steps)
            job.step()
        if per_step_sync:
            job.sync()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    cpu = time.thread_time() - c0
    i1 = instructions()
    s1, p1 = _steal_ticks(), _preemptions()
    job.sync()
    total = time.perf_counter() - t0
    # cpu_s: the main thread's CPU time per step before the final sync (where a launch-bound
    # job spends its step, and where CUPTI's per-launch cost lands), less noisy than the wall
    # time on a shared host: preemption and waits are not in it.
    instr = (i1 - i0) / n if i0 is not None and i1 is not None else None
    return {
        "step_s": total / n,
        "cpu_s": cpu / n,
        "step_med_s": statistics.median(times) if times else None,
        "instr": instr,
        "steps": n,
        "per_step_s": times,
        "steal_ticks": s1 - s0 if s0 is not None and s1 is not None else None,
        "preemptions": p1 - p0 if p0 is not None and p1 is not None else None,
    }


def block(job: Job, cond: str, steps: int, warm: int, wait_s: float) -> Dict[str, Any]:
    """One measured block under `cond`."""
    info: Dict[str, Any] = {"condition": cond}
    if cond == "kernels":
        slo_probe.request_depth("kernels", 0)
        info["depth_reached"] = wait_depth(lambda d: 1 <= d["depth"] <= 2 and d["reason"] == "script", wait_s)
    if cond in ("released", "control"):
        with slo_probe.cupti_released():
            run_steps(job, warm)
            c0 = counters()
            r = run_steps(job, steps)
            c1 = counters()
    else:
        run_steps(job, warm)
        c0 = counters()
        d0 = slo_probe.depth()
        r = run_steps(job, steps)
        c1 = counters()
        info["depth_at_start"] = d0
    if cond == "kernels":
        slo_probe.request_depth(0)
        info["depth_left"] = wait_depth(lambda d: d["reason"] != "script", wait_s)
    info.update(step_s=r["step_s"], cpu_s=r["cpu_s"], step_med_s=r["step_med_s"],
                instr=r["instr"], steps=steps, steal_ticks=r["steal_ticks"], preemptions=r["preemptions"],
                host_step_us=[round(t * 1e6, 1) for t in r["per_step_s"]], counters=delta(c0, c1))
    return info


def profiler_block(job: Job, steps: int, warm: int, count: bool) -> Dict[str, Any]:
    """torch.profiler (CPU and CUDA activities, as users run it) for one block, CUPTI handed
    over to it; with `count`, its CUDA events are counted (slow: only once per size)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if job.device == "cuda":
        acts.append(ProfilerActivity.CUDA)
    with slo_probe.cupti_released():
        with profile(activities=acts) as prof:
            run_steps(job, warm)
            r = run_steps(job, steps)
    b: Dict[str, Any] = {"condition": "profiler", "step_s": r["step_s"], "steps": steps + warm}
    if count:
        b["profiler_cuda_events"] = sum(1 for e in prof.events() if getattr(e.device_type, "name", "") == "CUDA")
    return b


def summary(xs: List[float]) -> Dict[str, float]:
    xs = sorted(xs)
    if not xs:
        return {}
    q = lambda p: xs[min(len(xs) - 1, max(0, int(round(p * (len(xs) - 1)))))]  # noqa: E731
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "mean": statistics.fmean(xs),
        "min": xs[0],
        "max": xs[-1],
        "p25": q(0.25),
        "p75": q(0.75),
    }


def toggles(job: Job, cycles: int, around: int, wait_s: float, deadline: float) -> Dict[str, Any]:
    """Raise/lower kernel tracing `cycles` times: how long until the depth shows, what the
    shim's thread spent switching, and the synchronised step times around each switch."""
    apply_raise, apply_lower, first_after_raise, first_after_lower = [], [], [], []
    steady0: List[float] = []
    steady1: List[float] = []
    c0 = counters()
    done = 0
    for _ in range(cycles):
        if time.time() > deadline:
            break
        steady0 += run_steps(job, around, per_step_sync=True)["per_step_s"]
        t = time.perf_counter()
        slo_probe.request_depth("kernels", 0)
        ok = wait_depth(lambda d: 1 <= d["depth"] <= 2 and d["reason"] == "script", wait_s)
        apply_raise.append(time.perf_counter() - t if ok else float("nan"))
        s = run_steps(job, around, per_step_sync=True)["per_step_s"]
        first_after_raise.append(s[0])
        steady1 += s[1:]
        t = time.perf_counter()
        slo_probe.request_depth(0)
        ok = wait_depth(lambda d: d["reason"] != "script", wait_s)
        apply_lower.append(time.perf_counter() - t if ok else float("nan"))
        s = run_steps(job, around, per_step_sync=True)["per_step_s"]
        first_after_lower.append(s[0])
        steady0 += s[1:]
        done += 1
    c = delta(c0, counters())
    ok = lambda xs: [x for x in xs if not math.isnan(x)]  # noqa: E731
    return {
        "cycles": done,
        "apply_raise_s": summary(ok(apply_raise)),
        "apply_lower_s": summary(ok(apply_lower)),
        "step_after_raise_s": summary(first_after_raise),
        "step_after_lower_s": summary(first_after_lower),
        "steady_timing_step_s": summary(steady0),
        "steady_kernels_step_s": summary(steady1),
        "shim_toggle_ns_per_change": c.get("toggle_ns", 0) / max(1, c.get("depth_changes", 0)),
        "counters": c,
    }


# ---------------------------------------------------------------------------------------------


def environment() -> Dict[str, Any]:
    e: Dict[str, Any] = {
        "python": platform.python_version(),
        "host": platform.node(),
        "shim": slo_probe.available(),
        "shim_status": slo_probe.status(),
        "injected": os.environ.get("CUDA_INJECTION64_PATH", ""),
        "torch": getattr(torch, "__version__", None),
    }
    if HAVE_TORCH and torch.cuda.is_available():
        e["gpu"] = torch.cuda.get_device_name(0)
        e["cuda"] = torch.version.cuda
    return e


def markers_fields(args: argparse.Namespace, job: Job) -> Dict[str, Any]:
    """How steps were marked; with --markers auto, whether the automatic clock attached, the
    index it has open (one step begun at each optimizer step of the clock after the first) and
    the optimizer steps this job ran."""
    return {
        "markers": args.markers,
        "auto_installed": slo_probe._autostep._installed,
        "auto_open_step": slo_probe._autostep.open_step(),
        "job_steps": getattr(job, "i", None),
    }


def emit(out: str, rec: Dict[str, Any]) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")


def run_ab(args: argparse.Namespace, sizes: List[tuple]) -> int:
    """The A/B rounds of every size first, then the profiler blocks of every size: once
    torch.profiler has run, it keeps its CUPTI subscription and the shim traces without launch
    callbacks, which would change what later blocks measure."""
    failures = 0
    done: List[tuple] = []  # (record, job)

    def fail(label: str, e: BaseException) -> None:
        nonlocal failures
        failures += 1
        log(f"{label}: FAILED: {e!r}")
        emit(args.out, {"kind": "error", "label": label, "mode": args.mode, "error": repr(e),
                        "traceback": traceback.format_exc()[-4000:]})

    for batch, seq in sizes:
        label = f"{MODEL_LABELS[args.model]}{args.mode} {batch}x{seq}" + MARKER_LABELS[args.markers]
        if time.time() > args.deadline - args.min_unit_s:
            log(f"{label}: skipped, {args.deadline - time.time():.0f} s left")
            emit(args.out, {"kind": "skipped", "label": label, "mode": args.mode, "why": "time budget"})
            continue
        try:
            t0 = time.time()
            job = Job(args.mode, batch, seq, args)
            run_steps(job, args.warmup)  # compile, CUDA graphs, allocator, first sample window
            warm_s = time.time() - t0
            log(f"{label}: warm in {warm_s:.1f} s on {job.device}")
            blocks: List[Dict[str, Any]] = []
            for r in range(args.blocks):
                if time.time() > args.deadline:
                    log(f"{label}: deadline after {r} rounds")
                    break
                conds = args.conditions
                order = conds[r % len(conds):] + conds[: r % len(conds)]
                for cond in order:
                    b = block(job, cond, args.block_steps, args.block_warm, args.wait_s)
                    b["round"] = r
                    blocks.append(b)
            rec: Dict[str, Any] = {
                "kind": "ab",
                "label": label,
                "mode": args.mode,
                "batch": batch,
                "seq": seq,
                "device": job.device,
                "simulated": job.simulated,
                "warm_s": warm_s,
                "blocks": blocks,
                "depth_end": slo_probe.depth(),
                "counters_end": counters(),
                "env": environment(),
                **markers_fields(args, job),
            }
            if args.toggles and (batch, seq) == sizes[0] and time.time() < args.deadline:
                rec["toggles"] = toggles(job, args.toggles, 5, args.wait_s, args.deadline)
            log(f"{label}: {len(blocks)} blocks in {time.time() - t0:.1f} s")
            emit(args.out, rec)
            done.append((rec, job))
        except Exception as e:  # one size failing must not lose the others
            fail(label, e)
    for rec, job in done:
        prof: Dict[str, Any] = {"kind": "profiler", "label": rec["label"], "mode": args.mode, "blocks": []}
        try:
            for i in range(args.profiler_blocks if HAVE_TORCH else 0):
                if time.time() > args.deadline:
                    prof["skipped"] = "time budget"
                    break
                prof["blocks"].append(profiler_block(job, args.block_steps, args.block_warm, i == 0))
        except Exception as e:
            prof["error"] = repr(e)
            fail(rec["label"] + " profiler", e)
        emit(args.out, prof)
    return failures


def run_pair(args: argparse.Namespace, sizes: List[tuple]) -> int:
    batch, seq = sizes[0]
    label = f"{MODEL_LABELS[args.model]}{args.mode} {batch}x{seq}"
    t0 = time.time()
    job = Job(args.mode, batch, seq, args)
    run_steps(job, args.warmup)
    warm_s = time.time() - t0
    c0 = counters()
    blocks = []
    left = args.steps
    while left > 0 and time.time() < args.deadline:
        n = min(args.block_steps, left)
        blocks.append(run_steps(job, n)["step_s"])
        left -= n
    emit(args.out, {
        "kind": args.kind,
        "label": args.label or label,
        "mode": args.mode,
        "batch": batch,
        "seq": seq,
        "tag": args.tag,
        "injected": bool(os.environ.get("CUDA_INJECTION64_PATH")),
        "device": job.device,
        "simulated": job.simulated,
        "warm_s": warm_s,
        "block_step_s": blocks,
        "steps": args.steps - left,
        "counters": delta(c0, counters()) if slo_probe.available() else None,
        "depth_end": slo_probe.depth(),
        "env": environment(),
        **markers_fields(args, job),
    })
    log(f"pair {label} ({args.tag}): {len(blocks)} blocks, median {statistics.median(blocks) * 1e3:.3f} ms/step"
        if blocks else f"pair {label} ({args.tag}): no blocks")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", choices=("ab", "pair"), default="ab")
    p.add_argument("--mode", choices=("eager", "compile", "reduce-overhead"), default="eager")
    p.add_argument("--model", choices=("gpt", "convnet"), default="gpt")
    p.add_argument("--sizes", default="4x128,16x512",
                   help="batch x sequence (gpt) or batch x image side (convnet), comma-separated")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--width", type=int, default=64, help="convnet: channels of its first stage")
    p.add_argument("--classes", type=int, default=1000, help="convnet: classes")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--blocks", type=int, default=8, help="rounds: each runs every condition once")
    p.add_argument("--block-steps", type=int, default=50)
    p.add_argument("--conditions", default=DEFAULT_CONDITIONS,
                   help=f"ab: the conditions of a round, comma-separated, among {', '.join(CONDITIONS)} "
                        "(released is the baseline and always runs)")
    p.add_argument("--block-warm", type=int, default=3, help="unmeasured steps after a switch")
    p.add_argument("--profiler-blocks", type=int, default=3)
    p.add_argument("--toggles", type=int, default=0)
    p.add_argument("--steps", type=int, default=1000, help="pair: measured steps")
    p.add_argument("--tag", default="", help="pair: this process's tag (A1 without the shim, B1 with, ...)")
    p.add_argument("--label", default="", help="pair: the label (default: mode and size)")
    p.add_argument("--kind", default="pair", help="pair: the record kind (pair, domain)")
    p.add_argument("--wait-s", type=float, default=2.0, help="longest wait for a depth change")
    p.add_argument("--deadline", type=float, default=0.0, help="epoch seconds: stop measuring after")
    p.add_argument("--min-unit-s", type=float, default=20.0, help="skip a size with less time left")
    p.add_argument("--out", required=True, help="JSON lines file to append to")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes, few steps, CPU or simulated")
    p.add_argument("--markers", choices=tuple(MARKER_LABELS), default="explicit",
                   help="ab: slo_probe.step() around each step (explicit), none, or none in the script "
                        "with slo-probe's bootstrap first on PYTHONPATH marking optimizer steps (auto)")
    args = p.parse_args()
    global MARKED
    MARKED = args.markers == "explicit"
    if args.dry_run:
        args.sizes = "2x16"
        args.dim, args.layers, args.heads, args.vocab = 32, 2, 2, 128
        args.width, args.classes = 8, 10
        # Rounds as asked, up to 12: 5 or more give the summary's intervals.
        args.blocks = min(args.blocks, 12)
        args.warmup, args.block_steps, args.block_warm = 2, 5, 1
        args.profiler_blocks = min(args.profiler_blocks, 1)
        args.toggles = min(args.toggles, 2)
        args.steps = min(args.steps, 20)
        args.wait_s = min(args.wait_s, 0.05)
        # Inductor on CPU needs a compiler and minutes: a dry run steps eagerly (labels keep the
        # mode asked for).
        args.compile_modes = False
    if not args.deadline:
        args.deadline = time.time() + 3600
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    conds = [c.strip() for c in args.conditions.split(",") if c.strip()]
    bad = [c for c in conds if c not in CONDITIONS]
    if bad:
        p.error(f"--conditions: unknown {', '.join(bad)} (choose among {', '.join(CONDITIONS)})")
    if "released" not in conds:
        conds.append("released")
    args.conditions = conds
    log(f"{args.run} {args.mode} sizes {sizes}; shim {'loaded' if slo_probe.available() else 'absent'}; "
        f"torch {getattr(torch, '__version__', 'absent')}; {args.deadline - time.time():.0f} s left")
    if args.run == "ab":
        return 1 if run_ab(args, sizes) else 0
    return run_pair(args, sizes)


if __name__ == "__main__":
    sys.exit(main())
