//! Maps and helpers used by every program family: drop/error counters, the job's process set
//! (the in-kernel filter), kernel struct offsets patched in by the agent, and the per-thread
//! statistics map that the scheduling and network programs both update.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use slo_probe_common::{Counter, ThreadStats};

/// Drop and error counters, one per-CPU slot per [`Counter`] (no atomics, no contention).
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// Process ids of the job (value: reserved, 0). When `FILTER_TRACKED` is 1 only threads of
/// these processes are followed; `proc.rs` adds forked children, the agent seeds the roots.
#[map]
pub static TRACKED: HashMap<u32, u32> = HashMap::with_max_entries(8192, 0);

/// Thread id → statistics (layout shared with the agent). Sized by the agent.
#[map]
pub static THREADS: HashMap<u32, ThreadStats> = HashMap::with_max_entries(16384, 0);

/// Per-CPU scratch used as the initial value of new `THREADS` entries (440 bytes are too many
/// for the 512-byte BPF stack next to everything else).
#[map]
static THREAD_SCRATCH: PerCpuArray<ThreadStats> = PerCpuArray::with_max_entries(1, 0);

/// 1: follow only the processes in `TRACKED`; 0: follow every process (patched by the agent).
#[unsafe(no_mangle)]
pub static FILTER_TRACKED: u32 = 0;

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

/// BPF_NOEXIST: insert only if absent.
pub const BPF_NOEXIST: u64 = 1;

/// BPF_RB_NO_WAKEUP: the agent drains rings on its own tick, so no record wakes it up.
pub const BPF_RB_NO_WAKEUP: u64 = 1;

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

/// `task->pid`, the thread id.
#[inline(always)]
pub fn task_tid(task: *const u8) -> Option<u32> {
    read_kernel::<u32>(task, global(&TASK_PID_OFFSET))
}

/// `task->pid` of a task a BTF tracepoint passed (`PTR_TO_BTF_ID`): a plain load, which the
/// verifier checks against the kernel's BTF (the offset is a constant of the frozen `.rodata`)
/// and turns into a fault-safe load; no helper call. The sched programs read it on every
/// wakeup and switch: on the CI VM (bpf_stats, 8 alternated runs) this took the wakeup program
/// from 160 to 140 ns a run and the switch program from 224 to 202 ns.
#[inline(always)]
pub fn btf_task_tid(task: *const u8) -> u32 {
    btf_load(task, global(&TASK_PID_OFFSET))
}

/// `task->tgid` of a task a BTF tracepoint passed, as [`btf_task_tid`] reads its pid (read for
/// every thread the job filter has not seen yet, on each of its wakeups and switches).
#[inline(always)]
pub fn btf_task_tgid(task: *const u8) -> u32 {
    btf_load(task, global(&TASK_TGID_OFFSET))
}

/// A field of a kernel struct reached from a BTF tracepoint's arguments (`PTR_TO_BTF_ID`, or a
/// pointer loaded from one): a plain load that the verifier checks against BTF and makes
/// fault-safe (a bad pointer reads 0).
#[inline(always)]
pub fn btf_load<T: Copy>(base: *const u8, offset: u32) -> T {
    // SAFETY: `base` is a kernel struct pointer the verifier types from BTF; it refuses the
    // program unless `offset` is that of a field of type `T` in that struct.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// `task->tgid`, the process id.
#[inline(always)]
pub fn task_tgid(task: *const u8) -> Option<u32> {
    read_kernel::<u32>(task, global(&TASK_TGID_OFFSET))
}

/// `task->comm` of a task.
#[inline(always)]
pub fn task_comm(task: *const u8) -> [u8; 16] {
    read_kernel::<[u8; 16]>(task, global(&TASK_COMM_OFFSET)).unwrap_or([0; 16])
}

/// Whether threads of process `tgid` are followed.
#[inline(always)]
pub fn is_tracked(tgid: u32) -> bool {
    // SAFETY: the value is not used, only its presence.
    global(&FILTER_TRACKED) == 0 || unsafe { TRACKED.get(tgid) }.is_some()
}

/// The statistics entry of thread `tid`, created (when its process is followed) with `tgid`,
/// `comm` and `flags`. `None` when the thread is not followed or the map is full.
#[inline(always)]
pub fn thread_entry(
    tid: u32,
    tgid: impl FnOnce() -> Option<u32>,
    comm: impl FnOnce() -> [u8; 16],
    flags: u32,
) -> Option<*mut ThreadStats> {
    if let Some(e) = THREADS.get_ptr_mut(tid) {
        return Some(e);
    }
    let tgid = tgid()?;
    if !is_tracked(tgid) {
        return None;
    }
    let scratch = THREAD_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch slot; only the identity and stamp fields are ever written, the
    // counters stay zero.
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "passing the 440-byte value by value would copy it onto the 512-byte BPF stack"
    )]
    unsafe {
        (*scratch).off_ts = 0;
        (*scratch).queued_ts = 0;
        (*scratch).tgid = tgid;
        (*scratch).flags = flags;
        (*scratch).comm = comm();
        if THREADS.insert(tid, &*scratch, BPF_NOEXIST).is_err() && THREADS.get(tid).is_none() {
            count(Counter::ThreadMapFull);
            return None;
        }
    }
    THREADS.get_ptr_mut(tid)
}
