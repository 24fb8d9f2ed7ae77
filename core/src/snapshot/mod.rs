//! The immutable snapshot the agent publishes once per tick: exporters, `observe`, the state API,
//! `top` and the healer read it and never the sources. Views derived from several sources
//! (stragglers) are computed once, when it is made ([`Snapshot::derive`]); per-process
//! statistics come with each process ([`process::IterationStats`]); iteration histories are
//! shared, not copied.

pub mod process;

pub use process::{IterationHistory, IterationStats, OpSummary, ProcessSnapshot};

use std::collections::{BTreeMap, VecDeque};

use slo_probe_common::{Counter, RunqLatencyRecord};

use crate::{
    cgroup::{CgroupRow, PressureRow},
    gpu::GpuSnapshot,
    net::NetSnapshot,
    roles::comm_to_string,
    straggler::{stragglers, RankView},
    threads::ThreadsSnapshot,
};

/// State of one probe family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeStatus {
    /// Probe name (`runqueue`, ...).
    pub name: &'static str,
    /// Attached and reporting.
    pub up: bool,
    /// Why it is down (empty when up).
    pub reason: String,
}

/// The agent's own cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AgentStats {
    /// CPU time used by the agent process since start, seconds.
    pub cpu_seconds: f64,
    /// Resident memory, bytes.
    pub resident_bytes: u64,
    /// Ticks since start.
    pub ticks: u64,
}

/// One run-queue outlier, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outlier {
    /// CLOCK_MONOTONIC ns when the wait ended.
    pub ts_ns: u64,
    /// Length of the wait, ns.
    pub delay_ns: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub thread: String,
    /// CPU it got.
    pub cpu: u32,
    /// The wait began with a preemption (else a wakeup).
    pub preempted: bool,
    /// The thread that ran on that CPU just before.
    pub prev_tid: u32,
}

impl From<&RunqLatencyRecord> for Outlier {
    fn from(r: &RunqLatencyRecord) -> Self {
        Self {
            ts_ns: r.ts_ns,
            delay_ns: r.delay_ns,
            pid: r.tgid,
            tid: r.tid,
            thread: comm_to_string(&r.comm),
            cpu: r.cpu,
            preempted: r.flags & slo_probe_common::RUNQ_FLAG_PREEMPTED != 0,
            prev_tid: r.prev_tid,
        }
    }
}

/// Outliers: a count per process and the most recent few.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutlierSnapshot {
    /// Outliers per process id since start (processes leave with the thread table).
    pub per_process: BTreeMap<u32, u64>,
    /// The latest outliers, oldest first.
    pub recent: Vec<Outlier>,
}

/// Keeps outlier counts and a bounded list of the latest outliers.
pub struct OutlierLog {
    per_process: BTreeMap<u32, u64>,
    recent: VecDeque<Outlier>,
    capacity: usize,
}

impl OutlierLog {
    /// A log keeping the latest `capacity` outliers.
    pub fn new(capacity: usize) -> Self {
        Self {
            per_process: BTreeMap::new(),
            recent: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Records one outlier.
    pub fn push(&mut self, r: &RunqLatencyRecord) {
        *self.per_process.entry(r.tgid).or_default() += 1;
        if self.capacity == 0 {
            return;
        }
        if self.recent.len() == self.capacity {
            self.recent.pop_front();
        }
        self.recent.push_back(Outlier::from(r));
    }

    /// The current state; counts of processes that `keep` rejects are dropped first, so that
    /// the map does not grow with every process the machine ever ran.
    pub fn snapshot(&mut self, keep: impl Fn(u32) -> bool) -> OutlierSnapshot {
        self.per_process.retain(|pid, _| keep(*pid));
        OutlierSnapshot {
            per_process: self.per_process.clone(),
            recent: self.recent.iter().cloned().collect(),
        }
    }
}

/// Everything the agent knows at one tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC ns of the tick.
    pub taken_at_ns: u64,
    /// Per-thread host statistics by thread, (process, role) and process (`None` while the
    /// scheduling probes are down).
    pub threads: Option<ThreadsSnapshot>,
    /// Run-queue outliers.
    pub outliers: OutlierSnapshot,
    /// TCP connections (`None` while the network probes are down).
    pub net: Option<NetSnapshot>,
    /// The job's cgroups: CPU throttling and pressure.
    pub cgroups: Vec<CgroupRow>,
    /// System-wide pressure stall information (empty where the kernel has no PSI).
    pub pressure: Vec<PressureRow>,
    /// Training processes with a CUPTI shim: GPU activity, iterations, SLO tree.
    pub processes: Vec<ProcessSnapshot>,
    /// The straggler view of every job with two or more ranks here (see [`Snapshot::derive`]).
    pub stragglers: Vec<RankView>,
    /// Kernel-side drop and error counters, indexed by [`Counter`], plus the agent's own
    /// decode errors in [`Counter::DecodeFailed`].
    pub counters: [u64; Counter::COUNT as usize],
    /// State of each probe family.
    pub probes: Vec<ProbeStatus>,
    /// The agent's own cost.
    pub agent: AgentStats,
    /// GPU metrics from NVML (`None` where no NVIDIA driver or GPU is present).
    pub gpus: Option<GpuSnapshot>,
}

impl Snapshot {
    /// Computes the views derived from several sources (once per tick, by whoever makes the
    /// snapshot).
    pub fn derive(mut self) -> Self {
        self.stragglers = stragglers(&self.processes);
        self
    }

    /// A training process by pid.
    pub fn process(&self, pid: u32) -> Option<&ProcessSnapshot> {
        self.processes.iter().find(|p| p.pid == pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::RecordHeader;

    fn record(pid: u32, delay_ns: u64) -> RunqLatencyRecord {
        RunqLatencyRecord {
            header: RecordHeader::of::<RunqLatencyRecord>(),
            ts_ns: 1,
            delay_ns,
            tgid: pid,
            tid: pid,
            cpu: 0,
            flags: 0,
            comm: *b"x\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            prev_tid: 0,
            _pad: 0,
        }
    }

    #[test]
    fn bounded_recent_and_pruned_counts() {
        let mut log = OutlierLog::new(2);
        for (pid, d) in [(1, 10), (2, 20), (1, 30)] {
            log.push(&record(pid, d));
        }
        let s = log.snapshot(|_| true);
        assert_eq!(s.recent.len(), 2);
        assert_eq!(s.recent[0].delay_ns, 20);
        assert_eq!(s.per_process.get(&1), Some(&2));
        let s = log.snapshot(|pid| pid != 1);
        assert_eq!(s.per_process.get(&1), None);
        assert_eq!(s.per_process.get(&2), Some(&1));
    }
}
