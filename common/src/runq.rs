//! Run-queue latency: the time a thread spends runnable but not running (woken or preempted,
//! waiting for a CPU). Produced by `ebpf/src/sched.rs` from the `sched_wakeup`,
//! `sched_wakeup_new` and `sched_switch` BTF tracepoints (kernel 5.5+, BTF required).

use core::mem::size_of;

use crate::{Record, RecordHeader, RecordKind};

/// Number of log2 slots in a [`RunqHist`]: slot `i` counts waits in `[2^i, 2^(i+1))` ns, slot 0
/// also counts 0 and 1 ns, and the last slot counts everything from `2^39` ns (≈ 550 s) up.
pub const RUNQ_SLOTS: usize = 40;

/// [`RunqLatencyRecord::flags`] / [`RunqHist`] bit: the wait began with an involuntary preemption
/// (the thread was still runnable when it was switched out) rather than a wakeup.
pub const RUNQ_FLAG_PREEMPTED: u32 = 1;

/// [`RunqHist::flags`] bit: the thread has exited; the agent reads the entry one last time and
/// deletes it.
pub const RUNQ_HIST_EXITED: u32 = 1 << 1;

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

/// Per-thread run-queue latency histogram, the value type of the `RUNQ_HIST` map (key: thread id).
/// Cumulative since the thread was first seen; the agent turns reads into deltas.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunqHist {
    /// Log2 slots, see [`RUNQ_SLOTS`].
    pub slots: [u64; RUNQ_SLOTS],
    /// Number of waits.
    pub count: u64,
    /// Sum of all waits, ns.
    pub total_ns: u64,
    /// Longest wait, ns.
    pub max_ns: u64,
    /// Waits that began with an involuntary preemption.
    pub preempted: u64,
    /// Process id (thread group id).
    pub tgid: u32,
    /// [`RUNQ_HIST_EXITED`] or 0.
    pub flags: u32,
    /// Thread name when the entry was created, NUL-padded.
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<RunqHist>() == 376);

impl RunqHist {
    /// An empty histogram.
    pub const ZERO: Self = Self {
        slots: [0; RUNQ_SLOTS],
        count: 0,
        total_ns: 0,
        max_ns: 0,
        preempted: 0,
        tgid: 0,
        flags: 0,
        comm: [0; 16],
    };
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain old data, see the size assertions and field types above.
    unsafe impl aya::Pod for super::RunqHist {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RunqLatencyRecord {}
}
