//! The host side shared by the agent and the CUPTI shim (feature `host`): the clock and the
//! ring's shared mapping, so that both sides agree by construction.

use core::ptr::NonNull;

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns`, of the shim's records and of the
/// agent's ticks, which is what lets them be joined.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Maps `len` bytes of the file `fd` read-write and shared (the shim writes its ring there, the
/// agent reads and acknowledges it). `None` on failure, with `errno` set.
///
/// # Safety
/// `fd` must be an open file at least `len` bytes long; the mapping is the caller's to unmap.
pub unsafe fn map_shared(fd: i32, len: usize) -> Option<NonNull<u8>> {
    // SAFETY: the caller's contract; a null hint lets the kernel choose the address.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        None
    } else {
        NonNull::new(base.cast())
    }
}
