//! The shims' transport: who may connect (`SO_PEERCRED`), the hello and the ring's memfd
//! (`SCM_RIGHTS`), the shared mapping, and telling a closed connection. What comes through the
//! ring goes to the process's pipeline ([`super`]).

use std::{
    fs::File,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
    time::Duration,
};

use slo_probe_common::ring::{Ring, ShimHello, RING_HEADER_LEN};

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
    /// Whether the peer closed the connection (the process exited or the shim let go).
    pub fn peer_closed(&self) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: valid socket and buffer.
        let r = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        r == 0
    }
}

/// Checks the peer, reads its hello and ring fd, and maps the ring.
pub(super) fn register(stream: UnixStream, me: u32, allowed: &[u32]) -> io::Result<Conn> {
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
