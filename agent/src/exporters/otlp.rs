//! OTLP push through `opentelemetry-otlp` (gRPC or HTTP/protobuf), for users whose metrics and
//! traces go through an OpenTelemetry Collector.
//!
//! Metrics are the Prometheus families under the same names (one namespace: the recording rules
//! and dashboards in `collector-config/` and `dashboards/` work whichever way the data arrives;
//! the collector's `prometheusremotewrite` runs with `add_metric_suffixes: false`). They are
//! bridged from the exposition [`super::prometheus::render`] writes, so the two exports cannot
//! drift: gauges become observable gauges, counters observable (cumulative, monotonic) counters,
//! and a histogram family its `_sum` and `_count` counters. Per-thread families
//! (`slo_probe_thread_*`) stay Prometheus-only: they are the unbounded share of the series. Each
//! training process's own iteration times also go into a real OTLP histogram,
//! `slo_probe_iteration_seconds`.
//!
//! Resources: the node's (service, host, Kubernetes node and the agent's pod) carries the node's
//! series; each training process the CUPTI shim reports gets its own resource with the node's
//! attributes plus its pid, job, rank, GPU UUID and Kubernetes pod, and carries that process's
//! series (those with its `pid` label) and its traces: one span per SLO violation, with a child
//! span per attributed operator and per host cause.
//!
//! The SDK's periodic reader and batch span processor export from their own threads; a receiver
//! that is down costs those threads their export timeout and nothing else: metric state is
//! cumulative (what was missed is in the next export), spans wait in a bounded queue (2048, then
//! dropped and counted by the SDK).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use opentelemetry::{
    metrics::{Histogram, Meter, MeterProvider as _},
    trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _},
    Context, KeyValue,
};
use opentelemetry_otlp::{
    Protocol, RetryPolicy, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _,
};
use opentelemetry_sdk::{
    metrics::{PeriodicReader, SdkMeterProvider},
    trace::SdkTracerProvider,
    Resource,
};
use slo_probe_core::{
    attribution::Attribution, gpu::GpuSnapshot, slo::Violation, snapshot::ProcessSnapshot,
    snapshot::Snapshot,
};

use crate::config::OtlpConfig;

/// Bucket bounds of `slo_probe_iteration_seconds`, in seconds (1 ms to 2 min).
const ITERATION_BOUNDS: [f64; 20] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0,
    5.0, 10.0, 30.0, 120.0,
];

/// The transport, resolved from the config, then `OTEL_EXPORTER_OTLP_PROTOCOL`, then gRPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// gRPC (port 4317).
    Grpc,
    /// HTTP with protobuf bodies (port 4318, `/v1/metrics`, `/v1/traces`).
    HttpProtobuf,
}

impl Transport {
    /// Parses `grpc` or `http/protobuf`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "grpc" => Some(Self::Grpc),
            "http/protobuf" | "http" => Some(Self::HttpProtobuf),
            _ => None,
        }
    }

    /// From the config (empty: the environment, then gRPC).
    pub fn resolve(configured: &str) -> Result<Self, String> {
        if !configured.is_empty() {
            return Self::parse(configured).ok_or_else(|| {
                format!("otlp.protocol = {configured:?}: expected \"grpc\" or \"http/protobuf\"")
            });
        }
        match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL") {
            Ok(v) if !v.is_empty() => Self::parse(&v).ok_or_else(|| {
                format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL={v:?}: slo-probe speaks \"grpc\" and \
                     \"http/protobuf\""
                )
            }),
            _ => Ok(Self::Grpc),
        }
    }
}

/// One sample of the exposition, bridged.
#[derive(Clone, Debug, PartialEq)]
struct Point {
    attrs: Vec<KeyValue>,
    value: f64,
}

/// What an instrument reports, by family name; shared with the SDK's callbacks.
type Points = Arc<Mutex<HashMap<String, Vec<Point>>>>;

/// A family of the exposition.
#[derive(Clone, Debug, PartialEq)]
struct Family {
    kind: Kind,
    help: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

/// The unit of a family, from its Prometheus suffix (UCUM, as OTLP wants), or the table's for a
/// semantic-convention name.
fn unit_of(name: &str) -> &'static str {
    if let Some((.., unit, _, _)) = SEMCONV.iter().find(|(n, ..)| *n == name) {
        return unit;
    }
    let base = name.trim_end_matches("_total");
    let base = base
        .trim_end_matches("_sum")
        .trim_end_matches("_count")
        .trim_end_matches("_bucket");
    if name.ends_with("_count") {
        return "1";
    }
    for (suffix, unit) in [
        ("_seconds", "s"),
        ("_bytes", "By"),
        ("_ratio", "1"),
        ("_watts", "W"),
        ("_hertz", "Hz"),
        ("_bytes_per_second", "By/s"),
    ] {
        if base.ends_with(suffix) {
            return unit;
        }
    }
    ""
}

/// Samples by owner (a training process's pid; `None`: the node), then by family.
type ByOwner = HashMap<Option<u32>, HashMap<String, Vec<Point>>>;

/// A sample's name, labels and value.
type Sample<'a> = (&'a str, Vec<(String, String)>, f64);

/// Parses Prometheus text exposition (as [`super::prometheus::render`] writes it) into families
/// and samples keyed by the process (`pid` label) they belong to (`None`: the node). Per-thread
/// families and histogram buckets are left out; a histogram's `_sum` and `_count` become
/// counters.
fn parse_exposition(text: &str, procs: &HashSet<u32>) -> (HashMap<String, Family>, ByOwner) {
    let mut families: HashMap<String, Family> = HashMap::new();
    let mut help: HashMap<&str, &str> = HashMap::new();
    let mut kinds: HashMap<&str, &str> = HashMap::new();
    let mut points: ByOwner = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, h)) = rest.split_once(' ') {
                help.insert(name, h);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, k)) = rest.split_once(' ') {
                kinds.insert(name, k);
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((name, labels, value)) = parse_sample(line) else {
            continue;
        };
        if name.starts_with("slo_probe_thread_") || name.ends_with("_bucket") {
            continue;
        }
        let (family, kind) = match kinds.get(name) {
            Some(&"counter") => (name, Kind::Counter),
            Some(_) => (name, Kind::Gauge),
            None => {
                // A histogram's _sum and _count.
                let base = name
                    .strip_suffix("_sum")
                    .or_else(|| name.strip_suffix("_count"));
                match base.and_then(|b| kinds.get(b)) {
                    Some(&"histogram") => (name, Kind::Counter),
                    _ => continue,
                }
            }
        };
        let base = family
            .strip_suffix("_sum")
            .or_else(|| family.strip_suffix("_count"))
            .filter(|b| kinds.get(b) == Some(&"histogram"))
            .unwrap_or(family);
        families.entry(family.to_owned()).or_insert_with(|| Family {
            kind,
            help: help.get(base).copied().unwrap_or("").to_owned(),
        });
        let owner = labels
            .iter()
            .find(|(k, _)| k == "pid")
            .and_then(|(_, v)| v.parse::<u32>().ok())
            .filter(|p| procs.contains(p));
        let attrs = labels
            .into_iter()
            .map(|(k, v)| KeyValue::new(k, v))
            .collect();
        points
            .entry(owner)
            .or_default()
            .entry(family.to_owned())
            .or_default()
            .push(Point { attrs, value });
    }
    (families, points)
}

/// (semconv name, source family, unit, attribute renames, kind).
type SemconvAlias = (
    &'static str,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    Kind,
);

/// OpenTelemetry semantic-convention names for the families that have one (hardware GPU
/// metrics, the agent's own process metrics), sent beside the Prometheus-named ones so that
/// dashboards built on the conventions find them: (semconv name, source family, unit,
/// attribute renames (Prometheus label → semconv attribute; others dropped), kind).
const SEMCONV: [SemconvAlias; 6] = [
    (
        "hw.gpu.utilization",
        "slo_probe_gpu_utilization_ratio",
        "1",
        &[("uuid", "hw.id"), ("name", "hw.name")],
        Kind::Gauge,
    ),
    (
        "hw.gpu.memory.utilization",
        "slo_probe_gpu_memory_utilization_ratio",
        "1",
        &[("uuid", "hw.id"), ("name", "hw.name")],
        Kind::Gauge,
    ),
    (
        "hw.gpu.memory.usage",
        "slo_probe_gpu_memory_used_bytes",
        "By",
        &[("uuid", "hw.id"), ("name", "hw.name")],
        Kind::Gauge,
    ),
    (
        "hw.gpu.memory.limit",
        "slo_probe_gpu_memory_total_bytes",
        "By",
        &[("uuid", "hw.id"), ("name", "hw.name")],
        Kind::Gauge,
    ),
    (
        "process.cpu.time",
        "slo_probe_agent_cpu_seconds_total",
        "s",
        &[],
        Kind::Counter,
    ),
    (
        "process.memory.usage",
        "slo_probe_agent_resident_memory_bytes",
        "By",
        &[],
        Kind::Gauge,
    ),
];

/// Adds the [`SEMCONV`] metrics to the node's families and points.
fn add_semconv(families: &mut HashMap<String, Family>, node: &mut HashMap<String, Vec<Point>>) {
    for (name, source, _unit, renames, kind) in SEMCONV {
        let Some(points) = node.get(source) else {
            continue;
        };
        let renamed: Vec<Point> = points
            .iter()
            .map(|p| Point {
                attrs: p
                    .attrs
                    .iter()
                    .filter_map(|kv| {
                        let (_, to) = renames.iter().find(|(from, _)| kv.key.as_str() == *from)?;
                        Some(KeyValue::new(*to, kv.value.clone()))
                    })
                    .collect(),
                value: p.value,
            })
            .collect();
        let help = families
            .get(source)
            .map(|f| f.help.clone())
            .unwrap_or_default();
        families.insert(name.to_owned(), Family { kind, help });
        node.insert(name.to_owned(), renamed);
    }
}

/// `name{a="x",b="y"} value` → its parts (label values unescaped).
fn parse_sample(line: &str) -> Option<Sample<'_>> {
    let (head, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let Some((name, rest)) = head.split_once('{') else {
        return Some((head, Vec::new(), value));
    };
    let body = rest.strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut val = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                '"' => break,
                c => val.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_owned(), val));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Some((name, labels, value))
}

/// A resource with its providers: the node, or one training process.
struct Target {
    meters: SdkMeterProvider,
    meter: Meter,
    tracer: Option<SdkTracerProvider>,
    points: Points,
    instruments: HashSet<String>,
    iteration_seconds: Histogram<f64>,
}

impl Target {
    fn new(cfg: &Settings, resource: Resource) -> Result<Self, String> {
        let exporter = match cfg.transport {
            Transport::Grpc => configure(
                opentelemetry_otlp::MetricExporter::builder().with_tonic(),
                cfg,
                cfg.timeout,
                None,
            )
            .build(),
            Transport::HttpProtobuf => configure(
                opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary),
                cfg,
                cfg.timeout,
                Some("/v1/metrics"),
            )
            .build(),
        }
        .map_err(|e| format!("cannot build the OTLP metric exporter: {e}"))?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(cfg.interval)
            .build();
        let meters = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(reader)
            .build();
        let tracer = if cfg.traces {
            let timeout = SPAN_RETRY_WINDOW.max(cfg.timeout);
            let exporter = match cfg.transport {
                Transport::Grpc => configure(
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_retry_policy(span_retries()),
                    cfg,
                    timeout,
                    None,
                )
                .build(),
                Transport::HttpProtobuf => configure(
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_http()
                        .with_protocol(Protocol::HttpBinary)
                        .with_retry_policy(span_retries()),
                    cfg,
                    timeout,
                    Some("/v1/traces"),
                )
                .build(),
            }
            .map_err(|e| format!("cannot build the OTLP span exporter: {e}"))?;
            Some(
                SdkTracerProvider::builder()
                    .with_resource(resource)
                    .with_batch_exporter(exporter)
                    .build(),
            )
        } else {
            None
        };
        let meter = meters.meter("slo-probe");
        let iteration_seconds = meter
            .f64_histogram("slo_probe_iteration_seconds")
            .with_description("Wall time of each training iteration the CUPTI shim reported.")
            .with_unit("s")
            .with_boundaries(ITERATION_BOUNDS.to_vec())
            .build();
        Ok(Self {
            meters,
            meter,
            tracer,
            points: Arc::default(),
            instruments: HashSet::new(),
            iteration_seconds,
        })
    }

    /// Replaces what the instruments report; registers the families seen for the first time.
    fn publish(&mut self, families: &HashMap<String, Family>, points: HashMap<String, Vec<Point>>) {
        for name in points.keys() {
            if self.instruments.contains(name) {
                continue;
            }
            let Some(f) = families.get(name) else {
                continue;
            };
            let shared = self.points.clone();
            let key = name.clone();
            let callback = move |o: &dyn opentelemetry::metrics::AsyncInstrument<f64>| {
                if let Ok(p) = shared.lock() {
                    for pt in p.get(&key).into_iter().flatten() {
                        o.observe(pt.value, &pt.attrs);
                    }
                }
            };
            match f.kind {
                Kind::Gauge => {
                    self.meter
                        .f64_observable_gauge(name.clone())
                        .with_description(f.help.clone())
                        .with_unit(unit_of(name))
                        .with_callback(callback)
                        .build();
                }
                Kind::Counter => {
                    self.meter
                        .f64_observable_counter(name.clone())
                        .with_description(f.help.clone())
                        .with_unit(unit_of(name))
                        .with_callback(callback)
                        .build();
                }
            }
            self.instruments.insert(name.clone());
        }
        if let Ok(mut p) = self.points.lock() {
            *p = points;
        }
    }

    /// Flushes and stops both providers (blocking a few seconds at most: a span batch still
    /// retrying for a receiver that is down is given up).
    fn shutdown(self, timeout: Duration) {
        let _ = self.meters.shutdown_with_timeout(timeout);
        if let Some(t) = self.tracer {
            let _ = t.shutdown_with_timeout(timeout);
        }
    }
}

/// The timeout and, when the config names one, the endpoint (over HTTP with the signal's path
/// appended, as the variables' base endpoint gets it); otherwise the SDK reads
/// `OTEL_EXPORTER_OTLP_*ENDPOINT`.
fn configure<B: opentelemetry_otlp::WithExportConfig>(
    b: B,
    cfg: &Settings,
    timeout: Duration,
    http_path: Option<&str>,
) -> B {
    let b = b.with_timeout(timeout);
    match (&cfg.endpoint, http_path) {
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

/// The exporter's settings, resolved.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Transport.
    pub transport: Transport,
    /// Base endpoint (`None`: `OTEL_EXPORTER_OTLP_*ENDPOINT`, then the transport's default on
    /// localhost).
    pub endpoint: Option<String>,
    /// Metric export period.
    pub interval: Duration,
    /// Export timeout.
    pub timeout: Duration,
    /// Whether violations go out as traces.
    pub traces: bool,
}

impl Settings {
    /// From the config section and the standard environment variables; `Ok(None)` when OTLP is
    /// off.
    pub fn resolve(c: &OtlpConfig) -> Result<Option<Self>, String> {
        let env_endpoint = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.is_empty()));
        let on = c.enabled.unwrap_or(env_endpoint || !c.endpoint.is_empty());
        if !on {
            return Ok(None);
        }
        let interval = if c.interval_ms > 0 {
            Duration::from_millis(c.interval_ms)
        } else {
            std::env::var("OTEL_METRIC_EXPORT_INTERVAL")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis)
                .unwrap_or(Duration::from_secs(10))
        };
        let timeout = if c.timeout_ms > 0 {
            Duration::from_millis(c.timeout_ms)
        } else {
            std::env::var("OTEL_EXPORTER_OTLP_TIMEOUT")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis)
                .unwrap_or(Duration::from_secs(10))
        };
        Ok(Some(Self {
            transport: Transport::resolve(&c.protocol)?,
            endpoint: (!c.endpoint.is_empty()).then(|| c.endpoint.clone()),
            interval,
            timeout,
            traces: c.traces,
        }))
    }
}

/// The node's resource attributes: service, host, and the agent's own Kubernetes pod and node
/// (downward API: `K8S_POD_NAME`, `K8S_NAMESPACE`, `K8S_NODE_NAME`). `OTEL_RESOURCE_ATTRIBUTES`
/// and `OTEL_SERVICE_NAME` are read by the SDK and win over the service name given here.
fn node_attributes() -> Vec<KeyValue> {
    let host = crate::sources::procfs::hostname();
    let mut a = vec![
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", host.clone()),
        KeyValue::new("host.name", host),
    ];
    if let Ok(id) = std::fs::read_to_string("/etc/machine-id") {
        if !id.trim().is_empty() {
            a.push(KeyValue::new("host.id", id.trim().to_owned()));
        }
    }
    for (var, key) in [
        ("K8S_NODE_NAME", "k8s.node.name"),
        ("K8S_POD_NAME", "k8s.pod.name"),
        ("K8S_NAMESPACE", "k8s.namespace.name"),
    ] {
        if let Ok(v) = std::env::var(var) {
            if !v.is_empty() {
                a.push(KeyValue::new(key, v));
            }
        }
    }
    a
}

fn resource(attrs: Vec<KeyValue>) -> Resource {
    let env_names_service = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|s| !s.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|s| s.contains("service.name="));
    let mut b = Resource::builder();
    if !env_names_service {
        b = b.with_service_name("slo-probe");
    }
    b.with_attributes(attrs).build()
}

/// What a training process is, for its resource: from the shim, NVML and its `/proc` entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcIdentity {
    /// Job id.
    pub job_id: Option<String>,
    /// Rank.
    pub rank: Option<u32>,
    /// UUID of the GPU it runs on.
    pub gpu_uuid: Option<String>,
    /// Executable name (`comm`).
    pub comm: Option<String>,
    /// Kubernetes pod UID (from its cgroup path).
    pub pod_uid: Option<String>,
    /// Kubernetes pod name (its `HOSTNAME` when `KUBERNETES_SERVICE_HOST` is set).
    pub pod_name: Option<String>,
    /// Kubernetes namespace (`POD_NAMESPACE` / `K8S_NAMESPACE` in its environment).
    pub namespace: Option<String>,
}

impl ProcIdentity {
    fn attributes(&self, pid: u32) -> Vec<KeyValue> {
        let mut a = vec![KeyValue::new("process.pid", i64::from(pid))];
        let mut opt = |k: &'static str, v: &Option<String>| {
            if let Some(v) = v {
                a.push(KeyValue::new(k, v.clone()));
            }
        };
        opt("process.executable.name", &self.comm);
        opt("slo_probe.job.id", &self.job_id);
        opt("hw.id", &self.gpu_uuid);
        opt("k8s.pod.uid", &self.pod_uid);
        opt("k8s.pod.name", &self.pod_name);
        opt("k8s.namespace.name", &self.namespace);
        if let Some(r) = self.rank {
            a.push(KeyValue::new("slo_probe.rank", i64::from(r)));
        }
        if self.gpu_uuid.is_some() {
            a.push(KeyValue::new("hw.type", "gpu"));
        }
        a
    }
}

/// The pod UID in a cgroup path: `…/pod<uid>/…` (cgroupfs driver) or
/// `…-pod<uid with _>.slice/…` (systemd driver).
pub fn pod_uid_of_cgroup(path: &str) -> Option<String> {
    path.split('/').find_map(|seg| {
        let i = seg.rfind("pod")?;
        let rest = seg[i + 3..].trim_end_matches(".slice");
        let uid = rest.replace('_', "-");
        (uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then_some(uid)
    })
}

/// Reads what `/proc/<pid>` says about a training process's pod.
fn proc_identity(p: &ProcessSnapshot, gpus: Option<&GpuSnapshot>) -> ProcIdentity {
    let pid = p.pid;
    let comm = crate::sources::procfs::stat(pid).map(|i| i.name);
    let pod_uid = crate::sources::procfs::cgroups(pid)
        .iter()
        .find_map(|l| pod_uid_of_cgroup(&l.path));
    let environ = crate::sources::procfs::Environ::of(pid);
    let env = |name: &str| environ.get(name);
    let in_k8s = env("KUBERNETES_SERVICE_HOST").is_some();
    let gpu_uuid = p
        .iterations
        .iter()
        .rev()
        .find_map(|i| i.gpu.as_ref().map(|g| g.index))
        .and_then(|idx| {
            gpus?
                .devices
                .iter()
                .find(|g| g.index == idx)
                .map(|g| g.uuid.clone())
        });
    ProcIdentity {
        job_id: p.job_id.clone(),
        rank: p.rank,
        gpu_uuid,
        comm,
        pod_uid,
        pod_name: if in_k8s { env("HOSTNAME") } else { None },
        namespace: env("POD_NAMESPACE").or_else(|| env("K8S_NAMESPACE")),
    }
}

/// A training process being exported.
struct Proc {
    target: Target,
    identity: ProcIdentity,
    last_iteration_end_ns: u64,
    violations_sent: HashSet<u64>,
    last_seen_ns: u64,
}

/// The OTLP exporter: fed every snapshot by the agent.
pub struct OtlpExporter {
    settings: Settings,
    node: Target,
    procs: HashMap<u32, Proc>,
    last_publish_ns: u64,
    retention_ns: u64,
}

impl OtlpExporter {
    /// Builds the node's providers. Must run inside the Tokio runtime (the gRPC channel lives
    /// there); connecting is lazy, so a receiver that is not up yet is no error.
    pub fn new(settings: Settings, retention: Duration) -> Result<Self, String> {
        let node = Target::new(&settings, resource(node_attributes()))?;
        log::info!(
            "OTLP export on ({:?}, {}, every {} ms)",
            settings.transport,
            settings
                .endpoint
                .as_deref()
                .unwrap_or("endpoint from OTEL_EXPORTER_OTLP_*"),
            settings.interval.as_millis()
        );
        Ok(Self {
            settings,
            node,
            procs: HashMap::new(),
            last_publish_ns: 0,
            retention_ns: retention.as_nanos() as u64,
        })
    }

    /// Takes a snapshot: new iterations into the histogram and violations as spans at once; the
    /// metric families are re-read at most four times per export period.
    pub fn update(&mut self, snap: &Snapshot) {
        let now = snap.taken_at_ns;

        for p in &snap.processes {
            if !self.procs.contains_key(&p.pid) {
                let identity = proc_identity(p, snap.gpus.as_ref());
                let mut attrs = node_attributes();
                attrs.extend(identity.attributes(p.pid));
                match Target::new(&self.settings, resource(attrs)) {
                    Ok(target) => {
                        self.procs.insert(
                            p.pid,
                            Proc {
                                target,
                                identity,
                                last_iteration_end_ns: 0,
                                violations_sent: HashSet::new(),
                                last_seen_ns: now,
                            },
                        );
                    }
                    Err(e) => {
                        log::warn!("OTLP: process {}: {e}", p.pid);
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
                // Once per violation: when it has its attribution, or when it closes.
                let ready = v.attribution.is_some() || v.closed_ns.is_some();
                if ready && proc.violations_sent.insert(v.id) {
                    send_violation(tracer, p, &proc.identity, v, now);
                    log::info!(
                        "OTLP: violation {} of process {} ({}) queued as a trace",
                        v.id,
                        p.pid,
                        v.node
                    );
                }
            }
        }
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
        let every = self.settings.interval.as_nanos() as u64 / 4;
        if self.last_publish_ns == 0 || now.saturating_sub(self.last_publish_ns) >= every {
            self.last_publish_ns = now;
            // Per-thread series stay Prometheus-only (they are the unbounded share).
            let text = super::prometheus::render(snap, false);
            let pids: HashSet<u32> = self.procs.keys().copied().collect();
            let (mut families, mut points) = parse_exposition(&text, &pids);
            if let Some(node) = points.get_mut(&None) {
                add_semconv(&mut families, node);
            }
            self.node
                .publish(&families, points.remove(&None).unwrap_or_default());
            for (pid, p) in &mut self.procs {
                p.target
                    .publish(&families, points.remove(&Some(*pid)).unwrap_or_default());
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
}

/// Feeds the exporter every snapshot until shutdown, then flushes (a final export, bounded by
/// the export timeout).
pub async fn run(
    mut exporter: OtlpExporter,
    mut snapshots: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break;
                }
                let snap = snapshots.borrow_and_update().clone();
                exporter.update(&snap);
            }
            _ = shutdown.changed() => break,
        }
    }
    let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
}

/// CLOCK_MONOTONIC ns → wall clock.
fn wall(mono_ns: u64, now_mono_ns: u64) -> SystemTime {
    let now = SystemTime::now();
    let ago = Duration::from_nanos(now_mono_ns.saturating_sub(mono_ns));
    now.checked_sub(ago).unwrap_or(UNIX_EPOCH)
}

/// One span per violation, a child per attributed operator and per host cause.
fn send_violation(
    tracer: &SdkTracerProvider,
    p: &ProcessSnapshot,
    id: &ProcIdentity,
    v: &Violation,
    now_mono: u64,
) {
    let tracer = tracer.tracer("slo-probe");
    let start = wall(v.since_ns, now_mono);
    let end = wall(v.closed_ns.unwrap_or(now_mono), now_mono);
    let mut attrs = vec![
        KeyValue::new("slo.node", v.node.clone()),
        KeyValue::new("slo.metric", v.metric.as_str()),
        KeyValue::new("slo.stat", v.stat.as_str()),
        KeyValue::new("slo.severity", v.severity.as_str()),
        KeyValue::new("slo.value", v.value),
        KeyValue::new("slo.threshold", v.threshold),
        KeyValue::new("slo.violation.id", v.id as i64),
        KeyValue::new("slo.violation.closed", v.closed_ns.is_some()),
        KeyValue::new("slo.chain", v.chain.clone()),
        KeyValue::new("process.pid", i64::from(p.pid)),
    ];
    if let Some(b) = v.baseline {
        attrs.push(KeyValue::new("slo.baseline", b));
    }
    if let Some(j) = &id.job_id {
        attrs.push(KeyValue::new("slo_probe.job.id", j.clone()));
    }
    if let Some(r) = id.rank {
        attrs.push(KeyValue::new("slo_probe.rank", i64::from(r)));
    }
    let parent = tracer
        .span_builder(format!("SLO violation: {}", v.node))
        .with_kind(SpanKind::Internal)
        .with_start_time(start)
        .with_attributes(attrs)
        .start(&tracer);
    let cx = Context::new().with_remote_span_context(parent.span_context().clone());
    if let Some(a) = &v.attribution {
        child_spans(&tracer, &cx, a, start, end);
    }
    let mut parent = parent;
    parent.set_status(Status::error(v.chain.clone()));
    parent.end_with_timestamp(end);
}

fn child_spans(
    tracer: &opentelemetry_sdk::trace::SdkTracer,
    cx: &Context,
    a: &Attribution,
    start: SystemTime,
    end: SystemTime,
) {
    for (i, c) in a.causes.iter().enumerate() {
        let mut s = tracer
            .span_builder(format!("operator: {}", c.op))
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes([
                KeyValue::new("slo.cause.rank", i as i64 + 1),
                KeyValue::new("slo.cause.op", c.op.clone()),
                KeyValue::new("slo.cause.dimension", c.dimension.as_str()),
                KeyValue::new("slo.cause.delta_ms", c.delta_ns / 1e6),
                KeyValue::new("slo.cause.gpu_ms_before", c.gpu_ns.0 / 1e6),
                KeyValue::new("slo.cause.gpu_ms_now", c.gpu_ns.1 / 1e6),
                KeyValue::new("slo.cause.detail", c.detail.clone()),
            ])
            .start_with_context(tracer, cx);
        s.end_with_timestamp(end);
    }
    for (i, h) in a.host.iter().enumerate() {
        let mut s = tracer
            .span_builder(format!("host: {}", h.what))
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes([
                KeyValue::new("slo.cause.rank", i as i64 + 1),
                KeyValue::new("slo.cause.host", h.what.clone()),
                KeyValue::new("slo.cause.delta", h.delta),
            ])
            .start_with_context(tracer, cx);
        s.end_with_timestamp(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse_with_escapes() {
        let (name, labels, v) =
            parse_sample(r#"slo_probe_x{pid="7",op="a\"b\\c",e=""} 1.5"#).expect("parses");
        assert_eq!(name, "slo_probe_x");
        assert_eq!(
            labels,
            vec![
                ("pid".into(), "7".into()),
                ("op".into(), "a\"b\\c".into()),
                ("e".into(), String::new())
            ]
        );
        assert_eq!(v, 1.5);
        assert_eq!(
            parse_sample("slo_probe_y 3"),
            Some(("slo_probe_y", vec![], 3.0))
        );
        assert_eq!(parse_sample("slo_probe_y{a=\"1\"} nope"), None);
    }

    #[test]
    fn exposition_splits_by_process_and_skips_threads_and_buckets() {
        let text = "# HELP slo_probe_a_total A.\n# TYPE slo_probe_a_total counter\n\
                    slo_probe_a_total{pid=\"7\",role=\"main\"} 3\n\
                    slo_probe_a_total{pid=\"8\",role=\"main\"} 4\n\
                    # HELP slo_probe_h_seconds H.\n# TYPE slo_probe_h_seconds histogram\n\
                    slo_probe_h_seconds_bucket{pid=\"7\",le=\"0.1\"} 1\n\
                    slo_probe_h_seconds_sum{pid=\"7\"} 0.05\n\
                    slo_probe_h_seconds_count{pid=\"7\"} 1\n\
                    # HELP slo_probe_thread_x_seconds T.\n# TYPE slo_probe_thread_x_seconds gauge\n\
                    slo_probe_thread_x_seconds{pid=\"7\",tid=\"9\"} 1\n\
                    # HELP slo_probe_g_ratio G.\n# TYPE slo_probe_g_ratio gauge\n\
                    slo_probe_g_ratio 0.5\n";
        let procs: HashSet<u32> = [7].into();
        let (families, points) = parse_exposition(text, &procs);
        assert_eq!(families["slo_probe_a_total"].kind, Kind::Counter);
        assert_eq!(families["slo_probe_h_seconds_sum"].kind, Kind::Counter);
        assert_eq!(families["slo_probe_h_seconds_count"].help, "H.");
        assert_eq!(families["slo_probe_g_ratio"].kind, Kind::Gauge);
        assert!(!families.contains_key("slo_probe_thread_x_seconds"));
        assert!(!families.contains_key("slo_probe_h_seconds_bucket"));
        // pid 7 is a shim process: its series go to its resource; pid 8 stays with the node.
        assert_eq!(points[&Some(7)]["slo_probe_a_total"][0].value, 3.0);
        assert_eq!(points[&None]["slo_probe_a_total"][0].value, 4.0);
        assert_eq!(points[&None]["slo_probe_g_ratio"][0].value, 0.5);
        assert_eq!(points[&Some(7)]["slo_probe_h_seconds_count"][0].value, 1.0);
    }

    #[test]
    fn semantic_convention_names_beside_the_prometheus_ones() {
        let text = "# HELP slo_probe_gpu_utilization_ratio U.\n\
                    # TYPE slo_probe_gpu_utilization_ratio gauge\n\
                    slo_probe_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-1\",name=\"NVIDIA H200\"} 0.9\n\
                    # HELP slo_probe_agent_cpu_seconds_total C.\n\
                    # TYPE slo_probe_agent_cpu_seconds_total counter\n\
                    slo_probe_agent_cpu_seconds_total 1.5\n";
        let (mut families, mut points) = parse_exposition(text, &HashSet::new());
        let node = points.get_mut(&None).expect("node");
        add_semconv(&mut families, node);
        let util = &node["hw.gpu.utilization"][0];
        assert_eq!(util.value, 0.9);
        assert_eq!(
            util.attrs,
            vec![
                KeyValue::new("hw.id", "GPU-1"),
                KeyValue::new("hw.name", "NVIDIA H200")
            ]
        );
        assert_eq!(families["process.cpu.time"].kind, Kind::Counter);
        assert_eq!(node["process.cpu.time"][0].value, 1.5);
        assert_eq!(unit_of("process.cpu.time"), "s");
        assert_eq!(unit_of("hw.gpu.memory.usage"), "By");
        // The Prometheus-named series stay.
        assert!(node.contains_key("slo_probe_gpu_utilization_ratio"));
        assert!(!node.contains_key("hw.power"));
    }

    #[test]
    fn units_follow_the_suffix() {
        assert_eq!(unit_of("slo_probe_offcpu_seconds_total"), "s");
        assert_eq!(unit_of("slo_probe_gpu_memory_used_bytes"), "By");
        assert_eq!(unit_of("slo_probe_gpu_utilization_ratio"), "1");
        assert_eq!(unit_of("slo_probe_runqueue_latency_seconds_count"), "1");
        assert_eq!(unit_of("slo_probe_runqueue_latency_seconds_sum"), "s");
        assert_eq!(
            unit_of("slo_probe_gpu_pcie_receive_bytes_per_second"),
            "By/s"
        );
    }

    #[test]
    fn pod_uid_from_both_cgroup_drivers() {
        assert_eq!(
            pod_uid_of_cgroup("/kubepods/burstable/pod8f1c2d3e-1111-2222-3333-444455556666/abc123")
                .as_deref(),
            Some("8f1c2d3e-1111-2222-3333-444455556666")
        );
        assert_eq!(
            pod_uid_of_cgroup(
                "/kubepods.slice/kubepods-burstable.slice/\
                 kubepods-burstable-pod8f1c2d3e_1111_2222_3333_444455556666.slice/cri-x.scope"
            )
            .as_deref(),
            Some("8f1c2d3e-1111-2222-3333-444455556666")
        );
        assert_eq!(pod_uid_of_cgroup("/user.slice/user-0.slice"), None);
    }

    #[test]
    fn transport_from_config_or_environment() {
        assert_eq!(Transport::resolve("grpc"), Ok(Transport::Grpc));
        assert_eq!(
            Transport::resolve("http/protobuf"),
            Ok(Transport::HttpProtobuf)
        );
        assert!(Transport::resolve("http/json").is_err());
    }
}
