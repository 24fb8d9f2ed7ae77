//! The host families: run-queue latency, off-CPU time, context switches and TCP bytes per
//! (process, role) and per thread; run-queue outliers; TCP retransmits per (process, role) and
//! per connection; the job's cgroups (CFS throttling, limit, pressure) and system-wide pressure.

use slo_probe_core::{
    cgroup::{CgroupRow, CpuStat},
    net::{endpoints, ConnRow, NetSnapshot},
    snapshot::Snapshot,
    threads::{RunqCounts, ThreadCounts, ThreadsSnapshot},
};

use super::{Family, Histogram, Kind, Label, Sink};

/// A family whose value is read from one row of `T`.
type Reading<T> = (Family, fn(&T) -> f64);
/// A series of a group counter: its `kind` label (empty: none) and how to read it.
type KindValue = (&'static str, fn(&ThreadCounts) -> f64);

/// First exported slot: bucket `le = 2^10 ns` (1.024 µs) holds every shorter wait too.
const FIRST_SLOT: usize = 9;
/// Last exported finite slot: `le = 2^34 ns` (17.2 s).
const LAST_SLOT: usize = 33;

/// The kernel's log2 run-queue slots as a histogram in seconds.
fn runq_histogram(
    sink: &mut impl Sink,
    family: &'static Family,
    labels: &[Label<'_>],
    c: &RunqCounts,
) {
    let mut buckets = [(0.0, 0u64); LAST_SLOT - FIRST_SLOT + 1];
    for (b, slot) in buckets.iter_mut().zip(FIRST_SLOT..=LAST_SLOT) {
        *b = (
            (1u64 << (slot + 1)) as f64 / 1e9,
            c.cumulative_below_slot_end(slot),
        );
    }
    sink.histogram(
        family,
        labels,
        &Histogram {
            buckets: &buckets,
            sum: c.total_ns as f64 / 1e9,
            count: c.count,
        },
    );
}

static RUNQ_LATENCY: Family = Family {
    name: "slo_probe_runqueue_latency_seconds",
    kind: Kind::Histogram,
    help: "Time threads spent runnable, waiting for a CPU, per wait; by process and thread role.",
    unit: "s",
};

/// A counter over the (process, role) groups and its series.
struct GroupCounter {
    family: Family,
    values: &'static [KindValue],
}

static GROUP_COUNTERS: [GroupCounter; 5] = [
    GroupCounter {
        family: Family {
            name: "slo_probe_runqueue_preempted_waits_total",
            kind: Kind::Counter,
            help: "Run-queue waits that began with an involuntary preemption (the rest began \
                   with a wakeup).",
            unit: "",
        },
        values: &[("", |c| c.runq.preempted as f64)],
    },
    GroupCounter {
        family: Family {
            name: "slo_probe_offcpu_seconds_total",
            kind: Kind::Counter,
            help: "Time threads spent off CPU, from switch-out to switch-in: voluntary (blocked \
                   or sleeping, including the wait after the wakeup) or involuntary (preempted).",
            unit: "s",
        },
        values: &[
            ("voluntary", |c| c.offcpu_voluntary_ns as f64 / 1e9),
            ("involuntary", |c| c.offcpu_involuntary_ns as f64 / 1e9),
        ],
    },
    GroupCounter {
        family: Family {
            name: "slo_probe_context_switches_total",
            kind: Kind::Counter,
            help: "Context switches away from threads: voluntary or involuntary (preemptions).",
            unit: "",
        },
        values: &[
            ("voluntary", |c| c.switches_voluntary as f64),
            ("involuntary", |c| c.switches_involuntary as f64),
        ],
    },
    GroupCounter {
        family: Family {
            name: "slo_probe_tcp_sent_bytes_total",
            kind: Kind::Counter,
            help: "TCP payload bytes sent by threads.",
            unit: "By",
        },
        values: &[("", |c| c.tcp_sent_bytes as f64)],
    },
    GroupCounter {
        family: Family {
            name: "slo_probe_tcp_received_bytes_total",
            kind: Kind::Counter,
            help: "TCP payload bytes received by threads.",
            unit: "By",
        },
        values: &[("", |c| c.tcp_recv_bytes as f64)],
    },
];

static THREAD_RUNQ_LATENCY: Family = Family {
    name: "slo_probe_thread_runqueue_latency_seconds",
    kind: Kind::Histogram,
    help: "Time a thread spent runnable, waiting for a CPU, per wait.",
    unit: "s",
};
static THREAD_OFFCPU: Family = Family {
    name: "slo_probe_thread_offcpu_seconds_total",
    kind: Kind::Counter,
    help: "Time a thread spent off CPU, by kind.",
    unit: "s",
};
static RUNQ_OUTLIERS: Family = Family {
    name: "slo_probe_runqueue_outliers_total",
    kind: Kind::Counter,
    help: "Run-queue waits at or above the outlier threshold, per process.",
    unit: "",
};

pub(super) fn threads(
    sink: &mut impl Sink,
    t: &ThreadsSnapshot,
    snapshot: &Snapshot,
    per_thread: bool,
) {
    let process_name = |pid: u32| t.process(pid).map_or("", |p| p.name.as_str());
    let pids: Vec<String> = t.groups.iter().map(|g| g.pid.to_string()).collect();
    sink.family(&RUNQ_LATENCY);
    for (g, pid) in t.groups.iter().zip(&pids) {
        let labels = [
            ("pid", pid.as_str()),
            ("process", &g.process),
            ("role", g.role.as_str()),
        ];
        runq_histogram(sink, &RUNQ_LATENCY, &labels, &g.counts.runq);
    }
    for c in &GROUP_COUNTERS {
        sink.family(&c.family);
        for (g, pid) in t.groups.iter().zip(&pids) {
            for (kind, value) in c.values {
                let labels = [
                    ("pid", pid.as_str()),
                    ("process", &g.process),
                    ("role", g.role.as_str()),
                    ("kind", kind),
                ];
                // No `kind` label where the family has a single series per group.
                let n = if kind.is_empty() { 3 } else { 4 };
                sink.sample(&c.family, &labels[..n], value(&g.counts));
            }
        }
    }
    if per_thread {
        let ids: Vec<(String, String)> = t
            .threads
            .iter()
            .map(|th| (th.pid.to_string(), th.tid.to_string()))
            .collect();
        sink.family(&THREAD_RUNQ_LATENCY);
        for (th, (pid, tid)) in t.threads.iter().zip(&ids) {
            let labels = [
                ("pid", pid.as_str()),
                ("process", process_name(th.pid)),
                ("tid", tid.as_str()),
                ("thread", &th.name),
                ("role", th.role.as_str()),
            ];
            runq_histogram(sink, &THREAD_RUNQ_LATENCY, &labels, &th.counts.runq);
        }
        sink.family(&THREAD_OFFCPU);
        for (th, (pid, tid)) in t.threads.iter().zip(&ids) {
            for (kind, ns) in [
                ("voluntary", th.counts.offcpu_voluntary_ns),
                ("involuntary", th.counts.offcpu_involuntary_ns),
            ] {
                let labels = [
                    ("pid", pid.as_str()),
                    ("process", process_name(th.pid)),
                    ("tid", tid.as_str()),
                    ("thread", &th.name),
                    ("role", th.role.as_str()),
                    ("kind", kind),
                ];
                sink.sample(&THREAD_OFFCPU, &labels, ns as f64 / 1e9);
            }
        }
    }
    sink.family(&RUNQ_OUTLIERS);
    for (pid, n) in &snapshot.outliers.per_process {
        sink.sample(
            &RUNQ_OUTLIERS,
            &[("pid", &pid.to_string()), ("process", process_name(*pid))],
            *n as f64,
        );
    }
}

static TCP_RETRANSMITS: Family = Family {
    name: "slo_probe_tcp_retransmits_total",
    kind: Kind::Counter,
    help: "Retransmitted TCP segments of the connections a process's threads own, by role \
           (pid 0: owner unknown).",
    unit: "",
};

/// The per-connection families and how to read their value.
static CONN_FAMILIES: [Reading<ConnRow>; 3] = [
    (
        Family {
            name: "slo_probe_tcp_connection_retransmits_total",
            kind: Kind::Counter,
            help: "Retransmitted segments of one connection.",
            unit: "",
        },
        |c| c.retransmits as f64,
    ),
    (
        Family {
            name: "slo_probe_tcp_connection_srtt_seconds",
            kind: Kind::Gauge,
            help: "Smoothed round-trip time of one connection at the last sample.",
            unit: "s",
        },
        |c| f64::from(c.srtt_us) / 1e6,
    ),
    (
        Family {
            name: "slo_probe_tcp_connection_cwnd_segments",
            kind: Kind::Gauge,
            help: "Congestion window of one connection at the last sample.",
            unit: "",
        },
        |c| f64::from(c.snd_cwnd),
    ),
];

static TCP_UNLISTED: Family = Family {
    name: "slo_probe_tcp_connections_unlisted",
    kind: Kind::Gauge,
    help: "Connections followed but not exported one by one (over prometheus.max_connections).",
    unit: "",
};

pub(super) fn net(sink: &mut impl Sink, net: &NetSnapshot, threads: Option<&ThreadsSnapshot>) {
    let process_name = |pid: u32| {
        threads
            .and_then(|t| t.process(pid))
            .map_or("", |p| p.name.as_str())
    };
    sink.family(&TCP_RETRANSMITS);
    for ((pid, role), n) in &net.retransmits {
        sink.sample(
            &TCP_RETRANSMITS,
            &[
                ("pid", &pid.to_string()),
                ("process", process_name(*pid)),
                ("role", role.as_str()),
            ],
            *n as f64,
        );
    }
    let conns: Vec<(String, String, String)> = net
        .conns
        .iter()
        .map(|c| {
            let (local, remote) = endpoints(&c.tuple);
            (c.pid.to_string(), local, remote)
        })
        .collect();
    for (family, value) in &CONN_FAMILIES {
        sink.family(family);
        for (c, (pid, local, remote)) in net.conns.iter().zip(&conns) {
            let labels = [
                ("pid", pid.as_str()),
                ("process", &c.process),
                ("role", c.role.as_str()),
                ("local", local),
                ("remote", remote),
            ];
            sink.sample(family, &labels, value(c));
        }
    }
    sink.family(&TCP_UNLISTED);
    sink.sample(&TCP_UNLISTED, &[], net.unlisted as f64);
}

/// The CFS bandwidth families and how to read their value.
static CPU_FAMILIES: [Reading<CpuStat>; 3] = [
    (
        Family {
            name: "slo_probe_cgroup_cpu_periods_total",
            kind: Kind::Counter,
            help: "CFS bandwidth periods elapsed in a cgroup of the job.",
            unit: "",
        },
        |s| s.nr_periods as f64,
    ),
    (
        Family {
            name: "slo_probe_cgroup_cpu_throttled_periods_total",
            kind: Kind::Counter,
            help: "Periods in which a cgroup of the job was throttled.",
            unit: "",
        },
        |s| s.nr_throttled as f64,
    ),
    (
        Family {
            name: "slo_probe_cgroup_cpu_throttled_seconds_total",
            kind: Kind::Counter,
            help: "Time a cgroup of the job was throttled.",
            unit: "s",
        },
        |s| s.throttled_ns as f64 / 1e9,
    ),
];

static CGROUP_LIMIT: Family = Family {
    name: "slo_probe_cgroup_cpu_limit_cpus",
    kind: Kind::Gauge,
    help: "CPU limit of a cgroup of the job (quota / period), where one is set.",
    unit: "",
};
static CGROUP_PRESSURE: Family = Family {
    name: "slo_probe_cgroup_cpu_pressure_stalled_seconds_total",
    kind: Kind::Counter,
    help: "CPU pressure stall time of a cgroup of the job (cgroup v2 with PSI).",
    unit: "s",
};
static PRESSURE: Family = Family {
    name: "slo_probe_pressure_stalled_seconds_total",
    kind: Kind::Counter,
    help: "System-wide pressure stall time (PSI) by resource: some task stalled, or all.",
    unit: "s",
};

/// A cgroup's labels: `cgroup`, `version`, `roles` (comma-separated).
struct CgroupLabels {
    version: String,
    roles: String,
}

impl CgroupLabels {
    fn of(c: &CgroupRow) -> Self {
        let roles: Vec<&str> = c.roles.iter().map(|r| r.as_str()).collect();
        Self {
            version: c.version.to_string(),
            roles: roles.join(","),
        }
    }
}

pub(super) fn cgroups(sink: &mut impl Sink, snapshot: &Snapshot) {
    let labels: Vec<CgroupLabels> = snapshot.cgroups.iter().map(CgroupLabels::of).collect();
    let rows = || snapshot.cgroups.iter().zip(&labels);
    for (family, value) in &CPU_FAMILIES {
        sink.family(family);
        for (c, l) in rows() {
            let Some(s) = &c.cpu else { continue };
            let labels = [
                ("cgroup", c.path.as_str()),
                ("version", &l.version),
                ("roles", &l.roles),
            ];
            sink.sample(family, &labels, value(s));
        }
    }
    sink.family(&CGROUP_LIMIT);
    for (c, l) in rows() {
        if let Some(cpus) = c.limit.and_then(|l| l.cpus()) {
            let labels = [
                ("cgroup", c.path.as_str()),
                ("version", &l.version),
                ("roles", &l.roles),
            ];
            sink.sample(&CGROUP_LIMIT, &labels, cpus);
        }
    }
    sink.family(&CGROUP_PRESSURE);
    for (c, l) in rows() {
        if let Some(p) = c.pressure {
            for (kind, us) in [("some", p.some_us), ("full", p.full_us)] {
                let labels = [
                    ("cgroup", c.path.as_str()),
                    ("version", &l.version),
                    ("roles", &l.roles),
                    ("kind", kind),
                ];
                sink.sample(&CGROUP_PRESSURE, &labels, us as f64 / 1e6);
            }
        }
    }
    sink.family(&PRESSURE);
    for p in &snapshot.pressure {
        for (kind, us) in [("some", p.pressure.some_us), ("full", p.pressure.full_us)] {
            sink.sample(
                &PRESSURE,
                &[("resource", p.resource), ("kind", kind)],
                us as f64 / 1e6,
            );
        }
    }
}
