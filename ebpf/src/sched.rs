//! Per-thread scheduling: run-queue latency (runnable → running) and off-CPU time split into
//! voluntary and involuntary. `sched_switch` stamps the thread leaving a CPU and closes the
//! periods of the thread it switches to. Waits go into a log2 histogram inside the thread's
//! `THREADS` entry; waits above `RUNQ_OUTLIER_NS` are also sent, one record each, through the
//! `RUNQ_EVENTS` ring buffer. Nothing wakes the agent.
//!
//! Where a wait starts: by default the scheduler's own stamp, `task->sched_info.last_queued`,
//! which the kernel sets on every enqueue (wakeup, fork, preemption) and which `sched_switch`
//! reads for the incoming task against the CPU's `rq->clock` (updated by `__schedule` just
//! before the tracepoint, and the value the scheduler's own accounting uses right after it).
//! Then no program runs on a wakeup at all, and that clock times off-CPU periods too: one
//! program, two hash lookups and no clock helper per context switch (`bpf_ktime_get_ns` only
//! for an outlier's record). On kernels whose BTF lacks that path (see [`SchedOffsets`]) the agent attaches
//! `sched_wakeup`/`sched_wakeup_new` too, and they stamp waits with `bpf_ktime_get_ns`.
//!
//! Needs kernel 5.18+ (`sched_switch` with `prev_state` as its 4th argument) and BTF.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::RingBuf,
    programs::BtfTracePointContext,
    EbpfContext,
};
use slo_probe_common::{
    log2_slot, Counter, RecordHeader, RunqLatencyRecord, SchedOffsets, ThreadStats, PROC_EXIT,
    RUNQ_FLAG_PREEMPTED, THREAD_EXITED, THREAD_OFF_INVOLUNTARY,
};

use crate::{
    proc::send_process_event,
    shared::{
        btf_load, btf_task_tgid, btf_task_tid, count, global, is_tracked, task_comm, thread_entry,
        BPF_RB_NO_WAKEUP, THREADS,
    },
};

/// Waits at or above this many ns are sent through `RUNQ_EVENTS` (patched by the agent).
#[unsafe(no_mangle)]
static RUNQ_OUTLIER_NS: u64 = u64::MAX;

/// Where the scheduler keeps its run-queue stamps (patched by the agent from BTF).
#[unsafe(no_mangle)]
static SCHED_OFFSETS: SchedOffsets = SchedOffsets {
    enabled: 0,
    last_queued: 0,
    run_delay: 0,
    se_cfs_rq: 0,
    cfs_rq_rq: 0,
    rq_clock: 0,
};

/// `TASK_RUNNING`: a task switched out in this state is still on the run queue.
const TASK_RUNNING: u32 = 0;

/// [`ThreadStats::flags`] bit private to the programs: the thread is on a CPU now.
const THREAD_ON_CPU: u32 = 1 << 3;

/// [`ThreadStats::flags`] bit private to the programs: `queued_ts` holds the task's
/// `sched_info.run_delay` as of its last switch-in (scheduler stamps only).
const THREAD_RUN_DELAY_SEEN: u32 = 1 << 4;

/// Outlier waits for the agent. Reserve-or-drop: a full ring counts `RingbufFull`.
#[map]
static RUNQ_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    try_wakeup(ctx.arg::<*const u8>(0));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    try_wakeup(ctx.arg::<*const u8>(0));
    0
}

#[inline(always)]
fn try_wakeup(task: *const u8) {
    let tid = btf_task_tid(task);
    if tid == 0 {
        return; // the idle task never waits
    }
    let Some(e) = thread_entry(tid, || Some(btf_task_tgid(task)), || task_comm(task), 0) else {
        return;
    };
    // SAFETY: pointer from a map lookup, valid for this program run.
    unsafe {
        // A thread woken while still on its CPU (on its way to sleep) does not wait; a thread
        // already waiting (preempted) keeps its earlier stamp.
        if (*e).flags & THREAD_ON_CPU == 0 && (*e).queued_ts == 0 {
            (*e).queued_ts = bpf_ktime_get_ns();
        }
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
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    let prev_state: u32 = ctx.arg(3);
    let kernel_stamps = global(&SCHED_OFFSETS.enabled) != 0;
    // With the scheduler's stamps, its clock times everything here (no helper call); the
    // wakeup programs' stamps are CLOCK_MONOTONIC.
    let now = if kernel_stamps {
        rq_clock(next)
    } else {
        unsafe { bpf_ktime_get_ns() }
    };

    // A plain load of `prev->pid` is cheaper than the get_current_pid_tgid helper.
    let prev_tid = btf_task_tid(prev);
    if prev_tid != 0 {
        if let Some(e) = thread_entry(
            prev_tid,
            || Some(btf_task_tgid(prev)),
            || task_comm(prev),
            0,
        ) {
            // A preempted task stays queued even when it was on its way to sleep (state set,
            // `schedule()` not yet called), so `preempt` counts as well as TASK_RUNNING.
            let involuntary = preempt != 0 || prev_state == TASK_RUNNING;
            // SAFETY: pointer from a map lookup. Only the CPU switching this thread out or in
            // writes these fields, one at a time.
            unsafe {
                (*e).off_ts = now;
                if !kernel_stamps {
                    // The wakeup programs' stamp: a preempted thread starts waiting now.
                    (*e).queued_ts = if involuntary { now } else { 0 };
                }
                if involuntary {
                    (*e).flags = ((*e).flags & !THREAD_ON_CPU) | THREAD_OFF_INVOLUNTARY;
                    (*e).switches_involuntary += 1;
                } else {
                    (*e).flags &= !(THREAD_ON_CPU | THREAD_OFF_INVOLUNTARY);
                    (*e).switches_voluntary += 1;
                }
            }
        }
    }

    let tid = btf_task_tid(next);
    if tid == 0 {
        return;
    }
    let Some(e) = thread_entry(
        tid,
        || Some(btf_task_tgid(next)),
        || task_comm(next),
        THREAD_ON_CPU,
    ) else {
        return;
    };
    // SAFETY: as above.
    unsafe {
        let off = (*e).off_ts;
        let flags = (*e).flags;
        let involuntary = flags & THREAD_OFF_INVOLUNTARY != 0;
        (*e).off_ts = 0;
        if off != 0 {
            let d = now.saturating_sub(off);
            if involuntary {
                (*e).offcpu_involuntary_ns += d;
            } else {
                (*e).offcpu_voluntary_ns += d;
            }
        }
        let delay = if kernel_stamps {
            let (delay, run_delay) = scheduler_wait(next, now, (*e).queued_ts, flags);
            (*e).queued_ts = run_delay;
            (*e).flags = flags | THREAD_ON_CPU | THREAD_RUN_DELAY_SEEN;
            delay
        } else {
            let queued = (*e).queued_ts;
            (*e).queued_ts = 0;
            (*e).flags = flags | THREAD_ON_CPU;
            // 0: became runnable before we attached
            if queued == 0 {
                None
            } else {
                Some(now.saturating_sub(queued))
            }
        };
        let Some(delay) = delay else {
            return;
        };
        if let Some(s) = (*e).runq_slots.get_mut(log2_slot(delay)) {
            *s += 1;
        }
        (*e).runq_count += 1;
        // Threads usually name themselves just after they start: refresh the name on the
        // 1st, 2nd, 4th, 8th... wait (a few reads per thread over its life).
        if (*e).runq_count & ((*e).runq_count - 1) == 0 {
            (*e).comm = task_comm(next);
        }
        (*e).runq_total_ns += delay;
        if delay > (*e).runq_max_ns {
            (*e).runq_max_ns = delay;
        }
        if involuntary {
            (*e).runq_preempted += 1;
        }
        if delay >= global(&RUNQ_OUTLIER_NS) {
            let ts = if kernel_stamps {
                bpf_ktime_get_ns()
            } else {
                now
            };
            send_outlier(&*e, tid, ts, delay, involuntary, prev_tid);
        }
    }
}

/// This CPU's `rq->clock` (ns), through `next->se.cfs_rq->rq`: `__schedule` updated it just
/// before `sched_switch`, and the scheduler's own accounting reads the same value right after.
/// 0 if a pointer on the way is NULL (the loads are fault-safe).
#[inline(always)]
fn rq_clock(next: *const u8) -> u64 {
    let o = &SCHED_OFFSETS;
    let cfs_rq: *const u8 = btf_load(next, global(&o.se_cfs_rq));
    let rq: *const u8 = btf_load(cfs_rq, global(&o.cfs_rq_rq));
    btf_load(rq, global(&o.rq_clock))
}

/// The wait of `next`, switching in at rq clock `clock`, from the scheduler's stamps, and its
/// `sched_info.run_delay` once the scheduler has added that wait. `seen` is the run delay stored
/// at its previous switch-in (valid when `flags` has [`THREAD_RUN_DELAY_SEEN`]). `None`: it was
/// not queued (nothing stamped, nothing added since it last ran).
#[inline(always)]
fn scheduler_wait(next: *const u8, clock: u64, seen: u64, flags: u32) -> (Option<u64>, u64) {
    let o = &SCHED_OFFSETS;
    let last_queued: u64 = btf_load(next, global(&o.last_queued));
    let run_delay: u64 = btf_load(next, global(&o.run_delay));
    // Waits the scheduler closed without a switch-in: the part of this wait spent queued on
    // another CPU before a migration (`sched_info_dequeue`).
    let earlier = if flags & THREAD_RUN_DELAY_SEEN != 0 {
        run_delay.saturating_sub(seen)
    } else {
        0
    };
    if last_queued == 0 {
        return (if earlier > 0 { Some(earlier) } else { None }, run_delay);
    }
    let here = clock.saturating_sub(last_queued);
    (Some(earlier + here), run_delay + here)
}

#[inline(always)]
fn send_outlier(e: &ThreadStats, tid: u32, now: u64, delay: u64, preempted: bool, prev: u32) {
    let Some(mut entry) = RUNQ_EVENTS.reserve::<RunqLatencyRecord>(0) else {
        count(Counter::RingbufFull);
        return;
    };
    entry.write(RunqLatencyRecord {
        header: RecordHeader::of::<RunqLatencyRecord>(),
        ts_ns: now,
        delay_ns: delay,
        tgid: e.tgid,
        tid,
        cpu: unsafe { bpf_get_smp_processor_id() },
        flags: if preempted { RUNQ_FLAG_PREEMPTED } else { 0 },
        comm: e.comm,
        prev_tid: prev,
        _pad: 0,
    });
    entry.submit(BPF_RB_NO_WAKEUP);
    count(Counter::OutliersSent);
}

/// A thread exits: mark its entry so that the agent reads it a last time and deletes it, and
/// report the exit of a followed process's main thread. Runs in the exiting thread's context.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> i32 {
    let tid = ctx.pid();
    let tgid = ctx.tgid();
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    if let Some(e) = THREADS.get_ptr_mut(tid) {
        // SAFETY: pointer from a map lookup.
        unsafe {
            (*e).flags |= THREAD_EXITED;
            (*e).comm = comm; // the name it had at the end
        }
    }
    if tid == tgid && is_tracked(tgid) {
        send_process_event(PROC_EXIT, tgid, 0, tid, comm);
    }
    0
}
