//! Run-queue latency aggregation: turns cumulative per-thread histograms read from the kernel
//! into a table of threads and processes whose counters only ever grow (what Prometheus expects),
//! surviving thread exit and thread-id reuse, and publishes it as an immutable [`RunqSnapshot`].

use std::collections::BTreeMap;

use slo_probe_common::{RunqHist, RUNQ_HIST_EXITED, RUNQ_SLOTS};

/// Log2-bucketed wait counts (slot `i` = waits in `[2^i, 2^(i+1))` ns) with totals.
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
    /// The counts of a kernel histogram.
    pub fn from_hist(h: &RunqHist) -> Self {
        Self {
            slots: h.slots,
            count: h.count,
            total_ns: h.total_ns,
            max_ns: h.max_ns,
            preempted: h.preempted,
        }
    }

    /// `self - earlier`, slot by slot; `None` when any counter went backwards (the entry was
    /// replaced, e.g. a reused thread id).
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

/// One thread's run-queue latency since the agent first saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadRunq {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub name: String,
    /// Counts since first seen (monotonic).
    pub counts: RunqCounts,
    /// The thread has exited; the row is kept for the retention period.
    pub exited: bool,
}

/// One process's run-queue latency: every thread it ever had, including exited ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRunq {
    /// Process id.
    pub pid: u32,
    /// Process name (its main thread's name).
    pub name: String,
    /// Counts of all its threads since first seen (monotonic).
    pub counts: RunqCounts,
    /// Threads currently in the table (live or recently exited).
    pub threads: u32,
}

/// What one read of the kernel map returned for a thread.
#[derive(Clone, Copy, Debug)]
pub struct ThreadRead {
    /// Thread id (the map key).
    pub tid: u32,
    /// The map value.
    pub hist: RunqHist,
}

/// Everything the run-queue probe knows at one tick, immutable once published.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunqSnapshot {
    /// CLOCK_MONOTONIC ns of the read this snapshot comes from.
    pub taken_at_ns: u64,
    /// Threads, ordered by (pid, tid).
    pub threads: Vec<ThreadRunq>,
    /// Processes, ordered by pid.
    pub processes: Vec<ProcessRunq>,
}

impl RunqSnapshot {
    /// The process with this pid.
    pub fn process(&self, pid: u32) -> Option<&ProcessRunq> {
        self.processes
            .binary_search_by_key(&pid, |p| p.pid)
            .ok()
            .map(|i| &self.processes[i])
    }

    /// The thread with this tid (threads are few enough per snapshot for a scan).
    pub fn thread(&self, tid: u32) -> Option<&ThreadRunq> {
        self.threads.iter().find(|t| t.tid == tid)
    }
}

struct ThreadState {
    pid: u32,
    name: String,
    /// Last kernel value, to compute deltas.
    last: RunqCounts,
    /// Monotonic total across entry replacements.
    total: RunqCounts,
    exited_at_tick: Option<u64>,
}

struct ProcessState {
    name: String,
    total: RunqCounts,
    last_seen_tick: u64,
}

/// Folds successive kernel reads into monotonic per-thread and per-process counts.
pub struct RunqTable {
    threads: BTreeMap<u32, ThreadState>,
    processes: BTreeMap<u32, ProcessState>,
    tick: u64,
    retention_ticks: u64,
}

impl RunqTable {
    /// A table that keeps exited threads and vanished processes for `retention_ticks` reads.
    pub fn new(retention_ticks: u64) -> Self {
        Self {
            threads: BTreeMap::new(),
            processes: BTreeMap::new(),
            tick: 0,
            retention_ticks,
        }
    }

    /// Applies one full read of the kernel map (every entry present at read time) and returns
    /// the snapshot. Entries absent from `reads` whose thread had not exited are treated as
    /// deleted by the agent after an exit.
    pub fn apply(&mut self, taken_at_ns: u64, reads: &[ThreadRead]) -> RunqSnapshot {
        self.tick += 1;
        let tick = self.tick;
        for r in reads {
            let now = RunqCounts::from_hist(&r.hist);
            let name = comm_to_string(&r.hist.comm);
            let exited = r.hist.flags & RUNQ_HIST_EXITED != 0;
            let pid = r.hist.tgid;
            let delta = match self.threads.get_mut(&r.tid) {
                Some(t) if t.pid == pid => {
                    // A counter going backwards means the kernel entry was replaced (the thread
                    // id was reused): everything in the new entry is new.
                    let d = now.since(&t.last).unwrap_or(now);
                    t.last = now;
                    t.total.add(&d);
                    t.name = name.clone();
                    if exited && t.exited_at_tick.is_none() {
                        t.exited_at_tick = Some(tick);
                    } else if !exited {
                        t.exited_at_tick = None;
                    }
                    d
                }
                _ => {
                    // New thread, or a reused id in another process.
                    self.threads.insert(
                        r.tid,
                        ThreadState {
                            pid,
                            name: name.clone(),
                            last: now,
                            total: now,
                            exited_at_tick: exited.then_some(tick),
                        },
                    );
                    now
                }
            };
            let p = self.processes.entry(pid).or_insert_with(|| ProcessState {
                name: String::new(),
                total: RunqCounts::default(),
                last_seen_tick: tick,
            });
            p.total.add(&delta);
            p.last_seen_tick = tick;
            if r.tid == pid || p.name.is_empty() {
                p.name = name;
            }
        }

        let retention = self.retention_ticks;
        self.threads
            .retain(|_, t| t.exited_at_tick.is_none_or(|at| tick - at <= retention));
        let live_pids: std::collections::BTreeSet<u32> =
            self.threads.values().map(|t| t.pid).collect();
        self.processes
            .retain(|pid, p| tick - p.last_seen_tick <= retention || live_pids.contains(pid));
        self.snapshot(taken_at_ns)
    }

    fn snapshot(&self, taken_at_ns: u64) -> RunqSnapshot {
        let mut threads: Vec<ThreadRunq> = self
            .threads
            .iter()
            .map(|(&tid, t)| ThreadRunq {
                pid: t.pid,
                tid,
                name: t.name.clone(),
                counts: t.total,
                exited: t.exited_at_tick.is_some(),
            })
            .collect();
        threads.sort_by_key(|t| (t.pid, t.tid));
        let processes = self
            .processes
            .iter()
            .map(|(&pid, p)| ProcessRunq {
                pid,
                name: p.name.clone(),
                counts: p.total,
                threads: threads.iter().filter(|t| t.pid == pid).count() as u32,
            })
            .collect();
        RunqSnapshot {
            taken_at_ns,
            threads,
            processes,
        }
    }
}

/// A NUL-padded kernel `comm` as a string (lossy for non-UTF-8 names).
pub fn comm_to_string(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::log2_slot;

    fn hist(pid: u32, name: &str, waits: &[u64]) -> RunqHist {
        let mut h = RunqHist::ZERO;
        h.tgid = pid;
        h.comm[..name.len()].copy_from_slice(name.as_bytes());
        for &w in waits {
            h.slots[log2_slot(w)] += 1;
            h.count += 1;
            h.total_ns += w;
            h.max_ns = h.max_ns.max(w);
        }
        h
    }

    #[test]
    fn quantiles_within_a_factor_of_two() {
        let waits: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let c = RunqCounts::from_hist(&hist(1, "t", &waits));
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
        let mut t = RunqTable::new(2);
        let s = t.apply(
            1,
            &[ThreadRead {
                tid: 11,
                hist: hist(10, "worker", &[100, 200]),
            }],
        );
        assert_eq!(s.thread(11).expect("t").counts.count, 2);
        assert_eq!(s.process(10).expect("p").counts.total_ns, 300);

        let mut h = hist(10, "worker", &[100, 200, 5000]);
        h.flags = RUNQ_HIST_EXITED;
        let s = t.apply(2, &[ThreadRead { tid: 11, hist: h }]);
        let th = s.thread(11).expect("t");
        assert!(th.exited);
        assert_eq!(th.counts.count, 3);
        assert_eq!(s.process(10).expect("p").counts.total_ns, 5300);

        // The agent deleted the exited entry: the row stays for the retention period...
        let s = t.apply(3, &[]);
        assert!(s.thread(11).is_some());
        let s = t.apply(4, &[]);
        assert!(s.thread(11).is_some());
        // ...then goes, and so does the process that has no thread left.
        let s = t.apply(5, &[]);
        assert!(s.thread(11).is_none());
        assert!(s.process(10).is_none());
    }

    #[test]
    fn reused_thread_id_does_not_go_backwards() {
        let mut t = RunqTable::new(10);
        t.apply(
            1,
            &[ThreadRead {
                tid: 5,
                hist: hist(4, "a", &[10, 10, 10]),
            }],
        );
        // Same tid, same process, fresh kernel entry with fewer waits.
        let s = t.apply(
            2,
            &[ThreadRead {
                tid: 5,
                hist: hist(4, "a", &[7]),
            }],
        );
        let c = s.thread(5).expect("t").counts;
        assert_eq!(c.count, 4);
        assert_eq!(c.total_ns, 37);
        // Same tid in another process: a new thread row, the old process keeps its total.
        let s = t.apply(
            3,
            &[ThreadRead {
                tid: 5,
                hist: hist(9, "b", &[1]),
            }],
        );
        assert_eq!(s.thread(5).expect("t").pid, 9);
        assert_eq!(s.process(4).expect("p4").counts.count, 4);
        assert_eq!(s.process(9).expect("p9").counts.count, 1);
    }

    #[test]
    fn process_name_is_main_thread_name() {
        let mut t = RunqTable::new(10);
        let s = t.apply(
            1,
            &[
                ThreadRead {
                    tid: 21,
                    hist: hist(20, "loader-1", &[1]),
                },
                ThreadRead {
                    tid: 20,
                    hist: hist(20, "train", &[1]),
                },
            ],
        );
        let p = s.process(20).expect("p");
        assert_eq!(p.name, "train");
        assert_eq!(p.threads, 2);
        assert_eq!(p.counts.count, 2);
    }

    #[test]
    fn bucket_counts_are_cumulative() {
        let c = RunqCounts::from_hist(&hist(1, "t", &[1, 3, 1024, 1 << 20]));
        assert_eq!(c.cumulative_below_slot_end(0), 1);
        assert_eq!(c.cumulative_below_slot_end(1), 2);
        assert_eq!(c.cumulative_below_slot_end(10), 3);
        assert_eq!(c.cumulative_below_slot_end(RUNQ_SLOTS - 1), 4);
    }
}
