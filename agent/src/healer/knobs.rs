//! The knobs the actuators turn, each read before it is written and read back after, and the
//! one implementation that touches the host ([`HostKnobs`]):
//!
//! - thread affinity: `sched_getaffinity` / `sched_setaffinity` (any kernel);
//! - nice and the EEVDF slice hint: `sched_getattr` / `sched_setattr` (3.14; the slice hint
//!   `sched_runtime` for fair threads from 6.12, commit 857b158), else `getpriority` /
//!   `setpriority`. Only fair policies are ever written (SCHED_OTHER, BATCH, IDLE keep their
//!   policy): never SCHED_DEADLINE, whose `fork` EAGAIN breaks DataLoader workers;
//! - I/O priority: `ioprio_get` / `ioprio_set` (2.6.13);
//! - cgroup files (v1 `cpu.shares`, `cpu.cfs_quota_us`, `cpuset.cpus`,
//!   `memory.soft_limit_in_bytes`; v2 `cpu.weight`, `cpu.max`, `cpu.idle` (5.15), `cpuset.cpus`,
//!   `memory.high`);
//! - socket priority of a process's TCP socket: `pidfd_open` + `pidfd_getfd` (5.6) +
//!   `getsockopt`/`setsockopt(SO_PRIORITY)`, the socket identified by its inode;
//! - the shim's tracing depth, through [`ShimControl`] (wired by the agent);
//! - an entry of the job's strategy channel (`<jobs_dir>/<pid>/strategy.json`), see
//!   [`super::channel`].
//!
//! Thread and process knobs carry the process's start time (`/proc/<pid>/stat` field 22), so
//! that a restarted agent never writes to a process that reused the pid.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use slo_probe_core::healer::Strategy;

use super::{channel::Channel, error::HealError};

/// One setting an action changes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "knob")]
pub enum Knob {
    /// CPU affinity of a thread.
    Affinity {
        /// Process.
        pid: u32,
        /// Thread.
        tid: u32,
        /// The process's start time, clock ticks after boot.
        start: u64,
    },
    /// Scheduling attributes of a thread (nice, slice hint).
    Sched {
        /// Process.
        pid: u32,
        /// Thread.
        tid: u32,
        /// The process's start time.
        start: u64,
    },
    /// I/O priority of a thread.
    IoPrio {
        /// Process.
        pid: u32,
        /// Thread.
        tid: u32,
        /// The process's start time.
        start: u64,
    },
    /// A cgroup file.
    Cgroup {
        /// The cgroup, as `/proc/<pid>/cgroup` shows it.
        cgroup: String,
        /// The file name, e.g. `cpu.shares`.
        file: String,
        /// Its absolute path.
        path: PathBuf,
    },
    /// `SO_PRIORITY` of one of a process's sockets.
    SocketPriority {
        /// Process.
        pid: u32,
        /// The process's start time.
        start: u64,
        /// File descriptor in that process.
        fd: i32,
        /// The socket's inode (checked before every write).
        inode: u64,
    },
    /// The shim's tracing depth in a process.
    ShimDepth {
        /// Process.
        pid: u32,
    },
    /// A strategy's entry in the job's strategy channel.
    JobStrategy {
        /// Process.
        pid: u32,
        /// The strategy.
        strategy: Strategy,
    },
}

impl Knob {
    /// The process a thread, socket or channel knob belongs to.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Self::Affinity { pid, .. }
            | Self::Sched { pid, .. }
            | Self::IoPrio { pid, .. }
            | Self::SocketPriority { pid, .. }
            | Self::ShimDepth { pid }
            | Self::JobStrategy { pid, .. } => Some(*pid),
            Self::Cgroup { .. } => None,
        }
    }

    /// A cgroup's `cpu.idle`. Its value reads "IDLE WEIGHT": the kernel sets a group's weight
    /// to the default when it leaves idle (v1 `cpu.shares` 1024, v2 `cpu.weight` 100; seen on
    /// the H200 where a neighbour's weight of 400 came back as 100 after an undo), so the
    /// weight it had travels with the flag and is written back after it.
    pub fn is_cpu_idle(&self) -> bool {
        matches!(self, Self::Cgroup { file, .. } if file == "cpu.idle")
    }
}

/// The weight file beside a cgroup's `cpu.idle` (v2 `cpu.weight`, v1 `cpu.shares`).
fn weight_file(idle: &std::path::Path) -> Option<std::path::PathBuf> {
    let dir = idle.parent()?;
    ["cpu.weight", "cpu.shares"]
        .into_iter()
        .map(|f| dir.join(f))
        .find(|p| p.exists())
}

impl fmt::Display for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Affinity { pid, tid, .. } => write!(f, "affinity of thread {tid} (pid {pid})"),
            Self::Sched { pid, tid, .. } => write!(f, "nice/slice of thread {tid} (pid {pid})"),
            Self::IoPrio { pid, tid, .. } => write!(f, "ioprio of thread {tid} (pid {pid})"),
            Self::Cgroup { path, .. } => write!(f, "{}", path.display()),
            Self::SocketPriority { pid, fd, .. } => write!(f, "SO_PRIORITY of fd {fd} (pid {pid})"),
            Self::ShimDepth { pid } => write!(f, "shim depth of pid {pid}"),
            Self::JobStrategy { pid, strategy } => {
                write!(f, "{strategy} in the strategy channel of pid {pid}")
            }
        }
    }
}

/// A knob's value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "value")]
pub enum KnobValue {
    /// CPUs, sorted.
    Cpus(Vec<u32>),
    /// Fair-class scheduling attributes.
    Sched {
        /// Policy (0 SCHED_OTHER, 3 SCHED_BATCH, 5 SCHED_IDLE).
        policy: u32,
        /// Nice.
        nice: i32,
        /// Slice hint in ns; 0: the default slice.
        slice_ns: u64,
    },
    /// A raw integer (ioprio, SO_PRIORITY, shim depth).
    Int(i64),
    /// A file's content, trimmed.
    Text(String),
    /// A channel entry (`None`: absent).
    Job(Option<serde_json::Value>),
}

impl KnobValue {
    /// Whether two values of `knob` mean the same (cpusets compare as CPU sets, text with
    /// whitespace collapsed).
    pub fn same(&self, other: &Self, knob: &Knob) -> bool {
        match (self, other) {
            (Self::Text(a), Self::Text(b)) => {
                let cpus = matches!(knob, Knob::Cgroup { file, .. } if file.starts_with("cpuset."));
                if knob.is_cpu_idle() {
                    // "IDLE [WEIGHT]" (see [`Knob::is_cpu_idle`]): the flag, and the weight
                    // where both sides name one.
                    let (mut a, mut b) = (a.split_whitespace(), b.split_whitespace());
                    a.next() == b.next() && a.zip(b).all(|(x, y)| x == y)
                } else if cpus {
                    parse_cpu_list(a) == parse_cpu_list(b)
                } else {
                    a.split_whitespace().eq(b.split_whitespace())
                }
            }
            _ => self == other,
        }
    }
}

impl fmt::Display for KnobValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpus(c) => f.write_str(&format_cpu_list(c)),
            Self::Sched {
                policy,
                nice,
                slice_ns,
            } => write!(
                f,
                "policy {policy} nice {nice} slice {}",
                if *slice_ns == 0 {
                    "default".to_owned()
                } else {
                    format!("{} µs", slice_ns / 1000)
                }
            ),
            Self::Int(i) => write!(f, "{i}"),
            Self::Text(t) => f.write_str(t),
            Self::Job(None) => f.write_str("(absent)"),
            Self::Job(Some(v)) => write!(f, "{v}"),
        }
    }
}

/// Parses a CPU list such as `0-3,8,10-11` (empty or malformed parts are skipped).
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b.min(a + 4096));
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Formats CPUs as a list with ranges.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Reads and writes knobs.
pub trait KnobIo {
    /// The knob's current value.
    fn read(&mut self, knob: &Knob) -> Result<KnobValue, HealError>;
    /// Sets the knob.
    fn write(&mut self, knob: &Knob, value: &KnobValue) -> Result<(), HealError>;
}

/// The shim's tracing depth in a process, set through the shim source's control socket (the
/// agent wires it; [`NoShimControl`] where it is not).
pub trait ShimControl: Send {
    /// The depth in force (0 iterations only, 1 kernels, 2 graph nodes), if known.
    fn depth(&self, pid: u32) -> Option<u32>;
    /// Sets it.
    fn set_depth(&self, pid: u32, depth: u32) -> Result<(), String>;
}

/// No shim control: depth knobs are skipped with a reason.
pub struct NoShimControl;

impl ShimControl for NoShimControl {
    fn depth(&self, _pid: u32) -> Option<u32> {
        None
    }

    fn set_depth(&self, _pid: u32, _depth: u32) -> Result<(), String> {
        Err("the shim source is not running in this agent".to_owned())
    }
}

/// The host's knobs.
pub struct HostKnobs {
    /// The strategy channel.
    pub channel: Channel,
    /// The shim's depth control.
    pub shim: Box<dyn ShimControl>,
}

/// The process's start time (field 22 of `/proc/<pid>/stat`), `None` once it is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    // Fields after the name start at field 3 (state): starttime is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn alive(pid: u32, tid: Option<u32>, start: u64, knob: &Knob) -> Result<(), HealError> {
    let same = start_time(pid) == Some(start)
        && tid.is_none_or(|t| Path::new(&format!("/proc/{pid}/task/{t}")).exists());
    if same {
        Ok(())
    } else {
        Err(HealError::Gone {
            what: knob.to_string(),
        })
    }
}

fn os_error(knob: &Knob, op: &'static str) -> HealError {
    HealError::Knob {
        knob: knob.to_string(),
        op,
        source: std::io::Error::last_os_error(),
    }
}

/// `struct sched_attr`, SCHED_ATTR_SIZE_VER1.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

const _: () = assert!(std::mem::size_of::<SchedAttr>() == 56);

/// Fair policies: SCHED_OTHER, SCHED_BATCH, SCHED_IDLE.
const FAIR_POLICIES: [u32; 3] = [0, 3, 5];

fn sched_getattr(tid: u32) -> std::io::Result<SchedAttr> {
    let mut a = SchedAttr {
        size: 56,
        ..Default::default()
    };
    // SAFETY: a valid sched_attr of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid as libc::pid_t,
            &mut a as *mut SchedAttr,
            56u32,
            0u32,
        )
    };
    if rc == 0 {
        Ok(a)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The slice a fair thread without a hint has (the agent's own thread never sets one).
fn default_slice_ns() -> u64 {
    static SLICE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SLICE.get_or_init(|| {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        sched_getattr(me).map(|a| a.sched_runtime).unwrap_or(0)
    })
}

fn ioprio(tid: u32) -> std::io::Result<i64> {
    // SAFETY: plain syscall; IOPRIO_WHO_PROCESS = 1 takes a thread id.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_get, 1, tid as libc::c_int) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A duplicate of `pid`'s file descriptor `fd`, checked to be the socket with `inode`.
struct RemoteFd(libc::c_int);

impl RemoteFd {
    fn open(pid: u32, fd: i32, inode: u64) -> std::io::Result<Self> {
        // SAFETY: plain syscalls; every fd they return is closed by the guards below.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
        if pidfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let pidfd = RemoteFd(pidfd as libc::c_int);
        // SAFETY: as above.
        let local = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.0, fd, 0u32) };
        if local < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let local = RemoteFd(local as libc::c_int);
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: valid fd and stat buffer.
        if unsafe { libc::fstat(local.0, st.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fstat filled it.
        let st = unsafe { st.assume_init() };
        if st.st_ino != inode || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(std::io::Error::other(format!(
                "fd {fd} of pid {pid} is no longer socket inode {inode}"
            )));
        }
        Ok(local)
    }
}

impl Drop for RemoteFd {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor.
        unsafe { libc::close(self.0) };
    }
}

impl KnobIo for HostKnobs {
    fn read(&mut self, knob: &Knob) -> Result<KnobValue, HealError> {
        match knob {
            Knob::Affinity { pid, tid, start } => {
                alive(*pid, Some(*tid), *start, knob)?;
                // SAFETY: a zeroed cpu_set_t is valid; the size matches.
                let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                let rc = unsafe {
                    libc::sched_getaffinity(
                        *tid as libc::pid_t,
                        std::mem::size_of::<libc::cpu_set_t>(),
                        &mut set,
                    )
                };
                if rc != 0 {
                    return Err(os_error(knob, "sched_getaffinity"));
                }
                let cpus = (0..libc::CPU_SETSIZE as usize)
                    // SAFETY: index within the set's size.
                    .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                    .map(|c| c as u32)
                    .collect();
                Ok(KnobValue::Cpus(cpus))
            }
            Knob::Sched { pid, tid, start } => {
                alive(*pid, Some(*tid), *start, knob)?;
                match sched_getattr(*tid) {
                    Ok(a) => {
                        let slice_ns = if a.sched_runtime == default_slice_ns() {
                            0
                        } else {
                            a.sched_runtime
                        };
                        Ok(KnobValue::Sched {
                            policy: a.sched_policy,
                            nice: a.sched_nice,
                            slice_ns,
                        })
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                        // SAFETY: errno is reset first so that -1 can be told from an error.
                        let nice = unsafe {
                            *libc::__errno_location() = 0;
                            libc::getpriority(libc::PRIO_PROCESS, *tid)
                        };
                        if nice == -1 && std::io::Error::last_os_error().raw_os_error() != Some(0) {
                            return Err(os_error(knob, "getpriority"));
                        }
                        Ok(KnobValue::Sched {
                            policy: 0,
                            nice,
                            slice_ns: 0,
                        })
                    }
                    Err(source) => Err(HealError::Knob {
                        knob: knob.to_string(),
                        op: "sched_getattr",
                        source,
                    }),
                }
            }
            Knob::IoPrio { pid, tid, start } => {
                alive(*pid, Some(*tid), *start, knob)?;
                ioprio(*tid)
                    .map(KnobValue::Int)
                    .map_err(|source| HealError::Knob {
                        knob: knob.to_string(),
                        op: "ioprio_get",
                        source,
                    })
            }
            Knob::Cgroup { path, .. } => match std::fs::read_to_string(path) {
                Ok(t) if knob.is_cpu_idle() => {
                    let weight = weight_file(path)
                        .and_then(|w| std::fs::read_to_string(w).ok())
                        .map(|w| format!(" {}", w.trim()))
                        .unwrap_or_default();
                    Ok(KnobValue::Text(format!("{}{weight}", t.trim())))
                }
                Ok(t) => Ok(KnobValue::Text(t.trim().to_owned())),
                // The cgroup was removed: nothing left to restore.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(HealError::Gone {
                    what: knob.to_string(),
                }),
                Err(source) => Err(HealError::Knob {
                    knob: knob.to_string(),
                    op: "read",
                    source,
                }),
            },
            Knob::SocketPriority {
                pid,
                start,
                fd,
                inode,
            } => {
                alive(*pid, None, *start, knob)?;
                let local =
                    RemoteFd::open(*pid, *fd, *inode).map_err(|source| HealError::Knob {
                        knob: knob.to_string(),
                        op: "pidfd_getfd",
                        source,
                    })?;
                let mut v: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: valid fd, buffer and length.
                let rc = unsafe {
                    libc::getsockopt(
                        local.0,
                        libc::SOL_SOCKET,
                        libc::SO_PRIORITY,
                        &mut v as *mut libc::c_int as *mut libc::c_void,
                        &mut len,
                    )
                };
                if rc != 0 {
                    return Err(os_error(knob, "getsockopt(SO_PRIORITY)"));
                }
                Ok(KnobValue::Int(i64::from(v)))
            }
            Knob::ShimDepth { pid } => self
                .shim
                .depth(*pid)
                .map(|d| KnobValue::Int(i64::from(d)))
                .ok_or_else(|| HealError::Unsupported {
                    what: knob.to_string(),
                    why: "no shim of that process is connected (or the shim source is down)"
                        .to_owned(),
                }),
            Knob::JobStrategy { pid, strategy } => {
                Ok(KnobValue::Job(self.channel.entry(*pid, *strategy)?))
            }
        }
    }

    fn write(&mut self, knob: &Knob, value: &KnobValue) -> Result<(), HealError> {
        let mismatch = || HealError::Mismatch {
            knob: knob.to_string(),
            value: value.to_string(),
        };
        match (knob, value) {
            (Knob::Affinity { pid, tid, start }, KnobValue::Cpus(cpus)) => {
                alive(*pid, Some(*tid), *start, knob)?;
                // SAFETY: a zeroed cpu_set_t is valid; CPU_SET indexes within it.
                let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                for &c in cpus
                    .iter()
                    .filter(|&&c| (c as usize) < libc::CPU_SETSIZE as usize)
                {
                    unsafe { libc::CPU_SET(c as usize, &mut set) };
                }
                // SAFETY: valid set of the size passed.
                let rc = unsafe {
                    libc::sched_setaffinity(
                        *tid as libc::pid_t,
                        std::mem::size_of::<libc::cpu_set_t>(),
                        &set,
                    )
                };
                if rc != 0 {
                    return Err(os_error(knob, "sched_setaffinity"));
                }
                Ok(())
            }
            (
                Knob::Sched { pid, tid, start },
                KnobValue::Sched {
                    policy,
                    nice,
                    slice_ns,
                },
            ) => {
                alive(*pid, Some(*tid), *start, knob)?;
                if !FAIR_POLICIES.contains(policy) {
                    return Err(HealError::Unsupported {
                        what: knob.to_string(),
                        why: format!("policy {policy} is not a fair policy; only SCHED_OTHER, SCHED_BATCH and SCHED_IDLE are written"),
                    });
                }
                let attr = SchedAttr {
                    size: 56,
                    sched_policy: *policy,
                    sched_nice: *nice,
                    sched_runtime: *slice_ns,
                    ..Default::default()
                };
                // SAFETY: a valid sched_attr of the size it states.
                let rc = unsafe {
                    libc::syscall(
                        libc::SYS_sched_setattr,
                        *tid as libc::pid_t,
                        &attr as *const SchedAttr,
                        0u32,
                    )
                };
                if rc == 0 {
                    return Ok(());
                }
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ENOSYS) {
                    return Err(HealError::Knob {
                        knob: knob.to_string(),
                        op: "sched_setattr",
                        source: e,
                    });
                }
                // SAFETY: plain syscall.
                if unsafe { libc::setpriority(libc::PRIO_PROCESS, *tid, *nice) } != 0 {
                    return Err(os_error(knob, "setpriority"));
                }
                Ok(())
            }
            (Knob::IoPrio { pid, tid, start }, KnobValue::Int(v)) => {
                alive(*pid, Some(*tid), *start, knob)?;
                // SAFETY: plain syscall; IOPRIO_WHO_PROCESS = 1.
                let rc = unsafe {
                    libc::syscall(
                        libc::SYS_ioprio_set,
                        1,
                        *tid as libc::c_int,
                        *v as libc::c_int,
                    )
                };
                if rc != 0 {
                    return Err(os_error(knob, "ioprio_set"));
                }
                Ok(())
            }
            (Knob::Cgroup { path, .. }, KnobValue::Text(t)) if knob.is_cpu_idle() => {
                // The flag first; leaving idle resets the weight to the default, so the weight
                // it had is written after it.
                let mut f = t.split_whitespace();
                let idle = f.next().unwrap_or_default();
                let err = |source| HealError::Knob {
                    knob: knob.to_string(),
                    op: "write",
                    source,
                };
                std::fs::write(path, idle).map_err(err)?;
                match (idle, f.next(), weight_file(path)) {
                    ("0", Some(w), Some(file)) => std::fs::write(file, w).map_err(err),
                    _ => Ok(()),
                }
            }
            (Knob::Cgroup { path, .. }, KnobValue::Text(t)) => {
                std::fs::write(path, t).map_err(|source| HealError::Knob {
                    knob: knob.to_string(),
                    op: "write",
                    source,
                })
            }
            (
                Knob::SocketPriority {
                    pid,
                    start,
                    fd,
                    inode,
                },
                KnobValue::Int(v),
            ) => {
                alive(*pid, None, *start, knob)?;
                let local =
                    RemoteFd::open(*pid, *fd, *inode).map_err(|source| HealError::Knob {
                        knob: knob.to_string(),
                        op: "pidfd_getfd",
                        source,
                    })?;
                let v = *v as libc::c_int;
                // SAFETY: valid fd, value and length.
                let rc = unsafe {
                    libc::setsockopt(
                        local.0,
                        libc::SOL_SOCKET,
                        libc::SO_PRIORITY,
                        &v as *const libc::c_int as *const libc::c_void,
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                if rc != 0 {
                    return Err(os_error(knob, "setsockopt(SO_PRIORITY)"));
                }
                Ok(())
            }
            (Knob::ShimDepth { pid }, KnobValue::Int(d)) => self
                .shim
                .set_depth(*pid, (*d).clamp(0, 2) as u32)
                .map_err(|why| HealError::Unsupported {
                    what: knob.to_string(),
                    why,
                }),
            (Knob::JobStrategy { pid, strategy }, KnobValue::Job(v)) => {
                self.channel.set_entry(*pid, *strategy, v.clone())
            }
            _ => Err(mismatch()),
        }
    }
}

/// The TCP sockets of `pid`: (fd, inode) of every descriptor that is a socket found in
/// `/proc/<pid>/net/tcp` or `tcp6` in the ESTABLISHED state.
pub fn tcp_sockets(pid: u32) -> Vec<(i32, u64)> {
    let mut established = std::collections::BTreeSet::new();
    for f in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{f}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if cols.len() > 9 && cols[3] == "01" {
                if let Ok(inode) = cols[9].parse::<u64>() {
                    established.insert(inode);
                }
            }
        }
    }
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        let inode = link
            .to_str()
            .and_then(|l| l.strip_prefix("socket:["))
            .and_then(|l| l.strip_suffix(']'))
            .and_then(|i| i.parse::<u64>().ok());
        if let Some(inode) = inode.filter(|i| established.contains(i)) {
            out.push((fd, inode));
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpu_list(&[5]), "5");
        let k = Knob::Cgroup {
            cgroup: "/x".into(),
            file: "cpuset.cpus".into(),
            path: "/x/cpuset.cpus".into(),
        };
        assert!(KnobValue::Text("0-1".into()).same(&KnobValue::Text("0,1".into()), &k));
        let k = Knob::Cgroup {
            cgroup: "/x".into(),
            file: "cpu.max".into(),
            path: "/x/cpu.max".into(),
        };
        assert!(
            KnobValue::Text("max  100000".into()).same(&KnobValue::Text("max 100000".into()), &k)
        );
        assert!(
            !KnobValue::Text("1000 100000".into()).same(&KnobValue::Text("max 100000".into()), &k)
        );
    }

    /// A real cgroup (v1 cpu on the CI VM; root): the kernel sets the weight to the default
    /// when a group leaves idle, so an undo of `cpu.idle` alone lost a neighbour's weight.
    #[test]
    fn an_undone_cpu_idle_gives_the_group_its_weight_back() {
        let root = std::path::Path::new("/sys/fs/cgroup/cpu");
        let dir = root.join(format!("slo-probe-idle-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        if std::fs::create_dir(&dir).is_err() || !dir.join("cpu.idle").exists() {
            eprintln!("skipped: no writable v1 cpu controller with cpu.idle at {root:?}");
            let _ = std::fs::remove_dir(&dir);
            return;
        }
        std::fs::write(dir.join("cpu.shares"), "4096").expect("shares");
        let mut io = HostKnobs {
            channel: crate::healer::channel::Channel::new(std::env::temp_dir()),
            shim: Box::new(NoShimControl),
        };
        let k = Knob::Cgroup {
            cgroup: "/n".into(),
            file: "cpu.idle".into(),
            path: dir.join("cpu.idle"),
        };
        let prior = io.read(&k).expect("read");
        assert_eq!(prior, KnobValue::Text("0 4096".into()));
        let value = KnobValue::Text("1".into());
        io.write(&k, &value).expect("idle");
        let now = io.read(&k).expect("read");
        assert!(now.same(&value, &k), "{now}");
        assert!(!now.same(&prior, &k), "{now}");
        let r = crate::healer::journal::restore(
            &mut io,
            &[crate::healer::journal::Change {
                knob: k.clone(),
                prior: prior.clone(),
                value,
            }],
        );
        let shares = std::fs::read_to_string(dir.join("cpu.shares")).unwrap_or_default();
        let _ = std::fs::remove_dir(&dir);
        assert!(r.failed.is_empty() && r.left.is_empty(), "{r:?}");
        assert_eq!(shares.trim(), "4096", "the weight it had before the action");
    }

    #[test]
    fn knobs_round_trip_through_json() {
        let k = Knob::Sched {
            pid: 1,
            tid: 2,
            start: 3,
        };
        let v = KnobValue::Sched {
            policy: 0,
            nice: -5,
            slice_ns: 0,
        };
        let text = serde_json::to_string(&(&k, &v)).expect("json");
        assert!(text.contains("\"knob\":\"sched\""), "{text}");
        let back: (Knob, KnobValue) = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, (k, v));
    }

    /// Reads of the calling thread's own knobs (no privilege needed to read).
    #[test]
    fn own_thread_knobs_read() {
        let pid = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let start = start_time(pid).expect("own start time");
        let mut io = HostKnobs {
            channel: Channel::new(std::env::temp_dir().join("slo-probe-knobs-test")),
            shim: Box::new(NoShimControl),
        };
        let cpus = io
            .read(&Knob::Affinity { pid, tid, start })
            .expect("affinity");
        assert!(
            matches!(cpus, KnobValue::Cpus(ref c) if !c.is_empty()),
            "{cpus:?}"
        );
        let s = io.read(&Knob::Sched { pid, tid, start }).expect("sched");
        assert!(matches!(s, KnobValue::Sched { slice_ns: 0, .. }), "{s:?}");
        assert!(io.read(&Knob::IoPrio { pid, tid, start }).is_ok());
        // A wrong start time is a different process.
        let gone = io.read(&Knob::Affinity {
            pid,
            tid,
            start: start + 1,
        });
        assert!(matches!(gone, Err(HealError::Gone { .. })), "{gone:?}");
        assert!(io.read(&Knob::ShimDepth { pid }).is_err());
    }
}
