//! Per-thread host statistics (run-queue latency, off-CPU time, TCP bytes): turns cumulative
//! per-thread values read from the kernel into counters that only ever grow (what Prometheus
//! expects), per thread and per (process, role), surviving thread exit and thread-id reuse, and
//! publishes them as an immutable [`ThreadsSnapshot`].

use std::collections::{BTreeMap, BTreeSet};

use slo_probe_common::{ThreadStats, RUNQ_SLOTS, THREAD_EXITED};

use crate::{
    proctree::ProcessTree,
    roles::{ProcessKind, Role, RoleRules},
};

/// Log2-bucketed run-queue waits (slot `i` = waits in `[2^i, 2^(i+1))` ns) with totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunqCounts {
    /// Waits per log2 slot.
    pub slots: [u64; RUNQ_SLOTS],
    /// Number of waits.
    pub count: u64,
    /// Sum of waits, ns.
    pub total_ns: u64,
    /// Longest single wait seen, ns.
    pub max_ns: u64,
    /// Waits that began with an involuntary preemption rather than a wakeup.
    pub preempted: u64,
}

impl Default for RunqCounts {
    fn default() -> Self {
        Self {
            slots: [0; RUNQ_SLOTS],
            count: 0,
            total_ns: 0,
            max_ns: 0,
            preempted: 0,
        }
    }
}

impl RunqCounts {
    /// `self - earlier`, slot by slot; `None` when any counter went backwards.
    pub fn since(&self, earlier: &Self) -> Option<Self> {
        let mut out = Self::default();
        for (o, (a, b)) in out
            .slots
            .iter_mut()
            .zip(self.slots.iter().zip(earlier.slots.iter()))
        {
            *o = a.checked_sub(*b)?;
        }
        out.count = self.count.checked_sub(earlier.count)?;
        out.total_ns = self.total_ns.checked_sub(earlier.total_ns)?;
        out.preempted = self.preempted.checked_sub(earlier.preempted)?;
        out.max_ns = self.max_ns;
        Some(out)
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Self) {
        for (a, b) in self.slots.iter_mut().zip(other.slots.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.total_ns += other.total_ns;
        self.preempted += other.preempted;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Mean wait in ns, `None` without waits.
    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.total_ns as f64 / self.count as f64)
    }

    /// Estimated `q`-quantile (0 ≤ q ≤ 1) in ns: linear interpolation inside the log2 slot that
    /// holds it, clamped to the largest wait seen. The estimate is within a factor of 2 of the
    /// true value by construction of the slots. `None` without waits.
    pub fn quantile_ns(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).max(1.0);
        let mut seen = 0u64;
        for (i, &n) in self.slots.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if (seen + n) as f64 >= rank {
                let lo = if i == 0 { 0.0 } else { (1u64 << i) as f64 };
                let hi = (1u64 << (i + 1)) as f64;
                let frac = (rank - seen as f64) / n as f64;
                let est = lo + (hi - lo) * frac;
                return Some(if self.max_ns > 0 {
                    est.min(self.max_ns as f64)
                } else {
                    est
                });
            }
            seen += n;
        }
        Some(self.max_ns as f64)
    }

    /// Number of waits shorter than `2^(slot+1)` ns: the cumulative count of a Prometheus bucket
    /// with that upper bound.
    pub fn cumulative_below_slot_end(&self, slot: usize) -> u64 {
        self.slots.iter().take(slot + 1).sum()
    }
}

/// Everything counted for a thread (or summed over threads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCounts {
    /// Run-queue latency.
    pub runq: RunqCounts,
    /// Off-CPU time after voluntary switches (blocked, sleeping), ns.
    pub offcpu_voluntary_ns: u64,
    /// Off-CPU time after preemptions, ns.
    pub offcpu_involuntary_ns: u64,
    /// Voluntary context switches.
    pub switches_voluntary: u64,
    /// Involuntary context switches.
    pub switches_involuntary: u64,
    /// TCP payload bytes sent.
    pub tcp_sent_bytes: u64,
    /// TCP payload bytes received.
    pub tcp_recv_bytes: u64,
}

impl ThreadCounts {
    /// The counts of a kernel entry.
    pub fn from_stats(s: &ThreadStats) -> Self {
        Self {
            runq: RunqCounts {
                slots: s.runq_slots,
                count: s.runq_count,
                total_ns: s.runq_total_ns,
                max_ns: s.runq_max_ns,
                preempted: s.runq_preempted,
            },
            offcpu_voluntary_ns: s.offcpu_voluntary_ns,
            offcpu_involuntary_ns: s.offcpu_involuntary_ns,
            switches_voluntary: s.switches_voluntary,
            switches_involuntary: s.switches_involuntary,
            tcp_sent_bytes: s.tcp_sent_bytes,
            tcp_recv_bytes: s.tcp_recv_bytes,
        }
    }

    /// `self - earlier`; `None` when any counter went backwards (the kernel entry was replaced,
    /// e.g. a reused thread id).
    pub fn since(&self, earlier: &Self) -> Option<Self> {
        Some(Self {
            runq: self.runq.since(&earlier.runq)?,
            offcpu_voluntary_ns: self
                .offcpu_voluntary_ns
                .checked_sub(earlier.offcpu_voluntary_ns)?,
            offcpu_involuntary_ns: self
                .offcpu_involuntary_ns
                .checked_sub(earlier.offcpu_involuntary_ns)?,
            switches_voluntary: self
                .switches_voluntary
                .checked_sub(earlier.switches_voluntary)?,
            switches_involuntary: self
                .switches_involuntary
                .checked_sub(earlier.switches_involuntary)?,
            tcp_sent_bytes: self.tcp_sent_bytes.checked_sub(earlier.tcp_sent_bytes)?,
            tcp_recv_bytes: self.tcp_recv_bytes.checked_sub(earlier.tcp_recv_bytes)?,
        })
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Self) {
        self.runq.add(&other.runq);
        self.offcpu_voluntary_ns += other.offcpu_voluntary_ns;
        self.offcpu_involuntary_ns += other.offcpu_involuntary_ns;
        self.switches_voluntary += other.switches_voluntary;
        self.switches_involuntary += other.switches_involuntary;
        self.tcp_sent_bytes += other.tcp_sent_bytes;
        self.tcp_recv_bytes += other.tcp_recv_bytes;
    }
}

/// One thread since the agent first saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadRow {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub name: String,
    /// Its role now.
    pub role: Role,
    /// Counts since first seen (monotonic).
    pub counts: ThreadCounts,
    /// The thread has exited; the row is kept for the retention period.
    pub exited: bool,
}

/// The threads of one role in one process, including exited ones: the export unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRow {
    /// Process id.
    pub pid: u32,
    /// Process name.
    pub process: String,
    /// The role.
    pub role: Role,
    /// Counts of every thread that had this role in this process (monotonic).
    pub counts: ThreadCounts,
    /// Threads with this role in the table now.
    pub threads: u32,
}

/// One process: all its threads, all roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRow {
    /// Process id.
    pub pid: u32,
    /// Parent process id (0 if unknown).
    pub ppid: u32,
    /// Process name (its main thread's name).
    pub name: String,
    /// What it is to the job.
    pub kind: ProcessKind,
    /// Counts of every thread it had (monotonic).
    pub counts: ThreadCounts,
    /// Threads in the table now.
    pub threads: u32,
}

/// What one read of the kernel map returned for a thread.
#[derive(Clone, Copy, Debug)]
pub struct ThreadRead {
    /// Thread id (the map key).
    pub tid: u32,
    /// The map value.
    pub stats: ThreadStats,
}

/// Everything the per-thread probes know at one tick, immutable once published.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadsSnapshot {
    /// CLOCK_MONOTONIC ns of the read this snapshot comes from.
    pub taken_at_ns: u64,
    /// Threads, ordered by (pid, tid).
    pub threads: Vec<ThreadRow>,
    /// (process, role) groups, ordered by (pid, role).
    pub groups: Vec<GroupRow>,
    /// Processes, ordered by pid.
    pub processes: Vec<ProcessRow>,
}

impl ThreadsSnapshot {
    /// The process with this pid.
    pub fn process(&self, pid: u32) -> Option<&ProcessRow> {
        self.processes
            .binary_search_by_key(&pid, |p| p.pid)
            .ok()
            .map(|i| &self.processes[i])
    }

    /// The thread with this tid.
    pub fn thread(&self, tid: u32) -> Option<&ThreadRow> {
        self.threads.iter().find(|t| t.tid == tid)
    }

    /// Counts per role over the processes in `pids` (every process when `None`).
    pub fn by_role(&self, pids: Option<&BTreeSet<u32>>) -> BTreeMap<Role, ThreadCounts> {
        let mut out: BTreeMap<Role, ThreadCounts> = BTreeMap::new();
        for g in &self.groups {
            if pids.is_none_or(|p| p.contains(&g.pid)) {
                out.entry(g.role).or_default().add(&g.counts);
            }
        }
        out
    }
}

struct ThreadState {
    pid: u32,
    name: String,
    role: Role,
    /// Last kernel value, to compute deltas.
    last: ThreadCounts,
    /// Monotonic total across entry replacements.
    total: ThreadCounts,
    exited_at_tick: Option<u64>,
}

struct GroupState {
    total: ThreadCounts,
    last_seen_tick: u64,
}

struct ProcessState {
    total: ThreadCounts,
    last_seen_tick: u64,
}

/// Folds successive kernel reads into monotonic per-thread, per-(process, role) and per-process
/// counts.
pub struct ThreadTable {
    threads: BTreeMap<u32, ThreadState>,
    groups: BTreeMap<(u32, Role), GroupState>,
    processes: BTreeMap<u32, ProcessState>,
    tick: u64,
    retention_ticks: u64,
}

impl ThreadTable {
    /// A table that keeps exited threads and vanished processes for `retention_ticks` reads.
    pub fn new(retention_ticks: u64) -> Self {
        Self {
            threads: BTreeMap::new(),
            groups: BTreeMap::new(),
            processes: BTreeMap::new(),
            tick: 0,
            retention_ticks,
        }
    }

    /// Applies one full read of the kernel map and returns the snapshot. Threads of processes
    /// outside the job (`tree.in_job`) are ignored. Roles come from `rules` over the names in
    /// this read and the tree.
    pub fn apply(
        &mut self,
        taken_at_ns: u64,
        reads: &[ThreadRead],
        tree: &ProcessTree,
        rules: &RoleRules,
    ) -> ThreadsSnapshot {
        self.tick += 1;
        let tick = self.tick;

        // 1. Thread deltas.
        let mut deltas: Vec<(u32, ThreadCounts)> = Vec::with_capacity(reads.len());
        for r in reads {
            let pid = r.stats.tgid;
            if !tree.in_job(pid) {
                continue;
            }
            let now = ThreadCounts::from_stats(&r.stats);
            let name = crate::roles::comm_to_string(&r.stats.comm);
            let exited = r.stats.flags & THREAD_EXITED != 0;
            let delta = match self.threads.get_mut(&r.tid) {
                Some(t) if t.pid == pid => {
                    // A counter going backwards means the kernel entry was replaced (the thread
                    // id was reused): everything in the new entry is new.
                    let d = now.since(&t.last).unwrap_or(now);
                    t.last = now;
                    t.total.add(&d);
                    t.name = name;
                    if exited {
                        t.exited_at_tick.get_or_insert(tick);
                    } else {
                        t.exited_at_tick = None;
                    }
                    d
                }
                _ => {
                    self.threads.insert(
                        r.tid,
                        ThreadState {
                            pid,
                            name,
                            role: Role::Other,
                            last: now,
                            total: now,
                            exited_at_tick: exited.then_some(tick),
                        },
                    );
                    now
                }
            };
            deltas.push((r.tid, delta));
        }

        // 2. Process kinds from the names of their threads, then thread roles.
        let mut names: BTreeMap<u32, Vec<(u32, &str)>> = BTreeMap::new();
        for (&tid, t) in &self.threads {
            names.entry(t.pid).or_default().push((tid, t.name.as_str()));
        }
        let kinds: BTreeMap<u32, ProcessKind> = names
            .iter()
            .map(|(&pid, threads)| {
                let main = threads
                    .iter()
                    .find(|(tid, _)| *tid == pid)
                    .map(|(_, n)| *n)
                    .or_else(|| tree.get(pid).map(|n| n.name.as_str()))
                    .unwrap_or("");
                let kind =
                    rules.process_kind(tree.is_root(pid), main, threads.iter().map(|(_, n)| *n));
                (pid, kind)
            })
            .collect();
        for (&tid, t) in self.threads.iter_mut() {
            let kind = kinds.get(&t.pid).copied().unwrap_or(ProcessKind::Other);
            t.role = rules.thread_role(kind, t.pid, tid, &t.name);
        }

        // 3. Group and process totals get this tick's deltas under the current roles.
        for (tid, d) in &deltas {
            let Some(t) = self.threads.get(tid) else {
                continue;
            };
            let g = self
                .groups
                .entry((t.pid, t.role))
                .or_insert_with(|| GroupState {
                    total: ThreadCounts::default(),
                    last_seen_tick: tick,
                });
            g.total.add(d);
            g.last_seen_tick = tick;
            let p = self.processes.entry(t.pid).or_insert_with(|| ProcessState {
                total: ThreadCounts::default(),
                last_seen_tick: tick,
            });
            p.total.add(d);
            p.last_seen_tick = tick;
        }

        // 4. Retention.
        let retention = self.retention_ticks;
        self.threads
            .retain(|_, t| t.exited_at_tick.is_none_or(|at| tick - at <= retention));
        let live: BTreeSet<u32> = self.threads.values().map(|t| t.pid).collect();
        self.groups
            .retain(|(pid, _), g| tick - g.last_seen_tick <= retention || live.contains(pid));
        self.processes
            .retain(|pid, p| tick - p.last_seen_tick <= retention || live.contains(pid));

        self.snapshot(taken_at_ns, tree, &kinds)
    }

    fn snapshot(
        &self,
        taken_at_ns: u64,
        tree: &ProcessTree,
        kinds: &BTreeMap<u32, ProcessKind>,
    ) -> ThreadsSnapshot {
        let process_name = |pid: u32| -> String {
            self.threads
                .get(&pid)
                .filter(|t| t.pid == pid)
                .map(|t| t.name.clone())
                .or_else(|| tree.get(pid).map(|n| n.name.clone()))
                .unwrap_or_default()
        };
        let threads: Vec<ThreadRow> = self
            .threads
            .iter()
            .map(|(&tid, t)| ThreadRow {
                pid: t.pid,
                tid,
                name: t.name.clone(),
                role: t.role,
                counts: t.total,
                exited: t.exited_at_tick.is_some(),
            })
            .collect::<Vec<_>>();
        let mut threads = threads;
        threads.sort_by_key(|t| (t.pid, t.tid));
        let groups = self
            .groups
            .iter()
            .map(|(&(pid, role), g)| GroupRow {
                pid,
                process: process_name(pid),
                role,
                counts: g.total,
                threads: threads
                    .iter()
                    .filter(|t| t.pid == pid && t.role == role)
                    .count() as u32,
            })
            .collect();
        let processes = self
            .processes
            .iter()
            .map(|(&pid, p)| ProcessRow {
                pid,
                ppid: tree.get(pid).map_or(0, |n| n.ppid),
                name: process_name(pid),
                kind: kinds.get(&pid).copied().unwrap_or(ProcessKind::Other),
                counts: p.total,
                threads: threads.iter().filter(|t| t.pid == pid).count() as u32,
            })
            .collect();
        ThreadsSnapshot {
            taken_at_ns,
            threads,
            groups,
            processes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::log2_slot;

    fn stats(pid: u32, name: &str, waits: &[u64]) -> ThreadStats {
        let mut h = ThreadStats::ZERO;
        h.tgid = pid;
        h.comm[..name.len()].copy_from_slice(name.as_bytes());
        for &w in waits {
            h.runq_slots[log2_slot(w)] += 1;
            h.runq_count += 1;
            h.runq_total_ns += w;
            h.runq_max_ns = h.runq_max_ns.max(w);
        }
        h
    }

    fn read(tid: u32, stats: ThreadStats) -> ThreadRead {
        ThreadRead { tid, stats }
    }

    fn apply(t: &mut ThreadTable, reads: &[ThreadRead]) -> ThreadsSnapshot {
        t.apply(1, reads, &ProcessTree::new(), &RoleRules::default())
    }

    #[test]
    fn quantiles_within_a_factor_of_two() {
        let waits: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let c = ThreadCounts::from_stats(&stats(1, "t", &waits)).runq;
        for q in [0.5, 0.9, 0.99] {
            let truth = waits[(q * 1000.0) as usize - 1] as f64;
            let est = c.quantile_ns(q).expect("q");
            assert!(
                est / truth < 2.0 && truth / est < 2.0,
                "q={q} est={est} truth={truth}"
            );
        }
        assert_eq!(c.quantile_ns(1.0), Some(1_000_000.0));
        assert_eq!(RunqCounts::default().quantile_ns(0.5), None);
        assert_eq!(c.mean_ns(), Some(500_500.0));
    }

    #[test]
    fn deltas_accumulate_and_survive_exit() {
        let mut t = ThreadTable::new(2);
        let s = apply(&mut t, &[read(11, stats(10, "worker", &[100, 200]))]);
        assert_eq!(s.thread(11).expect("t").counts.runq.count, 2);
        assert_eq!(s.process(10).expect("p").counts.runq.total_ns, 300);

        let mut h = stats(10, "worker", &[100, 200, 5000]);
        h.flags = THREAD_EXITED;
        let s = apply(&mut t, &[read(11, h)]);
        let th = s.thread(11).expect("t");
        assert!(th.exited);
        assert_eq!(th.counts.runq.count, 3);
        assert_eq!(s.process(10).expect("p").counts.runq.total_ns, 5300);

        // The agent deleted the exited entry: the row stays for the retention period...
        assert!(apply(&mut t, &[]).thread(11).is_some());
        assert!(apply(&mut t, &[]).thread(11).is_some());
        // ...then goes, and so does the process that has no thread left.
        let s = apply(&mut t, &[]);
        assert!(s.thread(11).is_none());
        assert!(s.process(10).is_none());
        assert!(s.groups.is_empty());
    }

    #[test]
    fn reused_thread_id_does_not_go_backwards() {
        let mut t = ThreadTable::new(10);
        apply(&mut t, &[read(5, stats(4, "a", &[10, 10, 10]))]);
        let s = apply(&mut t, &[read(5, stats(4, "a", &[7]))]);
        let c = s.thread(5).expect("t").counts.runq;
        assert_eq!(c.count, 4);
        assert_eq!(c.total_ns, 37);
        // Same tid in another process: a new thread row, the old process keeps its total.
        let s = apply(&mut t, &[read(5, stats(9, "b", &[1]))]);
        assert_eq!(s.thread(5).expect("t").pid, 9);
        assert_eq!(s.process(4).expect("p4").counts.runq.count, 4);
        assert_eq!(s.process(9).expect("p9").counts.runq.count, 1);
    }

    #[test]
    fn roles_group_threads_of_a_training_process() {
        let mut t = ThreadTable::new(10);
        let mut tree = ProcessTree::new();
        tree.set_roots([20]);
        tree.observe(20, 1, "python3");
        tree.observe(30, 20, "pt_data_worker");
        let mut sent = stats(20, "pt_nccl_watchdg", &[5]);
        sent.tcp_sent_bytes = 1000;
        let s = t.apply(
            1,
            &[
                read(20, stats(20, "python3", &[1, 1])),
                read(21, stats(20, "pt_autograd_0", &[2])),
                read(22, sent),
                read(23, stats(20, "pt_data_pin", &[3])),
                read(24, stats(20, "python3", &[4])),
                read(30, stats(30, "pt_data_worker", &[7])),
                read(31, stats(30, "pt_data_worker", &[8])),
                read(99, stats(99, "sshd", &[9])),
            ],
            &tree,
            &RoleRules::default(),
        );
        assert!(s.process(99).is_none(), "outside the job");
        let by_role = s.by_role(None);
        assert_eq!(by_role[&Role::Main].runq.count, 3);
        assert_eq!(by_role[&Role::Communication].tcp_sent_bytes, 1000);
        assert_eq!(by_role[&Role::PinMemory].runq.total_ns, 3);
        assert_eq!(by_role[&Role::Other].runq.total_ns, 4);
        assert_eq!(by_role[&Role::DataLoader].runq.total_ns, 15);
        assert_eq!(s.process(30).expect("worker").kind, ProcessKind::DataLoader);
        assert_eq!(s.process(20).expect("rank").kind, ProcessKind::Training);
        let g = s
            .groups
            .iter()
            .find(|g| g.pid == 30 && g.role == Role::DataLoader)
            .expect("group");
        assert_eq!((g.threads, g.process.as_str()), (2, "pt_data_worker"));
    }

    #[test]
    fn bucket_counts_are_cumulative() {
        let c = ThreadCounts::from_stats(&stats(1, "t", &[1, 3, 1024, 1 << 20])).runq;
        assert_eq!(c.cumulative_below_slot_end(0), 1);
        assert_eq!(c.cumulative_below_slot_end(1), 2);
        assert_eq!(c.cumulative_below_slot_end(10), 3);
        assert_eq!(c.cumulative_below_slot_end(RUNQ_SLOTS - 1), 4);
    }
}
