//! Root tier: the agent's Prometheus export through a real Prometheus, and every query of the
//! Grafana dashboards (`dashboards/*.json`) against it.
//!
//! The test starts the real `slo-probe agent` (eBPF, whole node) with short SLO windows, a real
//! workload (python loading the real CUPTI shim `libslo_probe_cupti.so`, rank 0 of job
//! `ci-job`, with a `pt_data_worker` thread doing CPU work and a `pt_nccl` thread doing loopback
//! TCP; steps of 20 ms, then 45 ms, then 20 ms again), and Debian's `/usr/bin/prometheus`
//! scraping the agent every second. The rules of `collector-config/rules/` are loaded where they
//! exist, and the `/metrics` text of an agent recorded on an H200 during a real training run
//! (`tests/fixtures/prometheus/h200.prom`) is served to Prometheus as a second target where it
//! exists: the GPU families come only from there on a machine without a GPU.
//!
//! It waits until the SLO engine has learned its baseline and opened a violation, checks the
//! values, then runs every panel and variable query of every dashboard and fails listing each
//! query that is invalid or returns no series. Queries of GPU families (`slo_probe_gpu_*`) need
//! the H200 fixture, queries of recording rules (names with a colon) the rule files; without
//! them they are run (and must be valid PromQL) but may be empty.
//!
//! `cargo test -p slo-probe-tests --test prometheus_export -- --nocapture` prints the table.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{Read, Write},
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use slo_probe_tests::{artefact, free_addr, http_get};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const JOB: &str = "ci-job";
/// What the test substitutes for Grafana's `$__rate_interval` (4 scrape intervals and more).
const RATE_INTERVAL: &str = "10s";

/// The workload: the real shim, step markers, a loader thread and a communication thread.
const WORKLOAD: &str = r#"
import ctypes, hashlib, os, socket, sys, threading, time
lib = ctypes.PyDLL(sys.argv[1])
lib.slo_probe_step_begin.argtypes = [ctypes.c_uint64]
lib.slo_probe_step_end.argtypes = [ctypes.c_uint64]
libc = ctypes.CDLL(None, use_errno=True)

def name(n):
    libc.prctl(15, n.encode(), 0, 0, 0)  # PR_SET_NAME: the thread's comm, which roles match

def data_worker():
    name("pt_data_worker")
    buf = os.urandom(1 << 20)
    while True:
        for _ in range(2):
            hashlib.sha256(buf).digest()  # releases the GIL on large buffers
        time.sleep(0.002)

def nccl():
    name("pt_nccl")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    tx = socket.create_connection(srv.getsockname())
    rx, _ = srv.accept()
    chunk = b"g" * 16384
    while True:
        tx.sendall(chunk)
        got = 0
        while got < len(chunk):
            got += len(rx.recv(len(chunk) - got))
        time.sleep(0.005)

for f in (data_worker, nccl):
    threading.Thread(target=f, daemon=True).start()

step = 0
def steps(n, seconds):
    global step
    for _ in range(n):
        lib.slo_probe_step_begin(step)
        time.sleep(seconds)
        lib.slo_probe_step_end(step)
        step += 1

print("workload: 20 ms steps", flush=True)
steps(150, 0.020)
print("workload: 45 ms steps", flush=True)
steps(120, 0.045)
print("workload: 20 ms steps again", flush=True)
steps(1_000_000, 0.020)
"#;

/// Everything the test started; stopped and removed when dropped, also on a failed assertion.
struct Guard {
    dir: PathBuf,
    children: Vec<(&'static str, Child)>,
    stop_fixture: Arc<AtomicBool>,
    fixture: Vec<thread::JoinHandle<()>>,
}

impl Guard {
    fn spawn(&mut self, what: &'static str, cmd: &mut Command) -> u32 {
        let log = |suffix: &str| {
            std::fs::File::create(self.dir.join(format!("{what}.{suffix}"))).expect("log file")
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log("out"))
            .stderr(log("err"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let pid = child.id();
        self.children.push((what, child));
        pid
    }

    /// Fails with the child's log if it exited.
    fn check_alive(&mut self, what: &str) {
        for (name, child) in &mut self.children {
            if *name == what {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("{what} exited ({status}):\n{}", self.log(what));
                }
            }
        }
    }

    fn log(&self, what: &str) -> String {
        let mut s = String::new();
        for suffix in ["out", "err"] {
            let text = std::fs::read_to_string(self.dir.join(format!("{what}.{suffix}")))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            for l in tail.into_iter().rev() {
                let _ = writeln!(s, "  {what}.{suffix}: {l}");
            }
        }
        s
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SIGTERM first (the agent detaches its programs on it), SIGKILL after 5 s.
        for (_, child) in &self.children {
            // SAFETY: kill has no memory preconditions; the pid is our own child, not reaped yet.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (what, child) in &mut self.children {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        eprintln!("{what} did not stop on SIGTERM: killed");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        self.stop_fixture.store(true, Ordering::Relaxed);
        for t in self.fixture.drain(..) {
            let _ = t.join();
        }
        if thread::panicking() {
            eprintln!("logs and Prometheus data kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn wait_http(addr: SocketAddr, path: &str, what: &str, guard: &mut Guard, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok((200, _)) = http_get(addr, path) {
            return;
        }
        guard.check_alive(what);
        assert!(
            Instant::now() < deadline,
            "{what} not answering http://{addr}{path} within {within:?}:\n{}",
            guard.log(what)
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// Serves one file as /metrics (any path) until `stop`.
fn serve_file(text: String, stop: Arc<AtomicBool>) -> (SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind fixture server");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    let handle = thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut req = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = write!(
                        s,
                        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; \
                         charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    );
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    (addr, handle)
}

/// Prometheus' HTTP API.
struct Prom {
    addr: SocketAddr,
}

impl Prom {
    fn api(&self, path: &str) -> Result<Vec<Value>, String> {
        let (status, body) = http_get(self.addr, path).map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!(
                "{status}: {}: {}",
                v["errorType"].as_str().unwrap_or(""),
                v["error"].as_str().unwrap_or(&body)
            ));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    fn query(&self, q: &str) -> Result<Vec<Value>, String> {
        self.api(&format!("/api/v1/query?query={}", percent_encode(q)))
    }

    fn query_range(&self, q: &str, start: f64, end: f64, step: f64) -> Result<Vec<Value>, String> {
        self.api(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
            percent_encode(q)
        ))
    }

    /// The value of each series of an instant query.
    fn values(&self, q: &str) -> Vec<(Value, f64)> {
        self.query(q)
            .unwrap_or_else(|e| panic!("{q}: {e}"))
            .into_iter()
            .map(|r| {
                let v = r["value"][1]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(f64::NAN);
                (r["metric"].clone(), v)
            })
            .collect()
    }
}

/// A query of a dashboard.
struct DashQuery {
    dashboard: String,
    what: String,
    expr: String,
    instant: bool,
}

/// Every panel target and variable query of a dashboard.
fn dashboard_queries(file: &Path) -> Vec<DashQuery> {
    let text = std::fs::read_to_string(file).expect("read dashboard");
    let d: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("?")
        .trim_end_matches(".json")
        .to_owned();
    assert_eq!(d["schemaVersion"], 39, "{name}: schemaVersion");
    let mut out = Vec::new();
    for var in d["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] != "query" {
            continue;
        }
        let q = var["query"]["query"]
            .as_str()
            .or(var["query"].as_str())
            .unwrap_or_else(|| panic!("{name}: variable {} without a query", var["name"]));
        out.push(DashQuery {
            dashboard: name.clone(),
            what: format!("${}", var["name"].as_str().unwrap_or("?")),
            expr: label_values_to_promql(q),
            instant: true,
        });
    }
    fn walk(panels: &Value, name: &str, out: &mut Vec<DashQuery>) {
        for p in panels.as_array().into_iter().flatten() {
            walk(&p["panels"], name, out);
            for t in p["targets"].as_array().into_iter().flatten() {
                let Some(expr) = t["expr"].as_str().filter(|e| !e.trim().is_empty()) else {
                    continue;
                };
                out.push(DashQuery {
                    dashboard: name.to_owned(),
                    what: format!(
                        "{} [{}]",
                        p["title"].as_str().unwrap_or("?"),
                        t["refId"].as_str().unwrap_or("?")
                    ),
                    expr: expr.to_owned(),
                    instant: t["instant"] == true && t["range"] != true,
                });
            }
        }
    }
    walk(&d["panels"], &name, &mut out);
    out
}

/// Grafana's `label_values(selector, label)` as the PromQL that lists the values.
fn label_values_to_promql(q: &str) -> String {
    let q = q.trim();
    let Some(inner) = q
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
    else {
        return q.to_owned();
    };
    match inner.rsplit_once(',') {
        Some((selector, label)) => format!("count by ({}) ({})", label.trim(), selector.trim()),
        None => format!(
            "count by ({}) ({{__name__=~\"slo_probe_.+\"}})",
            inner.trim()
        ),
    }
}

/// Replaces `$name` and `${name}` with the values of `vars`.
fn substitute(expr: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').unwrap_or(braced.len());
            (&braced[..end], end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        match vars.get(name) {
            Some(v) => out.push_str(v),
            None => panic!("unknown Grafana variable ${name} in {expr}"),
        }
        rest = &rest[i + 1 + len..];
    }
    out.push_str(rest);
    out
}

#[test]
fn dashboards_get_data_from_a_real_prometheus() {
    if !slo_probe_tests::root_or_skip("prometheus_export") {
        return;
    }
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} missing: scripts/setup installs Debian's prometheus"
    );
    let started = Instant::now();
    let root = repo_root();
    let agent_bin = artefact("slo-probe", "slo-probe");
    let shim = artefact("libslo_probe_cupti.so", "slo-probe-cupti");
    let dir = std::env::temp_dir().join(format!("slo-probe-prom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut guard = Guard {
        dir: dir.clone(),
        children: Vec::new(),
        stop_fixture: Arc::new(AtomicBool::new(false)),
        fixture: Vec::new(),
    };

    // The agent: whole node, short ticks and SLO windows.
    let agent_addr: SocketAddr = free_addr();
    let socket = dir.join("shim.sock");
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\ntick_ms = 500\n\n\
             [prometheus]\n# The dashboards use no per-thread family; keep the scrapes small.\n\
             per_thread = false\n\n\
             [shim]\nsocket = {:?}\n\n\
             [slo]\nwindow_ms = 500\nlearn_windows = 3\nwarmup_iterations = 5\n\n\
             # The healer in shadow (the default), journalling here: its families for the\n\
             # dashboards' healer row.\n\
             [heal]\nmode = \"shadow\"\njournal = {:?}\njobs_dir = {:?}\n",
            socket.display().to_string(),
            dir.join("heal.jsonl").display().to_string(),
            dir.join("jobs").display().to_string(),
        ),
    )
    .expect("write config");
    guard.spawn(
        "agent",
        Command::new(&agent_bin).args([
            "agent",
            "--config",
            config.to_str().expect("utf-8 path"),
            "--listen",
            &agent_addr.to_string(),
        ]),
    );
    wait_http(
        agent_addr,
        "/metrics",
        "agent",
        &mut guard,
        Duration::from_secs(30),
    );

    // The H200 recording, where the main session has added it.
    let h200 = root.join("tests/fixtures/prometheus/h200.prom");
    let h200_addr = if h200.exists() {
        let text = std::fs::read_to_string(&h200).expect("read h200.prom");
        let (addr, handle) = serve_file(text, guard.stop_fixture.clone());
        guard.fixture.push(handle);
        Some(addr)
    } else {
        None
    };
    // Two DDP ranks sharing the H200 (gloo), rank 1's CPUs contended: recorded by
    // scripts/gpu-multirank-check with the fault in force.
    let ddp = root.join("tests/fixtures/prometheus/h200-ddp.prom");
    let ddp_addr = ddp.exists().then(|| {
        let text = std::fs::read_to_string(&ddp).expect("read h200-ddp.prom");
        let (addr, handle) = serve_file(text, guard.stop_fixture.clone());
        guard.fixture.push(handle);
        addr
    });

    // The recording rules, where the collector branch has added them (promtool unit-test files
    // beside them are not rule files).
    let rules_dir = root.join("collector-config/rules");
    let mut rules: Vec<PathBuf> = std::fs::read_dir(&rules_dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    (n.ends_with(".yml") || n.ends_with(".yaml")) && !n.contains(".test.")
                })
                .collect()
        })
        .unwrap_or_default();
    rules.sort();

    // Prometheus.
    let prom_addr: SocketAddr = free_addr();
    let mut prom_config = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n",
    );
    if !rules.is_empty() {
        prom_config.push_str("rule_files:\n");
        for r in &rules {
            let _ = writeln!(prom_config, "  - {:?}", r.display().to_string());
        }
    }
    let _ = write!(
        prom_config,
        "scrape_configs:\n  - job_name: slo-probe\n    static_configs:\n      - targets: \
         [\"{agent_addr}\"]\n"
    );
    if let Some(a) = h200_addr {
        let _ = write!(
            prom_config,
            "  - job_name: slo-probe-h200\n    static_configs:\n      - targets: [\"{a}\"]\n"
        );
    }
    if let Some(a) = ddp_addr {
        let _ = write!(
            prom_config,
            "  - job_name: slo-probe-h200-ddp\n    static_configs:\n      - targets: [\"{a}\"]\n"
        );
    }
    let prom_yml = dir.join("prometheus.yml");
    std::fs::write(&prom_yml, &prom_config).expect("write prometheus.yml");
    let range_start = unix_now();
    guard.spawn(
        "prometheus",
        Command::new(PROMETHEUS).args([
            format!("--config.file={}", prom_yml.display()),
            format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
            format!("--web.listen-address={prom_addr}"),
        ]),
    );
    wait_http(
        prom_addr,
        "/-/ready",
        "prometheus",
        &mut guard,
        Duration::from_secs(30),
    );
    let prom = Prom { addr: prom_addr };

    // The workload.
    let script = dir.join("workload.py");
    std::fs::write(&script, WORKLOAD).expect("write workload");
    let workload_pid = guard.spawn(
        "workload",
        Command::new("python3")
            .arg(&script)
            .arg(&shim)
            .env("SLO_PROBE_SOCKET", &socket)
            .env("RANK", "0")
            .env("SLO_PROBE_JOB", JOB)
            .env_remove("CUDA_INJECTION64_PATH")
            .env_remove("SLURM_PROCID")
            .env_remove("SLURM_JOB_ID")
            .env_remove("TORCHELASTIC_RUN_ID"),
    );
    eprintln!(
        "agent {agent_addr}, prometheus {prom_addr}, workload pid {workload_pid}, H200 fixture: \
         {}, rule files: {}",
        h200_addr.map_or("none".to_owned(), |a| a.to_string()),
        rules.len()
    );

    // Until the SLO engine learned its baseline and opened a violation, seen by Prometheus.
    let iteration = format!("slo_probe_iteration_duration_seconds{{job_id=\"{JOB}\",rank=\"0\"}}");
    let data_loader = format!(
        "slo_probe_runqueue_latency_seconds_bucket{{role=\"data_loader\",pid=\"{workload_pid}\"}}"
    );
    let violations = format!("slo_probe_slo_violations_total{{job_id=\"{JOB}\"}} > 0");
    let awaited = [
        "slo_probe_slo_windows_total",
        "slo_probe_slo_state",
        iteration.as_str(),
        data_loader.as_str(),
        violations.as_str(),
    ];
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let missing: Vec<&str> = awaited
            .iter()
            .copied()
            .filter(|q| prom.query(q).map_or(true, |r| r.is_empty()))
            .collect();
        if missing.is_empty() {
            break;
        }
        guard.check_alive("agent");
        guard.check_alive("prometheus");
        guard.check_alive("workload");
        assert!(
            Instant::now() < deadline,
            "no data within 45 s for: {missing:?}\n{}{}",
            guard.log("agent"),
            guard.log("workload")
        );
        thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "baseline learned and a violation opened after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The values.
    let p50 = prom.values(&format!(
        "slo_probe_iteration_duration_seconds{{job_id=\"{JOB}\",rank=\"0\",quantile=\"0.5\"}}"
    ));
    assert_eq!(p50.len(), 1, "{p50:?}");
    assert!((0.015..0.06).contains(&p50[0].1), "iteration p50 {p50:?}");
    assert_eq!(p50[0].0["pid"], workload_pid.to_string());
    let violated = prom.values(&violations);
    assert!(
        violated.iter().any(|(m, _)| {
            let node = m["node"].as_str().unwrap_or("");
            node.starts_with("iteration") || node == "data_loading"
        }),
        "violations on {violated:?}"
    );
    // The recorded two-rank job: the rules name rank 1, whose CPUs were contended, the host
    // straggler of its job, as the agent on that node did.
    if ddp_addr.is_some() && !rules.is_empty() {
        let q = "topk(1, slo_probe:host_straggler_score:ratio{job_id=\"h200-ddp\"})";
        let deadline = Instant::now() + Duration::from_secs(20);
        let top = loop {
            let v = prom.values(q);
            if !v.is_empty() {
                break v;
            }
            assert!(Instant::now() < deadline, "no {q}");
            thread::sleep(Duration::from_millis(500));
        };
        eprintln!("recorded DDP job: {q} = {top:?}");
        assert_eq!(top[0].0["rank"], "1", "{top:?}");
        assert!(top[0].1 > 3.0, "{top:?}");
        let named = prom.values("slo_probe_straggler{job_id=\"h200-ddp\"}");
        assert_eq!(named.len(), 1, "{named:?}");
        assert_eq!(named[0].0["rank"], "1");
        assert!(
            named[0].0["cause"]
                .as_str()
                .is_some_and(|c| c.starts_with("host.")),
            "{named:?}"
        );
    }
    // Exactly one state per node.
    for (m, v) in prom.values(&format!(
        "sum by (node) (slo_probe_slo_state{{job_id=\"{JOB}\"}})"
    )) {
        assert_eq!(v, 1.0, "states of {m}");
    }
    // Windows of 500 ms: about two judged per second and node.
    let windows = |node: &str| {
        prom.values(&format!(
            "slo_probe_slo_windows_total{{job_id=\"{JOB}\",node=\"{node}\"}}"
        ))
        .first()
        .map_or(0.0, |(_, v)| *v)
    };
    let w0 = windows("iteration");
    thread::sleep(Duration::from_secs(3));
    let w1 = windows("iteration");
    assert!(
        w1 > w0 && (w1 - w0) <= 12.0,
        "windows judged: {w0} then {w1} 3 s later (500 ms windows)"
    );
    // The workload's threads, by role.
    for (family, role) in [
        ("slo_probe_runqueue_latency_seconds_count", "data_loader"),
        ("slo_probe_runqueue_latency_seconds_count", "communication"),
        ("slo_probe_tcp_sent_bytes_total", "communication"),
        ("slo_probe_offcpu_seconds_total", "main"),
    ] {
        let v = prom.values(&format!(
            "sum({family}{{pid=\"{workload_pid}\",role=\"{role}\"}})"
        ));
        assert!(
            v.first().is_some_and(|(_, v)| *v > 0.0),
            "{family} {role}: {v:?}"
        );
    }

    // Every query of every dashboard.
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("dashboards"))
        .expect("dashboards/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no dashboards/*.json");
    let queries: Vec<DashQuery> = files.iter().flat_map(|f| dashboard_queries(f)).collect();
    let end = unix_now();
    let range = format!("{}s", (end - range_start).ceil() as u64);
    let mut vars: BTreeMap<&str, String> = BTreeMap::new();
    vars.insert("__rate_interval", RATE_INTERVAL.into());
    vars.insert("__interval", "1s".into());
    vars.insert("__range", range);
    vars.insert("instance", ".*".into());
    let mut job_vars = vars.clone();
    job_vars.insert("job_id", JOB.into());
    job_vars.insert("rank", "0".into());
    // The H200 recording is another job: GPU queries run for every job and rank ("All").
    let mut all_vars = vars;
    all_vars.insert("job_id", ".*".into());
    all_vars.insert("rank", ".*".into());

    let heal_decided = prom
        .query("slo_probe_heal_actions_total")
        .is_ok_and(|r| !r.is_empty());
    let mut table = String::new();
    let mut failures = Vec::new();
    let (mut with_data, mut optional_empty) = (0, 0);
    for q in &queries {
        let gpu = q.expr.contains("slo_probe_gpu_");
        let rule = q
            .expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .any(|w| w.starts_with("slo_probe:"));
        let expr = substitute(&q.expr, if gpu { &all_vars } else { &job_vars });
        let result = if q.instant {
            prom.query(&expr)
        } else {
            prom.query_range(&expr, range_start, end, 1.0)
        };
        // The healer's event families: nothing is ever in force in shadow mode, and actions
        // and rewards exist once it has decided something (it may not have in this run).
        let heal_in_force = q.expr.contains("slo_probe_heal_strategy_in_force");
        let heal_event = ["slo_probe_heal_actions_total", "slo_probe_heal_reward"]
            .iter()
            .any(|f| q.expr.contains(f));
        let optional = (gpu && h200_addr.is_none())
            || (rule && rules.is_empty())
            || heal_in_force
            || (heal_event && !heal_decided);
        let (count, status) = match &result {
            Err(e) => {
                failures.push(format!(
                    "{} / {}: invalid: {e}\n    {expr}",
                    q.dashboard, q.what
                ));
                (0, "INVALID".to_owned())
            }
            Ok(r) if !r.is_empty() => {
                with_data += 1;
                (r.len(), "ok".to_owned())
            }
            Ok(_) if !optional => {
                failures.push(format!(
                    "{} / {}: no series\n    {expr}",
                    q.dashboard, q.what
                ));
                (0, "EMPTY".to_owned())
            }
            Ok(_) => {
                optional_empty += 1;
                let why = if gpu {
                    "no H200 fixture"
                } else if heal_in_force {
                    "shadow healer"
                } else if heal_event {
                    "no healer decision"
                } else {
                    "no rule files"
                };
                (0, format!("empty ({why})"))
            }
        };
        let _ = writeln!(
            table,
            "{:<22} {:<58} {:>6}  {status}",
            q.dashboard,
            q.what.chars().take(58).collect::<String>(),
            count
        );
    }
    println!(
        "{:<22} {:<58} {:>6}  status\n{table}{} queries: {with_data} with data, {} failed, \
         {optional_empty} empty and allowed (H200 fixture: {}, rule files: {}); {:.1} s",
        "dashboard",
        "panel [target] / $variable",
        "series",
        queries.len(),
        failures.len(),
        if h200_addr.is_some() { "yes" } else { "no" },
        rules.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} dashboard queries failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    drop(guard);
}
