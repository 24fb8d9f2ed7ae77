//! The SLO tree of each training process in Prometheus text: per node its value, threshold
//! (and where it comes from), baseline, compliance, burn rate, state and violations, the job's
//! score, and the attribution of every open violation.

use std::fmt::Write as _;

use slo_probe_core::{
    slo::{NodeState, Severity},
    snapshot::ProcessSnapshot,
};

use super::{escape, header, proc_labels};

/// Every state a node can be in, for `slo_probe_slo_state`.
const STATES: [NodeState; 5] = [
    NodeState::Unknown,
    NodeState::Ok,
    NodeState::Breaching,
    NodeState::Violated(Severity::Warning),
    NodeState::Violated(Severity::Critical),
];

/// Renders the `slo_probe_slo_*` and `slo_probe_attribution_*` families.
pub fn render_slo(out: &mut String, shims: &[ProcessSnapshot]) {
    let trees: Vec<_> = shims
        .iter()
        .filter_map(|p| p.slo.as_ref().map(|s| (proc_labels(p), s)))
        .collect();
    header(
        out,
        "slo_probe_slo_score",
        "gauge",
        "The job's weighted compliance over the SLO tree's weighted nodes (1: every judged window \
         met its threshold).",
    );
    for (pid, s) in &trees {
        if let Some(v) = s.nodes.first().and_then(|r| r.compliance) {
            let _ = writeln!(out, "slo_probe_slo_score{{{pid}}} {v}");
        }
    }
    header(
        out,
        "slo_probe_slo_value",
        "gauge",
        "A node's value in its last judged window, in its unit (ms, percent, ms per second, per \
         second).",
    );
    for (pid, s) in &trees {
        for n in s.nodes.iter().skip(1) {
            if let (Some(v), Some(m), Some(st)) = (n.value, n.metric, n.stat) {
                let _ = writeln!(
                    out,
                    "slo_probe_slo_value{{{pid},node=\"{}\",metric=\"{}\",stat=\"{}\",\
                     unit=\"{}\"}} {v}",
                    escape(&n.name),
                    m.as_str(),
                    st.as_str(),
                    escape(n.unit)
                );
            }
        }
    }
    header(
        out,
        "slo_probe_slo_threshold",
        "gauge",
        "The threshold in force: explicit (the config's), default (the seed's, until a baseline \
         is learned) or baseline (learned, with the node's tolerance).",
    );
    for (pid, s) in &trees {
        for n in s.nodes.iter().skip(1) {
            if let Some((t, src)) = n.threshold {
                let _ = writeln!(
                    out,
                    "slo_probe_slo_threshold{{{pid},node=\"{}\",source=\"{}\"}} {t}",
                    escape(&n.name),
                    src.as_str()
                );
            }
        }
    }
    header(
        out,
        "slo_probe_slo_baseline",
        "gauge",
        "The node's value learned from the job's healthy windows.",
    );
    for (pid, s) in &trees {
        for n in s.nodes.iter().skip(1) {
            if let Some(b) = n.baseline {
                let _ = writeln!(
                    out,
                    "slo_probe_slo_baseline{{{pid},node=\"{}\"}} {b}",
                    escape(&n.name)
                );
            }
        }
    }
    header(
        out,
        "slo_probe_slo_compliance_ratio",
        "gauge",
        "Share of the node's judged windows (up to slo.compliance_windows) that met the \
         threshold.",
    );
    header(
        out,
        "slo_probe_slo_burn_rate",
        "gauge",
        "Error-budget burn rate over the last slo.burn_windows windows: the share that missed, \
         over 1 - target (1: exactly on budget).",
    );
    for (pid, s) in &trees {
        for n in s.nodes.iter().skip(1) {
            let node = escape(&n.name);
            if let Some(c) = n.compliance {
                let _ = writeln!(
                    out,
                    "slo_probe_slo_compliance_ratio{{{pid},node=\"{node}\"}} {c}"
                );
            }
            if let Some(b) = n.burn_rate {
                let _ = writeln!(out, "slo_probe_slo_burn_rate{{{pid},node=\"{node}\"}} {b}");
            }
        }
    }
    header(
        out,
        "slo_probe_slo_state",
        "gauge",
        "1 for the node's current state: unknown, ok, breaching (the last window missed), \
         warning or critical (a violation is open).",
    );
    for (pid, s) in &trees {
        for n in &s.nodes {
            for st in STATES {
                let _ = writeln!(
                    out,
                    "slo_probe_slo_state{{{pid},node=\"{}\",state=\"{}\"}} {}",
                    escape(&n.name),
                    st.as_str(),
                    u8::from(n.state == st)
                );
            }
        }
    }
    header(
        out,
        "slo_probe_slo_windows_total",
        "counter",
        "SLO windows judged for the node (with slo_probe_slo_windows_missed_total: the error \
         ratio over any range, for multi-window burn-rate rules).",
    );
    header(
        out,
        "slo_probe_slo_windows_missed_total",
        "counter",
        "SLO windows whose value missed the node's threshold.",
    );
    header(
        out,
        "slo_probe_slo_target",
        "gauge",
        "The node's compliance target: the share of windows that should meet the threshold \
         (the error budget is 1 - target).",
    );
    for (pid, s) in &trees {
        for n in s.nodes.iter().skip(1) {
            let node = escape(&n.name);
            let _ = writeln!(
                out,
                "slo_probe_slo_windows_total{{{pid},node=\"{node}\"}} {}",
                n.windows
            );
            let _ = writeln!(
                out,
                "slo_probe_slo_windows_missed_total{{{pid},node=\"{node}\"}} {}",
                n.missed
            );
            let _ = writeln!(
                out,
                "slo_probe_slo_target{{{pid},node=\"{node}\"}} {}",
                n.target
            );
        }
    }
    header(
        out,
        "slo_probe_slo_violations_total",
        "counter",
        "Violations opened (a node breaching its threshold in slo.breach_windows consecutive \
         windows).",
    );
    for (pid, s) in &trees {
        for n in s.nodes.iter().skip(1) {
            let _ = writeln!(
                out,
                "slo_probe_slo_violations_total{{{pid},node=\"{}\"}} {}",
                escape(&n.name),
                n.violations
            );
        }
    }
    header(
        out,
        "slo_probe_attribution_seconds",
        "gauge",
        "For each open violation of an iteration metric, the operators that made iterations \
         slower, by rank: their contribution per iteration, seconds, with the dimension \
         (launch_latency, occupancy, memory_bandwidth, execution, communication, \
         data_loading).",
    );
    for (pid, s) in &trees {
        for v in s.open() {
            let Some(a) = &v.attribution else { continue };
            for (rank, c) in a.causes.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "slo_probe_attribution_seconds{{{pid},node=\"{}\",cause_rank=\"{}\",\
                     op=\"{}\",dimension=\"{}\"}} {}",
                    escape(&v.node),
                    rank + 1,
                    escape(&c.op),
                    c.dimension.as_str(),
                    c.delta_ns / 1e9
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_core::synth::{case, drive, generate, test_spec};

    /// A generated job whose all-reduce slows down, through the pipeline, rendered.
    #[test]
    fn renders_the_tree_and_the_attribution() {
        let mut p = drive(&generate(&case("comm_jitter", 5)), &test_spec());
        let info = p.info_mut();
        info.pid = 42;
        info.rank = Some(3);
        info.job_id = Some("llama".into());
        let shim = p.snapshot();
        let mut out = String::new();
        render_slo(&mut out, &[shim]);
        assert!(
            out.contains("slo_probe_slo_score{pid=\"42\",rank=\"3\",job_id=\"llama\"} "),
            "{out}"
        );
        assert!(out.contains(
            "slo_probe_slo_value{pid=\"42\",rank=\"3\",job_id=\"llama\",node=\"iteration\",metric=\"iteration_time\",\
             stat=\"p99\",unit=\"ms\"} "
        ));
        assert!(out.contains(
            "slo_probe_slo_threshold{pid=\"42\",rank=\"3\",job_id=\"llama\",node=\"iteration\",source=\"baseline\"}"
        ));
        assert!(
            out.contains("slo_probe_slo_state{pid=\"42\",rank=\"3\",job_id=\"llama\",node=\"iteration\",state=\"critical\"} 1")
                || out.contains(
                    "slo_probe_slo_state{pid=\"42\",rank=\"3\",job_id=\"llama\",node=\"iteration\",state=\"warning\"} 1"
                ),
            "{out}"
        );
        assert!(
            out.contains(
                "op=\"ncclDevKernel_AllReduce_Sum_f32_RING_LL\",dimension=\"communication\"}"
            ),
            "{out}"
        );
        // Every sample line belongs to a declared family.
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            assert!(out.contains(&format!("# TYPE {name} ")), "{line}");
        }
    }
}
