//! The metric model: every family the agent exports, defined once, and one walk over a
//! [`Snapshot`] that emits typed samples to a [`Sink`]. The Prometheus text writer
//! ([`super::prometheus::TextSink`]) and the OTLP exporter ([`super::otlp`]) are sinks, so
//! the two exports cannot drift: same names, labels, values and order.
//!
//! A walk declares each family ([`Sink::family`]) before its samples. A few families are
//! declared together and their samples interleaved per process (the iteration quantiles, the
//! SLO compliance and burn rate, the GPU CPU affinity): that is the order the exposition has
//! always had, and Prometheus accepts it. Values are `f64`, as Prometheus stores them (counts
//! above 2^53 lose their last digits, in the exposition as in the TSDB).
//!
//! Label cardinality: (process, role) series are at most five per live (or recently exited)
//! process of the job; thread series one per thread, left out with `per_thread = false`;
//! connection series at most `prometheus.max_connections`; cgroup series one per cgroup holding
//! a job process. Histogram buckets are the kernel's log2 slots from 1.024 µs to 17.2 s (25
//! buckets + `+Inf`).

pub mod gpu;
mod heal;
mod host;
mod process;
pub mod slo;

use slo_probe_common::Counter;
use slo_probe_core::snapshot::{ProcessSnapshot, Snapshot};

/// How a family's samples add up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A cumulative, monotonic total.
    Counter,
    /// Cumulative buckets with a sum and a count.
    Histogram,
}

impl Kind {
    /// The Prometheus `# TYPE` word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// A metric family: its one definition.
#[derive(Debug, PartialEq, Eq)]
pub struct Family {
    /// `slo_probe_<name>_<unit>[_total]`.
    pub name: &'static str,
    /// How its samples add up.
    pub kind: Kind,
    /// One sentence or more (the `# HELP` text, the OTLP description).
    pub help: &'static str,
    /// UCUM unit for OTLP (`s`, `By`, `1`, ...; empty: none). A histogram's `_count` is `1`.
    pub unit: &'static str,
}

/// A label: name and value (not escaped: the sink escapes).
pub type Label<'a> = (&'static str, &'a str);

/// One histogram series.
#[derive(Clone, Copy, Debug)]
pub struct Histogram<'a> {
    /// Upper bounds (`le`) and cumulative counts, ascending; `+Inf` is [`Histogram::count`].
    pub buckets: &'a [(f64, u64)],
    /// Sum of the observations, in the family's unit.
    pub sum: f64,
    /// Observations.
    pub count: u64,
}

/// Where a walk's samples go.
pub trait Sink {
    /// A family whose samples (if any) follow; called once per family per walk.
    fn family(&mut self, family: &'static Family);
    /// One gauge or counter sample of a family declared before.
    fn sample(&mut self, family: &'static Family, labels: &[Label<'_>], value: f64);
    /// One histogram series of a family declared before.
    fn histogram(&mut self, family: &'static Family, labels: &[Label<'_>], h: &Histogram<'_>);
}

/// What a walk leaves out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Per-thread families (`slo_probe_thread_*`): the unbounded share of the series.
    pub per_thread: bool,
}

static BUILD_INFO: Family = Family {
    name: "slo_probe_build_info",
    kind: Kind::Gauge,
    help: "slo-probe build; always 1.",
    unit: "",
};
static PROBE_UP: Family = Family {
    name: "slo_probe_probe_up",
    kind: Kind::Gauge,
    help: "Whether a probe family is attached and reporting (1) or down (0; see the reason label).",
    unit: "",
};
static EBPF_DROPPED: Family = Family {
    name: "slo_probe_ebpf_events_dropped_total",
    kind: Kind::Counter,
    help: "Events the probes dropped instead of blocking, by reason.",
    unit: "",
};
static EBPF_ERRORS: Family = Family {
    name: "slo_probe_ebpf_errors_total",
    kind: Kind::Counter,
    help: "Errors while collecting, by reason.",
    unit: "",
};
static EBPF_RECORDS: Family = Family {
    name: "slo_probe_ebpf_records_total",
    kind: Kind::Counter,
    help: "Records the probes sent to the agent, by kind.",
    unit: "",
};
/// The agent's own CPU time (also sent as the semantic-convention `process.cpu.time`).
pub static AGENT_CPU: Family = Family {
    name: "slo_probe_agent_cpu_seconds_total",
    kind: Kind::Counter,
    help: "CPU time the agent itself used.",
    unit: "s",
};
/// The agent's resident memory (also sent as the semantic-convention `process.memory.usage`).
pub static AGENT_RSS: Family = Family {
    name: "slo_probe_agent_resident_memory_bytes",
    kind: Kind::Gauge,
    help: "Resident memory of the agent.",
    unit: "By",
};
static AGENT_TICKS: Family = Family {
    name: "slo_probe_agent_ticks_total",
    kind: Kind::Counter,
    help: "Collection ticks since the agent started.",
    unit: "",
};

/// Walks the whole snapshot into `sink`, in exposition order.
pub fn walk(snapshot: &Snapshot, options: Options, sink: &mut impl Sink) {
    sink.family(&BUILD_INFO);
    sink.sample(&BUILD_INFO, &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    sink.family(&PROBE_UP);
    for p in &snapshot.probes {
        sink.sample(
            &PROBE_UP,
            &[("probe", p.name), ("reason", &p.reason)],
            f64::from(u8::from(p.up)),
        );
    }

    if let Some(t) = &snapshot.threads {
        host::threads(sink, t, snapshot, options.per_thread);
    }
    if let Some(net) = &snapshot.net {
        host::net(sink, net, snapshot.threads.as_ref());
    }
    host::cgroups(sink, snapshot);
    process::shims(sink, &snapshot.processes);
    process::refused(sink, &snapshot.shim_refused);
    process::stragglers(sink, &snapshot.stragglers);
    slo::walk(sink, &snapshot.processes);
    if let Some(g) = &snapshot.gpus {
        gpu::walk(sink, g);
    }
    heal::walk(sink, &snapshot.healers);

    sink.family(&EBPF_DROPPED);
    for c in Counter::ALL.into_iter().filter(|c| c.is_drop()) {
        sink.sample(
            &EBPF_DROPPED,
            &[("reason", c.name())],
            snapshot.counters[c as usize] as f64,
        );
    }
    sink.family(&EBPF_ERRORS);
    for c in [Counter::ProbeReadFailed, Counter::DecodeFailed] {
        sink.sample(
            &EBPF_ERRORS,
            &[("reason", c.name())],
            snapshot.counters[c as usize] as f64,
        );
    }
    sink.family(&EBPF_RECORDS);
    sink.sample(
        &EBPF_RECORDS,
        &[("kind", "runq_outlier")],
        snapshot.counters[Counter::OutliersSent as usize] as f64,
    );

    sink.family(&AGENT_CPU);
    sink.sample(&AGENT_CPU, &[], snapshot.agent.cpu_seconds);
    sink.family(&AGENT_RSS);
    sink.sample(&AGENT_RSS, &[], snapshot.agent.resident_bytes as f64);
    sink.family(&AGENT_TICKS);
    sink.sample(&AGENT_TICKS, &[], snapshot.agent.ticks as f64);
}

/// The labels of a training process's series: `pid`, and its `rank` and `job_id` from its
/// environment (empty when unknown).
pub(crate) struct ProcLabels<'a> {
    pid: String,
    rank: String,
    job_id: &'a str,
}

impl<'a> ProcLabels<'a> {
    pub(crate) fn of(p: &'a ProcessSnapshot) -> Self {
        Self {
            pid: p.pid.to_string(),
            rank: p.rank.map(|r| r.to_string()).unwrap_or_default(),
            job_id: p.job_id.as_deref().unwrap_or(""),
        }
    }

    /// `pid`, `rank`, `job_id`.
    pub(crate) fn get(&self) -> [Label<'_>; 3] {
        [
            ("pid", &self.pid),
            ("rank", &self.rank),
            ("job_id", self.job_id),
        ]
    }
}

#[cfg(test)]
pub(crate) mod tests;
