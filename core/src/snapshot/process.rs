//! One training process as a snapshot shows it: its shim's counters, its recent iterations (a
//! shared history: a tick copies pointers, never iterations), the statistics exporters, reports
//! and `top` print (computed once when the history changes), and its SLO tree.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use rustc_hash::FxHashMap;

use crate::{
    gputrace::{Iteration, OpKind, PHASES},
    slo::SloSnapshot,
};

/// Recent iterations, oldest first: chunks shared between the pipeline and every snapshot.
/// Pushing appends a chunk; trimming drops whole chunks and skips into the oldest, so a
/// snapshot's copy is a few pointer copies whatever the length.
#[derive(Clone, Debug, Default)]
pub struct IterationHistory {
    chunks: VecDeque<Arc<[Iteration]>>,
    /// Iterations of the oldest chunk that are no longer in the history.
    skip: usize,
    len: usize,
}

impl PartialEq for IterationHistory {
    fn eq(&self, o: &Self) -> bool {
        self.len == o.len && self.iter().eq(o.iter())
    }
}

impl From<Vec<Iteration>> for IterationHistory {
    fn from(v: Vec<Iteration>) -> Self {
        let mut h = Self::default();
        h.push(v, None);
        h
    }
}

impl IterationHistory {
    /// Appends `its` (in completion order), keeping at most the last `keep` iterations.
    pub fn push(&mut self, its: Vec<Iteration>, keep: Option<usize>) {
        if !its.is_empty() {
            self.len += its.len();
            self.chunks.push_back(Arc::from(its));
        }
        let Some(keep) = keep else { return };
        while self.len > keep {
            let excess = self.len - keep;
            let Some(first) = self.chunks.front() else {
                break;
            };
            let left = first.len() - self.skip;
            if excess >= left {
                self.chunks.pop_front();
                self.skip = 0;
                self.len -= left;
            } else {
                self.skip += excess;
                self.len -= excess;
            }
        }
    }

    /// Iterations held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Iteration> + Clone {
        let skip = self.skip;
        self.chunks
            .iter()
            .enumerate()
            .flat_map(move |(k, c)| c[if k == 0 { skip } else { 0 }..].iter())
    }

    /// The oldest.
    pub fn first(&self) -> Option<&Iteration> {
        self.iter().next()
    }

    /// The latest.
    pub fn last(&self) -> Option<&Iteration> {
        self.chunks.back().and_then(|c| c.last())
    }
}

/// P50 and P99 (nearest rank of `(n − 1) · q`).
pub type Quantiles = [u64; 2];

fn quantiles(mut v: Vec<u64>) -> Option<Quantiles> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let q = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Some([q(0.5), q(0.99)])
}

/// One operator summed over the history.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSummary {
    /// Label (see [`crate::gputrace::OpTime::op`]).
    pub op: Arc<str>,
    /// What it does.
    pub kind: OpKind,
    /// GPU time, ns.
    pub gpu_ns: u64,
    /// Activities.
    pub count: u64,
    /// GPU-time-weighted theoretical occupancy, when known.
    pub occupancy: Option<f64>,
}

/// One operator while the history is summed.
struct OpSum<'a> {
    kind: OpKind,
    op: &'a Arc<str>,
    gpu_ns: u64,
    count: u64,
    occ_weighted: f64,
    occ_ns: u64,
}

/// Operators [`IterationStats::ops`] keeps.
pub const TOP_OPS: usize = 16;

/// What the history's iterations add up to: computed once when it changes, read by every
/// exporter, report and view.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IterationStats {
    /// Iterations summarised.
    pub count: usize,
    /// Of those, the ones the GPU breakdown (busy, phases, launch latency, operators, means)
    /// comes from: those with their kernels traced.
    pub traced: usize,
    /// Whether their boundaries came from step markers (of the oldest).
    pub marked: bool,
    /// Iteration time ([`Iteration::step_ns`]), ns.
    pub wall_ns: Quantiles,
    /// Launch latency of every activity, ns (`None` without launch stamps).
    pub launch_latency_ns: Option<Quantiles>,
    /// Per phase of [`PHASES`], in its order, ns.
    pub phases: [Quantiles; PHASES.len()],
    /// Median of the iterations' GPU busy / wall ratios (warm-up iterations last seconds and
    /// would swamp a ratio of sums).
    pub gpu_busy_ratio_p50: f64,
    /// Mean kernels per iteration.
    pub kernels_mean: f64,
    /// Mean graph launches per iteration.
    pub graph_launches_mean: f64,
    /// Mean GPU idle before an iteration's first activity, ns.
    pub idle_before_first_mean_ns: f64,
    /// Operators by GPU time, largest first (ties by label), at most [`TOP_OPS`].
    pub ops: Vec<OpSummary>,
    /// GPU time of every operator, ns (the denominator of shares).
    pub ops_gpu_ns: u64,
}

impl IterationStats {
    /// The statistics of `h` (`None` when it is empty).
    pub fn of(h: &IterationHistory) -> Option<Self> {
        let first = h.first()?;
        let walls = quantiles(h.iter().map(Iteration::step_ns).collect())?;
        // The GPU breakdown from the iterations whose kernels were traced (all of them but
        // those outside the shim's sample windows); all of them when none was.
        let any_traced = h.iter().any(|i| i.traced);
        let gpu = || h.iter().filter(move |i| i.traced || !any_traced);
        let n = gpu().count().max(1);
        let launch = quantiles(
            gpu()
                .flat_map(|i| i.launch_latencies_ns.iter().copied())
                .collect(),
        );
        let mut phases = [[0u64; 2]; PHASES.len()];
        for (k, (_, of)) in PHASES.iter().enumerate() {
            phases[k] = quantiles(gpu().map(of).collect()).unwrap_or_default();
        }
        let mut busy: Vec<f64> = gpu().map(Iteration::gpu_busy_ratio).collect();
        busy.sort_by(f64::total_cmp);
        // Summed in a hash map, then put in label order (a BTreeMap's string comparisons on
        // each of every iteration's operators were 3% of the pipeline on the H200 eager
        // fixture).
        let mut ops: FxHashMap<&str, OpSum<'_>> = FxHashMap::default();
        for i in gpu() {
            for o in &i.ops {
                let e = ops.entry(&*o.op).or_insert(OpSum {
                    kind: o.kind,
                    op: &o.op,
                    gpu_ns: 0,
                    count: 0,
                    occ_weighted: 0.0,
                    occ_ns: 0,
                });
                e.gpu_ns += o.gpu_ns;
                e.count += u64::from(o.kernels);
                if let Some(occ) = o.occupancy {
                    e.occ_weighted += occ * o.gpu_ns as f64;
                    e.occ_ns += o.gpu_ns;
                }
            }
        }
        let mut ops: Vec<_> = ops.into_values().collect();
        // Labels are the map's keys: distinct.
        ops.sort_unstable_by(|a, b| a.op.cmp(b.op));
        let ops_gpu_ns = ops.iter().map(|o| o.gpu_ns).fold(0, u64::saturating_add);
        // Stable: ties stay in label order.
        ops.sort_by_key(|o| std::cmp::Reverse(o.gpu_ns));
        ops.truncate(TOP_OPS);
        let mean = |f: &dyn Fn(&Iteration) -> f64| gpu().map(f).sum::<f64>() / n as f64;
        Some(Self {
            count: h.len(),
            traced: gpu().count(),
            marked: first.marked,
            wall_ns: walls,
            launch_latency_ns: launch,
            phases,
            gpu_busy_ratio_p50: busy[busy.len() / 2],
            kernels_mean: mean(&|i| f64::from(i.kernels)),
            graph_launches_mean: mean(&|i| f64::from(i.graph_launches)),
            idle_before_first_mean_ns: mean(&|i| i.idle_before_first_ns as f64),
            ops: ops
                .into_iter()
                .map(|o| OpSummary {
                    op: o.op.clone(),
                    kind: o.kind,
                    gpu_ns: o.gpu_ns,
                    count: o.count,
                    occupancy: (o.occ_ns > 0).then(|| o.occ_weighted / o.occ_ns as f64),
                })
                .collect(),
            ops_gpu_ns,
        })
    }

    /// The quantiles of the phase `name` of [`PHASES`].
    pub fn phase(&self, name: &str) -> Option<Quantiles> {
        PHASES
            .iter()
            .position(|(n, _)| *n == name)
            .map(|k| self.phases[k])
    }
}

/// What the agent knows about one training process: its shim's counters, its iterations and
/// its SLO tree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessSnapshot {
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
    /// Completed iterations, oldest first (a bounded window in the live agent).
    pub iterations: IterationHistory,
    /// What the history adds up to (`None` while it is empty).
    pub stats: Option<Arc<IterationStats>>,
    /// Iterations completed since the shim registered (since its step markers began, where
    /// they began after iterations had been detected without them).
    pub iterations_total: u64,
    /// Iterations detected before the process's step markers began, left out of everything
    /// since (warm-up under another clock: `ProcessPipeline`'s restart on markers).
    pub iterations_before_markers: u64,
    /// What each CUDA graph runs (operators by share of its GPU time), for the graphs that
    /// node-level tracing has seen; graph-level records are labelled `graph#<id>`.
    pub graph_ops: Arc<BTreeMap<u32, Vec<(String, f64)>>>,
    /// Activities counted under the overflow operator because the assembler's operator table
    /// was full.
    pub ops_overflowed: u64,
    /// Name strings dropped because the assembler's string table was full.
    pub strings_dropped: u64,
    /// Records dropped because one of the assembler's per-process tables was full (records
    /// pending without an iteration, open steps, CUDA graphs).
    pub capped: u64,
    /// The SLO tree of the process, as of its last closed window.
    pub slo: Option<Arc<SloSnapshot>>,
    /// Its rank in the job, from its environment (`RANK`, ...), when known.
    pub rank: Option<u32>,
    /// Its job, from its environment (`SLO_PROBE_JOB`, `TORCHELASTIC_RUN_ID`, ...), when known.
    pub job_id: Option<String>,
    /// The shim's tracing depth and duty cycle as it published them (`None`: an older shim).
    pub depth: Option<slo_probe_common::ring::ShimDepth>,
    /// The depth the agent asks for now (`gpu::DEPTH_*`; 0: the shim's own tier): what the
    /// SLO engine wants, or the healer's shim-depth floor where that is deeper.
    pub depth_wanted: u32,
    /// The shim's own cost on the launching threads since it started (its callbacks plus the
    /// estimated CUPTI cost of its kernel records), ns.
    pub shim_cost_ns: u64,
    /// Time spent in the iterations completed since the shim registered, ns (what the cost is
    /// a share of).
    pub steps_ns: u64,
    /// How long no GPU record has reached the agent while the shim traced kernels and the job
    /// launched work, s (0: they arrive; the agent says so from 30 s).
    pub gpu_records_stalled_s: u64,
    /// Its executable name (`comm`), read when its shim registered.
    pub executable: Option<String>,
    /// Its Kubernetes pod's UID, from its cgroup path, read when its shim registered.
    pub pod_uid: Option<String>,
    /// Its Kubernetes pod's name (its `HOSTNAME` inside a pod), read when its shim registered.
    pub pod_name: Option<String>,
    /// Its Kubernetes namespace (`POD_NAMESPACE` or `K8S_NAMESPACE` in its environment), read
    /// when its shim registered.
    pub pod_namespace: Option<String>,
    /// UUID of the GPU it runs on: from its environment when its shim registered (a device
    /// plugin's `NVIDIA_VISIBLE_DEVICES` naming one GPU), else from NVML's view of its latest
    /// iterations ([`super::Snapshot::derive`]).
    pub gpu_uuid: Option<String>,
}

impl ProcessSnapshot {
    /// The shim's cost as a share of the process's step time (0 before any iteration).
    pub fn shim_overhead_ratio(&self) -> f64 {
        if self.steps_ns == 0 {
            0.0
        } else {
            self.shim_cost_ns as f64 / self.steps_ns as f64
        }
    }

    /// Sets the history and recomputes its statistics.
    pub fn set_iterations(&mut self, h: IterationHistory) {
        self.stats = IterationStats::of(&h).map(Arc::new);
        self.iterations = h;
    }
}

impl crate::straggler::Rank for ProcessSnapshot {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn rank(&self) -> Option<u32> {
        self.rank
    }

    fn job_id(&self) -> Option<&str> {
        self.job_id.as_deref()
    }

    fn iterations(&self) -> impl Iterator<Item = &Iteration> {
        self.iterations.iter()
    }

    fn node_value(&self, node: &str) -> Option<f64> {
        self.slo.as_ref()?.node(node)?.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(step: u64, wall: u64) -> Iteration {
        Iteration {
            step,
            start_ns: step * 1000,
            end_ns: step * 1000 + wall,
            ..Default::default()
        }
    }

    #[test]
    fn history_keeps_the_last_iterations_and_shares_chunks() {
        let mut h = IterationHistory::default();
        h.push((0..5).map(|s| it(s, 10)).collect(), Some(7));
        h.push((5..9).map(|s| it(s, 10)).collect(), Some(7));
        assert_eq!(h.len(), 7);
        assert_eq!(
            h.iter().map(|i| i.step).collect::<Vec<_>>(),
            (2..9).collect::<Vec<_>>()
        );
        assert_eq!(h.first().map(|i| i.step), Some(2));
        assert_eq!(h.last().map(|i| i.step), Some(8));
        let copy = h.clone();
        assert!(Arc::ptr_eq(&copy.chunks[1], &h.chunks[1]));
        h.push((9..20).map(|s| it(s, 10)).collect(), Some(7));
        assert_eq!(h.len(), 7);
        assert_eq!(h.chunks.len(), 1);
        assert_eq!(h.first().map(|i| i.step), Some(13));
        assert_eq!(copy.len(), 7, "an earlier copy is unchanged");
        h.push(Vec::new(), Some(3));
        assert_eq!(h.iter().map(|i| i.step).collect::<Vec<_>>(), [17, 18, 19]);
    }

    #[test]
    fn stats_use_nearest_rank_quantiles() {
        let h = IterationHistory::from((0..100).map(|s| it(s, 100 + s)).collect::<Vec<_>>());
        let s = IterationStats::of(&h).expect("stats");
        assert_eq!(s.count, 100);
        assert_eq!(s.wall_ns, [150, 198]);
        assert!(s.launch_latency_ns.is_none());
        assert!(IterationStats::of(&IterationHistory::default()).is_none());
    }
}
