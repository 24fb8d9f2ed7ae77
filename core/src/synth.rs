//! Generated training jobs with a known cause of slowness, for the known-answer tests of the SLO
//! engine and attribution, and for benchmarks.
//!
//! A job is simulated, not drawn: a host thread launches an iteration's kernels one after the
//! other (each launch costs it CPU time), the GPU runs them in order as soon as both the GPU and
//! the launch allow, the batch is copied in first and gradients are all-reduced at the end.
//! The shim's records come out of that timeline (kernels with launch time, grid, block,
//! registers; memory copies; step markers; operator strings), together with the host counters
//! the agent would sample every 100 ms. A fault changes the simulation from an onset time on,
//! the way the cause would change a real job: a slower kernel, a launch configuration with lower
//! occupancy, a slower copy, a host sync before an operator, a slower and jittery all-reduce with
//! TCP retransmits, a starved data loader, a main thread kept off the CPU. Everything is drawn
//! from one seed, so a case is reproducible from its seed alone.

use slo_probe_common::{
    gpu::{
        DepthRecord, DEPTH_KERNELS, DEPTH_REASON_DEFAULT, DEPTH_REASON_SAMPLE, DEPTH_TIMING,
        STEP_BEGIN, STEP_END, STRING_KERNEL, STRING_OP,
    },
    GpuKernelRecord, GpuMemRecord, Record, RecordHeader, StepRecord, StringRecord,
};

use slo_probe_common::{decode, ring::SHIM_MIN_DRAIN_NS, AnyRecord, RecordIter};

use crate::{
    attribution::{Dimension, DATA_LOADING_OP, LAUNCHES_OP},
    host::{ConnHost, HostSample},
    occupancy::SmLimits,
    pipeline::{record_time, PipelineSettings, ProcessPipeline, Windows},
    roles::Role,
    slo::SloSpec,
};

/// A small, fast, seedable generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// From a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-12);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// A positive factor around 1 with relative spread `sd`.
    pub fn jitter(&mut self, sd: f64) -> f64 {
        (sd * self.normal()).exp()
    }
}

/// The shape of a generated job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSpec {
    /// Transformer-like blocks: each has `attn` and `mlp` operators, forward and backward.
    pub blocks: usize,
    /// Kernels per operator.
    pub kernels_per_op: usize,
    /// Mean kernel duration, ns.
    pub kernel_ns: u64,
    /// Host CPU time per launch, ns.
    pub launch_cpu_ns: u64,
    /// Bytes of the batch copied in at the start of each iteration.
    pub batch_bytes: u64,
    /// Copy bandwidth, bytes per ns (GB/s).
    pub copy_bytes_per_ns: f64,
    /// Duration of the gradient all-reduce, ns.
    pub allreduce_ns: u64,
    /// Host wait for the next batch, ns.
    pub loader_ns: u64,
    /// Host time between iterations (logging, the Python loop), ns.
    pub between_ns: u64,
    /// Relative spread of every duration.
    pub jitter: f64,
    /// Share of iterations with a hiccup (a garbage-collection pause on the host).
    pub hiccup_rate: f64,
    /// A hiccup's length relative to the iteration.
    pub hiccup_size: f64,
    /// Whether operators differ in cost (see [`JobSpec::op_weights`]); else all cost the same.
    pub weighted: bool,
    /// Steps between host synchronisations (the loss read back): 1 syncs every step; more lets
    /// the CPU run ahead of the GPU, bounded by [`JobSpec::queue_depth`].
    pub sync_every: u64,
    /// Launches the host may have outstanding before it blocks (the driver's launch queue, the
    /// caching allocator waiting for a stream): how far a CPU that runs ahead gets.
    pub queue_depth: usize,
}

impl JobSpec {
    /// A job whose GPU is the bottleneck (kernels of hundreds of µs; the host runs ahead).
    pub fn gpu_bound(rng: &mut Rng) -> Self {
        Self {
            blocks: 2 + rng.below(4),
            kernels_per_op: 2,
            kernel_ns: rng.range(150_000.0, 400_000.0) as u64,
            launch_cpu_ns: rng.range(6_000.0, 12_000.0) as u64,
            batch_bytes: 64 << 20,
            copy_bytes_per_ns: rng.range(20.0, 25.0),
            allreduce_ns: rng.range(1_000_000.0, 2_000_000.0) as u64,
            loader_ns: rng.range(200_000.0, 500_000.0) as u64,
            between_ns: 150_000,
            jitter: 0.03,
            hiccup_rate: 0.01,
            hiccup_size: 0.12,
            weighted: true,
            // Half the GPU-bound jobs read the loss back every ten steps only: their CPU runs
            // ahead of the GPU, as real PyTorch jobs do, and queueing hides the host.
            sync_every: if rng.unit() < 0.5 { 10 } else { 1 },
            queue_depth: 100 + rng.below(300),
        }
    }

    /// A job whose host is the bottleneck (small kernels: launching them takes as long as
    /// running them).
    pub fn launch_bound(rng: &mut Rng) -> Self {
        Self {
            blocks: 2 + rng.below(4),
            kernels_per_op: 3,
            kernel_ns: rng.range(8_000.0, 14_000.0) as u64,
            launch_cpu_ns: rng.range(16_000.0, 24_000.0) as u64,
            batch_bytes: 4 << 20,
            copy_bytes_per_ns: rng.range(20.0, 25.0),
            allreduce_ns: rng.range(150_000.0, 300_000.0) as u64,
            loader_ns: rng.range(50_000.0, 150_000.0) as u64,
            between_ns: 80_000,
            jitter: 0.03,
            hiccup_rate: 0.01,
            hiccup_size: 0.12,
            weighted: false,
            sync_every: 1,
            queue_depth: 1024,
        }
    }

    /// Relative cost of each compute operator (same order as [`JobSpec::compute_ops`]): MLPs
    /// cost twice attention, backward twice forward, the loss and optimizer little (all 1 in
    /// an unweighted job).
    pub fn op_weights(&self) -> Vec<f64> {
        if !self.weighted {
            return vec![1.0; self.compute_ops().len()];
        }
        self.compute_ops()
            .iter()
            .map(|op| {
                let w = if op.contains("mlp") {
                    2.0
                } else if op.contains("attn") {
                    1.0
                } else if op == "loss" {
                    0.3
                } else {
                    0.6
                };
                if op.ends_with(".backward") {
                    2.0 * w
                } else {
                    w
                }
            })
            .collect()
    }

    /// The compute operators of one iteration, in launch order.
    pub fn compute_ops(&self) -> Vec<String> {
        let mut ops = Vec::new();
        for b in 0..self.blocks {
            ops.push(format!("blocks.{b}.attn"));
            ops.push(format!("blocks.{b}.mlp"));
        }
        ops.push("loss".to_owned());
        for b in (0..self.blocks).rev() {
            ops.push(format!("blocks.{b}.mlp.backward"));
            ops.push(format!("blocks.{b}.attn.backward"));
        }
        ops.push("optimizer.step".to_owned());
        ops
    }
}

/// The all-reduce kernel's name (NCCL's, so that it is classified as communication).
pub const ALLREDUCE_KERNEL: &str = "ncclDevKernel_AllReduce_Sum_f32_RING_LL";

/// The label of the batch copy.
pub const COPY_OP: &str = "memcpy HtoD";

/// The connection the all-reduce uses.
pub const RANK_SOCKET: &str = "10.0.0.1:41000 -> 10.0.0.2:29500";

/// A cause injected from an onset time on.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// None: a healthy job.
    None,
    /// Compute operator `op`'s kernels take `factor` times longer (same launch configuration).
    SlowKernel {
        /// Index into [`JobSpec::compute_ops`].
        op: usize,
        /// Duration factor.
        factor: f64,
    },
    /// Compute operator `op` launches with a configuration of lower theoretical occupancy
    /// (512 threads × 96 registers instead of 256 × 32), and its kernels take `factor` times
    /// longer.
    LowOccupancy {
        /// Index into [`JobSpec::compute_ops`].
        op: usize,
        /// Duration factor.
        factor: f64,
    },
    /// The batch copy runs at `1 / factor` of its bandwidth (pageable memory).
    SlowCopy {
        /// Duration factor.
        factor: f64,
    },
    /// Before launching compute operator `op`, the host synchronises with the GPU and works
    /// `gap_ns` more (a `.item()` in the model).
    LaunchGap {
        /// Index into [`JobSpec::compute_ops`].
        op: usize,
        /// Host time after the sync, ns.
        gap_ns: u64,
    },
    /// The all-reduce takes `extra_ns` longer on average, varying a lot, while the rank
    /// socket retransmits.
    CommJitter {
        /// Mean extra time, ns.
        extra_ns: u64,
        /// Retransmitted segments per iteration.
        retransmits: u64,
    },
    /// The next batch is ready `extra_ns` later: the loader workers wait for a CPU.
    LoaderStarvation {
        /// Extra wait, ns.
        extra_ns: u64,
    },
    /// The main thread is preempted for `total_ns` per iteration in pieces (noisy neighbours).
    HostContention {
        /// Run-queue wait per iteration, ns.
        total_ns: u64,
    },
}

/// The operator and dimension attribution should name for a fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truth {
    /// Operator label.
    pub op: String,
    /// Dimension.
    pub dimension: Dimension,
}

/// One generated case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// Seed of everything random in it.
    pub seed: u64,
    /// A short name of the fault kind.
    pub kind: &'static str,
    /// The job.
    pub spec: JobSpec,
    /// The fault.
    pub fault: Fault,
    /// A second, smaller change at the same time: compute operator and duration factor.
    pub secondary: Option<(usize, f64)>,
    /// Fault onset, ns after the job's start.
    pub onset_ns: u64,
    /// Length of the job, ns.
    pub duration_ns: u64,
}

impl Case {
    /// What attribution should find (`None` for a healthy job).
    pub fn truth(&self) -> Option<Truth> {
        let ops = self.spec.compute_ops();
        let t = |op: &str, dimension| {
            Some(Truth {
                op: op.to_owned(),
                dimension,
            })
        };
        match &self.fault {
            Fault::None => None,
            Fault::SlowKernel { op, .. } => t(&ops[*op], Dimension::Execution),
            Fault::LowOccupancy { op, .. } => t(&ops[*op], Dimension::Occupancy),
            Fault::SlowCopy { .. } => t(COPY_OP, Dimension::MemoryBandwidth),
            Fault::LaunchGap { op, .. } => t(&ops[*op], Dimension::LaunchLatency),
            Fault::CommJitter { .. } => t(ALLREDUCE_KERNEL, Dimension::Communication),
            Fault::LoaderStarvation { .. } => t(DATA_LOADING_OP, Dimension::DataLoading),
            Fault::HostContention { .. } => t(LAUNCHES_OP, Dimension::LaunchLatency),
        }
    }
}

/// Fault kinds [`cases`] draws from, with "healthy".
pub const KINDS: [&str; 8] = [
    "healthy",
    "slow_kernel",
    "low_occupancy",
    "slow_copy",
    "launch_gap",
    "comm_jitter",
    "loader_starvation",
    "host_contention",
];

/// Time of healthy running before the fault, ns (the engine learns its baseline there).
pub const ONSET_NS: u64 = 12_000_000_000;

/// Length of a case, ns.
pub const CASE_NS: u64 = 20_000_000_000;

/// `per_kind` cases of every kind in [`KINDS`], from `seed`. Fault sizes are drawn so that the
/// mean iteration grows by 12–50%; in a third of the faulty cases a second operator slows
/// down too, by a third as much.
pub fn cases(per_kind: usize, seed: u64) -> Vec<Case> {
    let mut out = Vec::new();
    for k in 0..per_kind {
        for (ki, &kind) in KINDS.iter().enumerate() {
            let case_seed = seed
                .wrapping_mul(1_000_003)
                .wrapping_add((k * KINDS.len() + ki) as u64);
            out.push(case(kind, case_seed));
        }
    }
    out
}

/// One case of `kind` from `seed`.
pub fn case(kind: &'static str, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let spec = if kind == "host_contention" || (kind == "healthy" && rng.unit() < 0.5) {
        JobSpec::launch_bound(&mut rng)
    } else {
        JobSpec::gpu_bound(&mut rng)
    };
    let base = estimate_iteration_ns(&spec);
    let grow = rng.range(0.12, 0.5) * base as f64;
    // The faulty operator: one with at least 5% of the iteration (a 100× slower loss kernel
    // is not a realistic incident).
    let weights = spec.op_weights();
    let unit = (spec.kernel_ns * spec.kernels_per_op as u64) as f64;
    let heavy: Vec<usize> = (0..weights.len())
        .filter(|&i| weights[i] * unit >= 0.05 * base as f64)
        .collect();
    let op = if heavy.is_empty() {
        rng.below(weights.len())
    } else {
        heavy[rng.below(heavy.len())]
    };
    let op_ns = weights[op] * unit;
    let copy_ns = spec.batch_bytes as f64 / spec.copy_bytes_per_ns;
    let fault = match kind {
        "slow_kernel" => Fault::SlowKernel {
            op,
            factor: 1.0 + grow / op_ns,
        },
        "low_occupancy" => Fault::LowOccupancy {
            op,
            factor: 1.0 + grow / op_ns,
        },
        "slow_copy" => Fault::SlowCopy {
            factor: 1.0 + grow / copy_ns,
        },
        "launch_gap" => Fault::LaunchGap {
            op,
            gap_ns: grow as u64,
        },
        "comm_jitter" => Fault::CommJitter {
            extra_ns: (grow + allreduce_slack_ns(&spec).max(0.0)) as u64,
            retransmits: 20 + rng.below(200) as u64,
        },
        // A CPU running ahead hides a slower loader up to its slack.
        "loader_starvation" => Fault::LoaderStarvation {
            extra_ns: (grow + host_slack_ns(&spec)) as u64,
        },
        "host_contention" => Fault::HostContention {
            total_ns: grow as u64,
        },
        _ => Fault::None,
    };
    let secondary = (fault != Fault::None && rng.unit() < 1.0 / 3.0 && heavy.len() > 1)
        .then(|| {
            let other = heavy[rng.below(heavy.len())];
            (other != op).then(|| (other, 1.0 + grow / 3.0 / (weights[other] * unit)))
        })
        .flatten();
    Case {
        seed,
        kind,
        spec,
        fault,
        secondary,
        onset_ns: ONSET_NS,
        duration_ns: CASE_NS,
    }
}

/// After which compute operator the all-reduce is launched: the middle of the backward pass.
fn allreduce_launch_index(spec: &JobSpec) -> usize {
    let n = spec.compute_ops().len();
    // Forward ops, the loss, then backward ops, then the optimizer.
    let backward_start = 2 * spec.blocks + 1;
    (backward_start + spec.blocks).min(n - 2)
}

/// GPU time of the compute work the all-reduce overlaps, ns (what a slower all-reduce hides
/// before it shows).
fn allreduce_slack_ns(spec: &JobSpec) -> f64 {
    let unit = (spec.kernel_ns * spec.kernels_per_op as u64) as f64;
    let w = spec.op_weights();
    let after = allreduce_launch_index(spec);
    w[after + 1..].iter().sum::<f64>() * unit - spec.allreduce_ns as f64
}

/// How much longer the GPU takes per step than the host when the CPU runs ahead (0 when the
/// host syncs every step), ns: what a slower host hides.
fn host_slack_ns(spec: &JobSpec) -> f64 {
    if spec.sync_every <= 1 {
        return 0.0;
    }
    let kernels = spec.compute_ops().len() * spec.kernels_per_op + 1;
    let weight: f64 = spec.op_weights().iter().sum();
    let copy = spec.batch_bytes as f64 / spec.copy_bytes_per_ns;
    let gpu = weight * (spec.kernels_per_op as u64 * spec.kernel_ns) as f64 + copy;
    let host = (kernels as u64 * spec.launch_cpu_ns + spec.loader_ns + spec.between_ns) as f64;
    (gpu - host).max(0.0)
}

/// An iteration's length without noise or faults, ns (roughly: the slower of host and GPU).
pub fn estimate_iteration_ns(spec: &JobSpec) -> u64 {
    let kernels = spec.compute_ops().len() * spec.kernels_per_op + 1;
    let weight: f64 = spec.op_weights().iter().sum();
    let gpu =
        (weight * (spec.kernels_per_op as u64 * spec.kernel_ns) as f64) as u64 + spec.allreduce_ns;
    let host = kernels as u64 * spec.launch_cpu_ns;
    let copy = (spec.batch_bytes as f64 / spec.copy_bytes_per_ns) as u64;
    spec.loader_ns + copy + gpu.max(host) + spec.between_ns
}

/// A generated trace: the shim's records as the agent would receive them, and the host
/// samples.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Records end to end (strings first, then each iteration's markers and activities).
    pub records: Vec<u8>,
    /// Host counters every 100 ms.
    pub host: Vec<HostSample>,
    /// Kernel records in `records`.
    pub kernels: u64,
    /// Iterations.
    pub iterations: u64,
}

/// Where the job starts on CLOCK_MONOTONIC (an arbitrary, realistic value).
const T0: u64 = 1_000_000_000_000;

/// Host sampling period, ns.
const HOST_PERIOD: u64 = 100_000_000;

/// The stream NCCL runs on (its own, overlapping the compute stream).
const COMM_STREAM: u32 = 13;

/// Id of the all-reduce kernel's name string.
const ALLREDUCE_NAME_ID: u32 = 1;

struct Sim<'a> {
    case: &'a Case,
    rng: Rng,
    out: Trace,
    host: u64,
    gpu: u64,
    /// Where the communication stream is busy until.
    comm: u64,
    /// Factor on every kernel's duration now (the GPU clock wanders a little).
    clock: f64,
    /// End times of the GPU work launched and not yet waited for, oldest first (the bounded
    /// queue a CPU running ahead fills).
    queue: std::collections::VecDeque<u64>,
    sample: HostSample,
    next_sample: u64,
    corr: u32,
}

impl Sim<'_> {
    fn push<R: Record>(&mut self, r: &R) {
        self.out.records.extend_from_slice(r.as_bytes());
    }

    fn string(&mut self, id: u32, kind: u32, text: &str) {
        let mut b = vec![0u8; 64 + text.len()];
        let n = StringRecord::encode(id, kind, text.as_bytes(), &mut b);
        self.out.records.extend_from_slice(&b[..n]);
    }

    /// Emits host samples up to `t`.
    fn sample_until(&mut self, t: u64) {
        while self.next_sample <= t {
            self.sample.at_ns = self.next_sample;
            self.out.host.push(self.sample.clone());
            self.next_sample += HOST_PERIOD;
        }
    }

    fn faulty(&self) -> bool {
        self.host >= T0 + self.case.onset_ns
    }

    /// The host spends `ns` on the CPU; `runq` of it waiting for one (main thread).
    fn host_work(&mut self, ns: u64, runq: u64) {
        self.host += ns + runq;
        if runq > 0 {
            let m = self.sample.role_mut(Role::Main);
            m.runq_ns += runq;
            m.runq_waits += 1;
            m.offcpu_involuntary_ns += runq;
        }
    }

    /// The host blocks until the queue has room for one more launch.
    fn queue_room(&mut self) {
        while self.queue.front().is_some_and(|&e| e <= self.host) {
            self.queue.pop_front();
        }
        while self.queue.len() >= self.case.spec.queue_depth.max(1) {
            if let Some(e) = self.queue.pop_front() {
                self.host = self.host.max(e);
            }
        }
    }

    #[expect(clippy::too_many_arguments, reason = "one kernel record's fields")]
    fn kernel(
        &mut self,
        name_id: u32,
        op_id: u32,
        dur_ns: u64,
        block: u32,
        registers: u32,
        stream: u32,
        runq: u64,
        after_comm: bool,
    ) {
        let launch_cost = (self.case.spec.launch_cpu_ns as f64 * self.rng.jitter(0.05)) as u64;
        self.queue_room();
        self.host_work(launch_cost, runq);
        let launch = self.host;
        let dur_ns = (dur_ns as f64 * self.clock) as u64;
        // The all-reduce waits for the gradients: the compute kernels launched before it; the
        // optimizer waits for the all-reduce (`after_comm`).
        let (lane, after) = if stream == COMM_STREAM {
            (&mut self.comm, self.gpu)
        } else if after_comm {
            (&mut self.gpu, self.comm)
        } else {
            (&mut self.gpu, 0)
        };
        let start = (*lane).max(launch + 4_000).max(after);
        let end = start + dur_ns.max(1_000);
        *lane = end;
        self.queue.push_back(end);
        self.corr += 1;
        let k = GpuKernelRecord {
            header: RecordHeader::of::<GpuKernelRecord>(),
            start_ns: start,
            end_ns: end,
            launch_ns: launch,
            graph_node_id: 0,
            correlation_id: self.corr,
            device_id: 0,
            context_id: 1,
            stream_id: stream,
            graph_id: 0,
            grid: [132, 1, 1],
            block: [block, 1, 1],
            registers,
            static_smem: 0,
            dynamic_smem: 0,
            name_id,
            op_id,
            launch_tid: 100,
            flags: 0,
        };
        self.push(&k);
        self.out.kernels += 1;
    }
}

/// Runs `case`'s job and records what the shim and the host probes would have seen.
pub fn generate(case: &Case) -> Trace {
    let spec = &case.spec;
    let ops = spec.compute_ops();
    let weights = spec.op_weights();
    let mut sim = Sim {
        case,
        rng: Rng::new(case.seed ^ 0x5eed),
        out: Trace::default(),
        host: T0,
        gpu: T0,
        comm: T0,
        clock: 1.0,
        queue: std::collections::VecDeque::new(),
        sample: HostSample::default(),
        next_sample: T0,
        corr: 0,
    };
    sim.sample.conns.push(ConnHost {
        label: RANK_SOCKET.to_owned(),
        role: Some(Role::Communication),
        retransmits: 0,
    });
    // Strings: the all-reduce kernel, then per operator an op string (id 100 + i) and a
    // kernel name per kernel of the operator (id 1000 + i * 16 + k).
    sim.string(ALLREDUCE_NAME_ID, STRING_KERNEL, ALLREDUCE_KERNEL);
    for (i, op) in ops.iter().enumerate() {
        sim.string(100 + i as u32, STRING_OP, op);
        for k in 0..spec.kernels_per_op {
            let name = match k % 3 {
                0 => "ampere_sgemm_128x64_tn".to_owned(),
                1 => format!("triton_poi_fused_{}_{k}", op.replace('.', "_")),
                _ => "vectorized_elementwise_kernel".to_owned(),
            };
            sim.string(1000 + (i * 16 + k) as u32, STRING_KERNEL, &name);
        }
    }
    let end = T0 + case.duration_ns;
    let mut step = 0u64;
    let mut next_clock = T0;
    // DDP launches the all-reduce once half of the backward pass has produced its gradients;
    // it overlaps the rest.
    let allreduce_after = allreduce_launch_index(spec);
    while sim.host < end {
        sim.sample_until(sim.host);
        if sim.host >= next_clock {
            sim.clock = sim.rng.range(0.97, 1.03);
            next_clock += 2_000_000_000;
        }
        let faulty = sim.faulty();
        let begin = sim.host;
        sim.push(&StepRecord {
            header: RecordHeader::of::<StepRecord>(),
            step,
            ts_ns: begin,
            tid: 100,
            phase: STEP_BEGIN,
        });
        // Wait for the batch (now and then much longer: a worker's garbage collection).
        let mut loader = (spec.loader_ns as f64 * sim.rng.jitter(0.1)) as u64;
        if sim.rng.unit() < 0.02 {
            loader = (loader as f64 * sim.rng.range(3.0, 6.0)) as u64;
        }
        if let (true, Fault::LoaderStarvation { extra_ns }) = (faulty, &case.fault) {
            let extra = (*extra_ns as f64 * sim.rng.jitter(0.15)) as u64;
            loader += extra;
            // The workers were runnable but waited for a CPU most of that time.
            let l = sim.sample.role_mut(Role::DataLoader);
            l.runq_ns += extra * 8 / 10;
            l.runq_waits += 4;
        }
        {
            // Healthy background: a little run-queue wait everywhere.
            let bg = (sim.rng.unit() * 30_000.0) as u64;
            sim.sample.role_mut(Role::DataLoader).runq_ns += bg;
            sim.sample.role_mut(Role::Main).runq_ns += bg / 3;
        }
        sim.host += loader;
        // Host contention: preemptions spread over the iteration's launches.
        let launches = ops.len() * spec.kernels_per_op + 1;
        let per_launch_runq = match (faulty, &case.fault) {
            (true, Fault::HostContention { total_ns }) => *total_ns / launches as u64,
            _ => 0,
        };
        // The batch copy.
        let mut copy =
            spec.batch_bytes as f64 / spec.copy_bytes_per_ns * sim.rng.jitter(spec.jitter);
        if let (true, Fault::SlowCopy { factor }) = (faulty, &case.fault) {
            copy *= factor;
        }
        sim.queue_room();
        sim.host_work(spec.launch_cpu_ns, 0);
        let start = sim.gpu.max(sim.host + 4_000);
        sim.gpu = start + copy as u64;
        sim.queue.push_back(sim.gpu);
        sim.corr += 1;
        let m = GpuMemRecord {
            header: RecordHeader::of::<GpuMemRecord>(),
            start_ns: start,
            end_ns: sim.gpu,
            launch_ns: sim.host,
            bytes: spec.batch_bytes,
            graph_node_id: 0,
            correlation_id: sim.corr,
            device_id: 0,
            stream_id: 7,
            graph_id: 0,
            kind: 1,
            op_id: 0,
            launch_tid: 100,
            flags: 0,
        };
        sim.push(&m);
        let mut ar = spec.allreduce_ns as f64 * sim.rng.jitter(spec.jitter);
        if let (
            true,
            Fault::CommJitter {
                extra_ns,
                retransmits,
            },
        ) = (faulty, &case.fault)
        {
            ar += *extra_ns as f64 * sim.rng.range(0.3, 1.7);
            let n = (*retransmits as f64 * sim.rng.range(0.5, 1.5)) as u64;
            sim.sample.role_mut(Role::Communication).retransmits += n;
            sim.sample.conns[0].retransmits += n;
        } else if sim.rng.unit() < 0.5 * estimate_iteration_ns(spec) as f64 / 1e9 {
            // About one burst every two seconds.
            let n = 1 + sim.rng.below(3) as u64;
            sim.sample.role_mut(Role::Communication).retransmits += n;
            sim.sample.conns[0].retransmits += n;
        }
        for (i, weight) in weights.iter().enumerate() {
            let mut factor = *weight;
            let (mut block, mut regs) = (256, 32);
            if let (true, Some((op, f))) = (faulty, case.secondary) {
                if op == i {
                    factor *= f;
                }
            }
            if faulty {
                match &case.fault {
                    Fault::SlowKernel { op, factor: f } if *op == i => factor *= *f,
                    Fault::LowOccupancy { op, factor: f } if *op == i => {
                        factor *= *f;
                        (block, regs) = (512, 96);
                    }
                    Fault::LaunchGap { op, gap_ns } if *op == i => {
                        // Synchronise, then work on the host.
                        sim.host = sim.host.max(sim.gpu).max(sim.comm);
                        sim.queue.clear();
                        let g = (*gap_ns as f64 * sim.rng.jitter(0.1)) as u64;
                        sim.host_work(g, 0);
                    }
                    _ => {}
                }
            }
            for k in 0..spec.kernels_per_op {
                let dur = (spec.kernel_ns as f64 * sim.rng.jitter(spec.jitter) * factor) as u64;
                let runq = if per_launch_runq > 0 {
                    (per_launch_runq as f64 * sim.rng.range(0.0, 2.0)) as u64
                } else {
                    0
                };
                sim.kernel(
                    1000 + (i * 16 + k) as u32,
                    100 + i as u32,
                    dur,
                    block,
                    regs,
                    7,
                    runq,
                    i == ops.len() - 1,
                );
            }
            if i == allreduce_after {
                sim.kernel(
                    ALLREDUCE_NAME_ID,
                    0,
                    ar as u64,
                    512,
                    64,
                    COMM_STREAM,
                    0,
                    false,
                );
            }
        }
        // The step ends with the loss read back (a sync) every `sync_every` steps, then the
        // loop's own work; in between, the CPU runs ahead.
        if (step + 1) % spec.sync_every.max(1) == 0 {
            sim.host = sim.host.max(sim.gpu).max(sim.comm);
            sim.queue.clear();
        }
        sim.push(&StepRecord {
            header: RecordHeader::of::<StepRecord>(),
            step,
            ts_ns: sim.host,
            tid: 100,
            phase: STEP_END,
        });
        let mut between = spec.between_ns;
        if sim.rng.unit() < spec.hiccup_rate {
            // A pause of the host's own (garbage collection): its length does not depend on
            // how long the step waited for the GPU.
            between += (spec.hiccup_size * estimate_iteration_ns(spec) as f64) as u64;
        }
        sim.host += between;
        step += 1;
    }
    sim.sample_until(sim.host + HOST_PERIOD);
    sim.out.iterations = step;
    sim.out
}

/// What the engine made of one case.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The case's kind.
    pub kind: &'static str,
    /// Its seed.
    pub seed: u64,
    /// What attribution should find.
    pub truth: Option<Truth>,
    /// Violations opened before the fault's onset (false alarms).
    pub early: usize,
    /// Their nodes and chains.
    pub early_chains: Vec<String>,
    /// Violations opened at or after the onset.
    pub after: usize,
    /// The top cause of the first violation after the onset that has an attribution.
    pub top: Option<(String, Dimension)>,
    /// Its causal chain.
    pub chain: String,
    /// From the onset to that violation, ns.
    pub latency_ns: Option<u64>,
    /// Its causes' sum over the change of the mean iteration between the windows they were
    /// measured over (1.0: the causes account for the whole change).
    pub sum_ratio: Option<f64>,
    /// Kernel records and iterations generated.
    pub kernels: u64,
    /// Iterations.
    pub iterations: u64,
}

impl Outcome {
    /// Whether the causes add up to the iteration change within ±25% (the sum bar).
    pub fn summed(&self) -> bool {
        self.sum_ratio.is_some_and(|x| (0.75..=1.25).contains(&x))
    }

    /// Whether the top cause names the injected operator and dimension (faulty cases), or no
    /// violation opened at all (healthy ones).
    pub fn correct(&self) -> bool {
        match &self.truth {
            None => self.early == 0 && self.after == 0,
            Some(t) => {
                self.early == 0
                    && self
                        .top
                        .as_ref()
                        .is_some_and(|(op, d)| *op == t.op && *d == t.dimension)
            }
        }
    }
}

/// The engine settings the known-answer cases run with: 1 s windows (a case lasts 20 s),
/// everything else as the defaults.
pub fn test_spec() -> SloSpec {
    SloSpec {
        window_ms: 1000,
        learn_windows: 5,
        ..SloSpec::default()
    }
}

/// How long after an iteration's end the simulated agent waits for its records, ns (the
/// shim's flush period, with room for the GPU running behind the host).
pub const SIM_SETTLE_NS: u64 = 1_000_000_000;

/// Feeds `trace` to a live pipeline the way the agent would: each record once it exists
/// ([`record_time`]), a host sample every 100 ms, time advancing with the host samples; the
/// H200's SM limits; then finishes it.
pub fn drive(trace: &Trace, spec: &SloSpec) -> ProcessPipeline {
    let mut p = pipeline(spec);
    crate::pipeline::drive(&mut p, time_ordered(trace), &trace.host, None);
    p
}

/// A live pipeline as [`drive`] sets it up.
fn pipeline(spec: &SloSpec) -> ProcessPipeline {
    let settings = PipelineSettings {
        slo: spec.clone(),
        windows: Windows::Fixed,
        settle_ns: SIM_SETTLE_NS,
        lag_ns: SIM_SETTLE_NS + HOST_PERIOD,
        keep_iterations: Some(crate::pipeline::KEEP_ITERATIONS),
        limits: SmLimits::for_capability(9, 0),
        ignore_markers: false,
    };
    ProcessPipeline::new(1, settings).expect("valid spec")
}

/// `trace`'s records in the order the agent has them ([`record_time`]).
fn time_ordered(trace: &Trace) -> Vec<(u64, AnyRecord<'_>)> {
    let mut records: Vec<(u64, AnyRecord<'_>)> = RecordIter::new(&trace.records)
        .flatten()
        .map(|r| (record_time(&r), r))
        .collect();
    records.sort_by_key(|(at, _)| *at);
    records
}

/// `trace` as the shim's always-on tier records it: kernels only in sample windows of `window`
/// steps every `period` steps (depth 1, [`DEPTH_REASON_SAMPLE`]) and in the host-time spans in
/// `raised` (depth 1 at the agent's request), timing in between (step markers, copies; depth
/// 0), with the depth records that say so. Kernels count as traced when they were launched at
/// depth 1, as the shim's launch callbacks and activity switch have it.
pub fn sampled(trace: &Trace, period: u64, window: u64, raised: &[(u64, u64)]) -> Trace {
    let period = period.max(1);
    // The host-time spans at kernel depth: a sample window runs from its first step's begin to
    // the begin of the step after its last; merged with the agent's.
    let mut spans: Vec<(u64, u64)> = raised.to_vec();
    // The shim holds kernel tracing on, and does not sample, while the GPU runs far behind
    // the launches (switching under a deep queue strands the records): more than 5 ms or half
    // a step (`hold_lag_ns`), here the median over the job's first 2 s.
    let mut lags: Vec<u64> = Vec::new();
    let mut begins: Vec<(u64, u64)> = Vec::new(); // (step, begin)
    for r in RecordIter::new(&trace.records).flatten() {
        match r {
            AnyRecord::GpuKernel(k) if k.launch_ns < T0 + HOLD_AT_START_NS => {
                lags.push(k.end_ns.saturating_sub(k.launch_ns));
            }
            AnyRecord::Step(st) if st.phase == STEP_BEGIN => begins.push((st.step, st.ts_ns)),
            _ => {}
        }
    }
    lags.sort_unstable();
    let lag = lags.get(lags.len() / 2).copied().unwrap_or(0);
    let early: Vec<u64> = begins
        .iter()
        .map(|b| b.1)
        .take_while(|&t| t < T0 + HOLD_AT_START_NS)
        .collect();
    let step = match early.as_slice() {
        [a, .., b] => (b - a) / (early.len() as u64 - 1),
        _ => 0,
    };
    let held = lag > (5 * 1_000_000u64).max(step / 2);
    let mut open: Option<u64> = held.then_some(T0);
    for &(n, ts) in begins.iter().filter(|_| !held) {
        match (n % period < window, open) {
            (true, None) => open = Some(ts),
            (false, Some(from)) => {
                spans.push((from, ts + SHIM_MIN_DRAIN_NS));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(from) = open {
        spans.push((from, u64::MAX));
    }
    // The shim holds kernel tracing from the start until its first cost check (2 s) shows
    // a shallow queue (`SLO_PROBE_HOLD_AT_START`).
    spans.push((T0, T0 + HOLD_AT_START_NS));
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (b, e) in spans {
        match merged.last_mut() {
            Some(last) if b <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((b, e)),
        }
    }
    let inside = |t: u64| {
        let at = merged.partition_point(|sp| sp.0 <= t);
        at > 0 && t < merged[at - 1].1
    };
    let depth = |from_ns: u64, depth: u32, reason: u32| DepthRecord {
        header: RecordHeader::of::<DepthRecord>(),
        from_ns,
        depth,
        reason,
    };
    let mut out = Trace {
        records: Vec::with_capacity(trace.records.len()),
        host: trace.host.clone(),
        kernels: 0,
        iterations: trace.iterations,
    };
    let mut rest = &trace.records[..];
    while !rest.is_empty() {
        let Ok((r, used)) = decode(rest) else { break };
        let (bytes, tail) = rest.split_at(used);
        rest = tail;
        if let AnyRecord::GpuKernel(k) = r {
            if !inside(k.launch_ns) {
                continue;
            }
            out.kernels += 1;
        }
        out.records.extend_from_slice(bytes);
    }
    // The depth records (the pipeline takes records in time order, these at their start).
    out.records
        .extend_from_slice(depth(T0 - 1, DEPTH_TIMING, DEPTH_REASON_DEFAULT).as_bytes());
    for (b, e) in merged {
        out.records
            .extend_from_slice(depth(b, DEPTH_KERNELS, DEPTH_REASON_SAMPLE).as_bytes());
        if e != u64::MAX {
            out.records
                .extend_from_slice(depth(e, DEPTH_TIMING, DEPTH_REASON_SAMPLE).as_bytes());
        }
    }
    out
}

/// [`judge`]s `case` as the live agent and shim would see it with sampling on and the loop
/// closed: kernels in sample windows ([`sampled`]), and at kernel depth from the moment the
/// pipeline wants it ([`ProcessPipeline::wanted_depth`], at the agent's tick) until it no
/// longer does. The job does not depend on the depth, so the loop is run by replaying: each
/// pass replays with the depth requests found so far, up to the first tick whose request
/// differs from them (everything before that tick is the same in the next pass).
pub fn judge_closed_loop(
    case: &Case,
    full: &Trace,
    spec: &SloSpec,
    period: u64,
    window: u64,
) -> Outcome {
    let mut raised: Vec<(u64, u64)> = Vec::new();
    for _ in 0..MAX_DEPTH_SWITCHES {
        let trace = sampled(full, period, window, &raised);
        let mut p = pipeline(spec);
        let mut change: Option<(u64, bool)> = None;
        let asked = |t: u64| raised.iter().any(|&(b, e)| b <= t && t < e);
        crate::pipeline::drive_ticks(&mut p, time_ordered(&trace), &trace.host, None, |p, now| {
            let want = p.wanted_depth() >= DEPTH_KERNELS;
            if change.is_none() && want != asked(now) {
                change = Some((now, want));
            }
        });
        match change {
            None => return outcome(case, &trace, &p),
            Some((t, true)) => raised.push((t, u64::MAX)),
            Some((t, false)) => {
                if let Some(last) = raised.last_mut() {
                    last.1 = t;
                }
            }
        }
    }
    judge(case, &sampled(full, period, window, &raised), spec)
}

/// How long the shim holds kernel tracing from the start of a launch-bound job (its first cost
/// check), ns.
const HOLD_AT_START_NS: u64 = 2_000_000_000;

/// Depth changes the closed loop follows at most (then it keeps what it has).
const MAX_DEPTH_SWITCHES: usize = 12;

/// Generates `case`, drives its records and host samples through the agent's pipeline
/// ([`drive`]), and reports what the SLO engine found.
pub fn run_case(case: &Case, spec: &SloSpec) -> Outcome {
    judge(case, &generate(case), spec)
}

/// Drives `trace` (generated from `case`, perhaps [`sampled`]) through the agent's pipeline and
/// reports what the SLO engine found.
pub fn judge(case: &Case, trace: &Trace, spec: &SloSpec) -> Outcome {
    outcome(case, trace, &drive(trace, spec))
}

/// What the SLO engine of `pipeline`, driven with `trace` (from `case`), found.
fn outcome(case: &Case, trace: &Trace, pipeline: &ProcessPipeline) -> Outcome {
    let engine = pipeline
        .engine()
        .expect("a fixed-window pipeline has an engine");
    let onset = T0 + case.onset_ns;
    let vs = engine.violations();
    let first = vs
        .iter()
        .filter(|v| v.opened_ns >= onset && v.attribution.is_some())
        .min_by_key(|v| v.opened_ns);
    Outcome {
        kind: case.kind,
        seed: case.seed,
        truth: case.truth(),
        early: vs.iter().filter(|v| v.opened_ns < onset).count(),
        early_chains: vs
            .iter()
            .filter(|v| v.opened_ns < onset)
            .map(|v| v.chain.clone())
            .collect(),
        after: vs.iter().filter(|v| v.opened_ns >= onset).count(),
        top: first
            .and_then(|v| v.attribution.as_ref())
            .and_then(|a| a.top())
            .map(|c| (c.op.clone(), c.dimension)),
        chain: first.map(|v| v.chain.clone()).unwrap_or_default(),
        latency_ns: first.map(|v| v.opened_ns - onset),
        sum_ratio: first
            .and_then(|v| v.attribution.as_ref())
            .and_then(|a| a.sum_ratio()),
        kernels: trace.kernels,
        iterations: trace.iterations,
    }
}

/// Runs `cases` and sums up: per kind, cases and correct ones.
pub fn known_answer(cases: &[Case], spec: &SloSpec) -> Vec<Outcome> {
    cases.iter().map(|c| run_case(c, spec)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assemble(t: &Trace) -> Vec<crate::gputrace::Iteration> {
        let mut asm = crate::gputrace::TraceAssembler::new();
        for r in RecordIter::new(&t.records) {
            asm.push(&r.expect("decodes"));
        }
        asm.take_iterations(0, 0, true)
    }

    #[test]
    fn a_generated_job_decodes_into_its_iterations() {
        let c = case("healthy", 7);
        let t = generate(&c);
        let its = assemble(&t);
        assert_eq!(its.len() as u64, t.iterations);
        let per = c.spec.compute_ops().len() * c.spec.kernels_per_op + 1;
        assert!(its
            .iter()
            .all(|i| i.kernels as usize == per && i.memory_ops == 1));
        assert!(its.iter().all(|i| i.comm_kernels == 1 && i.comm_ns > 0));
        let est = estimate_iteration_ns(&c.spec) as f64;
        let wall = its[10].step_ns() as f64;
        assert!((wall / est - 1.0).abs() < 0.25, "{wall} vs {est}");
        // Host samples every 100 ms over the whole job.
        assert!(t.host.len() as u64 >= CASE_NS / HOST_PERIOD);
        assert!(t
            .host
            .windows(2)
            .all(|w| w[1].at_ns - w[0].at_ns == HOST_PERIOD));
    }

    #[test]
    fn the_same_seed_gives_the_same_trace() {
        let a = generate(&case("comm_jitter", 42));
        let b = generate(&case("comm_jitter", 42));
        assert_eq!(a.records, b.records);
        assert_eq!(a.host, b.host);
        assert_ne!(a.records, generate(&case("comm_jitter", 43)).records);
    }

    #[test]
    fn faults_slow_the_job_down_after_the_onset() {
        for kind in &KINDS[1..] {
            let c = case(kind, 3);
            let its = assemble(&generate(&c));
            let mean = |f: &dyn Fn(&&crate::gputrace::Iteration) -> bool| {
                let v: Vec<f64> = its.iter().filter(f).map(|i| i.step_ns() as f64).collect();
                v.iter().sum::<f64>() / v.len() as f64
            };
            let onset = T0 + c.onset_ns;
            let before = mean(&|i| i.end_ns < onset && i.start_ns > T0 + 1_000_000_000);
            let after = mean(&|i| i.start_ns > onset);
            assert!(after > before * 1.1, "{kind}: {before} -> {after}");
        }
    }

    #[test]
    fn cases_cover_every_kind_and_are_distinct() {
        let cs = cases(3, 1);
        assert_eq!(cs.len(), 3 * KINDS.len());
        for k in KINDS {
            assert_eq!(cs.iter().filter(|c| c.kind == k).count(), 3);
        }
        assert!(cs
            .iter()
            .filter(|c| c.kind == "healthy")
            .all(|c| c.truth().is_none()));
        assert!(cs
            .iter()
            .filter(|c| c.kind != "healthy")
            .all(|c| c.truth().is_some()));
    }

    /// The known-answer suite: 30 cases of each fault kind and 30 healthy jobs (240 cases,
    /// seeded): top-1 attribution names the injected operator and dimension in at least 95%
    /// of the faulty cases, and no healthy job raises a violation.
    #[test]
    fn known_answer_suite() {
        let cases = cases(30, 2026);
        let outcomes = known_answer(&cases, &test_spec());
        let mut lines = Vec::new();
        for kind in KINDS {
            let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.kind == kind).collect();
            let ok = of.iter().filter(|o| o.correct()).count();
            lines.push(format!("{kind}: {ok}/{}", of.len()));
            for o in of.iter().filter(|o| !o.correct()) {
                eprintln!(
                    "wrong: {kind} seed {}: truth {:?}, top {:?}, early {}, after {}\n  {}\n  early: {:?}",
                    o.seed, o.truth, o.top, o.early, o.after, o.chain, o.early_chains
                );
            }
        }
        let faulty: Vec<&Outcome> = outcomes.iter().filter(|o| o.truth.is_some()).collect();
        let healthy: Vec<&Outcome> = outcomes.iter().filter(|o| o.truth.is_none()).collect();
        let correct = faulty.iter().filter(|o| o.correct()).count();
        let mut by_kind: Vec<String> = Vec::new();
        for kind in KINDS {
            let r: Vec<f64> = faulty
                .iter()
                .filter(|o| o.kind == kind)
                .filter_map(|o| o.sum_ratio)
                .collect();
            if r.is_empty() {
                continue;
            }
            let ok = r.iter().filter(|x| (0.75..=1.25).contains(*x)).count();
            let (lo, hi) = r
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            by_kind.push(format!("{kind}: {ok}/{} [{lo:.2}, {hi:.2}]", r.len()));
        }
        eprintln!("sums within ±25%: {}", by_kind.join(", "));
        for o in faulty.iter().filter(|o| !o.summed()) {
            eprintln!(
                "sum off: {} seed {}: {:?} of the change\n  {}",
                o.kind, o.seed, o.sum_ratio, o.chain
            );
        }
        let sums_ok = faulty.iter().filter(|o| o.summed()).count();
        let late: Vec<String> = faulty
            .iter()
            .filter(|o| o.latency_ns.is_none_or(|l| l > 5_000_000_000))
            .map(|o| format!("{} seed {}: {:?}", o.kind, o.seed, o.latency_ns))
            .collect();
        let slowest = faulty
            .iter()
            .filter_map(|o| o.latency_ns)
            .max()
            .unwrap_or(0);
        eprintln!(
            "detected within 5 s of the onset: {}/{} (slowest {:.1} s){}",
            faulty.len() - late.len(),
            faulty.len(),
            slowest as f64 / 1e9,
            if late.is_empty() {
                String::new()
            } else {
                format!("; late: {}", late.join(", "))
            }
        );
        let alarms = healthy.iter().filter(|o| !o.correct()).count();
        eprintln!(
            "known answers: {correct}/{} faulty cases top-1 correct ({:.1}%), {alarms}/{} healthy \
             jobs with a violation; by kind: {}",
            faulty.len(),
            100.0 * correct as f64 / faulty.len() as f64,
            healthy.len(),
            lines.join(", ")
        );
        assert!(faulty.len() + healthy.len() >= 200);
        assert!(
            correct * 100 >= faulty.len() * 95,
            "{correct}/{}",
            faulty.len()
        );
        assert_eq!(alarms, 0);
        // The causes add up to the iteration change over the windows they were measured over,
        // within ±25% (a collective grown over the backward kernels it overlaps had 1.3–2.2×).
        assert!(
            sums_ok * 100 >= faulty.len() * 95,
            "sums within ±25%: {sums_ok}/{}",
            faulty.len()
        );
        // The detection bar: every fault within 5 s of its onset.
        assert!(late.is_empty(), "detected late: {}", late.join(", "));
    }

    #[test]
    fn sampled_known_answer_suite() {
        // The always-on tier: kernels in sample windows only (here 5 steps of every 20, and
        // held on where the GPU runs far behind), the rest timed by markers and copies, kernel
        // depth when the pipeline asks for it (the loop closed, as the live agent does).
        let cases = cases(10, 2026);
        let spec = test_spec();
        let outcomes: Vec<Outcome> = cases
            .iter()
            .map(|c| judge_closed_loop(c, &generate(c), &spec, 20, 5))
            .collect();
        let mut lines = Vec::new();
        for kind in KINDS {
            let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.kind == kind).collect();
            let ok = of.iter().filter(|o| o.correct()).count();
            let summed = of.iter().filter(|o| o.summed()).count();
            lines.push(format!("{kind}: {ok}/{} (sums {summed})", of.len()));
            for o in of.iter().filter(|o| !o.correct()) {
                eprintln!(
                    "wrong: {kind} seed {}: truth {:?}, top {:?}, early {}, after {}\n  {}\n  early: {:?}",
                    o.seed, o.truth, o.top, o.early, o.after, o.chain, o.early_chains
                );
            }
        }
        eprintln!("sampled known answers: {}", lines.join(", "));
        let faulty: Vec<&Outcome> = outcomes.iter().filter(|o| o.truth.is_some()).collect();
        let correct = faulty.iter().filter(|o| o.correct()).count();
        let summed = faulty.iter().filter(|o| o.summed()).count();
        let alarms = outcomes
            .iter()
            .filter(|o| o.truth.is_none() && !o.correct())
            .count();
        let late = faulty
            .iter()
            .filter(|o| o.latency_ns.is_none_or(|l| l > 5_000_000_000))
            .count();
        eprintln!(
            "sampled: top-1 {correct}/{n}, sums within ±25% {summed}/{n}, detected late {late}, \
             healthy alarms {alarms}",
            n = faulty.len()
        );
        // Floors at what main reaches (2026-12-05: 70/70, 67/70, 0 late, 0 alarms; before the
        // GPU idle ahead of an iteration after an untraced one was left out, 69/70 and 57/70,
        // the host contention's sums 6/10; without the shim's least drain after a window
        // 59/70 and 56/70).
        assert!(correct >= 70, "top-1 {correct}/{}", faulty.len());
        assert!(summed >= 66, "sums within ±25% {summed}/{}", faulty.len());
        assert_eq!((late, alarms), (0, 0));
    }

    #[test]
    fn one_case_of_each_kind_is_found() {
        for kind in KINDS {
            let o = run_case(&case(kind, 11), &test_spec());
            eprintln!(
                "{kind}: truth {:?} top {:?} early {} after {} latency {:?}\n  {}",
                o.truth, o.top, o.early, o.after, o.latency_ns, o.chain
            );
        }
    }
}
