//! Batched reads of BPF hash maps (`BPF_MAP_LOOKUP_BATCH`, kernel 5.6+): one syscall per few
//! hundred entries instead of two per entry. aya 0.14 has no batch API, so this issues the
//! syscall itself; on kernels without it the caller falls back to aya's per-key iteration.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, BorrowedFd},
};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// `union bpf_attr`'s `batch` member.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Reads every entry of a (non-per-CPU) hash map. `Err` with `Unsupported` when the kernel has
/// no batch operations for this map.
pub fn lookup_all<K: aya::Pod, V: aya::Pod>(fd: BorrowedFd<'_>) -> io::Result<Vec<(K, V)>> {
    let mut chunk = 256usize;
    let mut out = Vec::new();
    let mut keys = vec![0u8; chunk * size_of::<K>()];
    let mut values = vec![0u8; chunk * size_of::<V>()];
    // Hash maps use a u32 bucket index as the batch cursor.
    let mut cursor_in = 0u32;
    let mut cursor_out = 0u32;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &cursor_in as *const u32 as u64
            },
            out_batch: &mut cursor_out as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: attr points at buffers of `count` keys and values that outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>(),
            )
        };
        let err = (rc < 0).then(io::Error::last_os_error);
        let n = attr.count as usize;
        for i in 0..n.min(chunk) {
            // SAFETY: the kernel wrote `n` keys and values; Pod types accept any bytes.
            let k = unsafe {
                std::ptr::read_unaligned(keys.as_ptr().add(i * size_of::<K>()).cast::<K>())
            };
            // SAFETY: as above.
            let v = unsafe {
                std::ptr::read_unaligned(values.as_ptr().add(i * size_of::<V>()).cast::<V>())
            };
            out.push((k, v));
        }
        match err.as_ref().and_then(io::Error::raw_os_error) {
            None => {}
            Some(libc::ENOENT) => return Ok(out), // end of the map
            Some(libc::ENOSPC) if n == 0 => {
                // One bucket holds more entries than fit: retry it with more room.
                chunk *= 2;
                keys.resize(chunk * size_of::<K>(), 0);
                values.resize(chunk * size_of::<V>(), 0);
                continue;
            }
            // 524 is the kernel-internal ENOTSUPP.
            Some(libc::EINVAL | 524 | libc::EOPNOTSUPP) if first => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, "no batch ops"));
            }
            Some(_) => return Err(err.unwrap_or_else(io::Error::last_os_error)),
        }
        cursor_in = cursor_out;
        first = false;
    }
}
