//! Prometheus text exposition (format 0.0.4) of the latest snapshot, served over HTTP on
//! loopback by default.
//!
//! Label cardinality: process series are one per live (or recently exited) process that had a
//! run-queue wait; thread series one per thread, and can be switched off with
//! `prometheus.per_thread = false`. Histogram buckets are the kernel's log2 slots from 1.024 µs to
//! 17.2 s (25 buckets + `+Inf`).

use std::{convert::Infallible, fmt::Write as _, net::SocketAddr, sync::Arc};

use http_body_util::Full;
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Method, Request, Response};
use hyper_util::rt::TokioIo;
use slo_probe_common::Counter;
use slo_probe_core::{runq::RunqCounts, snapshot::Snapshot};
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
fn escape(value: &str) -> String {
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

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
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

    if let Some(runq) = &snapshot.runq {
        let process_name = |pid: u32| runq.process(pid).map_or("", |p| p.name.as_str());
        let name = "slo_probe_process_runqueue_latency_seconds";
        header(
            &mut out,
            name,
            "histogram",
            "Time the threads of a process spent runnable, waiting for a CPU, per wait.",
        );
        for p in &runq.processes {
            let labels = format!("pid=\"{}\",process=\"{}\"", p.pid, escape(&p.name));
            histogram(&mut out, name, &labels, &p.counts);
        }
        let name = "slo_probe_process_runqueue_preempted_waits_total";
        header(
            &mut out,
            name,
            "counter",
            "Run-queue waits of a process that began with an involuntary preemption (the rest \
             began with a wakeup).",
        );
        for p in &runq.processes {
            let _ = writeln!(
                out,
                "{name}{{pid=\"{}\",process=\"{}\"}} {}",
                p.pid,
                escape(&p.name),
                p.counts.preempted
            );
        }
        if per_thread {
            let name = "slo_probe_thread_runqueue_latency_seconds";
            header(
                &mut out,
                name,
                "histogram",
                "Time a thread spent runnable, waiting for a CPU, per wait.",
            );
            for t in &runq.threads {
                let labels = format!(
                    "pid=\"{}\",process=\"{}\",tid=\"{}\",thread=\"{}\"",
                    t.pid,
                    escape(process_name(t.pid)),
                    t.tid,
                    escape(&t.name)
                );
                histogram(&mut out, name, &labels, &t.counts);
            }
        }
        let name = "slo_probe_runqueue_outliers_total";
        header(
            &mut out,
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

    header(
        &mut out,
        "slo_probe_ebpf_events_dropped_total",
        "counter",
        "Events the probes dropped instead of blocking, by reason.",
    );
    header(
        &mut out,
        "slo_probe_ebpf_errors_total",
        "counter",
        "Errors while collecting, by reason.",
    );
    for c in Counter::ALL {
        let n = snapshot.counters[c as usize];
        let family = if c.is_drop() {
            "slo_probe_ebpf_events_dropped_total"
        } else if c == Counter::OutliersSent {
            continue;
        } else {
            "slo_probe_ebpf_errors_total"
        };
        let _ = writeln!(out, "{family}{{reason=\"{}\"}} {n}", c.name());
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

/// A bound Prometheus endpoint, not yet serving.
pub struct PrometheusServer {
    listener: TcpListener,
    per_thread: bool,
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
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `/metrics` from the latest snapshot until `shutdown` turns true.
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
                    tokio::spawn(async move {
                        let service = service_fn(move |req| {
                            let snapshot = snapshots.borrow().clone();
                            async move { Ok::<_, Infallible>(respond(&req, &snapshot, per_thread)) }
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
            "slo-probe agent\n  /metrics  Prometheus text exposition\n  /healthz  liveness\n"
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
    use slo_probe_common::{log2_slot, RunqHist};
    use slo_probe_core::{
        runq::{RunqTable, ThreadRead},
        snapshot::ProbeStatus,
    };

    fn snapshot() -> Snapshot {
        let mut h = RunqHist::ZERO;
        h.tgid = 7;
        h.comm[..6].copy_from_slice(b"tr\"ain");
        for w in [500u64, 2_000, 3_000_000] {
            h.slots[log2_slot(w)] += 1;
            h.count += 1;
            h.total_ns += w;
        }
        let mut table = RunqTable::new(10);
        let runq = table.apply(1, &[ThreadRead { tid: 7, hist: h }]);
        Snapshot {
            runq: Some(runq),
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
        let labels = "pid=\"7\",process=\"tr\\\"ain\"";
        let name = "slo_probe_process_runqueue_latency_seconds";
        assert!(
            text.contains(&format!("{name}_bucket{{{labels},le=\"0.000001024\"}} 1")),
            "{text}"
        );
        assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"0.000002048\"}} 2")));
        assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"0.004194304\"}} 3")));
        assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"+Inf\"}} 3")));
        assert!(text.contains(&format!("{name}_count{{{labels}}} 3")));
        assert!(text.contains(&format!("{name}_sum{{{labels}}} 0.0030025")));
        assert!(text.contains("slo_probe_thread_runqueue_latency_seconds_count{pid=\"7\",process=\"tr\\\"ain\",tid=\"7\",thread=\"tr\\\"ain\"} 3"));
        assert!(text.contains("slo_probe_probe_up{probe=\"runqueue\",reason=\"\"} 1"));
        assert!(text.contains("slo_probe_ebpf_events_dropped_total{reason=\"ringbuf_full\"} 0"));
    }

    #[test]
    fn per_thread_can_be_switched_off() {
        let text = render(&snapshot(), false);
        assert!(!text.contains("slo_probe_thread_runqueue_latency_seconds_bucket"));
        assert!(text.contains("slo_probe_process_runqueue_latency_seconds_bucket"));
    }

    /// Every sample line belongs to a family declared with HELP and TYPE before it, and every
    /// line parses as `name{labels} value`.
    #[test]
    fn exposition_is_well_formed() {
        let text = render(&snapshot(), true);
        let mut declared = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared.insert(rest.split(' ').next().unwrap_or_default().to_owned());
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
