//! Helpers for slo-probe's integration tests: make kernel effects on purpose and measure them
//! independently of the probes.

use std::{
    path::PathBuf,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

/// Whether root-tier tests may skip when not privileged. Set `SLO_PROBE_REQUIRE_ROOT_TESTS=1`
/// (scripts/test and CI do) to make a missing privilege a failure instead of a skip.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("SLO_PROBE_REQUIRE_ROOT_TESTS").is_some_and(|v| v == "1") {
        panic!("{test}: root-tier test run without root, and SLO_PROBE_REQUIRE_ROOT_TESTS=1");
    }
    eprintln!("{test}: skipped: needs root (eBPF in the real kernel); run scripts/test as root");
    false
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity get valid
    // pointers.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(rc, 0, "sched_setaffinity({cpu}) failed");
    }
}

/// Number of CPUs this process may run on.
pub fn online_cpus() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC, ns.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Thread id of the caller.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The kernel's own scheduler accounting for the calling thread
/// (`/proc/thread-self/schedstat`, CONFIG_SCHED_INFO): time on CPU, time waiting on a run queue,
/// and the number of times it got a CPU. Independent of the probes: it is kept by the scheduler
/// core (`sched_info_enqueue`/`sched_info_arrive`), not by tracepoints.
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedStat {
    /// ns on CPU.
    pub run_ns: u64,
    /// ns runnable but waiting.
    pub wait_ns: u64,
    /// times it got a CPU.
    pub slices: u64,
}

impl SchedStat {
    /// Reads the calling thread's schedstat.
    pub fn of_this_thread() -> Self {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat")
            .expect("/proc/thread-self/schedstat (CONFIG_SCHED_INFO) is needed by this test");
        let v: Vec<u64> = text
            .split_whitespace()
            .map(|x| x.parse().expect("schedstat field"))
            .collect();
        Self {
            run_ns: v[0],
            wait_ns: v[1],
            slices: v[2],
        }
    }
}

/// The kernel's (voluntary, involuntary) context-switch counts of the calling thread.
pub fn ctxt_switches() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .expect("ctxt_switches field")
    };
    (
        field("voluntary_ctxt_switches:"),
        field("nonvoluntary_ctxt_switches:"),
    )
}

/// Busy threads pinned to one CPU, until dropped.
pub struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Hogs {
    /// Starts `n` busy threads pinned to `cpu`.
    pub fn start(n: usize, cpu: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|i| {
                let stop = stop.clone();
                thread::Builder::new()
                    .name(format!("hog-{i}"))
                    .spawn(move || {
                        pin_to_cpu(cpu);
                        while !stop.load(Ordering::Relaxed) {
                            std::hint::spin_loop();
                        }
                    })
                    .expect("spawn hog")
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What a victim thread measured about itself.
#[derive(Clone, Copy, Debug)]
pub struct VictimReport {
    /// Its thread id.
    pub tid: u32,
    /// Wall time of the measured window, ns.
    pub wall_ns: u64,
    /// Its CPU time in the window, ns.
    pub cpu_ns: u64,
    /// The kernel's schedstat over the thread's whole life, read at the end of the window.
    pub life: SchedStat,
    /// The kernel's (voluntary, involuntary) context-switch counts of the thread over its whole
    /// life (`/proc/thread-self/status`), read at the end of the window.
    pub ctxt: (u64, u64),
}

impl VictimReport {
    /// Run-queue wait of a thread that never blocks: the part of the window it was not on a CPU.
    pub fn off_cpu_ns(&self) -> u64 {
        self.wall_ns.saturating_sub(self.cpu_ns)
    }
}

/// How a victim behaves in its window.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Always runnable: every wait starts with a preemption.
    Busy,
    /// Sleeps `sleep` after every `work` of spinning: waits start with wakeups.
    SleepWake {
        /// Spin per cycle.
        work: Duration,
        /// Sleep per cycle.
        sleep: Duration,
    },
}

/// Runs a victim thread named `name`, pinned to `cpu`. `contend` is called once the victim has
/// taken its baseline readings (start contention there, so that the victim's own start is not
/// part of the measurement) and what it returns is dropped after the window.
pub fn run_victim<G>(
    name: &str,
    cpu: usize,
    window: Duration,
    behaviour: Behaviour,
    contend: impl FnOnce() -> G,
) -> VictimReport {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let victim = thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            pin_to_cpu(cpu);
            ready_tx.send(()).expect("ready");
            go_rx.recv().expect("go");
            let c0 = thread_cpu_ns();
            let w0 = monotonic_ns();
            let end = w0 + window.as_nanos() as u64;
            while monotonic_ns() < end {
                match behaviour {
                    Behaviour::Busy => std::hint::spin_loop(),
                    Behaviour::SleepWake { work, sleep } => {
                        let until = monotonic_ns() + work.as_nanos() as u64;
                        while monotonic_ns() < until {
                            std::hint::spin_loop();
                        }
                        thread::sleep(sleep);
                    }
                }
            }
            let w1 = monotonic_ns();
            let c1 = thread_cpu_ns();
            let s1 = SchedStat::of_this_thread();
            let ctxt = ctxt_switches();
            VictimReport {
                tid: gettid(),
                wall_ns: w1 - w0,
                cpu_ns: c1 - c0,
                life: s1,
                ctxt,
            }
        })
        .expect("spawn victim");
    ready_rx.recv().expect("victim ready");
    let guard = contend();
    // Give the contenders a moment to be on the CPU before the window opens.
    thread::sleep(Duration::from_millis(50));
    go_tx.send(()).expect("go");
    let report = victim.join().expect("victim thread");
    drop(guard);
    report
}

/// Whether `probe` agrees with `reference` within `rel` (fraction) plus `abs`.
pub fn agrees(probe: u64, reference: u64, rel: f64, abs: u64) -> Result<(), String> {
    let diff = probe.abs_diff(reference);
    let allowed = (reference as f64 * rel) as u64 + abs;
    if diff <= allowed {
        Ok(())
    } else {
        Err(format!(
            "probe {probe} vs reference {reference}: differ by {diff}, allowed {allowed}"
        ))
    }
}

/// The directory holding the test binaries' siblings: `target/<profile>`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf()
}

/// A workspace artefact in `target/<profile>` (`slo-probe`, `libslo_probe_cupti.so`), built or
/// found up to date by cargo first: `cargo test` of this crate does not build the agent's binary
/// or the shim, and a stale one would test old code.
pub fn artefact(file: &str, package: &str) -> PathBuf {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let dir = target_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", package]);
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("cargo build").success(),
        "cargo build -p {package}"
    );
    let path = dir.join(file);
    assert!(
        path.exists(),
        "{} missing after building {package}",
        path.display()
    );
    path
}

/// A free TCP port on loopback (bound, then released).
pub fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// A minimal HTTP/1.0 GET: the status and the body.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    Ok((status, body.to_owned()))
}

/// A shim source listening on `socket` with its own pipelines (no NVML), as the agent's
/// collector would hold them.
pub struct Shims {
    /// The source.
    pub source: slo_probe::sources::shim::ShimSource,
    /// Its pipelines.
    pub pipelines: Arc<std::sync::Mutex<slo_probe_core::pipeline::Pipelines>>,
}

impl Shims {
    /// Listens on `socket`; processes get `settings`.
    pub fn start(
        socket: &std::path::Path,
        settings: slo_probe_core::pipeline::PipelineSettings,
    ) -> std::io::Result<Self> {
        let pipelines = Arc::new(std::sync::Mutex::new(
            slo_probe_core::pipeline::Pipelines::new(settings)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        ));
        let source =
            slo_probe::sources::shim::ShimSource::start(socket, &[], None, pipelines.clone(), None)
                .map_err(std::io::Error::other)?;
        Ok(Self { source, pipelines })
    }

    /// Listens on `socket` with the live agent's settings (default SLO tree, 1 s ticks).
    pub fn live(socket: &std::path::Path) -> std::io::Result<Self> {
        Self::start(
            socket,
            slo_probe_core::pipeline::PipelineSettings::live(
                slo_probe_core::slo::SloSpec::default(),
                1_000_000_000,
            ),
        )
    }

    /// What every process shows now.
    pub fn processes(&self) -> Vec<slo_probe_core::snapshot::ProcessSnapshot> {
        self.pipelines
            .lock()
            .map(|mut p| p.snapshot())
            .unwrap_or_default()
    }
}
