//! OTLP push through `opentelemetry-otlp` (gRPC or HTTP/protobuf), for users whose metrics and
//! traces go through an OpenTelemetry Collector.
//!
//! Metrics ([`metrics`]) are the metric model's families under their Prometheus names, built as
//! data points straight from the snapshot. Resources ([`resource`]): the node's carries the
//! node's series; each training process the CUPTI shim reports gets its own, with the node's
//! attributes plus its pid, job, rank, GPU UUID and Kubernetes pod (read when its shim
//! registered, carried by its snapshot), and carries that process's series (those with its
//! `pid` label) and its traces ([`traces`]): one span per SLO violation, with a child span per
//! attributed operator and per host cause; and the healer's audit events as log records
//! ([`logs`]), on the job's resource. [`settings`] resolves the `[otlp]` section against
//! the `OTEL_*` variables before the agent starts anything.
//!
//! The SDK's periodic reader and batch span processor export from their own threads; a receiver
//! that is down costs those threads their export timeout and nothing else: metric state is
//! cumulative (what was missed is in the next export), spans and log records wait in bounded
//! queues (2048, then dropped and counted by the SDK).

mod logs;
mod metrics;
mod resource;
mod settings;
mod traces;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use opentelemetry::KeyValue;
use opentelemetry_otlp::{
    Protocol, RetryPolicy, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _,
};
use opentelemetry_sdk::{logs::SdkLoggerProvider, trace::SdkTracerProvider, Resource};
use slo_probe_core::snapshot::Snapshot;
use tokio::{sync::watch, task::JoinHandle};

use self::metrics::Meters;
pub use self::settings::{Env, ProcessEnv, Settings};
use super::Exporter;
use crate::config::OtlpProtocol;

/// Errors of the OTLP exporter.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// `otlp.protocol` names no transport slo-probe speaks.
    #[error("otlp.protocol = {value:?}: expected \"grpc\" or \"http/protobuf\"")]
    Protocol {
        /// The value given.
        value: String,
    },
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` names no transport slo-probe speaks.
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={value:?}: slo-probe speaks \"grpc\" and \"http/protobuf\"; \
         unset it or set otlp.protocol in the config"
    )]
    ProtocolVariable {
        /// The variable's value.
        value: String,
    },
    /// An `OTEL_EXPORTER_OTLP_*ENDPOINT` variable the SDK would read names an endpoint this
    /// build cannot send to (checked as `otlp.endpoint` is).
    #[error("{var}={value:?}: {why}")]
    EndpointVariable {
        /// The variable.
        var: &'static str,
        /// Its value, clipped.
        value: String,
        /// Why it cannot be used.
        why: &'static str,
    },
    /// The SDK refused to build a metric exporter (an endpoint or header it cannot use).
    #[error("cannot build the OTLP metric exporter; check otlp.endpoint and OTEL_EXPORTER_OTLP_*")]
    MetricExporter {
        /// What the SDK said.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The SDK refused to build a log exporter.
    #[error("cannot build the OTLP log exporter; check otlp.endpoint and OTEL_EXPORTER_OTLP_*")]
    LogExporter {
        /// What the SDK said.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The SDK refused to build a span exporter.
    #[error("cannot build the OTLP span exporter; check otlp.endpoint and OTEL_EXPORTER_OTLP_*")]
    SpanExporter {
        /// What the SDK said.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The timeout and, when the config names one, the endpoint (over HTTP with the signal's path
/// appended, as the variables' base endpoint gets it); otherwise the SDK reads
/// `OTEL_EXPORTER_OTLP_*ENDPOINT`.
fn configure<B: opentelemetry_otlp::WithExportConfig>(
    b: B,
    settings: &Settings,
    timeout: Duration,
    http_path: Option<&str>,
) -> B {
    let b = b.with_timeout(timeout);
    match (&settings.endpoint, http_path) {
        (Some(e), Some(path)) => b.with_endpoint(format!("{}{path}", e.trim_end_matches('/'))),
        (Some(e), None) => b.with_endpoint(e.clone()),
        (None, _) => b,
    }
}

/// Violations are rare and each one matters: their spans are retried for five minutes (the
/// exporter's deadline bounds its retries; the batch processor's queue, bounded, holds the later
/// spans meanwhile), so that a collector restart does not lose them. Metrics need no such thing:
/// they are cumulative, and keep the configured timeout.
const SPAN_RETRY_WINDOW: Duration = Duration::from_secs(300);

fn span_retries() -> RetryPolicy {
    RetryPolicy::recommended()
        .with_max_retries(64)
        .with_initial_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(10))
}

/// A span or log exporter (`$builder`: `SpanExporter`, `LogExporter`) over the configured
/// transport, retried for [`SPAN_RETRY_WINDOW`]; over HTTP to `$path`.
macro_rules! retried_exporter {
    ($builder:ident, $settings:expr, $path:literal) => {{
        let settings: &Settings = $settings;
        let timeout = SPAN_RETRY_WINDOW.max(settings.timeout);
        match settings.protocol {
            OtlpProtocol::Grpc => configure(
                opentelemetry_otlp::$builder::builder()
                    .with_tonic()
                    .with_retry_policy(span_retries()),
                settings,
                timeout,
                None,
            )
            .build(),
            OtlpProtocol::HttpProtobuf => configure(
                opentelemetry_otlp::$builder::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_retry_policy(span_retries()),
                settings,
                timeout,
                Some($path),
            )
            .build(),
        }
    }};
}

fn tracer(settings: &Settings, resource: Resource) -> Result<SdkTracerProvider, OtlpError> {
    let exporter = retried_exporter!(SpanExporter, settings, "/v1/traces")
        .map_err(|source| OtlpError::SpanExporter { source })?;
    Ok(SdkTracerProvider::builder()
        .with_resource(resource)
        .with_batch_exporter(exporter)
        .build())
}

/// The healer's log records are retried as spans are: each is an audited decision.
fn logger(settings: &Settings, resource: Resource) -> Result<SdkLoggerProvider, OtlpError> {
    let exporter = retried_exporter!(LogExporter, settings, "/v1/logs")
        .map_err(|source| OtlpError::LogExporter { source })?;
    Ok(SdkLoggerProvider::builder()
        .with_resource(resource)
        .with_batch_exporter(exporter)
        .build())
}

/// A resource with its providers: the node, or one training process.
struct Target {
    meters: Meters,
    tracer: Option<SdkTracerProvider>,
    logger: Option<SdkLoggerProvider>,
}

impl Target {
    fn new(settings: &Settings, resource: Resource) -> Result<Self, OtlpError> {
        let tracer = if settings.traces {
            Some(tracer(settings, resource.clone())?)
        } else {
            None
        };
        let logger = if settings.logs {
            Some(logger(settings, resource.clone())?)
        } else {
            None
        };
        Ok(Self {
            meters: Meters::new(settings, resource)?,
            tracer,
            logger,
        })
    }

    /// Flushes and stops both providers (blocking a few seconds at most: a span batch still
    /// retrying for a receiver that is down is given up).
    fn shutdown(self, timeout: Duration) {
        self.meters.shutdown(timeout);
        if let Some(t) = self.tracer {
            let _ = t.shutdown_with_timeout(timeout);
        }
        if let Some(l) = self.logger {
            let _ = l.shutdown_with_timeout(timeout);
        }
    }
}

/// A training process being exported.
struct Proc {
    target: Target,
    last_iteration_end_ns: u64,
    violations_sent: HashSet<u64>,
    last_seen_ns: u64,
}

/// The OTLP exporter: fed every snapshot by the agent.
pub struct OtlpExporter {
    settings: Settings,
    /// The node's resource, made once: each process's resource starts from its attributes.
    node_resource: Resource,
    node: Target,
    procs: HashMap<u32, Proc>,
    last_publish_ns: u64,
    retention_ns: u64,
    logs_sent: logs::Sent,
}

impl OtlpExporter {
    /// Builds the node's providers. Must run inside the Tokio runtime (the gRPC channel lives
    /// there); connecting is lazy, so a receiver that is not up yet is no error.
    pub fn new(settings: Settings, retention: Duration) -> Result<Self, OtlpError> {
        let node_resource = resource::node();
        let node = Target::new(&settings, node_resource.clone())?;
        log::info!(
            "OTLP export on ({:?}, {}, every {} ms)",
            settings.protocol,
            settings
                .endpoint
                .as_deref()
                .unwrap_or("endpoint from OTEL_EXPORTER_OTLP_*"),
            settings.interval.as_millis()
        );
        Ok(Self {
            settings,
            node_resource,
            node,
            procs: HashMap::new(),
            last_publish_ns: 0,
            logs_sent: logs::Sent::default(),
            retention_ns: u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX),
        })
    }

    /// Takes a snapshot: new iterations into the histogram and violations as spans at once; the
    /// data points are rebuilt at most four times per export period.
    pub fn update(&mut self, snap: &Snapshot) {
        let now = snap.taken_at_ns;
        for p in &snap.processes {
            if !self.procs.contains_key(&p.pid) {
                match Target::new(&self.settings, resource::process(&self.node_resource, p)) {
                    Ok(target) => {
                        self.procs.insert(
                            p.pid,
                            Proc {
                                target,
                                last_iteration_end_ns: 0,
                                violations_sent: HashSet::new(),
                                last_seen_ns: now,
                            },
                        );
                    }
                    Err(e) => {
                        log::warn!("OTLP: process {}: {}", p.pid, crate::error_chain(&e));
                        continue;
                    }
                }
            }
            let Some(proc) = self.procs.get_mut(&p.pid) else {
                continue;
            };
            proc.last_seen_ns = now;
            let labels = [
                KeyValue::new("pid", p.pid.to_string()),
                KeyValue::new("rank", p.rank.map(|r| r.to_string()).unwrap_or_default()),
                KeyValue::new("job_id", p.job_id.clone().unwrap_or_default()),
            ];
            for it in p
                .iterations
                .iter()
                .filter(|i| i.end_ns > proc.last_iteration_end_ns)
            {
                proc.target
                    .meters
                    .iteration_seconds
                    .record(it.wall_ns() as f64 / 1e9, &labels);
            }
            if let Some(last) = p.iterations.iter().map(|i| i.end_ns).max() {
                proc.last_iteration_end_ns = proc.last_iteration_end_ns.max(last);
            }
            let (Some(tracer), Some(slo)) = (&proc.target.tracer, &p.slo) else {
                continue;
            };
            for v in &slo.violations {
                if traces::ready(v) && proc.violations_sent.insert(v.id) {
                    traces::send_violation(tracer, p, v, now);
                    log::info!(
                        "OTLP: violation {} of process {} ({}) queued as a trace",
                        v.id,
                        p.pid,
                        v.node
                    );
                }
            }
        }
        // The healers' new audit events, on their job's resource (the node's for a job the shim
        // does not report).
        for h in &snap.healers {
            let events = self.logs_sent.take(h);
            let provider = self
                .procs
                .get(&h.job)
                .and_then(|p| p.target.logger.as_ref())
                .or(self.node.logger.as_ref());
            if let Some(provider) = provider {
                for e in events {
                    logs::send(provider, e, now);
                }
            }
        }
        let jobs: Vec<u32> = snap.healers.iter().map(|h| h.job).collect();
        self.logs_sent.retain(&jobs);
        // Processes gone for longer than the retention: final export, then their providers go.
        let live: HashSet<u32> = snap.processes.iter().map(|p| p.pid).collect();
        let gone: Vec<u32> = self
            .procs
            .iter()
            .filter(|(pid, p)| {
                !live.contains(pid) && now.saturating_sub(p.last_seen_ns) > self.retention_ns
            })
            .map(|(pid, _)| *pid)
            .collect();
        for pid in gone {
            if let Some(p) = self.procs.remove(&pid) {
                let timeout = self.settings.timeout;
                std::thread::spawn(move || p.target.shutdown(timeout));
            }
        }
        let every = u64::try_from(self.settings.interval.as_nanos() / 4).unwrap_or(u64::MAX);
        if self.last_publish_ns == 0 || now.saturating_sub(self.last_publish_ns) >= every {
            self.last_publish_ns = now;
            let pids: HashSet<u32> = self.procs.keys().copied().collect();
            let mut batch = metrics::collect(snap, &pids);
            self.node.meters.publish(batch.node);
            for (pid, p) in &mut self.procs {
                p.target
                    .meters
                    .publish(batch.procs.remove(pid).unwrap_or_default());
            }
        }
    }

    /// Flushes everything and stops (blocking up to the export timeout per provider).
    pub fn shutdown(self) {
        let timeout = self.settings.timeout.min(Duration::from_secs(5));
        let mut handles = Vec::new();
        for (_, p) in self.procs {
            handles.push(std::thread::spawn(move || p.target.shutdown(timeout)));
        }
        self.node.shutdown(timeout);
        for h in handles {
            let _ = h.join();
        }
    }

    /// Feeds the exporter every snapshot until shutdown, then flushes (a final export, bounded
    /// by the export timeout).
    pub async fn run(
        mut self,
        mut snapshots: watch::Receiver<Arc<Snapshot>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let snap = snapshots.borrow_and_update().clone();
                    self.update(&snap);
                }
                _ = shutdown.changed() => break,
            }
        }
        let _ = tokio::task::spawn_blocking(move || self.shutdown()).await;
    }
}

impl Exporter for OtlpExporter {
    fn name(&self) -> &'static str {
        "otlp"
    }

    fn start(
        self: Box<Self>,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        shutdown: watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        tokio::spawn((*self).run(snapshots, shutdown))
    }
}
