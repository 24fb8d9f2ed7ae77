//! Plain tier: the agent's state API, from the real binary (no eBPF, so no root) with two python
//! ranks of one job loading the real `libslo_probe_cupti.so` (no GPU: iterations from their step
//! markers; rank 1 slows from 20 to 45 ms steps). Asserted: `/api/v1/snapshot` has both ranks,
//! their SLO trees, rank 1's violation with its chain, the straggler scores on the 0..1 scale;
//! `/api/v1/watch` sends a full line then deltas; the write endpoints answer 403 unless
//! `[api] allow_writes`; allowed, a diagnostic reaches a rank's shim and an undo restores a
//! knob the journal lists as applied (a plain file standing in for a cgroup file).

use std::{
    io::{Read, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use slo_probe::{
    api::{
        client::Endpoint,
        types::{Snapshot, State, WatchEvent, VERSION},
    },
    healer::{
        journal::{self, ActionKey, Change, Journal, Record},
        knobs::{Knob, KnobValue},
    },
};
use slo_probe_core::healer::{Level, Strategy};
use slo_probe_tests::{artefact, free_addr, http_get, Procs};

fn tempdir(tag: &str) -> PathBuf {
    slo_probe_tests::tempdir("api", tag)
}

fn agent(dir: &Path, extra: &str) -> (Child, SocketAddr) {
    let listen = free_addr();
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\ntick_ms = 200\n[shim]\nsocket = {:?}\n[gpu]\nnvml = false\n\
             [slo]\nwindow_ms = 500\nlearn_windows = 3\nwarmup_iterations = 5\n{extra}\n",
            dir.join("shim.sock")
        ),
    )
    .expect("config");
    let child = Command::new(artefact("slo-probe", "slo-probe"))
        .args(["agent", "--no-ebpf", "--log-level", "warn", "--config"])
        .arg(&config)
        .args(["--listen", &listen.to_string()])
        .stdout(Stdio::null())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .spawn()
        .expect("slo-probe agent");
    (child, listen)
}

fn rank(dir: &Path, rank: u32, fast: u32) -> Child {
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
        .env("SLO_PROBE_JOB", "api-test")
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .expect("python3")
}

fn snapshot(addr: SocketAddr) -> Option<Snapshot> {
    let (status, body) = http_get(addr, "/api/v1/snapshot").ok()?;
    assert_eq!(status, 200, "{body}");
    Some(serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")))
}

/// A minimal HTTP/1.0 POST: the status and the body.
fn http_post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("tcp");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").expect("http");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, body.to_owned())
}

fn wait_for(addr: SocketAddr, what: &str, ok: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(s) = snapshot(addr) {
            if ok(&s) {
                return s;
            }
            last = Some(s);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("no {what} within 60 s: {last:#?}");
}

#[test]
fn the_agent_serves_its_state_and_watch_stream_and_guards_its_writes() {
    let dir = tempdir("state");
    let (a, addr) = agent(&dir, "");
    let r0 = rank(&dir, 0, u32::MAX);
    let r1 = rank(&dir, 1, 150);
    let (p0, p1) = (r0.id(), r1.id());
    let _procs = Procs(vec![a, r0, r1]);

    // Both ranks, with iterations and their trees.
    let s = wait_for(addr, "two ranks with iterations", |s| {
        [p0, p1].iter().all(|pid| {
            s.processes
                .iter()
                .any(|p| p.pid == *pid && p.iterations.total > 20 && p.slo.is_some())
        })
    });
    assert_eq!(s.version, VERSION);
    assert!(!s.node.is_empty());
    assert_eq!(
        s.agent.shim_socket.as_deref(),
        Some(dir.join("shim.sock").display().to_string().as_str())
    );
    assert!(!s.agent.writes_allowed);
    assert!(s
        .agent
        .probes
        .iter()
        .any(|p| p.name == "runqueue" && !p.up && p.reason.contains("--no-ebpf")));
    let p = s.processes.iter().find(|p| p.pid == p0).expect("rank 0");
    assert_eq!(p.rank, Some(0));
    assert_eq!(p.job_id.as_deref(), Some("api-test"));
    let slo = p.slo.as_ref().expect("tree");
    assert_eq!(slo.nodes[0].name, "job");
    assert!(slo.nodes.iter().any(|n| n.name == "iteration"));
    let p50 = p.iterations.wall_p50_ns.expect("p50");
    assert!((18_000_000..40_000_000).contains(&p50), "{p50}");

    // Rank 1's violation, with its chain and cause, and the job's straggler view.
    let s = wait_for(addr, "a violation on rank 1", |s| {
        s.processes
            .iter()
            .any(|p| p.pid == p1 && p.violations.iter().any(|v| v.open && !v.causes.is_empty()))
    });
    let p = s.processes.iter().find(|p| p.pid == p1).expect("rank 1");
    let v = p.violations.iter().find(|v| v.open).expect("open");
    assert_eq!(v.pid, p1);
    assert!(v.chain.contains('←'), "{}", v.chain);
    assert!(matches!(
        p.slo.as_ref().map(|s| s.state),
        Some(State::Warning | State::Critical | State::Breaching | State::Ok)
    ));
    assert!(s.open_violations().iter().any(|v| v.pid == p1));
    // Once most of rank 1's recent iterations are slow, it scores lower.
    let relative = |s: &Snapshot, pid: u32| {
        s.jobs
            .iter()
            .flat_map(|j| &j.ranks)
            .find(|r| r.pid == pid)
            .and_then(|r| r.relative)
    };
    let s = wait_for(addr, "rank 1 scored slower", |s| {
        relative(s, p1).is_some_and(|r| r < 0.8)
    });
    let job = s.jobs.iter().find(|j| j.id == "api-test").expect("job");
    assert_eq!(job.ranks.len(), 2);
    for r in &job.ranks {
        for x in [r.relative, r.individual].into_iter().flatten() {
            assert!((0.0..=1.0).contains(&x), "{r:?}");
        }
    }
    let slow = job.ranks.iter().find(|r| r.pid == p1).expect("rank 1");
    let fast = job.ranks.iter().find(|r| r.pid == p0).expect("rank 0");
    assert!(slow.relative < fast.relative, "{job:?}");

    // The watch stream: the whole state, then a delta per tick.
    let mut w = Endpoint::of(addr)
        .watch(Duration::from_secs(10))
        .expect("watch");
    let first = match w.next_event().expect("first line") {
        WatchEvent::Full(s) => s,
        other => panic!("{other:?}"),
    };
    assert!(first.processes.iter().any(|p| p.pid == p1));
    let mut state = first.clone();
    for _ in 0..3 {
        match w.next_event().expect("a delta") {
            WatchEvent::Delta(d) => {
                assert!(d.taken_at_ns > state.taken_at_ns);
                state.apply(d);
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(state.agent.ticks > first.agent.ticks);

    // Writes are off by default; unknown paths say what exists.
    let (status, body) = http_post(addr, "/api/v1/diagnostic", "{\"pid\":1}");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("allow_writes = true"), "{body}");
    let (status, body) = http_get(addr, "/api/v1/nope").expect("get");
    assert_eq!(status, 404);
    assert!(body.contains("/api/v1/snapshot"), "{body}");
    let (status, _) = http_get(addr, "/metrics").expect("metrics");
    assert_eq!(status, 200);
}

#[test]
fn allowed_writes_reach_the_shims_and_the_journal() {
    let dir = tempdir("writes");
    let journal = dir.join("heal.jsonl");
    let (a, addr) = agent(
        &dir,
        &format!(
            "[api]\nallow_writes = true\n[heal]\njournal = {journal:?}\njobs_dir = {:?}\n",
            dir.join("jobs")
        ),
    );
    let r0 = rank(&dir, 0, u32::MAX);
    let p0 = r0.id();
    let _procs = Procs(vec![a, r0]);
    let s = wait_for(addr, "the rank", |s| {
        s.processes.iter().any(|p| p.pid == p0)
    });
    assert!(s.agent.writes_allowed);

    // Diagnostics reach the rank's shim; a pid without one is named.
    let (status, body) = http_post(
        addr,
        "/api/v1/diagnostic",
        &format!("{{\"pid\":{p0},\"steps\":5}}"),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!(
            "asked the shim of pid {p0} for graph-node tracing during 5"
        )),
        "{body}"
    );
    let (status, body) = http_post(addr, "/api/v1/diagnostic", "{}");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("pid {p0}")), "{body}");
    let (status, body) = http_post(addr, "/api/v1/diagnostic", "{\"pid\":1}");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no training process with pid 1"), "{body}");

    // Undo: nothing applied yet; then an action journalled as applied (a knob in a plain file)
    // is restored, and journalled as undone by the API.
    let (status, body) = http_post(addr, "/api/v1/heal/undo", "{}");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no healer action to undo"), "{body}");
    let knob_file = dir.join("cpu.weight");
    std::fs::write(&knob_file, "10\n").expect("knob");
    let key = ActionKey {
        run: "an-earlier-run".into(),
        job: 4242,
        action: 3,
    };
    Journal::open(&journal)
        .expect("journal")
        .append_all(vec![
            Record::Prior {
                key: key.clone(),
                job_start: 1,
                strategy: Strategy::NeighborIsolation,
                level: Level::Mild,
                change: Change {
                    knob: Knob::Cgroup {
                        cgroup: "/neighbour".into(),
                        file: "cpu.weight".into(),
                        path: knob_file.clone(),
                    },
                    prior: KnobValue::Text("100".into()),
                    value: KnobValue::Text("10".into()),
                },
            },
            Record::Applied {
                key,
                strategy: Strategy::NeighborIsolation,
                changes: 1,
                notes: vec![],
            },
        ])
        .expect("append");
    let (status, body) = http_post(addr, "/api/v1/heal/undo", "{\"action\":4}");
    assert_eq!(status, 404, "{body}");
    let (status, body) = http_post(addr, "/api/v1/heal/undo", "{\"action\":3}");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("job 4242 action 3 (neighbor-isolation) undone: 1 knobs restored"),
        "{body}"
    );
    assert_eq!(
        std::fs::read_to_string(&knob_file).expect("knob").trim(),
        "100"
    );
    let (lines, _) = journal::read(&journal).expect("journal");
    assert!(lines
        .iter()
        .any(|l| matches!(&l.record, Record::Reverted { by, .. } if by == "api")));
    assert!(journal::outstanding(&lines).is_empty());
}
