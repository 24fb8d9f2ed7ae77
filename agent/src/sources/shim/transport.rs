//! The shims' transport: who may connect (`SO_PEERCRED`), the hello and the ring's memfd
//! (`SCM_RIGHTS`), the shared mapping, and telling a closed connection. What comes through the
//! ring goes to the process's pipeline ([`super`]).
//!
//! The peer is not trusted: every descriptor a message carries is closed unless it is the one
//! ring; the ring must be a memfd sealed against shrinking and growing (`F_SEAL_SHRINK |
//! F_SEAL_GROW`, Linux 3.17), so that the size checked here stays the size mapped — a peer
//! that truncated an unsealed file would make the agent's next read of the ring a SIGBUS.

use std::{
    fs::File,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
};

use slo_probe_common::ring::{Ring, ShimHello, RING_HEADER_LEN};

/// The seals a ring's memfd must carry.
pub(super) const REQUIRED_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Largest ring the agent maps, bytes.
pub(super) const MAX_RING_LEN: usize = 2 << 30;

/// Why a shim connection was refused; [`Refusal::reason`] is the `reason` label of
/// `slo_probe_shim_refused_total`.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// The peer's uid may not register.
    #[error("uid {uid} is not allowed (add it to shim.allowed_uids)")]
    Uid {
        /// The peer's uid.
        uid: u32,
    },
    /// The kernel did not say who the peer is.
    #[error("cannot read the peer's credentials (SO_PEERCRED)")]
    PeerCred {
        /// What getsockopt said.
        #[source]
        source: io::Error,
    },
    /// No hello within the handshake deadline.
    #[error("no hello within {ms} ms (a shim sends it right after connecting)")]
    Timeout {
        /// The deadline, ms.
        ms: u64,
    },
    /// Too many handshakes of this uid at once: the oldest is dropped.
    #[error("more than {max} handshakes of uid {uid} at once: the oldest was dropped")]
    PendingCap {
        /// The peer's uid.
        uid: u32,
        /// The cap.
        max: usize,
    },
    /// Too many training processes tracked.
    #[error(
        "{max} training processes are tracked already, none of them finished; pid {pid} is          not tracked"
    )]
    ProcessCap {
        /// The peer.
        pid: u32,
        /// The cap.
        max: usize,
    },
    /// The agent is out of file descriptors.
    #[error("cannot accept a shim connection: {source}; raise LimitNOFILE (ulimit -n)")]
    FdLimit {
        /// EMFILE or ENFILE.
        #[source]
        source: io::Error,
    },
    /// Reading the hello failed, or the peer hung up before sending it.
    #[error("reading the hello failed")]
    Io {
        /// What recvmsg said.
        #[source]
        source: io::Error,
    },
    /// Not a hello of this version.
    #[error("not a shim hello ({len} bytes); is the shim library of another slo-probe version?")]
    Hello {
        /// Bytes received.
        len: usize,
    },
    /// The hello carried no descriptor, or more than one.
    #[error("the hello carried {fds} file descriptors{}; a shim sends exactly one (its ring)", if *.truncated { " and more that did not fit" } else { "" })]
    Fds {
        /// Descriptors received (all closed).
        fds: usize,
        /// The kernel dropped further ones (MSG_CTRUNC).
        truncated: bool,
    },
    /// The hello's pid is not the peer's.
    #[error("hello for pid {said} from pid {host_pid} (pid {inner} in its own namespace)")]
    Pid {
        /// The pid in the hello.
        said: u32,
        /// The peer's pid (the kernel's, in the agent's namespace).
        host_pid: u32,
        /// The peer's pid in its innermost namespace, if known.
        inner: String,
    },
    /// The ring's size is out of range, or larger than its file.
    #[error("bad ring size {len} (file of {file} bytes; at most {MAX_RING_LEN})")]
    RingSize {
        /// Bytes the hello says.
        len: u64,
        /// Bytes the file has.
        file: u64,
    },
    /// The ring is not a memfd sealed against resizing.
    #[error(
        "the ring is not a memfd sealed against shrinking and growing (seals {seals}; needs          F_SEAL_SHRINK|F_SEAL_GROW): refused, as a ring truncated after this check would crash          the agent; use the shim library of this slo-probe version"
    )]
    Unsealed {
        /// The seals it has (`none`: not a memfd).
        seals: String,
    },
    /// mmap or the ring's header failed.
    #[error("cannot map the ring: {what}")]
    Map {
        /// What failed.
        what: String,
    },
}

impl Refusal {
    /// Every reason, in the order the metric lists them.
    pub(super) const REASONS: [&'static str; 13] = [
        "uid",
        "peer_cred",
        "timeout",
        "pending_cap",
        "process_cap",
        "fd_limit",
        "io",
        "hello",
        "fds",
        "pid",
        "ring_size",
        "unsealed",
        "map",
    ];

    /// The `reason` label.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Self::Uid { .. } => "uid",
            Self::PeerCred { .. } => "peer_cred",
            Self::Timeout { .. } => "timeout",
            Self::PendingCap { .. } => "pending_cap",
            Self::ProcessCap { .. } => "process_cap",
            Self::FdLimit { .. } => "fd_limit",
            Self::Io { .. } => "io",
            Self::Hello { .. } => "hello",
            Self::Fds { .. } => "fds",
            Self::Pid { .. } => "pid",
            Self::RingSize { .. } => "ring_size",
            Self::Unsealed { .. } => "unsealed",
            Self::Map { .. } => "map",
        }
    }

    /// Its index in [`Refusal::REASONS`].
    pub(super) fn index(&self) -> usize {
        let r = self.reason();
        Self::REASONS.iter().position(|x| *x == r).unwrap_or(0)
    }
}

/// One shim's mapping.
pub(super) struct Mapping {
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

/// A registered shim.
pub(super) struct Conn {
    /// Its process, as the host's pid namespace numbers it.
    pub pid: u32,
    /// The CUPTI version it runs against.
    pub cupti_version: u32,
    stream: UnixStream,
    /// Its ring (consumer side).
    pub ring: Ring,
    _mapping: Mapping,
    /// The connection reached EOF.
    pub closed: bool,
}

impl Conn {
    /// Whether the peer closed the connection (the process exited or the shim let go). A shim
    /// sends nothing after its hello: anything else is read and discarded, so that bytes
    /// stuffed into the socket cannot hide its end.
    pub fn peer_closed(&self) -> bool {
        let mut b = [0u8; 256];
        loop {
            // SAFETY: valid socket and buffer.
            let r = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    b.as_mut_ptr().cast(),
                    b.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            match r {
                0 => return true,
                n if n > 0 => continue,
                _ => {
                    return !matches!(
                        io::Error::last_os_error().raw_os_error(),
                        Some(libc::EAGAIN) | Some(libc::EINTR)
                    )
                }
            }
        }
    }
}

/// The peer's credentials, checked against root, the agent's own uid and `allowed`.
pub(super) fn check_peer(
    stream: &UnixStream,
    me: u32,
    allowed: &[u32],
) -> Result<libc::ucred, Refusal> {
    let cred = peer_cred(stream).map_err(|source| Refusal::PeerCred { source })?;
    if cred.uid != 0 && cred.uid != me && !allowed.contains(&cred.uid) {
        return Err(Refusal::Uid { uid: cred.uid });
    }
    Ok(cred)
}

/// Reads the hello and its ring fd without blocking: `Ok(None)` while nothing has arrived.
pub(super) fn try_hello(stream: &UnixStream) -> Result<Option<(Vec<u8>, OwnedFd)>, Refusal> {
    let (data, fds, truncated) = match recv_with_fds(stream) {
        Ok(got) => got,
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted =>
        {
            return Ok(None)
        }
        Err(source) => return Err(Refusal::Io { source }),
    };
    if data.is_empty() && fds.is_empty() {
        return Err(Refusal::Io {
            source: io::Error::new(io::ErrorKind::UnexpectedEof, "the peer hung up"),
        });
    }
    if fds.len() != 1 || truncated {
        // Dropping `fds` closes every one of them.
        return Err(Refusal::Fds {
            fds: fds.len(),
            truncated,
        });
    }
    let fd = fds
        .into_iter()
        .next()
        .ok_or(Refusal::Fds { fds: 0, truncated })?;
    Ok(Some((data, fd)))
}

/// Checks a hello and its ring, and maps the ring.
pub(super) fn register(
    stream: UnixStream,
    cred: &libc::ucred,
    hello: &[u8],
    fd: OwnedFd,
) -> Result<Conn, Refusal> {
    let hello = ShimHello::from_bytes(hello).ok_or(Refusal::Hello { len: hello.len() })?;
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
            return Err(Refusal::Pid {
                said: hello.pid,
                host_pid,
                inner: inner.map_or("unknown".into(), |p| p.to_string()),
            });
        }
        log::info!(
            "shim of pid {host_pid} registered from a pid namespace where it is pid {}",
            hello.pid
        );
    }
    // Sealed first: only then does the size checked below stay the size mapped.
    // SAFETY: fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & REQUIRED_SEALS != REQUIRED_SEALS {
        return Err(Refusal::Unsealed {
            seals: if seals < 0 {
                "none: not a memfd".into()
            } else {
                format!("{seals:#x}")
            },
        });
    }
    let meta = File::from(fd.try_clone().map_err(|e| Refusal::Map {
        what: e.to_string(),
    })?)
    .metadata()
    .map_err(|e| Refusal::Map {
        what: e.to_string(),
    })?;
    let file = meta.len();
    let len = usize::try_from(hello.ring_len)
        .ok()
        .filter(|&l| l > RING_HEADER_LEN && l <= MAX_RING_LEN && l as u64 <= file)
        .ok_or(Refusal::RingSize {
            len: hello.ring_len,
            file,
        })?;
    // SAFETY: a sealed memfd of at least `len` bytes, which cannot shrink.
    let base: *mut libc::c_void =
        unsafe { slo_probe_common::host::map_shared(fd.as_raw_fd(), len) }
            .ok_or_else(|| Refusal::Map {
                what: io::Error::last_os_error().to_string(),
            })?
            .as_ptr()
            .cast();
    drop(fd);
    let mapping = Mapping { base, len };
    // SAFETY: the mapping lives in the same Conn as the ring.
    let ring = unsafe { Ring::open(base.cast(), len) }.map_err(|e| Refusal::Map {
        what: e.to_string(),
    })?;
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

/// Room for this many descriptors in one message: more are dropped by the kernel (and the
/// message refused), none is left open.
const MAX_FDS: usize = 8;

/// One message without blocking: its bytes, every descriptor it carried (owned: closed when
/// dropped), and whether the kernel dropped descriptors that did not fit.
fn recv_with_fds(s: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>, bool)> {
    let mut data = vec![0u8; 64];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<i32>()) as u32) } as usize;
    // u64 elements: the control buffer must be aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: zeroed msghdr is valid; buffers outlive recvmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: valid socket and message.
    let n = unsafe {
        libc::recvmsg(
            s.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    data.truncate(n as usize);
    let mut fds = Vec::new();
    // SAFETY: walking the control buffer recvmsg filled; every SCM_RIGHTS descriptor is ours
    // to close.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(cmsg).cast::<i32>();
                for k in 0..payload / std::mem::size_of::<i32>() {
                    let fd = std::ptr::read_unaligned(p.add(k));
                    if fd >= 0 {
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((data, fds, msg.msg_flags & libc::MSG_CTRUNC != 0))
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
