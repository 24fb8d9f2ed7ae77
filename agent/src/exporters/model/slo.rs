//! The SLO tree of each training process: per node its value, threshold (and where it comes
//! from), baseline, compliance, burn rate, state and violations, the job's score, and the
//! attribution of every open violation.

use slo_probe_core::{
    slo::{NodeState, Severity},
    snapshot::ProcessSnapshot,
};

use super::{Family, Kind, ProcLabels, Sink};

/// Every state a node can be in, for `slo_probe_slo_state`.
const STATES: [NodeState; 5] = [
    NodeState::Unknown,
    NodeState::Ok,
    NodeState::Breaching,
    NodeState::Violated(Severity::Warning),
    NodeState::Violated(Severity::Critical),
];

static SCORE: Family = Family {
    name: "slo_probe_slo_score",
    kind: Kind::Gauge,
    help: "The job's weighted compliance over the SLO tree's weighted nodes (1: every judged \
           window met its threshold).",
    unit: "",
};
static VALUE: Family = Family {
    name: "slo_probe_slo_value",
    kind: Kind::Gauge,
    help: "A node's value in its last judged window, in its unit (ms, percent, ms per second, \
           per second).",
    unit: "",
};
static THRESHOLD: Family = Family {
    name: "slo_probe_slo_threshold",
    kind: Kind::Gauge,
    help: "The threshold in force: explicit (the config's), default (the seed's, until a \
           baseline is learned) or baseline (learned, with the node's tolerance).",
    unit: "",
};
static BASELINE: Family = Family {
    name: "slo_probe_slo_baseline",
    kind: Kind::Gauge,
    help: "The node's value learned from the job's healthy windows.",
    unit: "",
};
static COMPLIANCE: Family = Family {
    name: "slo_probe_slo_compliance_ratio",
    kind: Kind::Gauge,
    help: "Share of the node's judged windows (up to slo.compliance_windows) that met the \
           threshold.",
    unit: "1",
};
static BURN_RATE: Family = Family {
    name: "slo_probe_slo_burn_rate",
    kind: Kind::Gauge,
    help: "Error-budget burn rate over the last slo.burn_windows windows: the share that \
           missed, over 1 - target (1: exactly on budget).",
    unit: "",
};
static STATE: Family = Family {
    name: "slo_probe_slo_state",
    kind: Kind::Gauge,
    help: "1 for the node's current state: unknown, ok, breaching (the last window missed), \
           warning or critical (a violation is open).",
    unit: "",
};
static WINDOWS: Family = Family {
    name: "slo_probe_slo_windows_total",
    kind: Kind::Counter,
    help: "SLO windows judged for the node (with slo_probe_slo_windows_missed_total: the error \
           ratio over any range, for multi-window burn-rate rules).",
    unit: "",
};
static WINDOWS_MISSED: Family = Family {
    name: "slo_probe_slo_windows_missed_total",
    kind: Kind::Counter,
    help: "SLO windows whose value missed the node's threshold.",
    unit: "",
};
static TARGET: Family = Family {
    name: "slo_probe_slo_target",
    kind: Kind::Gauge,
    help: "The node's compliance target: the share of windows that should meet the threshold \
           (the error budget is 1 - target).",
    unit: "",
};
static VIOLATIONS: Family = Family {
    name: "slo_probe_slo_violations_total",
    kind: Kind::Counter,
    help: "Violations opened (a node breaching its threshold in slo.breach_windows consecutive \
           windows).",
    unit: "",
};
static ATTRIBUTION: Family = Family {
    name: "slo_probe_attribution_seconds",
    kind: Kind::Gauge,
    help: "For each open violation of an iteration metric, the operators that made iterations \
           slower, by rank: their contribution per iteration, seconds, with the dimension \
           (launch_latency, occupancy, memory_bandwidth, execution, communication, \
           data_loading).",
    unit: "s",
};

/// The `slo_probe_slo_*` and `slo_probe_attribution_*` families of `shims`.
pub fn walk(sink: &mut impl Sink, shims: &[ProcessSnapshot]) {
    let trees: Vec<_> = shims
        .iter()
        .filter_map(|p| p.slo.as_ref().map(|s| (ProcLabels::of(p), s)))
        .collect();
    sink.family(&SCORE);
    for (l, s) in &trees {
        if let Some(v) = s.nodes.first().and_then(|r| r.compliance) {
            sink.sample(&SCORE, &l.get(), v);
        }
    }
    sink.family(&VALUE);
    for (l, s) in &trees {
        let [pid, rank, job] = l.get();
        for n in s.nodes.iter().skip(1) {
            if let (Some(v), Some(m), Some(st)) = (n.value, n.metric, n.stat) {
                sink.sample(
                    &VALUE,
                    &[
                        pid,
                        rank,
                        job,
                        ("node", &n.name),
                        ("metric", m.as_str()),
                        ("stat", st.as_str()),
                        ("unit", n.unit),
                    ],
                    v,
                );
            }
        }
    }
    sink.family(&THRESHOLD);
    for (l, s) in &trees {
        let [pid, rank, job] = l.get();
        for n in s.nodes.iter().skip(1) {
            if let Some((t, src)) = n.threshold {
                sink.sample(
                    &THRESHOLD,
                    &[pid, rank, job, ("node", &n.name), ("source", src.as_str())],
                    t,
                );
            }
        }
    }
    sink.family(&BASELINE);
    for (l, s) in &trees {
        let [pid, rank, job] = l.get();
        for n in s.nodes.iter().skip(1) {
            if let Some(b) = n.baseline {
                sink.sample(&BASELINE, &[pid, rank, job, ("node", &n.name)], b);
            }
        }
    }
    // Declared together, sampled per node.
    sink.family(&COMPLIANCE);
    sink.family(&BURN_RATE);
    for (l, s) in &trees {
        let [pid, rank, job] = l.get();
        for n in s.nodes.iter().skip(1) {
            let labels = [pid, rank, job, ("node", &n.name)];
            if let Some(c) = n.compliance {
                sink.sample(&COMPLIANCE, &labels, c);
            }
            if let Some(b) = n.burn_rate {
                sink.sample(&BURN_RATE, &labels, b);
            }
        }
    }
    sink.family(&STATE);
    for (l, s) in &trees {
        let [pid, rank, job] = l.get();
        for n in &s.nodes {
            for st in STATES {
                sink.sample(
                    &STATE,
                    &[pid, rank, job, ("node", &n.name), ("state", st.as_str())],
                    f64::from(u8::from(n.state == st)),
                );
            }
        }
    }
    // Declared together, sampled per node.
    sink.family(&WINDOWS);
    sink.family(&WINDOWS_MISSED);
    sink.family(&TARGET);
    for (l, s) in &trees {
        let [pid, rank, job] = l.get();
        for n in s.nodes.iter().skip(1) {
            let labels = [pid, rank, job, ("node", &n.name)];
            sink.sample(&WINDOWS, &labels, n.windows as f64);
            sink.sample(&WINDOWS_MISSED, &labels, n.missed as f64);
            sink.sample(&TARGET, &labels, n.target);
        }
    }
    sink.family(&VIOLATIONS);
    for (l, s) in &trees {
        let [pid, rank, job] = l.get();
        for n in s.nodes.iter().skip(1) {
            sink.sample(
                &VIOLATIONS,
                &[pid, rank, job, ("node", &n.name)],
                n.violations as f64,
            );
        }
    }
    sink.family(&ATTRIBUTION);
    for (l, s) in &trees {
        let [pid, rank, job] = l.get();
        for v in s.open() {
            let Some(a) = &v.attribution else { continue };
            for (k, c) in a.causes.iter().enumerate() {
                sink.sample(
                    &ATTRIBUTION,
                    &[
                        pid,
                        rank,
                        job,
                        ("node", &v.node),
                        ("cause_rank", &(k + 1).to_string()),
                        ("op", &c.op),
                        ("dimension", c.dimension.as_str()),
                    ],
                    c.delta_ns / 1e9,
                );
            }
        }
    }
}
