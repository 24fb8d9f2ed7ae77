//! Run-queue latency per thread: `sched_wakeup`/`sched_wakeup_new` (and `sched_switch` of a
//! still-runnable task) stamp the moment a thread becomes runnable; `sched_switch` to that thread
//! closes the wait. Waits go into a per-thread log2 histogram in the kernel (`RUNQ_HIST`); waits
//! above `RUNQ_OUTLIER_NS` are also sent, one record each, through the `RUNQ_EVENTS` ring buffer.
//! Thread exits mark the histogram so that the agent reads it one last time and frees the slot.
//!
//! Needs kernel 5.18+ (`sched_switch` with `prev_state` as its 4th argument) and BTF.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::BtfTracePointContext,
    EbpfContext,
};
use slo_probe_common::{
    log2_slot, Counter, RecordHeader, RunqHist, RunqLatencyRecord, RUNQ_FLAG_PREEMPTED,
    RUNQ_HIST_EXITED,
};

use crate::shared::{count, global, task_comm, task_ids};

/// Waits at or above this many ns are sent through `RUNQ_EVENTS` (patched by the agent).
#[unsafe(no_mangle)]
static RUNQ_OUTLIER_NS: u64 = u64::MAX;

/// `TASK_RUNNING`: a task switched out in this state is still on the run queue (preempted or
/// yielded), so its wait starts now.
const TASK_RUNNING: u32 = 0;

/// BPF_NOEXIST: insert only if absent.
const BPF_NOEXIST: u64 = 1;

/// BPF_RB_NO_WAKEUP: the agent drains the ring on its own tick, so no record wakes it up.
const BPF_RB_NO_WAKEUP: u64 = 1;

/// When a thread became runnable.
#[repr(C)]
#[derive(Clone, Copy)]
struct Enqueued {
    ts_ns: u64,
    flags: u32,
    _pad: u32,
}

/// Thread id → when it became runnable. Entries live from wakeup to the next switch-in, so the
/// map holds at most the number of runnable threads; sized by the agent.
#[map]
static RUNQ_START: HashMap<u32, Enqueued> = HashMap::with_max_entries(16384, 0);

/// Thread id → cumulative histogram (value layout shared with the agent). Sized by the agent.
#[map]
static RUNQ_HIST: HashMap<u32, RunqHist> = HashMap::with_max_entries(16384, 0);

/// Outlier waits for the agent. Reserve-or-drop: a full ring counts `RingbufFull`.
#[map]
static RUNQ_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Per-CPU scratch used as the initial value of new `RUNQ_HIST` entries (376 bytes are too many
/// for the 512-byte BPF stack next to everything else).
#[map]
static HIST_SCRATCH: PerCpuArray<RunqHist> = PerCpuArray::with_max_entries(1, 0);

#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    try_enqueue(ctx.arg::<*const u8>(0), 0);
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    try_enqueue(ctx.arg::<*const u8>(0), 0);
    0
}

#[inline(always)]
fn try_enqueue(task: *const u8, flags: u32) {
    let Some((tid, _)) = task_ids(task) else {
        return;
    };
    stamp(tid, flags);
}

#[inline(always)]
fn stamp(tid: u32, flags: u32) {
    if tid == 0 {
        return; // the idle task never waits
    }
    let entry = Enqueued {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        flags,
        _pad: 0,
    };
    if RUNQ_START.insert(tid, entry, 0).is_err() {
        count(Counter::StartMapFull);
    }
}

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    try_sched_switch(&ctx);
    0
}

#[inline(always)]
fn try_sched_switch(ctx: &BtfTracePointContext) {
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
    //          unsigned int prev_state)
    let preempt: u8 = ctx.arg(0);
    let next: *const u8 = ctx.arg(2);
    let prev_state: u32 = ctx.arg(3);
    // A preempted task stays queued even when it was on its way to sleep (its state already
    // set, `schedule()` not yet called), so `preempt` counts as well as TASK_RUNNING.
    if preempt != 0 || prev_state == TASK_RUNNING {
        // `prev` is the current task here: its id needs no kernel read.
        stamp(ctx.pid(), RUNQ_FLAG_PREEMPTED);
    }

    let Some((tid, tgid)) = task_ids(next) else {
        return;
    };
    if tid == 0 {
        return;
    }
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { RUNQ_START.get(tid) }).copied() else {
        return; // became runnable before we attached
    };
    let _ = RUNQ_START.remove(tid);
    let now = unsafe { bpf_ktime_get_ns() };
    let delay = now.saturating_sub(start.ts_ns);

    let Some(hist) = hist_for(tid, tgid, next) else {
        count(Counter::ThreadMapFull);
        return;
    };
    // SAFETY: pointer from a map lookup, valid for this program run. Updates for one thread
    // come from the CPU that switches it in, one at a time, so plain adds do not race.
    unsafe {
        let slot = log2_slot(delay);
        if let Some(s) = (*hist).slots.get_mut(slot) {
            *s += 1;
        }
        (*hist).count += 1;
        // Threads usually name themselves just after they start: refresh the name on the
        // 1st, 2nd, 4th, 8th... wait (a few reads per thread over its life).
        if (*hist).count & ((*hist).count - 1) == 0 {
            (*hist).comm = task_comm(next);
        }
        (*hist).total_ns += delay;
        if delay > (*hist).max_ns {
            (*hist).max_ns = delay;
        }
        if start.flags & RUNQ_FLAG_PREEMPTED != 0 {
            (*hist).preempted += 1;
        }
    }

    if delay >= global(&RUNQ_OUTLIER_NS) {
        send_outlier(tid, tgid, next, now, delay, start.flags, ctx.pid());
    }
}

#[inline(always)]
fn hist_for(tid: u32, tgid: u32, task: *const u8) -> Option<*mut RunqHist> {
    if let Some(h) = RUNQ_HIST.get_ptr_mut(tid) {
        return Some(h);
    }
    let scratch = HIST_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch slot; only the identity fields are ever written, the counts
    // stay zero.
    unsafe {
        (*scratch).tgid = tgid;
        (*scratch).flags = 0;
        (*scratch).comm = task_comm(task);
        let _ = RUNQ_HIST.insert(tid, *scratch, BPF_NOEXIST);
    }
    RUNQ_HIST.get_ptr_mut(tid)
}

#[inline(always)]
fn send_outlier(tid: u32, tgid: u32, task: *const u8, now: u64, delay: u64, flags: u32, prev: u32) {
    let Some(mut entry) = RUNQ_EVENTS.reserve::<RunqLatencyRecord>(0) else {
        count(Counter::RingbufFull);
        return;
    };
    entry.write(RunqLatencyRecord {
        header: RecordHeader::of::<RunqLatencyRecord>(),
        ts_ns: now,
        delay_ns: delay,
        tgid,
        tid,
        cpu: unsafe { bpf_get_smp_processor_id() },
        flags,
        comm: task_comm(task),
        prev_tid: prev,
        _pad: 0,
    });
    entry.submit(BPF_RB_NO_WAKEUP);
    count(Counter::OutliersSent);
}

/// A thread exits: mark its histogram so that the agent reads it a last time and deletes it.
/// Runs in the exiting thread's context.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> i32 {
    let tid = ctx.pid();
    if let Some(h) = RUNQ_HIST.get_ptr_mut(tid) {
        // SAFETY: pointer from a map lookup.
        unsafe {
            (*h).flags |= RUNQ_HIST_EXITED;
            // The name it had at the end (cheap: the current task's own comm).
            if let Ok(comm) = bpf_get_current_comm() {
                (*h).comm = comm;
            }
        }
    }
    let _ = RUNQ_START.remove(tid);
    0
}
