//! Process-tree events: fork (a new process, not a new thread), exec and exit of a process's
//! main thread. Produced by `ebpf/src/proc.rs` from the `sched_process_fork`,
//! `sched_process_exec` and `sched_process_exit` BTF tracepoints; they let the agent follow a
//! job's process tree (DataLoader workers, compile workers) and keep the kernel-side target set
//! (`TRACKED`) in step with it.

use core::mem::size_of;

use crate::{Record, RecordHeader, RecordKind};

/// [`ProcessEventRecord::event`]: a new process (`pid`) forked from `ppid`.
pub const PROC_FORK: u32 = 1;
/// [`ProcessEventRecord::event`]: process `pid` executed a new program (`comm` is its new name).
pub const PROC_EXEC: u32 = 2;
/// [`ProcessEventRecord::event`]: the main thread of process `pid` exited.
pub const PROC_EXIT: u32 = 3;

/// One process-tree event, sent through the `PROC_EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEventRecord {
    /// `{ kind: ProcessEvent, version: 1, len: 48 }`.
    pub header: RecordHeader,
    /// CLOCK_MONOTONIC ns of the event.
    pub ts_ns: u64,
    /// [`PROC_FORK`], [`PROC_EXEC`] or [`PROC_EXIT`].
    pub event: u32,
    /// The process (thread group id).
    pub pid: u32,
    /// Its parent process (for a fork: the forking process).
    pub ppid: u32,
    /// The thread that caused the event (for a fork: the forking thread).
    pub tid: u32,
    /// Name of the process after the event, NUL-padded.
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<ProcessEventRecord>() == 48);

// SAFETY: repr(C), header first, integers only, no implicit padding (size pinned above).
unsafe impl Record for ProcessEventRecord {
    const KIND: RecordKind = RecordKind::ProcessEvent;
    const VERSION: u16 = 1;

    fn header(&self) -> &RecordHeader {
        &self.header
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain old data (size pinned above).
    unsafe impl aya::Pod for super::ProcessEventRecord {}
}
