//! The job's process tree: which processes belong to the job (the roots the agent targets and
//! their descendants), their parents and names. Fed by the kernel's fork/exec/exit events and by
//! scans of `/proc` that the agent does at start and when the kernel's event ring overflowed.

use std::collections::{BTreeMap, BTreeSet};

use slo_probe_common::{ProcessEventRecord, PROC_EXEC, PROC_EXIT, PROC_FORK};

use crate::roles::comm_to_string;

/// One process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessNode {
    /// Parent process id (0 when unknown).
    pub ppid: u32,
    /// Process name (its main thread's name).
    pub name: String,
    /// Tick at which it exited, if it did.
    pub exited_at_tick: Option<u64>,
}

/// Processes seen, with the job's roots.
#[derive(Clone, Debug, Default)]
pub struct ProcessTree {
    procs: BTreeMap<u32, ProcessNode>,
    roots: BTreeSet<u32>,
    tick: u64,
}

impl ProcessTree {
    /// An empty tree; with no roots every process is part of the job (whole-node mode).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the job's root processes.
    pub fn set_roots(&mut self, roots: impl IntoIterator<Item = u32>) {
        self.roots = roots.into_iter().collect();
    }

    /// The job's roots (empty in whole-node mode).
    pub fn roots(&self) -> &BTreeSet<u32> {
        &self.roots
    }

    /// Whether `pid` is one of the roots.
    pub fn is_root(&self, pid: u32) -> bool {
        self.roots.contains(&pid)
    }

    /// Records what a `/proc` scan saw.
    pub fn observe(&mut self, pid: u32, ppid: u32, name: &str) {
        let node = self.procs.entry(pid).or_insert_with(|| ProcessNode {
            ppid,
            name: String::new(),
            exited_at_tick: None,
        });
        node.ppid = ppid;
        node.name = name.to_owned();
        node.exited_at_tick = None;
    }

    /// Marks processes that a full `/proc` scan no longer lists as exited (an exit event can be
    /// lost when the event ring is full).
    pub fn mark_missing(&mut self, present: &BTreeSet<u32>) {
        let tick = self.tick;
        for (pid, n) in self.procs.iter_mut() {
            if !present.contains(pid) {
                n.exited_at_tick.get_or_insert(tick);
            }
        }
    }

    /// Applies one kernel event.
    pub fn apply_event(&mut self, e: &ProcessEventRecord) {
        let name = comm_to_string(&e.comm);
        match e.event {
            PROC_FORK => {
                self.procs.insert(
                    e.pid,
                    ProcessNode {
                        ppid: e.ppid,
                        name,
                        exited_at_tick: None,
                    },
                );
            }
            PROC_EXEC => {
                let node = self.procs.entry(e.pid).or_insert_with(|| ProcessNode {
                    ppid: 0,
                    name: String::new(),
                    exited_at_tick: None,
                });
                node.name = name;
            }
            PROC_EXIT => {
                if let Some(node) = self.procs.get_mut(&e.pid) {
                    node.exited_at_tick.get_or_insert(self.tick);
                }
            }
            _ => {}
        }
    }

    /// The process, if known.
    pub fn get(&self, pid: u32) -> Option<&ProcessNode> {
        self.procs.get(&pid)
    }

    /// Whether `pid` belongs to the job: in whole-node mode always; else when it is a root or
    /// descends from one.
    pub fn in_job(&self, pid: u32) -> bool {
        if self.roots.is_empty() {
            return true;
        }
        let mut p = pid;
        // Bounded walk: a corrupt parent chain cannot loop forever.
        for _ in 0..64 {
            if self.roots.contains(&p) {
                return true;
            }
            match self.procs.get(&p) {
                Some(n) if n.ppid != 0 && n.ppid != p => p = n.ppid,
                _ => return false,
            }
        }
        false
    }

    /// Whether `pid` is `ancestor` or one of its descendants (as far as the tree knows).
    pub fn descends_from(&self, pid: u32, ancestor: u32) -> bool {
        let mut p = pid;
        // Bounded walk: a corrupt parent chain cannot loop forever.
        for _ in 0..64 {
            if p == ancestor {
                return true;
            }
            match self.procs.get(&p) {
                Some(n) if n.ppid != 0 && n.ppid != p => p = n.ppid,
                _ => return false,
            }
        }
        false
    }

    /// Every process of the job known now.
    pub fn job_pids(&self) -> BTreeSet<u32> {
        let mut out: BTreeSet<u32> = self.roots.clone();
        out.extend(self.procs.keys().copied().filter(|&p| self.in_job(p)));
        out
    }

    /// Advances one tick and forgets processes that exited more than `retention` ticks ago
    /// (roots are kept: a target is forgotten only when the user says so).
    pub fn tick(&mut self, retention: u64) {
        self.tick += 1;
        let now = self.tick;
        let roots = &self.roots;
        self.procs.retain(|pid, n| {
            roots.contains(pid) || n.exited_at_tick.is_none_or(|at| now - at <= retention)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::RecordHeader;

    fn event(event: u32, pid: u32, ppid: u32, name: &str) -> ProcessEventRecord {
        let mut comm = [0u8; 16];
        comm[..name.len()].copy_from_slice(name.as_bytes());
        ProcessEventRecord {
            header: RecordHeader::of::<ProcessEventRecord>(),
            ts_ns: 0,
            event,
            pid,
            ppid,
            tid: ppid,
            comm,
        }
    }

    #[test]
    fn follows_forks_from_roots() {
        let mut t = ProcessTree::new();
        t.set_roots([100]);
        t.observe(100, 1, "python3");
        t.apply_event(&event(PROC_FORK, 101, 100, "python3"));
        t.apply_event(&event(PROC_FORK, 102, 101, "python3"));
        t.apply_event(&event(PROC_EXEC, 102, 0, "ptxas"));
        t.observe(200, 1, "sshd");
        assert!(t.in_job(102));
        assert!(!t.in_job(200));
        assert_eq!(t.get(102).map(|n| n.name.as_str()), Some("ptxas"));
        assert_eq!(
            t.job_pids().into_iter().collect::<Vec<_>>(),
            [100, 101, 102]
        );
    }

    #[test]
    fn exited_processes_leave_after_retention() {
        let mut t = ProcessTree::new();
        t.set_roots([1]);
        t.apply_event(&event(PROC_FORK, 5, 1, "w"));
        t.tick(1);
        t.apply_event(&event(PROC_EXIT, 5, 0, "w"));
        t.tick(1);
        assert!(t.get(5).is_some());
        t.tick(1);
        t.tick(1);
        assert!(t.get(5).is_none());
    }

    #[test]
    fn whole_node_mode_includes_everything() {
        let t = ProcessTree::new();
        assert!(t.in_job(12345));
    }
}
