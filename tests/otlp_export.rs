//! Plain tier: the agent's OTLP push, received by OTLP receivers in this test (gRPC through
//! tonic, HTTP/protobuf through hyper, both decoding with the OpenTelemetry protos). A python
//! process loads the real `libslo_probe_cupti.so` (no GPU: iterations from its step markers)
//! with a rank and a job id and slows from 20 to 45 ms steps; the agent (real binary, without
//! eBPF so that this tier needs no root) pushes its metrics, the violation's spans and its
//! healer's (shadow) audit events as log records.
//! Asserted: names, values and attributes, resources per process; and with the receiver down
//! the agent keeps serving, its memory stays bounded, and export resumes when it returns.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::{
        logs::v1::{
            logs_service_server::{LogsService, LogsServiceServer},
            ExportLogsServiceRequest, ExportLogsServiceResponse,
        },
        metrics::v1::{
            metrics_service_server::{MetricsService, MetricsServiceServer},
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        },
        trace::v1::{
            trace_service_server::{TraceService, TraceServiceServer},
            ExportTraceServiceRequest, ExportTraceServiceResponse,
        },
    },
    common::v1::{any_value::Value, KeyValue},
    logs::v1::LogRecord,
    metrics::v1::{metric::Data, number_data_point, Metric},
    resource::v1::Resource,
    trace::v1::Span,
};
use prost::Message as _;
use slo_probe_tests::{artefact, free_addr, http_get};

/// What a receiver got.
#[derive(Default)]
struct Received {
    metrics: Vec<ExportMetricsServiceRequest>,
    traces: Vec<ExportTraceServiceRequest>,
    logs: Vec<ExportLogsServiceRequest>,
}

type Shared = Arc<Mutex<Received>>;

struct Grpc(Shared);

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .metrics
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

struct GrpcTraces(Shared);

#[tonic::async_trait]
impl TraceService for GrpcTraces {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .traces
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

struct GrpcLogs(Shared);

#[tonic::async_trait]
impl LogsService for GrpcLogs {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .logs
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

/// A receiver on its own runtime; dropping it stops it (the port closes).
struct Receiver {
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Binds `addr` (port 0: any free one, no race with other tests for it) and returns the
/// address bound.
fn grpc_receiver(addr: SocketAddr, got: Shared) -> (Receiver, SocketAddr) {
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .expect("bind");
    let bound = listener.local_addr().expect("local addr");
    let (m, t, l) = (
        Grpc(got.clone()),
        GrpcTraces(got.clone()),
        GrpcLogs(got.clone()),
    );
    rt.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(m))
            .add_service(TraceServiceServer::new(t))
            .add_service(LogsServiceServer::new(l))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    (Receiver { rt: Some(rt) }, bound)
}

/// A receiver's address that takes any free port when bound (a port picked by binding and
/// closing first could be taken by another test's agent before the receiver binds it: seen in
/// CI as AddrInUse).
const ANY_PORT: &str = "127.0.0.1:0";

/// OTLP/HTTP with protobuf bodies: POST /v1/metrics, /v1/traces and /v1/logs.
/// Binds `addr` (port 0: any free one, no race with other tests for it) and returns the
/// address bound.
fn http_receiver(addr: SocketAddr, got: Shared) -> (Receiver, SocketAddr) {
    use http_body_util::{BodyExt as _, Full};
    use hyper::{body::Bytes, service::service_fn, Response};
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .expect("bind");
    let bound = listener.local_addr().expect("local addr");
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let got = got.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let got = got.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let body = req.into_body().collect().await?.to_bytes();
                        let reply = match path.as_str() {
                            "/v1/metrics" => {
                                let r = ExportMetricsServiceRequest::decode(body)
                                    .map_err(|e| std::io::Error::other(e.to_string()));
                                match r {
                                    Ok(r) => {
                                        got.lock()
                                            .unwrap_or_else(|e| e.into_inner())
                                            .metrics
                                            .push(r);
                                        Some(
                                            ExportMetricsServiceResponse::default().encode_to_vec(),
                                        )
                                    }
                                    Err(_) => None,
                                }
                            }
                            "/v1/traces" => match ExportTraceServiceRequest::decode(body) {
                                Ok(r) => {
                                    got.lock().unwrap_or_else(|e| e.into_inner()).traces.push(r);
                                    Some(ExportTraceServiceResponse::default().encode_to_vec())
                                }
                                Err(_) => None,
                            },
                            "/v1/logs" => match ExportLogsServiceRequest::decode(body) {
                                Ok(r) => {
                                    got.lock().unwrap_or_else(|e| e.into_inner()).logs.push(r);
                                    Some(ExportLogsServiceResponse::default().encode_to_vec())
                                }
                                Err(_) => None,
                            },
                            _ => None,
                        };
                        let resp = match reply {
                            Some(b) => Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::from(b))),
                            None => Response::builder()
                                .status(400)
                                .body(Full::new(Bytes::new())),
                        };
                        Ok::<_, hyper::Error>(resp.expect("response"))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (Receiver { rt: Some(rt) }, bound)
}

/// Kills its processes on the way out, whatever happens.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            // SAFETY: kill(2) on a pid we spawned.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for c in &mut self.0 {
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The agent (no eBPF), with the config given and extra environment, once it serves. The port
/// `free_addr` found free can be taken before the agent binds it (by an outgoing connection of
/// another test running beside this one: CI saw "Address already in use" once): an agent that
/// exits before it serves is started again on another port.
fn agent(dir: &Path, otlp: &str, env: &[(&str, String)]) -> (Child, SocketAddr) {
    for _ in 0..5 {
        let listen = free_addr();
        let mut child = agent_on(dir, otlp, env, listen);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break; // exited before it served: another port
            }
            if http_get(listen, "/metrics").is_ok_and(|(code, _)| code == 200)
                || Instant::now() >= deadline
            {
                return (child, listen);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("the agent exited before it served, on five ports in a row");
}

/// The agent (no eBPF) listening on `listen`, as started.
fn agent_on(dir: &Path, otlp: &str, env: &[(&str, String)], listen: SocketAddr) -> Child {
    let socket = dir.join("shim.sock");
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\ntick_ms = 200\n[shim]\nsocket = {socket:?}\n[gpu]\nnvml = false\n\
             [slo]\nwindow_ms = 500\nlearn_windows = 3\nwarmup_iterations = 5\n\
             [heal]\nmode = \"shadow\"\njournal = {:?}\njobs_dir = {:?}\n{otlp}\n",
            dir.join("heal.jsonl"),
            dir.join("jobs"),
        ),
    )
    .expect("config");
    let mut cmd = Command::new(artefact("slo-probe", "slo-probe"));
    cmd.args(["agent", "--no-ebpf", "--log-level", "warn", "--config"])
        .arg(&config)
        .args(["--listen", &listen.to_string()])
        .stdout(Stdio::null());
    for v in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_SERVICE_NAME",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("slo-probe agent")
}

/// A python training loop with the real shim: `fast` steps of 20 ms, then 45 ms ones.
fn job(dir: &Path, rank: u32, job: &str, fast: u32) -> Child {
    let script = format!(
        "import ctypes, time\n\
         lib = ctypes.PyDLL({lib:?})\n\
         lib.slo_probe_step_begin.argtypes = [ctypes.c_uint64]\n\
         lib.slo_probe_step_end.argtypes = [ctypes.c_uint64]\n\
         i = 0\n\
         while True:\n\
         \x20   lib.slo_probe_step_begin(i)\n\
         \x20   time.sleep(0.020 if i < {fast} else 0.045)\n\
         \x20   lib.slo_probe_step_end(i)\n\
         \x20   i += 1\n",
        lib = artefact("libslo_probe_cupti.so", "slo-probe-cupti")
            .display()
            .to_string(),
    );
    Command::new("python3")
        .args(["-c", &script])
        .env("SLO_PROBE_SOCKET", dir.join("shim.sock"))
        .env("RANK", rank.to_string())
        .env("SLO_PROBE_JOB", job)
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .expect("python3")
}

fn tempdir(tag: &str) -> PathBuf {
    slo_probe_tests::tempdir("otlp", tag)
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn attr_str(attrs: &[KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key)? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

/// Whether `resource` is the process `pid`'s.
fn of_process(resource: Option<&Resource>, pid: u32) -> bool {
    resource.is_some_and(|r| attr_str(&r.attributes, "process.pid") == Some(pid.to_string()))
}

/// The latest metric of a name per resource, with its resource's attributes.
fn metrics_named<'a>(got: &'a Received, name: &str) -> Vec<(&'a [KeyValue], &'a Metric)> {
    let mut out = Vec::new();
    for req in got.metrics.iter().rev() {
        for rm in &req.resource_metrics {
            let res = rm
                .resource
                .as_ref()
                .map(|r| r.attributes.as_slice())
                .unwrap_or(&[]);
            for sm in &rm.scope_metrics {
                for m in sm.metrics.iter().filter(|m| m.name == name) {
                    out.push((res, m));
                }
            }
        }
    }
    out
}

fn number(p: &opentelemetry_proto::tonic::metrics::v1::NumberDataPoint) -> f64 {
    match p.value {
        Some(number_data_point::Value::AsDouble(d)) => d,
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        None => f64::NAN,
    }
}

fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The whole check against one receiver: process resource, values, node resource, spans.
fn check_export(got: &Shared, pid: u32, rank: u32, job_id: &str) {
    // The process's SLO windows, under its own resource.
    let windows = wait_for("slo_probe_slo_windows_total of the process", 40, || {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        metrics_named(&g, "slo_probe_slo_windows_total")
            .into_iter()
            .find(|(res, _)| attr_str(res, "process.pid") == Some(pid.to_string()))
            .map(|(res, m)| (res.to_vec(), m.clone()))
    });
    let (res, m) = windows;
    assert_eq!(attr_str(&res, "slo_probe.job.id").as_deref(), Some(job_id));
    assert_eq!(attr_str(&res, "slo_probe.rank"), Some(rank.to_string()));
    assert_eq!(attr_str(&res, "service.name").as_deref(), Some("slo-probe"));
    assert!(attr_str(&res, "host.name").is_some_and(|h| !h.is_empty()));
    assert_eq!(
        attr_str(&res, "process.executable.name").as_deref(),
        Some("python3")
    );
    let Some(Data::Sum(sum)) = &m.data else {
        panic!("windows_total is not a sum: {m:?}")
    };
    assert!(sum.is_monotonic, "a counter is monotonic");
    let it = sum
        .data_points
        .iter()
        .find(|p| attr_str(&p.attributes, "node").as_deref() == Some("iteration"))
        .expect("the iteration node's windows");
    assert_eq!(attr_str(&it.attributes, "job_id").as_deref(), Some(job_id));
    assert_eq!(attr_str(&it.attributes, "rank"), Some(rank.to_string()));
    assert!(number(it) >= 1.0, "windows judged: {}", number(it));

    // Iteration times: a real histogram, 20 ms (then 45 ms) per step.
    let (count, total) = wait_for("slo_probe_iteration_seconds", 20, || {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        metrics_named(&g, "slo_probe_iteration_seconds")
            .into_iter()
            .filter(|(res, _)| attr_str(res, "process.pid") == Some(pid.to_string()))
            .find_map(|(_, m)| match &m.data {
                Some(Data::Histogram(h)) => h
                    .data_points
                    .iter()
                    .find(|p| p.count >= 50)
                    .map(|p| (p.count, p.sum.unwrap_or(0.0))),
                _ => None,
            })
    });
    let mean = total / count as f64;
    eprintln!(
        "iteration histogram: {count} iterations, mean {:.1} ms",
        mean * 1e3
    );
    assert!((0.018..0.050).contains(&mean), "mean iteration {mean} s");

    // The node's own series on the node's resource.
    let rss = wait_for("slo_probe_agent_resident_memory_bytes", 20, || {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        metrics_named(&g, "slo_probe_agent_resident_memory_bytes")
            .into_iter()
            .find_map(|(res, m)| match &m.data {
                Some(Data::Gauge(gg)) if attr_str(res, "process.pid").is_none() => {
                    gg.data_points.first().map(number)
                }
                _ => None,
            })
    });
    assert!((1e6..1e9).contains(&rss), "agent RSS {rss}");
    // The same under its semantic-convention name, with the unit the conventions give it.
    let (unit, semconv) = wait_for("process.memory.usage", 20, || {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        metrics_named(&g, "process.memory.usage")
            .into_iter()
            .find_map(|(res, m)| match &m.data {
                Some(Data::Gauge(gg)) if attr_str(res, "process.pid").is_none() => {
                    gg.data_points.first().map(|p| (m.unit.clone(), number(p)))
                }
                _ => None,
            })
    });
    assert_eq!(unit, "By");
    assert!(
        (1e6..1e9).contains(&semconv),
        "process.memory.usage {semconv}"
    );

    // One span per violation, with the attributed operator as a child span. On a loaded 2-core
    // machine a first violation can open on noise or on the first slow steps alone (seen in a
    // full run: +0.7 ms of data loading); the one of the slowdown has ~25 ms at rank 1.
    let delta_of = |children: &[Span]| -> Option<f64> {
        children
            .iter()
            .find(|c| attr_str(&c.attributes, "slo.cause.rank").as_deref() == Some("1"))
            .and_then(|c| attr_str(&c.attributes, "slo.cause.delta_ms"))
            .and_then(|v| v.parse().ok())
    };
    let mut seen: Vec<String> = Vec::new();
    let what = "a violation span with about 25 ms more per step at rank 1";
    let (parent, children) = wait_for(what, 60, || {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        let spans: Vec<Span> = g
            .traces
            .iter()
            .flat_map(|t| &t.resource_spans)
            .filter(|rs| of_process(rs.resource.as_ref(), pid))
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| ss.spans.iter().cloned())
            .collect();
        drop(g);
        let mut now_seen = Vec::new();
        let mut found = None;
        for parent in spans
            .iter()
            .filter(|s| s.name.starts_with("SLO violation: "))
        {
            let children: Vec<Span> = spans
                .iter()
                .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
                .cloned()
                .collect();
            let d = delta_of(&children);
            now_seen.push(format!("{} (top delta {d:?})", parent.name));
            if found.is_none() && d.is_some_and(|d| (15.0..35.0).contains(&d)) {
                found = Some((parent.clone(), children));
            }
        }
        if now_seen != seen {
            // What a timeout would leave unexplained.
            eprintln!("violation spans so far: {now_seen:?}");
            seen = now_seen;
        }
        found
    });
    eprintln!(
        "span {:?} ({}), children {:?}",
        parent.name,
        attr_str(&parent.attributes, "slo.chain").unwrap_or_default(),
        children.iter().map(|c| c.name.clone()).collect::<Vec<_>>()
    );
    assert!(parent.end_time_unix_nano > parent.start_time_unix_nano);
    assert!(attr_str(&parent.attributes, "slo.node").is_some());
    let threshold: f64 = attr_str(&parent.attributes, "slo.threshold")
        .and_then(|v| v.parse().ok())
        .expect("threshold");
    let value: f64 = attr_str(&parent.attributes, "slo.value")
        .and_then(|v| v.parse().ok())
        .expect("value");
    assert!(
        value > threshold,
        "a violation's value {value} breaks {threshold}"
    );
    let top = children
        .iter()
        .find(|c| attr_str(&c.attributes, "slo.cause.rank").as_deref() == Some("1"))
        .expect("the top cause");
    assert_eq!(top.name, "operator: (data loading)");
    let delta: f64 = attr_str(&top.attributes, "slo.cause.delta_ms")
        .and_then(|v| v.parse().ok())
        .expect("delta");
    assert!(
        (15.0..35.0).contains(&delta),
        "about 25 ms more per step: {delta}"
    );

    // The healer (shadow) audits the violation: each event a log record on the process's
    // resource, its sentence as the body, its fields as attributes.
    let logs = wait_for("the healer's audit events as log records", 30, || {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        let records: Vec<LogRecord> = g
            .logs
            .iter()
            .flat_map(|r| &r.resource_logs)
            .filter(|rl| of_process(rl.resource.as_ref(), pid))
            .flat_map(|rl| &rl.scope_logs)
            .flat_map(|sl| sl.log_records.iter().cloned())
            .collect();
        (!records.is_empty()).then_some(records)
    });
    let events: Vec<String> = logs
        .iter()
        .filter_map(|r| attr_str(&r.attributes, "slo_probe.heal.event"))
        .collect();
    eprintln!("healer log records: {events:?}");
    assert_eq!(events.len(), logs.len(), "every record names its event");
    for r in &logs {
        assert_eq!(
            attr_str(&r.attributes, "process.pid"),
            Some(pid.to_string())
        );
        assert!(r.time_unix_nano > 0 && r.severity_number > 0, "{r:?}");
        let body = match r.body.as_ref().and_then(|b| b.value.as_ref()) {
            Some(Value::StringValue(s)) => s.clone(),
            other => panic!("body {other:?}"),
        };
        assert!(body.starts_with(&format!("job {pid}: ")), "{body}");
    }
}

#[test]
fn otlp_over_grpc_from_the_config() {
    let dir = tempdir("grpc");
    let got = Shared::default();
    let (_rx, addr) = grpc_receiver(ANY_PORT.parse().expect("addr"), got.clone());
    let (a, _) = agent(
        &dir,
        &format!("[otlp]\nprotocol = \"grpc\"\nendpoint = \"http://{addr}\"\ninterval_ms = 500\n"),
        &[],
    );
    let mut procs = Procs(vec![a]);
    std::thread::sleep(Duration::from_millis(500));
    let j = job(&dir, 1, "otlp-grpc", 160);
    let pid = j.id();
    procs.0.push(j);
    check_export(&got, pid, 1, "otlp-grpc");
}

#[test]
fn otlp_over_http_from_the_environment() {
    let dir = tempdir("http");
    let got = Shared::default();
    let (_rx, addr) = http_receiver(ANY_PORT.parse().expect("addr"), got.clone());
    let (a, _) = agent(
        &dir,
        "[otlp]\ninterval_ms = 500\n",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=ci".into(),
            ),
        ],
    );
    let mut procs = Procs(vec![a]);
    std::thread::sleep(Duration::from_millis(500));
    let j = job(&dir, 2, "otlp-http", 160);
    let pid = j.id();
    procs.0.push(j);
    check_export(&got, pid, 2, "otlp-http");
    // OTEL_RESOURCE_ATTRIBUTES reaches every resource.
    let g = got.lock().unwrap_or_else(|e| e.into_inner());
    let res = &g.metrics.last().expect("metrics").resource_metrics[0];
    let attrs = &res.resource.as_ref().expect("resource").attributes;
    assert_eq!(
        attr_str(attrs, "deployment.environment").as_deref(),
        Some("ci")
    );
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn scrape(addr: SocketAddr) -> Option<String> {
    match http_get(addr, "/metrics") {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}

fn ticks(text: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with("slo_probe_agent_ticks_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn receiver_down_then_back() {
    let dir = tempdir("down");
    let addr = free_addr();
    // Nothing listens on addr yet: every export fails (connection refused, then timeouts).
    let (a, listen) = agent(
        &dir,
        &format!(
            "[otlp]\nprotocol = \"grpc\"\nendpoint = \"http://{addr}\"\ninterval_ms = 200\n\
             timeout_ms = 500\n"
        ),
        &[],
    );
    let agent_pid = a.id();
    let mut procs = Procs(vec![a]);
    std::thread::sleep(Duration::from_millis(500));
    // A violation within the outage: its spans queue (bounded) while nobody receives.
    let j = job(&dir, 0, "otlp-down", 160);
    let pid = j.id();
    procs.0.push(j);
    std::thread::sleep(Duration::from_secs(4));
    let rss_early = rss_kib(agent_pid);
    let ticks_early = scrape(listen).as_deref().and_then(ticks).expect("serving");
    std::thread::sleep(Duration::from_secs(16));
    let rss_late = rss_kib(agent_pid);
    let ticks_late = scrape(listen)
        .as_deref()
        .and_then(ticks)
        .expect("still serving");
    eprintln!(
        "receiver down 20 s: agent RSS {rss_early} KiB at 4 s, {rss_late} KiB at 20 s; ticks \
         {ticks_early} -> {ticks_late}"
    );
    assert!(ticks_late >= ticks_early + 50.0, "the agent kept ticking");
    assert!(
        rss_late < rss_early + 16 * 1024,
        "memory bounded while the receiver is down: {rss_early} -> {rss_late} KiB"
    );
    // The receiver comes back on the same address: export resumes, the process's series and
    // the violation's span (queued or new) arrive.
    let got = Shared::default();
    let t0 = Instant::now();
    let (_rx, _) = grpc_receiver(addr, got.clone());
    let n = wait_for("export to resume", 30, || {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        let n = metrics_named(&g, "slo_probe_slo_windows_total")
            .into_iter()
            .filter(|(res, _)| attr_str(res, "process.pid") == Some(pid.to_string()))
            .count();
        (n > 0).then_some(n)
    });
    eprintln!(
        "export resumed {:.1} s after the receiver came back ({n} exports of the process)",
        t0.elapsed().as_secs_f64()
    );
    // The violation opened during the outage: its span was retried and arrives now.
    let name = wait_for("the outage's violation span", 30, || {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        g.traces
            .iter()
            .flat_map(|t| &t.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
            .find(|s| s.name.starts_with("SLO violation: "))
            .map(|s| s.name.clone())
    });
    let counts: HashMap<&str, usize> = {
        let g = got.lock().unwrap_or_else(|e| e.into_inner());
        [("metrics", g.metrics.len()), ("traces", g.traces.len())].into()
    };
    eprintln!(
        "received after the outage: {counts:?}, the violation span {name:?} {:.1} s after the \
         receiver came back",
        t0.elapsed().as_secs_f64()
    );
}
