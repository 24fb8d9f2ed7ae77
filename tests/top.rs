//! Plain tier: `slo-probe top` as a user runs it, in a real pseudo-terminal with `NO_COLOR=1`,
//! against a real agent (no eBPF) that a python rank with the real shim reports to. The screen
//! is read back through a terminal emulator (vt100): the rank, its SLO tree and the panes
//! appear, the keys work (help, Tab, freeze, q), and when the agent goes away the status line
//! says it is reconnecting.

use std::{
    io::{Read, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use portable_pty::{native_pty_system, CommandBuilder, PtySize};
use slo_probe_tests::{artefact, free_addr, http_get, Procs};

const ROWS: u16 = 40;
const COLS: u16 = 120;

fn tempdir(tag: &str) -> PathBuf {
    slo_probe_tests::tempdir("top", tag)
}

fn agent(dir: &Path) -> (Child, SocketAddr) {
    let listen = free_addr();
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\ntick_ms = 200\n[shim]\nsocket = {:?}\n[gpu]\nnvml = false\n\
             [slo]\nwindow_ms = 500\nlearn_windows = 3\nwarmup_iterations = 5\n",
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

fn rank(dir: &Path) -> Child {
    let script = format!(
        "import ctypes, time\n\
         lib = ctypes.PyDLL({lib:?})\n\
         lib.slo_probe_step_begin.argtypes = [ctypes.c_uint64]\n\
         lib.slo_probe_step_end.argtypes = [ctypes.c_uint64]\n\
         i = 0\n\
         while True:\n\
         \x20   lib.slo_probe_step_begin(i)\n\
         \x20   time.sleep(0.020)\n\
         \x20   lib.slo_probe_step_end(i)\n\
         \x20   i += 1\n",
        lib = artefact("libslo_probe_cupti.so", "slo-probe-cupti")
            .display()
            .to_string(),
    );
    Command::new("python3")
        .args(["-c", &script])
        .env("SLO_PROBE_SOCKET", dir.join("shim.sock"))
        .env("RANK", "0")
        .env("SLO_PROBE_JOB", "pty-job")
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .expect("python3")
}

/// The emulated screen, fed by a reader thread.
struct Screen(Arc<Mutex<vt100::Parser>>);

impl Screen {
    fn text(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .screen()
            .contents()
    }

    fn wait_for(&self, what: &[&str], why: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let text = self.text();
            if what.iter().all(|w| text.contains(w)) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{why}: no {what:?} on the screen:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn top_in_a_terminal_shows_the_agent_and_follows_it() {
    let dir = tempdir("pty");
    let (a, addr) = agent(&dir);
    let r = rank(&dir);
    let pid = r.id();
    let mut procs = Procs(vec![a, r]);
    // The rank is known to the agent before top starts.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let body = http_get(addr, "/api/v1/snapshot")
            .map(|(_, b)| b)
            .unwrap_or_default();
        if body.contains(&format!("\"pid\":{pid}")) && body.contains("\"slo\":{") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent never saw pid {pid}: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let pty = native_pty_system()
        .openpty(PtySize {
            rows: ROWS,
            cols: COLS,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("openpty");
    let mut cmd = CommandBuilder::new(artefact("slo-probe", "slo-probe"));
    cmd.args(["top", "--url", &format!("http://{addr}")]);
    cmd.env("NO_COLOR", "1");
    cmd.env("TERM", "xterm-256color");
    let mut top = pty.slave.spawn_command(cmd).expect("top in the pty");
    drop(pty.slave);
    let parser = Arc::new(Mutex::new(vt100::Parser::new(ROWS, COLS, 0)));
    let mut reader = pty.master.try_clone_reader().expect("reader");
    let mut keys = pty.master.take_writer().expect("writer");
    let (done_tx, done_rx) = mpsc::channel::<()>();
    {
        let parser = parser.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                parser
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .process(&buf[..n]);
            }
            let _ = done_tx.send(());
        });
    }
    let screen = Screen(parser);
    let text = screen.wait_for(
        &[
            "slo-probe top",
            "live http://",
            "pty-job",
            &pid.to_string(),
            "SLO tree",
            "iteration",
            "open violations",
            "host by role",
            "GPUs",
        ],
        "the first screen",
    );
    assert!(
        text.contains("scheduling probes down") || text.contains("--no-ebpf"),
        "{text}"
    );
    // One key at a time, as typed: an Esc followed at once by a letter reads as Alt+letter.
    let mut press = |k: &[u8]| {
        keys.write_all(k).expect("key");
        keys.flush().expect("flush");
        std::thread::sleep(Duration::from_millis(300));
    };
    press(b"?");
    screen.wait_for(&["keys (Esc or ? closes)", "freeze the display"], "help");
    press(b"\x1b");
    press(b"f");
    screen.wait_for(&["FROZEN"], "freeze");
    press(b" ");
    press(b"\t");
    let _ = screen.wait_for(&["open violations"], "tab");

    // The agent goes away: top says so and keeps trying.
    let mut agent = procs.0.remove(0);
    let _ = agent.kill();
    let _ = agent.wait();
    screen.wait_for(&["reconnecting to http://"], "the agent gone");

    press(b"q");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = top.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "q did not quit:\n{}",
            screen.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    drop(pty.master);
    let _ = done_rx.recv_timeout(Duration::from_secs(5));
}

#[test]
fn once_prints_the_state_as_text_or_json() {
    let dir = tempdir("once");
    let (a, addr) = agent(&dir);
    let _procs = Procs(vec![a]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_get(addr, "/api/v1/snapshot").is_err() {
        assert!(Instant::now() < deadline, "no agent");
        std::thread::sleep(Duration::from_millis(100));
    }
    let bin = artefact("slo-probe", "slo-probe");
    let url = format!("http://{addr}");
    let out = Command::new(&bin)
        .args(["top", "--once", "--url", &url])
        .output()
        .expect("top --once");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 40, "{text}");
    assert!(text.contains("no training process yet"), "{text}");
    let out = Command::new(&bin)
        .args(["top", "--once", "--json", "--url", &url])
        .output()
        .expect("top --once --json");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["version"], 1);
    // Nothing listening: a clear error, not a hang.
    let out = Command::new(&bin)
        .args(["top", "--once", "--url", &format!("http://{}", free_addr())])
        .output()
        .expect("top --once");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the agent"), "{err}");
}
