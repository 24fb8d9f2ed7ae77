//! The `slo-probe` command line, run as a user would: help, config commands, the agent serving
//! real metrics as root, and its messages and degraded mode without privileges.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

const BIN: &str = env!("CARGO_BIN_EXE_slo-probe");

fn slo_probe(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run slo-probe")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn root_or_skip(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var_os("SLO_PROBE_REQUIRE_ROOT_TESTS").is_some_and(|v| v == "1") {
        panic!("{test}: needs root and SLO_PROBE_REQUIRE_ROOT_TESTS=1");
    }
    eprintln!("{test}: skipped: needs root");
    false
}

#[test]
fn help_lists_every_command() {
    let out = slo_probe(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for cmd in [
        "agent", "observe", "run", "top", "replay", "check", "config",
    ] {
        assert!(help.contains(cmd), "--help lacks {cmd}:\n{help}");
    }
    let out = slo_probe(&["agent", "--help"]);
    let help = text(&out.stdout);
    for flag in ["--config", "--listen", "--no-ebpf"] {
        assert!(help.contains(flag), "agent --help lacks {flag}:\n{help}");
    }
}

#[test]
fn top_shows_a_recording_without_an_agent() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/gpu/h200-graphs.bin"
    );
    let out = slo_probe(&["top", "--replay", fixture, "--once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let screen = text(&out.stdout);
    // 120x40 when stdout is not a terminal: every pane at once.
    assert_eq!(screen.lines().count(), 40, "{screen}");
    for want in [
        "slo-probe top",
        "replay ",
        "h200-graphs.bin",
        "SLO tree",
        "iteration p99",
        "top operators",
        "multi_tensor_apply",
        "graph#",
        "open violations",
    ] {
        assert!(screen.contains(want), "{want}:\n{screen}");
    }
    let out = slo_probe(&["top", "--replay", fixture, "--once", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["version"], 1);
    assert_eq!(v["processes"][0]["iterations"]["total"], 300);
    let out = slo_probe(&["top", "--json"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--json needs --once"));
}

#[test]
fn print_default_config_round_trips_through_check() {
    let out = slo_probe(&["config", "print-default"]);
    assert!(out.status.success());
    let dir = tempdir("config");
    let path = dir.join("default.toml");
    std::fs::write(&path, &out.stdout).expect("write");
    let out = slo_probe(&["config", "check", path.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(": ok"));
}

#[test]
fn invalid_config_names_the_key_and_fails() {
    let dir = tempdir("badconfig");
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[probes.runqueue]\noutlier_treshold_us = 5\n").expect("write");
    let out = slo_probe(&["config", "check", path.to_str().expect("utf-8 path")]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("outlier_treshold_us"), "{err}");
    let out = slo_probe(&["agent", "--config", path.to_str().expect("utf-8 path")]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("outlier_treshold_us"));
}

#[test]
fn observe_needs_a_command() {
    let out = slo_probe(&["observe"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("COMMAND"),
        "{}",
        text(&out.stderr)
    );
}

/// A fresh directory under the system temp dir, readable by every user.
fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("slo-probe-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

/// Starts `cmd`, waits for the agent's "serving Prometheus metrics at http://ADDR/metrics"
/// line on stderr and returns the child, the address and the stderr lines read so far (the
/// rest keep arriving on the receiver).
fn start_agent(mut cmd: Command) -> (Child, SocketAddr, mpsc::Receiver<String>) {
    let mut child = cmd
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start agent");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) else {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("agent exited with {status}:\n{}", seen.join("\n"));
            }
            continue;
        };
        if let Some(rest) = line.split("metrics at http://").nth(1) {
            let addr = rest.trim_end_matches("/metrics").parse().expect("address");
            return (child, addr, rx);
        }
        seen.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("agent did not announce its address:\n{}", seen.join("\n"));
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read");
    body
}

fn terminate(child: &mut Child) -> std::process::ExitStatus {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "agent ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Programs named `sched_switch` loaded in the kernel right now.
fn loaded_sched_switch_programs() -> usize {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some("sched_switch"))
        .count()
}

fn busy_thread(name: &str, cpu: usize, for_: Duration) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            // SAFETY: zeroed cpu_set_t is an empty set; valid pointers.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            let end = Instant::now() + for_;
            while Instant::now() < end {
                std::hint::spin_loop();
            }
        })
        .expect("spawn")
}

#[test]
fn agent_serves_thread_latency_and_detaches_on_sigterm() {
    if !root_or_skip("agent_serves_thread_latency") {
        return;
    }
    let before = loaded_sched_switch_programs();
    let mut cmd = Command::new(BIN);
    cmd.args(["agent", "--listen", "127.0.0.1:0"]);
    let (mut child, addr, rx) = start_agent(cmd);
    assert_eq!(
        loaded_sched_switch_programs(),
        before + 1,
        "program not loaded"
    );

    // Three busy threads on one CPU: each waits for the others.
    let threads: Vec<_> = (0..3)
        .map(|i| busy_thread(&format!("cli-busy-{i}"), 0, Duration::from_millis(1500)))
        .collect();
    for t in threads {
        t.join().expect("busy thread");
    }
    std::thread::sleep(Duration::from_millis(1500)); // at least one tick after they exited

    let metrics = get(addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains("slo_probe_probe_up{probe=\"runqueue\",reason=\"\"} 1"));
    let pid = std::process::id();
    let victim_count = metrics
        .lines()
        .find(|l| {
            l.starts_with("slo_probe_thread_runqueue_latency_seconds_count{")
                && l.contains(&format!("pid=\"{pid}\""))
                && l.contains("thread=\"cli-busy-0\"")
        })
        .unwrap_or_else(|| panic!("no series for thread cli-busy-0 of pid {pid}"));
    let waits: u64 = victim_count
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("count value");
    assert!(waits > 10, "{victim_count}");
    let sum_line = metrics
        .lines()
        .find(|l| {
            l.starts_with("slo_probe_thread_runqueue_latency_seconds_sum{")
                && l.contains("thread=\"cli-busy-0\"")
        })
        .expect("sum line");
    let waited: f64 = sum_line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("sum value");
    // Three threads sharing a CPU for 1.5 s: each waits roughly 1 s.
    assert!((0.5..1.5).contains(&waited), "{sum_line}");

    assert!(get(addr, "/healthz").contains("ok"));
    assert!(get(addr, "/nope").starts_with("HTTP/1.1 404"));

    let status = terminate(&mut child);
    assert!(status.success(), "agent exit status {status}");
    let log: Vec<String> = rx.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("probes detached")), "{log:?}");
    // The kernel frees a program after an RCU grace period, not at close().
    let deadline = Instant::now() + Duration::from_secs(5);
    while loaded_sched_switch_programs() != before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        loaded_sched_switch_programs(),
        before,
        "program still loaded 5 s after exit"
    );
}

/// A copy of the binary that an unprivileged user can execute (the build tree may sit under a
/// directory they cannot enter).
fn binary_for_nobody() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("nobody");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let bin = dir.join("slo-probe");
    std::fs::copy(BIN, &bin).expect("copy binary");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

fn as_nobody(bin: &PathBuf) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ])
    .arg(bin);
    cmd
}

#[test]
fn unprivileged_agent_explains_and_degrades() {
    if !root_or_skip("unprivileged_agent") {
        return;
    }
    let bin = binary_for_nobody();
    let out = as_nobody(&bin)
        .args(["agent", "--listen", "127.0.0.1:0"])
        .output()
        .expect("setpriv (util-linux) is needed by this test");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    for needle in ["CAP_BPF", "root", "--no-ebpf"] {
        assert!(err.contains(needle), "message lacks {needle}: {err}");
    }

    let out = as_nobody(&bin).arg("check").output().expect("check");
    assert!(!out.status.success());
    assert!(text(&out.stdout).contains("MISSING"));

    let mut cmd = as_nobody(&bin);
    cmd.args(["agent", "--no-ebpf", "--listen", "127.0.0.1:0"]);
    let (mut child, addr, _rx) = start_agent(cmd);
    std::thread::sleep(Duration::from_millis(300));
    let metrics = get(addr, "/metrics");
    assert!(
        metrics
            .contains("slo_probe_probe_up{probe=\"runqueue\",reason=\"disabled by --no-ebpf\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains("slo_probe_agent_resident_memory_bytes"));
    assert!(terminate(&mut child).success());
    let _ = std::fs::remove_dir_all(bin.parent().expect("dir"));
}
