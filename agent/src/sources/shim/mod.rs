//! The CUPTI shims' source: a Unix socket where each shim registers (its ring's memfd arrives
//! with `SCM_RIGHTS`), and a consumer thread that drains every ring every 50 ms, decodes the
//! records and folds them into one [`TraceAssembler`] per training process.
//!
//! Only root and the allowed user may connect (`SO_PEERCRED`; the socket file is 0660). A
//! process that dies mid-write leaves nothing half-visible (the ring publishes whole records);
//! its ring is drained once more and unmapped when its connection closes. A restarted agent
//! gets the same rings back: shims re-register every second.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{self, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{
            fs::PermissionsExt,
            net::{UnixListener, UnixStream},
        },
    },
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use slo_probe_common::{
    decode,
    ring::{Ring, ShimHello, RING_HEADER_LEN},
};
use slo_probe_core::{
    gpu::GpuHistory,
    gputrace::{Iteration, ShimProcess, TraceAssembler},
    host::HostSample,
    occupancy::SmLimits,
    slo::{SloEngine, SloSpec},
};

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/slo-probe/shim.sock";
/// Iterations kept per process for snapshots.
const KEEP_ITERATIONS: usize = 512;
/// How long after its end marker an iteration waits for its GPU records: CUPTI hands records
/// over in buffers, flushed by the shim every 200 ms.
const SETTLE_NS: u64 = 1_500_000_000;

/// Default lag of the SLO windows behind now: the settle time and a 1 s tick.
const DEFAULT_HOST_LAG_NS: u64 = SETTLE_NS + 1_000_000_000;

/// Errors of the shim source.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// The socket could not be created.
    #[error(
        "cannot listen for CUPTI shims on {path}: {source}; choose another path with \
         shim.socket in the config, or run as root"
    )]
    Listen {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// One shim's mapping.
struct Mapping {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is only accessed through `Ring`, whose consumer side is used by the single
// consumer thread.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

struct Conn {
    pid: u32,
    cupti_version: u32,
    stream: UnixStream,
    ring: Ring,
    _mapping: Mapping,
    closed: bool,
}

struct State {
    conns: Vec<Conn>,
    procs: BTreeMap<u32, Proc>,
    recorder: Option<PathBuf>,
    limits: Option<SmLimits>,
    /// NVML's recent samples, when the agent has NVML.
    gpu_history: Option<Arc<Mutex<GpuHistory>>>,
    /// The SLO tree for processes that register from now on.
    slo: SloSpec,
    /// How far behind now the engines close windows: the settle time of iterations, and the
    /// host samples' period (a window needs a host sample after its end).
    host_lag_ns: u64,
}

/// One training process: what was reported, the iteration assembler, the SLO engine.
struct Proc {
    info: ShimProcess,
    asm: TraceAssembler,
    slo: SloEngine,
    /// Windows closed when `info.slo` was last refreshed.
    slo_windows: u64,
    /// The shim disconnected and its last window was closed: the engine stops advancing (no
    /// stall is reported for a job that ended).
    finished: bool,
}

/// The listener, the consumer thread, and what they collected.
pub struct ShimSource {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    path: PathBuf,
}

impl ShimSource {
    /// Listens on `path`, accepting shims from root, the agent's own user and `allowed`.
    /// With `record_dir`, every record consumed is also appended to `<dir>/<pid>.bin` (the
    /// fixtures that tests replay).
    pub fn start(
        path: &Path,
        allowed: &[u32],
        record_dir: Option<PathBuf>,
    ) -> Result<Self, ShimError> {
        let allowed = allowed.to_vec();
        let listen_err = |source| ShimError::Listen {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(listen_err)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(listen_err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(listen_err)?;
        if let Some(&uid) = allowed.first() {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|e| listen_err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            // SAFETY: a valid path; -1 keeps the group.
            unsafe { libc::chown(c.as_ptr(), uid, u32::MAX) };
        }
        if let Some(d) = &record_dir {
            std::fs::create_dir_all(d).map_err(listen_err)?;
        }
        let state = Arc::new(Mutex::new(State {
            conns: Vec::new(),
            procs: BTreeMap::new(),
            recorder: record_dir,
            limits: None,
            gpu_history: None,
            slo: SloSpec::default(),
            host_lag_ns: DEFAULT_HOST_LAG_NS,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let state = state.clone();
            let stop = stop.clone();
            thread::Builder::new()
                .name("slo-shim-accept".into())
                .spawn(move || accept_loop(listener, state, stop, allowed))
                .map_err(listen_err)?;
        }
        {
            let state = state.clone();
            let stop = stop.clone();
            thread::Builder::new()
                .name("slo-shim-drain".into())
                .spawn(move || drain_loop(state, stop))
                .map_err(listen_err)?;
        }
        Ok(Self {
            state,
            stop,
            path: path.to_owned(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What every shim reported so far.
    pub fn snapshot(&self) -> Vec<ShimProcess> {
        self.state
            .lock()
            .map(|s| s.procs.values().map(|p| p.info.clone()).collect())
            .unwrap_or_default()
    }

    /// Drains every ring now and completes every pending iteration (used at the end of
    /// `observe`, after the command has exited).
    pub fn finish(&self) {
        if let Ok(mut s) = self.state.lock() {
            drain_all(&mut s, true);
        }
    }

    /// Asks every connected shim for node-level graph tracing during `steps` iterations.
    pub fn request_diagnostic(&self, steps: u32) {
        use slo_probe_common::{
            gpu::DEPTH_NODES,
            ring::{encode_depth_request, next_generation, DepthDuration},
        };
        if let Ok(s) = self.state.lock() {
            for c in &s.conns {
                let h = c.ring.header();
                let generation = next_generation(h.control.load(Ordering::Relaxed));
                h.control.store(
                    encode_depth_request(generation, DEPTH_NODES, DepthDuration::Steps(steps)),
                    Ordering::Release,
                );
            }
        }
    }

    /// The GPU's per-SM limits (from NVML's compute capability), for theoretical occupancy.
    pub fn set_limits(&self, limits: Option<SmLimits>) {
        if let Ok(mut s) = self.state.lock() {
            s.limits = limits;
            for p in s.procs.values_mut() {
                p.asm.set_limits(limits);
            }
        }
    }

    /// NVML's samples: each completed iteration gets what NVML saw on its GPU while it ran.
    pub fn set_gpu_history(&self, history: Arc<Mutex<GpuHistory>>) {
        if let Ok(mut s) = self.state.lock() {
            s.gpu_history = Some(history);
        }
    }

    /// The SLO tree of processes that register from now on, and how far behind now windows
    /// close (the host samples' period plus the iterations' settle time).
    pub fn set_slo(&self, spec: SloSpec, tick: Duration) {
        if let Ok(mut s) = self.state.lock() {
            s.slo = spec;
            s.host_lag_ns = SETTLE_NS + tick.as_nanos() as u64;
        }
    }

    /// Host counters of each training process's part of the job (the process and its
    /// descendants), for its SLO engine.
    pub fn push_host(&self, samples: Vec<(u32, HostSample)>) {
        if let Ok(mut s) = self.state.lock() {
            for (pid, sample) in samples {
                if let Some(p) = s.procs.get_mut(&pid) {
                    p.slo.push_host(sample);
                }
            }
        }
    }

    /// Process ids of the shims seen so far.
    pub fn pids(&self) -> Vec<u32> {
        self.state
            .lock()
            .map(|s| s.procs.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Decode failures, for the agent's error counter.
    pub fn decode_failed(&self) -> u64 {
        self.snapshot().iter().map(|p| p.decode_failed).sum()
    }
}

impl Drop for ShimSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Gives iterations that have none yet what NVML saw on their GPU, once a sample after their
/// end exists.
fn align_iterations(iterations: &mut [Iteration], history: &GpuHistory) {
    for it in iterations.iter_mut().filter(|i| i.gpu.is_none()) {
        if let Some(dev) = it.device {
            it.gpu = history.align(dev, it.gpu_start_ns, it.gpu_end_ns);
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    allowed: Vec<u32>,
) {
    let _ = listener.set_nonblocking(true);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => match register(stream, me, &allowed) {
                Ok(conn) => {
                    log::info!("CUPTI shim of pid {} registered", conn.pid);
                    if let Ok(mut s) = state.lock() {
                        // A re-registration replaces the old connection of that process.
                        s.conns.retain(|c| c.pid != conn.pid);
                        let pid = conn.pid;
                        let conn_cupti = conn.cupti_version;
                        let limits = s.limits;
                        s.conns.push(conn);
                        let spec = s.slo.clone();
                        let (rank, job_id) = crate::sources::procfs::job_identity(pid);
                        let p = s.procs.entry(pid).or_insert_with(|| {
                            let mut asm = TraceAssembler::new();
                            asm.set_limits(limits);
                            Proc {
                                info: ShimProcess {
                                    pid,
                                    cupti_version: conn_cupti,
                                    rank,
                                    job_id,
                                    ..Default::default()
                                },
                                asm,
                                // The spec was validated with the config.
                                slo: SloEngine::new(spec.clone()).unwrap_or_else(|_| {
                                    SloEngine::new(SloSpec::default()).expect("default SLO spec")
                                }),
                                slo_windows: 0,
                                finished: false,
                            }
                        });
                        p.finished = false;
                    }
                }
                Err(e) => log::warn!("refused a CUPTI shim connection: {e}"),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                log::warn!("shim socket accept failed: {e}");
                thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn register(stream: UnixStream, me: u32, allowed: &[u32]) -> io::Result<Conn> {
    let cred = peer_cred(&stream)?;
    if cred.uid != 0 && cred.uid != me && !allowed.contains(&cred.uid) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "uid {} is not allowed (add it to shim.allowed_uids)",
                cred.uid
            ),
        ));
    }
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let (hello, fd) = recv_with_fd(&stream)?;
    let hello = ShimHello::from_bytes(&hello)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a shim hello"))?;
    // The kernel gives the peer's pid in our namespace; the shim says its own, which differs in
    // a container with its own pid namespace (a Kubernetes pod without hostPID). It must be the
    // peer's pid in its innermost namespace; the host's pid is used from here on (the eBPF
    // probes and /proc speak it).
    let host_pid = cred.pid as u32;
    if hello.pid != host_pid {
        let inner = std::fs::read_to_string(format!("/proc/{host_pid}/status"))
            .ok()
            .and_then(|s| innermost_nspid(&s));
        if inner != Some(hello.pid) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "hello for pid {} from pid {host_pid} (pid {} in its own namespace)",
                    hello.pid,
                    inner.map_or("unknown".into(), |p| p.to_string())
                ),
            ));
        }
        log::info!(
            "shim of pid {host_pid} registered from a pid namespace where it is pid {}",
            hello.pid
        );
    }
    let len = usize::try_from(hello.ring_len)
        .ok()
        .filter(|&l| l > RING_HEADER_LEN && l <= 2 << 30)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad ring size"))?;
    // The file must really be that large, or the mapping would fault on access.
    let size = File::from(fd.try_clone()?).metadata()?.len();
    if size < len as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "ring file too small",
        ));
    }
    // SAFETY: a file we were given, of a size checked above.
    let base: *mut libc::c_void =
        unsafe { slo_probe_common::host::map_shared(fd.as_raw_fd(), len) }
            .ok_or_else(io::Error::last_os_error)?
            .as_ptr()
            .cast();
    let mapping = Mapping { base, len };
    // SAFETY: the mapping lives in the same Conn as the ring.
    let ring = unsafe { Ring::open(base.cast(), len) }
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    stream.set_nonblocking(true)?;
    Ok(Conn {
        pid: host_pid,
        cupti_version: hello.cupti_version,
        stream,
        ring,
        _mapping: mapping,
        closed: false,
    })
}

/// The pid in the innermost pid namespace, from `/proc/<pid>/status`'s `NSpid:` line (one pid
/// per nested namespace, outermost first).
fn innermost_nspid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

fn peer_cred(s: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid socket and out buffer.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

fn recv_with_fd(s: &UnixStream) -> io::Result<(Vec<u8>, OwnedFd)> {
    let mut data = vec![0u8; 64];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: zeroed msghdr is valid; buffers outlive recvmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: valid socket and message.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    data.truncate(n as usize);
    // SAFETY: walking the control buffer recvmsg filled.
    let fd = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "no ring fd attached",
            ));
        }
        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>())
    };
    // SAFETY: a descriptor the kernel just installed for us.
    Ok((data, unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn drain_loop(state: Arc<Mutex<State>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(50));
        if let Ok(mut s) = state.lock() {
            drain_all(&mut s, false);
        }
    }
}

fn drain_all(s: &mut State, flush: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    let State {
        conns,
        procs,
        recorder,
        gpu_history,
        host_lag_ns,
        ..
    } = s;
    let now = crate::collector::monotonic_ns();
    for c in conns.iter_mut() {
        let Some(proc_) = procs.get_mut(&c.pid) else {
            continue;
        };
        let Proc {
            info: p, asm, slo, ..
        } = proc_;
        let mut out = recorder
            .as_ref()
            .and_then(|d| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(d.join(format!("{}.bin", c.pid)))
                    .ok()
            })
            .map(io::BufWriter::new);
        let mut failed = 0u64;
        let n = c.ring.drain(&mut buf, |bytes| {
            if let Some(w) = out.as_mut() {
                let _ = w.write_all(bytes);
            }
            match decode(bytes) {
                Ok((r, _)) => asm.push(&r),
                Err(_) => failed += 1,
            }
        });
        if let Some(mut w) = out {
            let _ = w.flush();
        }
        let h = c.ring.header();
        p.records += n as u64;
        p.decode_failed += failed;
        p.dropped = h.dropped_records.load(Ordering::Relaxed);
        p.cupti_dropped = h.cupti_dropped.load(Ordering::Relaxed);
        p.corrupt_bytes = h.corrupt_bytes.load(Ordering::Relaxed);
        p.status = h.status.load(Ordering::Relaxed);
        p.seen = asm.seen;
        p.ops_overflowed = asm.ops_overflowed();
        p.strings_dropped = asm.strings_dropped;
        if let Some(g) = asm.graph_ops() {
            p.graph_ops = g;
        }
        // EOF on the connection: the process exited or the shim closed it.
        let mut b = [0u8; 1];
        // SAFETY: valid socket and buffer.
        let r = unsafe {
            libc::recv(
                c.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        c.closed = r == 0;
        p.connected = !c.closed;
        let done = asm.take_iterations(now, SETTLE_NS, flush || c.closed);
        for it in &done {
            slo.push_iteration(it);
        }
        p.late = asm.late;
        p.iterations_total += done.len() as u64;
        p.iterations.extend(done);
        let excess = p.iterations.len().saturating_sub(KEEP_ITERATIONS);
        p.iterations.drain(..excess);
    }
    if let Some(h) = gpu_history.as_ref().and_then(|h| h.lock().ok()) {
        for p in procs.values_mut() {
            align_iterations(&mut p.info.iterations, &h);
        }
    }
    // SLO windows: close those that ended (lagging for iterations and host samples to arrive);
    // for a process that is gone, close the window of its last iteration and stop there.
    for p in procs.values_mut() {
        if p.finished {
            continue;
        }
        let gone = !conns.iter().any(|c| c.pid == p.info.pid && !c.closed);
        if gone || flush {
            let last = p.info.iterations.last().map_or(0, |i| i.end_ns);
            p.slo.advance(last + p.slo.spec().window_ns());
            p.finished = gone;
        } else {
            p.slo.advance(now.saturating_sub(*host_lag_ns));
        }
        let windows = p.slo.snapshot_windows();
        if windows != p.slo_windows || p.info.slo.is_none() && windows > 0 {
            p.slo_windows = windows;
            p.info.slo = Some(p.slo.snapshot());
        }
    }
    conns.retain(|c| {
        if c.closed {
            log::info!("CUPTI shim of pid {} disconnected", c.pid);
        }
        !c.closed
    });
}

#[cfg(test)]
mod tests {
    use super::innermost_nspid;

    #[test]
    fn innermost_pid_of_a_containerised_process() {
        let status = "Name:\tpython3\nTgid:\t48211\nPid:\t48211\nNSpid:\t48211\t7\nPPid:\t1\n";
        assert_eq!(innermost_nspid(status), Some(7));
        assert_eq!(innermost_nspid("Pid:\t5\nNSpid:\t5\n"), Some(5));
        assert_eq!(innermost_nspid("Pid:\t5\n"), None);
    }
}
