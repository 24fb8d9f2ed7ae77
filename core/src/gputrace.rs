//! GPU traces from the CUPTI shim, turned into iterations: names and graph nodes resolved,
//! activities assigned to the iteration whose host-side window contains their launch, and per
//! iteration the wall time, GPU busy time, kernel and graph counts, launch latency, the GPU idle
//! gap before the first kernel (data loading / host wait), and time per operator.
//!
//! Iteration boundaries come from step markers (`slo_probe.step()`) when the script sends them;
//! otherwise they are detected: from the period of the copies, fills and graph launches, which
//! are traced at every depth (`cycle`); failing that, each launch of the CUDA graph replayed
//! most often starts an iteration, or, without graphs, the period of the kernel-name sequence.

mod cycle;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use rustc_hash::FxHashMap;

use crate::{gpu::IterationGpu, occupancy::SmLimits};
use slo_probe_common::{
    gpu::{MEM_KIND_MEMSET, STEP_BEGIN, STEP_END, STRING_KERNEL, STRING_OP},
    AnyRecord, GpuGraphRecord, GpuKernelRecord, GpuMemRecord,
};

/// What ran on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivityKind {
    /// A kernel launched eagerly.
    Kernel,
    /// A kernel node of a CUDA graph (diagnostic mode).
    GraphKernel,
    /// A whole CUDA graph launch (graph-level trace).
    Graph,
    /// A memcpy or memset.
    Memory,
    /// A CUDA event reached on a stream (a point in time).
    Event,
}

/// One GPU activity with its names resolved to ids.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activity {
    /// Kind.
    pub kind: ActivityKind,
    /// GPU start, ns.
    pub start_ns: u64,
    /// GPU end, ns.
    pub end_ns: u64,
    /// Host-side launch (API entry), ns; 0 if unknown. With `placed`, an estimate.
    pub launch_ns: u64,
    /// Whether `launch_ns` is not a stamp but where the stamps of the launches around it in
    /// correlation order place it (see [`LaunchStamps`]): it then places the activity in an
    /// iteration, and says nothing about launch latency. (A flag, not a second time: the
    /// activity stays 80 bytes, and an assembler holds up to [`MAX_PENDING`] of them.)
    pub placed: bool,
    /// Correlation id of the launching API call (0 if unknown).
    pub correlation_id: u32,
    /// Bytes copied or set (memory operations; 0 otherwise).
    pub bytes: u64,
    /// Kernel name id (0 for graphs and memory).
    pub name_id: u32,
    /// Operator id (0 if none).
    pub op_id: u32,
    /// Graph id (0 if none).
    pub graph_id: u32,
    /// Stream.
    pub stream_id: u32,
    /// Memory operation kind (`GpuMemRecord::kind`; 0 for others).
    pub mem_kind: u32,
    /// Theoretical occupancy of a kernel (0..=1), when the GPU's limits are known.
    pub occupancy: Option<f32>,
    /// CUDA device ordinal.
    pub device: u32,
}

/// The latest timestamp an activity or step keeps (2^62 ns, 146 years of `CLOCK_MONOTONIC`):
/// later ones come from a corrupt or hostile record and are clamped, so that sums of times and
/// spans stay far from `u64::MAX`.
pub const MAX_TS_NS: u64 = 1 << 62;
/// The longest an activity counts for (one hour): longer spans come from corrupt or hostile
/// records (a start after its end counts as zero). With [`MAX_PENDING`] activities per
/// iteration, no sum of durations comes near `u64::MAX`.
pub const MAX_ACTIVITY_NS: u64 = 3_600_000_000_000;

/// A timestamp as the assembler keeps it ([`MAX_TS_NS`]).
fn bounded_ts(ts: u64) -> u64 {
    ts.min(MAX_TS_NS)
}

/// An activity's end as the assembler keeps it: within [`MAX_ACTIVITY_NS`] of its start, never
/// before it.
fn bounded_end(start: u64, end: u64) -> u64 {
    let start = bounded_ts(start);
    end.clamp(start, start + MAX_ACTIVITY_NS)
}

impl Activity {
    fn from_kernel(k: &GpuKernelRecord) -> Self {
        Self {
            kind: if k.graph_id != 0 {
                ActivityKind::GraphKernel
            } else {
                ActivityKind::Kernel
            },
            start_ns: bounded_ts(k.start_ns),
            end_ns: bounded_end(k.start_ns, k.end_ns),
            launch_ns: bounded_ts(k.launch_ns),
            placed: false,
            correlation_id: k.correlation_id,
            bytes: 0,
            name_id: k.name_id,
            op_id: k.op_id,
            graph_id: k.graph_id,
            stream_id: k.stream_id,
            mem_kind: 0,
            occupancy: None,
            device: k.device_id,
        }
    }

    fn from_graph(g: &GpuGraphRecord) -> Self {
        Self {
            kind: ActivityKind::Graph,
            start_ns: bounded_ts(g.start_ns),
            end_ns: bounded_end(g.start_ns, g.end_ns),
            launch_ns: bounded_ts(g.launch_ns),
            placed: false,
            correlation_id: g.correlation_id,
            bytes: 0,
            name_id: 0,
            op_id: g.op_id,
            graph_id: g.graph_id,
            stream_id: g.stream_id,
            mem_kind: 0,
            occupancy: None,
            device: g.device_id,
        }
    }

    fn from_mem(m: &GpuMemRecord) -> Self {
        Self {
            kind: ActivityKind::Memory,
            start_ns: bounded_ts(m.start_ns),
            end_ns: bounded_end(m.start_ns, m.end_ns),
            launch_ns: bounded_ts(m.launch_ns),
            placed: false,
            correlation_id: m.correlation_id,
            bytes: m.bytes,
            name_id: 0,
            op_id: m.op_id,
            graph_id: m.graph_id,
            stream_id: m.stream_id,
            mem_kind: m.kind,
            occupancy: None,
            device: m.device_id,
        }
    }

    /// The host time that places it in an iteration: its launch (stamped or placed), else its
    /// start.
    pub fn anchor_ns(&self) -> u64 {
        if self.launch_ns != 0 {
            self.launch_ns
        } else {
            self.start_ns
        }
    }

    /// Its launch as the shim stamped it (not placed).
    pub fn stamped_launch_ns(&self) -> u64 {
        if self.placed {
            0
        } else {
            self.launch_ns
        }
    }

    /// GPU duration, ns.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// What an operator does on the GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Compute kernels.
    #[default]
    Compute,
    /// Collective communication kernels (NCCL).
    Communication,
    /// memcpy and memset.
    Memory,
    /// A whole CUDA graph traced at graph level (what it runs:
    /// [`crate::snapshot::ProcessSnapshot::graph_ops`]).
    Graph,
}

impl OpKind {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Compute => "compute",
            Self::Communication => "communication",
            Self::Memory => "memory",
            Self::Graph => "graph",
        }
    }
}

/// Time spent by one operator in an iteration.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    /// Operator label: the script's op name, else the fused operators of an Inductor kernel
    /// name, else the kernel name; `graph#<id>` for a graph traced at graph level; memory
    /// operations by direction (`memcpy HtoD`), after the op name when one was active.
    pub op: Arc<str>,
    /// What it does.
    pub kind: OpKind,
    /// Sum of its activities' GPU time, ns.
    pub gpu_ns: u64,
    /// The part of its GPU time on the critical path (that extended the GPU's busy time;
    /// work hidden behind other work has none), ns.
    pub critical_ns: u64,
    /// Activities (kernels, graph launches or memory operations).
    pub kernels: u32,
    /// GPU-time-weighted mean theoretical occupancy of its kernels, when known.
    pub occupancy: Option<f64>,
    /// GPU idle time just before its activities because nothing was queued (they were
    /// launched after the GPU went idle), ns: what late launches of this operator cost.
    pub gap_ns: u64,
    /// GPU idle time just before its activities while they were queued (waiting on another
    /// stream or an event), ns.
    pub wait_ns: u64,
    /// Mean launch latency (GPU start − API entry) of its activities that found the GPU
    /// waiting for them, ns (queueing behind earlier work is not latency), when known.
    pub launch_latency_ns: Option<u64>,
    /// Bytes its memory operations moved.
    pub bytes: u64,
}

/// One training iteration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Iteration {
    /// Step number from the marker, or the detected index.
    pub step: u64,
    /// Whether the boundaries came from markers.
    pub marked: bool,
    /// Host-side start, ns.
    pub start_ns: u64,
    /// Host-side end, ns.
    pub end_ns: u64,
    /// GPU busy time on the critical path of its period: the time its activities kept the GPU
    /// busy beyond what was already running, ns (at most [`Iteration::gpu_period_ns`]).
    pub gpu_busy_ns: u64,
    /// Its period on the GPU timeline: from when the GPU was done with earlier work (the
    /// previous iteration's) to when it was done with this one's, ns; for the first iteration,
    /// from its host-side start. What the GPU spent on it, busy or idle.
    pub gpu_period_ns: u64,
    /// Whether the timeline holds all of its work and all of the previous iteration's (each
    /// traced at kernel depth or launching CUDA graphs), so that `gpu_period_ns` is its time.
    pub gpu_period_whole: bool,
    /// Start of its first GPU activity or CUDA event, ns (the iteration's start when it has
    /// none).
    pub gpu_start_ns: u64,
    /// End of its last GPU activity or CUDA event, ns (the iteration's start when it has none).
    pub gpu_end_ns: u64,
    /// Eager kernels plus graph kernel nodes.
    pub kernels: u32,
    /// Graph kernel nodes (node-level tracing), of `kernels`.
    pub graph_nodes: u32,
    /// Graph launches seen at graph level.
    pub graph_launches: u32,
    /// Memory operations.
    pub memory_ops: u32,
    /// GPU time of memory operations, ns.
    pub memory_ns: u64,
    /// GPU time of compute kernels and graph launches, ns.
    pub compute_ns: u64,
    /// GPU time of communication kernels (NCCL), ns.
    pub comm_ns: u64,
    /// Communication kernels.
    pub comm_kernels: u32,
    /// Time a communication kernel ran while a compute kernel or graph ran too, ns: how much
    /// of the gradient sync is hidden behind compute (DDP overlaps all-reduce with backward).
    pub comm_overlap_ns: u64,
    /// GPU idle time before its first activity on the GPU timeline, ns: from when the GPU was
    /// done with the previous iteration's work (host wait, data loading; for the first
    /// iteration, from its host-side start). Zero when its work was queued before the GPU got
    /// to it: a CPU running ahead hides the host.
    pub idle_before_first_ns: u64,
    /// GPU idle time between its activities because nothing was queued (the host launched
    /// late), ns (launch gaps).
    pub gaps_ns: u64,
    /// GPU idle time between its activities although work was queued (stream dependencies,
    /// events), ns.
    pub wait_ns: u64,
    /// Launch latencies (GPU start − API entry) of its activities that found the GPU waiting
    /// for them, ns, sorted (queueing behind earlier work is left out).
    pub launch_latencies_ns: Vec<u64>,
    /// Time per operator, largest first.
    pub ops: Vec<OpTime>,
    /// GPU-time-weighted mean theoretical occupancy of its kernels, when known.
    pub occupancy: Option<f64>,
    /// Whether every kernel it launched was traced (the shim was at kernel depth or deeper from
    /// its start to its end). An iteration outside the shim's sample windows has its markers,
    /// graph launches and copies but not its eager kernels: its time counts, its GPU
    /// breakdown does not.
    pub traced: bool,
    /// CUDA device ordinal of its activities (the one with the most GPU time), when it has any.
    pub device: Option<u32>,
    /// What NVML saw on that GPU while it ran (filled in by the agent once a sample after its
    /// end exists; `None` without NVML).
    pub gpu: Option<IterationGpu>,
}

impl Iteration {
    /// Wall time between its host-side markers (or detected boundaries), ns.
    pub fn wall_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// How long the iteration took: its period on the GPU timeline when that timeline holds its
    /// work and the previous iteration's (traced at kernel depth, or CUDA graph launches, which
    /// are always traced: a CPU running ahead of the GPU makes host-side step times say when
    /// the host was let go, not how long the step took), else its wall time. An eager iteration outside the shim's
    /// sample windows has only its copies on the timeline: their period said 5 ms and 113 ms
    /// for alternate 57 ms steps on the H200 (2026-12-03), an iteration P99 of 215 ms for a
    /// job whose own P99 was 40 ms; and the first traced one after them starts its period from
    /// an end of the GPU's work the timeline did not see (130 ms for a 66 ms step). See
    /// [`Iteration::gpu_period_whole`].
    pub fn step_ns(&self) -> u64 {
        if self.gpu_period_ns > 0 && self.gpu_period_whole {
            self.gpu_period_ns
        } else {
            self.wall_ns()
        }
    }

    /// GPU idle before its first activity ([`Iteration::idle_before_first_ns`]) where it is
    /// known: after a whole iteration ([`Iteration::gpu_period_whole`]). After one whose
    /// kernels were not traced, the GPU's last work seen is older than its real last work, and
    /// the idle time seen takes in the untraced kernels' run time (the known-answer suite under
    /// sampling, 2026-12-05: host contention read as +0.27 ms of data loading).
    pub fn idle_before_first(&self) -> Option<u64> {
        self.gpu_period_whole.then_some(self.idle_before_first_ns)
    }

    /// Share of its period with the GPU busy (0..=1; 0 without GPU work).
    pub fn gpu_busy_ratio(&self) -> f64 {
        (self.gpu_busy_ns as f64 / self.busy_period_ns().max(1) as f64).min(1.0)
    }

    /// The period its busy time is a share of: its GPU period, which holds the busy time by
    /// construction (the wall time of an iteration timed by its markers can be shorter than
    /// what the GPU ran for it), else its wall time.
    pub fn busy_period_ns(&self) -> u64 {
        if self.gpu_period_ns > 0 {
            self.gpu_period_ns
        } else {
            self.wall_ns()
        }
    }

    /// From the start of its first GPU activity to the end of its last, ns.
    pub fn gpu_span_ns(&self) -> u64 {
        self.gpu_end_ns.saturating_sub(self.gpu_start_ns)
    }

    /// A launch-latency quantile, ns.
    pub fn launch_latency_ns(&self, q: f64) -> Option<u64> {
        let n = self.launch_latencies_ns.len();
        (n > 0).then(|| {
            self.launch_latencies_ns[((q.clamp(0.0, 1.0) * (n - 1) as f64).round()) as usize]
        })
    }
}

/// The operator label of an Inductor kernel (`triton_poi_fused_addmm_relu_0` → `addmm_relu`),
/// or `None` for other names.
pub fn inductor_ops(kernel: &str) -> Option<&str> {
    let rest = kernel.strip_prefix("triton_")?;
    let rest = rest.split_once('_').map(|(_, r)| r)?; // poi, red, per, tem, ...
    let rest = rest.strip_prefix("fused_").unwrap_or(rest);
    // Drop the trailing `_<n>` index.
    let rest = match rest.rsplit_once('_') {
        Some((head, tail)) if tail.chars().all(|c| c.is_ascii_digit()) => head,
        _ => rest,
    };
    (!rest.is_empty()).then_some(rest)
}

/// A phase of an iteration: its name (the `phase` label) and its time, ns.
pub type Phase = (&'static str, fn(&Iteration) -> u64);

/// The phases of an iteration: GPU compute, communication (NCCL kernels) and memory
/// operations, GPU idle before its first activity (host wait) and between activities (launch
/// gaps), and communication overlapped with compute.
pub const PHASES: [Phase; 6] = [
    ("compute", |i| i.compute_ns),
    ("communication", |i| i.comm_ns),
    ("memory", |i| i.memory_ns),
    ("host_wait", |i| i.idle_before_first_ns),
    ("launch_gaps", |i| i.gaps_ns),
    ("comm_overlap", |i| i.comm_overlap_ns),
];

/// A short readable label for a kernel name: Inductor's fused operators; else the demangled C++
/// function name without namespaces, template arguments and parameters; for CUTLASS-style
/// `Kernel<Config>` wrappers, the configuration's name.
pub fn short_kernel_name(kernel: &str) -> String {
    if let Some(ops) = inductor_ops(kernel) {
        return ops.to_owned();
    }
    let demangled = match cpp_demangle::Symbol::new(kernel) {
        Ok(s) => s.to_string(),
        // Some CUDA names (anonymous namespaces with file hashes) defeat the demangler: take
        // the last name of the nested name directly.
        Err(_) => match itanium_nested_name(kernel) {
            Some(n) => return n,
            None => kernel.to_owned(),
        },
    };
    let demangled = demangled.replace("(anonymous namespace)", "anon");
    // The name outside any template brackets, up to the parameter list; and the first
    // template argument of the outermost brackets.
    let mut head = String::new();
    let mut first_arg = String::new();
    let mut depth = 0usize;
    let mut in_first_arg = true;
    for c in demangled.chars() {
        match (c, depth) {
            ('(', 0) => break,
            ('<', _) => depth += 1,
            ('>', _) => depth = depth.saturating_sub(1),
            (',', 1) => in_first_arg = false,
            (c, 0) => head.push(c),
            (c, _) if in_first_arg => first_arg.push(c),
            _ => {}
        }
    }
    let last = |s: &str| s.rsplit("::").next().unwrap_or(s).trim().to_owned();
    let name = last(head.trim_start_matches("void ").trim());
    let lower = name.to_ascii_lowercase();
    if (lower.starts_with("kernel") || lower == "device_kernel") && !first_arg.is_empty() {
        return last(&first_arg);
    }
    if name.is_empty() {
        kernel.to_owned()
    } else {
        name
    }
}

/// The last plain identifier of an Itanium nested name (`_ZN2at6native...` → its last
/// component before template arguments or the end), `None` if `name` is not one.
fn itanium_nested_name(name: &str) -> Option<String> {
    let rest = name.strip_prefix("_ZN")?.as_bytes();
    let mut i = 0;
    let mut last = None;
    while i < rest.len() && rest[i].is_ascii_digit() {
        let start = i;
        while i < rest.len() && rest[i].is_ascii_digit() {
            i += 1;
        }
        let len: usize = std::str::from_utf8(&rest[start..i]).ok()?.parse().ok()?;
        let ident = rest.get(i..i + len)?;
        last = Some(String::from_utf8_lossy(ident).into_owned());
        i += len;
    }
    last
}

/// The graph id of a label of a graph traced at graph level (`graph#<id>`).
pub fn graph_id_of(label: &str) -> Option<u32> {
    label.strip_prefix("graph#")?.parse().ok()
}

/// What each CUDA graph (by graph id) was captured from ([`TraceAssembler::graph_composition`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphComposition {
    /// Its nodes per label of the operator that captured them (`""`: none).
    pub nodes: BTreeMap<u32, BTreeMap<String, u32>>,
    /// Its kernel nodes per label and launch configuration
    /// ([`slo_probe_common::gpu::encode_launch`]), where the capture recorded them (a shim since
    /// 2026-12-06, unless `SLO_PROBE_CAPTURE_LAUNCH=0`): `launch → nodes`.
    pub launches: BTreeMap<u32, BTreeMap<String, BTreeMap<u32, u32>>>,
}

/// Operators kept per graph by [`TraceAssembler::graph_ops`].
pub const GRAPH_OPS: usize = 8;

/// Distinct operators one assembler names; activities of further operators are counted under
/// [`OVERFLOW_OP`] (and in [`TraceAssembler::ops_overflowed`]), so memory stays bounded
/// whatever the job launches.
pub const MAX_OPS: usize = 4096;

/// Operator identities (operator id, kernel name or graph id) an assembler remembers.
pub const MAX_OP_KEYS: usize = 65_536;

/// Kernel names, and operator names, an assembler keeps (each); further strings are dropped
/// and counted ([`TraceAssembler::strings_dropped`]).
pub const MAX_STRINGS: usize = 65_536;

/// Launch configurations whose occupancy an assembler remembers (slots of a direct-mapped
/// cache: a power of two; 16 KiB).
const MAX_OCCUPANCY_CACHE: usize = 1024;

/// Graph nodes whose operator an assembler remembers.
const MAX_NODE_OPS: usize = 1 << 16;

/// Activities an assembler holds while their iteration is open or undetected; beyond this the
/// oldest quarter is dropped and counted ([`TraceAssembler::capped`]). About 20 MiB: two
/// seconds of 100,000 kernels a second.
pub const MAX_PENDING: usize = 1 << 18;

/// Steps an assembler holds open (begun, not ended or not settled); beyond this the oldest is
/// dropped and counted.
pub const MAX_OPEN_STEPS: usize = 4096;

/// CUDA graphs an assembler counts and profiles; launches and nodes of further graphs are
/// counted in [`TraceAssembler::capped`].
pub const MAX_GRAPHS: usize = 1024;

/// Operators a graph's profile keeps ([`TraceAssembler::graph_ops`] reports the top
/// [`GRAPH_OPS`]).
pub const MAX_GRAPH_KERNELS: usize = 1024;

/// Operators all graph profiles keep together.
pub const MAX_GRAPH_ENTRIES: usize = 1 << 16;

/// Bytes of kernel and operator names an assembler keeps (together), and of one name; further
/// names are dropped, longer ones cut, both counted in [`TraceAssembler::strings_dropped`].
pub const MAX_STRING_BYTES: usize = 4 << 20;
/// See [`MAX_STRING_BYTES`].
pub const MAX_STRING_LEN: usize = 4096;

/// Launch latencies an iteration keeps (an even sample of them, sorted, when it had more):
/// quantiles over the recent iterations stay within a few per mille.
pub const MAX_ITERATION_LATENCIES: usize = 1024;

/// Operators an iteration lists; the smallest beyond this are summed under [`OVERFLOW_OP`].
pub const MAX_ITERATION_OPS: usize = 256;

/// The label of the operator that collects activities beyond [`MAX_OPS`].
pub const OVERFLOW_OP: &str = "(other operators)";

/// What identifies an operator before its label is known.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum OpKey {
    /// Operator id, kernel name id.
    Kernel(u32, u32),
    /// Operator id, graph id.
    Graph(u32, u32),
    /// Operator id, memory kind.
    Memory(u32, u32),
}

/// Per operator, while an iteration is summarised.
#[derive(Clone, Copy, Default)]
struct OpAcc {
    gpu_ns: u64,
    critical_ns: u64,
    wait_ns: u64,
    count: u32,
    occ_weighted: f64,
    occ_ns: u64,
    gap_ns: u64,
    launch_sum: u64,
    launch_count: u32,
    bytes: u64,
}

/// Named operators: a label and kind per index, index 0 the overflow operator.
struct OpTable {
    by_key: FxHashMap<OpKey, u32>,
    /// Entries of `by_key` looked up lately, by a hash of the key, one per slot ([`NO_OP`]:
    /// none): every activity is looked up as it is summarised, and the hash map's lookups
    /// were 7% of the pipeline on the H200 eager fixture. `by_key` only grows, so an entry
    /// copied here stays right.
    recent: Vec<(OpKey, u32)>,
    by_label: FxHashMap<Arc<str>, u32>,
    info: Vec<(Arc<str>, OpKind)>,
    overflowed: u64,
}

/// Slots of [`OpTable`]'s `recent` (a power of two; 16 KiB).
const RECENT_OPS: usize = 1 << 10;

/// An empty slot of [`OpTable`]'s `recent` (no operator has this index: at most [`MAX_OPS`]).
const NO_OP: u32 = u32::MAX;

impl Default for OpTable {
    fn default() -> Self {
        Self {
            by_key: FxHashMap::default(),
            recent: vec![(OpKey::Kernel(0, 0), NO_OP); RECENT_OPS],
            by_label: FxHashMap::default(),
            info: vec![(Arc::from(OVERFLOW_OP), OpKind::Compute)],
            overflowed: 0,
        }
    }
}

impl OpKey {
    /// Its slot in [`OpTable`]'s `recent` (Fibonacci hashing of the fields).
    fn slot(self) -> usize {
        let (kind, x, y) = match self {
            OpKey::Kernel(x, y) => (0, x, y),
            OpKey::Graph(x, y) => (1, x, y),
            OpKey::Memory(x, y) => (2, x, y),
        };
        let h = ((u64::from(x) << 32) | u64::from(y))
            .wrapping_add(kind)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> (64 - RECENT_OPS.trailing_zeros())) as usize
    }
}

/// `memcpy HtoD` and the like, from CUPTI's copy kind.
fn memory_label(kind: u32) -> &'static str {
    match kind {
        MEM_KIND_MEMSET => "memset",
        1 => "memcpy HtoD",
        2 => "memcpy DtoH",
        3 => "memcpy HtoA",
        4 => "memcpy AtoH",
        5 => "memcpy AtoA",
        6 => "memcpy AtoD",
        7 => "memcpy DtoA",
        8 => "memcpy DtoD",
        9 => "memcpy HtoH",
        10 => "memcpy PtoP",
        _ => "memcpy",
    }
}

/// Whether a kernel name is a collective communication kernel.
pub fn is_comm_kernel(name: &str) -> bool {
    name.as_bytes()
        .windows(4)
        .any(|w| w.eq_ignore_ascii_case(b"nccl"))
}

/// Folds records into iterations.
#[derive(Default)]
pub struct TraceAssembler {
    names: HashMap<u32, String>,
    ops: HashMap<u32, String>,
    /// Each graph node's operator and launch configuration (0: not known).
    node_ops: FxHashMap<u64, (u32, u32)>,
    pending: Vec<Activity>,
    /// How many of the first pending activities are in anchor order (a take leaves them all
    /// sorted; what came since is after them): only the rest is sorted on the next take.
    pending_sorted: usize,
    steps: BTreeMap<u64, (Option<u64>, Option<u64>)>,
    marked: bool,
    next_detected: u64,
    graph_counts: HashMap<u32, u64>,
    /// The correlation id of the last graph launch seen at node level, per graph.
    graph_launch_corr: FxHashMap<u32, u32>,
    /// GPU time of node-level kernels by graph, then by (operator id, kernel name id).
    graph_contents: FxHashMap<u32, FxHashMap<(u32, u32), u64>>,
    /// Whether `graph_contents` grew since [`TraceAssembler::graph_ops`] was last asked.
    graph_contents_changed: bool,
    /// Nodes of each graph by the operator that captured them (0: none) and their launch
    /// configuration (0: not known), from the node records (the capture, and the clones
    /// instantiation makes).
    graph_nodes: FxHashMap<u32, FxHashMap<(u32, u32), u32>>,
    /// Whether `graph_nodes` grew since [`TraceAssembler::graph_composition`] was last asked.
    graph_nodes_changed: bool,
    table: OpTable,
    /// Scratch of `summarise`, indexed by operator.
    acc: Vec<OpAcc>,
    /// The GPU timeline of the activities summarised so far.
    timeline: GpuTimeline,
    /// The shim's tracing depth over time.
    depth: DepthLog,
    /// Stamped launches, for placing activities without a stamp.
    stamps: LaunchStamps,
    /// Kernels and graph launches of the last complete traced iterations.
    recent_launches: std::collections::VecDeque<u32>,
    /// Traced iterations refused as incomplete since the last complete one.
    refused_in_a_row: u32,
    /// The last iteration's work was not all on the GPU timeline (not traced at kernel depth,
    /// no graph launches): the GPU period of the next one starts from an end the timeline does
    /// not know.
    last_untimed: bool,
    /// Scratch of `summarise`: activities sorted by start, and their keys.
    sorted: Vec<Activity>,
    range_keys: Vec<(u64, u64, u32)>,
    /// Scratch of `summarise`: operators seen in the iteration.
    touched: Vec<u32>,
    /// Scratch of `summarise`: communication and compute intervals.
    comm_iv: Vec<(u64, u64)>,
    compute_iv: Vec<(u64, u64)>,
    /// Iteration boundaries from the tokens traced at every depth.
    cycle: cycle::CycleDetector,
    /// The period of the kernel sequence last detected, and how many kernels were pending
    /// when detection last failed.
    period: Option<usize>,
    period_failed_at: usize,
    /// Records seen, by kind: kernels, graphs, memory, nodes, strings, steps.
    pub seen: [u64; 6],
    /// Activities that belonged to no iteration (between steps, or too late for theirs).
    pub late: u64,
    limits: Option<SmLimits>,
    /// (threads per block, registers, shared memory) → occupancy, for the kernels seen
    /// lately: one per slot, by a hash of the key (empty until the first kernel: then every
    /// slot holds (0, 0, 0) → `None`, which is what the limits give for no threads).
    /// Occupancy depends on the key and the limits only, so a slot overwritten costs a
    /// recomputation, never a different value; a hash map's lookups were 4% of the pipeline
    /// on the H200 eager fixture.
    occupancy_cache: Vec<((u32, u32, u32), Option<f32>)>,
    /// Strings dropped because [`MAX_STRINGS`] or [`MAX_STRING_BYTES`] were kept already, or
    /// cut at [`MAX_STRING_LEN`].
    pub strings_dropped: u64,
    /// Bytes of the names kept.
    string_bytes: usize,
    /// Entries of `graph_contents`, all graphs together.
    graph_entries: usize,
    /// Entries of `graph_nodes`, all graphs together.
    graph_node_entries: usize,
    /// Records dropped because a table was full ([`MAX_PENDING`], [`MAX_OPEN_STEPS`],
    /// [`MAX_GRAPHS`], [`MAX_GRAPH_KERNELS`]).
    pub capped: u64,
    /// Whether [`MAX_PENDING`] and [`MAX_OPEN_STEPS`] apply (a live process, whose iterations
    /// are taken as time goes; a recording is pushed whole, then taken).
    bounded: bool,
}

impl TraceAssembler {
    /// An empty assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the GPU's per-SM limits, for theoretical occupancy of the kernels that follow.
    pub fn set_limits(&mut self, limits: Option<SmLimits>) {
        self.limits = limits;
        self.occupancy_cache.clear();
    }

    /// Caps what is pending ([`MAX_PENDING`], [`MAX_OPEN_STEPS`]): for a live process, whose
    /// iterations are taken as time goes.
    pub fn set_bounded(&mut self, bounded: bool) {
        self.bounded = bounded;
    }

    /// Frees every table and everything pending (the process is gone), keeping the counters.
    pub fn release(&mut self) {
        let mut kept = Self {
            seen: self.seen,
            late: self.late,
            strings_dropped: self.strings_dropped,
            capped: self.capped,
            limits: self.limits,
            bounded: self.bounded,
            ..Self::default()
        };
        kept.table.overflowed = self.table.overflowed;
        *self = kept;
    }

    /// A name by id (kernel or operator), if its string record has arrived.
    pub fn name(&self, id: u32) -> Option<&str> {
        self.names
            .get(&id)
            .or_else(|| self.ops.get(&id))
            .map(String::as_str)
    }

    /// Activities counted under [`OVERFLOW_OP`] so far.
    pub fn ops_overflowed(&self) -> u64 {
        self.table.overflowed
    }

    /// Distinct operators named so far (at most [`MAX_OPS`], plus the overflow operator).
    pub fn ops_named(&self) -> usize {
        self.table.info.len()
    }

    /// The label and kind of an activity's operator, and whether the label is final (a kernel
    /// whose name has not arrived yet gets `kernel#<id>` for now).
    fn label_of(&self, key: OpKey) -> (String, OpKind, bool) {
        let op = |id: u32| (id != 0).then(|| self.ops.get(&id)).flatten();
        match key {
            OpKey::Kernel(op_id, name_id) => {
                let name = self.names.get(&name_id);
                let kind = if name.is_some_and(|n| is_comm_kernel(n)) {
                    OpKind::Communication
                } else {
                    OpKind::Compute
                };
                match (op(op_id), name) {
                    (Some(o), _) => (o.clone(), kind, true),
                    (None, Some(n)) => (short_kernel_name(n), kind, true),
                    (None, None) => (format!("kernel#{name_id}"), kind, false),
                }
            }
            OpKey::Graph(op_id, graph_id) => match op(op_id) {
                Some(o) => (o.clone(), OpKind::Graph, true),
                None => (format!("graph#{graph_id}"), OpKind::Graph, true),
            },
            OpKey::Memory(op_id, kind) => match op(op_id) {
                Some(o) => (format!("{o}: {}", memory_label(kind)), OpKind::Memory, true),
                None => (memory_label(kind).to_owned(), OpKind::Memory, true),
            },
        }
    }

    fn key_of(a: &Activity) -> OpKey {
        match a.kind {
            ActivityKind::Graph => OpKey::Graph(a.op_id, a.graph_id),
            ActivityKind::Memory => OpKey::Memory(a.op_id, a.mem_kind),
            _ => OpKey::Kernel(a.op_id, a.name_id),
        }
    }

    /// The operator index of an activity, naming the operator on first sight.
    fn op_index(&mut self, a: &Activity) -> u32 {
        let key = Self::key_of(a);
        let slot = key.slot();
        let (k, i) = self.table.recent[slot];
        if k == key && i != NO_OP {
            return i;
        }
        if let Some(&i) = self.table.by_key.get(&key) {
            self.table.recent[slot] = (key, i);
            return i;
        }
        // Full: a new identity goes to the overflow operator without naming it (naming
        // demangles, and a job with a million kernel names must not pay that per kernel).
        if self.table.info.len() > MAX_OPS || self.table.by_key.len() >= MAX_OP_KEYS {
            self.table.overflowed += 1;
            return 0;
        }
        let (label, kind, final_label) = self.label_of(key);
        let index = match self.table.by_label.get(label.as_str()) {
            Some(&i) => i,
            None if self.table.info.len() > MAX_OPS => 0,
            None => {
                let label: Arc<str> = Arc::from(label);
                let i = self.table.info.len() as u32;
                self.table.info.push((label.clone(), kind));
                self.table.by_label.insert(label, i);
                i
            }
        };
        if final_label && index != 0 {
            self.table.by_key.insert(key, index);
        }
        if index == 0 {
            self.table.overflowed += 1;
        }
        index
    }

    /// The operator label of an activity (see [`OpTime::op`]).
    pub fn op_label(&self, a: &Activity) -> String {
        self.label_of(Self::key_of(a)).0
    }

    /// What each CUDA graph runs, from its node-level kernels (diagnostic mode): operators by
    /// share of the graph's GPU time, largest first, at most [`GRAPH_OPS`] per graph. `None`
    /// when nothing changed since the last call.
    pub fn graph_ops(&mut self) -> Option<BTreeMap<u32, Vec<(String, f64)>>> {
        if !std::mem::take(&mut self.graph_contents_changed) {
            return None;
        }
        let mut out = BTreeMap::new();
        for (&graph, contents) in &self.graph_contents {
            let mut by_label: HashMap<String, u64> = HashMap::new();
            for (&(op_id, name_id), &ns) in contents {
                let (label, _, _) = self.label_of(OpKey::Kernel(op_id, name_id));
                let sum = by_label.entry(label).or_default();
                *sum = sum.saturating_add(ns);
            }
            let total = by_label
                .values()
                .copied()
                .fold(0, u64::saturating_add)
                .max(1) as f64;
            let mut ops: Vec<(String, f64)> = by_label
                .into_iter()
                .map(|(l, ns)| (l, ns as f64 / total))
                .collect();
            ops.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            ops.truncate(GRAPH_OPS);
            out.insert(graph, ops);
        }
        Some(out)
    }

    /// Counts a node of `graph` captured under operator `op` (0: none) with launch
    /// configuration `launch` (0: not known), within [`MAX_GRAPHS`] graphs and
    /// [`MAX_GRAPH_ENTRIES`] entries.
    fn count_graph_node(&mut self, graph: u32, op: u32, launch: u32) {
        if !self.graph_nodes.contains_key(&graph) && self.graph_nodes.len() >= MAX_GRAPHS {
            self.capped += 1;
            return;
        }
        let ops = self.graph_nodes.entry(graph).or_default();
        match ops.get_mut(&(op, launch)) {
            Some(n) => *n = n.saturating_add(1),
            None if self.graph_node_entries < MAX_GRAPH_ENTRIES => {
                ops.insert((op, launch), 1);
                self.graph_node_entries += 1;
            }
            None => {
                self.capped += 1;
                return;
            }
        }
        self.graph_nodes_changed = true;
    }

    /// What each CUDA graph was captured from: its nodes by the label of the operator active
    /// when they were created (`""`: none), from the node records, which arrive at capture and
    /// instantiation, before any replay. `None` when nothing changed since the last call.
    pub fn graph_composition(&mut self) -> Option<GraphComposition> {
        if !std::mem::take(&mut self.graph_nodes_changed) {
            return None;
        }
        let mut out = GraphComposition::default();
        for (&graph, ops) in &self.graph_nodes {
            let mut by_label: BTreeMap<String, u32> = BTreeMap::new();
            let mut launches: BTreeMap<String, BTreeMap<u32, u32>> = BTreeMap::new();
            for (&(op, launch), &n) in ops {
                let label = if op == 0 {
                    String::new()
                } else {
                    self.ops.get(&op).cloned().unwrap_or_default()
                };
                if launch != 0 {
                    let sum = launches
                        .entry(label.clone())
                        .or_default()
                        .entry(launch)
                        .or_default();
                    *sum = sum.saturating_add(n);
                }
                let sum = by_label.entry(label).or_default();
                *sum = sum.saturating_add(n);
            }
            out.nodes.insert(graph, by_label);
            if !launches.is_empty() {
                out.launches.insert(graph, launches);
            }
        }
        Some(out)
    }

    /// Takes one decoded record.
    pub fn push(&mut self, r: &AnyRecord<'_>) {
        let a = match r {
            AnyRecord::GpuKernel(k) => {
                self.seen[0] += 1;
                let mut a = Activity::from_kernel(k);
                if let Some(l) = self.limits {
                    let threads = k.block[0]
                        .saturating_mul(k.block[1])
                        .saturating_mul(k.block[2]);
                    let smem = k.static_smem.saturating_add(k.dynamic_smem);
                    let key = (threads, k.registers, smem);
                    if self.occupancy_cache.is_empty() {
                        self.occupancy_cache
                            .resize(MAX_OCCUPANCY_CACHE, ((0, 0, 0), None));
                    }
                    let h = (u64::from(threads) | (u64::from(k.registers) << 32))
                        .wrapping_add(u64::from(smem).wrapping_mul(0x2545_F491_4F6C_DD1D))
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let slot = &mut self.occupancy_cache
                        [(h >> (64 - MAX_OCCUPANCY_CACHE.trailing_zeros())) as usize];
                    if slot.0 != key {
                        let o = l.occupancy(threads, k.registers, smem).map(|o| o as f32);
                        *slot = (key, o);
                    }
                    a.occupancy = slot.1;
                }
                if a.op_id == 0 && k.graph_node_id != 0 {
                    a.op_id = self.node_ops.get(&k.graph_node_id).map_or(0, |n| n.0);
                }
                if k.graph_id != 0 {
                    // A node of a graph launch traced at node level: one launch per
                    // correlation id (every node of a launch carries the launch's).
                    let known = self.graph_counts.contains_key(&k.graph_id);
                    if known || self.graph_counts.len() < MAX_GRAPHS {
                        let last = self.graph_launch_corr.entry(k.graph_id).or_insert(0);
                        if *last != k.correlation_id {
                            *last = k.correlation_id;
                            *self.graph_counts.entry(k.graph_id).or_default() += 1;
                        }
                    }
                    let key = (a.op_id, a.name_id);
                    let room = self.graph_entries < MAX_GRAPH_ENTRIES;
                    let graphs_full = self.graph_contents.len() >= MAX_GRAPHS;
                    match self.graph_contents.get_mut(&k.graph_id) {
                        Some(c) if c.contains_key(&key) => {
                            let sum = c.entry(key).or_default();
                            *sum = sum.saturating_add(a.duration_ns());
                            self.graph_contents_changed = true;
                        }
                        Some(c) if room && c.len() < MAX_GRAPH_KERNELS => {
                            c.insert(key, a.duration_ns());
                            self.graph_entries += 1;
                            self.graph_contents_changed = true;
                        }
                        None if room && !graphs_full => {
                            let mut c = FxHashMap::default();
                            c.insert(key, a.duration_ns());
                            self.graph_contents.insert(k.graph_id, c);
                            self.graph_entries += 1;
                            self.graph_contents_changed = true;
                        }
                        _ => self.capped += 1,
                    }
                }
                a
            }
            AnyRecord::GpuGraph(g) => {
                self.seen[1] += 1;
                if self.graph_counts.len() < MAX_GRAPHS
                    || self.graph_counts.contains_key(&g.graph_id)
                {
                    *self.graph_counts.entry(g.graph_id).or_default() += 1;
                } else {
                    self.capped += 1;
                }
                Activity::from_graph(g)
            }
            AnyRecord::GpuMem(m) => {
                self.seen[2] += 1;
                Activity::from_mem(m)
            }
            // CUPTI 13.0 reports no timestamp for events (0): nothing to place.
            AnyRecord::GpuEvent(e) if e.ts_ns == 0 => return,
            AnyRecord::GpuEvent(e) => Activity {
                kind: ActivityKind::Event,
                start_ns: bounded_ts(e.ts_ns),
                end_ns: bounded_ts(e.ts_ns),
                launch_ns: 0,
                placed: false,
                correlation_id: 0,
                bytes: 0,
                name_id: 0,
                op_id: 0,
                graph_id: 0,
                stream_id: e.stream_id,
                mem_kind: 0,
                occupancy: None,
                device: e.device_id,
            },
            AnyRecord::GraphNode(n) => {
                self.seen[3] += 1;
                // A clone has its original's operator and launch configuration.
                let original = self.node_ops.get(&n.original_node_id).copied();
                let op = if n.op_id != 0 {
                    n.op_id
                } else {
                    original.map_or(0, |o| o.0)
                };
                let launch = if n.launch != 0 {
                    n.launch
                } else {
                    original.map_or(0, |o| o.1)
                };
                if (op != 0 || launch != 0) && self.node_ops.len() < MAX_NODE_OPS {
                    self.node_ops.insert(n.node_id, (op, launch));
                }
                self.count_graph_node(n.graph_id, op, launch);
                return;
            }
            AnyRecord::String(s) => {
                self.seen[4] += 1;
                let table = match s.kind {
                    STRING_KERNEL => &mut self.names,
                    STRING_OP => &mut self.ops,
                    _ => return,
                };
                let mut bytes = s.bytes;
                if bytes.len() > MAX_STRING_LEN {
                    bytes = &bytes[..MAX_STRING_LEN];
                    self.strings_dropped += 1;
                }
                let old = table.get(&s.id).map_or(0, String::len);
                if (table.len() >= MAX_STRINGS && old == 0)
                    || self.string_bytes + bytes.len() > MAX_STRING_BYTES + old
                {
                    self.strings_dropped += 1;
                    return;
                }
                let name = String::from_utf8_lossy(bytes).into_owned();
                self.string_bytes = self.string_bytes + name.len() - old;
                table.insert(s.id, name);
                return;
            }
            AnyRecord::Depth(d) => {
                self.depth.push(d.from_ns, d.depth);
                return;
            }
            AnyRecord::Step(st) => {
                self.seen[5] += 1;
                self.marked = true;
                if self.bounded
                    && self.steps.len() >= MAX_OPEN_STEPS
                    && !self.steps.contains_key(&st.step)
                {
                    self.steps.pop_first();
                    self.capped += 1;
                }
                let e = self.steps.entry(st.step).or_default();
                match st.phase {
                    STEP_BEGIN => e.0 = Some(bounded_ts(st.ts_ns)),
                    STEP_END => e.1 = Some(bounded_ts(st.ts_ns)),
                    _ => {}
                }
                return;
            }
            _ => return,
        };
        self.stamps.push(a.correlation_id, a.launch_ns, a.op_id);
        if self.bounded {
            // A recording is pushed whole, then taken: all its stamps are kept.
            self.stamps.trim(MAX_STAMPS);
        }
        if self.bounded && self.pending.len() >= MAX_PENDING {
            // Nothing completes them (no boundaries, or a step that never ends): the oldest
            // go, so that memory stays bounded.
            self.pending.drain(..MAX_PENDING / 4);
            self.pending_sorted = self.pending_sorted.saturating_sub(MAX_PENDING / 4);
            self.capped += (MAX_PENDING / 4) as u64;
        }
        self.pending.push(a);
    }

    /// Returns the iterations that are complete: marked ones that ended at least `settle_ns`
    /// before `now_ns` (CLOCK_MONOTONIC; CUPTI delivers records in buffers, so a step's records
    /// can arrive after later steps' — the settle time covers the shim's flush period with room
    /// to spare), or all of them when `flush`. Without markers, detected iterations (see the
    /// module docs) up to the last boundary. Activities of returned iterations are released;
    /// records that arrive for an iteration already returned are counted in
    /// [`TraceAssembler::late`]. Linear in the activities pending (after sorting them).
    pub fn take_iterations(&mut self, now_ns: u64, settle_ns: u64, flush: bool) -> Vec<Iteration> {
        self.place_unstamped();
        if self.marked {
            self.take_marked(now_ns, settle_ns, flush)
        } else {
            self.take_detected(now_ns, settle_ns, flush)
        }
    }

    /// Places the pending activities that have no launch stamp by the stamps around them (see
    /// [`LaunchStamps`]); those with no stamp after them yet wait for the next call.
    fn place_unstamped(&mut self) {
        let unplaced = |a: &Activity| {
            a.launch_ns == 0 && a.correlation_id != 0 && a.kind != ActivityKind::Event
        };
        if self.stamps.is_empty() || !self.pending.iter().any(unplaced) {
            return;
        }
        // Which of them found their GPU idle when they started: the GPU was waiting for their
        // launch, so they were launched just before they started. Idle: no activity that
        // started before it on its device (by start, then position) was still running
        // IDLE_BEFORE_NS before it started. The activities' keys are sorted by value, not
        // indices by a key looked up in `pending` (that indirect sort on each call was 12% of
        // the pipeline on the H200 eager fixture); pending is in launch order, which is mostly
        // start order, so the stable sort mostly merges runs.
        // The keys are packed in one integer, device above start above position (starts are
        // at most MAX_TS_NS < 2^64): half the size of a tuple with the end, one comparison.
        let mut order: Vec<u128> = Vec::with_capacity(self.pending.len());
        order.extend(
            self.pending
                .iter()
                .enumerate()
                .filter(|(_, a)| a.kind != ActivityKind::Event && a.end_ns > a.start_ns)
                .map(|(i, a)| {
                    (u128::from(a.device) << 96) | (u128::from(a.start_ns) << 32) | i as u128
                }),
        );
        order.sort();
        let mut waited = vec![false; self.pending.len()];
        let mut busy: Option<(u32, u64)> = None;
        for &k in &order {
            let (d, start, i) = ((k >> 96) as u32, (k >> 32) as u64, k as u32);
            let end = self.pending[i as usize].end_ns;
            match busy {
                Some((bd, until)) if bd == d => {
                    waited[i as usize] = start > until + IDLE_BEFORE_NS;
                    busy = Some((d, until.max(end)));
                }
                _ => busy = Some((d, end)),
            }
        }
        for (i, (a, waited)) in self.pending.iter_mut().zip(waited).enumerate() {
            if !unplaced(a) {
                continue;
            }
            if let Some((t, op)) = self.stamps.place(a.correlation_id, a.start_ns, waited) {
                // Its anchor moves: the activities in order end before it.
                self.pending_sorted = self.pending_sorted.min(i);
                a.launch_ns = t;
                a.placed = true;
                if a.op_id == 0 {
                    a.op_id = op;
                }
            }
        }
    }

    /// Sorts the pending activities by anchor (cheap when they already are, as records mostly
    /// arrive in order).
    fn sort_pending(&mut self) {
        let n = self.pending.len();
        let s = self.pending_sorted.min(n);
        self.pending_sorted = n;
        if self.pending[s.saturating_sub(1)..].is_sorted_by_key(Activity::anchor_ns) {
            return;
        }
        // The keys are sorted, not the 80-byte activities (the stable sort moved each several
        // times through a buffer half as large as pending: 9% of the pipeline on the H200 eager
        // fixture), and only those after the ordered ones: stable, then merged with the
        // ordered ones from the first that goes after one of them, the ordered one first among
        // equal anchors (its position is lower). That is the stable order by anchor.
        let mut tail: Vec<(u64, u32)> = self.pending[s..]
            .iter()
            .zip(s..)
            .map(|(a, i)| (a.anchor_ns(), i as u32))
            .collect();
        tail.sort_by_key(|k| k.0);
        let first = tail[0].0;
        let from = self.pending[..s].partition_point(|a| a.anchor_ns() <= first);
        let mut order: Vec<u32> = Vec::with_capacity(n - from);
        let mut j = 0;
        for i in from..s {
            let key = (self.pending[i].anchor_ns(), i as u32);
            while j < tail.len() && tail[j] < key {
                order.push(tail[j].1);
                j += 1;
            }
            order.push(i as u32);
        }
        order.extend(tail[j..].iter().map(|k| k.1));
        // Then each activity is moved once, along the cycles of the permutation: position
        // `from + k` takes the activity at `order[k]`; a position done is marked with its own
        // index.
        let pending = &mut self.pending[from..];
        let from = from as u32;
        for start in 0..order.len() {
            if order[start] - from == start as u32 {
                continue;
            }
            let first = pending[start];
            let mut k = start;
            loop {
                let at = (order[k] - from) as usize;
                order[k] = from + k as u32;
                if at == start {
                    pending[k] = first;
                    break;
                }
                pending[k] = pending[at];
                k = at;
            }
        }
    }

    /// Summarises each `(step, begin, end)` window over the sorted pending activities (each
    /// activity in at most one window, the first that holds it) and removes what was used.
    /// `end_inclusive`: whether an activity anchored at `end` belongs to the window.
    fn cut(
        &mut self,
        windows: &[(u64, u64, u64)],
        marked: bool,
        end_inclusive: bool,
    ) -> Vec<Iteration> {
        let mut out = Vec::with_capacity(windows.len());
        let mut used: Vec<(usize, usize)> = Vec::with_capacity(windows.len());
        for &(step, b, e) in windows {
            let lo = self.pending.partition_point(|a| a.anchor_ns() < b);
            let hi = if end_inclusive {
                self.pending.partition_point(|a| a.anchor_ns() <= e)
            } else {
                self.pending.partition_point(|a| a.anchor_ns() < e)
            };
            let lo = lo.max(used.last().map_or(0, |u| u.1));
            let hi = hi.max(lo);
            let acts = std::mem::take(&mut self.sorted);
            let it = self.summarise_range(step, marked, b, e, lo..hi, acts);
            out.push(it);
            used.push((lo, hi));
        }
        // Keep what no window used, in order, moved down in place (a new vector of what was
        // kept came from fresh pages on each call).
        if used.iter().any(|u| u.1 > u.0) {
            let (mut kept, mut next) = (0, 0);
            for &(lo, hi) in &used {
                let lo = lo.max(next);
                self.pending.copy_within(next..lo, kept);
                kept += lo - next;
                next = next.max(hi);
            }
            let len = self.pending.len();
            self.pending.copy_within(next..len, kept);
            self.pending.truncate(kept + len - next);
            // What is kept keeps its order.
            self.pending_sorted = if self.pending_sorted == len {
                self.pending.len()
            } else {
                0
            };
        }
        out
    }

    fn take_marked(&mut self, now_ns: u64, settle_ns: u64, flush: bool) -> Vec<Iteration> {
        let horizon = now_ns.saturating_sub(settle_ns);
        let mut ready: Vec<(u64, u64, u64)> = self
            .steps
            .iter()
            .filter_map(|(&step, &(b, e))| Some((step, b?, e?)))
            .filter(|&(_, _, e)| flush || e <= horizon)
            .collect();
        self.sort_pending();
        let mut out = Vec::new();
        if !ready.is_empty() {
            for (step, _, _) in &ready {
                self.steps.remove(step);
            }
            ready.sort_by_key(|&(step, b, _)| (b, step));
            out = self.cut(&ready, true, true);
        }
        // Activities launched before the oldest open step belong to no iteration: between two
        // steps, or late for one already returned.
        if let Some((_, (Some(b), _))) = self.steps.iter().next() {
            let b = *b;
            let late = self.pending.partition_point(|a| a.anchor_ns() < b);
            self.pending.drain(..late);
            self.pending_sorted = self.pending_sorted.saturating_sub(late);
            self.late += late as u64;
        }
        out.sort_by_key(|i| i.start_ns);
        out
    }

    /// The period of the pending kernels' name sequence: the one found last while it still
    /// holds, else a new search (at most once per [`PERIOD_WINDOW`] / 4 new kernels after a
    /// failed one, as a search compares up to [`PERIOD_WINDOW`]² / 3 pairs).
    fn kernel_period(&mut self, names: &[u32]) -> Option<usize> {
        if let Some(p) = self.period {
            let recent = tail(names);
            if cycle::period_score(recent, p) >= cycle::PERIOD_MATCH && !one_name(recent, p) {
                return Some(p);
            }
            self.period = None;
        }
        if names.len() < self.period_failed_at + PERIOD_WINDOW / 4 && self.period_failed_at > 0 {
            return None;
        }
        self.period = detect_period(names);
        self.period_failed_at = if self.period.is_some() {
            0
        } else {
            names.len()
        };
        self.period
    }

    /// GPU idle time before each pending activity (in their launch order), ns: how long the
    /// GPU had been idle when it started (0 for events and the first one).
    fn gpu_idle_before(&self) -> Vec<u64> {
        let mut busy_until = 0u64;
        self.pending
            .iter()
            .map(|a| {
                if a.kind == ActivityKind::Event || a.end_ns <= a.start_ns {
                    return 0;
                }
                let i = if busy_until == 0 {
                    0
                } else {
                    a.start_ns.saturating_sub(busy_until)
                };
                busy_until = busy_until.max(a.end_ns);
                i
            })
            .collect()
    }

    fn take_detected(&mut self, now_ns: u64, settle_ns: u64, flush: bool) -> Vec<Iteration> {
        self.sort_pending();
        let horizon = if flush {
            u64::MAX
        } else {
            now_ns.saturating_sub(settle_ns)
        };
        let boundaries = match self.cycle.boundaries(&self.pending, horizon) {
            cycle::Found::Boundaries(b) => b,
            cycle::Found::Wait if !flush => return Vec::new(),
            cycle::Found::Wait | cycle::Found::Nothing => {
                let mut b = self.graph_or_kernel_boundaries();
                b.retain(|&t| t <= horizon);
                b
            }
        };
        let cut = (boundaries.len() >= 2).then(|| boundaries[boundaries.len() - 1]);
        let windows: Vec<(u64, u64, u64)> = boundaries
            .windows(2)
            .filter(|w| self.ran_compute(w[0], w[1]) || !self.depth.traced(w[0], w[1]))
            .enumerate()
            .map(|(k, w)| (self.next_detected + k as u64, w[0], w[1]))
            .collect();
        self.next_detected += windows.len() as u64;
        if let Some(cut) = cut {
            self.cycle.retire(cut);
        }
        let out = self.cut(&windows, false, false);
        if flush {
            self.pending.clear();
            self.pending_sorted = 0;
        } else if let Some(cut) = cut {
            let before = self.pending.partition_point(|a| a.anchor_ns() < cut);
            self.pending.drain(..before);
            self.pending_sorted = self.pending_sorted.saturating_sub(before);
        }
        out
    }

    /// Whether a pending activity anchored from `b` to `e` ran compute (a kernel or a graph).
    /// A detected iteration without any, while the shim traced kernels all along, is no
    /// training step (`take_detected` leaves it out): a period of copies alone. Moving a model
    /// to the GPU copies each layer's parameters in the same sizes, a period the copies' tokens
    /// lock on (H100, 2026-12-07: a GPT under `torch.compile` started with 7 such "iterations"
    /// of ~3 ms before compilation; `cycle.rs`). Left out before they are summarised: a flood
    /// of copies at a steady pace (one an iteration) would otherwise make and drop an
    /// iteration per copy.
    fn ran_compute(&self, b: u64, e: u64) -> bool {
        let lo = self.pending.partition_point(|a| a.anchor_ns() < b);
        let hi = self.pending.partition_point(|a| a.anchor_ns() < e);
        self.pending[lo..hi.max(lo)].iter().any(|a| {
            matches!(
                a.kind,
                ActivityKind::Kernel | ActivityKind::GraphKernel | ActivityKind::Graph
            )
        })
    }

    /// Boundaries where the copies, fills and graph launches give none: each launch of the
    /// graph launched most often, else the period of the kernel sequence.
    fn graph_or_kernel_boundaries(&mut self) -> Vec<u64> {
        // The graph launched most often; among equals the one created first (lowest id), so
        // that the choice does not depend on hash order.
        match self
            .graph_counts
            .iter()
            .max_by_key(|(g, n)| (**n, std::cmp::Reverse(**g)))
        {
            Some((&g, &n)) if n >= 2 => {
                // Its launches: graph-level records, and node-level kernels (all nodes of a
                // launch share the launch's time).
                // A launch starts the iteration together with the copies launched just before
                // it (the batch), from the one the GPU waited longest for.
                let idle = self.gpu_idle_before();
                let mut b: Vec<u64> = Vec::new();
                for (k, a) in self.pending.iter().enumerate() {
                    let launch = a.graph_id == g
                        && (a.kind == ActivityKind::Graph
                            || a.kind == ActivityKind::GraphKernel && a.stamped_launch_ns() != 0);
                    if !launch || b.last() == Some(&a.anchor_ns()) {
                        continue;
                    }
                    let mut from = k;
                    while from > 0 && self.pending[from - 1].kind == ActivityKind::Memory {
                        from -= 1;
                    }
                    let at = (from..=k)
                        .max_by_key(|&j| (idle[j], std::cmp::Reverse(j)))
                        .unwrap_or(k);
                    b.push(self.pending[at].anchor_ns().min(a.anchor_ns()));
                }
                b.dedup();
                b
            }
            _ => {
                // GPU idle before every activity, and where the kernels are.
                let idle = self.gpu_idle_before();
                let kernels: Vec<usize> = self
                    .pending
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| a.kind == ActivityKind::Kernel)
                    .map(|(k, _)| k)
                    .collect();
                // For kernel `i`: the activity launched since the kernel before it (the
                // batch's copy, a read-back) that the GPU waited longest for, and that wait.
                let entry = |i: usize| -> (u64, usize) {
                    let from = if i == 0 { 0 } else { kernels[i - 1] + 1 };
                    (from..=kernels[i])
                        .map(|k| (idle[k], k))
                        .max_by_key(|&(w, k)| (w, std::cmp::Reverse(k)))
                        .unwrap_or((0, kernels[i]))
                };
                let names: Vec<u32> = self
                    .pending
                    .iter()
                    .filter(|a| a.kind == ActivityKind::Kernel)
                    .map(|a| a.name_id)
                    .collect();
                match self.kernel_period(&names) {
                    Some(p) => {
                        // The iteration starts where the GPU waited longest for work in the
                        // phase of the period (the step boundary: the loader, the loop).
                        let phase = (0..p)
                            .max_by_key(|&r| {
                                let (sum, n) = (r.max(1)..kernels.len())
                                    .step_by(p)
                                    .fold((0u64, 0u64), |(s, n), i| (s + entry(i).0, n + 1));
                                (sum / n.max(1), std::cmp::Reverse(r))
                            })
                            .unwrap_or(0);
                        (phase..kernels.len())
                            .step_by(p)
                            .map(|i| self.pending[entry(i).1].anchor_ns())
                            .collect()
                    }
                    None => Vec::new(),
                }
            }
        }
    }

    /// Summarises the pending activities in `range` as one iteration from `b` to `e`;
    /// `sorted` is scratch space, handed back.
    fn summarise_range(
        &mut self,
        step: u64,
        marked: bool,
        b: u64,
        e: u64,
        range: std::ops::Range<usize>,
        mut sorted: Vec<Activity>,
    ) -> Iteration {
        sorted.clear();
        let acts = &self.pending[range];
        if acts.is_sorted_by_key(|a| (a.start_ns, a.end_ns)) {
            sorted.extend_from_slice(acts);
        } else {
            // By (start, end): their keys are sorted, then each activity copied once (the
            // unstable sort of the 80-byte activities was 5% of the pipeline on the H200
            // eager fixture). Distinct keys have one order, that of any sort; activities
            // that tie are sorted as they were, so that the tie goes the same way.
            let mut keys = std::mem::take(&mut self.range_keys);
            keys.clear();
            keys.extend(
                acts.iter()
                    .enumerate()
                    .map(|(i, a)| (a.start_ns, a.end_ns, i as u32)),
            );
            keys.sort_by_key(|k| (k.0, k.1));
            if keys
                .windows(2)
                .all(|w| (w[0].0, w[0].1) != (w[1].0, w[1].1))
            {
                sorted.extend(keys.iter().map(|k| acts[k.2 as usize]));
            } else {
                sorted.extend_from_slice(acts);
                sorted.sort_unstable_by_key(|a| (a.start_ns, a.end_ns));
            }
            self.range_keys = keys;
        }
        let it = self.summarise(step, marked, b, e, &sorted);
        self.sorted = sorted;
        it
    }

    /// One iteration from its activities, sorted by start, on the GPU's timeline (see
    /// [`GpuTimeline`]): busy time on the critical path, GPU idle because nothing was queued
    /// (the host was late) and idle while work was queued (a dependency), per operator and
    /// for the iteration; queueing (work waiting behind earlier work) is never counted.
    fn summarise(
        &mut self,
        step: u64,
        marked: bool,
        b: u64,
        e: u64,
        acts: &[Activity],
    ) -> Iteration {
        let mut busy = 0u64;
        let mut gaps = 0u64;
        let mut waits = 0u64;
        let mut touched = std::mem::take(&mut self.touched);
        touched.clear();
        let mut lat: Vec<u64> = Vec::new();
        let (mut kernels, mut graph_launches, mut memory_ops) = (0u32, 0u32, 0u32);
        let mut graph_nodes = 0u32;
        let (mut memory_ns, mut compute_ns, mut comm_ns, mut comm_kernels) =
            (0u64, 0u64, 0u64, 0u32);
        let mut by_device: [(u32, u64); 4] = [(u32::MAX, 0); 4];
        // The idle time before the iteration's first activity, and where the GPU was free from
        // then (the start of the iteration's period on the GPU).
        let mut first: Option<(u64, u64)> = None;
        // Intervals of communication and of compute, for their overlap (buffers reused).
        let mut comm_iv = std::mem::take(&mut self.comm_iv);
        let mut compute_iv = std::mem::take(&mut self.compute_iv);
        // When the GPU got through the work queued before this iteration's.
        let free_before = self.timeline.free.iter().map(|f| f.1).max().unwrap_or(0);
        for a in acts {
            let d = a.duration_ns();
            if let Some(slot) = by_device
                .iter_mut()
                .find(|s| s.0 == a.device || s.0 == u32::MAX)
            {
                slot.0 = a.device;
                // Saturating: hostile or corrupt records may claim any duration (found by
                // fuzz/fuzz_targets/replay.rs; overflow panicked in debug builds).
                slot.1 = slot.1.saturating_add(d);
            }
            if a.kind == ActivityKind::Event || a.end_ns <= a.start_ns {
                continue;
            }
            let Placed {
                free,
                critical,
                late,
                wait,
                launch_latency,
            } = self.timeline.place(a);
            busy = busy.saturating_add(critical);
            let (late, wait) = if first.is_none() {
                // The idle time before the iteration's first activity is the iteration's own
                // (data loading, the host between steps), not its operator's.
                let idle = match free {
                    Some(_) => late + wait,
                    // Nothing seen on this GPU before: from the iteration's host-side start.
                    None => a.start_ns.saturating_sub(b),
                };
                first = Some((idle, free.unwrap_or(b)));
                (0, 0)
            } else {
                gaps = gaps.saturating_add(late);
                waits = waits.saturating_add(wait);
                (late, wait)
            };
            let i = self.op_index(a) as usize;
            if i >= self.acc.len() {
                self.acc.resize(i + 64, OpAcc::default());
            }
            let acc = &mut self.acc[i];
            if acc.count == 0 {
                touched.push(i as u32);
            }
            acc.gpu_ns = acc.gpu_ns.saturating_add(d);
            acc.critical_ns = acc.critical_ns.saturating_add(critical);
            acc.count += 1;
            acc.gap_ns = acc.gap_ns.saturating_add(late);
            acc.wait_ns = acc.wait_ns.saturating_add(wait);
            acc.bytes = acc.bytes.saturating_add(a.bytes);
            if let Some(o) = a.occupancy {
                acc.occ_weighted += f64::from(o) * d as f64;
                acc.occ_ns = acc.occ_ns.saturating_add(d);
            }
            if let Some(l) = launch_latency.filter(|_| a.kind != ActivityKind::GraphKernel) {
                lat.push(l);
                acc.launch_sum = acc.launch_sum.saturating_add(l);
                acc.launch_count += 1;
            }
            match a.kind {
                ActivityKind::Kernel | ActivityKind::GraphKernel => {
                    kernels += 1;
                    graph_nodes += u32::from(a.kind == ActivityKind::GraphKernel);
                    if self.table.info[i].1 == OpKind::Communication {
                        comm_ns = comm_ns.saturating_add(d);
                        comm_kernels += 1;
                        comm_iv.push((a.start_ns, a.end_ns));
                    } else {
                        compute_ns = compute_ns.saturating_add(d);
                        compute_iv.push((a.start_ns, a.end_ns));
                    }
                }
                ActivityKind::Graph => {
                    graph_launches += 1;
                    compute_ns = compute_ns.saturating_add(d);
                    compute_iv.push((a.start_ns, a.end_ns));
                }
                ActivityKind::Memory => {
                    memory_ops += 1;
                    memory_ns = memory_ns.saturating_add(d);
                }
                ActivityKind::Event => {}
            }
        }
        let comm_overlap_ns = if comm_iv.is_empty() {
            0
        } else {
            intersection_ns(&mut comm_iv, &mut compute_iv)
        };
        comm_iv.clear();
        compute_iv.clear();
        self.comm_iv = comm_iv;
        self.compute_iv = compute_iv;
        if !lat.is_sorted() {
            lat.sort_unstable();
        }
        if lat.len() > MAX_ITERATION_LATENCIES {
            // An even sample of the sorted latencies keeps their quantiles.
            let n = lat.len();
            let m = MAX_ITERATION_LATENCIES;
            lat = (0..m).map(|k| lat[k * (n - 1) / (m - 1)]).collect();
        }
        let mut occ = (0.0, 0u64);
        let mut ops = Vec::with_capacity(touched.len());
        for &i in &touched {
            let acc = std::mem::take(&mut self.acc[i as usize]);
            occ.0 += acc.occ_weighted;
            occ.1 += acc.occ_ns;
            let (label, kind) = &self.table.info[i as usize];
            ops.push(OpTime {
                op: label.clone(),
                kind: *kind,
                gpu_ns: acc.gpu_ns,
                critical_ns: acc.critical_ns,
                kernels: acc.count,
                occupancy: (acc.occ_ns > 0).then(|| acc.occ_weighted / acc.occ_ns as f64),
                gap_ns: acc.gap_ns,
                wait_ns: acc.wait_ns,
                launch_latency_ns: (acc.launch_count > 0)
                    .then(|| acc.launch_sum / u64::from(acc.launch_count)),
                bytes: acc.bytes,
            });
        }
        ops.sort_unstable_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then_with(|| a.op.cmp(&b.op)));
        if ops.len() > MAX_ITERATION_OPS {
            fold_small_ops(&mut ops);
        }
        self.touched = touched;
        // The GPU span also counts CUDA events the script recorded on its streams.
        let span_start = acts.iter().map(|a| a.start_ns).min();
        let span_end = acts.iter().map(|a| a.end_ns).max();
        let device = by_device
            .iter()
            .filter(|s| s.0 != u32::MAX)
            .max_by_key(|s| (s.1, std::cmp::Reverse(s.0)))
            .map(|s| s.0);
        let (idle_before_first_ns, period_from) = first.unwrap_or((e.saturating_sub(b), b));
        let gpu_end = device
            .and_then(|d| self.timeline.free_at(d))
            .or(span_end)
            .unwrap_or(b);
        let mut it = Iteration {
            step,
            marked,
            start_ns: b,
            end_ns: e,
            gpu_busy_ns: busy,
            gpu_period_ns: gpu_end.saturating_sub(period_from),
            gpu_start_ns: span_start.unwrap_or(b),
            gpu_end_ns: span_end.unwrap_or(b),
            kernels,
            graph_nodes,
            graph_launches,
            memory_ops,
            memory_ns,
            compute_ns,
            comm_ns,
            comm_kernels,
            comm_overlap_ns,
            idle_before_first_ns,
            gaps_ns: gaps,
            wait_ns: waits,
            launch_latencies_ns: lat,
            ops,
            occupancy: (occ.1 > 0).then(|| occ.0 / occ.1 as f64),
            // Everything it launched was traced only if the shim still traced kernels when the
            // GPU ran them: a CPU running ahead launches work that runs after a sample window
            // closed (CUPTI records a kernel when it runs), and such an iteration would keep
            // only its first kernels, or none.
            traced: self.depth.traced(
                b,
                e.max(gpu_end.max(free_before).saturating_add(TRACED_MARGIN_NS)),
            ) && (self.depth.changes.is_empty()
                || graph_launches > 0
                || graph_nodes > 0
                || self.complete(kernels)),
            device,
            gpu: None,
            ..Iteration::default()
        };
        let whole = it.traced || it.graph_launches > 0;
        it.gpu_period_whole = whole && !self.last_untimed;
        self.last_untimed = !whole;
        it
    }

    /// Whether an iteration without CUDA graphs traced at kernel depth (by a shim that says its
    /// depth: one without CUPTI marks steps only) with `launches` kernels
    /// holds all of them: not when it has under [`INCOMPLETE_SHARE`] of the median of the last
    /// complete ones (on the H200, CUPTI delivered for seconds at a time only the kernels
    /// launched by the main thread, none of the autograd thread's backward: 48 or 55 of 185 per
    /// step; the GPU then looks idle where it ran them). After [`RESET_AFTER`] refused in a row
    /// the job changed: the counts start over.
    fn complete(&mut self, launches: u32) -> bool {
        let mut sorted: Vec<u32> = self.recent_launches.iter().copied().collect();
        sorted.sort_unstable();
        // No kernel at all is never a whole iteration: a CPU running ahead of the GPU, with
        // records delivered late (on the H200 every kernel record came 6-18 s after its
        // iteration), would otherwise make an iteration of pure "GPU idle" and start the median.
        let complete = launches > 0
            && (sorted.len() < 4
                || f64::from(launches) >= INCOMPLETE_SHARE * f64::from(sorted[sorted.len() / 2]));
        if complete {
            self.refused_in_a_row = 0;
            self.recent_launches.push_back(launches);
            if self.recent_launches.len() > RECENT_LAUNCHES {
                self.recent_launches.pop_front();
            }
        } else {
            self.refused_in_a_row += 1;
            if self.refused_in_a_row >= RESET_AFTER {
                self.recent_launches.clear();
                self.refused_in_a_row = 0;
            }
        }
        complete
    }
}

/// Below this share of the median launches of recent complete iterations, an iteration is
/// taken as partly traced.
pub const INCOMPLETE_SHARE: f64 = 0.7;

/// Complete traced iterations whose launch counts make that median.
const RECENT_LAUNCHES: usize = 63;

/// Iterations refused in a row after which the counts start over.
const RESET_AFTER: u32 = 64;

/// Launch stamps a local rate of API calls is measured over.
const RATE_SPAN: usize = 64;

/// Stamps further apart than this in time are not interpolated between (tracing was off between
/// them): an activity is placed from the nearer one.
const WIDE_BRACKET_NS: u64 = 20_000_000;

/// GPU idle before an activity above which the GPU was waiting for its launch (the driver
/// dispatches within 5–20 µs on an H200; a pageable copy stages first).
const IDLE_BEFORE_NS: u64 = 50_000;

/// Correlation ids past the last stamp an activity is still placed from it.
pub const MAX_EXTRAPOLATE: u32 = 4096;

/// Launch stamps a live assembler keeps for placing the activities that have none (the oldest
/// are dropped: about three seconds of a launch-heavy job traced at kernel depth, far more than
/// the GPU runs behind; 256 KiB).
const MAX_STAMPS: usize = 1 << 14;

/// The launches the shim stamped, by correlation id: where an activity that carries no launch
/// time of its own (a memcpy or memset, whose API calls the shim does not stamp; a kernel
/// whose stamp was missed) was launched. Correlation ids follow the order of the API calls,
/// so such an activity was launched between the stamped launches around it. Placing it by its
/// GPU start instead puts it as many iterations late as the CPU runs ahead of the GPU.
#[derive(Clone, Debug)]
pub struct LaunchStamps {
    /// (correlation id, launch ns, operator id): by correlation id up to `sorted`, then as
    /// they came (sorted when next read: records arrive per CUPTI buffer, so a stamp is often
    /// older than the last one, and inserting each in place moved the whole tail: 15% of the
    /// pipeline on the H200 eager fixture).
    stamps: Vec<(u32, u64, u32)>,
    /// How many of `stamps` are in order (distinct ids, at most `most`).
    sorted: usize,
    /// The most kept (the oldest ids go first), from [`LaunchStamps::trim`].
    most: usize,
    /// Scratch of `settle`: the ordered stamps that the new ones are merged into.
    merge: Vec<(u32, u64, u32)>,
    /// Where the last search by id ended: the next starts there (the activities placed one
    /// after another have ids close together; a binary search over all stamps each time was
    /// 3% of the pipeline on the H200 eager fixture).
    hint: std::cell::Cell<usize>,
    /// The last rate measured back and forth (stamp index, rate), until the stamps change:
    /// the copies of one batch sit between the same two stamps.
    rates: std::cell::Cell<[(usize, Option<f64>); 2]>,
}

/// No rate measured yet (see [`LaunchStamps`]'s `rates`).
const NO_RATES: [(usize, Option<f64>); 2] = [(usize::MAX, None); 2];

impl Default for LaunchStamps {
    fn default() -> Self {
        Self {
            stamps: Vec::new(),
            sorted: 0,
            most: usize::MAX,
            merge: Vec::new(),
            hint: std::cell::Cell::new(0),
            rates: std::cell::Cell::new(NO_RATES),
        }
    }
}

impl LaunchStamps {
    /// A stamped launch, in operator `op_id` (0: none). A second stamp of an id already kept
    /// is ignored (node-level kernels of one graph launch share its id).
    pub fn push(&mut self, correlation_id: u32, launch_ns: u64, op_id: u32) {
        if correlation_id == 0 || launch_ns == 0 {
            return;
        }
        let in_order = self.sorted == self.stamps.len();
        match self.stamps.last() {
            Some(&(c, ..)) if c == correlation_id => return,
            Some(&(c, ..)) if in_order && c < correlation_id => self.sorted += 1,
            None => self.sorted += 1,
            _ => {}
        }
        self.stamps.push((correlation_id, launch_ns, op_id));
        self.rates.set(NO_RATES);
        if self.stamps.len() > self.most.saturating_mul(2) {
            self.settle();
        }
    }

    /// Keeps at most `most` stamps from now on (the oldest ids are dropped when they are next
    /// read, or when twice as many came).
    pub fn trim(&mut self, most: usize) {
        self.most = most;
        if self.stamps.len() > most.saturating_mul(2) {
            self.settle();
        }
    }

    /// Puts the stamps in order: by id, the first of each id, the newest `most`.
    fn settle(&mut self) {
        self.rates.set(NO_RATES);
        let sorted = self.sorted;
        if sorted < self.stamps.len() {
            // Stable: of two stamps of one id, the first that came is kept. Only the new ones
            // are sorted, then merged into the ordered part from the first of them on (most
            // ids come in order: sorting all of them, with a buffer as large, was 5% of the
            // pipeline on the H200 eager fixture).
            self.stamps[sorted..].sort_by_key(|s| s.0);
            let first = self.stamps[sorted].0;
            let from = self.stamps[..sorted].partition_point(|s| s.0 <= first);
            // The ordered ones before `from` are distinct: only from the last of them on can
            // an id repeat.
            let dedup_from = from.saturating_sub(1);
            if from < sorted {
                let older = &mut self.merge;
                older.clear();
                older.extend_from_slice(&self.stamps[from..sorted]);
                let (mut i, mut j, mut w) = (0, sorted, from);
                while i < older.len() && j < self.stamps.len() {
                    // An older stamp goes first among equal ids.
                    if older[i].0 <= self.stamps[j].0 {
                        self.stamps[w] = older[i];
                        i += 1;
                    } else {
                        self.stamps[w] = self.stamps[j];
                        j += 1;
                    }
                    w += 1;
                }
                // The new ones left are in place already.
                self.stamps[w..w + older.len() - i].copy_from_slice(&older[i..]);
            }
            // Of equal ids, the first stays (as `dedup_by_key` over all of them).
            let mut kept = dedup_from + 1;
            for r in dedup_from + 1..self.stamps.len() {
                if self.stamps[r].0 != self.stamps[kept - 1].0 {
                    self.stamps[kept] = self.stamps[r];
                    kept += 1;
                }
            }
            self.stamps.truncate(kept);
        }
        if self.stamps.len() > self.most {
            self.stamps.drain(..self.stamps.len() - self.most);
        }
        self.sorted = self.stamps.len();
    }

    /// Where the activity with `correlation_id` that started on the GPU at `start_ns` was
    /// launched, never after its start: between the stamps before and after it, from the one
    /// nearer in correlation id at the rate of API calls around it (at most [`MAX_EXTRAPOLATE`]
    /// ids past the last stamp; `None` beyond: ask again when more records came). And in which
    /// operator: the one of the launches before and after it when they are close in time and
    /// share one (operators are scopes on the launching thread; 0 otherwise).
    ///
    /// `waited`: the GPU was idle when it started (it was waiting for this launch), so it was
    /// launched just before its start, within the stamps around it.
    pub fn place(
        &mut self,
        correlation_id: u32,
        start_ns: u64,
        waited: bool,
    ) -> Option<(u64, u32)> {
        if correlation_id == 0 || self.stamps.is_empty() {
            return None;
        }
        if self.sorted < self.stamps.len() || self.stamps.len() > self.most {
            self.settle();
        }
        let c = correlation_id;
        let at = self.search(c);
        let after = self.stamps.get(at).copied();
        let before = at.checked_sub(1).and_then(|i| self.stamps.get(i)).copied();
        let back = |(c0, t0, _): (u32, u64, u32)| {
            self.rate(at - 1, false)
                .map(|r| t0.saturating_add((f64::from(c - c0) / r) as u64))
        };
        let fwd = |(c1, t1, _): (u32, u64, u32)| {
            self.rate(at, true)
                .map(|r| t1.saturating_sub((f64::from(c1 - c) / r) as u64))
        };
        let (t, op) = match (before, after) {
            (_, Some((c1, t1, op))) if c1 == c => (t1, op),
            (before, after) if waited => {
                let lo = before.map_or(1, |s| s.1);
                let hi = after.map_or(u64::MAX, |s| s.1);
                (start_ns.clamp(lo, hi.max(lo)), 0)
            }
            (Some(s0 @ (c0, t0, op0)), Some(s1 @ (c1, t1, op1))) => {
                // From the nearer one: API calls come in bursts with the host's waits between
                // them (a batch's copy right after the wait for the loader, right before the
                // step's first kernel), which a straight line between the two would cross.
                let near = if c - c0 <= c1 - c { back(s0) } else { fwd(s1) };
                let lerp = t0
                    + (t1.saturating_sub(t0) as f64 * f64::from(c - c0) / f64::from(c1 - c0))
                        as u64;
                let close = t1.saturating_sub(t0) <= WIDE_BRACKET_NS && op0 == op1;
                // (Stamps of one thread follow their ids; across threads a stamp can be a little
                // out of order.)
                let (lo, hi) = (t0.min(t1), t0.max(t1));
                (
                    near.unwrap_or(lerp).clamp(lo, hi),
                    if close { op0 } else { 0 },
                )
            }
            (None, Some(s1 @ (_, t1, _))) => (fwd(s1).unwrap_or(t1.saturating_sub(1)), 0),
            (Some(s0 @ (c0, ..)), None) if c - c0 <= MAX_EXTRAPOLATE => (back(s0)?, 0),
            (_, None) => return None,
        };
        Some((t.min(start_ns).max(1), op))
    }

    /// API calls per ns around stamp `i`, over up to [`RATE_SPAN`] stamps after it (`forward`)
    /// or before it, none of them further apart than [`WIDE_BRACKET_NS`].
    fn rate(&self, i: usize, forward: bool) -> Option<f64> {
        let s = &self.stamps;
        if i >= s.len() {
            return None;
        }
        let memo = self.rates.get();
        if memo[usize::from(forward)].0 == i {
            return memo[usize::from(forward)].1;
        }
        let near = |a: usize, b: usize| s[b].1.saturating_sub(s[a].1) <= WIDE_BRACKET_NS;
        let (mut lo, mut hi) = (i, i);
        if forward {
            let last = (i + RATE_SPAN).min(s.len() - 1);
            while hi < last && near(hi, hi + 1) {
                hi += 1;
            }
        } else {
            let first = i.saturating_sub(RATE_SPAN);
            while lo > first && near(lo - 1, lo) {
                lo -= 1;
            }
        }
        let (x, y) = (s[lo], s[hi]);
        let rate = match (y.0.checked_sub(x.0), y.1.checked_sub(x.1)) {
            (Some(dc), Some(dt)) if dc > 0 && dt > 0 => Some(f64::from(dc) / dt as f64),
            _ => None,
        };
        let mut memo = memo;
        memo[usize::from(forward)] = (i, rate);
        self.rates.set(memo);
        rate
    }

    /// How many stamps have an id below `c` (they are in order), searched outwards from where
    /// the last search ended.
    fn search(&self, c: u32) -> usize {
        let s = &self.stamps;
        let below = |i: usize| s[i].0 < c;
        let h = self.hint.get().min(s.len());
        let (lo, hi) = if h == 0 || below(h - 1) {
            // At `h` or after: `hi` doubles its distance until it is not below.
            let (mut lo, mut step) = (h, 1);
            loop {
                let hi = lo.saturating_add(step).min(s.len());
                if hi == s.len() || !below(hi) {
                    break (lo, hi);
                }
                lo = hi + 1;
                step *= 2;
            }
        } else {
            // Before `h`: `lo` doubles its distance until it is below.
            let (mut hi, mut step) = (h - 1, 1);
            loop {
                if hi < step {
                    break (0, hi);
                }
                if below(hi - step) {
                    break (hi - step + 1, hi);
                }
                hi -= step;
                step *= 2;
            }
        };
        let at = lo + s[lo..hi].partition_point(|x| x.0 < c);
        self.hint.set(at);
        at
    }

    /// Stamps kept.
    pub fn len(&mut self) -> usize {
        self.settle();
        self.stamps.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }
}

/// How long kernel tracing must have stayed on after the GPU finished an iteration's work for
/// the iteration to count as traced: its last records can reach the shim's flush when the depth
/// goes down (a flush is a few ms).
pub const TRACED_MARGIN_NS: u64 = 20_000_000;

/// Depth changes kept (the oldest are dropped; iterations older than them are long done).
const MAX_DEPTH_CHANGES: usize = 4096;

/// The shim's tracing depth over time, from its depth records.
#[derive(Clone, Debug, Default)]
pub struct DepthLog {
    /// (from, depth), in time order.
    changes: std::collections::VecDeque<(u64, u32)>,
}

impl DepthLog {
    /// A depth record: `depth` from `from_ns` on.
    pub fn push(&mut self, from_ns: u64, depth: u32) {
        // Records come in time order; one out of order is placed where it belongs.
        let at = self.changes.partition_point(|c| c.0 <= from_ns);
        self.changes.insert(at, (from_ns, depth));
        if self.changes.len() > MAX_DEPTH_CHANGES {
            self.changes.pop_front();
        }
    }

    /// Whether everything launched from `b` to `e` was traced at kernel depth: true for a
    /// stream without depth records (shims before them traced every kernel).
    pub fn traced(&self, b: u64, e: u64) -> bool {
        let kernels = |d: u32| d != slo_probe_common::gpu::DEPTH_OFF && d >= 1;
        if self.changes.is_empty() {
            return true;
        }
        let at = self.changes.partition_point(|c| c.0 <= b);
        let before = if at == 0 {
            // Before the first record: the shim's state then is unknown.
            return false;
        } else {
            self.changes[at - 1].1
        };
        kernels(before)
            && self
                .changes
                .iter()
                .skip(at)
                .take_while(|c| c.0 <= e)
                .all(|c| kernels(c.1))
    }

    /// The depth in force at `t`, if a record says.
    pub fn at(&self, t: u64) -> Option<u32> {
        let at = self.changes.partition_point(|c| c.0 <= t);
        (at > 0).then(|| self.changes[at - 1].1)
    }
}

/// How long after its launch an activity may start and still count as the one the GPU was
/// waiting for (the driver's dispatch latency is 5–20 µs on an H200; an activity that starts
/// later than this after its launch while the GPU sat idle was waiting on something else).
pub const DISPATCH_NS: u64 = 50_000;

/// Where one activity lands on its GPU's timeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    /// When the GPU was last busy before it (`None`: nothing seen on the device yet).
    pub free: Option<u64>,
    /// The part of it that extended the GPU's busy time: its share of the critical path, ns.
    /// Work hidden behind other work (a collective under backward) has none.
    pub critical: u64,
    /// GPU idle before it because nothing was queued: it was launched after the GPU went
    /// idle (the host was late), ns.
    pub late: u64,
    /// GPU idle before it although it was queued (a dependency on another stream, an event),
    /// ns.
    pub wait: u64,
    /// Its launch latency (start − launch) when the GPU was waiting for it; `None` when it
    /// queued behind earlier work (queueing is not latency) or its launch is unknown.
    pub launch_latency: Option<u64>,
}

/// The GPU timeline of a process: per device, until when it was busy with the activities
/// placed so far (in start order, across iterations). Placing an activity tells whether the
/// GPU idled before it and why.
#[derive(Clone, Debug, Default)]
pub struct GpuTimeline {
    /// (device, busy until), a few devices per process.
    free: Vec<(u32, u64)>,
}

impl GpuTimeline {
    /// Until when `device` was busy.
    pub fn free_at(&self, device: u32) -> Option<u64> {
        self.free.iter().find(|f| f.0 == device).map(|f| f.1)
    }

    /// Places `a` (activities come in start order).
    pub fn place(&mut self, a: &Activity) -> Placed {
        let slot = match self.free.iter().position(|f| f.0 == a.device) {
            Some(k) => k,
            None => {
                self.free.push((a.device, 0));
                self.free.len() - 1
            }
        };
        let seen = self.free[slot].1 != 0;
        let free = self.free[slot].1;
        let idle = if seen {
            a.start_ns.saturating_sub(free)
        } else {
            0
        };
        let critical = a.end_ns.saturating_sub(a.start_ns.max(free));
        self.free[slot].1 = free.max(a.end_ns);
        // Launched after the GPU went idle, or started within the dispatch latency of its
        // launch: the GPU was waiting for this launch. (A placed launch is no stamp: unknown.)
        let launch = a.stamped_launch_ns();
        let waited_for_launch = launch == 0 || launch >= free || a.start_ns <= launch + DISPATCH_NS;
        let (late, wait) = if idle == 0 {
            (0, 0)
        } else if waited_for_launch {
            (idle, 0)
        } else {
            (0, idle)
        };
        // Launched while the GPU was idle (or first): its wait to start is launch latency.
        // Launched behind earlier work: its wait is queueing, left out.
        let launch_latency =
            (launch != 0 && (!seen || launch >= free)).then(|| a.start_ns.saturating_sub(launch));
        Placed {
            free: seen.then_some(free),
            critical,
            late,
            wait,
            launch_latency,
        }
    }
}

/// Sums the operators beyond the largest [`MAX_ITERATION_OPS`] − 1 (sorted largest first) into
/// one [`OVERFLOW_OP`] entry.
fn fold_small_ops(ops: &mut Vec<OpTime>) {
    let rest: Vec<OpTime> = ops.split_off(MAX_ITERATION_OPS - 1);
    let k = match ops.iter().position(|o| &*o.op == OVERFLOW_OP) {
        Some(k) => k,
        None => {
            ops.push(OpTime {
                op: Arc::from(OVERFLOW_OP),
                kind: OpKind::Compute,
                gpu_ns: 0,
                kernels: 0,
                occupancy: None,
                gap_ns: 0,
                critical_ns: 0,
                wait_ns: 0,
                launch_latency_ns: None,
                bytes: 0,
            });
            ops.len() - 1
        }
    };
    let o = &mut ops[k];
    let (mut occ, mut occ_ns) = (o.occupancy.unwrap_or(0.0) * o.gpu_ns as f64, 0u64);
    if o.occupancy.is_some() {
        occ_ns = o.gpu_ns;
    }
    let (mut lat, mut lat_n) = (
        o.launch_latency_ns.unwrap_or(0) * u64::from(o.kernels),
        if o.launch_latency_ns.is_some() {
            u64::from(o.kernels)
        } else {
            0
        },
    );
    for r in rest {
        o.gpu_ns += r.gpu_ns;
        o.kernels = o.kernels.saturating_add(r.kernels);
        o.gap_ns += r.gap_ns;
        o.critical_ns += r.critical_ns;
        o.wait_ns += r.wait_ns;
        o.bytes += r.bytes;
        if let Some(x) = r.occupancy {
            occ += x * r.gpu_ns as f64;
            occ_ns += r.gpu_ns;
        }
        if let Some(l) = r.launch_latency_ns {
            lat += l * u64::from(r.kernels);
            lat_n += u64::from(r.kernels);
        }
    }
    o.occupancy = (occ_ns > 0).then(|| occ / occ_ns as f64);
    o.launch_latency_ns = (lat_n > 0).then(|| lat / lat_n);
    ops.sort_unstable_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then_with(|| a.op.cmp(&b.op)));
}

/// Kernels looked at to find the period of a job's kernel sequence (bounds the cost).
const PERIOD_WINDOW: usize = 8192;

fn tail(seq: &[u32]) -> &[u32] {
    &seq[seq.len().saturating_sub(PERIOD_WINDOW)..]
}

/// The period `p` (2 ≤ p ≤ len/3) of the kernel-name sequence over its last
/// `PERIOD_WINDOW` elements (see `cycle::detect_period`); the recent window skips start-up
/// steps, which launch one-off kernels.
///
/// A sequence that is one name repeated (a run of fills zeroing buffers, an autotuner timing
/// one kernel) has every period and no iterations: a period whose every phase is mostly the
/// same name is none (`one_name`). On an H100, a GPT under `torch.compile(mode=
/// "reduce-overhead")` launched ~3,600 kernels while it compiled and captured its graphs, most
/// of them one fill; their period of 2 cut 667 "iterations" of ~120 µs before its first step.
pub fn detect_period(seq: &[u32]) -> Option<usize> {
    let seq = tail(seq);
    cycle::detect_period(seq, 2).filter(|&p| !one_name(seq, p))
}

/// Whether every phase `r` of period `p` in `seq` (the names at `r`, `r + p`, ...) has the same
/// most frequent name: a run of one name, whatever the period found in it.
fn one_name(seq: &[u32], p: usize) -> bool {
    if p == 0 || seq.len() < p {
        return false;
    }
    let mut counts: FxHashMap<(usize, u32), u32> = FxHashMap::default();
    for (i, &n) in seq.iter().enumerate() {
        *counts.entry((i % p, n)).or_default() += 1;
    }
    let mut modes: Vec<(u32, u32)> = vec![(0, 0); p];
    for (&(r, n), &c) in &counts {
        if (c, std::cmp::Reverse(n)) > (modes[r].1, std::cmp::Reverse(modes[r].0)) {
            modes[r] = (n, c);
        }
    }
    modes.iter().all(|m| m.0 == modes[0].0)
}

/// Total length of the time covered by both interval sets (each sorted and merged here).
fn intersection_ns(a: &mut [(u64, u64)], b: &mut [(u64, u64)]) -> u64 {
    fn merge(v: &mut [(u64, u64)]) -> usize {
        v.sort_unstable();
        let mut n = 0;
        for k in 0..v.len() {
            let (s, e) = v[k];
            if n > 0 && s <= v[n - 1].1 {
                v[n - 1].1 = v[n - 1].1.max(e);
            } else {
                v[n] = (s, e);
                n += 1;
            }
        }
        n
    }
    let (na, nb) = (merge(a), merge(b));
    let (mut i, mut j, mut total) = (0, 0, 0);
    while i < na && j < nb {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        total += hi.saturating_sub(lo);
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::{RecordHeader, StepRecord, StringRecord};

    fn kernel(start: u64, dur: u64, launch: u64, name_id: u32, op_id: u32) -> GpuKernelRecord {
        GpuKernelRecord {
            header: RecordHeader::of::<GpuKernelRecord>(),
            start_ns: start,
            end_ns: start + dur,
            launch_ns: launch,
            graph_node_id: 0,
            correlation_id: 0,
            device_id: 0,
            context_id: 1,
            stream_id: 7,
            graph_id: 0,
            grid: [1, 1, 1],
            block: [128, 1, 1],
            registers: 32,
            static_smem: 0,
            dynamic_smem: 0,
            name_id,
            op_id,
            launch_tid: 1,
            flags: 0,
        }
    }

    /// A host-to-device copy on stream 7.
    fn htod(
        start_ns: u64,
        end_ns: u64,
        launch_ns: u64,
        bytes: u64,
        corr: u32,
    ) -> AnyRecord<'static> {
        AnyRecord::GpuMem(GpuMemRecord {
            header: RecordHeader::of::<GpuMemRecord>(),
            start_ns,
            end_ns,
            launch_ns,
            bytes,
            graph_node_id: 0,
            correlation_id: corr,
            device_id: 0,
            stream_id: 7,
            graph_id: 0,
            kind: 1,
            op_id: 0,
            launch_tid: 1,
            flags: 0,
        })
    }

    fn step(step: u64, ts: u64, phase: u32) -> StepRecord {
        StepRecord {
            header: RecordHeader::of::<StepRecord>(),
            step,
            ts_ns: ts,
            tid: 1,
            phase,
        }
    }

    fn string(id: u32, kind: u32, name: &str) -> Vec<u8> {
        let mut b = vec![0u8; 64 + name.len()];
        let n = StringRecord::encode(id, kind, name.as_bytes(), &mut b);
        b.truncate(n);
        b
    }

    #[test]
    fn readable_kernel_names() {
        assert_eq!(
            short_kernel_name(
                "_ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm_256x128_8x4_nt_align1EEvNT_6ParamsE"
            ),
            "cutlass_80_simt_sgemm_256x128_8x4_nt_align1"
        );
        assert_eq!(
            short_kernel_name(
                "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIiEESt5arrayIPcLm1EEEEviT0_T1_"
            ),
            "vectorized_elementwise_kernel"
        );
        assert_eq!(short_kernel_name("triton_poi_fused_gelu_3"), "gelu");
        assert_eq!(
            short_kernel_name(
                "_ZN2at6native55_GLOBAL__N__d25d856e_22_ForeachBinaryOpList_cu_a911ec4325multi_tensor_apply_kernelINS1_18TensorListMetadataILi2EEENS1_24BinaryOpListAlphaFunctorIfLi2ELi2ELi0EEEJSt4plusIfEfEEEvT_T0_DpT1_"
            ),
            "multi_tensor_apply_kernel"
        );
        assert_eq!(short_kernel_name("plain_c_kernel"), "plain_c_kernel");
    }

    #[test]
    fn nested_name_fallback() {
        assert_eq!(
            itanium_nested_name("_ZN2at6native13reduce_kernelILi512EEEvT_").as_deref(),
            Some("reduce_kernel")
        );
        assert_eq!(itanium_nested_name("plain"), None);
    }

    #[test]
    fn inductor_names() {
        assert_eq!(
            inductor_ops("triton_poi_fused_addmm_relu_0"),
            Some("addmm_relu")
        );
        assert_eq!(
            inductor_ops("triton_red_fused__softmax_12"),
            Some("_softmax")
        );
        assert_eq!(
            inductor_ops("triton_per_fused_native_layer_norm_3"),
            Some("native_layer_norm")
        );
        assert_eq!(inductor_ops("ampere_sgemm_128x64_tn"), None);
    }

    #[test]
    fn hostile_times_are_bounded_at_assembly() {
        let mut t = TraceAssembler::new();
        t.push(&AnyRecord::Step(step(0, 1_000, STEP_BEGIN)));
        // A kernel ending at u64::MAX, one ending before it starts, a step ending at u64::MAX.
        let mut long = kernel(2_000, 10, 1_500, 1, 0);
        long.end_ns = u64::MAX;
        let mut backwards = kernel(3_000, 10, 2_500, 1, 0);
        backwards.end_ns = 5;
        t.push(&AnyRecord::GpuKernel(long));
        t.push(&AnyRecord::GpuKernel(backwards));
        t.push(&AnyRecord::Step(step(0, u64::MAX, STEP_END)));
        let its = t.take_iterations(u64::MAX, 1_000, true);
        assert_eq!(its.len(), 1);
        let i = &its[0];
        assert!(i.step_ns() <= MAX_TS_NS, "{}", i.step_ns());
        assert!(i.gpu_busy_ns <= MAX_ACTIVITY_NS, "{}", i.gpu_busy_ns);
        // Sums over many such iterations stay finite.
        let mut p = crate::attribution::Profile::default();
        for _ in 0..16 {
            p.add_iteration(i);
        }
        assert_eq!(p.wall_ns, i.step_ns().saturating_mul(16));
    }

    #[test]
    fn marked_iterations_with_ops_busy_idle_and_latency() {
        let mut t = TraceAssembler::new();
        for bytes in [
            string(1, STRING_KERNEL, "triton_poi_fused_gelu_0"),
            string(2, STRING_OP, "blocks.0.up"),
        ] {
            let (r, _) = slo_probe_common::decode(&bytes).expect("string");
            t.push(&r);
        }
        t.push(&AnyRecord::Step(step(0, 1_000, STEP_BEGIN)));
        // Two kernels overlapping (busy = 1500..2600 = 1100), launched at 1100 and 1200.
        t.push(&AnyRecord::GpuKernel(kernel(1_500, 600, 1_100, 1, 0)));
        t.push(&AnyRecord::GpuKernel(kernel(2_000, 600, 1_200, 1, 2)));
        t.push(&AnyRecord::Step(step(0, 3_000, STEP_END)));
        t.push(&AnyRecord::Step(step(1, 3_100, STEP_BEGIN)));
        t.push(&AnyRecord::GpuKernel(kernel(9_000, 100, 3_200, 1, 0)));
        // Step 0 is complete once the settle time has passed after its end.
        assert!(t.take_iterations(3_500, 1_000, false).is_empty());
        let it = t.take_iterations(4_000, 1_000, false);
        assert_eq!(it.len(), 1);
        let i = &it[0];
        assert_eq!((i.step, i.wall_ns(), i.kernels), (0, 2_000, 2));
        assert_eq!(i.gpu_busy_ns, 1_100);
        assert_eq!(i.gpu_span_ns(), 1_100);
        assert_eq!(i.idle_before_first_ns, 500);
        // The second kernel queued behind the first (launched at 1200, the GPU busy until
        // 2100): queueing, not launch latency.
        assert_eq!(i.launch_latencies_ns, vec![400]);
        assert_eq!(
            i.gpu_period_ns, 1_600,
            "from the host start to the GPU's end"
        );
        let crit: u64 = i.ops.iter().map(|o| o.critical_ns).sum();
        assert_eq!(crit, i.gpu_busy_ns);
        assert_eq!(i.ops.len(), 2);
        assert!(i.ops.iter().any(|o| &*o.op == "gelu" && o.gpu_ns == 600));
        assert!(i
            .ops
            .iter()
            .any(|o| &*o.op == "blocks.0.up" && o.gpu_ns == 600));
        // Step 1 has no end yet.
        assert!(t.take_iterations(100_000, 0, false).is_empty());
        t.push(&AnyRecord::Step(step(1, 9_500, STEP_END)));
        let it = t.take_iterations(0, 0, true);
        assert_eq!((it[0].step, it[0].kernels), (1, 1));
    }

    #[test]
    fn an_activity_stays_small() {
        // MAX_PENDING of them per live process (the hostile-client RSS bound counts on it).
        assert!(std::mem::size_of::<Activity>() <= 80);
    }

    /// A graph's composition counts its nodes by the operator that captured them, a clone by
    /// its original's, and the kernel nodes by their launch configuration where the capture
    /// recorded it (a clone by its original's); nodes of graphs beyond [`MAX_GRAPHS`] are
    /// counted as capped.
    #[test]
    fn graph_composition_counts_nodes_by_their_capturing_operator() {
        use slo_probe_common::gpu::{GraphNodeRecord, NODE_CLONED, NODE_CREATED};
        let mut t = TraceAssembler::new();
        for (id, name) in [(5, "blocks.1.mlp"), (6, "blocks.2.attn.extra")] {
            let b = string(id, STRING_OP, name);
            let (r, _) = slo_probe_common::decode(&b).expect("string");
            t.push(&r);
        }
        let launch = slo_probe_common::gpu::encode_launch([264, 1, 1], [32, 1, 1]);
        let node = |node_id: u64, original: u64, graph_id: u32, op_id: u32| GraphNodeRecord {
            header: RecordHeader::of::<GraphNodeRecord>(),
            node_id,
            original_node_id: original,
            graph_id,
            op_id,
            flags: if original == 0 {
                NODE_CREATED
            } else {
                NODE_CLONED
            },
            // The mlp's nodes were captured with a known configuration.
            launch: if original == 0 && op_id == 5 {
                launch
            } else {
                0
            },
        };
        // Captured in graph 4: two nodes of the mlp, one of the extra, one outside operators;
        // instantiated as graph 5 (clones), which adds a node of its own.
        for (n, op) in [(1, 5), (2, 5), (3, 6), (4, 0)] {
            t.push(&AnyRecord::GraphNode(node(n, 0, 4, op)));
        }
        for n in 1..=4 {
            t.push(&AnyRecord::GraphNode(node(100 + n, n, 5, 0)));
        }
        t.push(&AnyRecord::GraphNode(node(200, 0, 5, 0)));
        let c = t.graph_composition().expect("changed");
        let want = |pairs: &[(&str, u32)]| -> BTreeMap<String, u32> {
            pairs.iter().map(|(l, n)| ((*l).to_owned(), *n)).collect()
        };
        let four = want(&[("", 1), ("blocks.1.mlp", 2), ("blocks.2.attn.extra", 1)]);
        assert_eq!(c.nodes.get(&4), Some(&four));
        let five = want(&[("", 2), ("blocks.1.mlp", 2), ("blocks.2.attn.extra", 1)]);
        assert_eq!(c.nodes.get(&5), Some(&five));
        let mlp: BTreeMap<String, BTreeMap<u32, u32>> =
            [("blocks.1.mlp".to_owned(), [(launch, 2)].into())].into();
        assert_eq!(c.launches.get(&4), Some(&mlp));
        assert_eq!(c.launches.get(&5), Some(&mlp), "clones keep it");
        assert!(t.graph_composition().is_none(), "nothing new since");
        let capped = t.capped;
        for g in 0..MAX_GRAPHS as u32 {
            t.push(&AnyRecord::GraphNode(node(
                1_000 + u64::from(g),
                0,
                10 + g,
                0,
            )));
        }
        let c = t.graph_composition().expect("changed");
        assert_eq!(c.nodes.len(), MAX_GRAPHS);
        assert_eq!(t.capped - capped, 2, "two graphs beyond the cap");
    }

    /// Moving a model to the GPU copies its layers' parameters in a repeating run of sizes,
    /// which the copies' period locks on before the first step: while kernels were traced,
    /// those "iterations" ran no compute and are left out; the steps after them are counted
    /// and numbered from 0. While kernels were not traced (the always-on tier between sample
    /// windows), a step without a kernel record is no evidence: nothing is left out.
    #[test]
    fn copies_without_compute_are_no_iterations() {
        let copy =
            |start: u64, bytes: u64, corr: u32| htod(start, start + 20, start - 5, bytes, corr);
        let run = |depth: u32| {
            let mut t = TraceAssembler::new();
            t.push(&AnyRecord::Depth(slo_probe_common::DepthRecord {
                header: RecordHeader::of::<slo_probe_common::DepthRecord>(),
                from_ns: 1,
                depth,
                reason: 1,
            }));
            let mut corr = 1u32;
            let mut ts = 1_000u64;
            // 100 layers of three parameters each, copied 100 ns apart.
            for _ in 0..100 {
                for bytes in [4096u64, 16_384, 64] {
                    corr += 1;
                    t.push(&copy(ts, bytes, corr));
                    ts += 100;
                }
            }
            // A pause (compilation), during which the agent takes what it has, then 30 steps:
            // the batch, then eight kernels.
            ts += 5_000_000;
            let mut its = t.take_iterations(ts, 0, false);
            for _ in 0..30 {
                corr += 1;
                t.push(&copy(ts, 1 << 20, corr));
                ts += 40_000;
                for name in 5u32..13 {
                    let mut k = kernel(ts + 10, 500, ts, name, 0);
                    corr += 1;
                    k.correlation_id = corr;
                    t.push(&AnyRecord::GpuKernel(k));
                    ts += 1_000;
                }
                ts += 20_000;
            }
            its.extend(t.take_iterations(ts + 1_000_000, 0, true));
            its
        };
        let its = run(slo_probe_common::gpu::DEPTH_KERNELS);
        assert!(
            its.iter().all(|i| i.kernels > 0),
            "{:?}",
            its.iter()
                .map(|i| (i.step, i.kernels, i.wall_ns()))
                .collect::<Vec<_>>()
        );
        assert!((28..=30).contains(&its.len()), "{}", its.len());
        assert_eq!(its.first().map(|i| i.step), Some(0));
        assert!(its.windows(2).all(|w| w[1].step == w[0].step + 1));
        let idle = run(slo_probe_common::gpu::DEPTH_TIMING)
            .iter()
            .filter(|i| i.kernels == 0)
            .count();
        assert!(
            idle > 10,
            "kernels not traced: the copies' iterations stay ({idle})"
        );
    }

    /// A CPU running two iterations ahead of the GPU, as on the H200 (a GPU-bound eager job):
    /// the kernels and copies that carry no launch stamp (a copy's API is not stamped; a
    /// kernel's stamp can be missed) go to the iteration that launched them, by correlation
    /// id between the stamped launches, not to the one running when the GPU got to them; and
    /// they take the operator of the launches around them.
    #[test]
    fn unstamped_activities_go_to_the_iteration_that_launched_them() {
        let mut t = TraceAssembler::new();
        let name = string(5, STRING_OP, "blocks.1.mlp");
        let (r, _) = slo_probe_common::decode(&name).expect("string");
        t.push(&r);
        // Steps of 1000 ns from 10_000; each launches four kernels (ids 4k+1..4k+4) and one
        // copy (4k+5... as 100k+k), executed 2000 ns later (two iterations of queue).
        let mut corr = 100u32;
        for k in 0..6u64 {
            let b = 10_000 + k * 1_000;
            t.push(&AnyRecord::Step(step(k, b, STEP_BEGIN)));
            t.push(&AnyRecord::Step(step(k, b + 1_000, STEP_END)));
            for j in 0..4u64 {
                let launch = b + 100 + j * 200;
                let mut r = kernel(launch + 2_000, 150, launch, 1, 5);
                corr += 1;
                r.correlation_id = corr;
                if j == 1 || j == 2 {
                    // A missed stamp: neither launch time nor operator.
                    r.launch_ns = 0;
                    r.op_id = 0;
                }
                t.push(&AnyRecord::GpuKernel(r));
                if j == 1 {
                    corr += 1;
                    t.push(&htod(launch + 2_160, launch + 2_180, 0, 4096, corr));
                }
            }
        }
        let its = t.take_iterations(0, 0, true);
        assert_eq!(its.len(), 6);
        for i in &its {
            assert_eq!(
                (i.kernels, i.memory_ops),
                (4, 1),
                "step {}: each iteration keeps what it launched",
                i.step
            );
            assert!(
                i.ops.iter().all(|o| o.op.starts_with("blocks.1.mlp")),
                "step {}: operators {:?}",
                i.step,
                i.ops.iter().map(|o| o.op.to_string()).collect::<Vec<_>>()
            );
        }
        // Placing stays within the stamps and never after the start on the GPU.
        let mut s = LaunchStamps::default();
        s.push(10, 1_000, 3);
        s.push(20, 2_000, 3);
        s.push(30, 3_000, 4);
        assert_eq!(s.place(15, 9_000, false), Some((1_500, 3)));
        assert_eq!(
            s.place(15, 1_200, false),
            Some((1_200, 3)),
            "not after its start"
        );
        assert_eq!(
            s.place(25, 9_000, false),
            Some((2_500, 0)),
            "between two operators: none"
        );
        // Before every stamp, and after the last: at the rate of API calls there (one id per
        // 100 ns); far past the last, not yet.
        // The GPU was idle, waiting for it: launched just before it started.
        assert_eq!(s.place(25, 2_600, true), Some((2_600, 0)));
        assert_eq!(s.place(35, 9_000, true), Some((9_000, 0)));
        assert_eq!(s.place(5, 9_000, false), Some((500, 0)));
        assert_eq!(s.place(35, 9_000, false), Some((3_500, 0)));
        assert_eq!(s.place(30 + MAX_EXTRAPOLATE + 1, u64::MAX, false), None);
        s.push(20, 2_000, 3);
        assert_eq!(s.len(), 3, "a graph launch's nodes share one stamp");
        // A second sample window a second later: an activity just before it is placed from
        // its first stamps, one just after the first window from that one's.
        s.push(10_030, 1_000_003_000, 4);
        s.push(10_040, 1_000_004_000, 4);
        assert_eq!(s.place(10_000, u64::MAX, false), Some((1_000_000_000, 0)));
        assert_eq!(s.place(40, u64::MAX, false), Some((4_000, 0)));
        // Stamps out of time order (threads), wrapping ids, zeros: placing never panics and
        // never goes past the start.
        let mut s = LaunchStamps::default();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..5_000 {
            s.push(next() as u32 % 50_000, next() % 10_000_000_000, 1);
        }
        for _ in 0..5_000 {
            let start = next() % 10_000_000_000;
            if let Some((t, _)) = s.place(next() as u32, start, next() % 2 == 0) {
                assert!(t <= start.max(1));
            }
        }
    }

    /// A sample window of 500 ms on a job whose GPU runs 150 ms behind its CPU (30 ms steps of
    /// six kernels): CUPTI records a kernel when it runs, so the steps launched in the window's
    /// last 170 ms lose their kernels when it closes. Only the steps whose work the GPU finished
    /// while kernels were traced count as traced; and one that came with under 70% of the usual
    /// kernels (CUPTI missed a thread's) does not either.
    #[test]
    fn traced_means_the_gpu_ran_it_while_kernels_were_traced() {
        const MS: u64 = 1_000_000;
        let depth = |from_ns: u64, depth: u32| {
            AnyRecord::Depth(slo_probe_common::DepthRecord {
                header: RecordHeader::of::<slo_probe_common::DepthRecord>(),
                from_ns,
                depth,
                reason: 1,
            })
        };
        let mut t = TraceAssembler::new();
        t.push(&depth(1, 0));
        t.push(&depth(1_000 * MS, 1));
        t.push(&depth(1_500 * MS, 0));
        let mut corr = 1u32;
        for k in 0..20u64 {
            let b = 1_000 * MS + k * 30 * MS;
            t.push(&AnyRecord::Step(step(k, b, STEP_BEGIN)));
            t.push(&AnyRecord::Step(step(k, b + 30 * MS, STEP_END)));
            // Step 5 comes with two of its six kernels.
            let n = if k == 5 { 2 } else { 6 };
            for j in 0..n {
                let launch = b + MS + j * 4 * MS;
                let start = 150 * MS + b + j * 5 * MS;
                corr += 1;
                if start + 5 * MS > 1_500 * MS {
                    continue; // ran after the window closed: not recorded
                }
                let mut r = kernel(start, 5 * MS, launch, 1, 0);
                r.correlation_id = corr;
                t.push(&AnyRecord::GpuKernel(r));
            }
        }
        let its = t.take_iterations(0, 0, true);
        let traced: Vec<u64> = its.iter().filter(|i| i.traced).map(|i| i.step).collect();
        // Step k's work ends at 1180 + 30k ms, which must be 20 ms before the window closed
        // at 1500 ms: k ≤ 9 (step 10 ends exactly 20 ms before: not traced).
        assert_eq!(traced, vec![0, 1, 2, 3, 4, 6, 7, 8, 9]);
        let counts: Vec<u32> = its.iter().filter(|i| i.traced).map(|i| i.kernels).collect();
        assert_eq!(counts, vec![6; 9]);
    }

    /// The GPU timeline: a CPU running ahead queues work (no idle, no launch latency, however
    /// long the queue); a launch after the GPU went idle is the host's lateness; idle while
    /// work was queued is a dependency.
    #[test]
    fn the_timeline_separates_queueing_late_launches_and_dependencies() {
        let act = |start: u64, dur: u64, launch: u64| Activity {
            kind: ActivityKind::Kernel,
            start_ns: start,
            end_ns: start + dur,
            launch_ns: launch,
            placed: false,
            correlation_id: 0,
            bytes: 0,
            name_id: 1,
            op_id: 0,
            graph_id: 0,
            stream_id: 7,
            mem_kind: 0,
            occupancy: None,
            device: 0,
        };
        let mut t = GpuTimeline::default();
        // First activity: nothing known before it.
        let p = t.place(&act(1_000, 100, 990));
        assert_eq!((p.free, p.critical, p.late, p.wait), (None, 100, 0, 0));
        // Launched 10 ms before it could run (CPU ahead): pure queueing.
        let p = t.place(&act(1_100, 100, 50));
        assert_eq!(
            (p.critical, p.late, p.wait, p.launch_latency),
            (100, 0, 0, None)
        );
        // Launched after the GPU went idle at 1200: idle 1200 → 1510 is the host's.
        let p = t.place(&act(1_510, 100, 1_500));
        assert_eq!((p.late, p.wait, p.launch_latency), (310, 0, Some(10)));
        // Queued long before (at 1300) yet started 400 µs after the GPU was free: a dependency.
        let p = t.place(&act(401_610, 100, 1_300));
        assert_eq!((p.late, p.wait), (0, 400_000));
        // Fully hidden behind the previous one: no critical-path time.
        let p = t.place(&act(401_620, 50, 401_000));
        assert_eq!((p.critical, p.late, p.wait), (0, 0, 0));
        assert_eq!(t.free_at(0), Some(401_710));
    }

    #[test]
    fn detects_iterations_from_a_periodic_kernel_sequence() {
        let mut t = TraceAssembler::new();
        let mut ts = 0u64;
        for _ in 0..10 {
            for name in [5u32, 6, 7, 8] {
                ts += 100;
                t.push(&AnyRecord::GpuKernel(kernel(ts + 10, 50, ts, name, 0)));
            }
        }
        let it = t.take_iterations(ts + 1_000, 0, false);
        assert_eq!(it.len(), 9, "{it:?}");
        assert!(it
            .iter()
            .all(|i| !i.marked && i.kernels == 4 && i.wall_ns() == 400));
    }

    #[test]
    fn operators_and_strings_are_capped() {
        let mut t = TraceAssembler::new();
        t.push(&AnyRecord::Step(step(0, 0, STEP_BEGIN)));
        let n = MAX_OPS as u32 + 10;
        for id in 1..=n {
            let bytes = string(id, STRING_KERNEL, &format!("kernel_{id}"));
            let (r, _) = slo_probe_common::decode(&bytes).expect("string");
            t.push(&r);
            let ts = u64::from(id) * 10;
            t.push(&AnyRecord::GpuKernel(kernel(ts + 2, 5, ts + 1, id, 0)));
        }
        t.push(&AnyRecord::Step(step(0, u64::from(n) * 10 + 100, STEP_END)));
        let it = t.take_iterations(0, 0, true);
        assert_eq!(t.ops_named(), MAX_OPS + 1);
        assert_eq!(t.ops_overflowed(), 10);
        let overflow = it[0]
            .ops
            .iter()
            .find(|o| &*o.op == OVERFLOW_OP)
            .expect("overflow op");
        // The 10 beyond the table, and the smallest beyond what an iteration lists.
        assert!(overflow.kernels >= 10, "{}", overflow.kernels);
        assert_eq!(it[0].ops.len(), MAX_ITERATION_OPS - 1);
        assert_eq!(it[0].ops.iter().map(|o| o.kernels).sum::<u32>(), n);
        assert_eq!(it[0].kernels, n);
        // Strings beyond the cap are dropped and counted.
        for id in 0..(MAX_STRINGS as u32) {
            let bytes = string(1_000_000 + id, STRING_KERNEL, "k");
            let (r, _) = slo_probe_common::decode(&bytes).expect("string");
            t.push(&r);
        }
        assert_eq!(t.strings_dropped, u64::from(n));
    }

    /// Issue 16, item 5: random well-framed records (open steps that never end, a graph per
    /// kernel, long names) and realistic ones without boundaries stay within the caps, the
    /// excess counted; a released assembler keeps only its counters.
    #[test]
    fn hostile_records_stay_within_the_caps() {
        let mut t = TraceAssembler::new();
        t.set_bounded(true);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let long = "n".repeat(2 * MAX_STRING_LEN);
        for k in 0..600_000u64 {
            let r = rnd();
            match k % 4 {
                0 => t.push(&AnyRecord::Step(step(r, r >> 8, STEP_BEGIN))),
                1 => {
                    let mut g = kernel(r >> 20, 5, r >> 20, r as u32, (r >> 32) as u32);
                    g.graph_id = (r >> 40) as u32 | 1;
                    t.push(&AnyRecord::GpuKernel(g));
                }
                2 => t.push(&AnyRecord::GpuGraph(GpuGraphRecord {
                    header: RecordHeader::of::<GpuGraphRecord>(),
                    start_ns: r >> 20,
                    end_ns: (r >> 20) + 5,
                    launch_ns: r >> 20,
                    correlation_id: 0,
                    device_id: 0,
                    context_id: 1,
                    stream_id: 7,
                    graph_id: r as u32,
                    op_id: 0,
                    launch_tid: 1,
                    flags: 0,
                })),
                _ if k % 64 == 3 => {
                    let bytes = string(r as u32, STRING_KERNEL, &long);
                    let (rec, _) = slo_probe_common::decode(&bytes).expect("string");
                    t.push(&rec);
                }
                _ => t.push(&AnyRecord::GpuKernel(kernel(k, 5, k, 1, 0))),
            }
        }
        assert!(t.steps.len() <= MAX_OPEN_STEPS);
        assert!(t.pending.len() <= MAX_PENDING);
        assert!(t.graph_counts.len() <= MAX_GRAPHS);
        assert!(t.graph_contents.len() <= MAX_GRAPHS);
        let entries: usize = t.graph_contents.values().map(|c| c.len()).sum();
        assert!(entries <= MAX_GRAPH_ENTRIES && entries == t.graph_entries);
        assert!(t.string_bytes <= MAX_STRING_BYTES);
        assert!(t.names.values().all(|n| n.len() <= MAX_STRING_LEN));
        assert!(t.capped > 100_000, "{}", t.capped);
        assert!(t.strings_dropped > 0);
        let (seen, capped) = (t.seen, t.capped);
        t.release();
        assert_eq!((t.seen, t.capped), (seen, capped));
        assert!(t.pending.capacity() == 0 && t.names.is_empty() && t.steps.is_empty());
    }

    #[test]
    fn an_iteration_keeps_a_sample_of_its_launch_latencies() {
        let mut t = TraceAssembler::new();
        t.push(&AnyRecord::Step(step(0, 0, STEP_BEGIN)));
        for k in 0..10_000u64 {
            // Each launched while the GPU is idle, so its wait is launch latency (k ns).
            t.push(&AnyRecord::GpuKernel(kernel(
                k * 20_000 + k,
                5,
                k * 20_000,
                1,
                0,
            )));
        }
        t.push(&AnyRecord::Step(step(0, 300_000_000, STEP_END)));
        let it = t.take_iterations(0, 0, true);
        let lat = &it[0].launch_latencies_ns;
        assert_eq!(lat.len(), MAX_ITERATION_LATENCIES);
        // Latencies are 0..10000 ns, uniformly: the sample's median stays at the median.
        let p50 = it[0].launch_latency_ns(0.5).expect("p50");
        assert!((4_990..=5_010).contains(&p50), "{p50}");
        assert_eq!(it[0].kernels, 10_000);
    }

    #[test]
    fn period_detection() {
        assert_eq!(
            detect_period(&[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]),
            Some(3)
        );
        assert_eq!(detect_period(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), None);
        // One name repeated (fills while a graph is captured, an autotuner's timing loop), with
        // a few others among them: no period.
        let others = [5, 40, 41, 97, 150, 151, 230, 288];
        let fills: Vec<u32> = (0..300)
            .map(|i| if others.contains(&i) { 2 } else { 1 })
            .collect();
        assert_eq!(cycle::detect_period(&fills, 2), Some(2));
        assert_eq!(detect_period(&fills), None);
        // A step of several names, one of them most of it, has its period.
        let step = [1, 1, 1, 1, 2, 1, 1, 3];
        let steps: Vec<u32> = step.iter().copied().cycle().take(240).collect();
        assert_eq!(detect_period(&steps), Some(8));
    }

    #[test]
    fn overlap_of_interval_sets() {
        let mut comm = vec![(10, 20), (15, 30), (50, 60)];
        let mut compute = vec![(0, 12), (25, 55), (58, 70)];
        // [10,12) + [25,30) + [50,55) + [58,60)
        assert_eq!(intersection_ns(&mut comm, &mut compute), 2 + 5 + 5 + 2);
        assert_eq!(intersection_ns(&mut [], &mut [(0, 5)]), 0);
    }
}
