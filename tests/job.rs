//! Root tier: following a job. The kernel-side filter follows a process started after attach
//! into the processes it forks and ignores everything else; the thread roles of a real
//! multi-process, multi-threaded workload (`examples/cpu-workload`: loader worker processes, a
//! pin-memory thread, communication threads over loopback TCP, a training loop, a logger).

use std::{
    collections::BTreeSet,
    io::Write,
    path::PathBuf,
    process::{Command, Stdio},
    sync::Mutex,
    time::Duration,
};

use slo_probe::{
    cli::{observe, report},
    collector::Collector,
    config::Config,
    sources::ebpf::{EbpfSettings, Probes},
};
use slo_probe_common::{decode_as, ProcessEventRecord, PROC_FORK};
use slo_probe_core::roles::{ProcessKind, Role};
use slo_probe_tests::root_or_skip;

static SERIAL: Mutex<()> = Mutex::new(());

/// A process that spins until killed.
struct Spinner(std::process::Child);

impl Spinner {
    fn start() -> Self {
        Self(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .expect("spawn spinner"),
        )
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn kernel_filter_follows_forks_after_attach_and_ignores_the_rest() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root_or_skip("kernel_filter") {
        return;
    }
    let outsider = Spinner::start();
    // The root waits for a line on stdin, then forks two generations of busy children.
    let mut root = Command::new("sh")
        .args([
            "-c",
            "read go; (timeout 0.5 sh -c 'while :; do :; done' &); \
             timeout 0.5 sh -c 'while :; do :; done'; sleep 0.2",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn root");
    let root_pid = root.id();
    let mut probes = Probes::load(&EbpfSettings {
        targets: Some(vec![root_pid]),
        net: false,
        ..Default::default()
    })
    .expect("load probes");
    root.stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("go");
    root.wait().expect("root");
    std::thread::sleep(Duration::from_millis(200));
    let read = probes.read().expect("read");

    let forks: Vec<ProcessEventRecord> = read
        .records
        .iter()
        .filter_map(|b| decode_as::<ProcessEventRecord>(b).ok())
        .filter(|e| e.event == PROC_FORK)
        .collect();
    let mut tree = BTreeSet::from([root_pid]);
    for e in &forks {
        if tree.contains(&e.ppid) {
            tree.insert(e.pid);
        }
    }
    let seen: BTreeSet<u32> = read.threads.iter().map(|t| t.stats.tgid).collect();
    eprintln!(
        "root {root_pid}: {} forks followed, processes with threads seen: {seen:?}, outsider {}",
        forks.len(),
        outsider.0.id()
    );
    assert!(
        tree.len() >= 4,
        "the forks after attach were not followed: {forks:?}"
    );
    assert!(seen.contains(&root_pid));
    assert!(
        tree.iter().filter(|p| seen.contains(p)).count() >= 3,
        "threads of the forked processes were not followed"
    );
    assert!(
        seen.is_subset(&tree),
        "threads outside the job were followed: {:?}",
        seen.difference(&tree).collect::<Vec<_>>()
    );
    assert!(!seen.contains(&outsider.0.id()));
    assert!(!seen.contains(&std::process::id()));
}

/// `target/<profile>/slo-probe-workload`, built if a plain `cargo test` did not build it.
fn workload_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    // target/<profile>/deps/job-<hash>
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("slo-probe-workload");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = dir.ends_with("release");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "slo-probe-workload"]);
        if release {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("cargo build").success());
    }
    bin
}

#[test]
fn roles_of_a_real_multi_process_workload() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root_or_skip("roles") {
        return;
    }
    let bin = workload_binary();
    let mut config = Config::default();
    config.agent.tick_ms = 250;
    let mut collector = Collector::new(&config, false, true).expect("collector");
    let command = vec![
        bin.display().to_string(),
        "--duration".into(),
        "2".into(),
        "--augment".into(),
        "16".into(),
    ];
    let obs = observe::run(
        &mut collector,
        &command,
        Duration::from_secs(10),
        config.tick(),
        &observe::Inject::default(),
        None,
    )
    .expect("observe");
    assert!(obs.exit.is_some_and(|s| s.success()), "workload failed");
    eprintln!("{}", report::report(&obs, "slo-probe-workload", 20));
    let t = obs.snapshot.threads.as_ref().expect("threads");
    let job: Vec<_> = t
        .threads
        .iter()
        .filter(|th| obs.pids.contains(&th.pid))
        .collect();
    let names = |role: Role| -> BTreeSet<String> {
        job.iter()
            .filter(|th| th.role == role)
            .map(|th| th.name.clone())
            .collect()
    };
    assert_eq!(names(Role::Main), BTreeSet::from(["train-main".to_owned()]));
    assert_eq!(
        names(Role::DataLoader),
        BTreeSet::from(["loader-0", "loader-1", "loader-2"].map(String::from))
    );
    assert_eq!(
        names(Role::Communication),
        BTreeSet::from(["comm-allreduce", "comm-peer"].map(String::from))
    );
    assert_eq!(
        names(Role::PinMemory),
        BTreeSet::from(["pin-memory".to_owned()])
    );
    assert_eq!(
        names(Role::Other),
        BTreeSet::from(["metrics-log".to_owned()])
    );

    // The loader processes were forked after attach; they are followed and classified.
    let loaders: Vec<_> = t
        .processes
        .iter()
        .filter(|p| obs.pids.contains(&p.pid) && p.kind == ProcessKind::DataLoader)
        .collect();
    assert_eq!(loaders.len(), 3, "{:?}", t.processes);
    assert!(loaders.iter().all(|p| p.counts.runq.count > 0));

    // Every metric carries a role: the communication threads moved the gradients over TCP.
    let by_role = t.by_role(Some(&obs.pids));
    let comm = by_role[&Role::Communication];
    assert!(
        comm.tcp_sent_bytes > 0 && comm.tcp_recv_bytes > 0,
        "{comm:?}"
    );
    assert_eq!(by_role[&Role::DataLoader].tcp_sent_bytes, 0);
    assert!(by_role.values().all(|c| c.runq.count > 0));
    let net = obs.snapshot.net.as_ref().expect("tcp up");
    assert!(
        net.conns
            .iter()
            .filter(|c| obs.pids.contains(&c.pid))
            .all(|c| c.role == Role::Communication),
        "{:?}",
        net.conns
    );
}

/// No tracefs anywhere (a container's `/sys`, the GPU machine as it boots): every probe family
/// still attaches, since all are BTF tracepoints, and the TCP probes count this test's bytes.
/// The agent binary runs in a mount namespace of its own with tracefs and debugfs (whose
/// `tracing` directory automounts tracefs) unmounted; with classic tracepoints, which need
/// tracefs to attach, the TCP family was down here.
#[test]
fn every_probe_comes_up_without_tracefs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root_or_skip("no_tracefs") {
        return;
    }
    let bin = slo_probe_tests::artefact("slo-probe", "slo-probe");
    let dir = std::env::temp_dir().join(format!("slo-probe-notracefs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\ntick_ms = 250\n\n[shim]\nsocket = {:?}\n",
            dir.join("shim.sock").display().to_string()
        ),
    )
    .expect("config");
    let addr = slo_probe_tests::free_addr();
    let script = format!(
        "for m in /sys/kernel/debug/tracing /sys/kernel/tracing /sys/kernel/debug; do \
           umount -l $m 2>/dev/null; done; \
         if grep -qw tracefs /proc/self/mountinfo; then echo 'tracefs still mounted' >&2; exit 97; fi; \
         exec {} agent --config {} --listen {addr}",
        bin.display(),
        config.display()
    );
    let mut agent = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare");
    struct Stop<'a>(&'a mut std::process::Child);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
            let _ = self.0.wait();
        }
    }
    let agent = Stop(&mut agent);
    let metrics = || slo_probe_tests::http_get(addr, "/metrics").map(|(_, body)| body);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut text = String::new();
    // Loopback traffic from this process (followed: the agent follows the whole node) until
    // the agent reports TCP bytes.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let peer = listener.local_addr().expect("addr");
    let sent_bytes = |t: &str| -> f64 {
        t.lines()
            .filter(|l| l.starts_with("slo_probe_tcp_sent_bytes_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = agent.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = agent.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("agent exited ({status}): {err}");
        }
        if let Ok(mut s) = std::net::TcpStream::connect(peer) {
            let _ = s.write_all(&[0x5a; 64 * 1024]);
            let _ = listener.accept();
        }
        if let Ok(t) = metrics() {
            text = t;
            if sent_bytes(&text) > 0.0 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let up = |probe: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("slo_probe_probe_up{{probe=\"{probe}\"")))
            .unwrap_or_else(|| panic!("no slo_probe_probe_up for {probe}:\n{text}"))
            .to_owned()
    };
    for probe in ["runqueue", "process", "tcp"] {
        let line = up(probe);
        eprintln!("without tracefs: {line}");
        assert!(line.ends_with(" 1"), "{line}");
    }
    assert!(
        sent_bytes(&text) > 0.0,
        "TCP probes up but no bytes counted"
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}
