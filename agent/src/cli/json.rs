//! `--json` of `observe` and `replay`: per training process its shim's counters, every
//! iteration and the SLO tree; per role what the host did.

use slo_probe_core::snapshot::ProcessSnapshot;

use super::observe::Observation;
use crate::healer::shadow::Decided;

/// One process's shim counters and iterations as JSON.
pub fn shim_json(p: &ProcessSnapshot) -> serde_json::Value {
    use serde_json::json;
    json!({
        "pid": p.pid,
        "connected": p.connected,
        "status": p.status,
        "cupti_version": p.cupti_version,
        "records": p.records,
        "dropped": p.dropped,
        "cupti_dropped": p.cupti_dropped,
        "corrupt_bytes": p.corrupt_bytes,
        "decode_failed": p.decode_failed,
        "late": p.late,
        "seen": {
            "kernels": p.seen[0], "graphs": p.seen[1], "memory": p.seen[2],
            "graph_nodes": p.seen[3], "strings": p.seen[4], "steps": p.seen[5],
        },
        "slo": p.slo.as_deref().map(slo_json),
        "depth": p.depth.map(|d| json!({
            "depth": d.depth, "reason": d.reason, "window": d.window, "period": d.period,
            "millis": d.millis,
        })),
        "depth_wanted": p.depth_wanted,
        "shim_overhead_ratio": p.shim_overhead_ratio(),
        "graph_ops": p.graph_ops.iter().map(|(g, ops)| (g.to_string(), json!(ops)))
            .collect::<serde_json::Map<_, _>>(),
        "iterations": p.iterations.iter().map(|i| json!({
            "step": i.step,
            "marked": i.marked,
            "start_ns": i.start_ns,
            "end_ns": i.end_ns,
            "wall_ns": i.wall_ns(),
            "step_ns": i.step_ns(),
            "gpu_period_ns": i.gpu_period_ns,
            "wait_ns": i.wait_ns,
            "gpu_busy_ns": i.gpu_busy_ns,
            "gpu_span_ns": i.gpu_span_ns(),
            "kernels": i.kernels,
            "traced": i.traced,
            "graph_launches": i.graph_launches,
            "memory_ops": i.memory_ops,
            "idle_before_first_ns": i.idle_before_first_ns,
            "occupancy": i.occupancy,
            "launch_latency_p50_ns": i.launch_latency_ns(0.5),
            "launch_latency_p99_ns": i.launch_latency_ns(0.99),
            "ops": i.ops.iter().take(20).map(|o| json!({
                "op": &*o.op, "kind": o.kind.as_str(), "gpu_ns": o.gpu_ns,
                "kernels": o.kernels, "occupancy": o.occupancy, "gap_ns": o.gap_ns,
                "launch_latency_ns": o.launch_latency_ns, "bytes": o.bytes,
                "critical_ns": o.critical_ns, "wait_ns": o.wait_ns,
            })).collect::<Vec<_>>(),
            "device": i.device,
            "gpu": i.gpu.as_ref().map(iteration_gpu_json),
        })).collect::<Vec<_>>(),
    })
}

/// The SLO tree and violations as JSON.
pub fn slo_json(s: &slo_probe_core::slo::SloSnapshot) -> serde_json::Value {
    use serde_json::json;
    let nodes: Vec<_> = s
        .nodes
        .iter()
        .map(|n| {
            json!({
                "name": n.name,
                "parent": n.parent,
                "metric": n.metric.map(|m| m.as_str()),
                "stat": n.stat.map(|m| m.as_str()),
                "unit": n.unit,
                "weight": n.weight,
                "value": n.value,
                "threshold": n.threshold.map(|t| t.0),
                "threshold_source": n.threshold.map(|t| t.1.as_str()),
                "baseline": n.baseline,
                "compliance": n.compliance,
                "burn_rate": n.burn_rate,
                "state": n.state.as_str(),
                "windows": n.windows,
                "violations": n.violations,
            })
        })
        .collect();
    let violations: Vec<_> = s.violations.iter().map(violation_json).collect();
    json!({
        "windows": s.windows,
        "window_ns": s.window_ns,
        "iterations": s.iterations,
        "learning": s.learning,
        "nodes": nodes,
        "violations": violations,
    })
}

fn violation_json(v: &slo_probe_core::slo::Violation) -> serde_json::Value {
    use serde_json::json;
    let causes = v.attribution.as_ref().map(|a| {
        a.causes
            .iter()
            .map(|c| {
                json!({
                    "op": c.op,
                    "dimension": c.dimension.as_str(),
                    "delta_ns": c.delta_ns,
                    "detail": c.detail,
                })
            })
            .collect::<Vec<_>>()
    });
    let host = v
        .attribution
        .as_ref()
        .map(|a| a.host.iter().map(|h| h.what.clone()).collect::<Vec<_>>());
    // What the causes were measured over: the healthy windows' and the breaching windows' mean
    // iteration time, and how many iterations (traced ones) each side had.
    let compared = v.attribution.as_ref().map(|a| {
        json!({
            "iteration_ns": [a.iteration_ns.0, a.iteration_ns.1],
            "iterations": [a.iterations.0, a.iterations.1],
            "traced": [a.traced.0, a.traced.1],
        })
    });
    json!({
        "id": v.id,
        "node": v.node,
        "severity": v.severity.as_str(),
        "since_ns": v.since_ns,
        "opened_ns": v.opened_ns,
        "attributed_ns": v.attributed_ns,
        "closed_ns": v.closed_ns,
        "value": v.value,
        "threshold": v.threshold,
        "baseline": v.baseline,
        "chain": v.chain,
        "causes": causes,
        "host_causes": host,
        "compared": compared,
    })
}

fn iteration_gpu_json(g: &slo_probe_core::gpu::IterationGpu) -> serde_json::Value {
    serde_json::json!({
        "nvml_index": g.index,
        "samples": g.samples,
        "covered_ns": g.covered_ns,
        "gpu_util_percent": g.gpu_util_percent,
        "sm_clock_mhz": g.sm_clock_mhz,
        "memory_clock_mhz": g.memory_clock_mhz,
        "power_watts": g.power_watts,
        "memory_used_bytes": g.memory_used_bytes,
        "sm_occupancy_percent": g.sm_occupancy_percent,
        "sm_util_percent": g.sm_util_percent,
        "dram_bw_util_percent": g.dram_bw_util_percent,
        "tensor_util_percent": g.tensor_util_percent,
        "pcie_bytes_per_sec": g.pcie_bytes_per_sec,
        "nvlink_bytes_per_sec": g.nvlink_bytes_per_sec,
    })
}

/// The observation as JSON (for scripts): per process of the job, the shim's counters and every
/// iteration, and the host view by role.
pub fn json(obs: &Observation, command: &str) -> serde_json::Value {
    use serde_json::json;
    let s = &obs.snapshot;
    let shims: Vec<_> = s
        .processes
        .iter()
        .filter(|p| obs.pids.contains(&p.pid))
        .map(|p| process_json(p, obs.healers.get(&p.pid)))
        .collect();
    let roles: serde_json::Map<String, serde_json::Value> = s
        .threads
        .as_ref()
        .map(|t| {
            t.by_role(Some(&obs.pids))
                .into_iter()
                .map(|(r, c)| {
                    (
                        r.as_str().to_owned(),
                        json!({
                            "runq_waits": c.runq.count,
                            "runq_ns": c.runq.total_ns,
                            "offcpu_voluntary_ns": c.offcpu_voluntary_ns,
                            "offcpu_involuntary_ns": c.offcpu_involuntary_ns,
                            "tcp_sent_bytes": c.tcp_sent_bytes,
                            "tcp_recv_bytes": c.tcp_recv_bytes,
                        }),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "command": command,
        "elapsed_s": obs.elapsed.as_secs_f64(),
        "exit_code": obs.exit.and_then(|e| e.code()),
        "pids": obs.pids.iter().collect::<Vec<_>>(),
        "roles": roles,
        "gpu": shims,
    })
}

/// A process as [`shim_json`] has it, with what its shadow healer decided (`"healer"`) when
/// one ran.
pub fn process_json(p: &ProcessSnapshot, healer: Option<&Decided>) -> serde_json::Value {
    let mut j = shim_json(p);
    if let (Some(h), Some(m)) = (healer, j.as_object_mut()) {
        m.insert("healer".into(), shadow_healer_json(h));
    }
    j
}

/// A shadow healer (`replay`, `observe`): how many actions it would have taken, and its audit
/// events.
fn shadow_healer_json(h: &Decided) -> serde_json::Value {
    serde_json::json!({
        "mode": "shadow",
        "actions": h.actions,
        "events": h.events.iter().map(|e| serde_json::json!({
            "at_ns": e.at_ns,
            "action": e.action,
            "event": e.event.name(),
            "detail": crate::healer::audit::body(e),
        })).collect::<Vec<_>>(),
    })
}
