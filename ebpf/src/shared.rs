//! Maps and helpers used by every program family: the drop/error counters and kernel struct
//! offsets patched in by the agent.

use aya_ebpf::{helpers::bpf_probe_read_kernel, macros::map, maps::PerCpuArray};
use slo_probe_common::Counter;

/// Drop and error counters, one per-CPU slot per [`Counter`] (no atomics, no contention).
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// Byte offsets of `task_struct` fields on the running kernel. Rust eBPF has no CO-RE field
/// relocations, so the agent reads them from `/sys/kernel/btf/vmlinux` and patches these globals
/// before loading (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
pub static TASK_PID_OFFSET: u32 = 0;
/// See [`TASK_PID_OFFSET`].
#[unsafe(no_mangle)]
pub static TASK_TGID_OFFSET: u32 = 0;
/// See [`TASK_PID_OFFSET`].
#[unsafe(no_mangle)]
pub static TASK_COMM_OFFSET: u32 = 0;

/// Reads a patched global. `read_volatile` keeps the compiler from folding the initial value.
#[inline(always)]
pub fn global<T: Copy>(g: &T) -> T {
    // SAFETY: `g` is a valid reference to a static.
    unsafe { core::ptr::read_volatile(g) }
}

#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: this CPU's own slot. A program nesting through an interrupt can, rarely, lose
        // one increment; acceptable for counters, and cheaper than an atomic on every event.
        unsafe { *slot += 1 };
    }
}

/// Reads a `T` at `base + offset` of kernel memory, counting failures.
#[inline(always)]
pub fn read_kernel<T: Copy>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel validates the address and fails instead of faulting.
    match unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) } {
        Ok(v) => Some(v),
        Err(_) => {
            count(Counter::ProbeReadFailed);
            None
        }
    }
}

/// `task->pid` (the thread id), `task->tgid` (the process id) of a task.
#[inline(always)]
pub fn task_ids(task: *const u8) -> Option<(u32, u32)> {
    let tid = read_kernel::<u32>(task, global(&TASK_PID_OFFSET))?;
    let tgid = read_kernel::<u32>(task, global(&TASK_TGID_OFFSET))?;
    Some((tid, tgid))
}

/// `task->comm` of a task.
#[inline(always)]
pub fn task_comm(task: *const u8) -> [u8; 16] {
    read_kernel::<[u8; 16]>(task, global(&TASK_COMM_OFFSET)).unwrap_or([0; 16])
}
