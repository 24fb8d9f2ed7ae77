//! What the host did to the job, as cumulative counters sampled once per tick ([`HostSample`]),
//! and the deltas between two instants ([`HostDelta`]) that the SLO engine joins with
//! iterations and windows: run-queue wait and off-CPU time per thread role, CPU throttling of
//! the job's cgroups, and TCP retransmits per connection.

use std::collections::{BTreeSet, VecDeque};

use crate::{
    cgroup::CgroupRow,
    net::{endpoints, NetSnapshot},
    roles::Role,
    threads::ThreadsSnapshot,
};

/// Cumulative counters of one thread role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoleHost {
    /// Time runnable but waiting for a CPU, ns.
    pub runq_ns: u64,
    /// Run-queue waits.
    pub runq_waits: u64,
    /// Off-CPU time after preemptions, ns.
    pub offcpu_involuntary_ns: u64,
    /// Off-CPU time after blocking or sleeping, ns.
    pub offcpu_voluntary_ns: u64,
    /// TCP retransmitted segments on connections owned by threads of the role.
    pub retransmits: u64,
}

/// Cumulative retransmits of one connection of the job.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConnHost {
    /// `local -> remote`.
    pub label: String,
    /// Role of the owning thread.
    pub role: Option<Role>,
    /// Retransmitted segments.
    pub retransmits: u64,
}

/// The job's host counters at one instant (cumulative since the agent started following it).
/// Recorded next to a GPU recording as one JSON object per line (`<pid>.host.jsonl`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostSample {
    /// CLOCK_MONOTONIC ns.
    pub at_ns: u64,
    /// Per role, in [`Role::ALL`] order.
    pub roles: [RoleHost; 5],
    /// CPU time the job's cgroups were throttled, ns.
    pub throttled_ns: u64,
    /// Connections of the job.
    pub conns: Vec<ConnHost>,
}

impl HostSample {
    /// The counters of `role`.
    pub fn role(&self, role: Role) -> &RoleHost {
        &self.roles[role_index(role)]
    }

    /// The counters of `role`, to fill in.
    pub fn role_mut(&mut self, role: Role) -> &mut RoleHost {
        &mut self.roles[role_index(role)]
    }
}

/// Index of a role in [`Role::ALL`].
pub fn role_index(role: Role) -> usize {
    Role::ALL.iter().position(|r| *r == role).unwrap_or(4)
}

/// The host counters of the processes `pids` (a training process and its descendants, e.g.
/// DataLoader workers) at `at_ns`, from the tick's thread, network and cgroup views.
pub fn sample_of(
    pids: &BTreeSet<u32>,
    at_ns: u64,
    threads: Option<&ThreadsSnapshot>,
    net: Option<&NetSnapshot>,
    cgroups: &[CgroupRow],
) -> HostSample {
    let mut s = HostSample {
        at_ns,
        ..Default::default()
    };
    if let Some(t) = threads {
        for (role, c) in t.by_role(Some(pids)) {
            let r = s.role_mut(role);
            r.runq_ns = c.runq.total_ns;
            r.runq_waits = c.runq.count;
            r.offcpu_involuntary_ns = c.offcpu_involuntary_ns;
            r.offcpu_voluntary_ns = c.offcpu_voluntary_ns;
        }
    }
    if let Some(n) = net {
        for (&(pid, role), &count) in &n.retransmits {
            if pids.contains(&pid) {
                s.role_mut(role).retransmits += count;
            }
        }
        for c in n.conns.iter().filter(|c| pids.contains(&c.pid)) {
            let (local, remote) = endpoints(&c.tuple);
            s.conns.push(ConnHost {
                label: format!("{local} -> {remote}"),
                role: Some(c.role),
                retransmits: c.retransmits,
            });
        }
    }
    s.throttled_ns = cgroups
        .iter()
        .filter(|c| c.pids.iter().any(|p| pids.contains(p)))
        .filter_map(|c| c.cpu.map(|cpu| cpu.throttled_ns))
        .sum();
    s
}

/// What happened on the host between two instants.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostDelta {
    /// Length of the interval, ns.
    pub span_ns: u64,
    /// Per role, in [`Role::ALL`] order.
    pub roles: [RoleHost; 5],
    /// Throttled time, ns.
    pub throttled_ns: u64,
    /// Connections that retransmitted, most retransmits first.
    pub conns: Vec<ConnHost>,
}

impl HostDelta {
    /// The delta of `role`.
    pub fn role(&self, role: Role) -> &RoleHost {
        &self.roles[role_index(role)]
    }

    /// Per second of the interval: `v` ns (or events) per second.
    pub fn per_second(&self, v: u64) -> f64 {
        if self.span_ns == 0 {
            0.0
        } else {
            v as f64 * 1e9 / self.span_ns as f64
        }
    }

    /// Adds another interval's delta (for windows built from several).
    pub fn add(&mut self, o: &HostDelta) {
        self.span_ns += o.span_ns;
        for (a, b) in self.roles.iter_mut().zip(&o.roles) {
            a.runq_ns += b.runq_ns;
            a.runq_waits += b.runq_waits;
            a.offcpu_involuntary_ns += b.offcpu_involuntary_ns;
            a.offcpu_voluntary_ns += b.offcpu_voluntary_ns;
            a.retransmits += b.retransmits;
        }
        self.throttled_ns += o.throttled_ns;
        for c in &o.conns {
            match self.conns.iter_mut().find(|x| x.label == c.label) {
                Some(x) => x.retransmits += c.retransmits,
                None => self.conns.push(c.clone()),
            }
        }
        self.conns.sort_by(|a, b| {
            b.retransmits
                .cmp(&a.retransmits)
                .then(a.label.cmp(&b.label))
        });
    }
}

/// Recent host samples, oldest first, bounded.
#[derive(Clone, Debug)]
pub struct HostHistory {
    samples: VecDeque<HostSample>,
    capacity: usize,
}

impl HostHistory {
    /// Keeps at most `capacity` samples (at least 2).
    pub fn new(capacity: usize) -> Self {
        Self {
            samples: VecDeque::new(),
            capacity: capacity.max(2),
        }
    }

    /// Adds a sample; one not later than the last is ignored.
    pub fn push(&mut self, s: HostSample) {
        if self.samples.back().is_some_and(|l| l.at_ns >= s.at_ns) {
            return;
        }
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<&HostSample> {
        self.samples.back()
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The counters' growth from `from_ns` to `to_ns`, each sample interval apportioned by its
    /// overlap (the counters are assumed to grow evenly within an interval). `None` until a
    /// sample at or after `to_ns` exists, or when no sample precedes `from_ns`.
    pub fn delta(&self, from_ns: u64, to_ns: u64) -> Option<HostDelta> {
        let latest = self.samples.back()?;
        if latest.at_ns < to_ns || self.samples.front()?.at_ns > from_ns || to_ns < from_ns {
            return None;
        }
        let mut d = HostDelta {
            span_ns: to_ns - from_ns,
            ..Default::default()
        };
        // First interval (prev, cur] with cur > from_ns.
        let first = self.samples.partition_point(|s| s.at_ns <= from_ns).max(1);
        let mut conns: Vec<ConnHost> = Vec::new();
        for i in first..self.samples.len() {
            let (p, c) = (&self.samples[i - 1], &self.samples[i]);
            if p.at_ns >= to_ns {
                break;
            }
            let len = c.at_ns - p.at_ns;
            let overlap = c.at_ns.min(to_ns).saturating_sub(p.at_ns.max(from_ns));
            if len == 0 || overlap == 0 {
                continue;
            }
            let part = |a: u64, b: u64| {
                (b.saturating_sub(a) as u128 * overlap as u128 / len as u128) as u64
            };
            for (k, r) in d.roles.iter_mut().enumerate() {
                let (a, b) = (&p.roles[k], &c.roles[k]);
                r.runq_ns += part(a.runq_ns, b.runq_ns);
                r.runq_waits += part(a.runq_waits, b.runq_waits);
                r.offcpu_involuntary_ns += part(a.offcpu_involuntary_ns, b.offcpu_involuntary_ns);
                r.offcpu_voluntary_ns += part(a.offcpu_voluntary_ns, b.offcpu_voluntary_ns);
                r.retransmits += part(a.retransmits, b.retransmits);
            }
            d.throttled_ns += part(p.throttled_ns, c.throttled_ns);
            for cc in &c.conns {
                let before = p
                    .conns
                    .iter()
                    .find(|x| x.label == cc.label)
                    .map_or(0, |x| x.retransmits);
                let n = part(before, cc.retransmits);
                if n == 0 {
                    continue;
                }
                match conns.iter_mut().find(|x| x.label == cc.label) {
                    Some(x) => x.retransmits += n,
                    None => conns.push(ConnHost {
                        label: cc.label.clone(),
                        role: cc.role,
                        retransmits: n,
                    }),
                }
            }
        }
        conns.sort_by(|a, b| {
            b.retransmits
                .cmp(&a.retransmits)
                .then(a.label.cmp(&b.label))
        });
        d.conns = conns;
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, main_runq_ms: u64, retrans: u64) -> HostSample {
        let mut s = HostSample {
            at_ns: at_ms * 1_000_000,
            throttled_ns: at_ms * 1_000,
            ..Default::default()
        };
        s.role_mut(Role::Main).runq_ns = main_runq_ms * 1_000_000;
        s.role_mut(Role::Communication).retransmits = retrans;
        s.conns.push(ConnHost {
            label: "10.0.0.1:29500 -> 10.0.0.2:40000".into(),
            role: Some(Role::Communication),
            retransmits: retrans,
        });
        s
    }

    #[test]
    fn deltas_are_apportioned_by_overlap() {
        let mut h = HostHistory::new(16);
        h.push(sample(0, 0, 0));
        h.push(sample(100, 10, 0));
        h.push(sample(200, 30, 40));
        // Half of the first interval (5 ms) and all of the second (20 ms).
        let d = h.delta(50_000_000, 200_000_000).expect("covered");
        assert_eq!(d.span_ns, 150_000_000);
        assert_eq!(d.role(Role::Main).runq_ns, 25_000_000);
        assert_eq!(d.role(Role::Communication).retransmits, 40);
        assert_eq!(d.conns.len(), 1);
        assert_eq!(d.conns[0].retransmits, 40);
        assert_eq!(d.throttled_ns, 150_000);
        assert!((d.per_second(d.role(Role::Main).runq_ns) - 166_666_666.6).abs() < 1.0);
        // A quarter of the last interval.
        let d = h.delta(150_000_000, 175_000_000).expect("covered");
        assert_eq!(d.role(Role::Main).runq_ns, 5_000_000);
        assert_eq!(d.conns[0].retransmits, 10);
    }

    #[test]
    fn not_before_it_is_covered() {
        let mut h = HostHistory::new(16);
        assert!(h.delta(0, 1).is_none());
        h.push(sample(100, 0, 0));
        h.push(sample(200, 10, 0));
        assert!(
            h.delta(150_000_000, 201_000_000).is_none(),
            "no sample after"
        );
        assert!(
            h.delta(50_000_000, 150_000_000).is_none(),
            "no sample before"
        );
        h.push(sample(150, 1, 1));
        assert_eq!(h.len(), 2, "an older sample is ignored");
    }

    #[test]
    fn deltas_add_up() {
        let mut h = HostHistory::new(16);
        for k in 0..=4 {
            h.push(sample(k * 100, k * 10, k * 3));
        }
        let mut sum = h.delta(0, 200_000_000).expect("a");
        sum.add(&h.delta(200_000_000, 400_000_000).expect("b"));
        assert_eq!(sum, h.delta(0, 400_000_000).expect("all"));
    }
}
