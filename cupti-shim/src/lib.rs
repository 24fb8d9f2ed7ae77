//! `libslo_probe_cupti.so`: the CUPTI shim. Injected into a CUDA process with
//! `CUDA_INJECTION64_PATH=/path/to/libslo_probe_cupti.so`; the driver calls
//! [`InitializeInjection`] once, during `cuInit`.
//!
//! Tracing depth ([`depth`], [`control`]) keeps the always-on cost within a budget (0.5% of
//! step time by default) also on launch-bound jobs:
//! - depth 0, *timing* (always on): step markers, CUDA-graph launches at graph level
//!   (`GRAPH_TRACE`, with a callback on graph-launch ids only, for their launch time),
//!   memcpy and memset with a callback on the runtime copy and fill calls for their operator
//!   (`SLO_PROBE_MEM_ACTIVITY=0` turns them off). No per-kernel activity and
//!   no per-kernel launch callbacks, except in duty-cycled sample windows: every `period` steps
//!   (or ms without step markers) the shim goes to depth 1 for `window` steps (or ms), with the
//!   period set from the cost the shim measures on itself (`SLO_PROBE_SAMPLE_*` override it).
//!   Where the GPU runs far behind the launches (a deep queue: a GPU-bound job), kernel
//!   tracing is held on, since switching it on or off under a deep queue stranded every
//!   kernel record in CUPTI on the H200; the hold starts with tracing and ends once the queue
//!   is known to be shallow or the hold costly (`depth::Planner`, `SLO_PROBE_HOLD_LAG_MS`,
//!   `SLO_PROBE_HOLD_AT_START`). By default the hold gives way once the queue is known deep:
//!   windows go on, with kernel and memory activity switched only at the exit of a
//!   synchronising call, where the queue has drained, by the thread leaving it
//!   (`control::Drain`; `SLO_PROBE_TOGGLE_AT_SYNC=0` keeps the hold). Once the process launches a CUDA graph, kernel tracing is kept
//!   on (switching it with memory activity on stranded every record under graphs on an H100;
//!   `SLO_PROBE_GRAPH_FLOOR`).
//! - depth 1, *kernels*: `CONCURRENT_KERNEL` and kernel-launch callbacks (launch time, operator
//!   context, thread) in the API domains that match kernel records (`SLO_PROBE_LAUNCH_DOMAIN`).
//! - depth 2, *nodes*: depth 1 with graph-level tracing off, so that graph replays produce one
//!   record per kernel node, joined to the operator that captured the node.
//!
//! The agent (ring header `control` word) and the script (`slo_probe_request_depth`) raise the
//! depth for a while; `SLO_PROBE_DEPTH` sets the floor. Every change is stamped with a
//! `DepthRecord`, so the agent can tell "not sampled" from "no kernels" (`SLO_PROBE_SHIM_LOG=1`
//! says each change on stderr, and each activity kind switched). Every timestamp is
//! CLOCK_MONOTONIC (CUPTI's timestamp callback), the clock of the eBPF probes.
//!
//! Records go into a shared-memory ring ([`slo_probe_common::ring`]) that the agent maps after
//! the shim registers over a Unix socket. Rules that keep the training job safe: no CUDA thread
//! ever blocks on the shim (launch callbacks only write a lock-free table, other threads push
//! into a lock-free queue, full means dropped and counted); CUPTI is switched from the flusher
//! thread only; every entry point catches panics; `cuptiFinalize` is never called; after
//! `fork` the child's copy stays silent. The shim times its own callbacks on the launching
//! threads and publishes the totals in the ring header (CUPTI's own per-record work is not
//! visible to it: see `SHIM_COST_PER_KERNEL_RECORD_NS`).
//!
//! The training script talks to the shim through the C functions `slo_probe_*` below (the
//! `slo_probe` python package loads this library with ctypes), declared for C in
//! `include/slo_probe_shim.h`; `tests/c_header.rs` keeps the header, these functions, the python
//! table and the test stub in step.
//!
//! Needs CUDA 13.0 / CUPTI 13 (driver 580+); builds without CUDA.

mod activity;
mod api;
mod control;
mod depth;
mod error;
mod transport;

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    ffi::{c_char, c_void, CStr},
    panic::{catch_unwind, AssertUnwindSafe},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering},
        Mutex, OnceLock,
    },
    thread::Thread,
    time::Duration,
};

use api::{Cupti, CUPTI_ERROR_MAX_LIMIT_REACHED, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS, CUPTI_SUCCESS};
use control::{Applied, Control};
use crossbeam_queue::ArrayQueue;
use error::ShimError;
use slo_probe_common::{
    gpu::{
        encode_launch, DEPTH_NODES, DEPTH_OFF, DEPTH_REASON_DEFAULT, DEPTH_TIMING,
        KERNEL_DIAGNOSTIC, NODE_CLONED, NODE_CREATED, STEP_BEGIN, STEP_END, STRING_KERNEL,
        STRING_MAX, STRING_OP,
    },
    ring::{
        encode_depth_request, encode_shim_depth, next_generation, DepthDuration, ShimDepth,
        STATUS_CONNECTED, STATUS_DIAGNOSTIC, STATUS_LOST_RACE, STATUS_RELEASED, STATUS_TRACING,
    },
    GraphNodeRecord, Record, RecordHeader, StepRecord, StringRecord,
};
use transport::Transport;

const DOMAIN_DRIVER: u32 = 1;
const DOMAIN_RUNTIME: u32 = 2;
const DOMAIN_RESOURCE: u32 = 3;
pub(crate) const CBID_GRAPHNODE_CREATED: u32 = 13;
pub(crate) const CBID_GRAPHNODE_CLONED: u32 = 20;
/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`.
pub(crate) const FLUSH_FORCED: u32 = 1;

/// Size of each activity buffer handed to CUPTI while kernels are traced.
///
/// A default flush (`cuptiActivityFlushAll(0)`) returns only buffers whose every record is
/// complete. The CPU of a training job runs ahead of its GPU, so the buffer being filled always
/// holds records of work still queued: it comes back when it is full (and its work done), or at
/// a forced flush. Measured on the H200 (fault fixtures of 2026-11): with one 8 MiB size for
/// everything, no kernel record of a sampled window reached the agent before the job exited.
/// A forced flush at the end of every window delivered them within a second or two, but from
/// then on a fifth to a quarter of kernel records carried the correlation id of the record
/// before them (`scripts/gpu-buffer-check`, 2026-12-01: 20,583 repeats in 99,913 records; 0
/// without the forced flush), which breaks every launch stamp. So the forced flush is off
/// (`SLO_PROBE_FORCED_FLUSH=1` turns it on) and buffers are small instead: about 300 kernel
/// records, so that a window's records come back in buffers that fill within the window.
const BUFFER_BYTES: usize = 64 << 10;
/// Size of each buffer handed out at timing depth (memcpy, memset and graph-level records only,
/// a few per step): about 150 records, so that they come back within seconds.
const SMALL_BUFFER_BYTES: usize = 16 << 10;
/// Buffers kept for reuse, of each size.
const BUFFER_POOL: usize = 8;
/// How often CUPTI's worker thread flushes, in ms (`cuptiActivityFlushPeriod`). Without it,
/// on the H200 (CUDA 13.0) no kernel buffer came back while the job ran, however small the
/// buffers and however often the shim's own default flush ran (gpt eager, 2026-12-01: 5
/// buffers completed in 155 s, 47,062 records of one 40 s cut all at the exit flush). A
/// continuous CUPTI profiler (parcagpu) sets a period too.
///
/// The period was not the cause (2026-12-02, `scripts/gpu-arrival-check` on the fault suite's
/// eager GPT job, 60 s each): with the period, per-thread buffers on (CUDA 13's default) or off,
/// a 256 KiB device buffer, or 8 KiB buffers, 0–20 kernel records of ~50,000–86,000 reached
/// the shim before the exit flush. What stranded them was switching `CONCURRENT_KERNEL` off and
/// on while the GPU ran 150 ms behind the launches: held on (`SLO_PROBE_DEPTH=1`) every
/// record came within 1 s (lag p50 0.12 s) with no repeated correlation id. The planner now
/// holds kernel tracing on under a deep queue (`depth::Planner`). A synthetic loop
/// (`scripts/gpu-buffer-check`) did not show the stall in any variant.
const FLUSH_PERIOD_MS: u32 = 250;
/// `CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE`.
const ATTR_DEVICE_BUFFER_SIZE: u32 = 0;
/// `CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER` (CUDA 12.3 on; a `uint8_t`).
const ATTR_PER_THREAD_ACTIVITY_BUFFER: u32 = 9;

/// How activity buffers are sized, reused and flushed (see [`Shim::buffers_cfg`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BufferCfg {
    pub large: usize,
    pub small: usize,
    pub reuse: bool,
    pub forced_flush: bool,
    /// `cuptiActivityFlushPeriod`, ms; 0 leaves CUPTI's heuristics.
    pub flush_period_ms: u32,
    /// `CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE` in bytes where set; else CUPTI's default.
    pub device_buffer: Option<usize>,
    /// `CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER` where set; else CUPTI's default.
    pub per_thread: Option<bool>,
}

impl BufferCfg {
    fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From the variables `var` returns: sizes in KiB (4 KiB to 64 MiB), in bytes here.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let number = |k: &str| var(k).and_then(|v| v.parse::<usize>().ok());
        let bytes =
            |k: &str, default: usize| number(k).map_or(default, |kib| kib.clamp(4, 64 << 10) << 10);
        Self {
            large: bytes("SLO_PROBE_BUFFER_KIB", BUFFER_BYTES),
            small: bytes("SLO_PROBE_SMALL_BUFFER_KIB", SMALL_BUFFER_BYTES),
            reuse: var("SLO_PROBE_BUFFER_REUSE").is_none_or(|v| v != "0"),
            forced_flush: var("SLO_PROBE_FORCED_FLUSH").is_some_and(|v| v == "1"),
            flush_period_ms: var("SLO_PROBE_FLUSH_PERIOD_MS")
                .and_then(|v| v.parse::<u32>().ok())
                .map_or(FLUSH_PERIOD_MS, |ms| ms.min(60_000)),
            device_buffer: number("SLO_PROBE_DEVICE_BUFFER_KIB")
                .map(|kib| kib.clamp(64, 1 << 20) << 10),
            per_thread: var("SLO_PROBE_PER_THREAD_BUFFERS").map(|v| v == "1"),
        }
    }
}
/// Launch correlation slots (a power of two): more launches than this between a launch and
/// the flush of its record overwrite the oldest.
const CORR_SLOTS: usize = 1 << 16;
/// Records other threads can queue between two flushes (a CUDA-graph capture queues two per
/// node: created, then cloned at instantiation).
const QUEUE_LEN: usize = 1 << 16;
/// Graph nodes whose capture-time operator the shim remembers (for node-level kernel records).
const MAX_NODE_OPS: usize = 1 << 20;

/// One launch stamp, written by the launching thread, read when its records arrive.
struct CorrSlot {
    correlation: AtomicU32,
    launch_ns: AtomicU64,
    op: AtomicU32,
    tid: AtomicU32,
    /// `DOMAIN_DRIVER` or `DOMAIN_RUNTIME`: which callback stamped it.
    domain: AtomicU32,
}

enum Queued {
    Step(StepRecord),
    Depth(slo_probe_common::DepthRecord),
    Node(GraphNodeRecord),
    OpName { id: u32, name: Box<str> },
}

/// The single producer of the ring (behind a mutex, taken by the buffer-completion and flush
/// threads once per buffer or flush, never by a CUDA thread): the ring, kernel-name ids, graph
/// node → capture-time operator, a scratch buffer.
struct Writer {
    ring: Option<slo_probe_common::ring::Ring>,
    kernel_names: HashMap<usize, u32>,
    /// Filled from the node records the resource callback queues (in queue order, so a node's
    /// creation comes before its clones).
    node_ops: HashMap<u64, u32>,
    scratch: Vec<u8>,
}

impl Writer {
    fn push(&self, bytes: &[u8]) {
        if let Some(r) = &self.ring {
            r.push(bytes);
        }
    }
}

/// Counters the launching threads write in every callback, on a cache line of their own.
#[derive(Default)]
#[repr(align(64))]
struct Hot {
    /// Time inside the shim's callbacks on launching threads, ns.
    callback_ns: AtomicU64,
    kernels_driver: AtomicU64,
    kernels_runtime: AtomicU64,
    graphs_driver: AtomicU64,
    graphs_runtime: AtomicU64,
}

/// Debug counters, also exported through `slo_probe_debug_counters`.
#[derive(Default)]
struct Counters {
    kernel_records: AtomicU64,
    corr_hits: AtomicU64,
    corr_misses: AtomicU64,
    graph_records: AtomicU64,
    mem_records: AtomicU64,
    nodes_created: AtomicU64,
    nodes_cloned: AtomicU64,
    buffers_completed: AtomicU64,
    queue_dropped: AtomicU64,
    other_records: AtomicU64,
    /// Graph nodes not remembered because the node table was full.
    node_ops_full: AtomicU64,
    /// Kernel records whose launch a driver-API (runtime-API) callback stamped.
    corr_hits_driver: AtomicU64,
    corr_hits_runtime: AtomicU64,
    depth_changes: AtomicU64,
    /// Time the flusher spent switching CUPTI, ns.
    toggle_ns: AtomicU64,
    /// Launch to end on the GPU of the stamped kernels, smoothed over buffers, ns.
    gpu_lag_ns: AtomicU64,
    /// Depth switches that failed (CUPTI refused a kind).
    switch_errors: AtomicU64,
    /// Mirrors of the control state, for readers that must not take its lock.
    launch_domains: AtomicU64,
    sample_windows: AtomicU64,
    record_cost_ns: AtomicU64,
    /// Records dropped because a forced flush returned them before their work ran.
    incomplete_records: AtomicU64,
    /// Forced flushes at the end of sampled windows.
    forced_flushes: AtomicU64,
    /// Times kernel tracing was held on, pinned on under CUDA graphs, or released (see
    /// `depth::Planner`).
    holds: AtomicU64,
    /// See `Tally::corr_repeats`.
    corr_repeats: AtomicU64,
    /// Kernel-activity switches made while a thread sat at the exit of a synchronising call
    /// (the GPU drained), and those that waited for one in vain (`SLO_PROBE_TOGGLE_AT_SYNC`).
    drained_switches: AtomicU64,
    drain_timeouts: AtomicU64,
    /// Times depth 0 went quiet or loud again (`control::quiet_cupti`).
    quiet_switches: AtomicU64,
}

struct Shim {
    api: Option<Cupti>,
    cupti_version: u32,
    subscriber: AtomicPtr<c_void>,
    /// Activity kinds enabled and buffers registered by the shim.
    activity_on: AtomicBool,
    transport: Option<Transport>,
    writer: Mutex<Writer>,
    queue: ArrayQueue<Queued>,
    corr: Box<[CorrSlot]>,
    op_names: Mutex<HashMap<String, u32>>,
    next_name_id: AtomicU32,
    status: AtomicU64,
    /// Activity buffers for reuse: CUPTI asks for buffers on whatever thread needs one, a
    /// CUDA thread included, so the pool is lock-free.
    buffers: ArrayQueue<Box<[u64]>>,
    /// The same for the small buffers of timing depth.
    small_buffers: ArrayQueue<Box<[u64]>>,
    hot: Hot,
    steps_ended: AtomicU64,
    /// When the last step ended (CLOCK_MONOTONIC ns).
    last_step_ns: AtomicU64,
    /// Steps ended while kernels were traced.
    sampled_steps: AtomicU64,
    /// The depth CUPTI is at (`DEPTH_*`), for the step markers.
    depth_now: AtomicU32,
    /// The depth word ([`slo_probe_common::ring::decode_shim_depth`]), also in the header.
    depth_word: AtomicU64,
    /// A step marker that ends this many steps wakes the flusher (`u64::MAX`: none).
    wake_at_step: AtomicU64,
    /// The script's depth request, a control word (`encode_depth_request`).
    script_request: AtomicU64,
    /// Depth state: the flusher's and release/reacquire's, never a CUDA thread's.
    control: Mutex<Control>,
    /// When MEMCPY and MEMSET activity is on (`SLO_PROBE_MEM_ACTIVITY`, default 1).
    mem_activity: MemActivity,
    /// Memory activity goes with kernel activity from now on (a latch, set by the flusher
    /// before the switch that first takes it along: [`Shim::kinds_with_kernels`]).
    pub(crate) mem_follows: AtomicBool,
    /// Buffer handling, for checks on the GPU: sizes (`SLO_PROBE_BUFFER_KIB`, default 64;
    /// `SLO_PROBE_SMALL_BUFFER_KIB`, default 16), reuse of completed buffers
    /// (`SLO_PROBE_BUFFER_REUSE`, default 1) and the forced flush at the end of a sampled
    /// window (`SLO_PROBE_FORCED_FLUSH`, default 0: see [`BUFFER_BYTES`]).
    pub(crate) buffers_cfg: BufferCfg,
    counters: Counters,
    /// Kernel activity switched only where the GPU has drained (see [`control::Drain`]).
    pub(crate) drain: control::Drain,
    /// Whether depth 0 is quiet now (`control::QUIET_*`; see `control::quiet_cupti`): read by
    /// the flusher's flushes without the control lock.
    pub(crate) quiet: AtomicU8,
    log: bool,
}

static SHIM: OnceLock<Shim> = OnceLock::new();
/// Said once: kernel records repeat correlation ids (`Tally::repeats_unreliable`).
static REPEATS_SAID: AtomicBool = AtomicBool::new(false);
/// See `Tally::repeats_unreliable`.
const REPEATS_SAID_FROM: u64 = 64;
static FORKED: AtomicBool = AtomicBool::new(false);

/// Set when the process has begun to exit (`at_exit`): from then on the background thread
/// leaves CUPTI alone (no depth switch, no flush), because the CUDA driver and CUPTI are being
/// torn down around it; only the exiting thread's final flush runs.
pub(crate) static EXITING: AtomicBool = AtomicBool::new(false);
static INJECTED: AtomicBool = AtomicBool::new(false);
/// The flusher thread, unparked by step markers at window boundaries and by requests.
static FLUSHER: OnceLock<Thread> = OnceLock::new();

thread_local! {
    static OPS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static TID: Cell<u32> = const { Cell::new(0) };
    /// The launch configuration of the kernel launch this thread is in (between its callback's
    /// enter and exit; `encode_launch`), for the graph node its capture creates.
    static LAUNCH: Cell<u32> = const { Cell::new(0) };
}

/// Kernel nodes carry their launch configuration from the captured launch
/// (`SLO_PROBE_CAPTURE_LAUNCH`, default 1; 0 turns it off): a graph captured again with the same
/// nodes under other launch configurations (a module switched to a lower-occupancy launch under
/// `reduce-overhead`) can then be told apart by configuration. On an H100 (2026-12-06, the fault
/// suite's GPT under `reduce-overhead`, `scripts/gpu-graph-check`) it named the low-occupancy
/// GELU inside the graphs (`blocks.2.mlp.act`, occupancy) live, and the job ran to its end.
static CAPTURE_LAUNCH: AtomicBool = AtomicBool::new(true);

/// Whether the shim says what it does (`SLO_PROBE_SHIM_LOG=1`).
pub(crate) fn logging() -> bool {
    SHIM.get().is_some_and(|s| s.log)
}

/// Says, where [`logging`], which activity kinds (CUPTI's numbers: 10 kernels, 1 memcpy,
/// 2 memset, 51 graph launches) `what` switched, and on which thread: to find which switch left
/// a kind on.
pub(crate) fn log_activity(what: &str, kinds: &[u32]) {
    if logging() {
        let t = std::thread::current();
        say!(
            "activity {what} {kinds:?} (thread {})",
            t.name().unwrap_or("of the job")
        );
    }
}

/// When MEMCPY and MEMSET activity is on (`SLO_PROBE_MEM_ACTIVITY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemActivity {
    /// `0`: never.
    Off,
    /// The default: from the start, at every depth.
    On,
    /// `window` (an experiment): switched on and off with kernel activity. On an H100
    /// (2026-12-06, `bench/results/faults-2026-12-06-h100`, calls 7–9) with the hold off
    /// (`SLO_PROBE_HOLD_LAG_MS=0`), the suite's GPU-bound eager jobs delivered every record
    /// live and the GPT's 16x512 A/B cost −0.01% where the hold costs +0.67%; the convnet's
    /// faults were named right, but the GPT's kernel records came with the correlation id of
    /// the record before them (0% for a dozen windows, then up to 99.8%, for good), so its
    /// operators were wrong. Switching only at drained moments (`SLO_PROBE_TOGGLE_AT_SYNC=1`)
    /// kept the ids right (top-1 3/3) but parks the job's thread: not a default.
    WithKernels,
}

impl MemActivity {
    fn from_env() -> Self {
        match std::env::var("SLO_PROBE_MEM_ACTIVITY").as_deref() {
            Ok("0") => Self::Off,
            Ok("window") => Self::WithKernels,
            _ => Self::On,
        }
    }

    /// The activity kinds switched with kernel activity.
    pub(crate) fn with_kernels(self) -> &'static [u32] {
        match self {
            Self::WithKernels => &[activity::KIND_MEMCPY, activity::KIND_MEMSET],
            Self::Off | Self::On => &[],
        }
    }
}

/// The activity kinds tracing starts with (at depth 0), for memory activity `mem` and the kinds
/// switched with kernel activity `with_kernels` ([`Shim::kinds_with_kernels`]): graph-level
/// records, and memory activity where it is on at every depth. Not where it goes with kernel
/// activity (the planner's latch, [`depth::Planner::mem_with_kernels`]): tracing that starts
/// again after a release (`slo_probe.cupti_released()`, torch.profiler) starts without it.
fn start_kinds(mem: MemActivity, with_kernels: &[u32]) -> Vec<u32> {
    let mut kinds = vec![activity::KIND_GRAPH_TRACE];
    if mem == MemActivity::On && with_kernels.is_empty() {
        kinds.extend([activity::KIND_MEMCPY, activity::KIND_MEMSET]);
    }
    kinds
}

/// The launch configuration in a kernel launch's API parameters (`encode_launch`; 0 when not
/// a kernel launch, or unreadable).
///
/// # Safety
/// `params` is null or the `functionParams` CUPTI passes for `(domain, cbid)` at the API's
/// enter site.
unsafe fn launch_of(domain: u32, cbid: u32, params: *const u8) -> u32 {
    use control::{
        DRIVER_LAUNCH_CBIDS, DRIVER_LAUNCH_EX_CBIDS, RUNTIME_LAUNCH_CBIDS, RUNTIME_LAUNCH_EX_CBIDS,
    };
    use cudarc::cupti::sys::{
        cuLaunchKernel_params_st as Drv, cudaLaunchKernel_v7000_params_st as Rt,
    };
    if params.is_null() {
        return 0;
    }
    let dims = |p: *const u8, grid: usize, block: usize| {
        // SAFETY: (caller) `p` points at six u32 at these offsets.
        let at = |o: usize| unsafe { std::ptr::read_unaligned(p.add(o).cast::<[u32; 3]>()) };
        encode_launch(at(grid), at(block))
    };
    // The `_ptsz` variants have the same parameters as the plain ones; cuLaunchKernelEx and
    // cudaLaunchKernelExC take a pointer to a configuration that starts with the grid and the
    // block (CUlaunchConfig, cudaLaunchConfig_t).
    let (plain, ex, grid, block) = match domain {
        DOMAIN_DRIVER => (
            DRIVER_LAUNCH_CBIDS,
            DRIVER_LAUNCH_EX_CBIDS,
            std::mem::offset_of!(Drv, gridDimX),
            std::mem::offset_of!(Drv, blockDimX),
        ),
        DOMAIN_RUNTIME => (
            RUNTIME_LAUNCH_CBIDS,
            RUNTIME_LAUNCH_EX_CBIDS,
            std::mem::offset_of!(Rt, gridDim),
            std::mem::offset_of!(Rt, blockDim),
        ),
        _ => return 0,
    };
    if plain.contains(&cbid) {
        dims(params, grid, block)
    } else if ex.contains(&cbid) {
        // SAFETY: (caller) the first parameter is the configuration's pointer.
        let config = unsafe { std::ptr::read_unaligned(params.cast::<*const u8>()) };
        if config.is_null() {
            0
        } else {
            dims(config, 0, 12)
        }
    } else {
        0
    }
}

use slo_probe_common::host::monotonic_ns as now_ns;

fn tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no preconditions.
            t.set(unsafe { libc::gettid() } as u32);
        }
        t.get()
    })
}

fn current_op() -> u32 {
    OPS.with(|o| o.borrow().last().copied().unwrap_or(0))
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| flag_on(&v))
}

/// A switch's value that turns it on: `1` or `true`.
pub(crate) fn flag_on(v: &str) -> bool {
    v == "1" || v.eq_ignore_ascii_case("true")
}

macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("slo-probe shim (pid {}): {}", std::process::id(), format!($($arg)*))
    };
}
pub(crate) use say;

/// Wakes the flusher (a futex wake: never blocks).
fn wake_flusher() {
    if let Some(t) = FLUSHER.get() {
        t.unpark();
    }
}

/// Runs an FFI entry point: nothing happens after a fork in the child, and a panic never
/// unwinds into C.
fn guard<T>(default: T, f: impl FnOnce() -> T) -> T {
    if FORKED.load(Ordering::Relaxed) {
        return default;
    }
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(default)
}

extern "C" fn after_fork_in_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// The shim's state, created on first use by any entry point (the script may mark steps
/// before CUDA is initialised).
fn shim() -> &'static Shim {
    SHIM.get_or_init(|| {
        // SAFETY: registering a function with no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        let log = env_flag("SLO_PROBE_SHIM_LOG");
        if let Some(v) = std::env::var_os("SLO_PROBE_CAPTURE_LAUNCH") {
            match v.to_str() {
                Some("1" | "true") => CAPTURE_LAUNCH.store(true, Ordering::Relaxed),
                Some("0" | "false") => CAPTURE_LAUNCH.store(false, Ordering::Relaxed),
                _ => say!(
                    "SLO_PROBE_CAPTURE_LAUNCH={} is not valid; using the default",
                    v.to_string_lossy()
                ),
            }
        }
        let socket = std::env::var_os("SLO_PROBE_SOCKET")
            .map(PathBuf::from)
            .unwrap_or_else(|| transport::DEFAULT_SOCKET.into());
        let ring_mb: usize = std::env::var("SLO_PROBE_RING_MB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16)
            .clamp(1, 1024);
        let (transport, ring) = match Transport::new(ring_mb << 20, socket) {
            Ok((t, r)) => (Some(t), Some(r)),
            Err(e) => {
                say!("cannot create the shared ring ({e}); records are dropped");
                (None, None)
            }
        };
        let (api, cupti_version) = match Cupti::load() {
            Ok((api, how)) => {
                let mut v = 0u32;
                // SAFETY: valid out pointer.
                unsafe { (api.cuptiGetVersion)(&mut v) };
                if log {
                    say!("using libcupti {v} ({how})");
                }
                (Some(api), v)
            }
            Err(e) => {
                if INJECTED.load(Ordering::Relaxed) || log {
                    say!("{e}; GPU tracing is off (step markers still work)");
                }
                (None, 0)
            }
        };
        let (mut cfg, bad) = depth::Config::from_env(|k| std::env::var(k).ok());
        for (k, v) in bad {
            say!("{k}={v} is not valid; using the default");
        }
        let mem_activity = MemActivity::from_env();
        let drain =
            control::Drain::from_env(std::env::var("SLO_PROBE_TOGGLE_AT_SYNC").ok().as_deref());
        cfg.drain_deep = drain.enabled && drain.deep_only;
        // Without memory activity, switching kernel activity under CUDA graphs delivered every
        // record (see `depth::Planner`): no pin needed.
        cfg.graph_floor &= mem_activity != MemActivity::Off;
        let corr = (0..CORR_SLOTS)
            .map(|_| CorrSlot {
                correlation: AtomicU32::new(0),
                launch_ns: AtomicU64::new(0),
                op: AtomicU32::new(0),
                tid: AtomicU32::new(0),
                domain: AtomicU32::new(0),
            })
            .collect();
        let off = encode_shim_depth(ShimDepth {
            depth: DEPTH_OFF,
            ..ShimDepth::default()
        });
        let s = Shim {
            api,
            cupti_version,
            subscriber: AtomicPtr::new(std::ptr::null_mut()),
            activity_on: AtomicBool::new(false),
            transport,
            writer: Mutex::new(Writer {
                ring,
                kernel_names: HashMap::new(),
                node_ops: HashMap::new(),
                scratch: vec![0u8; 16 + STRING_MAX + 8],
            }),
            queue: ArrayQueue::new(QUEUE_LEN),
            corr,
            op_names: Mutex::new(HashMap::new()),
            next_name_id: AtomicU32::new(1),
            status: AtomicU64::new(0),
            buffers: ArrayQueue::new(BUFFER_POOL),
            small_buffers: ArrayQueue::new(BUFFER_POOL),
            hot: Hot::default(),
            steps_ended: AtomicU64::new(0),
            last_step_ns: AtomicU64::new(0),
            sampled_steps: AtomicU64::new(0),
            depth_now: AtomicU32::new(DEPTH_OFF),
            depth_word: AtomicU64::new(off),
            wake_at_step: AtomicU64::new(u64::MAX),
            script_request: AtomicU64::new(0),
            control: Mutex::new(Control::new(depth::Planner::new(cfg, now_ns()))),
            mem_activity,
            mem_follows: AtomicBool::new(false),
            buffers_cfg: BufferCfg::from_env(),
            counters: Counters::default(),
            drain,
            quiet: AtomicU8::new(control::QUIET_NO),
            log,
        };
        if let Some(t) = &s.transport {
            t.header.depth.store(off, Ordering::Relaxed);
        }
        match std::thread::Builder::new()
            .name("slo-probe-flush".into())
            .spawn(flusher)
        {
            Ok(h) => {
                let _ = FLUSHER.set(h.thread().clone());
            }
            Err(e) => {
                say!("cannot start the flush thread ({e}); records stay in CUPTI buffers");
            }
        }
        s
    })
}

impl Shim {
    /// The activity kinds switched on and off with kernel activity: memory activity's where
    /// `SLO_PROBE_MEM_ACTIVITY=window`, or once the planner lets it go with kernel activity
    /// ([`depth::Planner::mem_with_kernels`]: on since the start until then, and switched with
    /// it from a moment it is on as well; `mem_follows` says which, set before the first such
    /// switch).
    pub(crate) fn kinds_with_kernels(&self) -> &'static [u32] {
        if self.mem_activity == MemActivity::On && self.mem_follows.load(Ordering::Acquire) {
            MemActivity::WithKernels.with_kernels()
        } else {
            self.mem_activity.with_kernels()
        }
    }

    fn set_status(&self, bit: u64, on: bool) {
        let v = if on {
            self.status.fetch_or(bit, Ordering::Relaxed) | bit
        } else {
            self.status.fetch_and(!bit, Ordering::Relaxed) & !bit
        };
        if let Some(t) = &self.transport {
            t.header.status.store(v, Ordering::Relaxed);
        }
    }

    fn push_queued(&self, q: Queued) {
        if self.queue.push(q).is_err() {
            self.counters.queue_dropped.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = &self.transport {
                t.header.dropped_records.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Moves queued records into the ring. Node records learn their operator here: a created
    /// node carries the op of its capturing thread, a clone takes its original's.
    fn drain_queue(&self, w: &mut Writer) {
        while let Some(q) = self.queue.pop() {
            match q {
                Queued::Step(r) => w.push(r.as_bytes()),
                Queued::Depth(r) => w.push(r.as_bytes()),
                Queued::Node(mut r) => {
                    if r.flags == NODE_CLONED {
                        r.op_id = w.node_ops.get(&r.original_node_id).copied().unwrap_or(0);
                    }
                    if r.op_id != 0 {
                        if w.node_ops.len() < MAX_NODE_OPS || w.node_ops.contains_key(&r.node_id) {
                            w.node_ops.insert(r.node_id, r.op_id);
                        } else {
                            self.counters.node_ops_full.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    w.push(r.as_bytes());
                }
                Queued::OpName { id, name } => {
                    let n = StringRecord::encode(id, STRING_OP, name.as_bytes(), &mut w.scratch);
                    let (scratch, ring) = (&w.scratch, &w.ring);
                    if let Some(r) = ring {
                        r.push(&scratch[..n]);
                    }
                }
            }
        }
    }

    /// Sets up CUPTI at depth 0 (timestamps, subscription, graph-launch and resource
    /// callbacks, graph-level and memory activity), then moves to the depth wanted now. With
    /// `activity_only_ok` (taking CUPTI back from a tool that keeps its subscription, as
    /// torch.profiler does after it stops), a refused subscription still enables activity
    /// tracing, without launch stamps and operator context.
    fn start_tracing(&self, c: &mut Control, activity_only_ok: bool) -> Result<(), ShimError> {
        let Some(api) = &self.api else {
            return Err(ShimError::Unavailable);
        };
        // SAFETY: CUPTI functions called with valid arguments; callbacks are `extern "C"`
        // functions that catch panics.
        unsafe {
            (api.cuptiActivityRegisterTimestampCallback)(timestamp);
            let mut sub: *mut c_void = std::ptr::null_mut();
            let r = (api.cuptiSubscribe)(&mut sub, on_callback, std::ptr::null_mut());
            let activity_only = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS && activity_only_ok;
            if r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS && !activity_only {
                self.set_status(STATUS_LOST_RACE, true);
                return Err(ShimError::LostRace {
                    pid: std::process::id(),
                });
            }
            if activity_only {
                self.set_status(STATUS_LOST_RACE, true);
                say!(
                    "another tool still holds the CUPTI subscription (torch.profiler keeps it \
                     after it stops): GPU activity is traced again, without launch latency and \
                     operator context"
                );
            } else {
                api.check(r, || "cuptiSubscribe".into())?;
                self.set_status(STATUS_LOST_RACE, false);
                self.subscriber.store(sub, Ordering::Release);
                // Graph launches always (one callback per replay); kernel launches only at
                // depth 1 and 2 (`control::Shim::switch`). Copies and fills name their
                // operator at every depth (their records come at every depth).
                control::base_callbacks(
                    api,
                    sub,
                    self.drain.enabled,
                    self.mem_activity != MemActivity::Off,
                );
            }
            self.set_delivery(api);
            let r = (api.cuptiActivityRegisterCallbacks)(buffer_requested, buffer_completed);
            api.check(r, || "cuptiActivityRegisterCallbacks".into())?;
            let kinds = start_kinds(self.mem_activity, self.kinds_with_kernels());
            log_activity("on at start", &kinds);
            for k in kinds {
                let r = (api.cuptiActivityEnable)(k);
                api.check(r, || format!("cuptiActivityEnable({k})"))?;
            }
        }
        self.set_status(STATUS_TRACING, true);
        self.set_status(STATUS_RELEASED, false);
        self.set_status(STATUS_DIAGNOSTIC, false);
        self.activity_on.store(true, Ordering::Release);
        c.applied = Applied {
            depth: DEPTH_TIMING,
            reason: DEPTH_REASON_DEFAULT,
            domains: 0,
        };
        self.quiet.store(control::QUIET_NO, Ordering::Relaxed);
        let o = self.observe();
        self.record_depth(o.now_ns, DEPTH_TIMING, DEPTH_REASON_DEFAULT);
        self.apply_plan(api, c, &o);
        self.publish(c);
        wake_flusher();
        Ok(())
    }

    /// How CUPTI hands buffers back: its worker's flush period and the device buffer size,
    /// before any activity is enabled. Neither is needed to trace; a failure is said (each time
    /// tracing starts).
    fn set_delivery(&self, api: &Cupti) {
        let cfg = self.buffers_cfg;
        if cfg.flush_period_ms > 0 {
            match api.optional.flush_period {
                // SAFETY: a plain CUPTI call.
                Some(f) => {
                    let r = unsafe { f(cfg.flush_period_ms) };
                    if r != CUPTI_SUCCESS {
                        say!(
                            "cuptiActivityFlushPeriod({}) failed: {}; GPU records may reach the \
                             agent only in large batches",
                            cfg.flush_period_ms,
                            api.describe(r)
                        );
                    }
                }
                None => say!(
                    "this libcupti has no cuptiActivityFlushPeriod: GPU records may reach the \
                     agent only in large batches"
                ),
            }
        }
        if let (Some(bytes), Some(f)) = (cfg.device_buffer, api.optional.set_attribute) {
            let r = attribute(f, ATTR_DEVICE_BUFFER_SIZE, bytes).0;
            if r != CUPTI_SUCCESS {
                say!(
                    "cuptiActivitySetAttribute(DEVICE_BUFFER_SIZE, {bytes}) failed: {}",
                    api.describe(r)
                );
            }
        }
        if self.log {
            if let Some(f) = api.optional.get_attribute {
                let (r, value) = attribute(f, ATTR_PER_THREAD_ACTIVITY_BUFFER, 0u8);
                say!(
                    "CUPTI per-thread activity buffers: {value} (read: {}), flush period {} ms",
                    api.describe(r),
                    cfg.flush_period_ms
                );
            }
        }
        if let (Some(on), Some(f)) = (cfg.per_thread, api.optional.set_attribute) {
            let r = attribute(f, ATTR_PER_THREAD_ACTIVITY_BUFFER, u8::from(on)).0;
            if r != CUPTI_SUCCESS {
                say!(
                    "cuptiActivitySetAttribute(PER_THREAD_ACTIVITY_BUFFER, {on}) failed: {}",
                    api.describe(r)
                );
            }
        }
    }

    /// Flushes and unsubscribes, leaving CUPTI to another tool.
    fn stop_tracing(&self, c: &mut Control) -> Result<(), ShimError> {
        let Some(api) = &self.api else {
            return Ok(());
        };
        if !self.activity_on.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let sub = self.subscriber.swap(std::ptr::null_mut(), Ordering::AcqRel);
        let kinds = [
            activity::KIND_CONCURRENT_KERNEL,
            activity::KIND_MEMCPY,
            activity::KIND_MEMSET,
            activity::KIND_GRAPH_TRACE,
        ];
        log_activity("off at release", &kinds);
        // SAFETY: valid CUPTI calls; the subscriber, when there is one, is ours.
        let r = unsafe {
            (api.cuptiActivityFlushAll)(FLUSH_FORCED);
            for k in kinds {
                (api.cuptiActivityDisable)(k);
            }
            if sub.is_null() {
                Ok(())
            } else {
                (api.cuptiEnableDomain)(0, sub, DOMAIN_DRIVER);
                (api.cuptiEnableDomain)(0, sub, DOMAIN_RUNTIME);
                (api.cuptiEnableDomain)(0, sub, DOMAIN_RESOURCE);
                let r = (api.cuptiUnsubscribe)(sub);
                api.check(r, || "cuptiUnsubscribe".into())
            }
        };
        if let Ok(mut w) = self.writer.lock() {
            self.drain_queue(&mut w);
        }
        self.set_status(STATUS_TRACING, false);
        self.set_status(STATUS_RELEASED, true);
        self.stopped(c);
        r
    }

    /// Whether activity tracing is on (with or without a subscription).
    fn tracing(&self) -> bool {
        self.activity_on.load(Ordering::Acquire)
    }
}

/// Calls `cuptiActivitySetAttribute` or `cuptiActivityGetAttribute` (`f`) for `attr` with
/// `value` (a `size_t` or `uint8_t`, as the attribute takes): the result and the value after the
/// call (what CUPTI read back, for a get).
fn attribute<T: Copy>(f: api::SetAttributeFn, attr: u32, mut value: T) -> (api::CuptiResult, T) {
    let mut size = std::mem::size_of::<T>();
    // SAFETY: valid pointers to a `T` and its size; CUPTI writes at most `size` bytes.
    let r = unsafe { f(attr, &mut size, (&raw mut value).cast::<c_void>()) };
    (r, value)
}

/// Counts of one completed buffer, added to the shared counters once (no shared write per
/// record).
#[derive(Default)]
struct Tally {
    kernels: u64,
    graphs: u64,
    mems: u64,
    others: u64,
    corr_hits: u64,
    corr_misses: u64,
    kernel_hits_driver: u64,
    kernel_hits_runtime: u64,
    /// The longest launch-to-end of a stamped kernel in the buffer, ns.
    lag_max_ns: u64,
    /// Records a forced flush returned before their work ran (no timestamps): dropped.
    incomplete: u64,
    /// Kernel records with the correlation id of the kernel record before them (eager
    /// launches have one kernel each: many repeats mean the ids are not the launches').
    corr_repeats: u64,
    last_corr: u32,
}

impl Tally {
    /// Whether a record's work ran: a forced flush returns records of work still queued, whose
    /// timestamps CUPTI fills when it completes (still 0, or the end is). Those are counted.
    fn complete(&mut self, start_ns: u64, end_ns: u64) -> bool {
        let done = start_ns != 0 && end_ns != 0 && end_ns >= start_ns;
        if !done {
            self.incomplete += 1;
        }
        done
    }

    /// Whether this buffer's kernel records carry their launches' correlation ids so rarely that
    /// the job's log should say so: at least [`REPEATS_SAID_FROM`] repeats, a tenth of its
    /// kernel records or more. On an H100 (2026-12-06) the fault suite's eager GPT under
    /// `SLO_PROBE_MEM_ACTIVITY=window` with the hold off went from 0 to 99.8% repeats after a
    /// dozen windows, and stayed there; the shipped shim's recordings of it have none.
    fn repeats_unreliable(&self) -> bool {
        self.corr_repeats >= REPEATS_SAID_FROM && self.corr_repeats * 10 >= self.kernels
    }

    fn add_to(&self, c: &Counters) {
        c.buffers_completed.fetch_add(1, Ordering::Relaxed);
        for (counter, n) in [
            (&c.kernel_records, self.kernels),
            (&c.graph_records, self.graphs),
            (&c.mem_records, self.mems),
            (&c.other_records, self.others),
            (&c.corr_hits, self.corr_hits),
            (&c.corr_misses, self.corr_misses),
            (&c.corr_hits_driver, self.kernel_hits_driver),
            (&c.corr_hits_runtime, self.kernel_hits_runtime),
            (&c.incomplete_records, self.incomplete),
            (&c.corr_repeats, self.corr_repeats),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
        if self.lag_max_ns > 0 {
            // Half the last buffer's, half what was before (buffers are converted one at a
            // time, under the writer's lock).
            let old = c.gpu_lag_ns.load(Ordering::Relaxed);
            let new = if old == 0 {
                self.lag_max_ns
            } else {
                old / 2 + self.lag_max_ns / 2
            };
            c.gpu_lag_ns.store(new, Ordering::Relaxed);
        }
    }
}

/// What converting one buffer needs: the shim (launch stamps), the writer (names, node ops).
struct BufferCtx<'a> {
    shim: &'a Shim,
    w: &'a mut Writer,
    tally: Tally,
    /// The record being converted is a kernel (its hits are counted per launch domain, which
    /// is how `SLO_PROBE_LAUNCH_DOMAIN=auto` chooses).
    kernel: bool,
}

impl activity::Context for BufferCtx<'_> {
    fn launch(&mut self, correlation_id: u32) -> (u64, u32, u32) {
        let slot = &self.shim.corr[correlation_id as usize & (CORR_SLOTS - 1)];
        if slot.correlation.load(Ordering::Acquire) != correlation_id {
            self.tally.corr_misses += 1;
            return (0, 0, 0);
        }
        let r = (
            slot.launch_ns.load(Ordering::Relaxed),
            slot.op.load(Ordering::Relaxed),
            slot.tid.load(Ordering::Relaxed),
        );
        let domain = slot.domain.load(Ordering::Relaxed);
        // Re-check: a newer launch may have reused the slot meanwhile.
        if slot.correlation.load(Ordering::Acquire) != correlation_id {
            self.tally.corr_misses += 1;
            return (0, 0, 0);
        }
        self.tally.corr_hits += 1;
        if self.kernel {
            match domain {
                DOMAIN_DRIVER => self.tally.kernel_hits_driver += 1,
                DOMAIN_RUNTIME => self.tally.kernel_hits_runtime += 1,
                _ => {}
            }
        }
        r
    }

    fn kernel_name(&mut self, name: *const c_char) -> u32 {
        if name.is_null() {
            return 0;
        }
        let key = name as usize;
        if let Some(&id) = self.w.kernel_names.get(&key) {
            return id;
        }
        let id = self.shim.next_name_id.fetch_add(1, Ordering::Relaxed);
        self.w.kernel_names.insert(key, id);
        // SAFETY: CUPTI kernel names are NUL-terminated strings owned by CUPTI for the life of
        // the process.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        let n = StringRecord::encode(id, STRING_KERNEL, bytes, &mut self.w.scratch);
        if let Some(r) = &self.w.ring {
            r.push(&self.w.scratch[..n]);
        }
        id
    }

    fn node_op(&self, graph_node_id: u64) -> Option<u32> {
        self.w.node_ops.get(&graph_node_id).copied()
    }
}

unsafe extern "C" fn timestamp() -> u64 {
    now_ns()
}

unsafe extern "C" fn on_callback(_ud: *mut c_void, domain: u32, cbid: u32, data: *const c_void) {
    guard((), || {
        let Some(s) = SHIM.get() else { return };
        match domain {
            DOMAIN_DRIVER if control::DRIVER_SYNC_CBIDS.contains(&cbid) => {
                control::sync_callback(s, data)
            }
            DOMAIN_DRIVER | DOMAIN_RUNTIME => launch_callback(s, domain, cbid, data),
            DOMAIN_RESOURCE => {
                let t0 = now_ns();
                resource_callback(s, cbid, data);
                s.hot
                    .callback_ns
                    .fetch_add(now_ns().saturating_sub(t0), Ordering::Relaxed);
            }
            _ => {}
        }
    });
}

/// A kernel or graph launch, or a runtime copy or fill (API enter): stamps the launch time,
/// the thread's operator and the thread into the correlation table, and times itself. Copies
/// count in no launch counter (the depth planner's counters are kernel and graph launches).
fn launch_callback(s: &Shim, domain: u32, cbid: u32, data: *const c_void) {
    use cudarc::cupti::sys::CUpti_CallbackData as Cb;
    // SAFETY: for API domains CUPTI passes a CUpti_CallbackData; fields are read at the
    // bindings' offsets as raw integers.
    let (site, corr) = unsafe {
        let p = data.cast::<u8>();
        (
            std::ptr::read_unaligned(p.add(std::mem::offset_of!(Cb, callbackSite)).cast::<u32>()),
            std::ptr::read_unaligned(p.add(std::mem::offset_of!(Cb, correlationId)).cast::<u32>()),
        )
    };
    let capture = CAPTURE_LAUNCH.load(Ordering::Relaxed);
    if site != 0 {
        // Exit site: the launch is over (its node, if captured, was created during it).
        if capture {
            LAUNCH.with(|l| l.set(0));
        }
        return;
    }
    let t0 = now_ns();
    let h = &s.hot;
    if !control::is_copy(domain, cbid) {
        let graph = control::is_graph_launch(domain, cbid);
        let counter = match (domain, graph) {
            (DOMAIN_DRIVER, false) => &h.kernels_driver,
            (DOMAIN_DRIVER, true) => &h.graphs_driver,
            (_, false) => &h.kernels_runtime,
            (_, true) => &h.graphs_runtime,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if capture && !graph {
            // SAFETY: CUPTI passes a CUpti_CallbackData whose functionParams are this API's
            // parameters, valid during the callback.
            let launch = unsafe {
                let params = std::ptr::read_unaligned(
                    data.cast::<u8>()
                        .add(std::mem::offset_of!(Cb, functionParams))
                        .cast::<*const u8>(),
                );
                launch_of(domain, cbid, params)
            };
            LAUNCH.with(|l| l.set(launch));
        }
    }
    let slot = &s.corr[corr as usize & (CORR_SLOTS - 1)];
    // Invalidate, fill, publish: a reader that sees `corr` sees these fields.
    slot.correlation.store(0, Ordering::Relaxed);
    slot.launch_ns.store(t0, Ordering::Relaxed);
    slot.op.store(current_op(), Ordering::Relaxed);
    slot.tid.store(tid(), Ordering::Relaxed);
    slot.domain.store(domain, Ordering::Relaxed);
    slot.correlation.store(corr, Ordering::Release);
    h.callback_ns
        .fetch_add(now_ns().saturating_sub(t0), Ordering::Relaxed);
}

fn resource_callback(s: &Shim, cbid: u32, data: *const c_void) {
    use cudarc::cupti::sys::{CUpti_GraphData as G, CUpti_ResourceData as R};
    let Some(api) = &s.api else { return };
    if cbid != CBID_GRAPHNODE_CREATED && cbid != CBID_GRAPHNODE_CLONED {
        return;
    }
    // SAFETY: for these callback ids CUPTI passes a CUpti_ResourceData whose descriptor is a
    // CUpti_GraphData; pointers are read at the bindings' offsets.
    let (graph, node, original) = unsafe {
        let desc: *const u8 = std::ptr::read_unaligned(
            data.cast::<u8>()
                .add(std::mem::offset_of!(R, resourceDescriptor))
                .cast::<*const u8>(),
        );
        if desc.is_null() {
            return;
        }
        let ptr_at = |o: usize| std::ptr::read_unaligned(desc.add(o).cast::<*mut c_void>());
        (
            ptr_at(std::mem::offset_of!(G, graph)),
            ptr_at(std::mem::offset_of!(G, node)),
            ptr_at(std::mem::offset_of!(G, originalNode)),
        )
    };
    let (mut node_id, mut original_id, mut graph_id) = (0u64, 0u64, 0u32);
    // SAFETY: CUPTI id queries on handles CUPTI just gave us.
    unsafe {
        (api.cuptiGetGraphNodeId)(node, &mut node_id);
        if !graph.is_null() {
            (api.cuptiGetGraphId)(graph, &mut graph_id);
        }
        if cbid == CBID_GRAPHNODE_CLONED && !original.is_null() {
            (api.cuptiGetGraphNodeId)(original, &mut original_id);
        }
    }
    // No lock here (this is the capturing CUDA thread): a clone's operator is looked up when
    // the flusher drains the queue (`drain_queue`).
    let op = if cbid == CBID_GRAPHNODE_CREATED {
        s.counters.nodes_created.fetch_add(1, Ordering::Relaxed);
        current_op()
    } else {
        s.counters.nodes_cloned.fetch_add(1, Ordering::Relaxed);
        0
    };
    s.push_queued(Queued::Node(GraphNodeRecord {
        header: RecordHeader::of::<GraphNodeRecord>(),
        node_id,
        original_node_id: original_id,
        graph_id,
        op_id: op,
        flags: if cbid == CBID_GRAPHNODE_CREATED {
            NODE_CREATED
        } else {
            NODE_CLONED
        },
        // The kernel launch being captured on this thread, if any (0 otherwise).
        launch: if cbid == CBID_GRAPHNODE_CREATED {
            LAUNCH.with(Cell::get)
        } else {
            0
        },
    }));
}

unsafe extern "C" fn buffer_requested(buf: *mut *mut u8, size: *mut usize, max: *mut usize) {
    guard((), || {
        let t0 = now_ns();
        let s = shim();
        // Kernels traced (or about to be: the switch enables the kind after this reads the
        // depth, and a small buffer then fills within a step): large buffers; else small.
        let d = s.depth_now.load(Ordering::Relaxed);
        let large = control::traces_kernels(d);
        let cfg = s.buffers_cfg;
        let (pool, bytes) = if large {
            (&s.buffers, cfg.large)
        } else {
            (&s.small_buffers, cfg.small)
        };
        let b = pool
            .pop()
            .unwrap_or_else(|| vec![0u64; bytes / 8].into_boxed_slice());
        let len = b.len() * 8;
        // SAFETY: CUPTI's out pointers are valid; the buffer is 8-byte aligned and returned
        // to us in `buffer_completed`.
        unsafe {
            *size = len;
            *max = 0;
            *buf = Box::into_raw(b).cast::<u8>();
        }
        // CUPTI may ask on a launching thread: counted as the shim's time there.
        s.hot
            .callback_ns
            .fetch_add(now_ns().saturating_sub(t0), Ordering::Relaxed);
    });
}

unsafe extern "C" fn buffer_completed(
    ctx_ptr: *mut c_void,
    stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    // SAFETY: `buffer` is one we handed out in `buffer_requested`, `size` its length.
    let owned: Box<[u64]> = unsafe {
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            buffer.cast::<u64>(),
            size / 8,
        ))
    };
    guard((), || {
        let s = shim();
        let Some(api) = &s.api else { return };
        let Ok(mut w) = s.writer.lock() else { return };
        // Node records queued since the last flush first: kernels of this buffer may come from
        // graphs whose nodes they describe.
        s.drain_queue(&mut w);
        let diag = if s.status.load(Ordering::Relaxed) & STATUS_DIAGNOSTIC != 0 {
            KERNEL_DIAGNOSTIC
        } else {
            0
        };
        let mut ctx = BufferCtx {
            shim: s,
            w: &mut w,
            tally: Tally::default(),
            kernel: false,
        };
        let mut rec: *mut c_void = std::ptr::null_mut();
        loop {
            // SAFETY: iterating a completed buffer of `valid` bytes with CUPTI's API.
            let r = unsafe { (api.cuptiActivityGetNextRecord)(buffer, valid, &mut rec) };
            if r == CUPTI_ERROR_MAX_LIMIT_REACHED || r != CUPTI_SUCCESS {
                break;
            }
            let p = rec.cast::<u8>().cast_const();
            // SAFETY: `p` is a CUPTI record of the kind it declares.
            unsafe {
                let kind = activity::kind(p);
                ctx.kernel = kind == activity::KIND_CONCURRENT_KERNEL;
                match kind {
                    activity::KIND_CONCURRENT_KERNEL => {
                        let k = activity::kernel(p, &mut ctx, diag);
                        ctx.tally.kernels += 1;
                        if k.correlation_id == ctx.tally.last_corr {
                            ctx.tally.corr_repeats += 1;
                        }
                        ctx.tally.last_corr = k.correlation_id;
                        if !ctx.tally.complete(k.start_ns, k.end_ns) {
                            continue;
                        }
                        if k.launch_ns != 0 {
                            let lag = k.end_ns.saturating_sub(k.launch_ns);
                            ctx.tally.lag_max_ns = ctx.tally.lag_max_ns.max(lag);
                        }
                        ctx.w.push(k.as_bytes());
                    }
                    activity::KIND_GRAPH_TRACE => {
                        let g = activity::graph(p, &mut ctx);
                        ctx.tally.graphs += 1;
                        if !ctx.tally.complete(g.start_ns, g.end_ns) {
                            continue;
                        }
                        // A graph's launch is stamped at every depth: its lag tells the
                        // planner how deep the queue is before any window switches kernel
                        // activity under it.
                        if g.launch_ns != 0 {
                            let lag = g.end_ns.saturating_sub(g.launch_ns);
                            ctx.tally.lag_max_ns = ctx.tally.lag_max_ns.max(lag);
                        }
                        ctx.w.push(g.as_bytes());
                    }
                    activity::KIND_MEMCPY => {
                        let m = activity::memcpy(p, &mut ctx);
                        ctx.tally.mems += 1;
                        if !ctx.tally.complete(m.start_ns, m.end_ns) {
                            continue;
                        }
                        ctx.w.push(m.as_bytes());
                    }
                    activity::KIND_MEMSET => {
                        let m = activity::memset(p, &mut ctx);
                        ctx.tally.mems += 1;
                        if !ctx.tally.complete(m.start_ns, m.end_ns) {
                            continue;
                        }
                        ctx.w.push(m.as_bytes());
                    }
                    _ => ctx.tally.others += 1,
                }
            }
        }
        ctx.tally.add_to(&s.counters);
        if ctx.tally.repeats_unreliable() && !REPEATS_SAID.swap(true, Ordering::Relaxed) {
            say!(
                "CUPTI gave {} of {} kernel records the correlation id of the record before them: \
                 their operators and launch times are not their own from here on (seen where \
                 kernel activity is switched under a deep launch queue; by default the shim \
                 switches it there only at the exit of synchronising calls)",
                ctx.tally.corr_repeats,
                ctx.tally.kernels
            );
        }
        let mut dropped = 0usize;
        // SAFETY: valid out pointer; ctx/stream as CUPTI gave them.
        unsafe { (api.cuptiActivityGetNumDroppedRecords)(ctx_ptr, stream_id, &mut dropped) };
        if dropped > 0 {
            if let Some(t) = &s.transport {
                t.header
                    .cupti_dropped
                    .fetch_add(dropped as u64, Ordering::Relaxed);
            }
        }
    });
    if let Some(s) = SHIM.get() {
        // A full pool drops the buffer (freed here).
        let cfg = s.buffers_cfg;
        if cfg.reuse {
            let pool = if owned.len() * 8 >= cfg.large {
                &s.buffers
            } else {
                &s.small_buffers
            };
            let _ = pool.push(owned);
        }
    }
}

/// The background thread: switches depth when the plan says (woken by step markers at
/// window boundaries, by requests, or by the plan's time), flushes CUPTI and moves queued
/// records every flush period, keeps the agent connection.
fn flusher() {
    let period = std::env::var("SLO_PROBE_FLUSH_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200u64)
        .clamp(10, 10_000)
        * 1_000_000;
    let mut next_flush = now_ns() + period;
    let mut wake_ns: Option<u64> = None;
    let mut flushes = 0u64;
    loop {
        let now = now_ns();
        let until = wake_ns.map_or(next_flush, |w| w.min(next_flush));
        if until > now {
            std::thread::park_timeout(Duration::from_nanos(until - now));
        }
        if FORKED.load(Ordering::Relaxed) || EXITING.load(Ordering::Acquire) {
            return;
        }
        let Some(s) = SHIM.get() else { continue };
        wake_ns = catch_unwind(AssertUnwindSafe(|| s.control_tick())).unwrap_or(None);
        if now_ns() >= next_flush {
            let _ = catch_unwind(AssertUnwindSafe(|| flush_once(s, flushes)));
            flushes += 1;
            next_flush = now_ns() + period;
        }
    }
}

fn flush_once(s: &Shim, flushes: u64) {
    // Quiet at depth 0 (`control::quiet_cupti`): one flush returns what the window left in
    // CUPTI's buffers; after it nothing is traced, and nothing is flushed.
    let quiet = s.quiet.load(Ordering::Relaxed);
    if s.tracing() && !EXITING.load(Ordering::Acquire) && quiet != control::QUIET_FLUSHED {
        if let Some(api) = &s.api {
            // SAFETY: never called from a CUPTI callback; one flusher thread.
            unsafe { (api.cuptiActivityFlushAll)(0) };
        }
        if quiet == control::QUIET_UNFLUSHED {
            let _ = s.quiet.compare_exchange(
                control::QUIET_UNFLUSHED,
                control::QUIET_FLUSHED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
    if let Ok(mut w) = s.writer.lock() {
        s.drain_queue(&mut w);
    }
    if let Some(t) = &s.transport {
        if flushes % 5 == 0 {
            let status = s.status.load(Ordering::Relaxed);
            let up = t.ensure_connected(s.cupti_version, status as u32);
            s.set_status(STATUS_CONNECTED, up);
        }
    }
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| {
        if FORKED.load(Ordering::Relaxed) {
            return;
        }
        EXITING.store(true, Ordering::Release);
        let Some(s) = SHIM.get() else { return };
        // Waits for a depth switch the background thread is in the middle of (it takes this
        // lock for each), so that no CUPTI call of that thread overlaps the flush below; the
        // thread makes none after seeing EXITING.
        let _control = s.lock_control();
        if s.tracing() {
            if let Some(api) = &s.api {
                // SAFETY: forced flush at exit, from the exiting thread, with the background
                // thread out of CUPTI (see above).
                unsafe { (api.cuptiActivityFlushAll)(FLUSH_FORCED) };
            }
        }
        if let Ok(mut w) = s.writer.lock() {
            s.drain_queue(&mut w);
        }
    });
}

/// Called by the CUDA driver once, during `cuInit`, when this library is named in
/// `CUDA_INJECTION64_PATH`. Returns 1 (success) even when tracing cannot start, so that the
/// job always runs; the reason goes to stderr and to the agent's status.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> i32 {
    guard(1, || {
        if INJECTED.swap(true, Ordering::AcqRel) {
            return 1;
        }
        let s = shim();
        // SAFETY: registering a function with no preconditions.
        unsafe { libc::atexit(at_exit) };
        // Free: the flusher takes this lock only while tracing, which starts here.
        let Ok(mut c) = s.control.lock() else {
            return 1;
        };
        match s.start_tracing(&mut c, false) {
            Ok(()) => {
                if s.log {
                    say!("tracing (CUPTI {})", s.cupti_version);
                }
            }
            Err(e) => say!("{e}"),
        }
        1
    })
}

/// ABI version of the `slo_probe_*` functions: 1.
#[no_mangle]
pub extern "C" fn slo_probe_shim_version() -> i32 {
    1
}

fn step_marker(step: u64, phase: u32) {
    let s = shim();
    let ts = now_ns();
    if phase == STEP_END {
        let n = s.steps_ended.fetch_add(1, Ordering::Relaxed) + 1;
        s.last_step_ns.store(ts, Ordering::Relaxed);
        let depth = s.depth_now.load(Ordering::Relaxed);
        if depth != DEPTH_OFF && depth > DEPTH_TIMING {
            s.sampled_steps.fetch_add(1, Ordering::Relaxed);
        }
        // At a window boundary, wake the flusher (once per boundary).
        let w = s.wake_at_step.load(Ordering::Relaxed);
        if n >= w
            && s.wake_at_step
                .compare_exchange(w, u64::MAX, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            wake_flusher();
        }
    }
    s.push_queued(Queued::Step(StepRecord {
        header: RecordHeader::of::<StepRecord>(),
        step,
        ts_ns: ts,
        tid: tid(),
        phase,
    }));
}

/// Marks the start of training iteration `step`. Never blocks.
#[no_mangle]
pub extern "C" fn slo_probe_step_begin(step: u64) {
    guard((), || step_marker(step, STEP_BEGIN));
}

/// Marks the end of training iteration `step`. Never blocks.
#[no_mangle]
pub extern "C" fn slo_probe_step_end(step: u64) {
    guard((), || step_marker(step, STEP_END));
}

/// Returns the id of operator `name` (NUL-terminated UTF-8), creating it on first use; 0 on
/// failure. Call once per distinct name and cache the id.
///
/// # Safety
/// `name` must be null or a valid NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn slo_probe_intern_op(name: *const c_char) -> u32 {
    guard(0, || {
        if name.is_null() {
            return 0;
        }
        // SAFETY: per the contract.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let s = shim();
        let Ok(mut names) = s.op_names.lock() else {
            return 0;
        };
        if let Some(&id) = names.get(&name) {
            return id;
        }
        let id = s.next_name_id.fetch_add(1, Ordering::Relaxed);
        names.insert(name.clone(), id);
        s.push_queued(Queued::OpName {
            id,
            name: name.into_boxed_str(),
        });
        id
    })
}

/// Pushes operator `id` on the calling thread's operator stack: kernels it launches (and graph
/// nodes it captures) are attributed to it until the matching pop.
#[no_mangle]
pub extern "C" fn slo_probe_op_push(id: u32) {
    guard((), || OPS.with(|o| o.borrow_mut().push(id)));
}

/// Pops the calling thread's operator stack (no effect when empty).
#[no_mangle]
pub extern "C" fn slo_probe_op_pop() {
    guard((), || {
        OPS.with(|o| {
            o.borrow_mut().pop();
        })
    });
}

/// Hands CUPTI to another tool (torch.profiler): flushes, unsubscribes. 0 on success.
#[no_mangle]
pub extern "C" fn slo_probe_cupti_release() -> i32 {
    guard(-1, || {
        let s = shim();
        let Ok(mut c) = s.lock_control() else {
            return -1;
        };
        match s.stop_tracing(&mut c) {
            Ok(()) => 0,
            Err(e) => {
                say!("{e}");
                -2
            }
        }
    })
}

/// Takes CUPTI back after [`slo_probe_cupti_release`]. 0 on success.
#[no_mangle]
pub extern "C" fn slo_probe_cupti_reacquire() -> i32 {
    guard(-1, || {
        let s = shim();
        if s.tracing() {
            return 0;
        }
        let Ok(mut c) = s.lock_control() else {
            return -1;
        };
        match s.start_tracing(&mut c, true) {
            Ok(()) => 0,
            Err(e) => {
                say!("{e}");
                -2
            }
        }
    })
}

/// The shim's state: `STATUS_*` bits of [`slo_probe_common::ring`] (1 tracing, 2 connected,
/// 4 lost the CUPTI race, 8 diagnostic, 16 released, 32 kernels traced).
#[no_mangle]
pub extern "C" fn slo_probe_status() -> u32 {
    guard(0, || shim().status.load(Ordering::Relaxed) as u32)
}

/// Asks for node-level graph tracing (depth 2) during the next `steps` iterations (then back
/// to what the shim would do anyway).
#[no_mangle]
pub extern "C" fn slo_probe_request_diagnostic(steps: u32) {
    guard((), || {
        request_depth(DEPTH_NODES, steps.max(1));
    });
}

fn request_depth(depth: u32, steps: u32) {
    let s = shim();
    let duration = if steps == 0 {
        DepthDuration::UntilNext
    } else {
        DepthDuration::Steps(steps)
    };
    let g = next_generation(s.script_request.load(Ordering::Relaxed));
    s.script_request
        .store(encode_depth_request(g, depth, duration), Ordering::Release);
    wake_flusher();
}

/// Asks for tracing depth `depth` (0 timing, 1 kernels, 2 graph nodes) during the next `steps`
/// iterations (0: until the next request); depth 0 withdraws the script's request. Applied by
/// the shim's thread within milliseconds. 0 on success, -1 for a depth above 2.
#[no_mangle]
pub extern "C" fn slo_probe_request_depth(depth: u32, steps: u32) -> i32 {
    guard(-1, || {
        if depth > DEPTH_NODES {
            return -1;
        }
        request_depth(depth, steps);
        0
    })
}

/// The shim's depth word (`slo_probe_common::ring::decode_shim_depth`): current depth (bits
/// 0..7, 0xff off), reason (8..15), sample window (16..31), period (32..62), unit (63: ms).
#[no_mangle]
pub extern "C" fn slo_probe_depth() -> u64 {
    guard(0, || shim().depth_word.load(Ordering::Relaxed))
}

/// Copies up to `n` debug counters into `out` and returns how many exist, in this order:
/// launch callbacks on the driver and runtime APIs (kernels and graphs), kernel records,
/// correlation hits and misses, graph records, memory records, graph nodes created and cloned,
/// buffers completed, queue drops, other records, graph nodes not remembered (table full),
/// graph-launch callbacks, kernel records stamped by a driver and by a runtime callback, the
/// kernel-launch domains in use (1 driver, 2 runtime), depth changes, ns spent switching,
/// sample windows, ns inside callbacks, steps ended while kernels were traced.
///
/// # Safety
/// `out` must point to `n` writable u64s (or be null with `n` 0).
#[no_mangle]
pub unsafe extern "C" fn slo_probe_debug_counters(out: *mut u64, n: usize) -> usize {
    guard(0, || {
        let s = shim();
        let c = &s.counters;
        let h = &s.hot;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let all = [
            r(&h.kernels_driver) + r(&h.graphs_driver),
            r(&h.kernels_runtime) + r(&h.graphs_runtime),
            r(&c.kernel_records),
            r(&c.corr_hits),
            r(&c.corr_misses),
            r(&c.graph_records),
            r(&c.mem_records),
            r(&c.nodes_created),
            r(&c.nodes_cloned),
            r(&c.buffers_completed),
            r(&c.queue_dropped),
            r(&c.other_records),
            r(&c.node_ops_full),
            r(&h.graphs_driver) + r(&h.graphs_runtime),
            r(&c.corr_hits_driver),
            r(&c.corr_hits_runtime),
            r(&c.launch_domains),
            r(&c.depth_changes),
            r(&c.toggle_ns),
            r(&c.sample_windows),
            r(&h.callback_ns),
            r(&s.sampled_steps),
            r(&c.incomplete_records),
            r(&c.forced_flushes),
            r(&c.corr_repeats),
            r(&c.holds),
            r(&c.drained_switches),
            r(&c.drain_timeouts),
            r(&c.quiet_switches),
        ];
        if !out.is_null() {
            for (i, v) in all.iter().enumerate().take(n) {
                // SAFETY: per the contract, i < n.
                unsafe { *out.add(i) = *v };
            }
        }
        all.len()
    })
}

/// Forces a flush of CUPTI's buffers and the queue into the ring (for scripts and tests).
#[no_mangle]
pub extern "C" fn slo_probe_flush() {
    guard((), || {
        let s = shim();
        if s.tracing() {
            if let Some(api) = &s.api {
                // SAFETY: not from a CUPTI callback.
                unsafe { (api.cuptiActivityFlushAll)(FLUSH_FORCED) };
            }
        }
        if let Ok(mut w) = s.writer.lock() {
            s.drain_queue(&mut w);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The job's log hears of repeated correlation ids where they are many and common (the
    /// GPT's bursts of call 8, bench/results/faults-2026-12-06-h100: 590 of 1,892, then 99.8%),
    /// not for the few a buffer may carry.
    #[test]
    fn many_repeated_correlation_ids_are_said() {
        let t = |kernels, corr_repeats| Tally {
            kernels,
            corr_repeats,
            ..Tally::default()
        };
        assert!(t(1_892, 590).repeats_unreliable());
        assert!(t(140_116, 139_876).repeats_unreliable());
        assert!(!t(1_892, 0).repeats_unreliable());
        assert!(!t(10_000, 63).repeats_unreliable(), "too few to say");
        assert!(!t(100_000, 9_000).repeats_unreliable(), "under a tenth");
        assert!(t(640, 64).repeats_unreliable());
    }

    /// Tracing starts with memory activity only where it is on at every depth: not once it is
    /// switched with kernel activity (drained switching, or `SLO_PROBE_MEM_ACTIVITY=window`),
    /// so that tracing started again after a release leaves it off at depth 0.
    #[test]
    fn tracing_starts_with_memory_activity_only_where_it_stays_on() {
        let g = activity::KIND_GRAPH_TRACE;
        let (m, s) = (activity::KIND_MEMCPY, activity::KIND_MEMSET);
        assert_eq!(start_kinds(MemActivity::On, &[]), vec![g, m, s]);
        // Latched: memory activity goes with kernel activity.
        let drains = MemActivity::WithKernels.with_kernels();
        assert_eq!(start_kinds(MemActivity::On, drains), vec![g]);
        assert_eq!(start_kinds(MemActivity::WithKernels, drains), vec![g]);
        assert_eq!(start_kinds(MemActivity::Off, &[]), vec![g]);
    }

    /// The launch configuration read from each kernel-launch API's parameters, as CUPTI passes
    /// them (the bindings' layouts).
    #[test]
    fn launch_configurations_are_read_from_the_launch_parameters() {
        use cudarc::cupti::sys::{
            cuLaunchKernel_params_st as Drv, cudaLaunchKernel_v7000_params_st as Rt,
        };
        use slo_probe_common::gpu::decode_launch;
        // SAFETY: plain C structs of integers and pointers; all-zero is valid.
        let mut d: Drv = unsafe { std::mem::zeroed() };
        (
            d.gridDimX,
            d.gridDimY,
            d.blockDimX,
            d.blockDimY,
            d.blockDimZ,
        ) = (264, 2, 32, 1, 1);
        d.gridDimZ = 1;
        let mut r: Rt = unsafe { std::mem::zeroed() };
        (r.gridDim.x, r.gridDim.y, r.gridDim.z) = (131_072, 1, 1);
        (r.blockDim.x, r.blockDim.y, r.blockDim.z) = (128, 1, 1);
        // cuLaunchKernelEx / cudaLaunchKernelExC: a pointer to a configuration.
        let config: [u32; 8] = [8, 1, 1, 256, 1, 1, 0, 0];
        let ex: [*const u32; 4] = [
            config.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
        ];
        let null_ex: [*const u32; 4] = [std::ptr::null(); 4];
        let read =
            |domain, cbid, p: *const u8| decode_launch(unsafe { launch_of(domain, cbid, p) });
        let dp = (&raw const d).cast::<u8>();
        let rp = (&raw const r).cast::<u8>();
        assert_eq!(read(DOMAIN_DRIVER, 307, dp), (32, 528));
        assert_eq!(read(DOMAIN_DRIVER, 442, dp), (32, 528));
        assert_eq!(read(DOMAIN_RUNTIME, 211, rp), (128, 131_072));
        assert_eq!(read(DOMAIN_RUNTIME, 214, rp), (128, 131_072));
        for (domain, cbid) in [
            (DOMAIN_DRIVER, 652),
            (DOMAIN_DRIVER, 653),
            (DOMAIN_RUNTIME, 430),
            (DOMAIN_RUNTIME, 431),
        ] {
            assert_eq!(read(domain, cbid, ex.as_ptr().cast()), (256, 8));
            assert_eq!(read(domain, cbid, null_ex.as_ptr().cast()), (0, 0));
        }
        // Not a kernel launch, or no parameters: nothing.
        assert_eq!(read(DOMAIN_DRIVER, 514, dp), (0, 0));
        assert_eq!(read(DOMAIN_RUNTIME, 211, std::ptr::null()), (0, 0));
    }

    #[test]
    fn default_buffers_are_kib_sized_not_kib_counts() {
        // The defaults once came back as 64 and 16 *bytes*: on the H200 every buffer then held
        // no record and CUPTI dropped one per buffer (590,206 buffers, 0 kernel records).
        let cfg = BufferCfg::from_vars(|_| None);
        assert_eq!(cfg.large, 64 << 10);
        assert_eq!(cfg.small, 16 << 10);
        assert!(cfg.reuse && !cfg.forced_flush);
        assert_eq!(cfg.flush_period_ms, FLUSH_PERIOD_MS);
        assert_eq!(cfg.device_buffer, None);
        assert_eq!(cfg.per_thread, None);
    }

    #[test]
    fn buffer_sizes_from_the_environment_are_in_kib_and_clamped() {
        let vars = |k: &str| match k {
            "SLO_PROBE_BUFFER_KIB" => Some("8192".to_string()),
            "SLO_PROBE_SMALL_BUFFER_KIB" => Some("1".to_string()),
            "SLO_PROBE_BUFFER_REUSE" => Some("0".to_string()),
            "SLO_PROBE_FORCED_FLUSH" => Some("1".to_string()),
            "SLO_PROBE_FLUSH_PERIOD_MS" => Some("0".to_string()),
            "SLO_PROBE_DEVICE_BUFFER_KIB" => Some("256".to_string()),
            _ => None,
        };
        let cfg = BufferCfg::from_vars(vars);
        assert_eq!(cfg.large, 8 << 20);
        assert_eq!(cfg.small, 4 << 10);
        assert!(!cfg.reuse && cfg.forced_flush);
        assert_eq!(cfg.flush_period_ms, 0);
        assert_eq!(cfg.device_buffer, Some(256 << 10));
        let junk = BufferCfg::from_vars(|_| Some("lots".to_string()));
        assert_eq!(junk.large, BUFFER_BYTES);
    }
}
