//! Scheduling: run-queue latency (the time a thread spends runnable but not running, woken or
//! preempted, waiting for a CPU) and off-CPU time split into voluntary and involuntary.
//! Produced by `ebpf/src/sched.rs` from the `sched_wakeup`, `sched_wakeup_new` and
//! `sched_switch` BTF tracepoints (kernel 5.18+, BTF required).

use core::mem::size_of;

use crate::{Record, RecordHeader, RecordKind};

/// Number of log2 slots in [`ThreadStats::runq_slots`]: slot `i` counts waits in `[2^i, 2^(i+1))` ns, slot 0
/// also counts 0 and 1 ns, and the last slot counts everything from `2^39` ns (≈ 550 s) up.
pub const RUNQ_SLOTS: usize = 40;

/// [`RunqLatencyRecord::flags`] bit: the wait began with an involuntary preemption (the thread
/// was still runnable when it was switched out) rather than a wakeup.
pub const RUNQ_FLAG_PREEMPTED: u32 = 1;

/// The log2 slot of a wait of `ns` nanoseconds (see [`RUNQ_SLOTS`]). Loop-free so that the eBPF
/// verifier accepts it.
#[inline(always)]
pub const fn log2_slot(ns: u64) -> usize {
    let mut v = ns;
    let mut r = 0u32;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    if r as usize >= RUNQ_SLOTS {
        RUNQ_SLOTS - 1
    } else {
        r as usize
    }
}

/// One run-queue wait above the configured outlier threshold, sent through the `RUNQ_EVENTS`
/// ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunqLatencyRecord {
    /// `{ kind: RunqLatency, version: 1, len: 64 }`.
    pub header: RecordHeader,
    /// CLOCK_MONOTONIC ns at which the thread got the CPU (the end of the wait).
    pub ts_ns: u64,
    /// How long the thread waited on the run queue, in ns.
    pub delay_ns: u64,
    /// Process id (thread group id) of the thread.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU the thread got.
    pub cpu: u32,
    /// [`RUNQ_FLAG_PREEMPTED`] or 0.
    pub flags: u32,
    /// Thread name (`task->comm`), NUL-padded.
    pub comm: [u8; 16],
    /// Thread that ran on that CPU just before (the last one it waited behind).
    pub prev_tid: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<RunqLatencyRecord>() == 64);

// SAFETY: repr(C), header first, integers only, no implicit padding (size pinned above).
unsafe impl Record for RunqLatencyRecord {
    const KIND: RecordKind = RecordKind::RunqLatency;
    const VERSION: u16 = 1;

    fn header(&self) -> &RecordHeader {
        &self.header
    }
}

/// Per-thread scheduling and traffic statistics, the value type of the `THREADS` map (key: thread
/// id). Counters are cumulative since the thread was first seen; the agent turns reads into
/// deltas. The two stamps are the programs' bookkeeping for the wait or off-CPU period in
/// progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadStats {
    /// When the thread last left a CPU, 0 while it runs: the scheduler's clock (`rq->clock`) with
    /// the scheduler's stamps ([`SchedOffsets::enabled`]), CLOCK_MONOTONIC ns without.
    pub off_ts: u64,
    /// With the wakeup programs: CLOCK_MONOTONIC ns when it last became runnable, 0 while it is
    /// not waiting for a CPU. With the scheduler's stamps ([`SchedOffsets::enabled`]): the
    /// task's `sched_info.run_delay` just after its last switch-in.
    pub queued_ts: u64,
    /// Run-queue waits per log2 slot, see [`RUNQ_SLOTS`].
    pub runq_slots: [u64; RUNQ_SLOTS],
    /// Number of run-queue waits.
    pub runq_count: u64,
    /// Sum of run-queue waits, ns.
    pub runq_total_ns: u64,
    /// Longest run-queue wait, ns.
    pub runq_max_ns: u64,
    /// Run-queue waits that began with an involuntary preemption.
    pub runq_preempted: u64,
    /// Time off CPU after switching out voluntarily (blocked or sleeping), ns: from switch-out
    /// to the next switch-in, so it includes the run-queue wait after the wakeup.
    pub offcpu_voluntary_ns: u64,
    /// Time off CPU after being preempted (still runnable), ns.
    pub offcpu_involuntary_ns: u64,
    /// Voluntary switches out.
    pub switches_voluntary: u64,
    /// Involuntary switches out (preemptions).
    pub switches_involuntary: u64,
    /// TCP payload bytes this thread sent (`sock_send_length`).
    pub tcp_sent_bytes: u64,
    /// TCP payload bytes this thread received (`sock_recv_length`).
    pub tcp_recv_bytes: u64,
    /// Process id (thread group id).
    pub tgid: u32,
    /// [`THREAD_EXITED`], [`THREAD_OFF_INVOLUNTARY`].
    pub flags: u32,
    /// Thread name, NUL-padded (refreshed on the 1st, 2nd, 4th, 8th… switch-in and at exit).
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<ThreadStats>() == 440);

/// [`ThreadStats::flags`] bit: the thread has exited; the agent reads the entry one last time and
/// deletes it.
pub const THREAD_EXITED: u32 = 1 << 1;

/// [`ThreadStats::flags`] bit: the off-CPU period in progress began with a preemption.
pub const THREAD_OFF_INVOLUNTARY: u32 = 1 << 2;

impl ThreadStats {
    /// An empty entry.
    pub const ZERO: Self = Self {
        off_ts: 0,
        queued_ts: 0,
        runq_slots: [0; RUNQ_SLOTS],
        runq_count: 0,
        runq_total_ns: 0,
        runq_max_ns: 0,
        runq_preempted: 0,
        offcpu_voluntary_ns: 0,
        offcpu_involuntary_ns: 0,
        switches_voluntary: 0,
        switches_involuntary: 0,
        tcp_sent_bytes: 0,
        tcp_recv_bytes: 0,
        tgid: 0,
        flags: 0,
        comm: [0; 16],
    };
}

/// Byte offsets through which `sched_switch` reads the scheduler's own run-queue stamps (the
/// agent patches them in from kernel BTF as the global `SCHED_OFFSETS`). With `enabled` set, a
/// wait is the switching CPU's `rq->clock` minus the woken task's `sched_info.last_queued`, plus
/// what `sched_info.run_delay` gained since the task last ran (the part of a wait spent on
/// another CPU's queue before a migration), so the wakeup programs are not attached at all.
/// Without `enabled` (a kernel without `CONFIG_SCHED_INFO` or `CONFIG_FAIR_GROUP_SCHED`), the
/// wakeup programs stamp waits themselves.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SchedOffsets {
    /// 1: read the scheduler's stamps; 0: the wakeup programs stamp waits.
    pub enabled: u32,
    /// `task_struct.sched_info.last_queued` (rq clock ns when it was queued; 0 if not queued).
    pub last_queued: u32,
    /// `task_struct.sched_info.run_delay` (rq clock ns spent waiting, all its life).
    pub run_delay: u32,
    /// `task_struct.se.cfs_rq` (the task's CFS run queue on its CPU).
    pub se_cfs_rq: u32,
    /// `cfs_rq.rq` (the CPU's run queue).
    pub cfs_rq_rq: u32,
    /// `rq.clock` (updated by `__schedule` just before `sched_switch`).
    pub rq_clock: u32,
}
const _: () = assert!(size_of::<SchedOffsets>() == 24);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain old data, see the size assertions and field types above.
    unsafe impl aya::Pod for super::ThreadStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SchedOffsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RunqLatencyRecord {}
}
