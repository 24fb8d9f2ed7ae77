//! Guard rails the healer and its actuators obey: a cap on actions per hour and a cooldown per
//! strategy (per job), and the blast radius: the threads, processes and cgroups an action may
//! touch (the job's own, plus the neighbour cgroups the config allows).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::strategy::Strategy;

const HOUR_NS: u64 = 3_600_000_000_000;

/// Why an action is not taken now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "refusal")]
pub enum Refusal {
    /// The cap on actions per hour is reached.
    #[error(
        "{taken} actions in the last hour reach the cap of {cap}; next one possible in {wait_s} s"
    )]
    Cap {
        /// Actions in the last hour.
        taken: u32,
        /// The cap.
        cap: u32,
        /// Seconds until the oldest leaves the hour.
        wait_s: u64,
    },
    /// The strategy is cooling down.
    #[error("{strategy} is cooling down for {wait_s} s more")]
    Cooldown {
        /// The strategy.
        strategy: Strategy,
        /// Seconds left.
        wait_s: u64,
    },
    /// The target is outside the blast radius.
    #[error("{target} is outside the blast radius (the job's own threads and cgroups, and the neighbours heal.neighbors allows)")]
    Outside {
        /// What the action wanted to touch.
        target: String,
    },
}

/// The cap on actions per hour and the per-strategy cooldowns of one job.
#[derive(Clone, Debug, Default)]
pub struct RateLimit {
    cap_per_hour: u32,
    taken: VecDeque<u64>,
    cooling: BTreeMap<Strategy, u64>,
}

impl RateLimit {
    /// At most `cap_per_hour` actions in any hour.
    pub fn new(cap_per_hour: u32) -> Self {
        Self {
            cap_per_hour,
            ..Default::default()
        }
    }

    fn prune(&mut self, now_ns: u64) {
        while self
            .taken
            .front()
            .is_some_and(|t| now_ns.saturating_sub(*t) >= HOUR_NS)
        {
            self.taken.pop_front();
        }
    }

    /// Whether one more action is allowed at `now_ns`.
    pub fn check_cap(&mut self, now_ns: u64) -> Result<(), Refusal> {
        self.prune(now_ns);
        if self.taken.len() as u32 >= self.cap_per_hour {
            let oldest = self.taken.front().copied().unwrap_or(now_ns);
            return Err(Refusal::Cap {
                taken: self.taken.len() as u32,
                cap: self.cap_per_hour,
                wait_s: (oldest + HOUR_NS)
                    .saturating_sub(now_ns)
                    .div_ceil(1_000_000_000),
            });
        }
        Ok(())
    }

    /// Whether `strategy` is out of its cooldown at `now_ns`.
    pub fn check_cooldown(&self, strategy: Strategy, now_ns: u64) -> Result<(), Refusal> {
        match self.cooling.get(&strategy) {
            Some(&until) if until > now_ns => Err(Refusal::Cooldown {
                strategy,
                wait_s: (until - now_ns).div_ceil(1_000_000_000),
            }),
            _ => Ok(()),
        }
    }

    /// Counts an action taken at `now_ns`.
    pub fn record(&mut self, now_ns: u64) {
        self.prune(now_ns);
        self.taken.push_back(now_ns);
    }

    /// Puts `strategy` in cooldown until `until_ns` (never shortens one in force).
    pub fn cool(&mut self, strategy: Strategy, until_ns: u64) {
        let e = self.cooling.entry(strategy).or_insert(0);
        *e = (*e).max(until_ns);
    }

    /// Actions in the hour before `now_ns`.
    pub fn taken_last_hour(&self, now_ns: u64) -> u32 {
        self.taken
            .iter()
            .filter(|t| now_ns.saturating_sub(**t) < HOUR_NS)
            .count() as u32
    }
}

/// Something an actuator wants to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// A thread (`tid`) of process `pid`.
    Thread {
        /// Its process.
        pid: u32,
        /// The thread.
        tid: u32,
    },
    /// A process (its sockets, its strategy channel).
    Process {
        /// The process.
        pid: u32,
    },
    /// A cgroup, by its path as `/proc/<pid>/cgroup` shows it.
    Cgroup {
        /// The path, starting with `/`.
        path: &'a str,
    },
}

/// What one job's actions may touch: its processes and cgroups, and the allowed neighbours.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlastRadius {
    /// The job's processes (the training process and its descendants).
    pub pids: BTreeSet<u32>,
    /// The job's own cgroups.
    pub cgroups: BTreeSet<String>,
    /// Neighbour cgroups the config allows: paths, or prefixes ending in `*`.
    pub neighbors: Vec<String>,
}

impl BlastRadius {
    /// Whether `path` is an allowed neighbour (and not one of the job's own cgroups, nor an
    /// ancestor of one: demoting an ancestor would demote the job too).
    pub fn is_neighbor(&self, path: &str) -> bool {
        let own_or_above = self.cgroups.iter().any(|c| {
            c == path
                || path == "/"
                || c.strip_prefix(path)
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        !own_or_above
            && self.neighbors.iter().any(|n| match n.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => n == path,
            })
    }

    /// Whether an action may touch `t`.
    pub fn check(&self, t: &Target<'_>) -> Result<(), Refusal> {
        let ok = match t {
            Target::Thread { pid, .. } | Target::Process { pid } => self.pids.contains(pid),
            Target::Cgroup { path } => self.cgroups.contains(*path) || self.is_neighbor(path),
        };
        if ok {
            Ok(())
        } else {
            Err(Refusal::Outside {
                target: match t {
                    Target::Thread { pid, tid } => format!("thread {tid} of process {pid}"),
                    Target::Process { pid } => format!("process {pid}"),
                    Target::Cgroup { path } => format!("cgroup {path}"),
                },
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn cap_per_hour() {
        let mut r = RateLimit::new(2);
        assert!(r.check_cap(0).is_ok());
        r.record(0);
        r.record(10 * S);
        assert_eq!(
            r.check_cap(20 * S),
            Err(Refusal::Cap {
                taken: 2,
                cap: 2,
                wait_s: 3580
            })
        );
        assert_eq!(r.taken_last_hour(20 * S), 2);
        // The first leaves the hour.
        assert!(r.check_cap(3600 * S).is_ok());
        assert_eq!(r.taken_last_hour(3600 * S), 1);
    }

    #[test]
    fn cooldown_per_strategy() {
        let mut r = RateLimit::new(10);
        r.cool(Strategy::NumaPinning, 300 * S);
        assert_eq!(
            r.check_cooldown(Strategy::NumaPinning, 100 * S),
            Err(Refusal::Cooldown {
                strategy: Strategy::NumaPinning,
                wait_s: 200
            })
        );
        assert!(r.check_cooldown(Strategy::DeadlineAware, 100 * S).is_ok());
        assert!(r.check_cooldown(Strategy::NumaPinning, 300 * S).is_ok());
        // A shorter cooldown does not shorten the one in force.
        r.cool(Strategy::NumaPinning, 50 * S);
        assert!(r.check_cooldown(Strategy::NumaPinning, 299 * S).is_err());
    }

    #[test]
    fn blast_radius() {
        let b = BlastRadius {
            pids: [10, 11].into(),
            cgroups: ["/jobs/a".to_owned()].into(),
            neighbors: vec!["/batch/*".into(), "/jobs/b".into(), "/jobs".into()],
        };
        assert!(b.check(&Target::Thread { pid: 10, tid: 99 }).is_ok());
        assert!(b.check(&Target::Thread { pid: 12, tid: 12 }).is_err());
        assert!(b.check(&Target::Process { pid: 11 }).is_ok());
        assert!(b.check(&Target::Cgroup { path: "/jobs/a" }).is_ok());
        assert!(b.check(&Target::Cgroup { path: "/batch/x" }).is_ok());
        assert!(b.check(&Target::Cgroup { path: "/jobs/b" }).is_ok());
        assert!(b.check(&Target::Cgroup { path: "/jobs/c" }).is_err());
        // Allowed by the list, but an ancestor of the job's own cgroup: refused.
        let e = b.check(&Target::Cgroup { path: "/jobs" }).unwrap_err();
        assert!(e.to_string().contains("cgroup /jobs is outside"), "{e}");
        assert!(!b.is_neighbor("/"));
    }
}
