//! The wire types of the state API, version 1 (`/api/v1/...`), in one place: the agent's server,
//! `slo-probe top` and `slo-probe run` all use these. JSON through serde.
//!
//! Compatibility: every struct takes `#[serde(default)]` and none denies unknown fields, so a
//! client reads a newer agent's answers (new fields are ignored, missing ones take their
//! default), and every enum has an `unknown` variant that a value it does not know becomes.
//! A change that breaks this (renaming or retyping a field) makes a `/api/v2` with
//! [`VERSION`] 2; the `version` field of every document says which one it is.
//!
//! `GET /api/v1/watch` sends NDJSON: one [`WatchEvent`] per line, `{"type":"full",...}` (a whole
//! [`Snapshot`]) first, then `{"type":"delta",...}` each tick (a [`Delta`]: the top-level
//! sections that changed, whole; the unchanged ones absent).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The API version these types describe.
pub const VERSION: u32 = 1;

/// Everything the agent knows at one tick, as `GET /api/v1/snapshot` returns it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// [`VERSION`].
    pub version: u32,
    /// The node's host name.
    pub node: String,
    /// CLOCK_MONOTONIC ns of the tick on the agent's node.
    pub taken_at_ns: u64,
    /// The agent itself: build, cost, probes.
    pub agent: Agent,
    /// Training processes (those with a CUPTI shim), by job, rank and pid.
    pub processes: Vec<Process>,
    /// Jobs with at least one rank on this node, with their ranks' straggler scores.
    pub jobs: Vec<Job>,
    /// The host: the followed threads by role, their cgroups.
    pub host: Host,
    /// GPUs from NVML (empty without a driver).
    pub gpus: Vec<Gpu>,
    /// The healer's state and timeline (absent where no healer runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healer: Option<Healer>,
}

/// The agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Agent {
    /// slo-probe version.
    pub version: String,
    /// Collection ticks since start.
    pub ticks: u64,
    /// CPU time the agent used since start, s.
    pub cpu_seconds: f64,
    /// Its resident memory, bytes.
    pub resident_bytes: u64,
    /// Probe families and their state.
    pub probes: Vec<Probe>,
    /// The socket CUPTI shims register on (`SLO_PROBE_SOCKET`), when listening.
    pub shim_socket: Option<String>,
    /// Whether the write endpoints are on (`[api] allow_writes`).
    pub writes_allowed: bool,
}

/// One probe family.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Probe {
    /// `runqueue`, `tcp`, `process`, `cgroup`, `pressure`, `nvml`, `shim`.
    pub name: String,
    /// Attached and reporting.
    pub up: bool,
    /// Why it is down (empty when up).
    pub reason: String,
}

/// One training process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Process {
    /// Process id.
    pub pid: u32,
    /// Its name, where the scheduling probes saw it (empty otherwise).
    pub name: String,
    /// Its rank in the job (`RANK`, ...), when known.
    pub rank: Option<u32>,
    /// Its job (`SLO_PROBE_JOB`, `TORCHELASTIC_RUN_ID`, ...), when known.
    pub job_id: Option<String>,
    /// Its shim is connected now.
    pub connected: bool,
    /// The shim: tracing depth and counters.
    pub shim: Shim,
    /// Its iterations.
    pub iterations: Iterations,
    /// Its SLO tree as of the last closed window (absent before the first iteration).
    pub slo: Option<Slo>,
    /// Open violations, then the most recent closed ones.
    pub violations: Vec<Violation>,
    /// Operators by GPU time over the recent iterations, largest first (at most
    /// [`MAX_OPERATORS`]).
    pub operators: Vec<Operator>,
    /// Its threads and those of its descendant processes (data-loader workers) by role.
    pub host: Vec<RoleStats>,
}

/// Operators listed per process.
pub const MAX_OPERATORS: usize = 10;
/// Recent iteration wall times listed per process.
pub const RECENT_ITERATIONS: usize = 64;

/// What the shim traces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Depth {
    /// Not tracing (CUPTI taken by another tool, handed over, or not initialised).
    Off,
    /// Kernels, memory operations and graph launches.
    Kernels,
    /// Graph nodes too (diagnostic depth, raised on demand).
    GraphNodes,
    /// A depth this client does not know.
    #[default]
    #[serde(other)]
    Unknown,
}

/// A shim's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Shim {
    /// Tracing depth now.
    pub depth: Depth,
    /// CUPTI version (0: not tracing).
    pub cupti_version: u32,
    /// Another CUPTI subscriber was first: the shim does not trace.
    pub lost_race: bool,
    /// CUPTI was handed to another tool (`slo_probe.cupti_released()`).
    pub released: bool,
    /// Records consumed.
    pub records: u64,
    /// Records the shim dropped (ring full).
    pub dropped: u64,
    /// Records CUPTI dropped.
    pub cupti_dropped: u64,
    /// Records that did not decode.
    pub decode_failed: u64,
}

/// Where iteration boundaries come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IterationSource {
    /// No iteration yet.
    None,
    /// Step markers of the python client.
    Markers,
    /// Detected from the period of copies, fills and graph launches (or of the kernels).
    Detected,
    /// A source this client does not know.
    #[default]
    #[serde(other)]
    Unknown,
}

/// A process's iterations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Iterations {
    /// Completed since the shim registered.
    pub total: u64,
    /// Kept in the agent's recent window (the quantiles below are over these).
    pub recent: u64,
    /// Where their boundaries come from.
    pub source: IterationSource,
    /// Iterations detected before the process's step markers began (its warm-up, under
    /// another clock), left out of `total` and of the SLO tree.
    pub before_markers: u64,
    /// Step number of the last one.
    pub last_step: Option<u64>,
    /// Wall time P50, ns.
    pub wall_p50_ns: Option<u64>,
    /// Wall time P99, ns.
    pub wall_p99_ns: Option<u64>,
    /// GPU busy share of the wall time, median over the iterations, 0..1.
    pub gpu_busy_p50: Option<f64>,
    /// Wall times of the last iterations, oldest first (at most [`RECENT_ITERATIONS`]).
    pub recent_wall_ns: Vec<u64>,
}

/// A process's SLO tree.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Slo {
    /// The SLO score: the root's weighted compliance, 0..1.
    pub score: Option<f64>,
    /// The root's state.
    pub state: State,
    /// Baselines are still being learned.
    pub learning: bool,
    /// Windows closed.
    pub windows: u64,
    /// Window length, ns.
    pub window_ns: u64,
    /// Iterations judged.
    pub iterations: u64,
    /// Root first, then the nodes in the spec's order (children after their parent).
    pub nodes: Vec<SloNode>,
}

/// A node's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Within the threshold.
    Ok,
    /// The last window breached; not (yet) a violation.
    Breaching,
    /// A violation is open (warning).
    Warning,
    /// A violation is open (critical: 1.5× past the threshold).
    Critical,
    /// No window judged yet, or a state this client does not know.
    #[default]
    #[serde(other)]
    Unknown,
}

impl State {
    /// The wire name (`ok`, `breaching`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Breaching => "breaching",
            Self::Warning => "warning",
            Self::Critical => "critical",
            Self::Unknown => "unknown",
        }
    }
}

/// Whether a value is good below or above its threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// Good below.
    Below,
    /// Good above.
    Above,
    /// None (the root), or one this client does not know.
    #[default]
    #[serde(other)]
    Unknown,
}

/// One node of an SLO tree.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SloNode {
    /// Name (`job` for the root).
    pub name: String,
    /// Parent (`job` for top-level nodes; empty for the root).
    pub parent: String,
    /// Metric (`iteration_time`, ...; empty for the root).
    pub metric: String,
    /// Statistic (`p99`, ...).
    pub stat: String,
    /// Objective.
    pub objective: Objective,
    /// Unit of the value and threshold.
    pub unit: String,
    /// Weight in the parent's score.
    pub weight: f64,
    /// The last judged window's value.
    pub value: Option<f64>,
    /// Threshold in force.
    pub threshold: Option<f64>,
    /// Where the threshold comes from (`config`, `baseline`).
    pub threshold_source: Option<String>,
    /// Learned baseline.
    pub baseline: Option<f64>,
    /// Share of judged windows that met the threshold, 0..1.
    pub compliance: Option<f64>,
    /// Error-budget burn rate (1: on budget).
    pub burn_rate: Option<f64>,
    /// State.
    pub state: State,
    /// Windows judged.
    pub windows: u64,
    /// Violations opened so far.
    pub violations: u64,
    /// A P99 whose value is past its threshold in a window judged within it: too few of the
    /// window's iterations were over the threshold for a P99 breach (a 1% tail gives that
    /// many by chance).
    pub past_by_chance: bool,
}

/// Severity of a violation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    /// Past the threshold.
    Warning,
    /// 1.5× past it.
    Critical,
    /// One this client does not know.
    #[default]
    #[serde(other)]
    Unknown,
}

impl Severity {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warning => "warning",
            Self::Critical => "critical",
            Self::Unknown => "unknown",
        }
    }
}

/// An SLO violation and what caused it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Violation {
    /// Number within its process, from 1.
    pub id: u64,
    /// Its process.
    pub pid: u32,
    /// The node.
    pub node: String,
    /// Severity (the worst while open).
    pub severity: Severity,
    /// Still open.
    pub open: bool,
    /// When the first breaching window started, CLOCK_MONOTONIC ns.
    pub since_ns: u64,
    /// When it opened, ns.
    pub opened_ns: u64,
    /// When it closed, ns.
    pub closed_ns: Option<u64>,
    /// When its attribution first named a cause (the end of that window), ns; None until then.
    pub attributed_ns: Option<u64>,
    /// The last breaching window's value.
    pub value: f64,
    /// The threshold it broke.
    pub threshold: f64,
    /// The baseline, when learned.
    pub baseline: Option<f64>,
    /// The causal chain in words (`iteration p99 +38% … ← op … ← host cause`).
    pub chain: String,
    /// Operators by contribution, largest first.
    pub causes: Vec<Cause>,
    /// Host causes found in the same windows, in words.
    pub host_causes: Vec<String>,
}

/// An operator's part in a violation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Cause {
    /// Operator, or a pseudo-operator (`(data loading)`).
    pub op: String,
    /// Dimension (`compute`, `communication`, `data_loading`, ...).
    pub dimension: String,
    /// Its contribution to the change of the mean iteration, ns per iteration.
    pub delta_ns: f64,
    /// What changed, in words.
    pub detail: String,
}

/// An operator's GPU time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Operator {
    /// Label (`aten::mm`, an Inductor kernel's fused ops, `graph#3`, `memcpy HtoD`).
    pub op: String,
    /// `compute`, `communication`, `memory`, ...
    pub kind: String,
    /// Share of the process's GPU time, 0..1.
    pub share: f64,
    /// GPU time per iteration, ns.
    pub gpu_ns_per_iteration: f64,
    /// Activities (kernels, launches, copies) per iteration.
    pub activities_per_iteration: f64,
    /// GPU-time-weighted theoretical occupancy, 0..1, when known.
    pub occupancy: Option<f64>,
}

/// A job with ranks on this node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Job {
    /// Job id.
    pub id: String,
    /// Its ranks here, by rank.
    pub ranks: Vec<Rank>,
}

/// One rank of a job, with its straggler scores.
///
/// `relative` and `individual` are on the 0..1 scale NVIDIA Resiliency Extension (NVRx) uses:
/// 1 is the best, lower is slower. `relative`: the fastest rank's non-communication time over
/// this rank's; `individual`: this rank's best iteration over its median one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rank {
    /// Rank.
    pub rank: u32,
    /// Its process.
    pub pid: u32,
    /// Its SLO score, 0..1.
    pub score: Option<f64>,
    /// Relative performance score, 0..1 (two or more ranks here).
    pub relative: Option<f64>,
    /// Individual performance score, 0..1.
    pub individual: Option<f64>,
    /// Median iteration minus communication, s.
    pub noncomm_s: Option<f64>,
    /// `noncomm_s` over the median of the other ranks (1: like them).
    pub noncomm_ratio: Option<f64>,
    /// Host delay rate (run-queue waits and throttling), ms per s.
    pub host_delay_ms_per_s: Option<f64>,
    /// Host delay over the median of the other ranks (with a 1 ms/s floor).
    pub host_ratio: Option<f64>,
    /// Named the straggler: its cause (an SLO host node or a GPU phase).
    pub straggler: Option<String>,
}

/// The host side of the followed job (or node).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Host {
    /// Threads by role (empty while the scheduling probes are down).
    pub roles: Vec<RoleStats>,
    /// cgroups holding the job's processes.
    pub cgroups: Vec<Cgroup>,
    /// Run-queue waits above the outlier threshold since start.
    pub outliers: u64,
}

/// Threads of one role, counted since they were first seen.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoleStats {
    /// `main`, `data_loader`, `communication`, `pin_memory`, `other`.
    pub role: String,
    /// Threads in the table now.
    pub threads: u32,
    /// Run-queue waits.
    pub runq_waits: u64,
    /// Time runnable but waiting for a CPU, ns.
    pub runq_ns: u64,
    /// Wait P50, ns (absent when summed over processes).
    pub runq_p50_ns: Option<f64>,
    /// Wait P99, ns (absent when summed over processes).
    pub runq_p99_ns: Option<f64>,
    /// Voluntary off-CPU time (blocked), ns.
    pub offcpu_voluntary_ns: u64,
    /// Involuntary off-CPU time (preempted), ns.
    pub offcpu_involuntary_ns: u64,
    /// TCP bytes sent.
    pub tcp_sent_bytes: u64,
    /// TCP bytes received.
    pub tcp_recv_bytes: u64,
    /// TCP retransmits.
    pub retransmits: u64,
}

/// A cgroup of the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Cgroup {
    /// Path as in `/proc/<pid>/cgroup`.
    pub path: String,
    /// 1 or 2.
    pub version: u8,
    /// CPU limit, CPUs.
    pub limit_cpus: Option<f64>,
    /// Enforcement periods.
    pub nr_periods: Option<u64>,
    /// Periods throttled.
    pub nr_throttled: Option<u64>,
    /// Time throttled, ns.
    pub throttled_ns: Option<u64>,
    /// Roles of the job's threads in it.
    pub roles: Vec<String>,
}

/// One GPU, as NVML (and GPM on Hopper and later) last sampled it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub name: String,
    /// UUID.
    pub uuid: String,
    /// Time a kernel ran, %.
    pub util_percent: Option<f64>,
    /// Time memory was read or written, %.
    pub memory_util_percent: Option<f64>,
    /// Memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Memory in total, bytes.
    pub memory_total_bytes: Option<u64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Power draw, W.
    pub power_watts: Option<f64>,
    /// GPM: SMs with a warp assigned, %.
    pub sm_active_percent: Option<f64>,
    /// GPM: resident warps over the maximum, %.
    pub sm_occupancy_percent: Option<f64>,
    /// GPM: DRAM bandwidth, % of peak.
    pub dram_bw_percent: Option<f64>,
    /// GPM: any tensor-core instruction issued, % of time.
    pub tensor_percent: Option<f64>,
    /// PCIe bytes sent per second.
    pub pcie_tx_bytes_per_sec: Option<f64>,
    /// PCIe bytes received per second.
    pub pcie_rx_bytes_per_sec: Option<f64>,
    /// NVLink bytes sent per second.
    pub nvlink_tx_bytes_per_sec: Option<f64>,
    /// NVLink bytes received per second.
    pub nvlink_rx_bytes_per_sec: Option<f64>,
}

/// The healer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Healer {
    /// `off`, `shadow` (decides, does not act) or `on`.
    pub mode: String,
    /// What it is doing now, in words.
    pub state: String,
    /// Its decisions, actions and verdicts, oldest first.
    pub timeline: Vec<HealerEvent>,
}

/// One entry of the healer's timeline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealerEvent {
    /// CLOCK_MONOTONIC ns.
    pub at_ns: u64,
    /// Action id (what `POST /api/v1/heal/undo` names).
    pub id: u64,
    /// `decided`, `applied`, `verified`, `reverted`, `rejected`, ...
    pub kind: String,
    /// The strategy (`deadline-aware`, ...).
    pub strategy: String,
    /// What it acts on (`pid 1234 main threads`, ...).
    pub target: String,
    /// In words.
    pub detail: String,
}

/// One line of `GET /api/v1/watch`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum WatchEvent {
    /// The whole state (the first line, and after the agent lost track of a client).
    Full(Snapshot),
    /// What changed since the previous line.
    Delta(Delta),
    /// An event type this client does not know: skip it.
    #[serde(other)]
    Unknown,
}

/// The top-level sections of a [`Snapshot`] that changed, whole; absent ones did not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Delta {
    /// [`VERSION`].
    pub version: u32,
    /// The tick's time (every delta has it, so an empty delta is a heartbeat).
    pub taken_at_ns: u64,
    /// The agent section, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
    /// Every process, when one changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<Process>>,
    /// Every job, when one changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs: Option<Vec<Job>>,
    /// The host section, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<Host>,
    /// Every GPU, when one changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<Gpu>>,
    /// The healer, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healer: Option<Healer>,
}

impl Delta {
    /// Whether nothing but the time changed.
    pub fn is_empty(&self) -> bool {
        self.agent.is_none()
            && self.processes.is_none()
            && self.jobs.is_none()
            && self.host.is_none()
            && self.gpus.is_none()
            && self.healer.is_none()
    }
}

impl Snapshot {
    /// What changed from `self` to `next`.
    pub fn delta_to(&self, next: &Snapshot) -> Delta {
        fn changed<T: PartialEq + Clone>(a: &T, b: &T) -> Option<T> {
            (a != b).then(|| b.clone())
        }
        Delta {
            version: VERSION,
            taken_at_ns: next.taken_at_ns,
            agent: changed(&self.agent, &next.agent),
            processes: changed(&self.processes, &next.processes),
            jobs: changed(&self.jobs, &next.jobs),
            host: changed(&self.host, &next.host),
            gpus: changed(&self.gpus, &next.gpus),
            healer: if self.healer != next.healer {
                next.healer.clone()
            } else {
                None
            },
        }
    }

    /// Applies a delta.
    pub fn apply(&mut self, d: Delta) {
        self.taken_at_ns = d.taken_at_ns;
        if let Some(a) = d.agent {
            self.agent = a;
        }
        if let Some(p) = d.processes {
            self.processes = p;
        }
        if let Some(j) = d.jobs {
            self.jobs = j;
        }
        if let Some(h) = d.host {
            self.host = h;
        }
        if let Some(g) = d.gpus {
            self.gpus = g;
        }
        if let Some(h) = d.healer {
            self.healer = Some(h);
        }
    }

    /// Keeps the processes in `pids` only (a job's part of a node-wide agent's answer): their
    /// jobs' ranks, the healer's timeline entries about them (`target` is `pid N`), and the host
    /// by role summed over what is left (quantiles cannot be summed, so they are absent there).
    pub fn retain_pids(&mut self, pids: &BTreeSet<u32>) {
        self.processes.retain(|p| pids.contains(&p.pid));
        if let Some(h) = &mut self.healer {
            h.timeline.retain(|e| {
                e.target
                    .strip_prefix("pid ")
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_none_or(|p| pids.contains(&p))
            });
        }
        for j in &mut self.jobs {
            j.ranks.retain(|r| pids.contains(&r.pid));
        }
        self.jobs.retain(|j| !j.ranks.is_empty());
        let mut roles: Vec<RoleStats> = Vec::new();
        for r in self.processes.iter().flat_map(|p| &p.host) {
            match roles.iter_mut().find(|x| x.role == r.role) {
                Some(x) => x.add(r),
                None => {
                    let mut x = r.clone();
                    x.runq_p50_ns = None;
                    x.runq_p99_ns = None;
                    roles.push(x);
                }
            }
        }
        self.host.roles = roles;
        self.host.cgroups.clear();
    }

    /// Open violations of every process, worst first.
    pub fn open_violations(&self) -> Vec<&Violation> {
        let mut v: Vec<&Violation> = self
            .processes
            .iter()
            .flat_map(|p| &p.violations)
            .filter(|v| v.open)
            .collect();
        v.sort_by_key(|v| (v.severity != Severity::Critical, v.pid, v.id));
        v
    }
}

impl RoleStats {
    /// Adds another group's counts (threads, waits, bytes; quantiles become absent).
    pub fn add(&mut self, o: &RoleStats) {
        self.threads += o.threads;
        self.runq_waits += o.runq_waits;
        self.runq_ns += o.runq_ns;
        self.runq_p50_ns = None;
        self.runq_p99_ns = None;
        self.offcpu_voluntary_ns += o.offcpu_voluntary_ns;
        self.offcpu_involuntary_ns += o.offcpu_involuntary_ns;
        self.tcp_sent_bytes += o.tcp_sent_bytes;
        self.tcp_recv_bytes += o.tcp_recv_bytes;
        self.retransmits += o.retransmits;
    }
}

/// `POST /api/v1/diagnostic`: raise a process's tracing depth to graph nodes for a while.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiagnosticRequest {
    /// The process; absent: every connected shim.
    pub pid: Option<u32>,
    /// For this many iterations; 0: the agent's default ([`DEFAULT_DIAGNOSTIC_STEPS`]).
    pub steps: u32,
}

/// Iterations of node-level tracing a diagnostic request without `steps` asks for.
pub const DEFAULT_DIAGNOSTIC_STEPS: u32 = 50;

/// `POST /api/v1/heal/undo`: revert a healer action.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UndoRequest {
    /// The action ([`HealerEvent::id`]); absent: the latest one still in force.
    pub action: Option<u64>,
    /// The job ([`HealerEvent::target`]'s pid): action ids count per job, so an id in force
    /// in several jobs needs it; absent: any job.
    pub job: Option<u32>,
}

/// The answer of a write endpoint, and of every error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Reply {
    /// [`VERSION`].
    pub version: u32,
    /// Whether the request was carried out.
    pub ok: bool,
    /// What happened, or what to do.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, p99: u64) -> Process {
        Process {
            pid,
            iterations: Iterations {
                wall_p99_ns: Some(p99),
                ..Default::default()
            },
            host: vec![RoleStats {
                role: "main".into(),
                threads: 1,
                runq_waits: 3,
                runq_p50_ns: Some(1.0),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn delta_carries_changed_sections_and_applies_back() {
        let a = Snapshot {
            version: VERSION,
            taken_at_ns: 1,
            processes: vec![process(1, 10)],
            ..Default::default()
        };
        let mut b = a.clone();
        b.taken_at_ns = 2;
        let d = a.delta_to(&b);
        assert!(d.is_empty());
        assert_eq!(d.taken_at_ns, 2);
        b.processes[0].iterations.wall_p99_ns = Some(20);
        let d = a.delta_to(&b);
        assert!(d.processes.is_some() && d.gpus.is_none() && d.agent.is_none());
        let mut c = a.clone();
        c.apply(d);
        assert_eq!(c, b);
    }

    #[test]
    fn watch_lines_are_tagged_and_unknown_ones_are_skippable() {
        let full = serde_json::to_string(&WatchEvent::Full(Snapshot {
            version: VERSION,
            ..Default::default()
        }))
        .expect("json");
        assert!(
            full.starts_with("{\"type\":\"full\",\"version\":1,"),
            "{full}"
        );
        let delta = serde_json::to_string(&WatchEvent::Delta(Delta {
            version: VERSION,
            taken_at_ns: 5,
            ..Default::default()
        }))
        .expect("json");
        assert_eq!(
            delta,
            "{\"type\":\"delta\",\"version\":1,\"taken_at_ns\":5}"
        );
        let e: WatchEvent =
            serde_json::from_str("{\"type\":\"heartbeat\",\"x\":1}").expect("unknown type");
        assert_eq!(e, WatchEvent::Unknown);
    }

    #[test]
    fn newer_agents_are_readable() {
        // A field and an enum value this version does not know, and a missing field.
        let s: Snapshot = serde_json::from_str(
            r#"{"version":1,"future":true,"processes":[{"pid":7,"shim":{"depth":"warp-level"},
                "slo":{"state":"exploding","nodes":[]}}]}"#,
        )
        .expect("forward compatible");
        assert_eq!(s.processes[0].pid, 7);
        assert_eq!(s.processes[0].shim.depth, Depth::Unknown);
        assert_eq!(
            s.processes[0].slo.as_ref().map(|s| s.state),
            Some(State::Unknown)
        );
    }

    #[test]
    fn retain_keeps_a_job_and_sums_its_roles() {
        let mut s = Snapshot {
            processes: vec![process(1, 1), process(2, 1), process(3, 1)],
            jobs: vec![Job {
                id: "j".into(),
                ranks: vec![
                    Rank {
                        rank: 0,
                        pid: 1,
                        ..Default::default()
                    },
                    Rank {
                        rank: 1,
                        pid: 3,
                        ..Default::default()
                    },
                ],
            }],
            healer: Some(Healer {
                timeline: [1, 3]
                    .map(|pid| HealerEvent {
                        target: format!("pid {pid}"),
                        ..Default::default()
                    })
                    .to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        };
        s.retain_pids(&BTreeSet::from([1, 2]));
        assert_eq!(s.processes.len(), 2);
        assert_eq!(
            s.healer.as_ref().map(|h| h.timeline.len()),
            Some(1),
            "pid 3's healer events go"
        );
        assert_eq!(s.jobs[0].ranks.len(), 1);
        assert_eq!(s.host.roles.len(), 1);
        assert_eq!(s.host.roles[0].runq_waits, 6);
        assert_eq!(s.host.roles[0].runq_p50_ns, None);
    }
}
