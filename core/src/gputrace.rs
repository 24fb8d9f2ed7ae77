//! GPU traces from the CUPTI shim, turned into iterations: names and graph nodes resolved,
//! activities assigned to the iteration whose host-side window contains their launch, and per
//! iteration the wall time, GPU busy time, kernel and graph counts, launch latency, the GPU idle
//! gap before the first kernel (data loading / host wait), and time per operator.
//!
//! Iteration boundaries come from step markers (`slo_probe.step()`) when the script sends them;
//! otherwise they are detected: each launch of the CUDA graph replayed most often starts an
//! iteration, or, without graphs, the period of the kernel-name sequence.

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
    /// Host-side launch (API entry), ns; 0 if unknown.
    pub launch_ns: u64,
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

impl Activity {
    fn from_kernel(k: &GpuKernelRecord) -> Self {
        Self {
            kind: if k.graph_id != 0 {
                ActivityKind::GraphKernel
            } else {
                ActivityKind::Kernel
            },
            start_ns: k.start_ns,
            end_ns: k.end_ns,
            launch_ns: k.launch_ns,
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
            start_ns: g.start_ns,
            end_ns: g.end_ns,
            launch_ns: g.launch_ns,
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
            start_ns: m.start_ns,
            end_ns: m.end_ns,
            launch_ns: m.launch_ns,
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

    /// The host time that places it in an iteration: its launch, else its start.
    pub fn anchor_ns(&self) -> u64 {
        if self.launch_ns != 0 {
            self.launch_ns
        } else {
            self.start_ns
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
    /// Activities (kernels, graph launches or memory operations).
    pub kernels: u32,
    /// GPU-time-weighted mean theoretical occupancy of its kernels, when known.
    pub occupancy: Option<f64>,
    /// GPU idle time just before its activities (since the previous activity on the GPU
    /// ended), ns: what late launches of this operator cost the iteration.
    pub gap_ns: u64,
    /// Mean launch latency (GPU start − API entry) of its activities, ns, when known.
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
    /// GPU time covered by at least one activity, ns.
    pub gpu_busy_ns: u64,
    /// Start of its first GPU activity or CUDA event, ns (the iteration's start when it has
    /// none).
    pub gpu_start_ns: u64,
    /// End of its last GPU activity or CUDA event, ns (the iteration's start when it has none).
    pub gpu_end_ns: u64,
    /// Eager kernels plus graph kernel nodes.
    pub kernels: u32,
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
    /// GPU idle time from the iteration's start to its first activity, ns (host wait, data
    /// loading).
    pub idle_before_first_ns: u64,
    /// GPU idle time between its first activity and its last, ns (launch gaps).
    pub gaps_ns: u64,
    /// Launch latencies (GPU start − API entry) of its activities, ns, sorted.
    pub launch_latencies_ns: Vec<u64>,
    /// Time per operator, largest first.
    pub ops: Vec<OpTime>,
    /// GPU-time-weighted mean theoretical occupancy of its kernels, when known.
    pub occupancy: Option<f64>,
    /// CUDA device ordinal of its activities (the one with the most GPU time), when it has any.
    pub device: Option<u32>,
    /// What NVML saw on that GPU while it ran (filled in by the agent once a sample after its
    /// end exists; `None` without NVML).
    pub gpu: Option<IterationGpu>,
}

impl Iteration {
    /// Wall time, ns.
    pub fn wall_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
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

/// Launch configurations whose occupancy an assembler remembers.
const MAX_OCCUPANCY_CACHE: usize = 4096;

/// Graph nodes whose operator an assembler remembers.
const MAX_NODE_OPS: usize = 1 << 18;

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
    by_label: FxHashMap<Arc<str>, u32>,
    info: Vec<(Arc<str>, OpKind)>,
    overflowed: u64,
}

impl Default for OpTable {
    fn default() -> Self {
        Self {
            by_key: FxHashMap::default(),
            by_label: FxHashMap::default(),
            info: vec![(Arc::from(OVERFLOW_OP), OpKind::Compute)],
            overflowed: 0,
        }
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
    node_ops: FxHashMap<u64, u32>,
    pending: Vec<Activity>,
    steps: BTreeMap<u64, (Option<u64>, Option<u64>)>,
    marked: bool,
    next_detected: u64,
    graph_counts: HashMap<u32, u64>,
    /// GPU time of node-level kernels by graph, then by (operator id, kernel name id).
    graph_contents: FxHashMap<u32, FxHashMap<(u32, u32), u64>>,
    /// Whether `graph_contents` grew since [`TraceAssembler::graph_ops`] was last asked.
    graph_contents_changed: bool,
    table: OpTable,
    /// Scratch of `summarise`, indexed by operator.
    acc: Vec<OpAcc>,
    /// Scratch of `summarise`: activities sorted by start.
    sorted: Vec<Activity>,
    /// Scratch of `summarise`: operators seen in the iteration.
    touched: Vec<u32>,
    /// Scratch of `summarise`: communication and compute intervals.
    comm_iv: Vec<(u64, u64)>,
    compute_iv: Vec<(u64, u64)>,
    /// The period of the kernel sequence last detected, and how many kernels were pending
    /// when detection last failed.
    period: Option<usize>,
    period_failed_at: usize,
    /// Records seen, by kind: kernels, graphs, memory, nodes, strings, steps.
    pub seen: [u64; 6],
    /// Activities that belonged to no iteration (between steps, or too late for theirs).
    pub late: u64,
    limits: Option<SmLimits>,
    /// (threads per block, registers, shared memory) → occupancy, for the kernels seen.
    occupancy_cache: FxHashMap<(u32, u32, u32), Option<f32>>,
    /// Strings dropped because [`MAX_STRINGS`] were kept already.
    pub strings_dropped: u64,
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
        if let Some(&i) = self.table.by_key.get(&key) {
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
                *by_label.entry(label).or_default() += ns;
            }
            let total = by_label.values().sum::<u64>().max(1) as f64;
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
                    a.occupancy = match self.occupancy_cache.get(&key) {
                        Some(o) => *o,
                        None => {
                            let o = l.occupancy(threads, k.registers, smem).map(|o| o as f32);
                            if self.occupancy_cache.len() < MAX_OCCUPANCY_CACHE {
                                self.occupancy_cache.insert(key, o);
                            }
                            o
                        }
                    };
                }
                if a.op_id == 0 && k.graph_node_id != 0 {
                    a.op_id = self.node_ops.get(&k.graph_node_id).copied().unwrap_or(0);
                }
                if k.graph_id != 0 {
                    *self
                        .graph_contents
                        .entry(k.graph_id)
                        .or_default()
                        .entry((a.op_id, a.name_id))
                        .or_default() += a.duration_ns();
                    self.graph_contents_changed = true;
                }
                a
            }
            AnyRecord::GpuGraph(g) => {
                self.seen[1] += 1;
                *self.graph_counts.entry(g.graph_id).or_default() += 1;
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
                start_ns: e.ts_ns,
                end_ns: e.ts_ns,
                launch_ns: 0,
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
                let op = if n.op_id != 0 {
                    n.op_id
                } else {
                    self.node_ops.get(&n.original_node_id).copied().unwrap_or(0)
                };
                if op != 0 && self.node_ops.len() < MAX_NODE_OPS {
                    self.node_ops.insert(n.node_id, op);
                }
                return;
            }
            AnyRecord::String(s) => {
                self.seen[4] += 1;
                let table = match s.kind {
                    STRING_KERNEL => &mut self.names,
                    STRING_OP => &mut self.ops,
                    _ => return,
                };
                if table.len() >= MAX_STRINGS && !table.contains_key(&s.id) {
                    self.strings_dropped += 1;
                    return;
                }
                table.insert(s.id, String::from_utf8_lossy(s.bytes).into_owned());
                return;
            }
            AnyRecord::Step(st) => {
                self.seen[5] += 1;
                self.marked = true;
                let e = self.steps.entry(st.step).or_default();
                match st.phase {
                    STEP_BEGIN => e.0 = Some(st.ts_ns),
                    STEP_END => e.1 = Some(st.ts_ns),
                    _ => {}
                }
                return;
            }
            _ => return,
        };
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
        if self.marked {
            self.take_marked(now_ns, settle_ns, flush)
        } else {
            self.take_detected(flush)
        }
    }

    /// Sorts the pending activities by anchor (cheap when they already are, as records mostly
    /// arrive in order).
    fn sort_pending(&mut self) {
        if !self.pending.is_sorted_by_key(Activity::anchor_ns) {
            self.pending.sort_by_key(Activity::anchor_ns);
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
        // Keep what no window used, in order.
        if used.iter().any(|u| u.1 > u.0) {
            let mut keep = Vec::with_capacity(self.pending.len());
            let mut next = 0;
            for &(lo, hi) in &used {
                keep.extend_from_slice(&self.pending[next..lo.max(next)]);
                next = next.max(hi);
            }
            keep.extend_from_slice(&self.pending[next..]);
            self.pending = keep;
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
            if period_score(tail(names), p) >= PERIOD_MATCH {
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

    fn take_detected(&mut self, flush: bool) -> Vec<Iteration> {
        self.sort_pending();
        // The graph launched most often; among equals the one created first (lowest id), so
        // that the choice does not depend on hash order.
        let boundaries: Vec<u64> = match self
            .graph_counts
            .iter()
            .max_by_key(|(g, n)| (**n, std::cmp::Reverse(**g)))
        {
            Some((&g, &n)) if n >= 2 => self
                .pending
                .iter()
                .filter(|a| a.kind == ActivityKind::Graph && a.graph_id == g)
                .map(Activity::anchor_ns)
                .collect(),
            _ => {
                let names: Vec<u32> = self
                    .pending
                    .iter()
                    .filter(|a| a.kind == ActivityKind::Kernel)
                    .map(|a| a.name_id)
                    .collect();
                match self.kernel_period(&names) {
                    Some(p) => self
                        .pending
                        .iter()
                        .filter(|a| a.kind == ActivityKind::Kernel)
                        .step_by(p)
                        .map(Activity::anchor_ns)
                        .collect(),
                    None => Vec::new(),
                }
            }
        };
        let windows: Vec<(u64, u64, u64)> = boundaries
            .windows(2)
            .enumerate()
            .map(|(k, w)| (self.next_detected + k as u64, w[0], w[1]))
            .collect();
        self.next_detected += windows.len() as u64;
        let cut = windows.last().map(|w| w.2);
        let out = self.cut(&windows, false, false);
        if flush {
            self.pending.clear();
        } else if let Some(cut) = cut {
            let before = self.pending.partition_point(|a| a.anchor_ns() < cut);
            self.pending.drain(..before);
        }
        out
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
        sorted.extend_from_slice(&self.pending[range]);
        if !sorted.is_sorted_by_key(|a| (a.start_ns, a.end_ns)) {
            sorted.sort_unstable_by_key(|a| (a.start_ns, a.end_ns));
        }
        let it = self.summarise(step, marked, b, e, &sorted);
        self.sorted = sorted;
        it
    }

    /// One iteration from its activities, sorted by start.
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
        // The busy interval being merged, and where the GPU was last busy until.
        let mut cur: Option<(u64, u64)> = None;
        let mut touched = std::mem::take(&mut self.touched);
        touched.clear();
        let mut lat: Vec<u64> = Vec::new();
        let (mut kernels, mut graph_launches, mut memory_ops) = (0u32, 0u32, 0u32);
        let (mut memory_ns, mut compute_ns, mut comm_ns, mut comm_kernels) =
            (0u64, 0u64, 0u64, 0u32);
        let mut by_device: [(u32, u64); 4] = [(u32::MAX, 0); 4];
        let mut first_start = None;
        // Intervals of communication and of compute, for their overlap (buffers reused).
        let mut comm_iv = std::mem::take(&mut self.comm_iv);
        let mut compute_iv = std::mem::take(&mut self.compute_iv);
        for a in acts {
            let d = a.duration_ns();
            if let Some(slot) = by_device
                .iter_mut()
                .find(|s| s.0 == a.device || s.0 == u32::MAX)
            {
                slot.0 = a.device;
                slot.1 += d;
            }
            if a.kind == ActivityKind::Event {
                continue;
            }
            // Launch gap: idle GPU time just before this activity.
            let gap = match cur {
                Some((_, ce)) if a.start_ns > ce => a.start_ns - ce,
                _ => 0,
            };
            if a.end_ns > a.start_ns {
                first_start.get_or_insert(a.start_ns);
                match cur {
                    Some((cs, ce)) if a.start_ns <= ce => cur = Some((cs, ce.max(a.end_ns))),
                    Some((cs, ce)) => {
                        busy += ce - cs;
                        gaps += a.start_ns - ce;
                        cur = Some((a.start_ns, a.end_ns));
                    }
                    None => cur = Some((a.start_ns, a.end_ns)),
                }
            }
            let i = self.op_index(a) as usize;
            if i >= self.acc.len() {
                self.acc.resize(i + 64, OpAcc::default());
            }
            let acc = &mut self.acc[i];
            if acc.count == 0 {
                touched.push(i as u32);
            }
            acc.gpu_ns += d;
            acc.count += 1;
            acc.gap_ns += gap;
            acc.bytes += a.bytes;
            if let Some(o) = a.occupancy {
                acc.occ_weighted += f64::from(o) * d as f64;
                acc.occ_ns += d;
            }
            if a.launch_ns != 0 && a.kind != ActivityKind::GraphKernel {
                let l = a.start_ns.saturating_sub(a.launch_ns);
                lat.push(l);
                acc.launch_sum += l;
                acc.launch_count += 1;
            }
            match a.kind {
                ActivityKind::Kernel | ActivityKind::GraphKernel => {
                    kernels += 1;
                    if self.table.info[i].1 == OpKind::Communication {
                        comm_ns += d;
                        comm_kernels += 1;
                        comm_iv.push((a.start_ns, a.end_ns));
                    } else {
                        compute_ns += d;
                        compute_iv.push((a.start_ns, a.end_ns));
                    }
                }
                ActivityKind::Graph => {
                    graph_launches += 1;
                    compute_ns += d;
                    compute_iv.push((a.start_ns, a.end_ns));
                }
                ActivityKind::Memory => {
                    memory_ops += 1;
                    memory_ns += d;
                }
                ActivityKind::Event => {}
            }
        }
        if let Some((cs, ce)) = cur {
            busy += ce - cs;
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
                kernels: acc.count,
                occupancy: (acc.occ_ns > 0).then(|| acc.occ_weighted / acc.occ_ns as f64),
                gap_ns: acc.gap_ns,
                launch_latency_ns: (acc.launch_count > 0)
                    .then(|| acc.launch_sum / u64::from(acc.launch_count)),
                bytes: acc.bytes,
            });
        }
        ops.sort_unstable_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then_with(|| a.op.cmp(&b.op)));
        self.touched = touched;
        // The GPU span also counts CUDA events the script recorded on its streams.
        let span_start = acts.iter().map(|a| a.start_ns).min();
        let span_end = acts.iter().map(|a| a.end_ns).max();
        Iteration {
            step,
            marked,
            start_ns: b,
            end_ns: e,
            gpu_busy_ns: busy,
            gpu_start_ns: span_start.unwrap_or(b),
            gpu_end_ns: span_end.unwrap_or(b),
            kernels,
            graph_launches,
            memory_ops,
            memory_ns,
            compute_ns,
            comm_ns,
            comm_kernels,
            comm_overlap_ns,
            idle_before_first_ns: first_start.unwrap_or(e).saturating_sub(b),
            gaps_ns: gaps,
            launch_latencies_ns: lat,
            ops,
            occupancy: (occ.1 > 0).then(|| occ.0 / occ.1 as f64),
            device: by_device
                .iter()
                .filter(|s| s.0 != u32::MAX)
                .max_by_key(|s| (s.1, std::cmp::Reverse(s.0)))
                .map(|s| s.0),
            gpu: None,
        }
    }
}

/// Kernels looked at to find the period of a job's kernel sequence (bounds the cost).
const PERIOD_WINDOW: usize = 8192;

/// The share of positions `i` with `seq[i] == seq[i + p]` a period needs.
const PERIOD_MATCH: f64 = 0.8;

fn tail(seq: &[u32]) -> &[u32] {
    &seq[seq.len().saturating_sub(PERIOD_WINDOW)..]
}

fn period_score(seq: &[u32], p: usize) -> f64 {
    let n = seq.len();
    if p == 0 || n <= p {
        return 0.0;
    }
    (0..n - p).filter(|&i| seq[i] == seq[i + p]).count() as f64 / (n - p) as f64
}

/// The period `p` (2 ≤ p ≤ len/3) for which `seq[i] == seq[i + p]` holds most often over the
/// last [`PERIOD_WINDOW`] elements, if it holds for at least 80% of them (kernels launched by
/// two threads, e.g. the autograd engine's, interleave a little differently every step: 90%
/// was measured on a PyTorch job). The recent window skips start-up steps, which launch one-off
/// kernels.
pub fn detect_period(seq: &[u32]) -> Option<usize> {
    let seq = tail(seq);
    let n = seq.len();
    let (p, best) = (2..=n / 3)
        .map(|p| (p, period_score(seq, p)))
        .fold((0, 0.0), |acc, x| if x.1 > acc.1 { x } else { acc });
    (best >= PERIOD_MATCH).then_some(p)
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
        assert_eq!(i.launch_latencies_ns, vec![400, 800]);
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
    fn detects_iterations_from_a_periodic_kernel_sequence() {
        let mut t = TraceAssembler::new();
        let mut ts = 0u64;
        for _ in 0..10 {
            for name in [5u32, 6, 7, 8] {
                ts += 100;
                t.push(&AnyRecord::GpuKernel(kernel(ts + 10, 50, ts, name, 0)));
            }
        }
        let it = t.take_iterations(0, 0, false);
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
        assert_eq!(overflow.kernels, 10);
        assert_eq!(it[0].kernels, n);
        // Strings beyond the cap are dropped and counted.
        for id in 0..(MAX_STRINGS as u32) {
            let bytes = string(1_000_000 + id, STRING_KERNEL, "k");
            let (r, _) = slo_probe_common::decode(&bytes).expect("string");
            t.push(&r);
        }
        assert_eq!(t.strings_dropped, u64::from(n));
    }

    #[test]
    fn period_detection() {
        assert_eq!(
            detect_period(&[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]),
            Some(3)
        );
        assert_eq!(detect_period(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), None);
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
