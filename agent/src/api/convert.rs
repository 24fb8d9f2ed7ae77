//! The one place where the core's per-tick snapshot becomes the API's types
//! ([`super::types`]): the server, `slo-probe run`'s report and `top --replay` all convert here.
//! Pure: no I/O, so that the same snapshot always gives the same answer.

use std::collections::{BTreeMap, BTreeSet};

use slo_probe_common::ring::{
    STATUS_DIAGNOSTIC, STATUS_LOST_RACE, STATUS_RELEASED, STATUS_TRACING,
};
use slo_probe_core::{
    gpu::GpuSample,
    net::NetSnapshot,
    roles::Role,
    slo::{self as core_slo, NodeState, SloSnapshot},
    snapshot::{ProcessSnapshot, Snapshot as CoreSnapshot},
    straggler::{self, RankView},
    threads::{ThreadCounts, ThreadsSnapshot},
};

use super::types::{
    self, Agent, Cause, Cgroup, Depth, Gpu, Healer, HealerEvent, Host, IterationSource, Iterations,
    Job, Operator, Probe, Process, Rank, RoleStats, Shim, Slo, SloNode, Snapshot, Violation,
    MAX_OPERATORS, RECENT_ITERATIONS, VERSION,
};

/// What the core snapshot does not say about the agent.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The node's host name.
    pub host: String,
    /// The shims' socket, when listening.
    pub shim_socket: Option<String>,
    /// `[api] allow_writes`.
    pub writes_allowed: bool,
    /// `heal.mode` of the agent: `off`, `shadow` or `on`.
    pub heal_mode: &'static str,
}

/// The API snapshot of a core snapshot.
pub fn snapshot(s: &CoreSnapshot, ctx: &Context) -> Snapshot {
    let mut processes: Vec<Process> = s
        .processes
        .iter()
        .map(|p| process(p, s.threads.as_ref(), s.net.as_ref()))
        .collect();
    sort_processes(&mut processes);
    Snapshot {
        version: VERSION,
        node: ctx.host.clone(),
        taken_at_ns: s.taken_at_ns,
        agent: Agent {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ticks: s.agent.ticks,
            cpu_seconds: s.agent.cpu_seconds,
            resident_bytes: s.agent.resident_bytes,
            probes: s
                .probes
                .iter()
                .map(|p| Probe {
                    name: p.name.to_owned(),
                    up: p.up,
                    reason: p.reason.clone(),
                })
                .collect(),
            shim_socket: ctx.shim_socket.clone(),
            writes_allowed: ctx.writes_allowed,
        },
        jobs: jobs(&s.processes, &s.stragglers),
        processes,
        host: Host {
            roles: s
                .threads
                .as_ref()
                .map(|t| roles(t, None, s.net.as_ref()))
                .unwrap_or_default(),
            cgroups: s
                .cgroups
                .iter()
                .map(|c| Cgroup {
                    path: c.path.clone(),
                    version: c.version,
                    limit_cpus: c.limit.and_then(|l| l.cpus()),
                    nr_periods: c.cpu.map(|c| c.nr_periods),
                    nr_throttled: c.cpu.map(|c| c.nr_throttled),
                    throttled_ns: c.cpu.map(|c| c.throttled_ns),
                    roles: c.roles.iter().map(|r| r.as_str().to_owned()).collect(),
                })
                .collect(),
            outliers: s.outliers.per_process.values().sum(),
        },
        gpus: s
            .gpus
            .as_ref()
            .map(|g| g.devices.iter().map(gpu).collect())
            .unwrap_or_default(),
        healer: healer(&s.healers, ctx.heal_mode),
    }
}

/// Timeline entries the API shows (the latest, over every job).
const TIMELINE: usize = 64;

/// The healer's state and timeline from its per-job views; `None` where no healer runs.
fn healer(views: &[slo_probe_core::healer::HealerView], mode: &'static str) -> Option<Healer> {
    if views.is_empty() && mode == "off" {
        return None;
    }
    let state = if views.is_empty() {
        "watching (no job yet)".to_owned()
    } else {
        views
            .iter()
            .map(|v| match &v.in_force[..] {
                [] => format!("job {}: {}", v.job, v.phase.as_str()),
                f => format!(
                    "job {}: {} ({} in force)",
                    v.job,
                    v.phase.as_str(),
                    f.iter()
                        .map(|f| f.arm.strategy.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut events: Vec<&slo_probe_core::healer::AuditEvent> =
        views.iter().flat_map(|v| &v.timeline).collect();
    events.sort_by_key(|e| e.at_ns);
    let from = events.len().saturating_sub(TIMELINE);
    let timeline = events[from..]
        .iter()
        .map(|e| HealerEvent {
            at_ns: e.at_ns,
            id: e.action.unwrap_or(0),
            kind: e.event.name().to_owned(),
            strategy: serde_json::to_value(&e.event)
                .ok()
                .and_then(|v| v.get("strategy")?.as_str().map(str::to_owned))
                .unwrap_or_default(),
            target: format!("pid {}", e.job),
            detail: crate::healer::audit::body(e),
        })
        .collect();
    Some(Healer {
        mode: mode.to_owned(),
        state,
        timeline,
    })
}

/// The API snapshot of replayed recordings (`top --replay`, the processes of
/// `cli::replay::replay`): their processes, their job when they carry ranks, and nothing of a
/// host.
pub fn replayed(shims: &[ProcessSnapshot], host: &str) -> Snapshot {
    let mut processes: Vec<Process> = shims.iter().map(|p| process(p, None, None)).collect();
    sort_processes(&mut processes);
    Snapshot {
        version: VERSION,
        node: host.to_owned(),
        taken_at_ns: shims
            .iter()
            .flat_map(|p| p.iterations.last())
            .map(|i| i.end_ns)
            .max()
            .unwrap_or_default(),
        agent: Agent {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        },
        jobs: jobs(shims, &straggler::stragglers(shims)),
        processes,
        ..Default::default()
    }
}

fn sort_processes(p: &mut [Process]) {
    p.sort_by(|a, b| {
        (a.job_id.as_deref(), a.rank, a.pid).cmp(&(b.job_id.as_deref(), b.rank, b.pid))
    });
}

/// One training process. `threads` and `net`: the host view its roles come from.
pub fn process(
    p: &ProcessSnapshot,
    threads: Option<&ThreadsSnapshot>,
    net: Option<&NetSnapshot>,
) -> Process {
    let name = threads
        .and_then(|t| t.process(p.pid))
        .map(|r| r.name.clone())
        .unwrap_or_default();
    let host = threads
        .map(|t| roles(t, Some(&descendants(t, p.pid)), net))
        .unwrap_or_default();
    Process {
        pid: p.pid,
        name,
        rank: p.rank,
        job_id: p.job_id.clone(),
        connected: p.connected,
        shim: Shim {
            depth: if p.status & STATUS_TRACING == 0 {
                Depth::Off
            } else if p.status & STATUS_DIAGNOSTIC != 0 {
                Depth::GraphNodes
            } else {
                Depth::Kernels
            },
            cupti_version: p.cupti_version,
            lost_race: p.status & STATUS_LOST_RACE != 0,
            released: p.status & STATUS_RELEASED != 0,
            records: p.records,
            dropped: p.dropped,
            cupti_dropped: p.cupti_dropped,
            decode_failed: p.decode_failed,
        },
        iterations: iterations(p),
        slo: p.slo.as_deref().map(slo),
        violations: p
            .slo
            .as_ref()
            .map(|s| s.violations.iter().map(|v| violation(p.pid, v)).collect())
            .unwrap_or_default(),
        operators: operators(p),
        host,
    }
}

/// `pid` and every process of the table descending from it.
fn descendants(t: &ThreadsSnapshot, pid: u32) -> BTreeSet<u32> {
    let mut out = BTreeSet::from([pid]);
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

fn roles(
    t: &ThreadsSnapshot,
    pids: Option<&BTreeSet<u32>>,
    net: Option<&NetSnapshot>,
) -> Vec<RoleStats> {
    let by_role = t.by_role(pids);
    Role::ALL
        .iter()
        .filter_map(|role| {
            let c: &ThreadCounts = by_role.get(role)?;
            let threads = t
                .threads
                .iter()
                .filter(|th| th.role == *role && pids.is_none_or(|p| p.contains(&th.pid)))
                .count() as u32;
            let retransmits = net.map_or(0, |n| {
                n.retransmits
                    .iter()
                    .filter(|((pid, r), _)| r == role && pids.is_none_or(|p| p.contains(pid)))
                    .map(|(_, n)| n)
                    .sum()
            });
            Some(RoleStats {
                role: role.as_str().to_owned(),
                threads,
                runq_waits: c.runq.count,
                runq_ns: c.runq.total_ns,
                runq_p50_ns: c.runq.quantile_ns(0.5),
                runq_p99_ns: c.runq.quantile_ns(0.99),
                offcpu_voluntary_ns: c.offcpu_voluntary_ns,
                offcpu_involuntary_ns: c.offcpu_involuntary_ns,
                tcp_sent_bytes: c.tcp_sent_bytes,
                tcp_recv_bytes: c.tcp_recv_bytes,
                retransmits,
            })
        })
        .collect()
}

fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
}

fn iterations(p: &ProcessSnapshot) -> Iterations {
    let stats = p.stats.as_deref();
    let mut recent: Vec<u64> = p
        .iterations
        .iter()
        .rev()
        .take(RECENT_ITERATIONS)
        .map(|i| i.wall_ns())
        .collect();
    recent.reverse();
    Iterations {
        total: p.iterations_total,
        recent: p.iterations.len() as u64,
        source: match stats {
            None => IterationSource::None,
            Some(s) if s.marked => IterationSource::Markers,
            Some(_) => IterationSource::Detected,
        },
        before_markers: p.iterations_before_markers,
        last_step: p.iterations.last().map(|i| i.step),
        wall_p50_ns: stats.map(|s| s.wall_ns[0]),
        wall_p99_ns: stats.map(|s| s.wall_ns[1]),
        gpu_busy_p50: stats.map(|s| s.gpu_busy_ratio_p50),
        recent_wall_ns: recent,
    }
}

fn operators(p: &ProcessSnapshot) -> Vec<Operator> {
    let Some(stats) = p.stats.as_deref() else {
        return Vec::new();
    };
    let n = stats.count.max(1) as f64;
    stats
        .ops
        .iter()
        .take(MAX_OPERATORS)
        .map(|o| Operator {
            op: o.op.to_string(),
            kind: o.kind.as_str().to_owned(),
            share: o.gpu_ns as f64 / stats.ops_gpu_ns.max(1) as f64,
            gpu_ns_per_iteration: o.gpu_ns as f64 / n,
            activities_per_iteration: o.count as f64 / n,
            occupancy: o.occupancy,
        })
        .collect()
}

fn state(s: NodeState) -> types::State {
    match s {
        NodeState::Unknown => types::State::Unknown,
        NodeState::Ok => types::State::Ok,
        NodeState::Breaching => types::State::Breaching,
        NodeState::Violated(core_slo::Severity::Warning) => types::State::Warning,
        NodeState::Violated(core_slo::Severity::Critical) => types::State::Critical,
    }
}

fn slo(s: &SloSnapshot) -> Slo {
    let root = s.nodes.first();
    Slo {
        score: root.and_then(|r| r.compliance),
        state: root.map_or(types::State::Unknown, |r| state(r.state)),
        learning: s.learning,
        windows: s.windows,
        window_ns: s.window_ns,
        iterations: s.iterations,
        nodes: s
            .nodes
            .iter()
            .map(|n| SloNode {
                name: n.name.clone(),
                parent: n.parent.clone(),
                metric: n.metric.map(|m| m.as_str().to_owned()).unwrap_or_default(),
                stat: n.stat.map(|s| s.as_str().to_owned()).unwrap_or_default(),
                objective: match n.objective {
                    Some(core_slo::Objective::Below) => types::Objective::Below,
                    Some(core_slo::Objective::Above) => types::Objective::Above,
                    None => types::Objective::Unknown,
                },
                unit: n.unit.to_owned(),
                weight: n.weight,
                value: n.value,
                threshold: n.threshold.map(|t| t.0),
                threshold_source: n.threshold.map(|t| t.1.as_str().to_owned()),
                baseline: n.baseline,
                compliance: n.compliance,
                burn_rate: n.burn_rate,
                state: state(n.state),
                windows: n.windows,
                violations: n.violations,
                past_by_chance: n.past_by_chance(),
            })
            .collect(),
    }
}

fn violation(pid: u32, v: &core_slo::Violation) -> Violation {
    Violation {
        id: v.id,
        pid,
        node: v.node.clone(),
        severity: match v.severity {
            core_slo::Severity::Warning => types::Severity::Warning,
            core_slo::Severity::Critical => types::Severity::Critical,
        },
        open: v.closed_ns.is_none(),
        since_ns: v.since_ns,
        opened_ns: v.opened_ns,
        closed_ns: v.closed_ns,
        attributed_ns: v.attributed_ns,
        value: v.value,
        threshold: v.threshold,
        baseline: v.baseline,
        chain: v.chain.clone(),
        causes: v
            .attribution
            .iter()
            .flat_map(|a| &a.causes)
            .map(|c| Cause {
                op: c.op.clone(),
                dimension: c.dimension.as_str().to_owned(),
                delta_ns: c.delta_ns,
                detail: c.detail.clone(),
            })
            .collect(),
        host_causes: v
            .attribution
            .iter()
            .flat_map(|a| &a.host)
            .map(|h| h.what.clone())
            .collect(),
    }
}

/// Jobs and their ranks, with the core's straggler view and the NVRx-scale scores.
fn jobs(shims: &[ProcessSnapshot], views: &[RankView]) -> Vec<Job> {
    let mut jobs: BTreeMap<&str, Vec<Rank>> = BTreeMap::new();
    for p in shims {
        let (Some(job), Some(rank)) = (p.job_id.as_deref(), p.rank) else {
            continue;
        };
        if job.is_empty() {
            continue;
        }
        let view = views.iter().find(|v| v.pid == p.pid);
        jobs.entry(job).or_default().push(Rank {
            rank,
            pid: p.pid,
            score: p.slo.as_ref().and_then(|s| s.nodes.first()?.compliance),
            relative: None,
            individual: individual(p),
            noncomm_s: view.and_then(|v| v.noncomm_s),
            noncomm_ratio: view.and_then(|v| v.noncomm_score),
            host_delay_ms_per_s: view.and_then(|v| v.host_delay_ms_per_s),
            host_ratio: view.and_then(|v| v.host_score),
            straggler: view.and_then(|v| v.straggler.clone()),
        });
    }
    jobs.into_iter()
        .map(|(id, mut ranks)| {
            ranks.sort_by_key(|r| (r.rank, r.pid));
            // NVRx's relative score: the best rank's time over this one's.
            let best = ranks
                .iter()
                .filter_map(|r| r.noncomm_s)
                .filter(|&x| x > 0.0)
                .min_by(f64::total_cmp);
            if ranks.len() >= 2 {
                for r in &mut ranks {
                    r.relative = best.zip(r.noncomm_s).map(|(b, x)| (b / x).min(1.0));
                }
            }
            Job {
                id: id.to_owned(),
                ranks,
            }
        })
        .collect()
}

/// NVRx's individual score: the rank's best iteration (without communication) over its median.
fn individual(p: &ProcessSnapshot) -> Option<f64> {
    let mut v: Vec<u64> = p
        .iterations
        .iter()
        .map(|i| i.wall_ns().saturating_sub(i.comm_ns))
        .filter(|&x| x > 0)
        .collect();
    v.sort_unstable();
    let best = *v.first()?;
    let median = quantile(&v, 0.5)?;
    Some(best as f64 / median as f64)
}

fn gpu(d: &GpuSample) -> Gpu {
    Gpu {
        index: d.index,
        name: d.name.clone(),
        uuid: d.uuid.clone(),
        util_percent: d.gpu_util_percent,
        memory_util_percent: d.memory_util_percent,
        memory_used_bytes: d.memory_used_bytes,
        memory_total_bytes: d.memory_total_bytes,
        sm_clock_mhz: d.sm_clock_mhz,
        power_watts: d.power_watts,
        sm_active_percent: d.gpm.sm_util_percent,
        sm_occupancy_percent: d.gpm.sm_occupancy_percent,
        dram_bw_percent: d.gpm.dram_bw_util_percent,
        tensor_percent: d.gpm.any_tensor_util_percent,
        pcie_tx_bytes_per_sec: d.pcie_tx_bytes_per_sec,
        pcie_rx_bytes_per_sec: d.pcie_rx_bytes_per_sec,
        nvlink_tx_bytes_per_sec: d.nvlink_tx_bytes_per_sec,
        nvlink_rx_bytes_per_sec: d.nvlink_rx_bytes_per_sec,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use slo_probe_core::gputrace::Iteration;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/gpu")
            .join(name)
    }

    #[test]
    fn a_recording_converts_with_its_tree_and_operators() {
        let r = crate::cli::replay::replay(&fixture("h200-graphs.bin"), None, false, None)
            .expect("replays");
        let s = replayed(std::slice::from_ref(&r.process), "node");
        assert_eq!(s.version, VERSION);
        assert_eq!(s.processes.len(), 1);
        let p = &s.processes[0];
        assert_eq!(p.iterations.recent, r.process.iterations.len() as u64);
        assert!(p.iterations.wall_p50_ns <= p.iterations.wall_p99_ns);
        assert!(!p.operators.is_empty());
        let shares: f64 = p.operators.iter().map(|o| o.share).sum();
        assert!(shares <= 1.0 + 1e-9, "{shares}");
        let slo = p.slo.as_ref().expect("a tree");
        assert_eq!(slo.nodes[0].name, core_slo::ROOT);
        assert!(slo.nodes.iter().any(|n| n.threshold.is_some()));
        // The JSON reads back (floats to their last digit only with serde_json's
        // float_roundtrip, which the clients do not need).
        let text = serde_json::to_string(&s).expect("json");
        let back: Snapshot = serde_json::from_str(&text).expect("parse");
        assert_eq!(
            back.processes[0].slo.as_ref().map(|s| s.nodes.len()),
            Some(slo.nodes.len())
        );
        assert_eq!(back.processes[0].operators.len(), p.operators.len());
    }

    #[test]
    fn a_violation_says_when_it_was_attributed() {
        let mut v = core_slo::Violation {
            id: 3,
            node: "iteration".into(),
            metric: core_slo::Metric::IterationTime,
            stat: core_slo::Stat::P99,
            severity: core_slo::Severity::Warning,
            since_ns: 1_000,
            opened_ns: 2_000,
            closed_ns: None,
            value: 30.0,
            threshold: 20.0,
            baseline: Some(17.0),
            attribution: None,
            attributed_ns: None,
            chain: String::new(),
        };
        let api = violation(7, &v);
        assert_eq!((api.attributed_ns, api.open, api.pid), (None, true, 7));
        v.attributed_ns = Some(3_000);
        let text = serde_json::to_string(&violation(7, &v)).expect("json");
        let back: Violation = serde_json::from_str(&text).expect("parse");
        assert_eq!(back.attributed_ns, Some(3_000));
        // A snapshot from an agent that predates the field reads as not attributed.
        let old: Violation = serde_json::from_str(r#"{"id":1,"opened_ns":5}"#).expect("parse");
        assert_eq!((old.attributed_ns, old.opened_ns), (None, 5));
    }

    #[test]
    fn ranks_get_nvrx_scores_with_the_slowest_lowest() {
        let rank = |pid: u32, r: u32, wall_ms: u64| {
            let mut p = ProcessSnapshot {
                pid,
                rank: Some(r),
                job_id: Some("ddp".into()),
                ..Default::default()
            };
            p.set_iterations(
                (0..5)
                    .map(|k| Iteration {
                        start_ns: k * 1_000_000_000,
                        end_ns: k * 1_000_000_000 + (wall_ms + k) * 1_000_000,
                        ..Default::default()
                    })
                    .collect::<Vec<_>>()
                    .into(),
            );
            p
        };
        let ranks = [rank(10, 0, 100), rank(11, 1, 100), rank(12, 2, 200)];
        let j = jobs(&ranks, &straggler::stragglers(&ranks));
        assert_eq!(j.len(), 1);
        let r = &j[0].ranks;
        assert_eq!(r.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1, 2]);
        let rel: Vec<f64> = r.iter().map(|r| r.relative.expect("relative")).collect();
        assert!((rel[0] - 1.0).abs() < 1e-9, "{rel:?}");
        assert!((0.45..0.55).contains(&rel[2]), "{rel:?}");
        for r in r {
            let i = r.individual.expect("individual");
            assert!((0.9..=1.0).contains(&i), "{i}");
        }
        assert!(r[2].straggler.is_some(), "{r:?}");
    }
}
