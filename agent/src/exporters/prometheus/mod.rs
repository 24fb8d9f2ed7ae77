//! Prometheus text exposition (format 0.0.4) of the latest snapshot, served over HTTP on
//! loopback by default.
//!
//! Label cardinality: (process, role) series are at most five per live (or recently exited)
//! process of the job; thread series one per thread, switched off with
//! `prometheus.per_thread = false`; connection series at most `prometheus.max_connections`;
//! cgroup series one per cgroup holding a job process. Histogram buckets are the kernel's log2
//! slots from 1.024 µs to 17.2 s (25 buckets + `+Inf`).

pub mod gpu;
pub mod slo;

use std::{convert::Infallible, fmt::Write as _, net::SocketAddr, sync::Arc};

use http_body_util::{BodyExt as _, Full};
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Method, Request, Response};
use hyper_util::rt::TokioIo;
use slo_probe_common::Counter;
use slo_probe_core::{
    cgroup::{CgroupRow, CpuStat},
    net::{endpoints, ConnRow, NetSnapshot},
    snapshot::ProcessSnapshot,
    snapshot::Snapshot,
    straggler::RankView,
    threads::{RunqCounts, ThreadCounts, ThreadsSnapshot},
};
use tokio::{net::TcpListener, sync::watch};

/// First exported slot: bucket `le = 2^10 ns` (1.024 µs) holds every shorter wait too.
const FIRST_SLOT: usize = 9;
/// Last exported finite slot: `le = 2^34 ns` (17.2 s).
const LAST_SLOT: usize = 33;

/// Content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Errors of the Prometheus endpoint.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The listen address could not be bound.
    #[error(
        "cannot listen on {addr} for Prometheus metrics: {source}; choose another address with \
         --listen or prometheus.listen in the config"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Escapes a label value (backslash, double quote, newline).
pub(crate) fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Writes a family's `# HELP` and `# TYPE` lines.
pub(crate) fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, labels: &str, c: &RunqCounts) {
    for slot in FIRST_SLOT..=LAST_SLOT {
        let le = (1u64 << (slot + 1)) as f64 / 1e9;
        let n = c.cumulative_below_slot_end(slot);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", c.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", c.total_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", c.count);
}

/// Renders a snapshot in the text exposition format.
pub fn render(snapshot: &Snapshot, per_thread: bool) -> String {
    let mut out = String::with_capacity(16 * 1024);
    header(
        &mut out,
        "slo_probe_build_info",
        "gauge",
        "slo-probe build; always 1.",
    );
    let _ = writeln!(
        out,
        "slo_probe_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );

    header(
        &mut out,
        "slo_probe_probe_up",
        "gauge",
        "Whether a probe family is attached and reporting (1) or down (0; see the reason label).",
    );
    for p in &snapshot.probes {
        let _ = writeln!(
            out,
            "slo_probe_probe_up{{probe=\"{}\",reason=\"{}\"}} {}",
            p.name,
            escape(&p.reason),
            u8::from(p.up)
        );
    }

    if let Some(t) = &snapshot.threads {
        render_threads(&mut out, t, snapshot, per_thread);
    }
    if let Some(net) = &snapshot.net {
        render_net(&mut out, net, snapshot.threads.as_ref());
    }
    render_cgroups(&mut out, snapshot);
    render_shims(&mut out, snapshot);
    render_stragglers(&mut out, &snapshot.stragglers);
    slo::render_slo(&mut out, &snapshot.processes);
    if let Some(g) = &snapshot.gpus {
        gpu::render_gpus(&mut out, g);
    }

    header(
        &mut out,
        "slo_probe_ebpf_events_dropped_total",
        "counter",
        "Events the probes dropped instead of blocking, by reason.",
    );
    for c in Counter::ALL.into_iter().filter(|c| c.is_drop()) {
        let _ = writeln!(
            out,
            "slo_probe_ebpf_events_dropped_total{{reason=\"{}\"}} {}",
            c.name(),
            snapshot.counters[c as usize]
        );
    }
    header(
        &mut out,
        "slo_probe_ebpf_errors_total",
        "counter",
        "Errors while collecting, by reason.",
    );
    for c in [Counter::ProbeReadFailed, Counter::DecodeFailed] {
        let _ = writeln!(
            out,
            "slo_probe_ebpf_errors_total{{reason=\"{}\"}} {}",
            c.name(),
            snapshot.counters[c as usize]
        );
    }
    header(
        &mut out,
        "slo_probe_ebpf_records_total",
        "counter",
        "Records the probes sent to the agent, by kind.",
    );
    let _ = writeln!(
        out,
        "slo_probe_ebpf_records_total{{kind=\"runq_outlier\"}} {}",
        snapshot.counters[Counter::OutliersSent as usize]
    );

    header(
        &mut out,
        "slo_probe_agent_cpu_seconds_total",
        "counter",
        "CPU time the agent itself used.",
    );
    let _ = writeln!(
        out,
        "slo_probe_agent_cpu_seconds_total {}",
        snapshot.agent.cpu_seconds
    );
    header(
        &mut out,
        "slo_probe_agent_resident_memory_bytes",
        "gauge",
        "Resident memory of the agent.",
    );
    let _ = writeln!(
        out,
        "slo_probe_agent_resident_memory_bytes {}",
        snapshot.agent.resident_bytes
    );
    header(
        &mut out,
        "slo_probe_agent_ticks_total",
        "counter",
        "Collection ticks since the agent started.",
    );
    let _ = writeln!(out, "slo_probe_agent_ticks_total {}", snapshot.agent.ticks);
    out
}

/// A value of a family: its `kind` label (empty: none) and how to read it.
type KindValue<T> = (&'static str, fn(&T) -> f64);
/// A family: name, type, help and how to read its value.
type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> f64);

/// One counter family over the (process, role) groups.
fn group_counter(
    out: &mut String,
    t: &ThreadsSnapshot,
    name: &str,
    help: &str,
    values: &[KindValue<ThreadCounts>],
) {
    header(out, name, "counter", help);
    for g in &t.groups {
        for (kind, value) in values {
            let kind_label = if kind.is_empty() {
                String::new()
            } else {
                format!(",kind=\"{kind}\"")
            };
            let _ = writeln!(
                out,
                "{name}{{pid=\"{}\",process=\"{}\",role=\"{}\"{kind_label}}} {}",
                g.pid,
                escape(&g.process),
                g.role,
                value(&g.counts)
            );
        }
    }
}

fn render_threads(out: &mut String, t: &ThreadsSnapshot, snapshot: &Snapshot, per_thread: bool) {
    let process_name = |pid: u32| t.process(pid).map_or("", |p| p.name.as_str());
    let name = "slo_probe_runqueue_latency_seconds";
    header(
        out,
        name,
        "histogram",
        "Time threads spent runnable, waiting for a CPU, per wait; by process and thread role.",
    );
    for g in &t.groups {
        let labels = format!(
            "pid=\"{}\",process=\"{}\",role=\"{}\"",
            g.pid,
            escape(&g.process),
            g.role
        );
        histogram(out, name, &labels, &g.counts.runq);
    }
    group_counter(
        out,
        t,
        "slo_probe_runqueue_preempted_waits_total",
        "Run-queue waits that began with an involuntary preemption (the rest began with a wakeup).",
        &[("", |c| c.runq.preempted as f64)],
    );
    group_counter(
        out,
        t,
        "slo_probe_offcpu_seconds_total",
        "Time threads spent off CPU, from switch-out to switch-in: voluntary (blocked or \
         sleeping, including the wait after the wakeup) or involuntary (preempted).",
        &[
            ("voluntary", |c| c.offcpu_voluntary_ns as f64 / 1e9),
            ("involuntary", |c| c.offcpu_involuntary_ns as f64 / 1e9),
        ],
    );
    group_counter(
        out,
        t,
        "slo_probe_context_switches_total",
        "Context switches away from threads: voluntary or involuntary (preemptions).",
        &[
            ("voluntary", |c| c.switches_voluntary as f64),
            ("involuntary", |c| c.switches_involuntary as f64),
        ],
    );
    group_counter(
        out,
        t,
        "slo_probe_tcp_sent_bytes_total",
        "TCP payload bytes sent by threads.",
        &[("", |c| c.tcp_sent_bytes as f64)],
    );
    group_counter(
        out,
        t,
        "slo_probe_tcp_received_bytes_total",
        "TCP payload bytes received by threads.",
        &[("", |c| c.tcp_recv_bytes as f64)],
    );
    if per_thread {
        let name = "slo_probe_thread_runqueue_latency_seconds";
        header(
            out,
            name,
            "histogram",
            "Time a thread spent runnable, waiting for a CPU, per wait.",
        );
        for th in &t.threads {
            let labels = format!(
                "pid=\"{}\",process=\"{}\",tid=\"{}\",thread=\"{}\",role=\"{}\"",
                th.pid,
                escape(process_name(th.pid)),
                th.tid,
                escape(&th.name),
                th.role
            );
            histogram(out, name, &labels, &th.counts.runq);
        }
        let name = "slo_probe_thread_offcpu_seconds_total";
        header(
            out,
            name,
            "counter",
            "Time a thread spent off CPU, by kind.",
        );
        for th in &t.threads {
            for (kind, ns) in [
                ("voluntary", th.counts.offcpu_voluntary_ns),
                ("involuntary", th.counts.offcpu_involuntary_ns),
            ] {
                let _ = writeln!(
                    out,
                    "{name}{{pid=\"{}\",process=\"{}\",tid=\"{}\",thread=\"{}\",role=\"{}\",\
                     kind=\"{kind}\"}} {}",
                    th.pid,
                    escape(process_name(th.pid)),
                    th.tid,
                    escape(&th.name),
                    th.role,
                    ns as f64 / 1e9
                );
            }
        }
    }
    let name = "slo_probe_runqueue_outliers_total";
    header(
        out,
        name,
        "counter",
        "Run-queue waits at or above the outlier threshold, per process.",
    );
    for (pid, n) in &snapshot.outliers.per_process {
        let _ = writeln!(
            out,
            "{name}{{pid=\"{pid}\",process=\"{}\"}} {n}",
            escape(process_name(*pid))
        );
    }
}

fn render_net(out: &mut String, net: &NetSnapshot, threads: Option<&ThreadsSnapshot>) {
    let process_name = |pid: u32| {
        threads
            .and_then(|t| t.process(pid))
            .map_or("", |p| p.name.as_str())
    };
    let name = "slo_probe_tcp_retransmits_total";
    header(
        out,
        name,
        "counter",
        "Retransmitted TCP segments of the connections a process's threads own, by role \
         (pid 0: owner unknown).",
    );
    for ((pid, role), n) in &net.retransmits {
        let _ = writeln!(
            out,
            "{name}{{pid=\"{pid}\",process=\"{}\",role=\"{role}\"}} {n}",
            escape(process_name(*pid))
        );
    }
    let families: [Family<ConnRow>; 3] = [
        (
            "slo_probe_tcp_connection_retransmits_total",
            "counter",
            "Retransmitted segments of one connection.",
            |c| c.retransmits as f64,
        ),
        (
            "slo_probe_tcp_connection_srtt_seconds",
            "gauge",
            "Smoothed round-trip time of one connection at the last sample.",
            |c| f64::from(c.srtt_us) / 1e6,
        ),
        (
            "slo_probe_tcp_connection_cwnd_segments",
            "gauge",
            "Congestion window of one connection at the last sample.",
            |c| f64::from(c.snd_cwnd),
        ),
    ];
    for (name, kind, help, value) in families {
        header(out, name, kind, help);
        for c in &net.conns {
            let (local, remote) = endpoints(&c.tuple);
            let _ = writeln!(
                out,
                "{name}{{pid=\"{}\",process=\"{}\",role=\"{}\",local=\"{local}\",\
                 remote=\"{remote}\"}} {}",
                c.pid,
                escape(&c.process),
                c.role,
                value(c)
            );
        }
    }
    header(
        out,
        "slo_probe_tcp_connections_unlisted",
        "gauge",
        "Connections followed but not exported one by one (over prometheus.max_connections).",
    );
    let _ = writeln!(out, "slo_probe_tcp_connections_unlisted {}", net.unlisted);
}

fn render_cgroups(out: &mut String, snapshot: &Snapshot) {
    let labels = |c: &CgroupRow| {
        let roles: Vec<&str> = c.roles.iter().map(|r| r.as_str()).collect();
        format!(
            "cgroup=\"{}\",version=\"{}\",roles=\"{}\"",
            escape(&c.path),
            c.version,
            roles.join(",")
        )
    };
    let with_cpu: Vec<_> = snapshot
        .cgroups
        .iter()
        .filter_map(|c| Some((c, c.cpu?)))
        .collect();
    let families: [Family<CpuStat>; 3] = [
        (
            "slo_probe_cgroup_cpu_periods_total",
            "counter",
            "CFS bandwidth periods elapsed in a cgroup of the job.",
            |s| s.nr_periods as f64,
        ),
        (
            "slo_probe_cgroup_cpu_throttled_periods_total",
            "counter",
            "Periods in which a cgroup of the job was throttled.",
            |s| s.nr_throttled as f64,
        ),
        (
            "slo_probe_cgroup_cpu_throttled_seconds_total",
            "counter",
            "Time a cgroup of the job was throttled.",
            |s| s.throttled_ns as f64 / 1e9,
        ),
    ];
    for (name, kind, help, value) in families {
        header(out, name, kind, help);
        for (c, s) in &with_cpu {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(c), value(s));
        }
    }
    header(
        out,
        "slo_probe_cgroup_cpu_limit_cpus",
        "gauge",
        "CPU limit of a cgroup of the job (quota / period), where one is set.",
    );
    for c in &snapshot.cgroups {
        if let Some(cpus) = c.limit.and_then(|l| l.cpus()) {
            let _ = writeln!(
                out,
                "slo_probe_cgroup_cpu_limit_cpus{{{}}} {cpus}",
                labels(c)
            );
        }
    }
    header(
        out,
        "slo_probe_cgroup_cpu_pressure_stalled_seconds_total",
        "counter",
        "CPU pressure stall time of a cgroup of the job (cgroup v2 with PSI).",
    );
    for c in &snapshot.cgroups {
        if let Some(p) = c.pressure {
            for (kind, us) in [("some", p.some_us), ("full", p.full_us)] {
                let _ = writeln!(
                    out,
                    "slo_probe_cgroup_cpu_pressure_stalled_seconds_total{{{},kind=\"{kind}\"}} {}",
                    labels(c),
                    us as f64 / 1e6
                );
            }
        }
    }
    header(
        out,
        "slo_probe_pressure_stalled_seconds_total",
        "counter",
        "System-wide pressure stall time (PSI) by resource: some task stalled, or all.",
    );
    for p in &snapshot.pressure {
        for (kind, us) in [("some", p.pressure.some_us), ("full", p.pressure.full_us)] {
            let _ = writeln!(
                out,
                "slo_probe_pressure_stalled_seconds_total{{resource=\"{}\",kind=\"{kind}\"}} {}",
                p.resource,
                us as f64 / 1e6
            );
        }
    }
}

/// The labels of a training process's series: `pid`, and its `rank` and `job_id` from its
/// environment (empty when unknown).
pub(crate) fn proc_labels(p: &ProcessSnapshot) -> String {
    format!(
        "pid=\"{}\",rank=\"{}\",job_id=\"{}\"",
        p.pid,
        p.rank.map(|r| r.to_string()).unwrap_or_default(),
        escape(p.job_id.as_deref().unwrap_or(""))
    )
}

fn render_shims(out: &mut String, snapshot: &Snapshot) {
    use slo_probe_common::ring::{
        STATUS_CONNECTED, STATUS_DIAGNOSTIC, STATUS_LOST_RACE, STATUS_TRACING,
    };
    let shims = &snapshot.processes;
    header(
        out,
        "slo_probe_shim_state",
        "gauge",
        "State of a training process's CUPTI shim: connected, tracing, lost_race (another CUPTI \
         subscriber was first), diagnostic (node-level graph tracing).",
    );
    for p in shims {
        for (state, on) in [
            ("connected", p.connected || p.status & STATUS_CONNECTED != 0),
            ("tracing", p.status & STATUS_TRACING != 0),
            ("lost_race", p.status & STATUS_LOST_RACE != 0),
            ("diagnostic", p.status & STATUS_DIAGNOSTIC != 0),
        ] {
            let _ = writeln!(
                out,
                "slo_probe_shim_state{{{},state=\"{state}\"}} {}",
                proc_labels(p),
                u8::from(on)
            );
        }
    }
    header(
        out,
        "slo_probe_shim_records_total",
        "counter",
        "GPU records consumed from a shim, by kind.",
    );
    for p in shims {
        for (kind, n) in [
            ("kernel", p.seen[0]),
            ("graph", p.seen[1]),
            ("memory", p.seen[2]),
            ("graph_node", p.seen[3]),
            ("string", p.seen[4]),
            ("step", p.seen[5]),
        ] {
            let _ = writeln!(
                out,
                "slo_probe_shim_records_total{{{},kind=\"{kind}\"}} {n}",
                proc_labels(p)
            );
        }
    }
    header(
        out,
        "slo_probe_shim_dropped_records_total",
        "counter",
        "GPU records lost: ring_full (the shim dropped rather than block the job), cupti \
         (CUPTI's own buffers overflowed), strings_full (kernel or operator names beyond the \
         agent's 65536 per process; their kernels are counted unnamed).",
    );
    for p in shims {
        for (reason, n) in [
            ("ring_full", p.dropped),
            ("cupti", p.cupti_dropped),
            ("strings_full", p.strings_dropped),
        ] {
            let _ = writeln!(
                out,
                "slo_probe_shim_dropped_records_total{{{},reason=\"{reason}\"}} {n}",
                proc_labels(p)
            );
        }
    }
    header(
        out,
        "slo_probe_shim_operators_overflowed_total",
        "counter",
        "GPU activities counted under the operator \"(other operators)\" because the process \
         had 4096 distinct operators already (the agent's memory stays bounded).",
    );
    for p in shims {
        let _ = writeln!(
            out,
            "slo_probe_shim_operators_overflowed_total{{{}}} {}",
            proc_labels(p),
            p.ops_overflowed
        );
    }
    header(
        out,
        "slo_probe_iterations_total",
        "counter",
        "Training iterations completed (from step markers, or detected).",
    );
    for p in shims {
        let _ = writeln!(
            out,
            "slo_probe_iterations_total{{{}}} {}",
            proc_labels(p),
            p.iterations_total
        );
    }
    header(
        out,
        "slo_probe_iteration_duration_seconds",
        "gauge",
        "Iteration wall time over the agent's recent window (the last 512 iterations), by \
         quantile.",
    );
    header(
        out,
        "slo_probe_iteration_gpu_busy_ratio",
        "gauge",
        "Share of an iteration's wall time with the GPU busy: the median over the recent window.",
    );
    header(
        out,
        "slo_probe_iteration_phase_seconds",
        "gauge",
        "Time per iteration by phase over the recent window, by quantile: GPU compute, \
         communication (NCCL kernels) and memory operations, host_wait (GPU idle before the \
         iteration's first activity: data loading, the host) and launch_gaps (GPU idle between \
         activities), comm_overlap (communication kernels running while compute ran: the \
         gradient sync hidden behind backward). In synchronous data parallel training the \
         straggler rank has the least communication: the others wait for it inside the \
         all-reduce.",
    );
    header(
        out,
        "slo_probe_gpu_launch_latency_seconds",
        "gauge",
        "Launch latency (API entry to GPU start) over the recent window, by quantile.",
    );
    for p in shims {
        let Some(st) = &p.stats else { continue };
        let secs = |ns: u64| ns as f64 / 1e9;
        for (k, quantile) in [0.5, 0.99].into_iter().enumerate() {
            let _ = writeln!(
                out,
                "slo_probe_iteration_duration_seconds{{{},quantile=\"{quantile}\"}} {}",
                proc_labels(p),
                secs(st.wall_ns[k])
            );
            if let Some(lat) = st.launch_latency_ns {
                let _ = writeln!(
                    out,
                    "slo_probe_gpu_launch_latency_seconds{{{},quantile=\"{quantile}\"}} {}",
                    proc_labels(p),
                    secs(lat[k])
                );
            }
        }
        for ((phase, _), q) in slo_probe_core::gputrace::PHASES.iter().zip(&st.phases) {
            for (k, quantile) in [0.5, 0.99].into_iter().enumerate() {
                let _ = writeln!(
                    out,
                    "slo_probe_iteration_phase_seconds{{{},phase=\"{phase}\",quantile=\"{quantile}\"}} {}",
                    proc_labels(p),
                    secs(q[k])
                );
            }
        }
        let _ = writeln!(
            out,
            "slo_probe_iteration_gpu_busy_ratio{{{}}} {}",
            proc_labels(p),
            st.gpu_busy_ratio_p50
        );
    }
}

/// The node's straggler view: jobs with two or more ranks here.
fn render_stragglers(out: &mut String, views: &[RankView]) {
    header(
        out,
        "slo_probe_straggler_score",
        "gauge",
        "A rank against the median of its job's other ranks on this node: signal noncomm (median \
         iteration minus its communication kernels; the straggler waits least in the \
         all-reduce) or host_delay (run-queue delay of its main, loader and communication \
         threads plus cgroup throttling, ms/s, floor 1 ms/s).",
    );
    for v in views {
        let labels = format!(
            "pid=\"{}\",rank=\"{}\",job_id=\"{}\"",
            v.pid,
            v.rank,
            escape(&v.job_id)
        );
        if let Some(s) = v.noncomm_score {
            let _ = writeln!(
                out,
                "slo_probe_straggler_score{{{labels},signal=\"noncomm\"}} {s}"
            );
        }
        if let Some(s) = v.host_score {
            let _ = writeln!(
                out,
                "slo_probe_straggler_score{{{labels},signal=\"host_delay\"}} {s}"
            );
        }
    }
    header(
        out,
        "slo_probe_straggler",
        "gauge",
        "1 for the rank named the straggler of its job on this node, with its cause: an SLO host \
         node (host.runqueue.main, ...) or a GPU phase (compute, memory, host_wait, launch_gaps).",
    );
    for v in views {
        if let Some(cause) = &v.straggler {
            let _ = writeln!(
                out,
                "slo_probe_straggler{{pid=\"{}\",rank=\"{}\",job_id=\"{}\",cause=\"{}\"}} 1",
                v.pid,
                v.rank,
                escape(&v.job_id),
                escape(cause)
            );
        }
    }
}

/// A bound Prometheus endpoint, not yet serving.
pub struct PrometheusServer {
    listener: TcpListener,
    per_thread: bool,
    api: Arc<crate::api::Api>,
}

impl PrometheusServer {
    /// Binds the listen address (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr, per_thread: bool) -> Result<Self, PrometheusError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| PrometheusError::Bind { addr, source })?;
        Ok(Self {
            listener,
            per_thread,
            api: Arc::default(),
        })
    }

    /// Serves the state API (`/api/v1`, [`crate::api`]) with these settings beside the metrics
    /// (by default: read-only, without the agent's host name or shim socket).
    pub fn with_api(mut self, api: crate::api::Api) -> Self {
        self.api = Arc::new(api);
        self
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `/metrics` and `/api/v1` from the latest snapshot until `shutdown` turns true.
    pub async fn serve(
        self,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let snapshots = snapshots.clone();
                    let per_thread = self.per_thread;
                    let api = self.api.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                            let snapshots = snapshots.clone();
                            let api = api.clone();
                            async move {
                                if req.uri().path().starts_with("/api/") {
                                    return Ok::<_, Infallible>(
                                        crate::api::handle(req, api, snapshots).await,
                                    );
                                }
                                let snapshot = snapshots.borrow().clone();
                                Ok(respond(&req, &snapshot, per_thread).map(|b| b.boxed()))
                            }
                        });
                        // A client that hangs up mid-response is not the agent's problem.
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                _ = shutdown.changed() => break,
            }
        }
    }
}

fn respond<B>(req: &Request<B>, snapshot: &Snapshot, per_thread: bool) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (200, CONTENT_TYPE, render(snapshot, per_thread)),
        (&Method::GET, "/healthz") => (200, "text/plain", "ok\n".to_owned()),
        (&Method::GET, "/") => (
            200,
            "text/plain",
            "slo-probe agent\n  /metrics           Prometheus text exposition\n  /healthz           \
             liveness\n  /api/v1/snapshot   the state as JSON\n  /api/v1/watch      the state, then \
             its changes each tick (NDJSON)\n"
                .to_owned(),
        ),
        _ => (404, "text/plain", "not found; try /metrics\n".to_owned()),
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::{log2_slot, ThreadStats};
    use slo_probe_core::{
        cgroup::{CpuLimit, Pressure, PressureRow},
        proctree::ProcessTree,
        roles::{Role, RoleRules},
        snapshot::ProbeStatus,
        threads::{ThreadRead, ThreadTable},
    };

    fn snapshot() -> Snapshot {
        let mut h = ThreadStats::ZERO;
        h.tgid = 7;
        h.comm[..6].copy_from_slice(b"tr\"ain");
        for w in [500u64, 2_000, 3_000_000] {
            h.runq_slots[log2_slot(w)] += 1;
            h.runq_count += 1;
            h.runq_total_ns += w;
        }
        h.offcpu_voluntary_ns = 2_500_000_000;
        h.tcp_sent_bytes = 4096;
        let mut tree = ProcessTree::new();
        tree.set_roots([7]);
        let mut table = ThreadTable::new(10);
        let threads = table.apply(
            1,
            &[ThreadRead { tid: 7, stats: h }],
            &tree,
            &RoleRules::default(),
        );
        Snapshot {
            threads: Some(threads),
            cgroups: vec![CgroupRow {
                path: "/job".into(),
                version: 1,
                cpu: Some(CpuStat {
                    nr_periods: 10,
                    nr_throttled: 9,
                    throttled_ns: 900_000_000,
                }),
                limit: Some(CpuLimit {
                    quota_us: Some(10_000),
                    period_us: 100_000,
                }),
                pressure: None,
                pids: vec![7],
                roles: vec![Role::Main],
            }],
            pressure: vec![PressureRow {
                resource: "cpu",
                pressure: Pressure {
                    some_us: 1_500_000,
                    full_us: 0,
                },
            }],
            probes: vec![ProbeStatus {
                name: "runqueue",
                up: true,
                reason: String::new(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_escaped() {
        let text = render(&snapshot(), true);
        let labels = "pid=\"7\",process=\"tr\\\"ain\",role=\"main\"";
        let name = "slo_probe_runqueue_latency_seconds";
        assert!(
            text.contains(&format!("{name}_bucket{{{labels},le=\"0.000001024\"}} 1")),
            "{text}"
        );
        assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"0.000002048\"}} 2")));
        assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"0.004194304\"}} 3")));
        assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"+Inf\"}} 3")));
        assert!(text.contains(&format!("{name}_count{{{labels}}} 3")));
        assert!(text.contains(&format!("{name}_sum{{{labels}}} 0.0030025")));
        assert!(text.contains(
            "slo_probe_thread_runqueue_latency_seconds_count{pid=\"7\",process=\"tr\\\"ain\",\
             tid=\"7\",thread=\"tr\\\"ain\",role=\"main\"} 3"
        ));
        assert!(text.contains(&format!(
            "slo_probe_offcpu_seconds_total{{{labels},kind=\"voluntary\"}} 2.5"
        )));
        assert!(text.contains(&format!("slo_probe_tcp_sent_bytes_total{{{labels}}} 4096")));
        assert!(text.contains("slo_probe_probe_up{probe=\"runqueue\",reason=\"\"} 1"));
        assert!(text.contains("slo_probe_ebpf_events_dropped_total{reason=\"ringbuf_full\"} 0"));
        let cg = "cgroup=\"/job\",version=\"1\",roles=\"main\"";
        assert!(text.contains(&format!(
            "slo_probe_cgroup_cpu_throttled_periods_total{{{cg}}} 9"
        )));
        assert!(text.contains(&format!(
            "slo_probe_cgroup_cpu_throttled_seconds_total{{{cg}}} 0.9"
        )));
        assert!(text.contains(&format!("slo_probe_cgroup_cpu_limit_cpus{{{cg}}} 0.1")));
        assert!(text.contains(
            "slo_probe_pressure_stalled_seconds_total{resource=\"cpu\",kind=\"some\"} 1.5"
        ));
    }

    #[test]
    fn per_thread_can_be_switched_off() {
        let text = render(&snapshot(), false);
        assert!(!text.contains("slo_probe_thread_runqueue_latency_seconds_bucket"));
        assert!(text.contains("slo_probe_runqueue_latency_seconds_bucket"));
    }

    /// Every sample line belongs to a family declared once with HELP and TYPE before it, and
    /// every line parses as `name{labels} value`.
    #[test]
    fn exposition_is_well_formed() {
        let text = render(&snapshot(), true);
        let mut declared = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let family = rest.split(' ').next().unwrap_or_default().to_owned();
                assert!(declared.insert(family.clone()), "{family} declared twice");
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let name_end = line.find(['{', ' ']).expect("name");
            let name = &line[..name_end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| declared.contains(*f)))
                .unwrap_or(name);
            assert!(declared.contains(family), "undeclared family in {line}");
            let value = line.rsplit(' ').next().expect("value");
            assert!(value.parse::<f64>().is_ok(), "bad value in {line}");
        }
    }
}
