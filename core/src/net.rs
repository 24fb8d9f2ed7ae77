//! TCP connections of the job: retransmits per connection with the owning process, thread and
//! role, smoothed RTT and congestion window, and monotonic retransmit totals per
//! (process, role) that survive connections closing.
//!
//! Connection series are bounded: at most `max_exported` connections are listed (those with the
//! most retransmits, then the most recently active); the others are counted in
//! [`NetSnapshot::unlisted`] and still add to the per-role totals.

use std::collections::{BTreeMap, VecDeque};

use slo_probe_common::{ConnStats, TcpRetransmitRecord, TcpTuple, CONN_CLOSED};

use crate::{roles::Role, threads::ThreadsSnapshot};

/// What one read of the kernel map returned for a connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnRead {
    /// Kernel socket address (the map key).
    pub sk: u64,
    /// The map value.
    pub stats: ConnStats,
}

/// One connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnRow {
    /// Endpoints.
    pub tuple: TcpTuple,
    /// Owning process (0 if unknown).
    pub pid: u32,
    /// Owning thread (0 if unknown).
    pub tid: u32,
    /// Owning process name.
    pub process: String,
    /// Role of the owning thread.
    pub role: Role,
    /// Retransmitted segments since the agent first saw it.
    pub retransmits: u64,
    /// Smoothed RTT at the last sample, µs (0 before the first sample).
    pub srtt_us: u32,
    /// Congestion window at the last sample, segments.
    pub snd_cwnd: u32,
    /// Closed; kept for the retention period.
    pub closed: bool,
}

/// One retransmission, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retransmit {
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    /// Endpoints.
    pub tuple: TcpTuple,
    /// Owning process (0 if unknown).
    pub pid: u32,
    /// Owning thread (0 if unknown).
    pub tid: u32,
    /// TCP state number.
    pub state: u32,
}

/// The network view at one tick.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetSnapshot {
    /// Listed connections, most retransmits first.
    pub conns: Vec<ConnRow>,
    /// Connections followed but not listed (over the cap).
    pub unlisted: u64,
    /// Retransmits per (process, role) since start, including closed connections.
    pub retransmits: BTreeMap<(u32, Role), u64>,
    /// The latest retransmissions, oldest first.
    pub recent: Vec<Retransmit>,
}

struct ConnState {
    last: ConnStats,
    retransmits: u64,
    closed_at_tick: Option<u64>,
    last_active_tick: u64,
}

/// Folds successive reads of the connection map.
pub struct ConnTable {
    /// By (socket address, generation): a new connection at a reused address is another.
    conns: BTreeMap<(u64, u32), ConnState>,
    totals: BTreeMap<(u32, Role), u64>,
    recent: VecDeque<Retransmit>,
    tick: u64,
    retention_ticks: u64,
    max_exported: usize,
}

/// How many recent retransmissions a snapshot carries.
const RECENT: usize = 64;

impl ConnTable {
    /// A table keeping closed connections `retention_ticks` reads and listing at most
    /// `max_exported`.
    pub fn new(retention_ticks: u64, max_exported: usize) -> Self {
        Self {
            conns: BTreeMap::new(),
            totals: BTreeMap::new(),
            recent: VecDeque::with_capacity(RECENT),
            tick: 0,
            retention_ticks,
            max_exported,
        }
    }

    /// Records one retransmission record (for the recent list; totals come from the map).
    pub fn push_record(&mut self, r: &TcpRetransmitRecord) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(Retransmit {
            ts_ns: r.ts_ns,
            tuple: r.tuple,
            pid: r.tgid,
            tid: r.tid,
            state: r.state,
        });
    }

    /// Applies one full read of the map, then the final states of connections that closed
    /// (`closed`, from `ConnClosedRecord`s: their map entries are gone); roles and names come
    /// from the thread snapshot. Connections whose owner is outside the job are ignored when
    /// `in_job` says so.
    pub fn apply(
        &mut self,
        reads: &[ConnRead],
        closed: &[ConnRead],
        threads: Option<&ThreadsSnapshot>,
        in_job: impl Fn(u32) -> bool,
    ) -> NetSnapshot {
        self.tick += 1;
        let tick = self.tick;
        let role_of = |tid: u32| {
            threads
                .and_then(|t| t.thread(tid))
                .map_or(Role::Other, |t| t.role)
        };
        for r in reads.iter().chain(closed) {
            if r.stats.tgid != 0 && !in_job(r.stats.tgid) {
                continue;
            }
            let closing = r.stats.flags & CONN_CLOSED != 0;
            let state = self
                .conns
                .entry((r.sk, r.stats.generation))
                .or_insert_with(|| ConnState {
                    last: ConnStats {
                        retransmits: 0,
                        ..r.stats
                    },
                    retransmits: 0,
                    closed_at_tick: None,
                    last_active_tick: tick,
                });
            // Counters of one connection only grow: an older value (a read taken before a
            // close handed over the final one) adds nothing.
            let delta = r.stats.retransmits.saturating_sub(state.last.retransmits);
            if r.stats.retransmits < state.last.retransmits {
                continue;
            }
            if delta > 0 || r.stats.last_ts != state.last.last_ts {
                state.last_active_tick = tick;
            }
            state.retransmits += delta;
            let was_closed = state.closed_at_tick.is_some();
            state.last = r.stats;
            // A closed connection stays closed (its generation is never reused).
            if closing || was_closed {
                state.closed_at_tick.get_or_insert(tick);
                state.last.flags |= CONN_CLOSED;
            }
            if delta > 0 {
                *self
                    .totals
                    .entry((r.stats.tgid, role_of(r.stats.tid)))
                    .or_default() += delta;
            }
        }
        let retention = self.retention_ticks;
        self.conns
            .retain(|_, c| c.closed_at_tick.is_none_or(|at| tick - at <= retention));

        let mut rows: Vec<(u64, ConnRow)> = self
            .conns
            .values()
            .map(|c| {
                let process = threads
                    .and_then(|t| t.process(c.last.tgid))
                    .map(|p| p.name.clone())
                    .unwrap_or_default();
                (
                    c.last_active_tick,
                    ConnRow {
                        tuple: c.last.tuple,
                        pid: c.last.tgid,
                        tid: c.last.tid,
                        process,
                        role: role_of(c.last.tid),
                        retransmits: c.retransmits,
                        srtt_us: c.last.srtt_us,
                        snd_cwnd: c.last.snd_cwnd,
                        closed: c.closed_at_tick.is_some(),
                    },
                )
            })
            .collect();
        rows.sort_by(|a, b| {
            b.1.retransmits
                .cmp(&a.1.retransmits)
                .then(b.0.cmp(&a.0))
                .then(a.1.tuple.cmp(&b.1.tuple))
        });
        let unlisted = rows.len().saturating_sub(self.max_exported) as u64;
        rows.truncate(self.max_exported);
        NetSnapshot {
            conns: rows.into_iter().map(|(_, r)| r).collect(),
            unlisted,
            retransmits: self.totals.clone(),
            recent: self.recent.iter().cloned().collect(),
        }
    }

    /// Forgets the totals of processes that `keep` rejects (they left the job's tables).
    pub fn prune(&mut self, keep: impl Fn(u32) -> bool) {
        self.totals.retain(|(pid, _), _| *pid == 0 || keep(*pid));
    }
}

/// A tuple's endpoints as `addr:port` strings (IPv6 in brackets); `("", "")` when unknown.
pub fn endpoints(t: &TcpTuple) -> (String, String) {
    use std::net::{Ipv4Addr, Ipv6Addr};
    let addr = |a: &[u8; 16], port: u16| -> String {
        match t.family {
            slo_probe_common::net::AF_INET => {
                format!("{}:{port}", Ipv4Addr::new(a[0], a[1], a[2], a[3]))
            }
            slo_probe_common::net::AF_INET6 => format!("[{}]:{port}", Ipv6Addr::from(*a)),
            _ => String::new(),
        }
    };
    (addr(&t.saddr, t.sport), addr(&t.daddr, t.dport))
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::net::AF_INET;

    fn conn(tgid: u32, tid: u32, retransmits: u64, port: u16) -> ConnStats {
        ConnStats {
            tuple: TcpTuple {
                saddr: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                daddr: [10, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                sport: port,
                dport: 29500,
                family: AF_INET,
                _pad: 0,
            },
            tgid,
            tid,
            retransmits,
            srtt_us: 250,
            snd_cwnd: 10,
            last_ts: retransmits,
            flags: 0,
            generation: 7,
            retrans_base: 0,
            _pad: 0,
        }
    }

    #[test]
    fn retransmits_accumulate_through_close_and_reuse() {
        let mut t = ConnTable::new(1, 10);
        let read = |stats| ConnRead { sk: 1, stats };
        let s = t.apply(&[read(conn(5, 6, 3, 1000))], &[], None, |_| true);
        assert_eq!(s.conns[0].retransmits, 3);
        // It closes with 4: the final state comes from the closed record; the map entry is
        // gone (a stale read of the entry in the same tick adds nothing).
        let mut closed = conn(5, 6, 4, 1000);
        closed.flags = CONN_CLOSED;
        let s = t.apply(&[read(conn(5, 6, 3, 1000))], &[read(closed)], None, |_| {
            true
        });
        assert_eq!(s.conns.len(), 1);
        assert!(s.conns[0].closed);
        assert_eq!(s.retransmits[&(5, Role::Other)], 4);
        // Same socket address, a new connection (another generation): a row of its own, and
        // the closed one keeps its count.
        let mut reused = conn(5, 6, 1, 1001);
        reused.generation = 8;
        let s = t.apply(&[read(reused)], &[], None, |_| true);
        assert_eq!(s.retransmits[&(5, Role::Other)], 5);
        assert_eq!(s.conns.len(), 2);
        assert!(s.conns.iter().any(|c| c.closed && c.retransmits == 4));
        assert!(s.conns.iter().any(|c| !c.closed && c.retransmits == 1));
        // The closed one is gone after the retention.
        let s = t.apply(&[read(reused)], &[], None, |_| true);
        assert_eq!(s.conns.len(), 1);
    }

    #[test]
    fn listing_is_capped_and_counts_the_rest() {
        let mut t = ConnTable::new(5, 2);
        let reads: Vec<_> = (0..5)
            .map(|i| ConnRead {
                sk: i,
                stats: conn(5, 6, i, 1000 + i as u16),
            })
            .collect();
        let s = t.apply(&reads, &[], None, |_| true);
        assert_eq!(s.conns.len(), 2);
        assert_eq!(s.unlisted, 3);
        assert_eq!(s.conns[0].retransmits, 4);
        assert_eq!(s.retransmits[&(5, Role::Other)], 10);
    }

    #[test]
    fn owners_outside_the_job_are_ignored() {
        let mut t = ConnTable::new(5, 10);
        let s = t.apply(
            &[ConnRead {
                sk: 1,
                stats: conn(77, 78, 9, 1),
            }],
            &[],
            None,
            |p| p != 77,
        );
        assert!(s.conns.is_empty());
        assert!(s.retransmits.is_empty());
    }

    #[test]
    fn endpoint_strings() {
        let (l, r) = endpoints(&conn(1, 1, 0, 4242).tuple);
        assert_eq!(
            (l.as_str(), r.as_str()),
            ("10.0.0.1:4242", "10.0.0.2:29500")
        );
    }
}
