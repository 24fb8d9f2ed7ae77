//! Process tree: follows the job across fork and exec. A process forked by a followed process
//! is added to `TRACKED` here, in the kernel, before it can run, so DataLoader workers and
//! compile workers started after attach are covered from their first instruction. Fork, exec and
//! main-thread exit are reported to the agent through `PROC_EVENTS` (reserve-or-drop).
//!
//! Needs BTF (`tp_btf/sched_process_fork`, `sched_process_exec`).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::RingBuf,
    programs::BtfTracePointContext,
    EbpfContext,
};
use slo_probe_common::{Counter, ProcessEventRecord, RecordHeader, PROC_EXEC, PROC_FORK};

use crate::shared::{
    count, global, is_tracked, task_comm, task_tgid, task_tid, BPF_RB_NO_WAKEUP, FILTER_TRACKED,
    THREADS, TRACKED,
};

/// Process events for the agent.
#[map]
static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

#[inline(always)]
pub fn send_process_event(event: u32, pid: u32, ppid: u32, tid: u32, comm: [u8; 16]) {
    let Some(mut entry) = PROC_EVENTS.reserve::<ProcessEventRecord>(0) else {
        count(Counter::EventRingFull);
        return;
    };
    entry.write(ProcessEventRecord {
        header: RecordHeader::of::<ProcessEventRecord>(),
        ts_ns: unsafe { bpf_ktime_get_ns() },
        event,
        pid,
        ppid,
        tid,
        comm,
    });
    entry.submit(BPF_RB_NO_WAKEUP);
}

/// TP_PROTO(struct task_struct *parent, struct task_struct *child). Runs in the parent.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    let child: *const u8 = ctx.arg(1);
    let (Some(pid), Some(tid)) = (task_tgid(child), task_tid(child)) else {
        return 0;
    };
    if pid != tid {
        return 0; // a new thread: covered through its process
    }
    let parent = ctx.tgid();
    if global(&FILTER_TRACKED) != 0 {
        // SAFETY: only presence is used.
        if unsafe { TRACKED.get(parent) }.is_none() {
            return 0;
        }
        if TRACKED.insert(pid, 0, 0).is_err() {
            count(Counter::TrackedMapFull);
        }
    }
    send_process_event(PROC_FORK, pid, parent, ctx.pid(), task_comm(child));
    0
}

/// TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm). Runs in `p`, whose
/// name is already the new program's.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    let pid = ctx.tgid();
    if is_tracked(pid) {
        let comm = bpf_get_current_comm().unwrap_or([0; 16]);
        if let Some(e) = THREADS.get_ptr_mut(ctx.pid()) {
            // SAFETY: pointer from a map lookup.
            unsafe { (*e).comm = comm };
        }
        send_process_event(PROC_EXEC, pid, 0, ctx.pid(), comm);
    }
    0
}
