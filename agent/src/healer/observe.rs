//! Snapshot → what the healer reads. The ONE place that reads the core snapshot for the
//! healer: each training process the shim reports is a job; its [`JobObservation`] (iterations,
//! SLO node values, the open violation and its cause) and its [`JobTarget`] (threads by role,
//! descendants, own cgroups, GPU and that GPU's CPUs) come from here, so that a change of the
//! snapshot's shape is adapted here only.
//!
//! Not in the snapshot, and passed in by the loop: host CPU utilisation ([`HostExtra`]).

use std::collections::{BTreeMap, BTreeSet};

use slo_probe_core::{
    healer::{HostCause, IterationSample, JobObservation, NodeObs, OpenViolation},
    slo::{NodeState, Objective, SloSnapshot, Violation},
    snapshot::{ProcessSnapshot, Snapshot},
};

use super::actuators::{CgroupTarget, JobTarget, ThreadTarget};

/// Iterations handed to the healer per tick at most (it skips those it has seen).
const ITERATIONS: usize = 256;

/// Host figures the snapshot does not carry.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostExtra {
    /// Host CPU utilisation, 0..1.
    pub host_cpu_util: Option<f64>,
}

/// One job as the healer sees it, and what its actions may touch.
#[derive(Clone, Debug)]
pub struct Observed {
    /// For the core healer.
    pub obs: JobObservation,
    /// For the actuators.
    pub target: JobTarget,
}

/// Extra run-queue wait (ms/s over the node's baseline) that names a role's threads as the host
/// cause even when their node is not breaching: a tenth of a CPU-second per second.
const RUNQ_GROWTH_MS_PER_S: f64 = 100.0;

/// The host cause a host node stands for.
fn host_node(node: &str) -> Option<HostCause> {
    Some(match node {
        "host.throttling" => HostCause::Throttling,
        "host.runqueue.main" => HostCause::RunqueueMain,
        "host.runqueue.communication" => HostCause::RunqueueCommunication,
        "host.runqueue.data_loader" => HostCause::RunqueueDataLoader,
        "host.runqueue.pin_memory" => HostCause::RunqueuePinMemory,
        "host.retransmits" => HostCause::Retransmits,
        _ => return None,
    })
}

/// The host cause an attribution's sentence names (see `attribution::host_causes`).
fn host_text(what: &str) -> Option<HostCause> {
    Some(if what.starts_with("main threads waited") {
        HostCause::RunqueueMain
    } else if what.starts_with("data_loader threads waited") {
        HostCause::RunqueueDataLoader
    } else if what.starts_with("pin_memory threads waited") {
        HostCause::RunqueuePinMemory
    } else if what.starts_with("communication threads waited") {
        HostCause::RunqueueCommunication
    } else if what.contains("cgroup was throttled") {
        HostCause::Throttling
    } else if what.contains("TCP retransmits") {
        HostCause::Retransmits
    } else {
        return None;
    })
}

/// The host cause behind the job's violation, from the host nodes of the tree: throttling when
/// its node breaches or grew by at least [`RUNQ_GROWTH_MS_PER_S`] (it makes the throttled
/// threads wait on the run queue too); else the role
/// whose run-queue wait grew the most over its baseline, in ms per second (time every role
/// spends waiting, so comparable), when its node breaches or it grew by at least
/// [`RUNQ_GROWTH_MS_PER_S`]; else retransmits when their node breaches; else the cause the
/// attribution names.
fn host_cause(slo: &SloSnapshot, v: &Violation) -> HostCause {
    let breaching = |n: &slo_probe_core::slo::NodeView| {
        matches!(n.state, NodeState::Breaching | NodeState::Violated(_))
    };
    // Throttled time grows at once with a quota, while its node may take a few windows to
    // breach (and the healer diagnoses when the iteration's violation opens): growth of
    // [`RUNQ_GROWTH_MS_PER_S`] over its baseline names it as well.
    let throttle_grew = |n: &slo_probe_core::slo::NodeView| {
        n.value
            .is_some_and(|v| v - n.baseline.unwrap_or(0.0) >= RUNQ_GROWTH_MS_PER_S)
    };
    if slo
        .node("host.throttling")
        .is_some_and(|n| breaching(n) || throttle_grew(n))
    {
        return HostCause::Throttling;
    }
    let grown = slo
        .nodes
        .iter()
        .filter_map(|n| {
            let cause = host_node(&n.name)?;
            if matches!(cause, HostCause::Throttling | HostCause::Retransmits) {
                return None;
            }
            let growth = n.value? - n.baseline.unwrap_or(0.0);
            (growth > 0.0 && (breaching(n) || growth >= RUNQ_GROWTH_MS_PER_S))
                .then_some((growth, cause))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((_, cause)) = grown {
        return cause;
    }
    if slo.node("host.retransmits").is_some_and(breaching) {
        return HostCause::Retransmits;
    }
    v.attribution
        .as_ref()
        .and_then(|a| a.host.iter().find_map(|h| host_text(&h.what)))
        .unwrap_or(HostCause::None)
}

/// The violation the healer acts on: the open one of a weighted node (the job's SLO) that
/// opened first, with its cause.
fn violation(slo: &SloSnapshot) -> Option<OpenViolation> {
    let weighted = |v: &&Violation| slo.node(&v.node).is_some_and(|n| n.weight > 0.0);
    let v = slo
        .open()
        .filter(weighted)
        .min_by_key(|v| (v.since_ns, v.id))?;
    let dimension = v
        .attribution
        .as_ref()
        .and_then(|a| a.top())
        .map(|c| c.dimension.as_str().to_owned())
        .unwrap_or_default();
    Some(OpenViolation {
        node: v.node.clone(),
        dimension,
        host: host_cause(slo, v),
        detail: v.chain.clone(),
        since_ns: v.since_ns,
        opened_ns: v.opened_ns,
    })
}

fn nodes(slo: &SloSnapshot) -> BTreeMap<String, NodeObs> {
    slo.nodes
        .iter()
        .filter_map(|n| {
            Some((
                n.name.clone(),
                NodeObs {
                    value: n.value?,
                    higher_is_better: n.objective? == Objective::Above,
                    guarded: n.weight > 0.0,
                    windows: n.windows,
                },
            ))
        })
        .collect()
}

/// The job's processes: `pid` and its descendants among the snapshot's processes.
fn job_pids(s: &Snapshot, pid: u32) -> BTreeSet<u32> {
    let mut out = BTreeSet::from([pid]);
    let Some(t) = &s.threads else {
        return out;
    };
    loop {
        let before = out.len();
        for p in &t.processes {
            if out.contains(&p.ppid) {
                out.insert(p.pid);
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

fn target(s: &Snapshot, p: &ProcessSnapshot) -> JobTarget {
    let pids = job_pids(s, p.pid);
    let threads = s
        .threads
        .as_ref()
        .map(|t| {
            t.threads
                .iter()
                .filter(|r| !r.exited && pids.contains(&r.pid))
                .map(|r| ThreadTarget {
                    pid: r.pid,
                    tid: r.tid,
                    role: r.role,
                    name: r.name.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    let cgroups = s
        .cgroups
        .iter()
        .filter(|c| c.pids.iter().any(|x| pids.contains(x)))
        .map(|c| CgroupTarget {
            path: c.path.clone(),
            version: c.version,
        })
        .collect();
    let gpu = p
        .iterations
        .iter()
        .rev()
        .find_map(|i| i.device.or(i.gpu.as_ref().map(|g| g.index)));
    let gpu_cpus = gpu
        .and_then(|g| {
            let topo = &s.gpus.as_ref()?.topology;
            topo.iter()
                .find(|t| t.index == g)
                .map(|t| t.cpu_affinity.clone())
        })
        .unwrap_or_default();
    JobTarget {
        pid: p.pid,
        start: super::knobs::start_time(p.pid).unwrap_or(0),
        pids,
        threads,
        cgroups,
        gpu,
        gpu_cpus,
    }
}

/// What the healer sees of process `p` of snapshot `s`: its recent iterations, its SLO
/// tree's values and its open violation with the cause. Pure (no `/proc`): `replay` runs a
/// shadow healer on it.
pub fn job_observation(s: &Snapshot, p: &ProcessSnapshot, extra: &HostExtra) -> JobObservation {
    let from = p.iterations.len().saturating_sub(ITERATIONS);
    let iterations: Vec<IterationSample> = p
        .iterations
        .iter()
        .skip(from)
        .map(|i| IterationSample {
            end_ns: i.end_ns,
            wall_ms: i.wall_ns() as f64 / 1e6,
        })
        .collect();
    let slo = p.slo.as_deref();
    let node = |name: &str| slo.and_then(|s| s.node(name));
    let window_ns = slo.map_or(0, |s| s.window_ns);
    let iterations_per_s = (window_ns > 0)
        .then(|| {
            let cut = s.taken_at_ns.saturating_sub(window_ns);
            let n = p.iterations.iter().filter(|i| i.end_ns > cut).count();
            n as f64 / (window_ns as f64 / 1e9)
        })
        .filter(|r| *r > 0.0);
    JobObservation {
        at_ns: s.taken_at_ns,
        iteration_p99_ms: node("iteration").and_then(|n| n.value),
        slo_p99_ms: node("iteration").and_then(|n| n.threshold.map(|t| t.0)),
        iterations_per_s,
        host_cpu_util: extra.host_cpu_util,
        gpu_util: node("compute").and_then(|n| n.value).map(|v| v / 100.0),
        sync_jitter_ms: node("communication").and_then(|n| n.value),
        gpu_util_windows: node("compute").map_or(0, |n| n.windows),
        sync_jitter_windows: node("communication").map_or(0, |n| n.windows),
        nodes: slo.map(nodes).unwrap_or_default(),
        violation: slo.and_then(violation),
        iterations,
        unavailable: BTreeMap::new(),
    }
}

/// Every job of the snapshot.
pub fn observe(s: &Snapshot, extra: &HostExtra) -> Vec<Observed> {
    s.processes
        .iter()
        .filter(|p| p.connected || !p.iterations.is_empty())
        .map(|p| Observed {
            obs: job_observation(s, p, extra),
            target: target(s, p),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_core::{
        attribution::{Attribution, HostCause as AHost},
        slo::{Metric, NodeView, Severity, Stat},
    };

    fn v(id: u64, node: &str, since: u64) -> Violation {
        Violation {
            id,
            node: node.into(),
            metric: Metric::IterationTime,
            stat: Stat::P99,
            severity: Severity::Warning,
            since_ns: since,
            opened_ns: since + 1,
            closed_ns: None,
            value: 2.0,
            threshold: 1.0,
            baseline: None,
            attribution: None,
            attributed_ns: None,
            chain: format!("{node} chain"),
        }
    }

    fn n(name: &str, weight: f64, objective: Objective, value: f64) -> NodeView {
        NodeView {
            name: name.into(),
            weight,
            objective: Some(objective),
            value: Some(value),
            state: NodeState::Ok,
            ..Default::default()
        }
    }

    fn host(name: &str, value: f64, baseline: f64, state: NodeState) -> NodeView {
        NodeView {
            baseline: Some(baseline),
            state,
            ..n(name, 0.0, Objective::Below, value)
        }
    }

    #[test]
    fn the_cause_is_throttling_else_the_largest_runqueue_growth() {
        let mut it = v(2, "iteration", 100);
        it.attribution = Some(Attribution {
            iteration_ns: (1.0, 2.0),
            causes: vec![],
            host: vec![AHost {
                what:
                    "data_loader threads waited 3 ms per iteration for a CPU (run queue; was 0 µs)"
                        .into(),
                delta: 1.0,
                node: "host.runqueue.data_loader",
            }],
            iterations: (1, 1),
            traced: (1, 1),
        });
        let breaching = NodeState::Breaching;
        let slo = SloSnapshot {
            nodes: vec![
                n("iteration", 0.4, Objective::Below, 30.0),
                n("compute", 0.35, Objective::Above, 90.0),
                // Grew by 250 ms/s but under its (noisy) threshold; communication breaches with
                // +26 ms/s: the main thread's growth is the cause.
                host("host.runqueue.main", 742.0, 492.0, NodeState::Ok),
                host("host.runqueue.communication", 40.0, 14.0, breaching),
                host("host.throttling", 0.0, 0.0, NodeState::Ok),
            ],
            violations: vec![v(1, "host.runqueue.communication", 50), it],
            ..Default::default()
        };
        let o = violation(&slo).expect("violation");
        assert_eq!(o.node, "iteration"); // host nodes have no weight: never acted on alone
        assert_eq!(o.host, HostCause::RunqueueMain);
        assert_eq!(o.since_ns, 100);
        let mut throttled = slo.clone();
        throttled.nodes[4].state = NodeState::Breaching;
        assert_eq!(
            violation(&throttled).expect("v").host,
            HostCause::Throttling
        );
        // Throttled 300 ms/s more than its baseline, its node not breaching yet: throttling
        // (ahead of the main thread's run-queue growth, which the throttling causes).
        let mut growing = slo.clone();
        growing.nodes[4].value = Some(310.0);
        growing.nodes[4].baseline = Some(10.0);
        assert_eq!(violation(&growing).expect("v").host, HostCause::Throttling);
        // 50 ms/s more: not enough on its own.
        growing.nodes[4].value = Some(60.0);
        assert_eq!(
            violation(&growing).expect("v").host,
            HostCause::RunqueueMain
        );
        // Nothing grew: the attribution's sentence.
        let mut quiet = slo.clone();
        quiet.nodes[2].value = Some(492.0);
        quiet.nodes[3].value = Some(14.0);
        assert_eq!(
            violation(&quiet).expect("v").host,
            HostCause::RunqueueDataLoader
        );
        let nodes = nodes(&slo);
        assert!(nodes["compute"].higher_is_better && nodes["compute"].guarded);
        assert!(!nodes["host.runqueue.main"].guarded);
        // Only host nodes open: nothing to act on.
        let only_host = SloSnapshot {
            violations: vec![v(1, "host.runqueue.main", 50)],
            ..slo
        };
        assert!(violation(&only_host).is_none());
    }

    #[test]
    fn host_sentences() {
        assert_eq!(
            host_text("the job's cgroup was throttled 3.00 ms per iteration (was 0 µs)"),
            Some(HostCause::Throttling)
        );
        assert_eq!(
            host_text("12 TCP retransmits on a -> b (1.0 per iteration; was 0.0)"),
            Some(HostCause::Retransmits)
        );
        assert_eq!(host_text("something else"), None);
    }
}
