//! GPU traces from the CUPTI shim, turned into iterations: names and graph nodes resolved,
//! activities assigned to the iteration whose host-side window contains their launch, and per
//! iteration the wall time, GPU busy time, kernel and graph counts, launch latency, the GPU idle
//! gap before the first kernel (data loading / host wait), and time per operator.
//!
//! Iteration boundaries come from step markers (`slo_probe.step()`) when the script sends them;
//! otherwise they are detected: each launch of the CUDA graph replayed most often starts an
//! iteration, or, without graphs, the period of the kernel-name sequence.

use std::collections::{BTreeMap, HashMap};

use crate::{gpu::IterationGpu, occupancy::SmLimits};
use slo_probe_common::{
    gpu::{STEP_BEGIN, STEP_END, STRING_KERNEL, STRING_OP},
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
    /// Kernel name id (0 for graphs and memory).
    pub name_id: u32,
    /// Operator id (0 if none).
    pub op_id: u32,
    /// Graph id (0 if none).
    pub graph_id: u32,
    /// Stream.
    pub stream_id: u32,
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
            name_id: k.name_id,
            op_id: k.op_id,
            graph_id: k.graph_id,
            stream_id: k.stream_id,
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
            name_id: 0,
            op_id: g.op_id,
            graph_id: g.graph_id,
            stream_id: g.stream_id,
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
            name_id: 0,
            op_id: m.op_id,
            graph_id: m.graph_id,
            stream_id: m.stream_id,
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

/// Time spent by one operator in an iteration.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    /// Operator label: the script's op name, else the fused operators of an Inductor kernel
    /// name, else the kernel name.
    pub op: String,
    /// Sum of its kernels' GPU time, ns.
    pub gpu_ns: u64,
    /// Kernels.
    pub kernels: u32,
    /// GPU-time-weighted mean theoretical occupancy of its kernels, when known.
    pub occupancy: Option<f64>,
}

/// One training iteration.
#[derive(Clone, Debug, PartialEq)]
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
    /// GPU idle time from the iteration's start to its first activity, ns (host wait, data
    /// loading).
    pub idle_before_first_ns: u64,
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

/// What the agent knows about one training process's shim.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShimProcess {
    /// Training process.
    pub pid: u32,
    /// Connected now.
    pub connected: bool,
    /// `STATUS_*` bits the shim published (`slo_probe_common::ring`).
    pub status: u64,
    /// CUPTI version the shim runs against (0: not tracing).
    pub cupti_version: u32,
    /// Records consumed.
    pub records: u64,
    /// Records the shim dropped (ring or queue full).
    pub dropped: u64,
    /// Records CUPTI dropped.
    pub cupti_dropped: u64,
    /// Bytes the agent skipped as corrupt.
    pub corrupt_bytes: u64,
    /// Records that did not decode.
    pub decode_failed: u64,
    /// Records seen by kind: kernels, graphs, memory, graph nodes, strings, steps.
    pub seen: [u64; 6],
    /// GPU activities outside every iteration (between steps, or late for theirs).
    pub late: u64,
    /// Completed iterations, oldest first (a bounded window).
    pub iterations: Vec<Iteration>,
    /// Iterations completed since the shim registered.
    pub iterations_total: u64,
    /// What each CUDA graph runs (operators by share of its GPU time), for the graphs that
    /// node-level tracing has seen; graph-level records are labelled `graph#<id>`.
    pub graph_ops: BTreeMap<u32, Vec<(String, f64)>>,
}

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

/// Folds records into iterations.
#[derive(Default)]
pub struct TraceAssembler {
    names: HashMap<u32, String>,
    ops: HashMap<u32, String>,
    node_ops: HashMap<u64, u32>,
    pending: Vec<Activity>,
    steps: BTreeMap<u64, (Option<u64>, Option<u64>)>,
    marked: bool,
    next_detected: u64,
    graph_counts: HashMap<u32, u64>,
    /// GPU time of node-level kernels by graph, then by (operator id, kernel name id).
    graph_contents: HashMap<u32, HashMap<(u32, u32), u64>>,
    /// Whether `graph_contents` grew since [`TraceAssembler::graph_ops`] was last asked.
    graph_contents_changed: bool,
    /// Records seen, by kind: kernels, graphs, memory, nodes, strings, steps.
    pub seen: [u64; 6],
    /// Activities that belonged to no iteration (between steps, or too late for theirs).
    pub late: u64,
    limits: Option<SmLimits>,
}

impl TraceAssembler {
    /// An empty assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the GPU's per-SM limits, for theoretical occupancy of the kernels that follow.
    pub fn set_limits(&mut self, limits: Option<SmLimits>) {
        self.limits = limits;
    }

    /// A name by id (kernel or operator), if its string record has arrived.
    pub fn name(&self, id: u32) -> Option<&str> {
        self.names
            .get(&id)
            .or_else(|| self.ops.get(&id))
            .map(String::as_str)
    }

    /// The operator label of an activity (see [`OpTime::op`]).
    pub fn op_label(&self, a: &Activity) -> String {
        if a.op_id != 0 {
            if let Some(op) = self.ops.get(&a.op_id) {
                return op.clone();
            }
        }
        match a.kind {
            ActivityKind::Graph => return format!("graph#{}", a.graph_id),
            ActivityKind::Memory => return "memory".into(),
            _ => {}
        }
        match self.names.get(&a.name_id) {
            Some(n) => short_kernel_name(n),
            None => format!("kernel#{}", a.name_id),
        }
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
                let a = Activity {
                    kind: ActivityKind::GraphKernel,
                    start_ns: 0,
                    end_ns: 0,
                    launch_ns: 0,
                    name_id,
                    op_id,
                    graph_id: graph,
                    stream_id: 0,
                    occupancy: None,
                    device: 0,
                };
                *by_label.entry(self.op_label(&a)).or_default() += ns;
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
                a.occupancy = self.limits.and_then(|l| {
                    let threads = k.block.iter().product::<u32>();
                    l.occupancy(threads, k.registers, k.static_smem + k.dynamic_smem)
                        .map(|o| o as f32)
                });
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
                name_id: 0,
                op_id: 0,
                graph_id: 0,
                stream_id: e.stream_id,
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
                if op != 0 {
                    self.node_ops.insert(n.node_id, op);
                }
                return;
            }
            AnyRecord::String(s) => {
                self.seen[4] += 1;
                let text = String::from_utf8_lossy(s.bytes).into_owned();
                match s.kind {
                    STRING_KERNEL => self.names.insert(s.id, text),
                    STRING_OP => self.ops.insert(s.id, text),
                    _ => None,
                };
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
    /// [`TraceAssembler::late`].
    pub fn take_iterations(&mut self, now_ns: u64, settle_ns: u64, flush: bool) -> Vec<Iteration> {
        if self.marked {
            self.take_marked(now_ns, settle_ns, flush)
        } else {
            self.take_detected(flush)
        }
    }

    fn take_marked(&mut self, now_ns: u64, settle_ns: u64, flush: bool) -> Vec<Iteration> {
        let horizon = now_ns.saturating_sub(settle_ns);
        let ready: Vec<(u64, u64, u64)> = self
            .steps
            .iter()
            .filter_map(|(&step, &(b, e))| Some((step, b?, e?)))
            .filter(|&(_, _, e)| flush || e <= horizon)
            .collect();
        let mut out = Vec::new();
        for (step, b, e) in ready {
            self.steps.remove(&step);
            let (inside, rest): (Vec<Activity>, Vec<Activity>) = self
                .pending
                .drain(..)
                .partition(|a| a.anchor_ns() >= b && a.anchor_ns() <= e);
            self.pending = rest;
            out.push(self.summarise(step, true, b, e, &inside));
        }
        // Activities launched before the oldest open step belong to no iteration: between two
        // steps, or late for one already returned.
        if let Some((_, (Some(b), _))) = self.steps.iter().next() {
            let b = *b;
            let before = self.pending.len();
            self.pending.retain(|a| a.anchor_ns() >= b);
            self.late += (before - self.pending.len()) as u64;
        }
        out.sort_by_key(|i| i.start_ns);
        out
    }

    fn take_detected(&mut self, flush: bool) -> Vec<Iteration> {
        self.pending.sort_by_key(|a| a.anchor_ns());
        let boundaries: Vec<u64> = match self.graph_counts.iter().max_by_key(|(_, n)| **n) {
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
                match detect_period(&names) {
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
        let mut out = Vec::new();
        let mut cut = 0u64;
        for w in boundaries.windows(2) {
            let (b, e) = (w[0], w[1]);
            let inside: Vec<Activity> = self
                .pending
                .iter()
                .filter(|a| a.anchor_ns() >= b && a.anchor_ns() < e)
                .copied()
                .collect();
            let step = self.next_detected;
            self.next_detected += 1;
            out.push(self.summarise(step, false, b, e, &inside));
            cut = e;
        }
        if flush {
            self.pending.clear();
        } else if cut > 0 {
            self.pending.retain(|a| a.anchor_ns() >= cut);
        }
        out
    }

    fn summarise(&self, step: u64, marked: bool, b: u64, e: u64, acts: &[Activity]) -> Iteration {
        let mut intervals: Vec<(u64, u64)> = acts
            .iter()
            .filter(|a| a.end_ns > a.start_ns)
            .map(|a| (a.start_ns, a.end_ns))
            .collect();
        intervals.sort_unstable();
        let mut busy = 0u64;
        let mut cur: Option<(u64, u64)> = None;
        for (s, t) in intervals.iter().copied() {
            match cur {
                Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(t))),
                Some((cs, ce)) => {
                    busy += ce - cs;
                    cur = Some((s, t));
                }
                None => cur = Some((s, t)),
            }
        }
        if let Some((cs, ce)) = cur {
            busy += ce - cs;
        }
        let first_start = intervals.first().map_or(e, |(s, _)| *s);
        // The GPU span also counts CUDA events the script recorded on its streams.
        let span_start = acts.iter().map(|a| a.start_ns).min();
        let span_end = acts.iter().map(|a| a.end_ns).max();
        let mut lat: Vec<u64> = acts
            .iter()
            .filter(|a| a.launch_ns != 0 && a.kind != ActivityKind::GraphKernel)
            .map(|a| a.start_ns.saturating_sub(a.launch_ns))
            .collect();
        lat.sort_unstable();
        // (GPU ns, kernels, occupancy × ns, ns with a known occupancy)
        let mut by_op: HashMap<String, (u64, u32, f64, u64)> = HashMap::new();
        let weighted = |a: &Activity| {
            a.occupancy.map_or((0.0, 0), |o| {
                (f64::from(o) * a.duration_ns() as f64, a.duration_ns())
            })
        };
        for a in acts.iter().filter(|a| {
            matches!(
                a.kind,
                ActivityKind::Kernel | ActivityKind::GraphKernel | ActivityKind::Graph
            )
        }) {
            let e = by_op.entry(self.op_label(a)).or_default();
            let (w, n) = weighted(a);
            e.0 += a.duration_ns();
            e.1 += 1;
            e.2 += w;
            e.3 += n;
        }
        let mean = |w: f64, n: u64| (n > 0).then(|| w / n as f64);
        let (w_all, n_all) = by_op
            .values()
            .fold((0.0, 0), |(w, n), e| (w + e.2, n + e.3));
        let mut ops: Vec<OpTime> = by_op
            .into_iter()
            .map(|(op, (gpu_ns, kernels, w, n))| OpTime {
                op,
                gpu_ns,
                kernels,
                occupancy: mean(w, n),
            })
            .collect();
        ops.sort_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then(a.op.cmp(&b.op)));
        Iteration {
            step,
            marked,
            start_ns: b,
            end_ns: e,
            gpu_busy_ns: busy,
            gpu_start_ns: span_start.unwrap_or(b),
            gpu_end_ns: span_end.unwrap_or(b),
            kernels: acts
                .iter()
                .filter(|a| matches!(a.kind, ActivityKind::Kernel | ActivityKind::GraphKernel))
                .count() as u32,
            graph_launches: acts
                .iter()
                .filter(|a| a.kind == ActivityKind::Graph)
                .count() as u32,
            memory_ops: acts
                .iter()
                .filter(|a| a.kind == ActivityKind::Memory)
                .count() as u32,
            memory_ns: acts
                .iter()
                .filter(|a| a.kind == ActivityKind::Memory)
                .map(Activity::duration_ns)
                .sum(),
            idle_before_first_ns: first_start.saturating_sub(b),
            launch_latencies_ns: lat,
            ops,
            occupancy: mean(w_all, n_all),
            device: main_device(acts),
            gpu: None,
        }
    }
}

/// The device with the most GPU time among `acts`.
fn main_device(acts: &[Activity]) -> Option<u32> {
    let mut by_dev: BTreeMap<u32, u64> = BTreeMap::new();
    for a in acts {
        *by_dev.entry(a.device).or_default() += a.duration_ns();
    }
    by_dev
        .into_iter()
        .max_by_key(|&(d, ns)| (ns, std::cmp::Reverse(d)))
        .map(|(d, _)| d)
}

/// Kernels looked at to find the period of a job's kernel sequence (bounds the cost).
const PERIOD_WINDOW: usize = 8192;

/// The period `p` (2 ≤ p ≤ len/3) for which `seq[i] == seq[i + p]` holds most often over the
/// last [`PERIOD_WINDOW`] elements, if it holds for at least 80% of them (kernels launched by
/// two threads, e.g. the autograd engine's, interleave a little differently every step: 90%
/// was measured on a PyTorch job). The recent window skips start-up steps, which launch one-off
/// kernels.
pub fn detect_period(seq: &[u32]) -> Option<usize> {
    let seq = &seq[seq.len().saturating_sub(PERIOD_WINDOW)..];
    let n = seq.len();
    let score =
        |p: usize| (0..n - p).filter(|&i| seq[i] == seq[i + p]).count() as f64 / (n - p) as f64;
    let (p, best) =
        (2..=n / 3)
            .map(|p| (p, score(p)))
            .fold((0, 0.0), |acc, x| if x.1 > acc.1 { x } else { acc });
    (best >= 0.8).then_some(p)
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
        assert!(i.ops.iter().any(|o| o.op == "gelu" && o.gpu_ns == 600));
        assert!(i
            .ops
            .iter()
            .any(|o| o.op == "blocks.0.up" && o.gpu_ns == 600));
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
    fn period_detection() {
        assert_eq!(
            detect_period(&[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]),
            Some(3)
        );
        assert_eq!(detect_period(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), None);
    }
}
