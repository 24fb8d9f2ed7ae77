//! The training processes' families: each CUPTI shim's state, records and drops, iterations and
//! their statistics (computed once per tick in the snapshot); the node's straggler view.

use slo_probe_common::ring::{
    STATUS_CONNECTED, STATUS_DIAGNOSTIC, STATUS_LOST_RACE, STATUS_TRACING,
};
use slo_probe_core::{gputrace::PHASES, snapshot::ProcessSnapshot, straggler::RankView};

use super::{Family, Kind, ProcLabels, Sink};

static SHIM_STATE: Family = Family {
    name: "slo_probe_shim_state",
    kind: Kind::Gauge,
    help: "State of a training process's CUPTI shim: connected, tracing, lost_race (another \
           CUPTI subscriber was first), diagnostic (node-level graph tracing).",
    unit: "",
};
static SHIM_RECORDS: Family = Family {
    name: "slo_probe_shim_records_total",
    kind: Kind::Counter,
    help: "GPU records consumed from a shim, by kind.",
    unit: "",
};
static SHIM_DROPPED: Family = Family {
    name: "slo_probe_shim_dropped_records_total",
    kind: Kind::Counter,
    help: "GPU records lost: ring_full (the shim dropped rather than block the job), cupti \
           (CUPTI's own buffers overflowed), strings_full (kernel or operator names beyond the \
           agent's 65536 per process; their kernels are counted unnamed), tables_full (records \
           beyond the assembler's caps on pending activities, open steps, graphs and names).",
    unit: "",
};
static SHIM_OPS_OVERFLOWED: Family = Family {
    name: "slo_probe_shim_operators_overflowed_total",
    kind: Kind::Counter,
    help: "GPU activities counted under the operator \"(other operators)\" because the process \
           had 4096 distinct operators already (the agent's memory stays bounded).",
    unit: "",
};
static SHIM_CORRUPT: Family = Family {
    name: "slo_probe_shim_corrupt_bytes_total",
    kind: Kind::Counter,
    help: "Bytes of a shim's ring that the agent skipped as corrupt (a bad record length, or a \
           producer further ahead than the ring holds).",
    unit: "By",
};
static SHIM_REFUSED: Family = Family {
    name: "slo_probe_shim_refused_total",
    kind: Kind::Counter,
    help: "Shim connections the agent refused, by reason: uid (not allowed), timeout (no hello \
           in time), pending_cap (too many handshakes of one uid), process_cap, fd_limit, \
           hello, fds (not exactly one descriptor), pid, ring_size, unsealed (the ring is not a \
           sealed memfd), map, io, peer_cred.",
    unit: "",
};
static SHIM_DEPTH: Family = Family {
    name: "slo_probe_shim_depth",
    kind: Kind::Gauge,
    help: "Tracing depth of a training process's shim: 0 timing (markers, graph launches, copies; \
           kernels only in duty-cycled sample windows), 1 every kernel, 2 graph nodes too, -1 off \
           (CUPTI handed over or lost); `wanted` is what the SLO engine asks for (raised while an \
           iteration node breaches, until attribution has what it needs).",
    unit: "",
};
static SHIM_SAMPLE_PERIOD: Family = Family {
    name: "slo_probe_shim_sample_period",
    kind: Kind::Gauge,
    help: "The shim's duty cycle at depth 0: one sample window of `window` every `period` (unit: \
           steps, or ms for a process without step markers); 0: no sampling (kernel tracing \
           held on under a deep GPU queue or CUDA graphs, or a fixed depth).",
    unit: "",
};
static SHIM_OVERHEAD: Family = Family {
    name: "slo_probe_shim_overhead_ratio",
    kind: Kind::Gauge,
    help: "The shim's own cost on the training process's launching threads (its callbacks, plus \
           the estimated CUPTI cost of each kernel record) as a share of its step time, since it \
           registered.",
    unit: "1",
};
static ITERATIONS: Family = Family {
    name: "slo_probe_iterations_total",
    kind: Kind::Counter,
    help: "Training iterations completed (from step markers, or detected).",
    unit: "",
};
static ITERATION_DURATION: Family = Family {
    name: "slo_probe_iteration_duration_seconds",
    kind: Kind::Gauge,
    help: "Iteration wall time over the agent's recent window (the last 512 iterations), by \
           quantile.",
    unit: "s",
};
static GPU_BUSY: Family = Family {
    name: "slo_probe_iteration_gpu_busy_ratio",
    kind: Kind::Gauge,
    help: "Share of an iteration's wall time with the GPU busy: the median over the recent \
           window.",
    unit: "1",
};
static ITERATION_PHASE: Family = Family {
    name: "slo_probe_iteration_phase_seconds",
    kind: Kind::Gauge,
    help: "Time per iteration by phase over the recent window, by quantile: GPU compute, \
           communication (NCCL kernels) and memory operations, host_wait (GPU idle before the \
           iteration's first activity: data loading, the host) and launch_gaps (GPU idle \
           between activities), comm_overlap (communication kernels running while compute \
           ran: the gradient sync hidden behind backward). In synchronous data parallel \
           training the straggler rank has the least communication: the others wait for it \
           inside the all-reduce.",
    unit: "s",
};
static LAUNCH_LATENCY: Family = Family {
    name: "slo_probe_gpu_launch_latency_seconds",
    kind: Kind::Gauge,
    help: "Launch latency (API entry to GPU start) over the recent window, by quantile.",
    unit: "s",
};

/// The quantiles of [`slo_probe_core::snapshot::Quantiles`], as `quantile` label values.
const QUANTILES: [&str; 2] = ["0.5", "0.99"];

pub(super) fn shims(sink: &mut impl Sink, shims: &[ProcessSnapshot]) {
    let labels: Vec<ProcLabels<'_>> = shims.iter().map(ProcLabels::of).collect();
    let procs = || shims.iter().zip(&labels);
    sink.family(&SHIM_STATE);
    for (p, l) in procs() {
        let [pid, rank, job] = l.get();
        for (state, on) in [
            ("connected", p.connected || p.status & STATUS_CONNECTED != 0),
            ("tracing", p.status & STATUS_TRACING != 0),
            ("lost_race", p.status & STATUS_LOST_RACE != 0),
            ("diagnostic", p.status & STATUS_DIAGNOSTIC != 0),
        ] {
            sink.sample(
                &SHIM_STATE,
                &[pid, rank, job, ("state", state)],
                f64::from(u8::from(on)),
            );
        }
    }
    sink.family(&SHIM_RECORDS);
    for (p, l) in procs() {
        let [pid, rank, job] = l.get();
        for (kind, n) in [
            ("kernel", p.seen[0]),
            ("graph", p.seen[1]),
            ("memory", p.seen[2]),
            ("graph_node", p.seen[3]),
            ("string", p.seen[4]),
            ("step", p.seen[5]),
        ] {
            sink.sample(&SHIM_RECORDS, &[pid, rank, job, ("kind", kind)], n as f64);
        }
    }
    sink.family(&SHIM_DROPPED);
    for (p, l) in procs() {
        let [pid, rank, job] = l.get();
        for (reason, n) in [
            ("ring_full", p.dropped),
            ("cupti", p.cupti_dropped),
            ("strings_full", p.strings_dropped),
            ("tables_full", p.capped),
        ] {
            sink.sample(
                &SHIM_DROPPED,
                &[pid, rank, job, ("reason", reason)],
                n as f64,
            );
        }
    }
    sink.family(&SHIM_OPS_OVERFLOWED);
    for (p, l) in procs() {
        sink.sample(&SHIM_OPS_OVERFLOWED, &l.get(), p.ops_overflowed as f64);
    }
    sink.family(&SHIM_CORRUPT);
    for (p, l) in procs() {
        sink.sample(&SHIM_CORRUPT, &l.get(), p.corrupt_bytes as f64);
    }
    sink.family(&SHIM_DEPTH);
    for (p, l) in procs() {
        let [pid, rank, job] = l.get();
        if let Some(d) = p.depth {
            let depth = if d.depth == slo_probe_common::gpu::DEPTH_OFF {
                -1.0
            } else {
                f64::from(d.depth)
            };
            sink.sample(&SHIM_DEPTH, &[pid, rank, job, ("which", "current")], depth);
        }
        sink.sample(
            &SHIM_DEPTH,
            &[pid, rank, job, ("which", "wanted")],
            f64::from(p.depth_wanted),
        );
    }
    sink.family(&SHIM_SAMPLE_PERIOD);
    for (p, l) in procs() {
        let [pid, rank, job] = l.get();
        if let Some(d) = p.depth {
            let unit = if d.millis { "ms" } else { "steps" };
            for (which, v) in [("period", d.period), ("window", d.window)] {
                sink.sample(
                    &SHIM_SAMPLE_PERIOD,
                    &[pid, rank, job, ("which", which), ("unit", unit)],
                    f64::from(v),
                );
            }
        }
    }
    sink.family(&SHIM_OVERHEAD);
    for (p, l) in procs() {
        sink.sample(&SHIM_OVERHEAD, &l.get(), p.shim_overhead_ratio());
    }
    sink.family(&ITERATIONS);
    for (p, l) in procs() {
        sink.sample(&ITERATIONS, &l.get(), p.iterations_total as f64);
    }
    // Declared together, sampled per process.
    sink.family(&ITERATION_DURATION);
    sink.family(&GPU_BUSY);
    sink.family(&ITERATION_PHASE);
    sink.family(&LAUNCH_LATENCY);
    let secs = |ns: u64| ns as f64 / 1e9;
    for (p, l) in procs() {
        let Some(st) = &p.stats else { continue };
        let [pid, rank, job] = l.get();
        for (k, quantile) in QUANTILES.into_iter().enumerate() {
            sink.sample(
                &ITERATION_DURATION,
                &[pid, rank, job, ("quantile", quantile)],
                secs(st.wall_ns[k]),
            );
            if let Some(lat) = st.launch_latency_ns {
                sink.sample(
                    &LAUNCH_LATENCY,
                    &[pid, rank, job, ("quantile", quantile)],
                    secs(lat[k]),
                );
            }
        }
        for ((phase, _), q) in PHASES.iter().zip(&st.phases) {
            for (k, quantile) in QUANTILES.into_iter().enumerate() {
                sink.sample(
                    &ITERATION_PHASE,
                    &[pid, rank, job, ("phase", phase), ("quantile", quantile)],
                    secs(q[k]),
                );
            }
        }
        sink.sample(&GPU_BUSY, &[pid, rank, job], st.gpu_busy_ratio_p50);
    }
}

/// The node's refused shim connections, by reason.
pub(super) fn refused(sink: &mut impl Sink, refused: &[(&'static str, u64)]) {
    sink.family(&SHIM_REFUSED);
    for (reason, n) in refused {
        sink.sample(&SHIM_REFUSED, &[("reason", reason)], *n as f64);
    }
}

static STRAGGLER_SCORE: Family = Family {
    name: "slo_probe_straggler_score",
    kind: Kind::Gauge,
    help: "A rank against the median of its job's other ranks on this node: signal noncomm \
           (median iteration minus its communication kernels; the straggler waits least in the \
           all-reduce) or host_delay (run-queue delay of its main, loader and communication \
           threads plus cgroup throttling, ms/s, floor 1 ms/s).",
    unit: "",
};
static STRAGGLER: Family = Family {
    name: "slo_probe_straggler",
    kind: Kind::Gauge,
    help: "1 for the rank named the straggler of its job on this node, with its cause: an SLO \
           host node (host.runqueue.main, ...) or a GPU phase (compute, memory, host_wait, \
           launch_gaps).",
    unit: "",
};

/// The node's straggler view: jobs with two or more ranks here.
pub(super) fn stragglers(sink: &mut impl Sink, views: &[RankView]) {
    let ids: Vec<(String, String)> = views
        .iter()
        .map(|v| (v.pid.to_string(), v.rank.to_string()))
        .collect();
    sink.family(&STRAGGLER_SCORE);
    for (v, (pid, rank)) in views.iter().zip(&ids) {
        for (signal, score) in [("noncomm", v.noncomm_score), ("host_delay", v.host_score)] {
            if let Some(s) = score {
                sink.sample(
                    &STRAGGLER_SCORE,
                    &[
                        ("pid", pid),
                        ("rank", rank),
                        ("job_id", &v.job_id),
                        ("signal", signal),
                    ],
                    s,
                );
            }
        }
    }
    sink.family(&STRAGGLER);
    for (v, (pid, rank)) in views.iter().zip(&ids) {
        if let Some(cause) = &v.straggler {
            sink.sample(
                &STRAGGLER,
                &[
                    ("pid", pid),
                    ("rank", rank),
                    ("job_id", &v.job_id),
                    ("cause", cause),
                ],
                1.0,
            );
        }
    }
}
