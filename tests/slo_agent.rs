//! Plain tier: the SLO engine inside the agent's shim source, fed by a real process. The real
//! `libslo_probe_cupti.so` is loaded by python (no GPU here: iterations come from its step
//! markers alone, so the whole iteration is GPU idle before its first activity); the steps
//! take 20 ms, then 45 ms. The source's engine learns the 20 ms baseline, opens a violation
//! on the iteration nodes and attributes it to data loading; Prometheus renders it.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use slo_probe::exporters::{model, prometheus::TextSink};
use slo_probe_core::{attribution::DATA_LOADING_OP, pipeline::PipelineSettings, slo::SloSpec};
use slo_probe_tests::Shims;

fn shim_library() -> PathBuf {
    slo_probe_tests::artefact("libslo_probe_cupti.so", "slo-probe-cupti")
}

#[test]
fn a_slower_job_opens_a_violation_in_the_agent() {
    let socket = std::env::temp_dir().join(format!(
        "slo-probe-test-slo-{}/shim.sock",
        std::process::id()
    ));
    let src = Shims::start(
        &socket,
        PipelineSettings::live(
            SloSpec {
                window_ms: 500,
                learn_windows: 3,
                warmup_iterations: 5,
                ..SloSpec::default()
            },
            100_000_000,
        ),
    )
    .expect("listen");
    let script = format!(
        "import ctypes, time\n\
         lib = ctypes.PyDLL({lib:?})\n\
         lib.slo_probe_step_begin.argtypes = [ctypes.c_uint64]\n\
         lib.slo_probe_step_end.argtypes = [ctypes.c_uint64]\n\
         for i in range(260):\n\
         \x20   lib.slo_probe_step_begin(i)\n\
         \x20   time.sleep(0.020 if i < 160 else 0.045)\n\
         \x20   lib.slo_probe_step_end(i)\n\
         time.sleep(30)\n",
        lib = shim_library().display().to_string(),
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .env("SLO_PROBE_SOCKET", &socket)
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .expect("python3");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(40);
    let found = loop {
        let p = src.processes().into_iter().find(|p| p.pid == pid);
        // The attribution of an open violation is refreshed as more slow iterations come in:
        // the first one, at the onset, may have compared only the first slow steps (on a loaded
        // machine: +6 ms), so wait for it to settle on the slowdown.
        let settled = |v: &&slo_probe_core::slo::Violation| {
            v.attribution
                .as_ref()
                .and_then(|a| a.top())
                .is_some_and(|c| (15e6..35e6).contains(&c.delta_ns))
        };
        if let Some(v) = p
            .as_ref()
            .and_then(|p| p.slo.as_ref())
            .and_then(|s| s.violations.iter().find(settled).cloned())
        {
            break (p.expect("process"), v);
        }
        assert!(
            Instant::now() < deadline,
            "no violation: {:?}",
            p.and_then(|p| p.slo)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    let (p, v) = found;
    eprintln!("{}", v.chain);
    assert!(
        v.node.starts_with("iteration") || v.node == "data_loading",
        "{v:?}"
    );
    let top = v
        .attribution
        .as_ref()
        .and_then(|a| a.top())
        .expect("top cause");
    assert_eq!(top.op, DATA_LOADING_OP);
    // About 25 ms more per iteration.
    assert!((15e6..35e6).contains(&top.delta_ns), "{top:?}");
    let mut text = String::new();
    model::slo::walk(&mut TextSink::new(&mut text), &[p]);
    assert!(text.contains(&format!(
        "slo_probe_attribution_seconds{{pid=\"{pid}\",rank=\"\",job_id=\"\",node=\"{}\",cause_rank=\"1\",op=\"(data loading)\",dimension=\"data_loading\"}}",
        v.node
    )), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Issue 16, Deliver 2: the real agent binary (`slo-probe agent --no-ebpf`) under hostile
// clients, its memory and its /metrics latency measured throughout.

use std::{
    io::Write as _,
    net::{SocketAddr, TcpStream},
    os::unix::process::CommandExt as _,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

use slo_probe_tests::hostile::{self, HostileRing, Rng};

/// The memory bound: resident set of the agent at any time under the attacks below, for a
/// release build (`SLO_PROBE_BIN`, or this workspace's built with `--release`; 47 MiB at most
/// here, 2026-12-06).
const RSS_BOUND: u64 = 64 << 20;
/// The same for the debug build that `cargo test` makes (the README's test command): it starts
/// 14 MiB larger, drains a flood more slowly, and peaked at 63–66 MiB (a clean-clone CI run,
/// 2026-12-06: 66.4 MiB just after the flood of copies, back to 27 MiB).
const RSS_BOUND_DEBUG: u64 = 80 << 20;

/// The bound for the agent under test: a debug build only where this workspace's is used.
fn rss_bound() -> u64 {
    let given = std::env::var_os("SLO_PROBE_BIN").is_some_and(|b| !b.is_empty());
    if cfg!(debug_assertions) && !given {
        RSS_BOUND_DEBUG
    } else {
        RSS_BOUND
    }
}
/// How far above its start the agent's resident set may stay once the hostile clients are gone.
const RSS_SETTLED: u64 = 12 << 20;
/// Scrapes under the attacks answer within this: at least [`SCRAPE_SHARE`] of them in every
/// phase, all of them with `SLO_PROBE_STRICT_LATENCY=1` (the house style keeps timed
/// assertions out of tests: the machine running them is shared; the failures this test is
/// about are scrapes that time out or are refused, which [`SCRAPE_STALL`] catches).
const SCRAPE_BOUND: Duration = Duration::from_millis(100);
/// See [`SCRAPE_BOUND`].
const SCRAPE_SHARE: f64 = 0.95;
/// No scrape may take this long, ever.
const SCRAPE_STALL: Duration = Duration::from_secs(2);

/// The agent binary: `$SLO_PROBE_BIN` (another build, e.g. the release one or one from before
/// a change, for comparisons), else this workspace's, built first.
fn agent_binary() -> PathBuf {
    match std::env::var_os("SLO_PROBE_BIN") {
        Some(b) if !b.is_empty() => PathBuf::from(b),
        _ => slo_probe_tests::artefact("slo-probe", "slo-probe"),
    }
}

/// A running `slo-probe agent --no-ebpf` with a test config.
struct Agent {
    child: std::process::Child,
    addr: SocketAddr,
    socket: PathBuf,
    log: PathBuf,
    dir: PathBuf,
}

impl Agent {
    /// Starts the agent with `extra` appended to its config, under a 1,024-descriptor limit
    /// (the usual default that the attacks exhausted).
    fn start(tag: &str, extra: &str) -> Self {
        let bin = agent_binary();
        let dir =
            std::env::temp_dir().join(format!("slo-probe-agent-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let addr = slo_probe_tests::free_addr();
        let socket = dir.join("shim.sock");
        let config = dir.join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "[agent]\ntick_ms = 500\nretention_s = 3\n[prometheus]\nlisten = \"{addr}\"\n\
                 [shim]\nsocket = \"{}\"\n[gpu]\nnvml = false\n{extra}",
                socket.display()
            ),
        )
        .expect("config");
        let log = dir.join("agent.log");
        let mut cmd = Command::new(bin);
        cmd.args(["agent", "--no-ebpf", "--config"])
            .arg(&config)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"));
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let l = libc::rlimit {
                    rlim_cur: 1024,
                    rlim_max: 1024,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("agent");
        let agent = Self {
            child,
            addr,
            socket,
            log,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while slo_probe_tests::http_get(addr, "/metrics").is_err() || !agent.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "agent never served: {}",
                agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        agent
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn metrics(&self) -> String {
        slo_probe_tests::http_get(self.addr, "/metrics")
            .map(|r| r.1)
            .unwrap_or_default()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the monitor saw in one phase.
#[derive(Clone, Debug, Default)]
struct Phase {
    name: &'static str,
    scrapes: usize,
    failed: usize,
    max_scrape: Duration,
    /// Scrapes within [`SCRAPE_BOUND`].
    fast: usize,
    max_rss: u64,
    last_rss: u64,
    max_fds: usize,
    /// The last `smaps_rollup` breakdown.
    mem: String,
}

/// Scrapes /metrics and reads the agent's resident set every 100 ms, by phase.
struct Monitor {
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    phases: Arc<Mutex<Vec<Phase>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    fn start(agent: &Agent, names: &[&'static str]) -> Self {
        let phase = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let phases = Arc::new(Mutex::new(
            names
                .iter()
                .map(|n| Phase {
                    name: n,
                    ..Phase::default()
                })
                .collect::<Vec<_>>(),
        ));
        let (addr, pid) = (agent.addr, agent.pid());
        let thread = {
            let (phase, stop, phases) = (phase.clone(), stop.clone(), phases.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let k = phase.load(Ordering::Relaxed);
                    let t0 = Instant::now();
                    let got = slo_probe_tests::http_get(addr, "/metrics");
                    let ok = got.as_ref().is_ok_and(|r| r.0 == 200);
                    if !ok {
                        eprintln!("failed scrape: {:?}", got.map(|r| r.0));
                    }
                    let took = t0.elapsed();
                    let rss = hostile::rss_bytes(pid);
                    let fds = hostile::open_fds(pid);
                    let mem = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
                        .unwrap_or_default()
                        .lines()
                        .filter(|l| l.starts_with("Anonymous:") || l.starts_with("Shared_"))
                        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
                        .collect::<Vec<_>>()
                        .join(", ");
                    if let Some(p) = phases.lock().expect("phases").get_mut(k) {
                        p.mem = mem;
                        p.scrapes += 1;
                        p.failed += usize::from(!ok);
                        p.max_scrape = p.max_scrape.max(took);
                        p.fast += usize::from(took <= SCRAPE_BOUND);
                        p.max_rss = p.max_rss.max(rss);
                        p.last_rss = rss;
                        p.max_fds = p.max_fds.max(fds);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Self {
            phase,
            stop,
            phases,
            thread: Some(thread),
        }
    }

    fn next(&self) {
        self.phase.fetch_add(1, Ordering::Relaxed);
    }

    fn finish(mut self) -> Vec<Phase> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.phases.lock().expect("phases").clone()
    }
}

/// Seconds each record flood lasts: 8 in CI; `SLO_PROBE_FLOOD_S=60` for the full run of the
/// issue (README, "Hardening").
fn flood_seconds() -> u64 {
    std::env::var("SLO_PROBE_FLOOD_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// Registers a sealed 8 MiB ring and pushes records made by `make` as fast as the ring
/// takes them for `secs`, then disconnects. Returns the records pushed.
fn flood(agent: &Agent, secs: u64, mut make: impl FnMut(u64, &mut Vec<u8>)) -> u64 {
    let ring = HostileRing::new("hostile-flood", hostile::ring_len(8 << 20), true).expect("ring");
    let conn = hostile::register(&agent.socket, &ring).expect("register");
    let end = Instant::now() + Duration::from_secs(secs);
    let (mut n, mut buf) = (0u64, Vec::with_capacity(4096));
    while Instant::now() < end {
        for _ in 0..4096 {
            make(n, &mut buf);
            if ring.ring.push(&buf) {
                n += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
    drop(conn);
    n
}

/// Items 2–6, 11 and the memory bound against the real agent: record floods (random
/// well-framed records; realistic copies without iteration boundaries), 1,000 short-lived
/// registrations, 1,100 idle and slow HTTP connections under a 1,024-descriptor limit, and 200
/// refused hellos. Throughout: RSS ≤ 64 MiB and /metrics within 100 ms; after each attack the
/// agent comes back near its starting RSS, the gone processes are retired after
/// `agent.retention_s`, refusals are counted in /metrics and logged a few times only.
#[test]
fn hostile_clients_neither_bloat_nor_stall_the_agent() {
    let agent = Agent::start("hostile", "");
    let secs = flood_seconds();
    std::thread::sleep(Duration::from_secs(2));
    let monitor = Monitor::start(
        &agent,
        &[
            "start",
            "random records",
            "after random",
            "copies without boundaries",
            "after copies",
            "1000 short-lived pids",
            "after pids",
            "1100 idle HTTP connections",
            "after HTTP",
            "200 refused hellos",
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    let settle = || std::thread::sleep(Duration::from_secs(6)); // retention 3 s, ticks, trim

    monitor.next();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let n = flood(&agent, secs, |_, b| hostile::random_record(&mut rng, b));
    eprintln!("random records: {n} in {secs} s");
    monitor.next();
    settle();

    monitor.next();
    let t0 = slo_probe_tests::monotonic_ns();
    let n = flood(&agent, secs, |k, b| {
        b.clear();
        b.extend_from_slice(slo_probe_common::Record::as_bytes(&hostile::memcpy_record(
            t0 + k * 3_000,
        )));
    });
    eprintln!("copy records without boundaries: {n} in {secs} s");
    monitor.next();
    settle();

    monitor.next();
    let ring = HostileRing::new("hostile-pids", hostile::ring_len(1 << 16), true).expect("ring");
    let pids =
        hostile::short_lived_registrations(&agent.socket, &ring, 1000, 32, 20).expect("fork");
    std::thread::sleep(Duration::from_secs(1));
    let m = agent.metrics();
    let listed = |m: &str| {
        pids.iter()
            .filter(|p| m.contains(&format!("slo_probe_shim_state{{pid=\"{p}\"")))
            .count()
    };
    let seen = listed(&m);
    eprintln!("short-lived registrations listed just after: {seen}");
    monitor.next();
    settle();
    let m = agent.metrics();
    assert_eq!(
        listed(&m),
        0,
        "exited processes still exported after retention_s"
    );
    assert!(m.len() < 200_000, "/metrics is {} bytes", m.len());

    monitor.next();
    let mut held: Vec<TcpStream> = Vec::new();
    for k in 0..1100 {
        if let Ok(mut s) = TcpStream::connect(agent.addr) {
            if k % 10 == 0 {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
            }
            held.push(s);
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    let fds_under_attack = hostile::open_fds(agent.pid());
    drop(held);
    monitor.next();
    std::thread::sleep(Duration::from_secs(2));

    monitor.next();
    for _ in 0..200 {
        if let Ok(s) = std::os::unix::net::UnixStream::connect(&agent.socket) {
            let _ = hostile::send_with_fds(&s, b"not a hello, not at all, no fd", &[]);
            let mut b = [0u8; 1];
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = std::io::Read::read(&mut &s, &mut b);
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let m = agent.metrics();
    let phases = monitor.finish();

    eprintln!(
        "phase                          scrapes failed  max scrape  ≤100ms   max RSS   last RSS  fds"
    );
    for p in &phases {
        eprintln!(
            "{:<30} {:>7} {:>6} {:>8.1} ms {:>6.1}% {:>6.1} MiB {:>6.1} MiB {:>4}",
            p.name,
            p.scrapes,
            p.failed,
            p.max_scrape.as_secs_f64() * 1e3,
            100.0 * p.fast as f64 / p.scrapes.max(1) as f64,
            p.max_rss as f64 / (1 << 20) as f64,
            p.last_rss as f64 / (1 << 20) as f64,
            p.max_fds
        );
        eprintln!("    ({})", p.mem);
    }
    let base = phases[0].last_rss;
    for p in &phases {
        assert!(p.failed == 0, "{}: {} scrapes failed", p.name, p.failed);
        assert!(
            p.max_rss <= rss_bound(),
            "{}: RSS {} MiB",
            p.name,
            p.max_rss >> 20
        );
        let strict = std::env::var_os("SLO_PROBE_STRICT_LATENCY").is_some_and(|v| v == "1");
        let bound = if strict { SCRAPE_BOUND } else { SCRAPE_STALL };
        assert!(
            p.max_scrape <= bound,
            "{}: a scrape took {:?}",
            p.name,
            p.max_scrape
        );
        // One slow scrape is allowed on top of the share (short phases have 20 scrapes).
        assert!(
            p.fast as f64 + 1.0 >= SCRAPE_SHARE * p.scrapes as f64,
            "{}: {} of {} scrapes within {SCRAPE_BOUND:?}",
            p.name,
            p.fast,
            p.scrapes
        );
        if p.name.starts_with("after") {
            assert!(
                p.last_rss <= base + RSS_SETTLED,
                "{}: RSS {} MiB, started at {} MiB",
                p.name,
                p.last_rss >> 20,
                base >> 20
            );
        }
    }
    assert!(fds_under_attack < 300, "{fds_under_attack} descriptors");
    let refused = m
        .lines()
        .find(|l| l.starts_with("slo_probe_shim_refused_total{reason=\"fds\"}"))
        .unwrap_or_default();
    assert!(refused.ends_with(" 200"), "{refused}");
    let logged = agent
        .log_text()
        .lines()
        .filter(|l| l.contains("refused a CUPTI shim connection"))
        .count();
    assert!(
        logged <= 3,
        "{logged} refusal lines logged:\n{}",
        agent.log_text()
    );
    assert!(m.contains("slo_probe_shim_corrupt_bytes_total"));
}

/// Item 6: a connection that sends no complete request is closed after the header deadline,
/// and a burst of idle connections beyond the cap closes the oldest ones (before the fix both
/// stayed open for good).
#[test]
fn idle_http_connections_are_closed() {
    let agent = Agent::start("http", "");
    let mut idle = TcpStream::connect(agent.addr).expect("connect");
    idle.write_all(b"GET /metrics HTTP/1.1\r\n")
        .expect("partial request");
    idle.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let _ = std::io::Read::read_to_end(&mut idle, &mut buf);
    let took = t0.elapsed();
    eprintln!("a partial request was closed after {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let before = hostile::open_fds(agent.pid());
    let held: Vec<TcpStream> = (0..500)
        .filter_map(|_| TcpStream::connect(agent.addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = hostile::open_fds(agent.pid());
    eprintln!(
        "agent descriptors: {before} before, {during} with {} idle clients",
        held.len()
    );
    assert!(during < before + 100, "{during} descriptors");
    let (status, _) = slo_probe_tests::http_get(agent.addr, "/metrics").expect("scrape");
    assert_eq!(status, 200);
}

/// Runs `slo-probe <args>` with `env`; exit status and stderr.
fn run_cli(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(agent_binary());
    cmd.args(args).env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("slo-probe");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Items 7–9: what the agent refuses at start, `config check` refuses too, with a short clear
/// message: https and malformed OTLP endpoints (a 10 MB one quoted cut), in the config or the
/// environment, and a regular file at `shim.socket` (left as it was); a second agent on a
/// socket fails and leaves the first one's socket alone.
#[test]
fn config_check_refuses_what_the_agent_refuses() {
    let dir = std::env::temp_dir().join(format!("slo-probe-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).expect("config");
        p.display().to_string()
    };
    let addr = slo_probe_tests::free_addr();
    let base = format!(
        "[agent]\ntick_ms = 500\n[prometheus]\nlisten = \"{addr}\"\n[gpu]\nnvml = false\n\
         [shim]\nsocket = \"{}\"\n",
        dir.join("shim.sock").display()
    );
    let long = format!("http://{}", "a".repeat(10 << 20));
    for (name, otlp, why) in [
        ("https.toml", "https://otel:4317".to_owned(), "TLS"),
        ("bad.toml", "http://[::1".to_owned(), "otlp.endpoint"),
        ("port.toml", "http://otel:99999".to_owned(), "otlp.endpoint"),
        ("long.toml", long, "otlp.endpoint"),
    ] {
        let path = write(name, &format!("{base}[otlp]\nendpoint = \"{otlp}\"\n"));
        for args in [
            vec!["config", "check", &path],
            vec!["agent", "--no-ebpf", "--config", &path],
        ] {
            let (ok, err) = run_cli(&args, &[]);
            assert!(!ok, "{args:?} passed");
            assert!(
                err.contains(why),
                "{args:?}: {}",
                &err[..err.len().min(500)]
            );
            assert!(err.len() < 2000, "{args:?}: {} bytes of error", err.len());
        }
        let _ = std::fs::remove_file(&path);
    }
    let plain = write("plain.toml", &base);
    let (ok, err) = run_cli(
        &["config", "check", &plain],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel:4318")],
    );
    assert!(!ok && err.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{err}");
    let (ok, err) = run_cli(&["config", "check", &plain], &[]);
    assert!(ok, "{err}");

    // A decoy file at shim.socket: refused by both, never replaced.
    let decoy = dir.join("decoy");
    std::fs::write(&decoy, b"precious").expect("decoy");
    let path = write(
        "decoy.toml",
        &format!(
            "[prometheus]\nlisten = \"{addr}\"\n[gpu]\nnvml = false\n[shim]\nsocket = \"{}\"\n",
            decoy.display()
        ),
    );
    for args in [
        vec!["config", "check", &path],
        vec!["agent", "--no-ebpf", "--config", &path],
    ] {
        let (ok, err) = run_cli(&args, &[]);
        assert!(!ok && err.contains("not a socket"), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(&decoy).expect("decoy"), b"precious");

    // A second agent on a running agent's socket.
    let first = Agent::start("first", "");
    let second = write(
        "second.toml",
        &format!(
            "[prometheus]\nlisten = \"{}\"\n[gpu]\nnvml = false\n[shim]\nsocket = \"{}\"\n",
            slo_probe_tests::free_addr(),
            first.socket.display()
        ),
    );
    let (ok, err) = run_cli(&["agent", "--no-ebpf", "--config", &second], &[]);
    assert!(!ok && err.contains("owns the shim socket"), "{err}");
    assert!(first.socket.exists(), "the first agent's socket is gone");
    let ring = HostileRing::new("hostile-second", hostile::ring_len(1 << 16), true).expect("ring");
    let _conn = hostile::register(&first.socket, &ring).expect("the first agent still listens");
    let _ = std::fs::remove_dir_all(&dir);
}
