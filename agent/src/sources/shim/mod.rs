//! The CUPTI shims' source: a Unix socket where each shim registers (its ring's memfd arrives
//! with `SCM_RIGHTS`, see [`transport`]), and a consumer thread that drains every ring every
//! 50 ms into the process's pipeline ([`slo_probe_core::pipeline`]) and advances the pipelines.
//! The source only pushes: the pipelines are shared with the collector, which adds host samples
//! and reads the snapshots.
//!
//! Only root, the agent's own user and `shim.allowed_uids` may register (`SO_PEERCRED`); the
//! socket file is 0660 and every allowed uid gets its own entry in the socket's POSIX ACL
//! (`system.posix_acl_access`), so that each of them can connect — group ownership would admit
//! one group only, mode 0666 would let every local user reach the handshake. On a file system
//! without ACLs the socket falls back to 0666 and the `SO_PEERCRED` check alone decides.
//!
//! One agent owns a socket: it holds an exclusive `flock` on `<socket>.lock` beside it while it
//! listens, so a second agent (or `observe`) on the same path fails instead of unlinking the
//! first one's socket; only a socket is ever replaced (a stale one, whose owner is gone), and on
//! exit only the socket this agent bound is removed.
//!
//! Registrations are handled concurrently by one thread that polls every handshake in flight:
//! each gets [`HANDSHAKE_MS`] to send its hello, at most [`MAX_PENDING_PER_UID`] per uid are in
//! flight (a new one drops that uid's oldest), and every refusal is counted by reason
//! ([`ShimSource::refused`]) and logged at most once per [`REFUSAL_LOG_S`] per reason. A process
//! that dies mid-write leaves nothing half-visible (the ring publishes whole records); its ring
//! is drained once more and unmapped when its connection closes. A restarted agent gets the
//! same rings back: shims re-register every second.

mod transport;
mod watch;

use std::{
    collections::VecDeque,
    fs::File,
    io::{self, Write},
    os::unix::{
        fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt},
        io::AsRawFd,
        net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use slo_probe_common::{
    gpu::{DEPTH_OFF, DEPTH_TIMING},
    ring::{decode_shim_depth, encode_depth_request, next_generation, DepthDuration},
};
use slo_probe_core::{gpu::GpuHistory, pipeline::Pipelines};

use self::{
    transport::{check_peer, register, try_hello, Conn, Refusal},
    watch::{Change, RecordWatch},
};

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/slo-probe/shim.sock";

/// Time a connection has to send its hello, ms.
pub const HANDSHAKE_MS: u64 = 1000;

/// Handshakes in flight per uid.
pub const MAX_PENDING_PER_UID: usize = 32;

/// Connections accepted between two polls of the handshakes in flight.
const ACCEPT_BATCH: usize = MAX_PENDING_PER_UID / 2;

/// Handshakes in flight in all.
pub const MAX_PENDING: usize = 256;

/// Training processes tracked at once (registered, or finished and retained): a new one beyond
/// this replaces the one that finished first, or is refused when none has finished.
pub const MAX_PROCESSES: usize = 1024;

/// A refusal of each reason is logged at most once per this many seconds (the rest are
/// counted, and the next line says how many were not logged).
pub const REFUSAL_LOG_S: u64 = 10;

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
    /// Another agent holds the socket's lock.
    #[error(
        "another slo-probe agent owns the shim socket {path} (it holds {lock}); stop it, or \
         give this one another path with shim.socket"
    )]
    Owned {
        /// The socket.
        path: String,
        /// The lock file.
        lock: String,
    },
    /// Something that is not a socket is where the socket should be.
    #[error(
        "shim.socket {path} exists and is not a socket ({what}); refusing to replace it: \
         remove it or choose another path"
    )]
    NotASocket {
        /// The path.
        path: String,
        /// What it is.
        what: &'static str,
    },
}

impl ShimError {
    /// Whether another agent owns the socket, or a file that is not ours is in its place: the
    /// configuration is wrong, not the machine.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Owned { .. } | Self::NotASocket { .. })
    }
}

struct State {
    conns: Vec<Conn>,
    recorder: Option<PathBuf>,
    /// The depth last asked of each process's shim, and when.
    requested: std::collections::HashMap<u32, (u32, std::time::Instant)>,
    /// `shim.depth_on_demand`: ask the shims for depth while their SLO trees breach.
    depth_on_demand: bool,
    /// Depths set from outside the SLO engine (the healer's shim-depth strategy), per pid:
    /// the engine's wants never go below them until they are set back to 0.
    floors: std::collections::HashMap<u32, u32>,
    /// Whether each process's GPU records arrive while its shim traces kernels.
    watches: std::collections::HashMap<u32, RecordWatch>,
}

/// How long a depth request holds in the shim (renewed while it is wanted, so a stopped agent
/// never leaves a job traced deeply for long).
const REQUEST_TENTHS: u32 = 100;
/// How often a standing request is renewed.
const RENEW_AFTER: Duration = Duration::from_secs(5);

/// What the consumer thread needs besides the connections.
#[derive(Clone)]
struct Sinks {
    pipelines: Arc<Mutex<Pipelines>>,
    /// NVML's recent samples, when the agent has NVML.
    gpu_history: Option<Arc<Mutex<GpuHistory>>>,
}

/// Refusals by reason, and when each reason was last logged.
struct Refusals {
    counts: [AtomicU64; Refusal::REASONS.len()],
    log: Mutex<[(Option<Instant>, u64); Refusal::REASONS.len()]>,
}

impl Refusals {
    fn new() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            log: Mutex::new([(None, 0); Refusal::REASONS.len()]),
        }
    }

    /// Counts `r`, and logs it unless its reason was logged less than [`REFUSAL_LOG_S`] ago.
    fn refuse(&self, r: &Refusal) {
        let i = r.index();
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let Ok(mut log) = self.log.lock() else { return };
        let (last, suppressed) = &mut log[i];
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(REFUSAL_LOG_S)) {
            *suppressed += 1;
            return;
        }
        *last = Some(now);
        let n = std::mem::take(suppressed);
        let e = crate::error_chain(r);
        if n > 0 {
            log::warn!(
                "refused a CUPTI shim connection: {e} ({n} more refused for this reason in the \
                 last {REFUSAL_LOG_S} s, not logged)"
            );
        } else {
            log::warn!("refused a CUPTI shim connection: {e}");
        }
    }
}

/// The socket this source bound and the lock that makes it the socket's only owner.
struct Owner {
    path: PathBuf,
    /// Device and inode of the socket bound.
    id: (u64, u64),
    /// Holds the `flock`; released when dropped, after the socket is removed.
    _lock: File,
}

impl Owner {
    /// Locks `<path>.lock`, replaces a stale socket (never anything else) and binds `path`.
    fn claim(path: &Path) -> Result<(Self, UnixListener), ShimError> {
        let listen_err = |source| ShimError::Listen {
            path: crate::clip(&path.display().to_string()),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(listen_err)?;
        }
        let mut lock_name = path.file_name().unwrap_or_default().to_owned();
        lock_name.push(".lock");
        let lock_path = path.with_file_name(lock_name);
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&lock_path)
            .map_err(listen_err)?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(ShimError::Owned {
                    path: crate::clip(&path.display().to_string()),
                    lock: crate::clip(&lock_path.display().to_string()),
                });
            }
            return Err(listen_err(e));
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => {
                // We hold the lock: whoever bound it is gone.
                std::fs::remove_file(path).map_err(listen_err)?;
            }
            Ok(m) => {
                let t = m.file_type();
                return Err(ShimError::NotASocket {
                    path: crate::clip(&path.display().to_string()),
                    what: if t.is_dir() {
                        "a directory"
                    } else if t.is_symlink() {
                        "a symbolic link"
                    } else if t.is_file() {
                        "a regular file"
                    } else {
                        "a special file"
                    },
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(listen_err(e)),
        }
        let listener = UnixListener::bind(path).map_err(listen_err)?;
        let m = std::fs::symlink_metadata(path).map_err(listen_err)?;
        Ok((
            Self {
                path: path.to_owned(),
                id: (m.dev(), m.ino()),
                _lock: lock,
            },
            listener,
        ))
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Only the socket this agent bound: not one a later owner made, nor a file in its place.
        if std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == self.id)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Lets root, the agent and `allowed` connect: mode 0660, and a POSIX ACL entry for each
/// allowed uid; mode 0666 where the file system has no ACLs (`SO_PEERCRED` still decides).
fn grant(path: &Path, me: u32, allowed: &[u32]) -> io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    let mut users: Vec<u32> = allowed
        .iter()
        .copied()
        .filter(|&u| u != 0 && u != me)
        .collect();
    users.sort_unstable();
    users.dedup();
    if users.is_empty() {
        return Ok(());
    }
    let acl = posix_acl(&users);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a valid path and attribute name, and a buffer of acl.len() bytes.
    let rc = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(e);
    }
    log::warn!(
        "{}: the file system has no POSIX ACLs; the shim socket is mode 0666 and only the \
         agent's uid check (root, its own uid, shim.allowed_uids) keeps other users out",
        crate::clip(&path.display().to_string())
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

/// The `system.posix_acl_access` value (version 2, entries sorted by tag then id): the owner,
/// each of `users`, the owning group and the mask read-write, others nothing.
fn posix_acl(users: &[u32]) -> Vec<u8> {
    const USER_OBJ: u16 = 0x01;
    const USER: u16 = 0x02;
    const GROUP_OBJ: u16 = 0x04;
    const MASK: u16 = 0x10;
    const OTHER: u16 = 0x20;
    const RW: u16 = 6;
    const UNDEFINED: u32 = u32::MAX;
    let mut out = 2u32.to_le_bytes().to_vec();
    let mut entry = |tag: u16, perm: u16, id: u32| {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    };
    entry(USER_OBJ, RW, UNDEFINED);
    for &u in users {
        entry(USER, RW, u);
    }
    entry(GROUP_OBJ, RW, UNDEFINED);
    entry(MASK, RW, UNDEFINED);
    entry(OTHER, 0, UNDEFINED);
    out
}

/// The listener, the consumer thread, and the connections they keep.
pub struct ShimSource {
    state: Arc<Mutex<State>>,
    sinks: Sinks,
    stop: Arc<AtomicBool>,
    path: PathBuf,
    refusals: Arc<Refusals>,
    /// Dropped last: the socket is removed before the lock is released.
    _owner: Owner,
}

impl ShimSource {
    /// `shim.depth_on_demand`: whether breaching SLO trees raise their shims' depth (on from
    /// the start).
    pub fn set_depth_on_demand(&self, on: bool) {
        if let Ok(mut s) = self.state.lock() {
            s.depth_on_demand = on;
        }
    }

    /// Listens on `path`, accepting shims from root, the agent's own user and `allowed`, and
    /// feeds what they send into `pipelines` (one per process, made on registration).
    /// `gpu_history`: NVML's samples, so that each iteration gets what NVML saw on its GPU.
    /// With `record_dir`, every record consumed is also appended to `<dir>/<pid>.bin` (the
    /// fixtures that tests replay).
    pub fn start(
        path: &Path,
        allowed: &[u32],
        record_dir: Option<PathBuf>,
        pipelines: Arc<Mutex<Pipelines>>,
        gpu_history: Option<Arc<Mutex<GpuHistory>>>,
    ) -> Result<Self, ShimError> {
        let allowed = allowed.to_vec();
        let listen_err = |source| ShimError::Listen {
            path: crate::clip(&path.display().to_string()),
            source,
        };
        let (owner, listener) = Owner::claim(path)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        grant(path, me, &allowed).map_err(listen_err)?;
        if let Some(d) = &record_dir {
            std::fs::create_dir_all(d).map_err(listen_err)?;
        }
        let state = Arc::new(Mutex::new(State {
            conns: Vec::new(),
            recorder: record_dir,
            requested: std::collections::HashMap::new(),
            depth_on_demand: true,
            floors: std::collections::HashMap::new(),
            watches: std::collections::HashMap::new(),
        }));
        let sinks = Sinks {
            pipelines,
            gpu_history,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let refusals = Arc::new(Refusals::new());
        {
            let accept = Accept {
                listener,
                state: state.clone(),
                sinks: sinks.clone(),
                stop: stop.clone(),
                allowed,
                me,
                refusals: refusals.clone(),
            };
            listener_thread(accept).map_err(listen_err)?;
        }
        {
            let (state, sinks, stop) = (state.clone(), sinks.clone(), stop.clone());
            thread::Builder::new()
                .name("slo-shim-drain".into())
                .spawn(move || drain_loop(state, sinks, stop))
                .map_err(listen_err)?;
        }
        Ok(Self {
            state,
            sinks,
            stop,
            path: path.to_owned(),
            refusals,
            _owner: owner,
        })
    }

    /// Connections refused so far, by reason (every reason, in a fixed order).
    pub fn refused(&self) -> Vec<(&'static str, u64)> {
        Refusal::REASONS
            .iter()
            .zip(&self.refusals.counts)
            .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Shims registered now.
    pub fn connections(&self) -> usize {
        self.state.lock().map_or(0, |s| s.conns.len())
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Drains every ring now and finishes every pipeline (the end of `observe`, after the
    /// command has exited).
    pub fn finish(&self) {
        if let Ok(mut s) = self.state.lock() {
            drain_all(&mut s, &self.sinks, true);
        }
    }

    /// A handle on the connected shims for requests from outside the collector (the state
    /// API's diagnostic endpoint); the source stays their owner.
    pub fn handle(&self) -> ShimHandle {
        ShimHandle {
            state: Arc::downgrade(&self.state),
        }
    }

    /// Asks the shim of `pid` (every connected shim when `None`) for node-level graph tracing
    /// during `steps` iterations; returns the pids asked. See [`ShimHandle::request_diagnostic`].
    pub fn request_diagnostic(&self, pid: Option<u32>, steps: u32) -> Vec<u32> {
        self.handle().request_diagnostic(pid, steps)
    }
}

/// Reaches the connected shims from another thread without owning them: it holds the source's
/// state weakly, so once the source is dropped (and its threads have stopped) no shim is
/// connected through it any more.
#[derive(Clone)]
pub struct ShimHandle {
    state: std::sync::Weak<Mutex<State>>,
}

impl ShimHandle {
    /// Asks the shim of `pid` (every connected shim when `None`) for node-level graph tracing
    /// during `steps` iterations; returns the pids asked, in registration order (empty when
    /// none of them is connected). The request is the shim's control word, as the source's own
    /// depth requests are: a later depth the SLO engine asks for replaces it.
    pub fn request_diagnostic(&self, pid: Option<u32>, steps: u32) -> Vec<u32> {
        use slo_probe_common::gpu::DEPTH_NODES;
        let Some(state) = self.state.upgrade() else {
            return Vec::new();
        };
        let Ok(s) = state.lock() else {
            return Vec::new();
        };
        let mut asked = Vec::new();
        for c in s
            .conns
            .iter()
            .filter(|c| !c.closed && pid.is_none_or(|p| p == c.pid))
        {
            let h = c.ring.header();
            let generation = next_generation(h.control.load(Ordering::Relaxed));
            h.control.store(
                encode_depth_request(generation, DEPTH_NODES, DepthDuration::Steps(steps)),
                Ordering::Release,
            );
            asked.push(c.pid);
        }
        asked
    }
}

impl ShimHandle {
    /// The depth floor set for `pid` ([`ShimHandle::set_depth_floor`]; 0 when none is set),
    /// `None` when no shim of `pid` is connected. Not the depth in force, which follows the SLO
    /// engine and the shim's duty cycle above the floor.
    pub fn depth_floor(&self, pid: u32) -> Option<u32> {
        self.with_connected(pid, |s| s.floors.get(&pid).copied().unwrap_or(DEPTH_TIMING))
            .ok()
    }

    /// A depth the SLO engine's requests for `pid` never go below (the healer's shim-depth
    /// strategy): asked of the shim on the next drain, renewed with the engine's requests,
    /// dropped when the process disconnects; 0 hands the depth back to the engine. At most
    /// graph-node depth.
    pub fn set_depth_floor(&self, pid: u32, depth: u32) -> Result<(), &'static str> {
        self.with_connected(pid, |s| {
            if depth == DEPTH_TIMING {
                s.floors.remove(&pid);
            } else {
                s.floors
                    .insert(pid, depth.min(slo_probe_common::gpu::DEPTH_NODES));
            }
        })
    }

    /// `f` on the source's state while a shim of `pid` is connected.
    fn with_connected<R>(
        &self,
        pid: u32,
        f: impl FnOnce(&mut State) -> R,
    ) -> Result<R, &'static str> {
        let state = self.state.upgrade().ok_or("the shim source has stopped")?;
        let mut s = state
            .lock()
            .map_err(|_| "the shim source's state is poisoned")?;
        if !s.conns.iter().any(|c| c.pid == pid && !c.closed) {
            return Err("no shim of that process is connected");
        }
        Ok(f(&mut s))
    }
}

impl crate::sources::Source for ShimSource {
    fn health(&self) -> Vec<slo_probe_core::snapshot::ProbeStatus> {
        crate::sources::flag_health("shim", &self.stop)
    }

    /// The threads stop within a poll period (registrations are refused from then on); the
    /// socket is removed when the source is dropped.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for ShimSource {
    fn drop(&mut self) {
        // The owner, dropped after this, removes the socket it bound.
        crate::sources::Source::stop(self);
    }
}

/// What the listener thread owns.
struct Accept {
    listener: UnixListener,
    state: Arc<Mutex<State>>,
    sinks: Sinks,
    stop: Arc<AtomicBool>,
    allowed: Vec<u32>,
    me: u32,
    refusals: Arc<Refusals>,
}

/// A connection whose hello has not arrived yet.
struct Pending {
    stream: UnixStream,
    cred: libc::ucred,
    deadline: Instant,
}

fn listener_thread(a: Accept) -> io::Result<()> {
    a.listener.set_nonblocking(true)?;
    thread::Builder::new()
        .name("slo-shim-accept".into())
        .spawn(move || a.run())
        .map(|_| ())
}

impl Accept {
    /// Accepts and finishes handshakes until stopped: one `poll` over the listener and every
    /// handshake in flight, so that a slow or idle peer delays nobody.
    fn run(self) {
        let mut pending: VecDeque<Pending> = VecDeque::new();
        // Out of descriptors: the listener stays readable, so it is left out of the poll for a
        // while instead of spinning on EMFILE.
        let mut paused_until: Option<Instant> = None;
        let mut fds: Vec<libc::pollfd> = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            let listening = paused_until.is_none_or(|t| Instant::now() >= t);
            fds.clear();
            fds.push(libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: if listening { libc::POLLIN } else { 0 },
                revents: 0,
            });
            fds.extend(pending.iter().map(|p| libc::pollfd {
                fd: p.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            // SAFETY: a valid array of fds.len() pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
            let now = Instant::now();
            let mut waiting = VecDeque::with_capacity(pending.len());
            for (p, f) in pending.drain(..).zip(&fds[1..]) {
                if f.revents != 0 {
                    if let Some(p) = self.progress(p) {
                        waiting.push_back(p);
                    }
                } else if now >= p.deadline {
                    self.refusals.refuse(&Refusal::Timeout { ms: HANDSHAKE_MS });
                } else {
                    waiting.push_back(p);
                }
            }
            pending = waiting;
            if listening && fds[0].revents & libc::POLLIN != 0 {
                paused_until = self.accept_ready(&mut pending);
            }
        }
    }

    /// Accepts what is queued (at most [`ACCEPT_BATCH`], fewer than a uid may have in flight,
    /// so that a hello that arrives just after its connection is read before a flood of newer
    /// connections of the same uid can push it out);
    /// returns until when to stop listening (out of descriptors).
    fn accept_ready(&self, pending: &mut VecDeque<Pending>) -> Option<Instant> {
        for _ in 0..ACCEPT_BATCH {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) => {
                    self.refusals.refuse(&Refusal::FdLimit { source: e });
                    return Some(Instant::now() + Duration::from_millis(100));
                }
                Err(e) => {
                    log::warn!("shim socket accept failed: {e}");
                    return Some(Instant::now() + Duration::from_millis(100));
                }
            };
            let cred = match check_peer(&stream, self.me, &self.allowed) {
                Ok(c) => c,
                Err(r) => {
                    self.refusals.refuse(&r);
                    continue;
                }
            };
            let p = Pending {
                stream,
                cred,
                deadline: Instant::now() + Duration::from_millis(HANDSHAKE_MS),
            };
            // A shim sends its hello right after connecting: usually it is there already.
            let Some(p) = self.progress(p) else { continue };
            let of_uid = pending.iter().filter(|q| q.cred.uid == p.cred.uid).count();
            if of_uid >= MAX_PENDING_PER_UID || pending.len() >= MAX_PENDING {
                let oldest = if of_uid >= MAX_PENDING_PER_UID {
                    pending.iter().position(|q| q.cred.uid == p.cred.uid)
                } else {
                    Some(0)
                };
                if let Some(dropped) = oldest.and_then(|k| pending.remove(k)) {
                    self.refusals.refuse(&Refusal::PendingCap {
                        uid: dropped.cred.uid,
                        max: MAX_PENDING_PER_UID,
                    });
                }
            }
            pending.push_back(p);
        }
        None
    }

    /// Reads the hello if it came, and registers; gives the connection back while it has not.
    fn progress(&self, p: Pending) -> Option<Pending> {
        match try_hello(&p.stream) {
            Ok(None) => Some(p),
            Ok(Some((hello, fd))) => {
                match register(p.stream, &p.cred, &hello, fd) {
                    Ok(conn) => self.admit(conn),
                    Err(r) => self.refusals.refuse(&r),
                }
                None
            }
            Err(r) => {
                self.refusals.refuse(&r);
                None
            }
        }
    }

    /// Gives a registered shim its pipeline, and its connection to the consumer thread.
    fn admit(&self, conn: Conn) {
        // Read once here: nothing downstream reads /proc for it.
        let identity = crate::sources::procfs::ProcessIdentity::read(conn.pid);
        let Ok(mut s) = self.state.lock() else { return };
        let Ok(mut ps) = self.sinks.pipelines.lock() else {
            return;
        };
        if !ps.make_room(conn.pid, MAX_PROCESSES) {
            self.refusals.refuse(&Refusal::ProcessCap {
                pid: conn.pid,
                max: MAX_PROCESSES,
            });
            return;
        }
        log::info!("CUPTI shim of pid {} registered", conn.pid);
        // A re-registration replaces the old connection of that process and continues its
        // pipeline.
        s.conns.retain(|c| c.pid != conn.pid);
        let info = ps.open(conn.pid).info_mut();
        info.cupti_version = conn.cupti_version;
        identity.fill(info);
        drop(ps);
        s.conns.push(conn);
    }
}

fn drain_loop(state: Arc<Mutex<State>>, sinks: Sinks, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(50));
        if let Ok(mut s) = state.lock() {
            drain_all(&mut s, &sinks, false);
        }
    }
}

/// Drains every ring into its pipeline, then advances the pipelines (`flush`: finishes them).
fn drain_all(s: &mut State, sinks: &Sinks, flush: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    let now = slo_probe_common::host::monotonic_ns();
    let Ok(mut pipelines) = sinks.pipelines.lock() else {
        return;
    };
    let State {
        conns,
        recorder,
        requested,
        depth_on_demand,
        floors,
        watches,
    } = s;
    for c in conns.iter_mut() {
        let Some(p) = pipelines.get_mut(c.pid) else {
            continue;
        };
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
        let n = c.ring.drain(&mut buf, |bytes| {
            if let Some(w) = out.as_mut() {
                let _ = w.write_all(bytes);
            }
            p.push_bytes(bytes);
        });
        if let Some(mut w) = out {
            let _ = w.flush();
        }
        c.closed = c.peer_closed();
        let h = c.ring.header();
        let info = p.info_mut();
        info.records += n as u64;
        info.dropped = h.dropped_records.load(Ordering::Relaxed);
        info.cupti_dropped = h.cupti_dropped.load(Ordering::Relaxed);
        info.corrupt_bytes = h.corrupt_bytes.load(Ordering::Relaxed);
        info.status = h.status.load(Ordering::Relaxed);
        info.connected = !c.closed;
    }
    let history = sinks.gpu_history.as_ref().and_then(|h| h.lock().ok());
    let gpu = history.as_deref();
    if flush {
        pipelines.finish(gpu);
    } else {
        // A process without an open connection is gone: its pipeline finishes.
        pipelines.advance(now, gpu, |pid| {
            conns.iter().any(|c| c.pid == pid && !c.closed)
        });
    }
    // Depth on demand: what each engine needs, asked of its shim; the shim's own depth and
    // cost, for the snapshot.
    for c in conns.iter().filter(|c| !c.closed) {
        let Some(p) = pipelines.get_mut(c.pid) else {
            continue;
        };
        let engine = if *depth_on_demand {
            p.wanted_depth()
        } else {
            DEPTH_TIMING
        };
        let floor = floors.get(&c.pid).copied().unwrap_or(DEPTH_TIMING);
        let want = engine.max(floor);
        let sampling = p.node_sampling();
        log::debug!(
            "pid {}: depth wanted {engine} (graphs seen {}, node sample {sampling}, the engine \
             wants nodes {:?}, SLO view {})",
            c.pid,
            p.graphs_seen(),
            p.engine().map(|e| e.wants_nodes()),
            p.info_mut().slo.is_some()
        );
        let h = c.ring.header();
        let info = p.info_mut();
        info.depth_wanted = want;
        info.depth = Some(decode_shim_depth(h.depth.load(Ordering::Relaxed)));
        info.shim_cost_ns = h.shim_counters().estimated_cost_ns();
        let watch = watches.entry(c.pid).or_default();
        let gpu_records = info.seen[0] + info.seen[1] + info.seen[2];
        match watch.update(
            now,
            info.depth.map_or(DEPTH_OFF, |d| d.depth),
            h.launches_seen.load(Ordering::Relaxed),
            gpu_records,
        ) {
            Some(Change::Stalled(quiet)) => log::warn!(
                "pid {}: no GPU record has reached the agent for {} s while its shim traces \
                 kernels and the job launches work: CUPTI is holding them (it did so until the \
                 job's exit on the H200 when kernel activity was switched under a deep queue or \
                 CUDA graphs); until they come, its SLO tree is judged on wall times and host data \
                 alone",
                c.pid,
                quiet.as_secs()
            ),
            Some(Change::Resumed) => {
                log::info!("pid {}: GPU records reach the agent again", c.pid);
            }
            None => {}
        }
        info.gpu_records_stalled_s = watch.stalled(now).map_or(0, |d| d.as_secs());
        let last = requested.get(&c.pid).copied();
        let due = match last {
            None => want > DEPTH_TIMING,
            Some((d, at)) => d != want || (want > DEPTH_TIMING && at.elapsed() >= RENEW_AFTER),
        };
        if due {
            let generation = next_generation(h.control.load(Ordering::Relaxed));
            let duration = if want > DEPTH_TIMING {
                DepthDuration::Tenths(REQUEST_TENTHS)
            } else {
                DepthDuration::UntilNext
            };
            h.control.store(
                encode_depth_request(generation, want, duration),
                Ordering::Release,
            );
            if last.map(|l| l.0) != Some(want) {
                log::info!(
                    "pid {}: asked its shim for depth {want} ({})",
                    c.pid,
                    if want > engine {
                        "the healer set it"
                    } else if sampling && want == slo_probe_common::gpu::DEPTH_NODES {
                        "a node-level sample of its CUDA graphs while healthy, or a graph to look into"
                    } else if want > DEPTH_TIMING {
                        "an SLO node breaches"
                    } else {
                        "attribution has what it needs"
                    }
                );
            }
            requested.insert(c.pid, (want, std::time::Instant::now()));
        }
    }
    requested.retain(|pid, _| conns.iter().any(|c| c.pid == *pid && !c.closed));
    floors.retain(|pid, _| conns.iter().any(|c| c.pid == *pid && !c.closed));
    watches.retain(|pid, _| conns.iter().any(|c| c.pid == *pid && !c.closed));
    drop(history);
    drop(pipelines);
    let before = conns.len();
    conns.retain(|c| {
        if c.closed {
            log::info!("CUPTI shim of pid {} disconnected", c.pid);
        }
        !c.closed
    });
    if conns.len() < before {
        // A gone process's tables were freed (its pipeline was released when it finished,
        // above).
        crate::release_memory();
    }
}
