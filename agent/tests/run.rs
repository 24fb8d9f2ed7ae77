//! `slo-probe run` with plain commands (no GPU, no eBPF): the command's exit status and output
//! are the wrapper's, a fatal signal is re-raised, signals sent to the wrapper are forwarded, a
//! terminal's Ctrl-C reaches the command once (driven through a real pseudo-terminal), the shim
//! variable reaches a grandchild, and the report is written and parseable in every case.

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use slo_probe::cli::run::RunReport;

const BIN: &str = env!("CARGO_BIN_EXE_slo-probe");

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("slo-probe-run-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A config that finds no agent (its API address is a free port) and injects `library`; its
/// healer journals in `dir` unless `heal` (a `[heal]` section) says otherwise.
fn config(dir: &Path, library: &str, heal: Option<&str>) -> PathBuf {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let path = dir.join("run.toml");
    let heal = heal.map_or_else(|| heal_section(dir, &dir.join("heal.jsonl")), str::to_owned);
    std::fs::write(
        &path,
        format!(
            "[prometheus]\nlisten = \"127.0.0.1:{port}\"\n[shim]\nlibrary = {library:?}\n\
             [gpu]\nnvml = false\n{heal}"
        ),
    )
    .expect("config");
    path
}

/// A `[heal]` section journalling at `journal`, with the jobs' channels in `dir`.
fn heal_section(dir: &Path, journal: &Path) -> String {
    format!(
        "[heal]\njournal = {journal:?}\njobs_dir = {:?}\n",
        dir.join("jobs")
    )
}

/// `slo-probe run --no-ebpf -o REPORT FLAGS -- COMMAND` in `dir`.
fn wrapper_with(dir: &Path, report: &str, flags: &[&str], command: &[&str]) -> Command {
    wrapper_healing(dir, None, report, flags, command)
}

/// [`wrapper_with`] with its own `[heal]` section.
fn wrapper_healing(
    dir: &Path,
    heal: Option<&str>,
    report: &str,
    flags: &[&str],
    command: &[&str],
) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(dir)
        .arg("run")
        .arg("--config")
        .arg(config(dir, "/opt/test/libslo_probe_cupti.so", heal))
        .args(["--no-ebpf", "-o", report])
        .args(flags)
        .arg("--")
        .args(command)
        .env_remove("CUDA_INJECTION64_PATH")
        .env_remove("RUST_LOG");
    c
}

fn wrapper(dir: &Path, report: &str, command: &[&str]) -> Command {
    wrapper_with(dir, report, &[], command)
}

fn report(path: &Path) -> RunReport {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exit_codes_and_output_are_the_commands() {
    let dir = tempdir("codes");
    for code in [0, 3] {
        let name = format!("r{code}");
        let out: Output = wrapper(
            &dir,
            &name,
            &["sh", "-c", &format!("echo out; echo err >&2; exit {code}")],
        )
        .output()
        .expect("run");
        assert_eq!(out.status.code(), Some(code), "{}", text(&out.stderr));
        // The command's stdout is untouched; the wrapper's lines are on stderr, prefixed.
        assert_eq!(text(&out.stdout), "out\n");
        let err = text(&out.stderr);
        assert!(err.starts_with("err\n"), "{err}");
        assert!(
            err.lines().skip(1).all(|l| l.starts_with("slo-probe: ")),
            "{err}"
        );
        let r = report(&dir.join(format!("{name}.json")));
        assert_eq!(r.exit.code, Some(code));
        assert_eq!(r.command[0], "sh");
        assert!(r.wall_s >= 0.0);
        assert!(r.interrupted.is_none());
        let summary = std::fs::read_to_string(dir.join(format!("{name}.txt"))).expect("txt");
        assert!(
            summary.contains(&format!("exited with {code}")),
            "{summary}"
        );
    }
    let out = wrapper(&dir, "r127", &["no-such-command-anywhere"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("not found in PATH"));
}

#[test]
fn a_command_killed_by_a_signal_is_re_raised_and_reported() {
    let dir = tempdir("signal");
    let out = wrapper(&dir, "killed", &["sh", "-c", "kill -KILL $$"])
        .output()
        .expect("run");
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{:?}", out.status);
    let r = report(&dir.join("killed.json"));
    assert_eq!(r.exit.code, None);
    assert_eq!(r.exit.signal, Some(libc::SIGKILL));
    assert_eq!(r.exit.signal_name.as_deref(), Some("SIGKILL"));
}

#[test]
fn the_shim_variable_reaches_a_grandchild_and_a_users_own_is_kept() {
    let dir = tempdir("inject");
    let grandchild = [
        "sh",
        "-c",
        "sh -c 'echo \"$CUDA_INJECTION64_PATH|$SLO_PROBE_SOCKET\"'",
    ];
    let out = wrapper(&dir, "inj", &grandchild).output().expect("run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    let (lib, socket) = line.trim().split_once('|').expect("two values");
    assert_eq!(lib, "/opt/test/libslo_probe_cupti.so");
    assert!(socket.ends_with("shim.sock"), "{line}");
    assert_eq!(
        report(&dir.join("inj.json")).injected.as_deref(),
        Some("/opt/test/libslo_probe_cupti.so")
    );

    let out = wrapper(&dir, "user", &grandchild)
        .env("CUDA_INJECTION64_PATH", "/users/own.so")
        .output()
        .expect("run");
    assert!(text(&out.stdout).starts_with("/users/own.so|"));
    let err = text(&out.stderr);
    assert!(
        err.contains("CUDA_INJECTION64_PATH is already set to /users/own.so; keeping it"),
        "{err}"
    );
    assert_eq!(report(&dir.join("user.json")).injected, None);
}

/// A stand-in for torch's optimizers, as torch >= 2.0 lays them out: `torch.optim.optimizer`
/// keeps the global step post-hooks, and `Optimizer.step` runs them after each step.
const FAKE_TORCH: &[(&str, &str)] = &[
    ("torch/__init__.py", "from . import optim\n"),
    (
        "torch/optim/__init__.py",
        "from .optimizer import Optimizer\n",
    ),
    (
        "torch/optim/optimizer.py",
        "_hooks = {}\n\
         def register_optimizer_step_post_hook(hook):\n    _hooks[len(_hooks)] = hook\n\
         class Optimizer:\n    def step(self):\n        \
         for h in list(_hooks.values()):\n            h(self, (), {})\n",
    ),
];

/// A script without markers: three steps of one optimizer, one of another; it prints where
/// `slo_probe` came from and the step the automatic clock has open.
const UNMARKED: &str = "import torch, slo_probe, os\n\
    a, b = torch.optim.Optimizer(), torch.optim.Optimizer()\n\
    for _ in range(3):\n    a.step()\n    b.step()\n\
    print(os.path.dirname(os.path.dirname(slo_probe.__file__)), \
    slo_probe._autostep.open_step(), os.environ.get('CHAINED'))\n";

#[test]
fn a_python_script_without_markers_gets_them_from_its_optimizer() {
    let python = match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => "python3",
        _ => {
            eprintln!("skipped: no python3");
            return;
        }
    };
    let dir = tempdir("autostep");
    let lib = dir.join("lib");
    for (rel, text) in FAKE_TORCH {
        let path = lib.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    // The environment's own sitecustomize, which the bootstrap must still run.
    let site = dir.join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(
        site.join("sitecustomize.py"),
        "import os\nos.environ['CHAINED'] = 'yes'\n",
    )
    .unwrap();
    let pythonpath = format!("{}:{}", lib.display(), site.display());
    let run = |flags: &[&str], name: &str| {
        wrapper_with(&dir, name, flags, &[python, "-c", UNMARKED])
            .env("PYTHONPATH", &pythonpath)
            .env_remove("SLO_PROBE_SHIM")
            .env_remove("SLO_PROBE_AUTO_STEPS")
            .output()
            .expect("run")
    };
    // On: the package comes from run's private folder (none is installed here), the clock
    // counts the first optimizer's steps (begun at its 1st, 2nd, 3rd: index 2 open), and the
    // environment's sitecustomize ran.
    let out = run(&[], "auto");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{line}");
    assert!(
        fields[0].contains("slo-probe-python-"),
        "slo_probe from {line}"
    );
    assert_eq!(&fields[1..], ["2", "yes"], "{line}");
    assert!(
        !Path::new(fields[0]).exists(),
        "run removes its folder when the command ends"
    );
    // Off: no bootstrap, so no package either (the script's import fails).
    let out = run(&["--no-auto-steps"], "off");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("No module named 'slo_probe'"),
        "{}",
        text(&out.stderr)
    );
}

/// Starts the wrapper with a command that prints `ready` once it trapped its signals.
fn start_ready(mut cmd: Command) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("run");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20)).as_deref(),
        Ok("ready")
    );
    (child, rx)
}

#[test]
fn term_sent_to_the_wrapper_is_forwarded_and_a_stuck_command_is_killed() {
    let dir = tempdir("term");
    let script = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done";
    let (mut child, rx) = start_ready(wrapper(&dir, "term", &["sh", "-c", script]));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(7));
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).as_deref(),
        Ok("got-term")
    );
    let r = report(&dir.join("term.json"));
    assert_eq!(r.interrupted.as_deref(), Some("SIGTERM"));
    assert!(!r.killed_after_timeout);

    // A command that ignores TERM gets SIGKILL after --kill-after.
    let script = "trap '' TERM; echo ready; while :; do sleep 0.05; done";
    let (mut child, _rx) = start_ready(wrapper_with(
        &dir,
        "stuck",
        &["--kill-after", "0.5"],
        &["sh", "-c", script],
    ));
    let t = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    let r = report(&dir.join("stuck.json"));
    assert!(r.killed_after_timeout);
    assert_eq!(r.exit.signal, Some(libc::SIGKILL));
}

#[test]
fn an_existing_report_stops_run_before_the_command_and_names_are_numbered() {
    let dir = tempdir("exists");
    std::fs::write(dir.join("taken.json"), "{}").expect("write");
    let out = wrapper(&dir, "taken", &["sh", "-c", "touch ran"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--force-overwrite"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.join("ran").exists(), "the command ran");
    let out = wrapper_with(
        &dir,
        "taken",
        &["--force-overwrite"],
        &["sh", "-c", "touch ran"],
    )
    .output()
    .expect("run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.join("ran").exists());
    assert_eq!(report(&dir.join("taken.json")).version, 1);

    // Default names: slo-probe-<host>-<n>.json, the first free n.
    for _ in 0..2 {
        let out = Command::new(BIN)
            .current_dir(&dir)
            .args(["run", "--config"])
            .arg(config(&dir, "/x.so", None))
            .args(["--no-ebpf", "--", "true"])
            .output()
            .expect("run");
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("slo-probe-") && n.ends_with(".json"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names[0].ends_with("-1.json") && names[1].ends_with("-2.json"),
        "{names:?}"
    );
    for n in &names {
        report(&dir.join(n));
    }
}

/// The wrapper in a pseudo-terminal, as a user runs it: Ctrl-C typed there reaches the command
/// once (it is in the wrapper's process group, and the wrapper does not forward a signal that
/// came from the terminal), and the report is still written.
#[test]
fn ctrl_c_in_a_terminal_reaches_the_command_once_and_the_report_is_written() {
    use portable_pty::{native_pty_system, CommandBuilder, PtySize};
    let dir = tempdir("pty");
    let cfg = config(&dir, "/x.so", None);
    let pty = native_pty_system()
        .openpty(PtySize {
            rows: 24,
            cols: 80,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("openpty");
    let run = |script: &str, name: &str| {
        let mut c = CommandBuilder::new(BIN);
        c.cwd(&dir);
        c.args(["run", "--no-ebpf", "-o", name, "--config"]);
        c.arg(&cfg);
        c.args(["--", "sh", "-c", script]);
        c.env_remove("CUDA_INJECTION64_PATH");
        c
    };
    // Counts the INTs it gets; `sleep` runs in the foreground, so a second INT (a forwarded
    // one) would arrive after the first trap ran and count.
    let script = "n=0; trap 'n=$((n+1))' INT; echo ready; i=0; \
                  while [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done; echo \"ints=$n\"";
    let mut child = pty
        .slave
        .spawn_command(run(script, "ctrlc"))
        .expect("spawn in the pty");
    let mut reader = pty.master.try_clone_reader().expect("reader");
    let mut writer = pty.master.take_writer().expect("writer");
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut screen = String::new();
    let wait_for = |screen: &mut String, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !screen.contains(what) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(b) => screen.push_str(&String::from_utf8_lossy(&b)),
                Err(_) => panic!("no {what:?} in the terminal:\n{screen}"),
            }
        }
    };
    wait_for(&mut screen, "ready");
    // Into the loop's first `sleep`.
    std::thread::sleep(Duration::from_millis(200));
    writer.write_all(b"\x03").expect("Ctrl-C");
    writer.flush().expect("flush");
    wait_for(&mut screen, "ints=");
    let status = child.wait().expect("wait");
    wait_for(&mut screen, "wrote");
    assert!(screen.contains("ints=1"), "{screen}");
    assert!(status.success(), "{status:?}\n{screen}");
    assert!(screen.contains("SIGINT from the terminal"), "{screen}");
    let r = report(&dir.join("ctrlc.json"));
    assert_eq!(r.interrupted.as_deref(), Some("SIGINT"));
    assert_eq!(r.exit.code, Some(0));

    // A command that dies of the Ctrl-C: the wrapper ends with SIGINT too, after its report.
    screen.clear();
    let mut child = pty
        .slave
        .spawn_command(run("echo ready; exec sleep 30", "died"))
        .expect("spawn in the pty");
    wait_for(&mut screen, "ready");
    std::thread::sleep(Duration::from_millis(200));
    writer.write_all(b"\x03").expect("Ctrl-C");
    let status = child.wait().expect("wait");
    assert!(status.signal().is_some(), "{status:?}\n{screen}");
    let r = report(&dir.join("died.json"));
    assert_eq!(r.exit.signal, Some(libc::SIGINT));
}

#[test]
fn listen_serves_the_state_api_while_the_command_runs() {
    let dir = tempdir("listen");
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    // The command reads the API of the agent `run` started for it.
    let script = "import json, os, time, urllib.request\n\
                  for _ in range(100):\n\
                  \x20   try:\n\
                  \x20       s = json.load(urllib.request.urlopen('http://' + os.environ['ADDR'] + '/api/v1/snapshot'))\n\
                  \x20       break\n\
                  \x20   except OSError:\n\
                  \x20       time.sleep(0.1)\n\
                  print('version', s['version'], 'socket', s['agent']['shim_socket'] == os.environ['SLO_PROBE_SOCKET'])\n";
    let out = wrapper_with(
        &dir,
        "listen",
        &["--listen", &addr.to_string()],
        &["python3", "-c", script],
    )
    .env("ADDR", addr.to_string())
    .output()
    .expect("run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "version 1 socket True\n");
    assert!(text(&out.stderr).contains(&format!("http://{addr}/api/v1/snapshot")));
    assert_eq!(
        report(&dir.join("listen.json")).agent,
        "in-process without eBPF"
    );
}

#[test]
fn heal_runs_the_healer_in_the_mode_asked_and_never_fails_the_command() {
    use slo_probe::{
        cli::run::HealMode,
        healer::journal::{self, Record},
    };
    let dir = tempdir("heal");
    let out = wrapper_with(&dir, "shadow", &["--heal", "shadow"], &["true"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = report(&dir.join("shadow.json"));
    assert_eq!(r.heal, Some(HealMode::Shadow));
    assert_eq!(
        r.state.healer.as_ref().map(|h| h.mode.as_str()),
        Some("shadow"),
        "{:?}",
        r.notes
    );
    let (lines, _) = journal::read(&dir.join("heal.jsonl")).expect("journal");
    assert!(
        lines
            .iter()
            .any(|l| matches!(&l.record, Record::Start { mode, .. } if mode == "shadow")),
        "{lines:?}"
    );
    let txt = std::fs::read_to_string(dir.join("shadow.txt")).expect("txt");
    assert!(txt.contains("healer:     shadow\n"), "{txt}");

    // heal.mode = on in the config: without --heal a run only shadows.
    let heal_on = format!(
        "{}mode = \"on\"\n",
        heal_section(&dir, &dir.join("heal.jsonl"))
    );
    let out = wrapper_healing(&dir, Some(&heal_on), "configured", &[], &["true"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = report(&dir.join("configured.json"));
    assert_eq!(r.heal, None);
    assert_eq!(
        r.state.healer.as_ref().map(|h| h.mode.as_str()),
        Some("shadow")
    );
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("acts only with --heal on")),
        "{:?}",
        r.notes
    );

    // A journal that cannot be created (a file where its folder should be): said, noted, and
    // the command runs all the same.
    std::fs::write(dir.join("a-file"), "").expect("file");
    let unusable = heal_section(&dir, &dir.join("a-file").join("heal.jsonl"));
    let out = wrapper_healing(
        &dir,
        Some(&unusable),
        "nojournal",
        &["--heal", "on"],
        &["sh", "-c", "exit 4"],
    )
    .output()
    .expect("run");
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("slo-probe: heal on: cannot use the heal journal")
            && err.contains("running without healing"),
        "{err}"
    );
    let r = report(&dir.join("nojournal.json"));
    assert!(r.state.healer.is_none());
    assert!(
        r.notes
            .iter()
            .any(|n| n.starts_with("no healer (heal on): cannot use the heal journal")),
        "{:?}",
        r.notes
    );
    let txt = std::fs::read_to_string(dir.join("nojournal.txt")).expect("txt");
    assert!(
        txt.contains("healer:     off (--heal on; see the notes)"),
        "{txt}"
    );
}

#[test]
fn a_journal_a_running_agent_heals_with_is_left_to_it() {
    let dir = tempdir("owner");
    let journal = dir.join("heal.jsonl");
    let agent_config = dir.join("agent.toml");
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    std::fs::write(
        &agent_config,
        format!(
            "[shim]\nsocket = {:?}\n[gpu]\nnvml = false\n{}",
            dir.join("agent.sock"),
            heal_section(&dir, &journal)
        ),
    )
    .expect("config");
    let mut agent = Command::new(BIN)
        .args(["agent", "--no-ebpf", "--log-level", "warn", "--config"])
        .arg(&agent_config)
        .args(["--listen", &listen.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .spawn()
        .expect("slo-probe agent");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&journal).map_or(true, |t| !t.contains("\"start\"")) {
        assert!(Instant::now() < deadline, "the agent journalled no start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = wrapper_with(&dir, "owned", &["--heal", "on"], &["true"])
        .output()
        .expect("run");
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let owned = format!("the healer of the slo-probe agent with pid {}", agent.id());
    assert!(err.contains(&owned), "{err}");
    let r = report(&dir.join("owned.json"));
    assert!(r.state.healer.is_none());
    assert!(r.notes.iter().any(|n| n.contains(&owned)), "{:?}", r.notes);
}
