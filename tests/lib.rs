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
    if is_root() {
        return true;
    }
    if std::env::var_os("SLO_PROBE_REQUIRE_ROOT_TESTS").is_some_and(|v| v == "1") {
        panic!("{test}: root-tier test run without root, and SLO_PROBE_REQUIRE_ROOT_TESTS=1");
    }
    eprintln!("{test}: skipped: needs root (eBPF in the real kernel); run scripts/test as root");
    false
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) {
    if let Err(e) = pin_thread_to_cpu(0, cpu) {
        panic!("sched_setaffinity({cpu}) failed: {e}");
    }
}

/// Pins thread `tid` (0: the calling thread) to one CPU; a queued thread moves at once.
pub fn pin_thread_to_cpu(tid: u32, cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity get valid
    // pointers.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
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
    run_victim_tid(name, cpu, window, behaviour, |_| contend())
}

/// [`run_victim`] whose `contend` gets the victim's thread id.
pub fn run_victim_tid<G>(
    name: &str,
    cpu: usize,
    window: Duration,
    behaviour: Behaviour,
    contend: impl FnOnce(u32) -> G,
) -> VictimReport {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let victim = thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            pin_to_cpu(cpu);
            ready_tx.send(gettid()).expect("ready");
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
    let tid = ready_rx.recv().expect("victim ready");
    let guard = contend(tid);
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

/// Hostile shim clients for the hardening tests (issue 16): rings that are not what they
/// claim, hellos with extra descriptors, floods of records, many short-lived processes.
pub mod hostile {
    use std::{
        io,
        os::{
            fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
            unix::net::UnixStream,
        },
        path::Path,
    };

    use slo_probe_common::{
        ring::{Ring, ShimHello, HELLO_MAGIC, RING_HEADER_LEN, RING_VERSION},
        GpuEventRecord, GpuGraphRecord, GpuKernelRecord, GpuMemRecord, GraphNodeRecord, Record,
        RecordHeader, StepRecord, StringRecord,
    };

    /// A ring in a memfd made by the test, sealed or not.
    pub struct HostileRing {
        /// The memfd.
        pub memfd: OwnedFd,
        /// Producer side.
        pub ring: Ring,
        /// Bytes mapped.
        pub len: usize,
    }

    impl HostileRing {
        /// A ring of `len` bytes named `name` (as `/proc/*/fd` shows it: `/memfd:<name>`);
        /// sealed against shrinking and growing as the real shim does, or not.
        pub fn new(name: &str, len: usize, sealed: bool) -> io::Result<Self> {
            let c = std::ffi::CString::new(name).map_err(io::Error::other)?;
            let flags = libc::MFD_CLOEXEC | if sealed { libc::MFD_ALLOW_SEALING } else { 0 };
            // SAFETY: a valid name and flags.
            let fd = unsafe { libc::memfd_create(c.as_ptr(), flags) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor.
            let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: valid fd.
            if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
                return Err(io::Error::last_os_error());
            }
            if sealed {
                // SAFETY: valid fd.
                let rc = unsafe {
                    libc::fcntl(
                        fd,
                        libc::F_ADD_SEALS,
                        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // SAFETY: a file of `len` bytes; the mapping is kept until the process exits.
            let base = unsafe { slo_probe_common::host::map_shared(fd, len) }
                .ok_or_else(io::Error::last_os_error)?;
            // SAFETY: a fresh zeroed mapping of `len` bytes.
            let ring = unsafe { Ring::init(base.as_ptr(), len, std::process::id()) }
                .map_err(|e| io::Error::other(e.to_string()))?;
            Ok(Self { memfd, ring, len })
        }

        /// The hello a shim of process `pid` sends for this ring.
        pub fn hello(&self, pid: u32) -> [u8; 32] {
            hello(pid, self.len)
        }
    }

    /// A hello for `pid` and a ring of `len` bytes.
    pub fn hello(pid: u32, len: usize) -> [u8; 32] {
        ShimHello {
            magic: HELLO_MAGIC,
            version: RING_VERSION,
            pid,
            ring_len: len as u64,
            cupti_version: 0,
            status: 0,
        }
        .to_bytes()
    }

    /// Sends `data` with `fds` attached in one message.
    pub fn send_with_fds(s: &UnixStream, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: pure computation.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        let mut control = vec![0u64; space.div_ceil(8)];
        // SAFETY: zeroed msghdr is valid; the buffers outlive sendmsg.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: the control buffer holds one cmsg of `bytes` bytes.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr(),
                    libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                    fds.len(),
                );
            }
        }
        // SAFETY: a valid socket and message.
        if unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Connects to `socket` and registers `ring` for this process.
    pub fn register(socket: &Path, ring: &HostileRing) -> io::Result<UnixStream> {
        let s = UnixStream::connect(socket)?;
        send_with_fds(
            &s,
            &ring.hello(std::process::id()),
            &[ring.memfd.as_raw_fd()],
        )?;
        Ok(s)
    }

    /// Descriptors of this process whose target is `/memfd:<name> (deleted)`.
    pub fn memfds_named(name: &str) -> usize {
        let want = format!("/memfd:{name} (deleted)");
        std::fs::read_dir("/proc/self/fd")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == want.as_str())
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// `n` child processes, each registering `ring` under its own pid, holding the connection
    /// `hold_ms`, then exiting (the short-lived registrations of item 4). At most `parallel`
    /// live at once. Returns their pids.
    pub fn short_lived_registrations(
        socket: &Path,
        ring: &HostileRing,
        n: usize,
        parallel: usize,
        hold_ms: u32,
    ) -> io::Result<Vec<u32>> {
        // Everything the children need is made before forking: a child of a multi-threaded
        // process only makes system calls.
        // SAFETY: a zeroed sockaddr_un is valid.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let path = socket.as_os_str().as_encoded_bytes();
        if path.len() >= addr.sun_path.len() {
            return Err(io::Error::other("socket path too long"));
        }
        for (d, s) in addr.sun_path.iter_mut().zip(path) {
            *d = *s as libc::c_char;
        }
        let len = ring.len;
        let memfd = ring.memfd.as_raw_fd();
        // SAFETY: pure computation.
        let space = unsafe { libc::CMSG_SPACE(4) } as usize;
        let mut pids = Vec::with_capacity(n);
        let mut live = 0usize;
        for _ in 0..n {
            if live >= parallel {
                // SAFETY: waiting for any child.
                unsafe { libc::wait(std::ptr::null_mut()) };
                live -= 1;
            }
            // SAFETY: the child only makes system calls and exits with _exit.
            let pid = unsafe { libc::fork() };
            if pid < 0 {
                return Err(io::Error::last_os_error());
            }
            if pid == 0 {
                // SAFETY: system calls on stack buffers; _exit never returns.
                unsafe {
                    let me = libc::getpid() as u32;
                    let hello = hello(me, len);
                    let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                    let rc = libc::connect(
                        s,
                        (&addr as *const libc::sockaddr_un).cast(),
                        std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                    );
                    if rc == 0 {
                        let mut control = [0u64; 4];
                        let mut iov = libc::iovec {
                            iov_base: hello.as_ptr() as *mut libc::c_void,
                            iov_len: hello.len(),
                        };
                        let mut msg: libc::msghdr = std::mem::zeroed();
                        msg.msg_iov = &mut iov;
                        msg.msg_iovlen = 1;
                        msg.msg_control = control.as_mut_ptr().cast();
                        msg.msg_controllen = space as _;
                        let cmsg = libc::CMSG_FIRSTHDR(&msg);
                        (*cmsg).cmsg_level = libc::SOL_SOCKET;
                        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                        (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
                        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), memfd);
                        libc::sendmsg(s, &msg, libc::MSG_NOSIGNAL);
                        let ts = libc::timespec {
                            tv_sec: (hold_ms / 1000) as libc::time_t,
                            tv_nsec: (hold_ms % 1000) as libc::c_long * 1_000_000,
                        };
                        libc::nanosleep(&ts, std::ptr::null_mut());
                    }
                    libc::_exit(0);
                }
            }
            pids.push(pid as u32);
            live += 1;
        }
        for _ in 0..live {
            // SAFETY: waiting for any child.
            unsafe { libc::wait(std::ptr::null_mut()) };
        }
        Ok(pids)
    }

    /// A xorshift generator: deterministic floods.
    pub struct Rng(pub u64);

    impl Rng {
        /// The next value.
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    fn random_fixed<R: Record>(rng: &mut Rng, out: &mut Vec<u8>) {
        let n = std::mem::size_of::<R>();
        let at = out.len();
        while out.len() < at + n {
            out.extend_from_slice(&rng.next_u64().to_ne_bytes());
        }
        out.truncate(at + n);
        let h = RecordHeader::of::<R>();
        out[at..at + 2].copy_from_slice(&h.kind.to_ne_bytes());
        out[at + 2..at + 4].copy_from_slice(&h.version.to_ne_bytes());
        out[at + 4..at + 8].copy_from_slice(&h.len.to_ne_bytes());
    }

    /// One random well-framed GPU record (any kind the shim sends, random contents) into `out`
    /// (cleared first).
    pub fn random_record(rng: &mut Rng, out: &mut Vec<u8>) {
        out.clear();
        match rng.next_u64() % 7 {
            0 => random_fixed::<GpuKernelRecord>(rng, out),
            1 => random_fixed::<GpuGraphRecord>(rng, out),
            2 => random_fixed::<GpuMemRecord>(rng, out),
            3 => random_fixed::<GraphNodeRecord>(rng, out),
            4 => random_fixed::<GpuEventRecord>(rng, out),
            5 => random_fixed::<StepRecord>(rng, out),
            _ => {
                let len = (rng.next_u64() % 512) as usize;
                let name: Vec<u8> = (0..len)
                    .map(|_| b'a' + (rng.next_u64() % 26) as u8)
                    .collect();
                out.resize(16 + name.len() + 16, 0);
                let kind = 1 + (rng.next_u64() % 2) as u32;
                let n = StringRecord::encode(rng.next_u64() as u32, kind, &name, out);
                out.truncate(n);
            }
        }
    }

    /// A realistic memcpy record at `t` ns (a job that copies and never marks a step).
    pub fn memcpy_record(t: u64) -> GpuMemRecord {
        GpuMemRecord {
            header: RecordHeader::of::<GpuMemRecord>(),
            start_ns: t,
            end_ns: t + 2_000,
            launch_ns: t - 1_000,
            bytes: 1 << 20,
            graph_node_id: 0,
            correlation_id: t as u32,
            device_id: 0,
            stream_id: 7,
            graph_id: 0,
            kind: 1,
            op_id: 0,
            launch_tid: 1,
            flags: 0,
        }
    }

    /// Resident set of process `pid`, bytes (`VmRSS`).
    pub fn rss_bytes(pid: u32) -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024)
    }

    /// Open descriptors of process `pid`.
    pub fn open_fds(pid: u32) -> usize {
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
    }

    /// `RING_HEADER_LEN` plus `data` bytes.
    pub const fn ring_len(data: usize) -> usize {
        RING_HEADER_LEN + data
    }
}

/// A fresh, empty folder for one test: `<tmp>/slo-probe-<suite>-<tag>-<pid>`.
pub fn tempdir(suite: &str, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("slo-probe-{suite}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Child processes killed (SIGKILL) and reaped when dropped.
pub struct Procs(pub Vec<std::process::Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
