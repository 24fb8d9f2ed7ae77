//! Attribution: which operator made the iterations slower, along which dimension, and which
//! host cause in the same window goes with it.
//!
//! The SLO engine keeps a [`Profile`] per window: per operator the GPU time, the GPU idle time
//! just before its activities (launch gaps), activity count, theoretical occupancy and bytes,
//! plus the iteration-level idle time before the first activity, all summed over the window's
//! iterations, and the host's deltas over the window. [`attribute`] compares the profile of the
//! windows that breached with the baseline profile of healthy windows, per iteration: each
//! operator's contribution to the change of the iteration time is the change of its GPU time plus
//! the change of its launch gaps; operators are ranked by it and each is classified by the
//! dimension that changed (see [`Dimension`]). Two pseudo-operators stand for what belongs to no
//! operator: [`DATA_LOADING_OP`] (GPU idle before an iteration's first activity) and
//! [`LAUNCHES_OP`] (launch gaps grown across many operators at once, the mark of a launching
//! thread kept off the CPU). The host deltas of the same windows, against the baseline's, give
//! the cause behind the dimension: run-queue wait of the launching or loader threads, cgroup
//! throttling, TCP retransmits on the communication sockets.
//!
//! Only grown contributions are listed, so a shrink that is the other side of a growth is
//! offset against that growth before ranking, or the causes would add up to more than the
//! iteration changed: work grown over work on another stream gives up the critical-path time it
//! now covers (`behind_grown`); CUDA graphs share their net change (a recaptured module shows as
//! a new graph and an old one gone); a slower batch copy gives up the idle time before the first
//! kernel that it grew into (`into_idle_before`); idle time that moved from before other
//! operators to before the first kernel is counted once. In a launch-bound job sampled by the
//! shim, the launch gaps also take what the untraced iterations grew (`add_untraced_growth`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    sync::Arc,
};

use rustc_hash::FxHashMap;
use slo_probe_common::gpu::decode_launch;

use crate::{
    gputrace::{graph_id_of, GraphComposition, Iteration, OpKind},
    host::HostDelta,
    roles::Role,
};

/// Along what an operator got slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// Its work reached the GPU later: GPU idle before its kernels grew (a host sync, slow
    /// launches, a launching thread kept off the CPU).
    LaunchLatency,
    /// Its kernels ran with fewer resident warps: a launch configuration with lower theoretical
    /// occupancy.
    Occupancy,
    /// Its memory operations moved the same bytes more slowly.
    MemoryBandwidth,
    /// Its kernels ran longer with the same launch configuration.
    Execution,
    /// Collective communication took longer.
    Communication,
    /// The GPU waited longer for the next batch at the start of iterations.
    DataLoading,
}

impl Dimension {
    /// Lower-case name, with `_`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LaunchLatency => "launch_latency",
            Self::Occupancy => "occupancy",
            Self::MemoryBandwidth => "memory_bandwidth",
            Self::Execution => "execution",
            Self::Communication => "communication",
            Self::DataLoading => "data_loading",
        }
    }
}

/// The pseudo-operator for the GPU idle time before an iteration's first activity.
pub const DATA_LOADING_OP: &str = "(data loading)";

/// The pseudo-operator for launch gaps grown across many operators.
pub const LAUNCHES_OP: &str = "(kernel launches)";

/// One operator summed over a window's iterations.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpAgg {
    /// What it does.
    pub kind: OpKind,
    /// GPU time, ns.
    pub gpu_ns: u64,
    /// GPU time on the critical path (see [`crate::gputrace::OpTime::critical_ns`]), ns.
    pub critical_ns: u64,
    /// Activities.
    pub count: u64,
    /// GPU idle time just before its activities because they were launched late, ns.
    pub gap_ns: u64,
    /// GPU idle time just before its activities while they were queued, ns.
    pub wait_ns: u64,
    /// Occupancy × ns, over activities with a known occupancy.
    pub occ_weighted: f64,
    /// ns of activities with a known occupancy.
    pub occ_ns: u64,
    /// Bytes moved.
    pub bytes: u64,
}

impl OpAgg {
    fn of(o: &crate::gputrace::OpTime) -> Self {
        OpAgg {
            kind: o.kind,
            gpu_ns: o.gpu_ns,
            critical_ns: o.critical_ns,
            count: u64::from(o.kernels),
            gap_ns: o.gap_ns,
            wait_ns: o.wait_ns,
            occ_weighted: o.occupancy.map_or(0.0, |v| v * o.gpu_ns as f64),
            occ_ns: if o.occupancy.is_some() { o.gpu_ns } else { 0 },
            bytes: o.bytes,
        }
    }

    fn add(&mut self, o: &OpAgg) {
        self.gpu_ns = self.gpu_ns.saturating_add(o.gpu_ns);
        self.critical_ns = self.critical_ns.saturating_add(o.critical_ns);
        self.count += o.count;
        self.gap_ns = self.gap_ns.saturating_add(o.gap_ns);
        self.wait_ns = self.wait_ns.saturating_add(o.wait_ns);
        self.occ_weighted += o.occ_weighted;
        self.occ_ns = self.occ_ns.saturating_add(o.occ_ns);
        self.bytes = self.bytes.saturating_add(o.bytes);
    }

    fn occupancy(&self) -> Option<f64> {
        (self.occ_ns > 0).then(|| self.occ_weighted / self.occ_ns as f64)
    }
}

/// An operator label as a map key: equal when the same allocation (the assembler hands out one
/// `Arc` per label, so lookups rarely compare bytes) or the same text.
#[derive(Clone, Debug, Eq, PartialOrd, Ord)]
pub struct OpName(pub Arc<str>);

impl PartialEq for OpName {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.0, &o.0) || *self.0 == *o.0
    }
}

impl std::hash::Hash for OpName {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.hash(h);
    }
}

impl std::borrow::Borrow<str> for OpName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// Most operators a profile keeps apart; the rest are summed under [`OVERFLOW`].
pub const MAX_PROFILE_OPS: usize = 4096;

/// Where a profile sums operators beyond [`MAX_PROFILE_OPS`].
pub const OVERFLOW: &str = "(other operators)";

/// A window's iterations summed, for attribution.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Iterations.
    pub iterations: u64,
    /// Of those, the iterations whose kernels were traced: operators, idle times and clocks
    /// come from these alone (the shim samples kernels in windows).
    pub traced: u64,
    /// Wall time, ns.
    pub wall_ns: u64,
    /// Wall time of the traced iterations alone, ns.
    pub traced_wall_ns: u64,
    /// GPU idle before the first activity, ns, of the traced iterations where it is known
    /// ([`Iteration::idle_before_first`]).
    pub idle_before_ns: u64,
    /// The iterations `idle_before_ns` sums.
    pub idle_before_iterations: u64,
    /// Per operator.
    pub ops: FxHashMap<OpName, OpAgg>,
    /// Operators' activities summed under [`OVERFLOW`] because the profile was full.
    pub overflowed: u64,
    /// Host deltas over the window.
    pub host: HostDelta,
    /// Sum of the SM clocks NVML saw during the iterations that have NVML data, MHz, and how
    /// many they are.
    pub sm_clock_mhz: (f64, u64),
    /// The traced node-level iterations (CUDA graphs traced node by node), apart: they tell
    /// what a graph runs, and [`refine_graph_cause`] compares them with each other only.
    pub nodes: NodeProfile,
}

/// A window's node-level iterations summed: per operator as in [`Profile`], where a graph
/// shows its kernels by the operator that captured them instead of one graph launch.
#[derive(Clone, Debug, Default)]
pub struct NodeProfile {
    /// Node-level iterations.
    pub iterations: u64,
    /// Per operator (at most [`MAX_PROFILE_OPS`]; the rest are left out).
    pub ops: FxHashMap<OpName, OpAgg>,
}

impl NodeProfile {
    fn add_iteration(&mut self, it: &Iteration) {
        self.iterations += 1;
        for o in &it.ops {
            self.add_op(&o.op, &OpAgg::of(o));
        }
    }

    /// Adds another window's node-level iterations.
    pub fn merge(&mut self, o: &NodeProfile) {
        self.iterations += o.iterations;
        for (k, v) in &o.ops {
            self.add_op(&k.0, v);
        }
    }

    fn add_op(&mut self, op: &Arc<str>, agg: &OpAgg) {
        if let Some(e) = self.ops.get_mut(op.as_ref()) {
            e.add(agg);
        } else if self.ops.len() < MAX_PROFILE_OPS {
            self.ops.insert(OpName(op.clone()), *agg);
        }
    }
}

impl Profile {
    /// Adds one iteration.
    pub fn add_iteration(&mut self, it: &Iteration) {
        self.iterations += 1;
        self.wall_ns = self.wall_ns.saturating_add(it.step_ns());
        // Node-level iterations show a graph's kernels where the others show one graph
        // launch: they tell what a graph runs, and are compared only with each other.
        if it.traced && it.graph_nodes > 0 {
            self.nodes.add_iteration(it);
        }
        if !it.traced || it.graph_nodes > 0 {
            return;
        }
        self.traced += 1;
        self.traced_wall_ns = self.traced_wall_ns.saturating_add(it.step_ns());
        if let Some(idle) = it.idle_before_first() {
            self.idle_before_ns = self.idle_before_ns.saturating_add(idle);
            self.idle_before_iterations += 1;
        }
        if let Some(c) = it.gpu.as_ref().and_then(|g| g.sm_clock_mhz) {
            self.sm_clock_mhz.0 += c;
            self.sm_clock_mhz.1 += 1;
        }
        for o in &it.ops {
            self.add_op(&o.op, &OpAgg::of(o));
        }
    }

    fn add_op(&mut self, op: &Arc<str>, agg: &OpAgg) {
        let key = OpName(op.clone());
        if let Some(e) = self.ops.get_mut(&key) {
            e.add(agg);
            return;
        }
        if self.ops.len() >= MAX_PROFILE_OPS {
            self.overflowed += agg.count;
            let e = self.ops.entry(OpName(Arc::from(OVERFLOW))).or_default();
            e.add(agg);
            return;
        }
        self.ops.insert(key, *agg);
    }

    /// Adds another profile.
    pub fn merge(&mut self, o: &Profile) {
        self.iterations += o.iterations;
        self.traced += o.traced;
        self.wall_ns = self.wall_ns.saturating_add(o.wall_ns);
        self.traced_wall_ns = self.traced_wall_ns.saturating_add(o.traced_wall_ns);
        self.idle_before_ns = self.idle_before_ns.saturating_add(o.idle_before_ns);
        self.idle_before_iterations += o.idle_before_iterations;
        self.overflowed += o.overflowed;
        self.sm_clock_mhz.0 += o.sm_clock_mhz.0;
        self.sm_clock_mhz.1 += o.sm_clock_mhz.1;
        for (k, v) in &o.ops {
            self.add_op(&k.0, v);
        }
        self.nodes.merge(&o.nodes);
        self.host.add(&o.host);
    }

    /// Mean wall time per iteration, ns.
    pub fn mean_wall_ns(&self) -> f64 {
        per(self.wall_ns, self.iterations)
    }
}

fn per(v: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        v as f64 / n as f64
    }
}

/// One ranked operator.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    /// Operator label, or a pseudo-operator.
    pub op: String,
    /// Dimension.
    pub dimension: Dimension,
    /// Its contribution to the change of the mean iteration time, ns per iteration.
    pub delta_ns: f64,
    /// Its GPU time per iteration before and now, ns.
    pub gpu_ns: (f64, f64),
    /// Its launch gaps per iteration before and now, ns.
    pub gap_ns: (f64, f64),
    /// What changed, in words.
    pub detail: String,
}

/// A host (or device) cause found in the same windows.
#[derive(Clone, Debug, PartialEq)]
pub struct HostCause {
    /// Which: the SLO host node it belongs to (`host.runqueue.main`,
    /// `host.runqueue.data_loader`, `host.runqueue.communication`, `host.runqueue.pin_memory`,
    /// `host.throttling`, `host.retransmits`), or `gpu.sm_clock` for the GPU's clock (NVML).
    pub node: &'static str,
    /// What, in words (`main threads waited 4.1 ms per iteration for a CPU`).
    pub what: String,
    /// How much it grew per iteration (ns, or events for retransmits).
    pub delta: f64,
}

/// What made the iterations slower.
#[derive(Clone, Debug, PartialEq)]
pub struct Attribution {
    /// Mean iteration time before and now, ns.
    pub iteration_ns: (f64, f64),
    /// Operators by contribution, largest first (at most [`TOP`]).
    pub causes: Vec<Cause>,
    /// Host causes that go with the top operator's dimension.
    pub host: Vec<HostCause>,
    /// Iterations compared (baseline, now).
    pub iterations: (u64, u64),
    /// Of those, the traced ones the operators were compared over (baseline, now).
    pub traced: (u64, u64),
}

/// Operators kept in an [`Attribution`].
pub const TOP: usize = 5;

impl Attribution {
    /// The top cause.
    pub fn top(&self) -> Option<&Cause> {
        self.causes.first()
    }

    /// The causes' sum over the change of the mean iteration between the two sides they were
    /// measured over (1.0: they account for the whole change); `None` when it did not grow.
    pub fn sum_ratio(&self) -> Option<f64> {
        let change = self.iteration_ns.1 - self.iteration_ns.0;
        let total: f64 = self.causes.iter().map(|c| c.delta_ns).sum();
        (change > 0.0).then(|| total / change)
    }

    /// The causal chain, e.g. `iteration p99 +38% (17.3 ms → 23.9 ms) ← ncclDevKernel_AllReduce
    /// +6.4 ms per iteration (communication) ← 214 TCP retransmits on 10.0.0.1:41000 ->
    /// 10.0.0.2:29500`. `head` names the SLO and its change. Without a cause it says what was
    /// compared: the iterations did not grow (a node that breached while the step did not slow:
    /// idle time that moved from before the first kernel to between kernels), or no operator's
    /// change kept a share of their growth.
    pub fn chain(&self, head: &str) -> String {
        let mut s = head.to_owned();
        if let Some(c) = self.top() {
            let _ = write!(
                s,
                " ← {} {:+.2} ms per iteration ({}: {})",
                c.op,
                c.delta_ns / 1e6,
                c.dimension.as_str(),
                c.detail
            );
        } else if self.traced.1 > 0 {
            let why = if self.iteration_ns.1 <= self.iteration_ns.0 {
                "the iterations did not grow"
            } else {
                "no operator's change accounts for the iterations' growth"
            };
            let _ = write!(
                s,
                " ← no cause: {why} (mean {} → {}, {} traced iterations)",
                ms(self.iteration_ns.0),
                ms(self.iteration_ns.1),
                self.traced.1
            );
        }
        if let Some(h) = self.host.first() {
            let _ = write!(s, " ← {}", h.what);
        }
        s
    }
}

/// Compares `now` with `baseline` (see the module docs). `None` when either has no iteration.
pub fn attribute(baseline: &Profile, now: &Profile) -> Option<Attribution> {
    if baseline.traced == 0 || now.traced == 0 {
        return None;
    }
    // Per iteration of those traced: the operators' figures come from them.
    let (nb, nn) = (baseline.traced, now.traced);
    let empty = OpAgg::default();
    let mut causes: Vec<Cause> = Vec::new();
    let mut kinds: Vec<OpKind> = Vec::new();
    let mut gap_growth: Vec<f64> = Vec::new();
    // Critical-path time each operator lost while its own GPU time did not shrink: work that
    // another stream's grown work now covers (see `behind_grown`).
    let mut covered = 0.0;
    let mut names: Vec<&OpName> = now.ops.keys().chain(baseline.ops.keys()).collect();
    names.sort();
    names.dedup();
    for op in names {
        let b = baseline.ops.get(op).unwrap_or(&empty);
        let n = now.ops.get(op).unwrap_or(&empty);
        let gpu = (per(b.gpu_ns, nb), per(n.gpu_ns, nn));
        // What it added to the iteration: its GPU time on the critical path, and the GPU idle
        // before it (launched late, or queued behind a dependency). Queueing behind earlier
        // work is in neither: it is never a cause.
        let crit = (per(b.critical_ns, nb), per(n.critical_ns, nn));
        let gap = (per(b.gap_ns + b.wait_ns, nb), per(n.gap_ns + n.wait_ns, nn));
        let d_gpu = crit.1 - crit.0;
        let d_gap = gap.1 - gap.0;
        covered += (-d_gpu - (gpu.0 - gpu.1).max(0.0)).max(0.0);
        gap_growth.push(d_gap.max(0.0));
        let kind = if n.count > 0 { n.kind } else { b.kind };
        let (dimension, detail) = classify(kind, b, n, (nb, nn), d_gpu, d_gap);
        kinds.push(kind);
        causes.push(Cause {
            op: op.0.to_string(),
            dimension,
            delta_ns: d_gpu + d_gap,
            gpu_ns: gpu,
            gap_ns: gap,
            detail,
        });
    }
    if covered > 0.0 {
        behind_grown(&mut causes, covered);
    }
    // CUDA graphs replayed whole: torch.compile captures a changed module as a new graph, so
    // the new graph shows whole and the old one gone. Their grown deltas share the graphs' net
    // change instead (kinds: `kinds[i]` goes with `causes[i]`).
    let graph_ops: Vec<usize> = (0..causes.len())
        .filter(|&i| kinds[i] == OpKind::Graph)
        .collect();
    if graph_ops.len() > 1 {
        let net: f64 = graph_ops.iter().map(|&i| causes[i].delta_ns).sum();
        let grown: f64 = graph_ops.iter().map(|&i| causes[i].delta_ns.max(0.0)).sum();
        if grown > 0.0 && net < grown {
            let share = net.max(0.0) / grown;
            for &i in &graph_ops {
                let c = &mut causes[i];
                c.delta_ns = c.delta_ns.max(0.0) * share;
            }
        }
    }
    // Launch gaps grown everywhere rather than before one operator.
    let total_gap: f64 = gap_growth.iter().sum();
    let biggest_gap = gap_growth.iter().copied().fold(0.0, f64::max);
    if total_gap > 0.0 && biggest_gap < 0.5 * total_gap {
        let ops_grown = gap_growth
            .iter()
            .filter(|g| **g > 0.05 * total_gap / gap_growth.len() as f64)
            .count();
        causes.push(Cause {
            op: LAUNCHES_OP.to_owned(),
            dimension: Dimension::LaunchLatency,
            delta_ns: total_gap,
            gpu_ns: (0.0, 0.0),
            gap_ns: (0.0, total_gap),
            detail: format!("GPU idle between kernels grew before {ops_grown} operators"),
        });
        // Their gaps now count under the pseudo-operator.
        for c in causes.iter_mut().filter(|c| c.op != LAUNCHES_OP) {
            c.delta_ns -= (c.gap_ns.1 - c.gap_ns.0).max(0.0);
        }
    }
    let idle = (
        per(baseline.idle_before_ns, baseline.idle_before_iterations),
        per(now.idle_before_ns, now.idle_before_iterations),
    );
    let mut loading = idle.1 - idle.0;
    let mut moved = 0.0;
    if loading < 0.0 {
        loading += into_idle_before(&mut causes, &kinds, -loading);
        // Idle time that moved from before the first kernel to between kernels: the GPU
        // waited as long as before, in another place (a contended main thread under CUDA graphs
        // on the H200: the gaps between the graphs grew 9.9 ms while the idle before the first
        // grew shorter, for a step 1.4 ms longer).
        loading += into_gaps(&mut causes, &kinds, -loading);
    } else if loading > 0.0 {
        // Idle time that moved to the start of the iteration from before other operators: the
        // GPU waited as long as before, in another place (a starved loader under torch.compile
        // on the H200: 8 ms of idle before a batch norm went, 23 ms before the first kernel came,
        // for a step 16.5 ms longer).
        let shrank: f64 = (0..kinds.len())
            .map(|i| (causes[i].gap_ns.0 - causes[i].gap_ns.1).max(0.0))
            .sum();
        moved = shrank.min(loading);
        loading -= moved;
    }
    causes.push(Cause {
        op: DATA_LOADING_OP.to_owned(),
        dimension: Dimension::DataLoading,
        delta_ns: loading,
        gpu_ns: (0.0, 0.0),
        gap_ns: idle,
        detail: {
            let mut d = format!(
                "GPU idle before the first kernel {} → {} per iteration",
                ms(idle.0),
                ms(idle.1)
            );
            if moved > 0.0 {
                let _ = write!(d, ", {} of it moved from before other operators", ms(moved));
            }
            d
        },
    });
    rank(&mut causes);
    causes.retain(|c| c.delta_ns > 0.0);
    let mut host = causes
        .first()
        .map(|c| host_causes(c.dimension, c.delta_ns, baseline, now))
        .unwrap_or_default();
    if stalled_launcher_not_operator(&mut causes, &host) {
        host = host_causes(Dimension::LaunchLatency, causes[0].delta_ns, baseline, now);
    }
    // After the host causes, which are judged against what the traced iterations' records show.
    if let Some(c) = causes.first_mut().filter(|c| c.op == LAUNCHES_OP) {
        add_untraced_growth(c, baseline, now);
    }
    if causes
        .first()
        .is_some_and(|c| c.dimension == Dimension::DataLoading)
    {
        late_launch_not_loading(&mut causes, &mut host, baseline, now);
    } else if causes
        .first()
        .is_some_and(|c| c.dimension == Dimension::LaunchLatency)
    {
        starved_not_launching(&mut causes, &mut host, baseline, now);
    }
    causes.truncate(TOP);
    // A slower GPU clock lengthens every kernel: the device cause of an execution slowdown.
    if causes
        .first()
        .is_some_and(|c| matches!(c.dimension, Dimension::Execution | Dimension::Occupancy))
    {
        let clock = |p: &Profile| {
            (p.sm_clock_mhz.1 > 0).then(|| p.sm_clock_mhz.0 / p.sm_clock_mhz.1 as f64)
        };
        if let (Some(before), Some(now_mhz)) = (clock(baseline), clock(now)) {
            if now_mhz < 0.9 * before {
                host.insert(
                    0,
                    HostCause {
                        node: "gpu.sm_clock",
                        what: format!(
                            "the GPU's SM clock fell from {before:.0} to {now_mhz:.0} MHz (NVML)"
                        ),
                        delta: before - now_mhz,
                    },
                );
            }
        }
    }
    Some(Attribution {
        iteration_ns: (baseline.mean_wall_ns(), now.mean_wall_ns()),
        causes,
        host,
        iterations: (baseline.iterations, now.iterations),
        traced: (nb, nn),
    })
}

/// Node-level iterations on each side that [`refine_graph_cause`] needs.
pub const MIN_NODE_ITERATIONS: u64 = 5;

/// Whether the top cause of `a` is a CUDA graph replayed whole (graph-level records: one
/// activity per launch, which says that the graph got slower, not what in it).
pub fn top_is_graph(a: &Attribution, baseline: &Profile, now: &Profile) -> bool {
    a.top().is_some_and(|c| is_graph(c, baseline, now))
}

/// Whether a cause is an operator of kind [`OpKind::Graph`] on either side.
fn is_graph(c: &Cause, baseline: &Profile, now: &Profile) -> bool {
    now.ops
        .get(c.op.as_str())
        .or_else(|| baseline.ops.get(c.op.as_str()))
        .is_some_and(|o| o.kind == OpKind::Graph)
}

/// Where the top cause of `a` is a CUDA graph (see [`top_is_graph`]), names what in it got
/// slower from node-level iterations of both sides (the shim traces graphs node by node in
/// short samples while the job is healthy, and on demand once a violation points into a
/// graph): the node-level operator that grew most takes the top, with its dimension and at most
/// the graphs' net change (all graphs' time now less before: a changed module captured as a new
/// graph shows the new graph whole and the old one gone); the top graph keeps what is left of
/// that change, and the other graph causes go. Returns
/// whether it did; without [`MIN_NODE_ITERATIONS`] on each side, or with no operator grown,
/// `a` is left as it is.
pub fn refine_graph_cause(
    a: &mut Attribution,
    baseline: &Profile,
    now: &Profile,
    node_baseline: &NodeProfile,
    node_now: &NodeProfile,
) -> bool {
    if !top_is_graph(a, baseline, now)
        || node_baseline.iterations < MIN_NODE_ITERATIONS
        || node_now.iterations < MIN_NODE_ITERATIONS
    {
        return false;
    }
    let side = |n: &NodeProfile| Profile {
        iterations: n.iterations,
        traced: n.iterations,
        ops: n.ops.clone(),
        ..Profile::default()
    };
    let Some(inner) = attribute(&side(node_baseline), &side(node_now)) else {
        return false;
    };
    let Some(found) = inner
        .causes
        .into_iter()
        .find(|c| c.op != DATA_LOADING_OP && c.op != LAUNCHES_OP && c.delta_ns > 0.0)
    else {
        return false;
    };
    // The graphs' net change: a job that switches to another graph (torch.compile captures a
    // changed module as a new graph) shows the new graph whole and the old one gone, and only
    // their difference is the slowdown.
    let (nb, nn) = (baseline.traced, now.traced);
    let graph_time = |p: &Profile, n: u64| {
        p.ops
            .values()
            .filter(|o| o.kind == OpKind::Graph)
            .map(|o| per(o.critical_ns + o.gap_ns + o.wait_ns, n))
            .sum::<f64>()
    };
    let net = graph_time(now, nn) - graph_time(baseline, nb);
    let graph = a.causes.remove(0);
    a.causes.retain(|c| !is_graph(c, baseline, now));
    let delta = if net > 0.0 {
        found.delta_ns.min(net)
    } else {
        found.delta_ns
    };
    let rest = net - delta;
    let detail = format!(
        "inside {} (node-level trace, {} and {} iterations): {}",
        graph.op, node_baseline.iterations, node_now.iterations, found.detail
    );
    a.causes.insert(
        0,
        Cause {
            delta_ns: delta,
            detail,
            ..found
        },
    );
    if rest > 0.0 {
        a.causes.push(Cause {
            delta_ns: rest,
            ..graph
        });
        rank(&mut a.causes[1..]);
    }
    a.causes.truncate(TOP);
    true
}

/// Where the top cause of `a` is a CUDA graph new since the baseline (torch.compile captured a
/// changed module again) and node-level iterations could not look into it
/// ([`refine_graph_cause`]), names what changed from how the graphs were captured
/// (`composition`, [`crate::gputrace::TraceAssembler::graph_composition`]): the graph it
/// replaced is the one of the baseline, launched less often now, whose nodes by operator
/// differ least from it; the named operator with the most nodes added takes the top, with the graph's dimension
/// and delta. Where no named operator added nodes, the named operator with the most kernel
/// nodes captured under other launch configurations takes the top, as occupancy (where the
/// capture recorded configurations: [`GraphComposition::launches`]). Returns whether it did;
/// with no such graph or difference, `a` is left as it is.
pub fn refine_graph_by_composition(
    a: &mut Attribution,
    baseline: &Profile,
    now: &Profile,
    composition: &GraphComposition,
) -> bool {
    let Some(top) = a.causes.first() else {
        return false;
    };
    // Launches per traced iteration.
    let rate = |p: &Profile, op: &str| {
        p.ops.get(op).map_or(0.0, |o| o.count as f64) / p.traced.max(1) as f64
    };
    // New since the baseline: launched there at under half its rate now. The baseline's last
    // window can hold the first iterations after the change (an H100 GPT under
    // reduce-overhead, 2026-12-07: the graph that replaced the changed module's in 10 of the
    // baseline's 225 iterations, all 31 of the violation's).
    if !is_graph(top, baseline, now) || rate(baseline, &top.op) >= 0.5 * rate(now, &top.op) {
        return false;
    }
    let Some((new_id, new)) =
        graph_id_of(&top.op).and_then(|id| Some((id, composition.nodes.get(&id)?)))
    else {
        return false;
    };
    let distance = |old: &BTreeMap<String, u32>| -> u64 {
        let labels: BTreeSet<&String> = new.keys().chain(old.keys()).collect();
        labels
            .into_iter()
            .map(|l| {
                let (x, y) = (new.get(l).copied(), old.get(l).copied());
                u64::from(x.unwrap_or(0).abs_diff(y.unwrap_or(0)))
            })
            .sum()
    };
    // Launched less often now than before (the window the change happened in still has some
    // launches of the old graph).
    let replaced = baseline
        .ops
        .iter()
        .filter(|(op, o)| {
            o.kind == OpKind::Graph && o.count > 0 && rate(now, &op.0) < 0.9 * rate(baseline, &op.0)
        })
        .filter_map(|(op, _)| {
            let id = graph_id_of(&op.0)?;
            Some((id, composition.nodes.get(&id)?))
        })
        .min_by_key(|(id, old)| (distance(old), *id));
    let Some((old_id, old)) = replaced else {
        return false;
    };
    let added = new
        .iter()
        .filter(|(label, _)| !label.is_empty())
        .map(|(label, &n)| {
            (
                label,
                n.saturating_sub(old.get(label).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, more)| *more > 0)
        .max_by(|x, y| x.1.cmp(&y.1).then_with(|| y.0.cmp(x.0)));
    let Some((label, more)) = added else {
        return refine_graph_by_launches(a, composition, new_id, old_id);
    };
    let nodes = |c: &BTreeMap<String, u32>| c.values().copied().map(u64::from).sum::<u64>();
    name_inside_graph(a, label, None, |graph| {
        format!(
            "{more} more of its nodes in {graph} than in graph#{old_id}, which that graph \
             replaced ({} → {} nodes, as captured)",
            nodes(old),
            nodes(new)
        )
    });
    true
}

/// Puts `op` in place of the top cause, a graph, with the graph's delta and its `dimension`
/// (or the graph's), and a detail of `what(graph label)` followed by the graph's own.
fn name_inside_graph(
    a: &mut Attribution,
    op: &str,
    dimension: Option<Dimension>,
    what: impl FnOnce(&str) -> String,
) {
    let graph = a.causes.remove(0);
    let detail = format!("{}: {}", what(&graph.op), graph.detail);
    a.causes.insert(
        0,
        Cause {
            op: op.to_owned(),
            dimension: dimension.unwrap_or(graph.dimension),
            detail,
            ..graph
        },
    );
}

/// [`refine_graph_by_composition`] where graph `new_id` has the nodes of `old_id` it replaced:
/// the named operator whose kernel nodes were captured under launch configurations most
/// different from the old graph's takes the top cause, as occupancy.
fn refine_graph_by_launches(
    a: &mut Attribution,
    composition: &GraphComposition,
    new_id: u32,
    old_id: u32,
) -> bool {
    let (Some(new), Some(old)) = (
        composition.launches.get(&new_id),
        composition.launches.get(&old_id),
    ) else {
        return false;
    };
    let empty = BTreeMap::new();
    // Nodes of a label in one graph under a configuration the other graph has fewer of.
    let only = |x: &BTreeMap<u32, u32>, y: &BTreeMap<u32, u32>| -> Vec<(u32, u32)> {
        x.iter()
            .filter_map(|(&l, &n)| {
                let more = n.saturating_sub(y.get(&l).copied().unwrap_or(0));
                (more > 0).then_some((l, more))
            })
            .collect()
    };
    let changed = new
        .iter()
        .filter(|(label, _)| !label.is_empty())
        .filter_map(|(label, now)| {
            let before = old.get(label).unwrap_or(&empty);
            let (gone, came) = (only(before, now), only(now, before));
            let n: u32 = came.iter().map(|c| c.1).sum();
            (n > 0 && !gone.is_empty()).then_some((label, n, gone, came))
        })
        .max_by(|x, y| x.1.cmp(&y.1).then_with(|| y.0.cmp(x.0)));
    let Some((label, n, gone, came)) = changed else {
        return false;
    };
    let say = |v: &[(u32, u32)]| {
        v.iter()
            .map(|&(l, count)| {
                let (threads, blocks) = decode_launch(l);
                let times = if count > 1 {
                    format!("{count}× ")
                } else {
                    String::new()
                };
                format!("{times}{blocks} blocks of {threads} threads")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    name_inside_graph(a, label, Some(Dimension::Occupancy), |graph| {
        format!(
            "{n} of its kernel nodes in {graph} captured with another launch configuration than \
             in graph#{old_id}, which that graph replaced ({} → {})",
            say(&gone),
            say(&came)
        )
    });
    true
}

/// GPU idle before an iteration's first kernel grows when the data comes late, and also when
/// the launching thread is late to launch the iteration's first work: under CUDA graphs (a few
/// launches per step) a main thread kept off its CPU shows only there (H200, 2026-12-02: the
/// convnet under `reduce-overhead` with busy loops on the main thread's CPU read as data
/// loading). Where the main threads waited longer for a CPU and the loader threads' evidence
/// is absent, the idle time is the launches': it moves to [`LAUNCHES_OP`] (merged with it when
/// present). Where the job's cgroup was throttled, which keeps the main threads and the loaders
/// waiting alike (H200: the convnet under `reduce-overhead`, 4× slower, read as data loading),
/// the part up to the main threads' growth moves. The host causes follow the top cause.
fn late_launch_not_loading(
    causes: &mut Vec<Cause>,
    host: &mut Vec<HostCause>,
    baseline: &Profile,
    now: &Profile,
) {
    let loader_evidence = host.iter().any(|h| {
        h.node == runqueue_node(Role::DataLoader) || h.node == runqueue_node(Role::PinMemory)
    });
    let throttled = host.iter().any(|h| h.node == "host.throttling");
    if loader_evidence && !throttled {
        return;
    }
    let launch_host = host_causes(Dimension::LaunchLatency, causes[0].delta_ns, baseline, now);
    if !launch_host
        .iter()
        .any(|h| h.node == runqueue_node(Role::Main))
    {
        return;
    }
    let main_waited = per(now.host.role(Role::Main).runq_ns, now.iterations)
        - per(baseline.host.role(Role::Main).runq_ns, baseline.iterations);
    let moved = if loader_evidence {
        causes[0].delta_ns.min(main_waited.max(0.0))
    } else {
        causes[0].delta_ns
    };
    let whole = moved >= causes[0].delta_ns;
    let idle = if whole {
        causes.remove(0)
    } else {
        causes[0].delta_ns -= moved;
        Cause {
            delta_ns: moved,
            ..causes[0].clone()
        }
    };
    let detail = if whole {
        format!("{} while the main threads waited for a CPU", idle.detail)
    } else {
        format!(
            "{} of the GPU idle before the first kernel while the main threads waited {} more \
             per iteration for a CPU",
            ms(moved),
            ms(main_waited)
        )
    };
    into_launches(causes, idle.delta_ns, idle.gpu_ns, idle.gap_ns, detail);
    if causes
        .first()
        .is_some_and(|c| c.dimension == Dimension::LaunchLatency)
    {
        *host = launch_host;
    }
}

/// A job stalled as a whole (its cgroup throttled) delays every launch after the stall, and the
/// GPU idles wherever its queue first runs dry: where it ran shallowest before, before an
/// operator the GPU already waited for, not because of anything that operator does. Where the
/// top cause is one operator's launch latency and the throttling, at least as long per
/// iteration, is its host cause, the launch gaps grown before every operator are the launches'
/// ([`LAUNCHES_OP`]). The main threads' run-queue wait alone is not taken as such a stall: a host
/// synchronisation in one module grows it too (the thread sleeps in the sync and waits to run
/// again), and there the operator is the answer (A-05, A-36 of the suite). On an H100
/// (2026-12-07, `faults-B-compile-nomarkers-h100`, B-66) the convnet under `torch.compile` in a
/// throttled cgroup, without step markers: 36 of its ~60 ms of grown idle came before
/// `_native_batch_norm_legit_functional`, which had 6.6 ms before it already, while the cgroup
/// was throttled 239 ms per iteration. Returns whether it moved anything.
fn stalled_launcher_not_operator(causes: &mut Vec<Cause>, host: &[HostCause]) -> bool {
    let Some(top) = causes.first() else {
        return false;
    };
    if top.dimension != Dimension::LaunchLatency || top.op == LAUNCHES_OP {
        return false;
    }
    let stall = host
        .iter()
        .filter(|h| h.node == "host.throttling")
        .map(|h| h.delta)
        .fold(0.0, f64::max);
    if stall < top.delta_ns {
        return false;
    }
    let (top_grown, top_op) = ((top.gap_ns.1 - top.gap_ns.0).max(0.0), top.op.clone());
    let (mut moved, mut ops) = (0.0, 0);
    for c in causes
        .iter_mut()
        .filter(|c| c.dimension == Dimension::LaunchLatency && c.op != LAUNCHES_OP)
    {
        let grown = (c.gap_ns.1 - c.gap_ns.0).max(0.0).min(c.delta_ns.max(0.0));
        c.delta_ns -= grown;
        moved += grown;
        ops += 1;
    }
    let detail = format!(
        "GPU idle between kernels grew before {ops} operators while the job was throttled \
         ({} of it before {top_op}, where the queue ran dry)",
        ms(top_grown)
    );
    into_launches(causes, moved, (0.0, 0.0), (0.0, moved), detail);
    causes.retain(|c| c.delta_ns > 0.0);
    true
}

/// Adds `delta_ns` of grown idle to [`LAUNCHES_OP`] (its detail after the cause's own where it
/// is there already, else a new cause with these GPU and gap times), and ranks the causes again.
fn into_launches(
    causes: &mut Vec<Cause>,
    delta_ns: f64,
    gpu_ns: (f64, f64),
    gap_ns: (f64, f64),
    detail: String,
) {
    match causes.iter_mut().find(|c| c.op == LAUNCHES_OP) {
        Some(l) => {
            l.delta_ns += delta_ns;
            l.detail = format!("{}; {detail}", l.detail);
        }
        None => causes.push(Cause {
            op: LAUNCHES_OP.to_owned(),
            dimension: Dimension::LaunchLatency,
            delta_ns,
            gpu_ns,
            gap_ns,
            detail,
        }),
    }
    rank(causes);
}

/// The other way round: a job whose CPU runs ahead of the GPU hides its launch gaps behind the
/// queue; when the next batch comes late the queue drains, the GPU idles before the
/// iteration's first work, and then waits for each launch until the queue builds up again
/// (H200, 2026-12-02: busy loops on a compiled convnet's loader CPUs read as the batch norm's
/// launch latency, +4 ms per iteration, with the data loading second at +2 ms). Where the top
/// cause is launch latency, the main threads did not wait longer for a CPU, the GPU idle before
/// the first kernel grew and the loader threads' evidence is there, the launch latencies grown
/// are the data loading's: they move to [`DATA_LOADING_OP`], with the loaders' wait as the host
/// cause.
fn starved_not_launching(
    causes: &mut Vec<Cause>,
    host: &mut Vec<HostCause>,
    baseline: &Profile,
    now: &Profile,
) {
    if host.iter().any(|h| h.node == runqueue_node(Role::Main)) {
        return;
    }
    let Some(at) = causes.iter().position(|c| c.op == DATA_LOADING_OP) else {
        return;
    };
    let late: f64 = causes
        .iter()
        .filter(|c| c.dimension == Dimension::LaunchLatency)
        .map(|c| c.delta_ns)
        .sum();
    let loading_host = host_causes(
        Dimension::DataLoading,
        causes[at].delta_ns + late,
        baseline,
        now,
    );
    if !loading_host.iter().any(|h| {
        h.node == runqueue_node(Role::DataLoader) || h.node == runqueue_node(Role::PinMemory)
    }) {
        return;
    }
    let moved = causes
        .iter()
        .filter(|c| c.dimension == Dimension::LaunchLatency)
        .count();
    let mut loading = causes.remove(at);
    causes.retain(|c| c.dimension != Dimension::LaunchLatency);
    loading.detail = format!(
        "{}; and {} of launch latency grown before {moved} operators, which the GPU waited for \
         once the late batch had drained its queue",
        loading.detail,
        ms(late)
    );
    loading.delta_ns += late;
    causes.push(loading);
    rank(causes);
    *host = loading_host;
}

/// Copies that moved their bytes more slowly (`causes[i]` of kind `kinds[i]`) where the GPU's idle
/// time before the iteration's first activity shrank by `shrank` ns: the copy at the start of the
/// iteration grew into time the GPU had spent waiting anyway, and only what the idle time did not
/// absorb costs the step. Takes the absorbed part off the largest such copies first and returns
/// it. On the H200 a convnet under CUDA graphs copying its batch from pageable memory: the copy
/// 1.4 → 15 ms a step, the idle before the first kernel 8.7 → 0.6 ms, the step +5 ms.
fn into_idle_before(causes: &mut [Cause], kinds: &[OpKind], shrank: f64) -> f64 {
    let copies: Vec<usize> = (0..kinds.len())
        .filter(|&i| {
            kinds[i] == OpKind::Memory && causes[i].dimension == Dimension::MemoryBandwidth
        })
        .collect();
    take_off_largest(
        causes,
        copies,
        shrank,
        |c| c.delta_ns,
        "into the GPU's idle time before the first kernel",
    )
}

/// Takes up to `shrank` ns (the GPU's idle time before the first kernel that went) off grown
/// idle time between kernels: the launches' cause where there is one, else the operators' grown
/// gaps. Returns what it took.
fn into_gaps(causes: &mut [Cause], kinds: &[OpKind], shrank: f64) -> f64 {
    let launches = (kinds.len()..causes.len()).find(|&i| causes[i].op == LAUNCHES_OP);
    let candidates: Vec<usize> = match launches {
        Some(i) => vec![i],
        None => (0..kinds.len()).collect(),
    };
    take_off_largest(
        causes,
        candidates,
        shrank,
        |c| (c.gap_ns.1 - c.gap_ns.0).max(0.0),
        "moved from before the first kernel",
    )
}

/// Takes up to `amount` ns off the grown causes among `candidates`, largest first, each at
/// most `most(cause)`, and says so in their details ("; X of it {what}"). Returns what it took.
fn take_off_largest(
    causes: &mut [Cause],
    mut candidates: Vec<usize>,
    amount: f64,
    most: impl Fn(&Cause) -> f64,
    what: &str,
) -> f64 {
    candidates.retain(|&i| causes[i].delta_ns > 0.0);
    candidates.sort_by(|&a, &b| causes[b].delta_ns.total_cmp(&causes[a].delta_ns));
    let mut left = amount;
    for i in candidates {
        let c = &mut causes[i];
        let take = left.min(c.delta_ns).min(most(c));
        if take <= 0.0 {
            continue;
        }
        c.delta_ns -= take;
        left -= take;
        let _ = write!(c.detail, "; {} of it {what}", ms(take));
        if left <= 0.0 {
            break;
        }
    }
    amount - left
}

/// Work on one stream that grew over work on another (a slower collective over the backward
/// kernels it overlaps): the timeline gives the critical path to the activity that started
/// first, so the grown one gains all its new length and the work it now covers loses its part,
/// a shrink that no grown cause offsets (only grown causes are listed). The grown operators'
/// critical-path growth gives up `covered`, largest first: what they added to the iteration is
/// only what reaches beyond the work that ran beside them.
fn behind_grown(causes: &mut [Cause], covered: f64) {
    let all: Vec<usize> = (0..causes.len()).collect();
    let growth = |c: &Cause| c.gpu_ns.1 - c.gpu_ns.0;
    take_off_largest(causes, all, covered, growth, "over work beside it");
}

/// Launch gaps grown across the operators, the top cause, measured on the traced iterations
/// alone: adds what all the window's iterations grew more than the traced ones. The shim traces
/// kernels in sample windows, and a window holds a host-slowed job's short iterations more often
/// than its long ones (an iteration spanning a throttled period seldom falls whole into one): on
/// the H200 a throttled launch-bound GPT's traced iterations grew 6 ms where all grew 15 ms.
/// Every iteration's wall time is known all the same; in a job whose GPU is idle most of the
/// time (launch-bound), what an iteration grew is GPU idle, and with launches late across the
/// operators, GPU idle between launches. Where the GPU is busy most of the time, an untraced
/// iteration's growth may be GPU work as well, and nothing is added.
fn add_untraced_growth(c: &mut Cause, baseline: &Profile, now: &Profile) {
    let traced_mean = |p: &Profile| per(p.traced_wall_ns, p.traced);
    if baseline.traced_wall_ns == 0
        || now.traced_wall_ns == 0
        || (baseline.traced == baseline.iterations && now.traced == now.iterations)
    {
        return;
    }
    let busy = |p: &Profile| per(p.ops.values().map(|o| o.critical_ns).sum(), p.traced);
    if busy(baseline) > 0.5 * traced_mean(baseline) || busy(now) > 0.5 * traced_mean(now) {
        return;
    }
    let all = now.mean_wall_ns() - baseline.mean_wall_ns();
    let traced = traced_mean(now) - traced_mean(baseline);
    if all <= traced {
        return;
    }
    // The mean over all iterations of what each is known to have added: a traced iteration
    // its launch gaps' growth, an untraced one its whole growth. What else the traced ones
    // show (another part shrinking by chance in a few dozen iterations) stays with them, and
    // is not carried over to the iterations not seen (A-12 on the H200: 51 of 163 traced, the
    // traced ones' other parts 0.7 ms shorter, the sum 1.28x the change before this).
    let w = now.traced as f64 / now.iterations.max(1) as f64;
    let more = all + w * (c.delta_ns - traced) - c.delta_ns;
    if more <= 0.0 {
        return;
    }
    c.delta_ns += more;
    c.gap_ns.1 += more;
    let _ = write!(c.detail, "; {} more in the iterations not traced", ms(more));
}

/// Largest contribution first; ties by operator label, so the order never depends on input order.
fn rank(causes: &mut [Cause]) {
    causes.sort_by(|a, b| {
        b.delta_ns
            .total_cmp(&a.delta_ns)
            .then_with(|| a.op.cmp(&b.op))
    });
}

/// A duration in ms, for details.
fn ms(ns: f64) -> String {
    if ns.abs() >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.0} µs", ns / 1e3)
    }
}

fn classify(
    kind: OpKind,
    b: &OpAgg,
    n: &OpAgg,
    (nb, nn): (u64, u64),
    d_gpu: f64,
    d_gap: f64,
) -> (Dimension, String) {
    let factor = if b.gpu_ns > 0 && n.count > 0 && b.count > 0 {
        (n.gpu_ns as f64 / n.count as f64) / (b.gpu_ns as f64 / b.count as f64)
    } else {
        f64::NAN
    };
    let longer = if factor.is_finite() {
        format!("{factor:.2}× longer each")
    } else {
        "new".to_owned()
    };
    if d_gap > d_gpu && d_gap > 0.0 {
        return (
            Dimension::LaunchLatency,
            format!(
                "GPU idle before it {} → {} per iteration",
                ms(per(b.gap_ns, nb)),
                ms(per(n.gap_ns, nn))
            ),
        );
    }
    match kind {
        OpKind::Communication => (Dimension::Communication, format!("collective {longer}")),
        OpKind::Memory => {
            let bw = |a: &OpAgg| (a.gpu_ns > 0).then(|| a.bytes as f64 / a.gpu_ns as f64);
            let detail = match (bw(b), bw(n)) {
                (Some(x), Some(y)) => format!("{:.1} → {:.1} GB/s", x, y),
                _ => longer,
            };
            (Dimension::MemoryBandwidth, detail)
        }
        // More kernels per iteration (an operator doing more work): its time-weighted
        // occupancy follows the mix of kernels, not a launch configuration (on the H200 a
        // module repeating its matmuls read as occupancy 35% → 26%).
        _ if b.count > 0 && per(n.count, nn) > 1.2 * per(b.count, nb) => (
            Dimension::Execution,
            format!(
                "{:.0} → {:.0} kernels per iteration, {longer}",
                per(b.count, nb),
                per(n.count, nn)
            ),
        ),
        _ => match (b.occupancy(), n.occupancy()) {
            (Some(x), Some(y)) if y < x * 0.85 => (
                Dimension::Occupancy,
                format!(
                    "theoretical occupancy {:.0}% → {:.0}%, kernels {longer}",
                    100.0 * x,
                    100.0 * y
                ),
            ),
            _ => (
                Dimension::Execution,
                format!("kernels {longer}, same launch configuration"),
            ),
        },
    }
}

/// The SLO node of a role's run-queue wait.
pub fn runqueue_node(role: Role) -> &'static str {
    match role {
        Role::Main => "host.runqueue.main",
        Role::DataLoader => "host.runqueue.data_loader",
        Role::Communication => "host.runqueue.communication",
        Role::PinMemory => "host.runqueue.pin_memory",
        Role::Other => "host.runqueue.other",
    }
}

/// Host changes per iteration that go with `dimension`, largest first. A run-queue wait counts
/// when it grew by half again, or by at least half of `explains_ns` (the cause's delta per
/// iteration): a thread that waited that much longer for a CPU accounts for the slowdown even
/// where its wait was already large (H200, 2026-12-02: the launch-bound eager GPT's main
/// threads waited 10.4 ms per 9.6 ms iteration before busy loops joined their CPU, so the
/// first windows of the fault, +3.2 ms of launch gaps, grew it by less than half).
///
/// Per iteration of all the windows' iterations, traced or not: the host samples cover the
/// windows' whole wall time (dividing by the traced ones alone inflated a window with few
/// traced iterations: 94.5 ms of run-queue wait per 12 ms iteration on the H200 recording).
fn host_causes(
    dimension: Dimension,
    explains_ns: f64,
    baseline: &Profile,
    now: &Profile,
) -> Vec<HostCause> {
    let (b, nb, n, nn) = (
        &baseline.host,
        baseline.iterations,
        &now.host,
        now.iterations,
    );
    let mut out = Vec::new();
    let runq = |role: Role, out: &mut Vec<HostCause>| {
        let before = per(b.role(role).runq_ns, nb);
        let now = per(n.role(role).runq_ns, nn);
        let grew = now - before;
        if grew > 20_000.0 && (now > 1.5 * before || grew >= 0.5 * explains_ns) {
            out.push(HostCause {
                node: runqueue_node(role),
                what: format!(
                    "{} threads waited {} per iteration for a CPU (run queue; was {})",
                    role.as_str(),
                    ms(now),
                    ms(before)
                ),
                delta: now - before,
            });
        }
    };
    let throttled = |out: &mut Vec<HostCause>| {
        let before = per(b.throttled_ns, nb);
        let now = per(n.throttled_ns, nn);
        if now - before > 20_000.0 && now > 1.5 * before {
            out.push(HostCause {
                node: "host.throttling",
                what: format!(
                    "the job's cgroup was throttled {} per iteration (was {})",
                    ms(now),
                    ms(before)
                ),
                delta: now - before,
            });
        }
    };
    match dimension {
        Dimension::LaunchLatency | Dimension::Execution | Dimension::Occupancy => {
            runq(Role::Main, &mut out);
            throttled(&mut out);
        }
        Dimension::DataLoading => {
            runq(Role::DataLoader, &mut out);
            runq(Role::PinMemory, &mut out);
            throttled(&mut out);
        }
        Dimension::Communication => {
            let before = per(b.role(Role::Communication).retransmits, nb);
            let now = per(n.role(Role::Communication).retransmits, nn);
            let total = n.role(Role::Communication).retransmits;
            if total >= 3 && now > 2.0 * before {
                let on = n
                    .conns
                    .first()
                    .map(|c| format!(" on {}", c.label))
                    .unwrap_or_default();
                out.push(HostCause {
                    node: "host.retransmits",
                    what: format!(
                        "{total} TCP retransmits{on} ({:.1} per iteration; was {:.1})",
                        now, before
                    ),
                    delta: now - before,
                });
            }
            runq(Role::Communication, &mut out);
        }
        Dimension::MemoryBandwidth => {
            runq(Role::PinMemory, &mut out);
        }
    }
    out.sort_by(|a, c| c.delta.total_cmp(&a.delta));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(iterations: u64, ops: &[(&str, OpKind, u64, u64, f64)], idle: u64) -> Profile {
        let mut p = Profile {
            iterations,
            traced: iterations,
            wall_ns: iterations * 10_000_000,
            traced_wall_ns: iterations * 10_000_000,
            idle_before_ns: idle * iterations,
            idle_before_iterations: iterations,
            ..Default::default()
        };
        for (name, kind, gpu, gap, occ) in ops {
            p.ops.insert(
                OpName(Arc::from(*name)),
                OpAgg {
                    kind: *kind,
                    gpu_ns: gpu * iterations,
                    critical_ns: gpu * iterations,
                    count: 2 * iterations,
                    gap_ns: gap * iterations,
                    wait_ns: 0,
                    occ_weighted: occ * (gpu * iterations) as f64,
                    occ_ns: gpu * iterations,
                    bytes: if *kind == OpKind::Memory { 1 << 20 } else { 0 } * iterations,
                },
            );
        }
        p
    }

    const C: OpKind = OpKind::Compute;

    /// Three operators of 1 ms each with `gap` of GPU idle before each.
    fn three_ops(gap: u64) -> Vec<(&'static str, OpKind, u64, u64, f64)> {
        ["a", "b", "c"]
            .into_iter()
            .map(|name| (name, C, 1_000_000, gap, 1.0))
            .collect()
    }

    /// Sets `role`'s run-queue wait to `ns_per_iteration` per iteration of `p`.
    fn set_runq(p: &mut Profile, role: Role, ns_per_iteration: u64) {
        p.host.roles[crate::host::role_index(role)].runq_ns = ns_per_iteration * p.iterations;
    }

    #[test]
    fn the_slower_operator_ranks_first_with_its_dimension() {
        let base = profile(
            100,
            &[("a", C, 1_000_000, 0, 1.0), ("b", C, 2_000_000, 0, 1.0)],
            100_000,
        );
        // b: 2 ms → 5 ms, same occupancy: execution.
        let now = profile(
            50,
            &[("a", C, 1_010_000, 0, 1.0), ("b", C, 5_000_000, 0, 1.0)],
            100_000,
        );
        let a = attribute(&base, &now).expect("attribution");
        let top = a.top().expect("top");
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("b", Dimension::Execution)
        );
        assert!((top.delta_ns - 3_000_000.0).abs() < 1.0);
        // Lower occupancy: occupancy.
        let now = profile(
            50,
            &[("a", C, 1_000_000, 0, 1.0), ("b", C, 5_000_000, 0, 0.25)],
            100_000,
        );
        let top = attribute(&base, &now).expect("a").causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("b", Dimension::Occupancy)
        );
        assert!(top.detail.contains("100% → 25%"), "{}", top.detail);
        // Twice the kernels per iteration with a lower occupancy mix: more work, execution.
        let mut now = profile(
            50,
            &[("a", C, 1_000_000, 0, 1.0), ("b", C, 5_000_000, 0, 0.5)],
            100_000,
        );
        now.ops.get_mut(&OpName(Arc::from("b"))).expect("b").count *= 2;
        let top = attribute(&base, &now).expect("a").causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("b", Dimension::Execution)
        );
        assert!(
            top.detail.contains("2 → 4 kernels per iteration"),
            "{}",
            top.detail
        );
    }

    #[test]
    fn gpu_idle_before_an_iteration_after_an_untraced_one_is_left_out() {
        // A sample window's first traced iteration follows one whose kernels were not traced:
        // the GPU's last work seen is older than its last, and its idle time before the first
        // kernel is that of the untraced iteration's kernels too (the known-answer suite under
        // sampling: host contention read as +0.27 ms of data loading, sums 1.5-2x the change).
        let add = |p: &mut Profile, n: usize, idle_ms: u64, whole: bool| {
            for _ in 0..n {
                p.add_iteration(&Iteration {
                    traced: true,
                    start_ns: 0,
                    end_ns: 10_000_000,
                    idle_before_first_ns: idle_ms * 1_000_000,
                    gpu_period_whole: whole,
                    ..Default::default()
                });
            }
        };
        let mut base = Profile::default();
        add(&mut base, 40, 1, true);
        let mut now = Profile::default();
        for _ in 0..10 {
            add(&mut now, 1, 6, false);
            add(&mut now, 4, 1, true);
        }
        assert_eq!((now.traced, now.idle_before_iterations), (50, 40));
        assert_eq!(per(now.idle_before_ns, now.idle_before_iterations), 1e6);
        let a = attribute(&base, &now);
        assert!(
            a.as_ref()
                .is_none_or(|a| a.causes.iter().all(|c| c.op != DATA_LOADING_OP)),
            "{a:?}"
        );
    }

    #[test]
    fn gaps_before_one_operator_and_everywhere() {
        let ops = |gap_a, gap_b, gap_c| {
            vec![
                ("a", C, 1_000_000u64, gap_a, 1.0),
                ("b", C, 1_000_000, gap_b, 1.0),
                ("c", C, 1_000_000, gap_c, 1.0),
            ]
        };
        let base = profile(100, &ops(10_000, 10_000, 10_000), 0);
        let one = profile(100, &ops(10_000, 3_000_000, 10_000), 0);
        let top = attribute(&base, &one).expect("a").causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("b", Dimension::LaunchLatency)
        );
        let all = profile(100, &ops(1_000_000, 1_100_000, 900_000), 0);
        let top = attribute(&base, &all).expect("a").causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            (LAUNCHES_OP, Dimension::LaunchLatency)
        );
        assert!((top.delta_ns - 2_970_000.0).abs() < 1.0, "{top:?}");
    }

    #[test]
    fn a_large_run_queue_wait_that_grew_by_the_slowdown_is_the_host_cause() {
        let mut base = profile(100, &three_ops(10_000), 0);
        set_runq(&mut base, Role::Main, 10_000_000);
        let host_of = |runq_now: u64| {
            let mut slow = profile(100, &three_ops(1_010_000), 0);
            set_runq(&mut slow, Role::Main, runq_now);
            let a = attribute(&base, &slow).expect("a");
            assert_eq!(a.causes[0].op, LAUNCHES_OP);
            a.host.first().map(|h| h.node)
        };
        // +3 ms of launch gaps; the wait grew 10 → 13 ms (less than 1.5x, all of the slowdown).
        assert_eq!(host_of(13_000_000), Some("host.runqueue.main"));
        // 10 → 10.5 ms: a sixth of it, not the cause.
        assert_eq!(host_of(10_500_000), None);
    }

    #[test]
    fn a_copy_that_grew_into_the_idle_time_before_the_first_kernel_costs_only_the_rest() {
        let ops = |copy_ns| {
            [
                (
                    "data_to_device: memcpy HtoD",
                    OpKind::Memory,
                    copy_ns,
                    0,
                    1.0,
                ),
                ("conv", C, 25_000_000, 0, 1.0),
            ]
        };
        // The copy 1.4 → 15 ms; the GPU's idle before the first activity 8.7 → 0.6 ms.
        let base = profile(100, &ops(1_400_000), 8_700_000);
        let now = profile(100, &ops(15_000_000), 600_000);
        let a = attribute(&base, &now).expect("a");
        let top = &a.causes[0];
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("data_to_device: memcpy HtoD", Dimension::MemoryBandwidth)
        );
        assert!((top.delta_ns - 5_500_000.0).abs() < 1.0, "{top:?}");
        assert!(
            top.detail.contains("idle time before the first kernel"),
            "{}",
            top.detail
        );
        assert!(
            a.causes.iter().all(|c| c.op != DATA_LOADING_OP),
            "{:?}",
            a.causes
        );
        // The idle time unchanged: the copy's growth is all of it.
        let now = profile(100, &ops(15_000_000), 8_700_000);
        let top = attribute(&base, &now).expect("a").causes[0].clone();
        assert!((top.delta_ns - 13_600_000.0).abs() < 1.0, "{top:?}");
    }

    #[test]
    fn a_collective_that_grew_over_the_work_beside_it_costs_only_what_reaches_beyond() {
        // An all-reduce on its own stream starts with the backward kernels: 1 ms over 5 ms of
        // them; then 8 ms, the iteration 3 ms longer. The timeline gives the critical path to
        // the all-reduce (it started first): 1 → 8 ms, the backward's 4 → 0 ms.
        let ops = |ar: u64| [("bwd", C, 5_000_000, 0, 1.0), ("allreduce", C, ar, 0, 1.0)];
        let crit = |mut p: Profile, bwd: u64, ar: u64| {
            let n = p.traced;
            for (name, c) in [("bwd", bwd), ("allreduce", ar)] {
                p.ops
                    .get_mut(&OpName(Arc::from(name)))
                    .expect("op")
                    .critical_ns = c * n;
            }
            p
        };
        let base = crit(profile(50, &ops(1_000_000), 0), 4_000_000, 1_000_000);
        let now = crit(profile(50, &ops(8_000_000), 0), 0, 8_000_000);
        let a = attribute(&base, &now).expect("a");
        let top = &a.causes[0];
        assert_eq!(top.op, "allreduce");
        assert!((top.delta_ns - 3_000_000.0).abs() < 1.0, "{top:?}");
        assert!(top.detail.contains("over work beside it"), "{}", top.detail);
        let sum: f64 = a.causes.iter().map(|c| c.delta_ns).sum();
        assert!((sum - 3_000_000.0).abs() < 1.0, "{a:?}");
    }

    #[test]
    fn idle_time_that_moved_to_the_start_of_the_iteration_is_not_counted_twice() {
        // A starved loader under torch.compile: 8 ms of GPU idle before a batch norm went, 23
        // ms before the first kernel came; the step grew 15 ms.
        let ops = |gap| {
            [
                ("conv", C, 25_000_000, 0, 1.0),
                ("bn", C, 1_000_000, gap, 1.0),
            ]
        };
        let base = profile(100, &ops(8_000_000), 1_600_000);
        let now = profile(100, &ops(0), 24_600_000);
        let a = attribute(&base, &now).expect("a");
        let top = &a.causes[0];
        assert_eq!(
            (top.op.as_str(), top.dimension),
            (DATA_LOADING_OP, Dimension::DataLoading)
        );
        assert!((top.delta_ns - 15_000_000.0).abs() < 1.0, "{top:?}");
        assert!(
            top.detail.contains("moved from before other operators"),
            "{}",
            top.detail
        );
    }

    #[test]
    fn idle_time_that_moved_from_the_start_to_between_kernels_is_counted_once() {
        // A contended main thread under CUDA graphs (B-15 on the H200): the GPU waited 16 ms
        // for the batch before the first graph and not between the graphs; now 8 ms less
        // before the first and 3.3 ms more before each of three graphs: 2 ms net.
        let ops = |gap| {
            [
                ("graph#5", OpKind::Graph, 9_000_000, gap, 1.0),
                ("graph#8", OpKind::Graph, 18_000_000, gap, 1.0),
                ("optimizer", C, 1_000_000, gap, 1.0),
            ]
        };
        let base = profile(100, &ops(0), 16_000_000);
        let now = profile(100, &ops(3_333_333), 8_000_000);
        let a = attribute(&base, &now).expect("a");
        let top = &a.causes[0];
        assert_eq!(
            (top.op.as_str(), top.dimension),
            (LAUNCHES_OP, Dimension::LaunchLatency)
        );
        assert!((top.delta_ns - 2_000_000.0).abs() < 10.0, "{top:?}");
        assert!(
            top.detail
                .contains("8.00 ms of it moved from before the first kernel"),
            "{}",
            top.detail
        );
        let sum: f64 = a.causes.iter().map(|c| c.delta_ns).sum();
        assert!((sum - 2_000_000.0).abs() < 10.0, "{a:?}");
        // The GPU only waited elsewhere: nothing grew.
        let now = profile(100, &ops(2_000_000), 10_000_000);
        let a = attribute(&base, &now).expect("a");
        assert!(a.causes.is_empty(), "{a:?}");
    }

    /// `traced` of `iterations` traced, the untraced ones `untraced_ms` long.
    fn sampled(mut p: Profile, iterations: u64, untraced_ms: u64) -> Profile {
        p.wall_ns = p.traced_wall_ns + (iterations - p.traced) * untraced_ms * 1_000_000;
        p.iterations = iterations;
        p
    }

    #[test]
    fn launches_late_everywhere_take_what_the_untraced_iterations_grew_in_a_launch_bound_job() {
        // Three operators of `gpu` ns each with `gap` ns of launch gap before each.
        let ops = |gpu, gap| -> Vec<_> {
            ["a", "b", "c"]
                .into_iter()
                .map(|name| (name, C, gpu, gap, 1.0))
                .collect()
        };
        // 50 of 100 iterations traced, the untraced ones 10 ms.
        let before = |gpu| sampled(profile(50, &ops(gpu, 10_000), 0), 100, 10);
        // 10 of 40 traced, with 1 ms more of launch gap before each operator and `traced_ms`
        // long; the untraced ones 10 → 30 ms (a throttled period seldom falls whole into a
        // sample).
        let after = |gpu, traced_ms: u64| {
            let mut now = profile(10, &ops(gpu, 1_010_000), 0);
            now.traced_wall_ns = 10 * traced_ms * 1_000_000;
            sampled(now, 40, 30)
        };
        // Launch-bound: 30 µs of GPU work in a 10 ms iteration. The traced iterations grew 3 ms.
        let a = attribute(&before(10_000), &after(10_000, 13)).expect("a");
        let top = &a.causes[0];
        assert_eq!(top.op, LAUNCHES_OP);
        // All iterations grew (10 × 13 + 30 × 30) / 40 − 10 = 15.75 ms: 3 ms traced, 12.75 not.
        assert!((top.delta_ns - 15_750_000.0).abs() < 1.0, "{top:?}");
        assert!(top.detail.contains("not traced"), "{}", top.detail);
        // The traced iterations' launch gaps grew 3 ms while they grew 2 ms (something else 1 ms
        // shorter in them): they count for their share (10 of 40), the others for their growth.
        let top = attribute(&before(10_000), &after(10_000, 12))
            .expect("a")
            .causes[0]
            .clone();
        // All grew (10 × 12 + 30 × 30) / 40 − 10 = 15.5 ms; + 10/40 × (3 − 2) = 15.75 ms.
        assert!((top.delta_ns - 15_750_000.0).abs() < 1.0, "{top:?}");

        // GPU-bound (3 ms of each 10 ms iteration per operator): an untraced iteration's growth
        // may be GPU work; only what the traced ones show.
        let top = attribute(&before(3_000_000), &after(3_000_000, 13))
            .expect("a")
            .causes[0]
            .clone();
        assert_eq!(top.op, LAUNCHES_OP);
        assert!((top.delta_ns - 3_000_000.0).abs() < 1.0, "{top:?}");
    }

    #[test]
    fn host_waits_are_per_iteration_of_the_whole_window_not_of_the_traced_ones() {
        let mut base = profile(100, &three_ops(10_000), 0);
        set_runq(&mut base, Role::Main, 1_000_000);
        // 100 iterations, 10 of them traced (a sample window), the wait unchanged per iteration.
        let mut now = profile(10, &three_ops(1_510_000), 0);
        now.iterations = 100;
        now.wall_ns = 100 * 13_000_000;
        set_runq(&mut now, Role::Main, 1_100_000);
        let a = attribute(&base, &now).expect("a");
        assert_eq!(a.causes[0].op, LAUNCHES_OP);
        assert!(a.host.is_empty(), "{:?}", a.host);
    }

    #[test]
    fn idle_before_the_first_kernel_is_the_launches_when_the_main_threads_waited() {
        let ops = [("a", C, 1_000_000u64, 0u64, 1.0)];
        let mut base = profile(100, &ops, 200_000);
        let mut late = profile(100, &ops, 3_000_000);
        set_runq(&mut base, Role::Main, 100_000);
        set_runq(&mut late, Role::Main, 2_500_000);
        let a = attribute(&base, &late).expect("a");
        let top = a.causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            (LAUNCHES_OP, Dimension::LaunchLatency)
        );
        assert!((top.delta_ns - 2_800_000.0).abs() < 1.0, "{top:?}");
        assert!(top.detail.contains("main threads waited"), "{}", top.detail);
        assert_eq!(a.host[0].node, "host.runqueue.main");
        assert!(a.causes.iter().all(|c| c.op != DATA_LOADING_OP));
        // The loader threads waited too: the data came late, whatever the main threads did.
        set_runq(&mut base, Role::DataLoader, 100_000);
        set_runq(&mut late, Role::DataLoader, 2_000_000);
        let a = attribute(&base, &late).expect("a");
        assert_eq!(
            (a.causes[0].op.as_str(), a.causes[0].dimension),
            (DATA_LOADING_OP, Dimension::DataLoading)
        );
        assert_eq!(a.host[0].node, "host.runqueue.data_loader");
        // The job's cgroup throttled: everyone waited; the launches take the idle up to the
        // main threads' growth (2.4 of 2.8 ms), the data loading keeps the rest.
        base.host.throttled_ns = 0;
        late.host.throttled_ns = 5_000_000 * late.iterations;
        let a = attribute(&base, &late).expect("a");
        let top = a.causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            (LAUNCHES_OP, Dimension::LaunchLatency)
        );
        assert!((top.delta_ns - 2_400_000.0).abs() < 1.0, "{top:?}");
        let rest = a
            .causes
            .iter()
            .find(|c| c.op == DATA_LOADING_OP)
            .expect("the rest");
        assert!((rest.delta_ns - 400_000.0).abs() < 1.0, "{rest:?}");
        assert!(
            a.host.iter().any(|h| h.node == "host.throttling"),
            "{:?}",
            a.host
        );
    }

    /// A throttled job's GPU idles where its queue runs dry, mostly before one operator: the
    /// launches' cause all the same. A host sync in one module (the main threads' run-queue wait
    /// grown with it, no throttling) keeps its operator.
    #[test]
    fn a_throttled_jobs_idle_before_one_operator_is_the_launches() {
        let ops = |a_gap: u64, b_gap: u64| {
            vec![
                ("a", C, 1_000_000u64, a_gap, 1.0),
                ("b", C, 1_000_000, b_gap, 1.0),
                ("c", C, 1_000_000, 100_000, 1.0),
            ]
        };
        let base = profile(100, &ops(1_000_000, 100_000), 0);
        // 6 ms more idle before `a` (where the queue ran dry), 1 ms more before `b`.
        let mut now = profile(100, &ops(7_000_000, 1_100_000), 0);
        now.host.throttled_ns = 40_000_000 * now.iterations;
        let a = attribute(&base, &now).expect("a");
        let top = a.causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            (LAUNCHES_OP, Dimension::LaunchLatency),
            "{:?}",
            a.causes
        );
        assert!((top.delta_ns - 7_000_000.0).abs() < 1.0, "{top:?}");
        assert!(
            top.detail.contains("before a, where the queue ran dry"),
            "{}",
            top.detail
        );
        assert!(
            a.causes.iter().all(|c| c.op != "a" && c.op != "b"),
            "{:?}",
            a.causes
        );
        assert_eq!(a.host[0].node, "host.throttling");
        // The same idle with the main threads' wait grown instead: the operator stays.
        let mut synced = profile(100, &ops(7_000_000, 1_100_000), 0);
        set_runq(&mut synced, Role::Main, 40_000_000);
        let a = attribute(&base, &synced).expect("a");
        assert_eq!(a.causes[0].op, "a", "{:?}", a.causes);
        // Throttled for less than the operator's idle grew: not the stall's doing alone.
        now.host.throttled_ns = 2_000_000 * now.iterations;
        let a = attribute(&base, &now).expect("a");
        assert_eq!(a.causes[0].op, "a", "{:?}", a.causes);
    }

    /// A late batch drains the queue a CPU running ahead had built: the GPU then waits for
    /// launches it did not wait for before; those launch latencies are the data loading's.
    #[test]
    fn launch_gaps_after_a_late_batch_are_the_data_loading() {
        let mut base = profile(100, &three_ops(100_000), 1_000_000);
        // The batch 2 ms later; then 1.5 ms of gaps before each operator.
        let mut late = profile(100, &three_ops(1_600_000), 3_000_000);
        set_runq(&mut base, Role::DataLoader, 100_000);
        set_runq(&mut late, Role::DataLoader, 8_000_000);
        let a = attribute(&base, &late).expect("a");
        let top = a.causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            (DATA_LOADING_OP, Dimension::DataLoading)
        );
        assert!((top.delta_ns - 6_500_000.0).abs() < 1.0, "{top:?}");
        assert!(
            a.causes
                .iter()
                .all(|c| c.dimension != Dimension::LaunchLatency),
            "{a:?}"
        );
        assert_eq!(a.host[0].node, "host.runqueue.data_loader");
        // Without the loaders' evidence the gaps stay the launches'.
        set_runq(&mut late, Role::DataLoader, 100_000);
        let a = attribute(&base, &late).expect("a");
        assert_eq!(a.causes[0].dimension, Dimension::LaunchLatency, "{a:?}");
        // Nor when the main threads waited longer too.
        set_runq(&mut late, Role::DataLoader, 8_000_000);
        set_runq(&mut late, Role::Main, 6_000_000);
        let a = attribute(&base, &late).expect("a");
        assert_eq!(a.causes[0].dimension, Dimension::LaunchLatency, "{a:?}");
    }

    #[test]
    fn data_loading_and_memory_and_communication() {
        let ops = |copy, comm| {
            vec![
                ("a", C, 1_000_000u64, 0u64, 1.0),
                ("memcpy HtoD", OpKind::Memory, copy, 0, 0.0),
                ("nccl", OpKind::Communication, comm, 0, 0.0),
            ]
        };
        let base = profile(100, &ops(1_000_000, 1_000_000), 200_000);
        let starved = profile(100, &ops(1_000_000, 1_000_000), 3_000_000);
        let top = attribute(&base, &starved).expect("a").causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            (DATA_LOADING_OP, Dimension::DataLoading)
        );
        let copy = profile(100, &ops(3_000_000, 1_000_000), 200_000);
        let top = attribute(&base, &copy).expect("a").causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("memcpy HtoD", Dimension::MemoryBandwidth)
        );
        let mut comm = profile(100, &ops(1_000_000, 4_000_000), 200_000);
        comm.host.roles[crate::host::role_index(Role::Communication)].retransmits = 214;
        comm.host.conns.push(crate::host::ConnHost {
            label: "10.0.0.1:41000 -> 10.0.0.2:29500".into(),
            role: Some(Role::Communication),
            retransmits: 214,
        });
        let a = attribute(&base, &comm).expect("a");
        let top = a.causes[0].clone();
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("nccl", Dimension::Communication)
        );
        let chain = a.chain("iteration p99 +38%");
        assert!(
            chain.starts_with("iteration p99 +38% ← nccl +3.00 ms per iteration (communication")
                && chain.ends_with("← 214 TCP retransmits on 10.0.0.1:41000 -> 10.0.0.2:29500 (2.1 per iteration; was 0.0)"),
            "{chain}"
        );
    }

    /// A violation without a cause says what was compared rather than nothing (the suite's
    /// B-03-ro: launch gaps grew where the idle before the first kernel shrank).
    #[test]
    fn a_chain_without_a_cause_says_the_iterations_did_not_grow() {
        let a = Attribution {
            iteration_ns: (38_600_000.0, 36_400_000.0),
            causes: Vec::new(),
            host: Vec::new(),
            iterations: (100, 100),
            traced: (100, 100),
        };
        assert_eq!(
            a.chain("compute.launch_gaps mean +5355%"),
            "compute.launch_gaps mean +5355% ← no cause: the iterations did not grow (mean \
             38.60 ms → 36.40 ms, 100 traced iterations)"
        );
        let grown = Attribution {
            iteration_ns: (36_400_000.0, 38_600_000.0),
            ..a.clone()
        };
        assert_eq!(
            grown.chain("x"),
            "x ← no cause: no operator's change accounts for the iterations' growth (mean \
             36.40 ms → 38.60 ms, 100 traced iterations)"
        );
        // Nothing traced: nothing said.
        let untraced = Attribution {
            traced: (0, 0),
            ..a
        };
        assert_eq!(untraced.chain("x"), "x");
    }

    #[test]
    fn profiles_are_bounded() {
        let mut p = Profile::default();
        for k in 0..(MAX_PROFILE_OPS + 100) {
            p.add_op(
                &Arc::from(format!("op{k}")),
                &OpAgg {
                    count: 1,
                    gpu_ns: 1,
                    ..Default::default()
                },
            );
        }
        assert_eq!(p.ops.len(), MAX_PROFILE_OPS + 1);
        assert_eq!(p.overflowed, 100);
        assert_eq!(p.ops[OVERFLOW].count, 100);
        let mut q = p.clone();
        q.merge(&p);
        assert_eq!(q.ops.len(), MAX_PROFILE_OPS + 1);
        assert_eq!(q.ops[OVERFLOW].count, 200);
    }

    #[test]
    fn a_graph_as_the_top_cause_is_looked_into_by_its_node_level_iterations() {
        const G: OpKind = OpKind::Graph;
        // Graph-level: the graph grew by 3 ms per iteration, nothing else moved.
        let before = profile(
            20,
            &[
                ("graph#7", G, 20_000_000, 0, 0.5),
                ("adam", C, 1_000_000, 0, 0.5),
            ],
            0,
        );
        let now = profile(
            20,
            &[
                ("graph#7", G, 23_000_000, 0, 0.5),
                ("adam", C, 1_000_000, 0, 0.5),
            ],
            0,
        );
        let nodes = |mlp: u64| NodeProfile {
            iterations: 10,
            ops: profile(
                10,
                &[
                    ("blocks.1.attn", C, 8_000_000, 0, 0.5),
                    ("blocks.1.mlp", C, mlp, 0, 0.5),
                ],
                0,
            )
            .ops,
        };
        let mut a = attribute(&before, &now).expect("attribution");
        assert_eq!(a.top().map(|c| c.op.as_str()), Some("graph#7"));
        assert!(top_is_graph(&a, &before, &now));
        // Without node-level iterations on both sides it stays as it is.
        assert!(!refine_graph_cause(
            &mut a,
            &before,
            &now,
            &NodeProfile::default(),
            &nodes(15_000_000)
        ));
        assert_eq!(a.top().map(|c| c.op.as_str()), Some("graph#7"));
        // The module that grew inside takes the top, with its dimension; the graph keeps the rest.
        assert!(refine_graph_cause(
            &mut a,
            &before,
            &now,
            &nodes(12_000_000),
            &nodes(14_500_000)
        ));
        let top = a.top().expect("top");
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("blocks.1.mlp", Dimension::Execution)
        );
        assert!((top.delta_ns - 2_500_000.0).abs() < 1.0, "{top:?}");
        assert!(top.detail.starts_with("inside graph#7"), "{}", top.detail);
        let graph = a
            .causes
            .iter()
            .find(|c| c.op == "graph#7")
            .expect("graph keeps the rest");
        assert!((graph.delta_ns - 500_000.0).abs() < 1.0, "{graph:?}");
        assert!(!top_is_graph(&a, &before, &now));
        // Done once: the top is no graph any more.
        assert!(!refine_graph_cause(
            &mut a,
            &before,
            &now,
            &nodes(12_000_000),
            &nodes(14_500_000)
        ));
        // A changed module captured as a new graph: the new graph whole, the old one gone;
        // only their difference is shared out.
        let switched = profile(
            20,
            &[
                ("graph#9", G, 23_000_000, 0, 0.5),
                ("adam", C, 1_000_000, 0, 0.5),
            ],
            0,
        );
        let mut s = attribute(&before, &switched).expect("attribution");
        assert_eq!(s.top().map(|c| c.op.as_str()), Some("graph#9"));
        // Netted already: +23 ms new and -20 ms gone make +3 ms.
        assert!(
            s.top().is_some_and(|c| (c.delta_ns - 3e6).abs() < 1.0),
            "{s:?}"
        );
        assert!(refine_graph_cause(
            &mut s,
            &before,
            &switched,
            &nodes(12_000_000),
            &nodes(14_500_000)
        ));
        let sum: f64 = s.causes.iter().map(|c| c.delta_ns).sum();
        assert!((sum - 3_000_000.0).abs() < 1.0, "{s:?}");
        assert_eq!(s.top().map(|c| c.op.as_str()), Some("blocks.1.mlp"));
        // An eager operator at the top is not touched.
        let now_eager = profile(
            20,
            &[
                ("graph#7", G, 20_000_000, 0, 0.5),
                ("adam", C, 4_000_000, 0, 0.5),
            ],
            0,
        );
        let mut e = attribute(&before, &now_eager).expect("attribution");
        assert!(!refine_graph_cause(
            &mut e,
            &before,
            &now_eager,
            &nodes(12_000_000),
            &nodes(14_500_000)
        ));
        assert_eq!(e.top().map(|c| c.op.as_str()), Some("adam"));
        // Low occupancy inside a recaptured graph (the suite's A-04-ro and A-09-ro: the
        // capture adds no node, only the launch configuration changes): the node-level
        // iterations name the module and the occupancy dimension.
        let occ = |mlp: u64, o: f64| NodeProfile {
            iterations: 10,
            ops: profile(
                10,
                &[
                    ("blocks.1.attn", C, 8_000_000, 0, 0.5),
                    ("blocks.2.mlp.act", C, mlp, 0, o),
                ],
                0,
            )
            .ops,
        };
        let mut o = attribute(&before, &switched).expect("attribution");
        assert!(refine_graph_cause(
            &mut o,
            &before,
            &switched,
            &occ(2_000_000, 0.75),
            &occ(5_000_000, 0.25)
        ));
        let top = o.top().expect("top");
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("blocks.2.mlp.act", Dimension::Occupancy),
            "{o:?}"
        );
    }

    /// Nodes per capturing operator's label, as [`GraphComposition::nodes`] keeps them.
    fn labels(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(l, n)| ((*l).to_owned(), *n)).collect()
    }

    /// torch.compile captured the forward again: graph#5 replaced by graph#17, 3 ms longer,
    /// with 4 nodes of `blocks.2.attn.extra` more; the backward (graph#8) captured again as it
    /// was (graph#20), no longer. The baseline, the window after, and how they were captured.
    fn recaptured() -> (Profile, Profile, GraphComposition) {
        const G: OpKind = OpKind::Graph;
        let before = profile(
            20,
            &[
                ("graph#5", G, 8_000_000, 0, 0.5),
                ("graph#8", G, 6_000_000, 0, 0.5),
            ],
            0,
        );
        let now = profile(
            20,
            &[
                ("graph#17", G, 11_000_000, 0, 0.5),
                ("graph#20", G, 6_000_000, 0, 0.5),
            ],
            0,
        );
        let mut composition = GraphComposition::default();
        let nodes = &mut composition.nodes;
        nodes.insert(5, labels(&[("", 116), ("blocks.1.mlp", 5)]));
        nodes.insert(8, labels(&[("", 378), ("blocks.1.mlp", 12)]));
        nodes.insert(
            17,
            labels(&[("", 121), ("blocks.1.mlp", 5), ("blocks.2.attn.extra", 4)]),
        );
        nodes.insert(20, labels(&[("", 378), ("blocks.1.mlp", 12)]));
        (before, now, composition)
    }

    /// [`refine_graph_by_composition`] on [`recaptured`]'s attribution names the operator whose
    /// capture added nodes: graph#17's 4 of `blocks.2.attn.extra`, against graph#5.
    fn names_the_added_extra(
        a: &mut Attribution,
        before: &Profile,
        now: &Profile,
        composition: &GraphComposition,
    ) {
        assert!(refine_graph_by_composition(a, before, now, composition));
        let top = a.top().expect("top");
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("blocks.2.attn.extra", Dimension::Execution),
            "{a:?}"
        );
        assert!(
            top.detail
                .starts_with("4 more of its nodes in graph#17 than in graph#5"),
            "{}",
            top.detail
        );
    }

    #[test]
    fn a_new_graph_is_named_by_the_operator_its_capture_added() {
        const G: OpKind = OpKind::Graph;
        let (before, now, mut composition) = recaptured();
        let mut a = attribute(&before, &now).expect("attribution");
        assert_eq!(a.top().map(|c| c.op.as_str()), Some("graph#17"));
        let sum = |a: &Attribution| a.causes.iter().map(|c| c.delta_ns).sum::<f64>();
        let total = sum(&a);
        names_the_added_extra(&mut a, &before, &now, &composition);
        assert!((sum(&a) - total).abs() < 1.0, "the deltas are kept: {a:?}");
        // The named operator is no graph: done once.
        assert!(!refine_graph_by_composition(
            &mut a,
            &before,
            &now,
            &composition
        ));
        // Captured again with the same nodes, without launch configurations recorded: nothing
        // to name.
        let mut same = composition.clone();
        same.nodes
            .insert(17, labels(&[("", 116), ("blocks.1.mlp", 5)]));
        let mut b = attribute(&before, &now).expect("attribution");
        assert!(!refine_graph_by_composition(&mut b, &before, &now, &same));
        assert_eq!(b.top().map(|c| c.op.as_str()), Some("graph#17"));
        // Without the capture records of the new graph, nothing either.
        composition.nodes.remove(&17);
        assert!(!refine_graph_by_composition(
            &mut b,
            &before,
            &now,
            &composition
        ));
        // A graph the baseline launched as often is not new: left alone.
        let grown = profile(
            20,
            &[
                ("graph#5", G, 11_000_000, 0, 0.5),
                ("graph#8", G, 6_000_000, 0, 0.5),
            ],
            0,
        );
        let mut c = attribute(&before, &grown).expect("attribution");
        assert_eq!(c.top().map(|c| c.op.as_str()), Some("graph#5"));
        assert!(!refine_graph_by_composition(&mut c, &before, &grown, &same));
    }

    /// The baseline's last window held the first iterations after the recapture: the new graph
    /// launched in 1 of its 20 iterations (the suite's A-54, an H100 GPT under reduce-overhead,
    /// 2026-12-07: 10 of 225). It is still the one that replaced the old graph.
    #[test]
    fn a_new_graph_the_baseline_launched_a_little_is_named_by_its_capture() {
        let (mut before, now, composition) = recaptured();
        let first = profile(1, &[("graph#17", OpKind::Graph, 11_000_000, 0, 0.5)], 0);
        before.ops.extend(first.ops);
        let mut a = attribute(&before, &now).expect("attribution");
        assert_eq!(a.top().map(|c| c.op.as_str()), Some("graph#17"), "{a:?}");
        names_the_added_extra(&mut a, &before, &now, &composition);
        // Launched at half its rate now or more, it is no new graph.
        let mut half = before.clone();
        half.ops.get_mut("graph#17").expect("graph#17").count = 20;
        let mut b = attribute(&half, &now).expect("attribution");
        assert!(!refine_graph_by_composition(
            &mut b,
            &half,
            &now,
            &composition
        ));
    }

    /// Low occupancy inside a recaptured graph (the suite's A-04-ro and A-09-ro): the same
    /// nodes, but the Triton GELU of `blocks.2.mlp.act` captured at 264 blocks of 32 threads
    /// instead of 131072 of 128 (forward and backward), as the shim records it at capture (by
    /// default; `SLO_PROBE_CAPTURE_LAUNCH=0` turns it off).
    #[test]
    fn a_new_graph_with_the_same_nodes_is_named_by_its_changed_launch_configuration() {
        use slo_probe_common::gpu::encode_launch;
        const G: OpKind = OpKind::Graph;
        let before = profile(20, &[("graph#5", G, 8_000_000, 0, 0.5)], 0);
        let now = profile(20, &[("graph#26", G, 15_000_000, 0, 0.5)], 0);
        let normal = encode_launch([131_072, 1, 1], [128, 1, 1]);
        let low = encode_launch([264, 1, 1], [32, 1, 1]);
        let matmul = encode_launch([128, 4, 1], [256, 1, 1]);
        let labels = |act: u32| -> BTreeMap<String, BTreeMap<u32, u32>> {
            [
                ("blocks.2.mlp.act".to_owned(), [(act, 2)].into()),
                ("blocks.2.mlp".to_owned(), [(matmul, 4)].into()),
                (String::new(), [(matmul, 100)].into()),
            ]
            .into()
        };
        let comp: BTreeMap<String, u32> = [
            ("".to_owned(), 100),
            ("blocks.2.mlp".to_owned(), 4),
            ("blocks.2.mlp.act".to_owned(), 2),
        ]
        .into();
        let mut c = GraphComposition::default();
        c.nodes.insert(5, comp.clone());
        c.nodes.insert(26, comp);
        c.launches.insert(5, labels(normal));
        c.launches.insert(26, labels(low));
        let mut a = attribute(&before, &now).expect("attribution");
        assert_eq!(a.top().map(|c| c.op.as_str()), Some("graph#26"));
        assert!(refine_graph_by_composition(&mut a, &before, &now, &c));
        let top = a.top().expect("top");
        assert_eq!(
            (top.op.as_str(), top.dimension),
            ("blocks.2.mlp.act", Dimension::Occupancy),
            "{a:?}"
        );
        assert!(
            top.detail.starts_with(
                "2 of its kernel nodes in graph#26 captured with another launch configuration \
                 than in graph#5, which that graph replaced (2× 131072 blocks of 128 threads → \
                 2× 264 blocks of 32 threads)"
            ),
            "{}",
            top.detail
        );
        // The same configurations: nothing to name.
        c.launches.insert(26, labels(normal));
        let mut b = attribute(&before, &now).expect("attribution");
        assert!(!refine_graph_by_composition(&mut b, &before, &now, &c));
        // Only the old graph's configurations recorded: nothing either.
        c.launches.remove(&26);
        assert!(!refine_graph_by_composition(&mut b, &before, &now, &c));
    }

    #[test]
    fn nothing_to_compare() {
        assert!(attribute(&Profile::default(), &profile(1, &[], 0)).is_none());
    }
}
