//! The shim's side of the transport: a memfd-backed ring ([`slo_probe_common::ring`]) and the
//! Unix-socket registration with the agent (the memfd travels with `SCM_RIGHTS`). The ring
//! exists from the start, so records are kept (up to its size) while no agent is listening;
//! the connection is retried in the background, and re-made after an agent restart. The memfd
//! is sealed against shrinking and growing (Linux 3.17), which the agent requires.

use std::{
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
    path::PathBuf,
    sync::Mutex,
};

use slo_probe_common::ring::{
    Ring, RingHeader, ShimHello, HELLO_MAGIC, RING_HEADER_LEN, RING_VERSION,
};

/// Default agent socket.
pub const DEFAULT_SOCKET: &str = "/run/slo-probe/shim.sock";

/// The ring's shared header and the agent connection. The ring itself (the producer side) is
/// returned separately by [`Transport::new`]: its pushes must be serialised by the owner.
pub struct Transport {
    /// The ring's header (atomics: status, counters, control word).
    pub header: &'static RingHeader,
    memfd: OwnedFd,
    len: usize,
    socket_path: PathBuf,
    conn: Mutex<Option<UnixStream>>,
}

impl Transport {
    /// Creates the ring in a new memfd of `capacity` data bytes (rounded down to a power of two).
    pub fn new(capacity: usize, socket_path: PathBuf) -> io::Result<(Self, Ring)> {
        let len = RING_HEADER_LEN + capacity;
        // SAFETY: a NUL-terminated name; flags valid.
        let fd = unsafe {
            libc::memfd_create(
                c"slo-probe-ring".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh memfd we own.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: valid fd.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // The agent maps the ring only if its size cannot change (a shrunk file would fault
        // in the agent). Failing to seal never stops the job: the ring works, the agent
        // refuses it and says so.
        // SAFETY: fcntl on our own memfd.
        if unsafe {
            libc::fcntl(
                memfd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            )
        } != 0
        {
            eprintln!(
                "slo-probe shim: cannot seal the ring memfd ({}); the agent will refuse it, \
                 GPU records stay in this process",
                io::Error::last_os_error()
            );
        }
        // SAFETY: a file we own, `len` bytes long (truncated above); shared so the agent sees
        // the writes.
        let base = unsafe { slo_probe_common::host::map_shared(memfd.as_raw_fd(), len) }
            .ok_or_else(io::Error::last_os_error)?
            .as_ptr();
        // SAFETY: a fresh zeroed mapping of `len` bytes, page aligned, never unmapped (the
        // process keeps it until exit).
        let ring = unsafe { Ring::init(base.cast(), len, std::process::id()) }
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // SAFETY: the mapping is never unmapped, so the header lives as long as the process.
        let header: &'static RingHeader = unsafe { &*base.cast::<RingHeader>() };
        Ok((
            Self {
                header,
                memfd,
                len,
                socket_path,
                conn: Mutex::new(None),
            },
            ring,
        ))
    }

    /// Whether an agent is connected now: checks a live connection for EOF, and otherwise
    /// tries to connect and register. Never blocks for long (connect on a Unix socket either
    /// succeeds or fails at once).
    pub fn ensure_connected(&self, cupti_version: u32, status: u32) -> bool {
        let Ok(mut conn) = self.conn.lock() else {
            return false;
        };
        if let Some(s) = conn.as_ref() {
            let mut b = [0u8; 1];
            // SAFETY: valid fd and buffer.
            let n = unsafe {
                libc::recv(
                    s.as_raw_fd(),
                    b.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            let gone = n == 0
                || (n < 0
                    && !matches!(
                        io::Error::last_os_error().raw_os_error(),
                        Some(libc::EAGAIN) | Some(libc::EINTR)
                    ));
            if !gone {
                return true;
            }
            *conn = None;
        }
        match self.register(cupti_version, status) {
            Ok(s) => {
                *conn = Some(s);
                true
            }
            Err(_) => false,
        }
    }

    fn register(&self, cupti_version: u32, status: u32) -> io::Result<UnixStream> {
        let s = UnixStream::connect(&self.socket_path)?;
        let hello = ShimHello {
            magic: HELLO_MAGIC,
            version: RING_VERSION,
            pid: std::process::id(),
            ring_len: self.len as u64,
            cupti_version,
            status,
        }
        .to_bytes();
        send_with_fd(&s, &hello, self.memfd.as_raw_fd())?;
        Ok(s)
    }
}

/// Sends `data` with one file descriptor attached.
fn send_with_fd(s: &UnixStream, data: &[u8], fd: i32) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: zeroed msghdr is valid; pointers set below stay alive during sendmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg has a control buffer of CMSG_SPACE(4) bytes.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd);
    }
    // SAFETY: a valid socket and message.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short hello"));
    }
    Ok(())
}
