//! The CUPTI shims' source: a Unix socket where each shim registers (its ring's memfd arrives
//! with `SCM_RIGHTS`, see [`transport`]), and a consumer thread that drains every ring every
//! 50 ms into the process's pipeline ([`slo_probe_core::pipeline`]) and advances the pipelines.
//! The source only pushes: the pipelines are shared with the collector, which adds host samples
//! and reads the snapshots.
//!
//! Only root and the allowed user may connect (`SO_PEERCRED`; the socket file is 0660). A
//! process that dies mid-write leaves nothing half-visible (the ring publishes whole records);
//! its ring is drained once more and unmapped when its connection closes. A restarted agent
//! gets the same rings back: shims re-register every second.

mod transport;

use std::{
    io::{self, Write},
    os::unix::{fs::PermissionsExt, net::UnixListener},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use slo_probe_core::{gpu::GpuHistory, pipeline::Pipelines};

use self::transport::{register, Conn};

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/slo-probe/shim.sock";

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

struct State {
    conns: Vec<Conn>,
    recorder: Option<PathBuf>,
}

/// What the consumer thread needs besides the connections.
#[derive(Clone)]
struct Sinks {
    pipelines: Arc<Mutex<Pipelines>>,
    /// NVML's recent samples, when the agent has NVML.
    gpu_history: Option<Arc<Mutex<GpuHistory>>>,
}

/// The listener, the consumer thread, and the connections they keep.
pub struct ShimSource {
    state: Arc<Mutex<State>>,
    sinks: Sinks,
    stop: Arc<AtomicBool>,
    path: PathBuf,
}

impl ShimSource {
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
            recorder: record_dir,
        }));
        let sinks = Sinks {
            pipelines,
            gpu_history,
        };
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (state, sinks, stop) = (state.clone(), sinks.clone(), stop.clone());
            thread::Builder::new()
                .name("slo-shim-accept".into())
                .spawn(move || accept_loop(listener, state, sinks, stop, allowed))
                .map_err(listen_err)?;
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
        })
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

    /// Asks every connected shim for node-level graph tracing during `steps` iterations.
    pub fn request_diagnostic(&self, steps: u32) {
        if let Ok(s) = self.state.lock() {
            for c in &s.conns {
                let h = c.ring.header();
                let generation = (h.control.load(Ordering::Relaxed) >> 32) as u32 + 1;
                h.control.store(
                    (u64::from(generation) << 32) | u64::from(steps),
                    Ordering::Release,
                );
            }
        }
    }
}

impl Drop for ShimSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(
    listener: UnixListener,
    state: Arc<Mutex<State>>,
    sinks: Sinks,
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
                    let (rank, job_id) = crate::sources::procfs::job_identity(conn.pid);
                    if let Ok(mut s) = state.lock() {
                        // A re-registration replaces the old connection of that process and
                        // continues its pipeline.
                        s.conns.retain(|c| c.pid != conn.pid);
                        if let Ok(mut ps) = sinks.pipelines.lock() {
                            let info = ps.open(conn.pid).info_mut();
                            info.cupti_version = conn.cupti_version;
                            info.rank = rank;
                            info.job_id = job_id;
                        }
                        s.conns.push(conn);
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
    let State { conns, recorder } = s;
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
    drop(history);
    drop(pipelines);
    conns.retain(|c| {
        if c.closed {
            log::info!("CUPTI shim of pid {} disconnected", c.pid);
        }
        !c.closed
    });
}
