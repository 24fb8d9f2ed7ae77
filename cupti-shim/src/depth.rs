//! Tracing depth: which depth the shim should be at now, and when to look again. Pure logic
//! (no CUPTI, no clock, no threads): the flusher thread feeds it what it observed and applies
//! the answer, so every rule here is unit-tested without a GPU.
//!
//! Depths (`slo_probe_common::gpu::DEPTH_*`): 0 timing (step markers, graph launches at graph
//! level, memcpy/memset, no per-kernel activity or launch callbacks), 1 kernels, 2 graph nodes.
//! The shim runs at the highest of: its configured tier (`SLO_PROBE_DEPTH`, default 0), the
//! agent's request, the script's request, and a duty-cycled sample window.
//!
//! Sample windows keep the always-on tier's cost within a budget (default 0.5% of step time):
//! every `period` steps kernels are traced for `window` complete steps. The period follows from
//! what the last windows cost (the shim's callback time, the estimated CUPTI cost of each kernel
//! launched, the switching), the step time outside windows, and the depth-0 cost between
//! windows: `period = cost_of_a_window / ((budget − depth-0 share) × step_time)`. A process that
//! marks no steps is sampled by time instead (`window` ms every `period` ms). The first window
//! comes early (step 10, or 2 s) so that baselines form quickly.

use slo_probe_common::{
    gpu::{
        DEPTH_KERNELS, DEPTH_NODES, DEPTH_REASON_AGENT, DEPTH_REASON_DEFAULT, DEPTH_REASON_SAMPLE,
        DEPTH_REASON_SCRIPT, DEPTH_TIMING,
    },
    ring::{DepthDuration, ShimDepth, SHIM_COST_PER_KERNEL_RECORD_NS, SHIM_MIN_DRAIN_NS},
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
/// Longest sampling period in steps and in time.
const MAX_PERIOD_STEPS: u64 = 1_000_000;
const MAX_PERIOD_NS: u64 = 600 * SEC;
/// Windows start at most once a second.
const MIN_PERIOD_NS: u64 = SEC;
/// Share of the budget the planner aims at.
const SAFETY: f64 = 0.8;
/// Markers older than this (and 20 step times) mean the script stopped marking steps.
const MARKERS_STALE_NS: u64 = 10 * SEC;

/// Why the shim is at its depth (the `DEPTH_REASON_*` of the ABI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The configured tier.
    Default = DEPTH_REASON_DEFAULT as isize,
    /// A sample window.
    Sample = DEPTH_REASON_SAMPLE as isize,
    /// The script asked.
    Script = DEPTH_REASON_SCRIPT as isize,
    /// The agent asked.
    Agent = DEPTH_REASON_AGENT as isize,
}

impl Reason {
    /// Which reason is reported when several ask for the same depth.
    const fn rank(self) -> u8 {
        match self {
            Self::Default => 0,
            Self::Sample => 1,
            Self::Script => 2,
            Self::Agent => 3,
        }
    }
}

/// Which API domains' kernel-launch callbacks stamp launches (`SLO_PROBE_LAUNCH_DOMAIN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchDomains {
    /// Both in a probe window now and then; the domains whose stamps kernel records matched in
    /// between.
    Auto,
    /// The driver API (`cuLaunchKernel`: Triton/Inductor launch here directly).
    Driver,
    /// The runtime API (`cudaLaunchKernel`: eager PyTorch).
    Runtime,
    /// Both.
    Both,
}

/// Bit of a domain mask: the driver API.
pub const DRIVER: u32 = 1;
/// Bit of a domain mask: the runtime API.
pub const RUNTIME: u32 = 2;

/// The shim's depth settings, from the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Depth when nothing else asks (`SLO_PROBE_DEPTH`: 0/timing, 1/kernels, 2/nodes; default
    /// 0; `SLO_PROBE_DIAGNOSTIC=1` means 2).
    pub base: u32,
    /// Sample windows on (`SLO_PROBE_SAMPLE=0` turns them off; only at base depth 0).
    pub sampling: bool,
    /// Complete steps per window (`SLO_PROBE_SAMPLE_STEPS`, default 5).
    pub window_steps: u64,
    /// Fixed period in steps (`SLO_PROBE_SAMPLE_EVERY`; default: from the measured cost).
    pub every_steps: Option<u64>,
    /// Window length without step markers (`SLO_PROBE_SAMPLE_MS`, default 100).
    pub window_ms: u64,
    /// Fixed period in ms without step markers (`SLO_PROBE_SAMPLE_EVERY_MS`).
    pub every_ms: Option<u64>,
    /// Budget as a fraction of step time (`SLO_PROBE_SAMPLE_BUDGET_PCT`, default 0.5 %).
    pub budget: f64,
    /// Estimated CUPTI cost per kernel record, ns (`SLO_PROBE_RECORD_COST_NS`).
    pub record_cost_ns: u64,
    /// Step (end markers counted from the start) at which the first window opens
    /// (`SLO_PROBE_SAMPLE_FIRST_STEP`, default 10).
    pub first_window_step: u64,
    /// Without markers, when the first window opens after tracing starts, ms (default 2000).
    pub first_window_ms: u64,
    /// Kernel-launch callback domains (`SLO_PROBE_LAUNCH_DOMAIN`: auto, driver, runtime, both;
    /// default auto).
    pub domains: LaunchDomains,
    /// Kernel tracing stays on, windows stop, while the GPU runs this far (or half a step,
    /// whichever is longer) behind the launches (`SLO_PROBE_HOLD_LAG_MS`, default 5; 0: never).
    /// See [`Planner`]: switching kernel activity off and on under a deep queue loses records.
    pub hold_lag_ns: u64,
    /// The hold ends when its estimated cost (callbacks plus `record_cost_ns` per launch) passes
    /// this share of wall time (`SLO_PROBE_HOLD_MAX_PCT`, default 8 %); no new hold for
    /// [`NO_HOLD_AFTER_COST_NS`] then. A hold's job runs behind on the GPU, where CUPTI's time
    /// on the launching thread mostly hides behind the queue; 8% at 4 µs a record ends holds at
    /// about the launch rate that 3% did at the 1.5 µs assumed before (2026-12-05), so the
    /// recalibration moved no hold. A job without step markers keeps its hold past this cost
    /// until the queue has stayed shallow for [`UNHOLD_AFTER_NS`]: its copies are its iteration
    /// clock (see `update_hold`).
    pub hold_max_share: f64,
    /// Kernel tracing is on from the start and stays on until the queue is known (on a
    /// shallow queue, also until `first_window_step` steps are marked or
    /// [`OPENING_HOLD_MAX_NS`] passed) (`SLO_PROBE_HOLD_AT_START`, default 1; 0: the first
    /// window opens at `first_window_step`). See [`Planner`]: even the first switch on under a deep queue
    /// strands the records.
    pub hold_at_start: bool,
    /// Once the process launches a CUDA graph, kernel tracing stays on (depth 1 is the floor of
    /// the duty cycle) until that costs more than [`Config::hold_max_share`]
    /// (`SLO_PROBE_GRAPH_FLOOR`, default 1; 0: windows as for eager jobs). See [`Planner`]:
    /// switching kernel activity under CUDA graphs with memory activity on stranded the records.
    /// The shim turns it off where memory activity is off (`SLO_PROBE_MEM_ACTIVITY=0`).
    pub graph_floor: bool,
    /// Node-level tracing (depth 2) may be switched on and off once the process launches CUDA
    /// graphs (`SLO_PROBE_GRAPH_NODES`, default 0: requests for depth 2 get depth 1 from the
    /// first graph launch on). On an H100 (the fault suite's GPT under
    /// `torch.compile(mode="reduce-overhead")`, 2026-12-06) the job crashed (SIGSEGV in
    /// `CUDAGraph.replay`) right after the shim left a node-level sample during which torch had
    /// captured a new graph, in 2 of 2 runs. A node-level base depth (`SLO_PROBE_DEPTH=2`)
    /// never switches, and is kept.
    pub graph_nodes: bool,
    /// Where the hold would keep kernel tracing on (a deep queue), switch it at drained moments
    /// instead, from then on (the exit of a synchronising call, [`Planner::drains`]); set by
    /// the shim from `SLO_PROBE_TOGGLE_AT_SYNC` (default on; `0` keeps the hold).
    pub drain_deep: bool,
    /// Depth 0 goes quiet between sample windows where [`Planner::may_quiet`] allows it
    /// (`SLO_PROBE_QUIET_IDLE`, default on; `0` or `false` keeps it loud; see
    /// `control::quiet_cupti`).
    pub quiet_idle: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            base: DEPTH_TIMING,
            sampling: true,
            window_steps: 5,
            every_steps: None,
            window_ms: 100,
            every_ms: None,
            budget: 0.005,
            record_cost_ns: SHIM_COST_PER_KERNEL_RECORD_NS,
            first_window_step: 10,
            first_window_ms: 2_000,
            domains: LaunchDomains::Auto,
            hold_lag_ns: HOLD_LAG_NS,
            hold_max_share: 0.08,
            hold_at_start: true,
            graph_floor: true,
            graph_nodes: false,
            drain_deep: false,
            quiet_idle: true,
        }
    }
}

/// Parses a depth: 0/1/2 or timing/kernels/nodes.
pub fn parse_depth(v: &str) -> Option<u32> {
    match v.trim().to_ascii_lowercase().as_str() {
        "0" | "timing" => Some(DEPTH_TIMING),
        "1" | "kernels" => Some(DEPTH_KERNELS),
        "2" | "nodes" => Some(DEPTH_NODES),
        _ => None,
    }
}

impl Config {
    /// The settings from environment variables read through `get`; a value that does not parse
    /// keeps the default and is reported in the returned list of `(variable, value)`.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> (Self, Vec<(String, String)>) {
        let mut c = Self::default();
        let mut bad = Vec::new();
        let mut num = |name: &str, min: u64, max: u64| -> Option<u64> {
            let v = get(name)?;
            match v.trim().parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Some(n),
                _ => {
                    bad.push((name.to_owned(), v));
                    None
                }
            }
        };
        c.window_steps = num("SLO_PROBE_SAMPLE_STEPS", 1, 10_000).unwrap_or(c.window_steps);
        c.every_steps = num("SLO_PROBE_SAMPLE_EVERY", 2, MAX_PERIOD_STEPS);
        c.window_ms = num("SLO_PROBE_SAMPLE_MS", 1, 60_000).unwrap_or(c.window_ms);
        c.every_ms = num("SLO_PROBE_SAMPLE_EVERY_MS", 2, MAX_PERIOD_NS / MS);
        c.record_cost_ns =
            num("SLO_PROBE_RECORD_COST_NS", 0, 1_000_000).unwrap_or(c.record_cost_ns);
        c.first_window_step =
            num("SLO_PROBE_SAMPLE_FIRST_STEP", 0, MAX_PERIOD_STEPS).unwrap_or(c.first_window_step);
        c.hold_lag_ns = num("SLO_PROBE_HOLD_LAG_MS", 0, 60_000).map_or(c.hold_lag_ns, |ms| ms * MS);
        // Switches: 0 or 1.
        let mut switch = |name: &str, default: bool| num(name, 0, 1).map_or(default, |n| n == 1);
        c.hold_at_start = switch("SLO_PROBE_HOLD_AT_START", c.hold_at_start);
        c.graph_floor = switch("SLO_PROBE_GRAPH_FLOOR", c.graph_floor);
        c.graph_nodes = switch("SLO_PROBE_GRAPH_NODES", c.graph_nodes);
        if let Some(v) = get("SLO_PROBE_HOLD_MAX_PCT") {
            match v.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => c.hold_max_share = p / 100.0,
                _ => bad.push(("SLO_PROBE_HOLD_MAX_PCT".into(), v)),
            }
        }
        if let Some(v) = get("SLO_PROBE_SAMPLE_BUDGET_PCT") {
            match v.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => c.budget = p / 100.0,
                _ => bad.push(("SLO_PROBE_SAMPLE_BUDGET_PCT".into(), v)),
            }
        }
        let flag = |v: &str| v == "1" || v.eq_ignore_ascii_case("true");
        let off = |v: &str| v == "0" || v.eq_ignore_ascii_case("false");
        if get("SLO_PROBE_DIAGNOSTIC").is_some_and(|v| flag(&v)) {
            c.base = DEPTH_NODES;
        }
        if let Some(v) = get("SLO_PROBE_DEPTH") {
            match parse_depth(&v) {
                Some(d) => c.base = d,
                None => bad.push(("SLO_PROBE_DEPTH".into(), v)),
            }
        }
        if let Some(v) = get("SLO_PROBE_QUIET_IDLE") {
            if flag(&v) {
                c.quiet_idle = true;
            } else if off(&v) {
                c.quiet_idle = false;
            } else {
                bad.push(("SLO_PROBE_QUIET_IDLE".into(), v));
            }
        }
        if let Some(v) = get("SLO_PROBE_SAMPLE") {
            c.sampling = !off(&v);
        }
        if let Some(v) = get("SLO_PROBE_LAUNCH_DOMAIN") {
            c.domains = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => LaunchDomains::Auto,
                "driver" => LaunchDomains::Driver,
                "runtime" => LaunchDomains::Runtime,
                "both" => LaunchDomains::Both,
                _ => {
                    bad.push(("SLO_PROBE_LAUNCH_DOMAIN".into(), v));
                    c.domains
                }
            };
        }
        (c, bad)
    }
}

/// What the flusher saw, all cumulative since the shim started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// CLOCK_MONOTONIC ns.
    pub now_ns: u64,
    /// Step end markers.
    pub steps: u64,
    /// When the last step ended (0: never).
    pub last_step_ns: u64,
    /// Time inside the shim's callbacks on launching threads, ns.
    pub callback_ns: u64,
    /// Kernel-launch callbacks.
    pub kernel_launches: u64,
    /// Kernel records delivered.
    pub kernel_records: u64,
    /// Graph-launch records delivered (`GRAPH_TRACE`, at every depth but nodes): under CUDA
    /// graphs they, not kernel records, show that CUPTI hands records over.
    pub graph_records: u64,
    /// CUDA-graph launches (callbacks, at every depth: they do not wait for CUPTI's records).
    pub graph_launches: u64,
    /// Time the flusher spent switching CUPTI, ns.
    pub toggle_ns: u64,
    /// How long after their launch kernels finish on the GPU lately (a CPU running ahead
    /// queues work), ns; 0 while unknown. CUPTI records a kernel when it runs: a window stays
    /// open this much longer, so that what its steps launched is traced.
    pub gpu_lag_ns: u64,
}

/// The depth wanted now and when to be asked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `DEPTH_*`.
    pub depth: u32,
    /// Why.
    pub reason: Reason,
    /// Ask again when this many steps have ended.
    pub wake_step: Option<u64>,
    /// Ask again at this time (ns).
    pub wake_ns: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Until {
    Forever,
    /// Steps ended ≥ this, or the time cap passed (markers may stop).
    Steps(u64, u64),
    Ns(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Request {
    depth: u32,
    until: Until,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Step(u64),
    Ns(u64),
}

/// An open sample window and what was observed when it opened.
#[derive(Clone, Copy, Debug)]
struct Window {
    at: Observed,
    /// Opened by time (no markers).
    millis: bool,
    /// When its steps (or its time) were done.
    launched_at: Option<u64>,
    /// Once its steps (or its time) are done: until when it stays open for the GPU to run
    /// what they launched.
    drain_until: Option<u64>,
}

/// The longest a window stays open after its steps for the GPU to catch up.
pub const MAX_DRAIN_NS: u64 = 2 * SEC;

/// The shortest a window of steps stays open after them (see [`SHIM_MIN_DRAIN_NS`]); what
/// the drain costs is measured with the window's and sets the period, as the rest does.
pub const MIN_DRAIN_NS: u64 = SHIM_MIN_DRAIN_NS;

/// Default of [`Config::hold_lag_ns`].
pub const HOLD_LAG_NS: u64 = 5 * MS;

/// How long the GPU lag stays under half the hold threshold before windows resume.
pub const UNHOLD_AFTER_NS: u64 = 5 * SEC;

/// On a shallow queue the opening hold ends once the job has marked
/// [`Config::first_window_step`] steps, or this long after tracing started without them.
pub const OPENING_HOLD_MAX_NS: u64 = 60 * SEC;

/// How long an agent's request for kernels outlives its lowering once kernel tracing switches
/// at drained moments ([`Planner::drains`]).
pub const DEEP_LINGER_NS: u64 = 10 * SEC;

/// How often a hold's cost is judged.
pub const HOLD_COST_EVERY_NS: u64 = 2 * SEC;
/// See [`Config::hold_max_share`].
pub const NO_HOLD_AFTER_COST_NS: u64 = 600 * SEC;
/// A hold under which kernels are launched but no record comes back for this long ends (it
/// costs and delivers nothing), and no hold starts for [`NO_HOLD_AFTER_COST_NS`].
pub const NO_RECORDS_NS: u64 = 30 * SEC;

/// The depth state machine.
///
/// A window raises the depth to kernels for a few steps now and then, at a period set from
/// what the windows cost. Where the CPU runs far ahead of the GPU (a deep launch queue, as in
/// GPU-bound training), the window that measured it does not close: kernel tracing is *held*
/// on. Measured on the H200 (eager GPT job of the fault suite, 2026-12-02,
/// `scripts/gpu-arrival-check`): switching `CONCURRENT_KERNEL` off and on under a 150 ms queue
/// left every kernel record in CUPTI until the process exited (0 of 86,235 delivered live;
/// with memcpy records off they came, but 25% carried the correlation id of the record before
/// them), while kernels held on delivered 100% within 1 s with no repeated id. A job with a
/// deep queue is GPU-bound, so the per-launch CPU cost of tracing is hidden behind the GPU's
/// work. Windows resume once the lag stays under half the threshold for
/// [`UNHOLD_AFTER_NS`].
///
/// The hold also starts with tracing ([`Config::hold_at_start`]): on the same job the shim as
/// first shipped (2026-12-02, second run) opened its first window at step 10, under the queue,
/// and 28 of 221,997 kernel records came back live; kernels on from the start (before the
/// job's first launch) delivered all of them. A launch-bound job ends that opening hold at its
/// first cost check (2 s; without step markers once its queue has stayed shallow for
/// [`UNHOLD_AFTER_NS`]), a shallow queue after [`UNHOLD_AFTER_NS`]; the first window then
/// comes `first_window_step` steps (or `first_window_ms`) later. A window whose launches bring
/// no record back within [`MAX_DRAIN_NS`] is treated as a deep queue too (held, not switched
/// off again), and a hold that brings no record back for [`NO_RECORDS_NS`] ends. Under CUDA
/// graphs the graph-launch records (traced at every depth) count as records back, and their
/// launch-to-end time as the lag: a graph job's queue is known before any window.
///
/// With [`Config::drain_deep`] (the shim's default) the hold gives way once the queue is known
/// deep (records back under it, the lag over the threshold, the job's first steps marked; or a
/// window that measured it): windows go on, and the shim switches them only at drained moments
/// ([`Planner::drains`], `control::Drain`). A lowering asked by the agent then lingers
/// [`DEEP_LINGER_NS`], since the next raise can come only at the next drained moment. Only a
/// job that marks its steps: without markers the kernels are its iteration clock (the agent
/// detects iterations from them), so a marker-less job keeps the hold (on an H100, the suite's
/// GPU-bound eager jobs replayed without their markers found 85% of their steps).
///
/// Under CUDA graphs kernel tracing is *pinned* on from the process's first graph launch
/// ([`Config::graph_floor`]). Measured on an H100 (GPT of the fault suite under
/// `torch.compile(mode="reduce-overhead")`, 2026-12-05, `bench/results/faults-2026-12-05-h100`):
/// with windows switching `CONCURRENT_KERNEL` while memcpy/memset activity was on, every GPU
/// record (graph-level ones included) reached the agent only at the job's exit (lag p50 57 s);
/// with memory activity off, or kernel tracing never switched off, all came within 0.4 s. The
/// depth-1/depth-2 switches the agent asks for under the pin were among the latter. Under a
/// graph the launching thread launches few kernels, so the pin costs little (reduce-overhead
/// jobs of `scripts/gpu-overhead` stayed held at depth 1 all run, within noise of released);
/// it ends, for the rest of the process, once it costs more than [`Config::hold_max_share`].
#[derive(Debug)]
pub struct Planner {
    cfg: Config,
    agent: Option<Request>,
    script: Option<Request>,
    window: Option<Window>,
    next: Option<Next>,
    millis: bool,
    /// Smoothed cost of one window, ns.
    window_cost_ns: Option<f64>,
    /// Smoothed step time outside windows, ns.
    step_ns: Option<f64>,
    /// Smoothed depth-0 cost as a share of wall time.
    base_share: f64,
    /// When the last window closed (for the depth-0 share).
    quiet_since: Option<Observed>,
    /// Current period (steps, or ms in time mode); 0 until known.
    period: u64,
    windows: u64,
    /// Kernel tracing held on (a deep launch queue).
    held: Option<Held>,
    /// No hold before this time (one cost too much).
    no_hold_until: u64,
    /// Kernel tracing pinned on because the process launches CUDA graphs: where its cost is
    /// measured from.
    pinned: Option<Observed>,
    /// The pin cost too much once: no pin again.
    pin_refused: bool,
    /// A request for node-level tracing got kernel level because the process launches CUDA
    /// graphs ([`Config::graph_nodes`]).
    nodes_refused: bool,
    /// A deep queue was seen with [`Config::drain_deep`]: kernel tracing is switched at drained
    /// moments from now on, and never held.
    draining: bool,
    /// A hold ended with the queue measured shallow (the records back, the lag under half the
    /// threshold): memory activity may go with kernel activity from then on
    /// ([`Planner::mem_with_kernels`]).
    shallow_seen: bool,
}

/// Kernel tracing held on: since when the lag has stayed low, and where its cost is measured
/// from.
#[derive(Clone, Copy, Debug)]
struct Held {
    low_since: Option<u64>,
    cost_from: Observed,
    /// When the hold began.
    from: Observed,
    /// The opening hold (from the start, nothing measured yet).
    opening: bool,
}

impl Planner {
    /// A planner with `cfg`, tracing from `now_ns`.
    pub fn new(cfg: Config, now_ns: u64) -> Self {
        let next = Some(Next::Ns(now_ns + cfg.first_window_ms * MS));
        let period = cfg.every_ms.unwrap_or(0);
        let mut p = Self {
            cfg,
            agent: None,
            script: None,
            window: None,
            next,
            millis: true,
            window_cost_ns: None,
            step_ns: None,
            base_share: 0.0,
            quiet_since: None,
            period,
            windows: 0,
            held: None,
            no_hold_until: 0,
            pinned: None,
            pin_refused: false,
            nodes_refused: false,
            draining: false,
            shallow_seen: false,
        };
        if p.cfg.hold_at_start && p.sampling() && p.hold_threshold().is_some() {
            let start = Observed {
                now_ns,
                ..Observed::default()
            };
            p.held = Some(Held {
                low_since: None,
                cost_from: start,
                from: start,
                opening: true,
            });
        }
        p
    }

    /// Whether kernel tracing is held on because the GPU runs far behind the launches.
    pub fn held(&self) -> bool {
        self.held.is_some()
    }

    /// Whether kernel tracing is switched only at drained moments: a deep queue was seen and
    /// [`Config::drain_deep`] is on (the shim switches memory activity with it then).
    pub fn drains(&self) -> bool {
        self.draining
    }

    /// Whether memory activity (where it is on) is switched with kernel activity from now on,
    /// off at depth 0: once kernel tracing is switched at drained moments ([`Planner::drains`]),
    /// or once a hold (the opening one) ended with the queue measured shallow, where switching
    /// strands no record, in a job that marks its steps (without markers the copies and fills
    /// are its iteration clock, `core/src/gputrace/cycle.rs`). Until then it is on from the
    /// start, at every depth. On an H100 (2026-12-06, `bench/results/overhead-2026-12-06`
    /// calls 1–2, and the switch log of `overhead-2026-12-06b` call 1) a GPU-bound eager job
    /// whose queue the planner never judged deep (20-step blocks, each ended by a sync, after a
    /// launch-bound phase) kept it on at depth 0, and its memcpy/memset records cost it +0.6%
    /// on the GPU; with this, no memory record at depth 0 and +0.18% (`overhead-2026-12-06b`
    /// call 3). A latch: it never goes back.
    pub fn mem_with_kernels(&self) -> bool {
        self.draining || self.shallow_seen
    }

    /// Whether depth 0 may go quiet now ([`Config::quiet_idle`], `control::quiet_cupti`):
    /// between sample windows of a job that marks its steps (they time its iterations), whose
    /// queue was measured shallow at the end of a hold (kernel tracing is switched from the
    /// flusher then, without a drained moment), that is not held or pinned on, and that has
    /// launched no CUDA graph (their graph records are its GPU timing at depth 0). A job that
    /// starts launching graphs later is seen in its next window and stays loud from then on.
    pub fn may_quiet(&self, o: &Observed) -> bool {
        self.cfg.quiet_idle
            && !self.millis
            && self.shallow_seen
            && !self.draining
            && self.held.is_none()
            && self.pinned.is_none()
            && self.window.is_none()
            && o.graph_launches == 0
            && o.graph_records == 0
    }

    /// Whether a deep queue seen now turns to drained switching instead of the hold: with
    /// [`Config::drain_deep`], for a job that marks its steps (without markers its kernels are
    /// its iteration clock).
    fn may_drain(&self) -> bool {
        self.cfg.drain_deep && !self.millis
    }

    /// Whether kernel tracing is pinned on because the process launches CUDA graphs.
    pub fn pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// Whether a request for node-level tracing has been answered with kernel level because
    /// the process launches CUDA graphs ([`Config::graph_nodes`]).
    pub fn nodes_refused(&self) -> bool {
        self.nodes_refused
    }

    /// Whether requests for node level get kernel level now: the process launches CUDA graphs
    /// and [`Config::graph_nodes`] is off.
    pub fn no_graph_nodes(&self, o: &Observed) -> bool {
        o.graph_launches > 0 && !self.cfg.graph_nodes
    }

    /// The lag from which kernel tracing is held on: the configured one, or half a step.
    fn hold_threshold(&self) -> Option<u64> {
        (self.cfg.hold_lag_ns > 0 && self.cfg.hold_max_share > 0.0).then(|| {
            let half_step = if self.millis {
                0
            } else {
                self.step_ns.map_or(0, |s| (s / 2.0) as u64)
            };
            self.cfg.hold_lag_ns.max(half_step)
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Sample windows opened so far.
    pub fn windows(&self) -> u64 {
        self.windows
    }

    fn sampling(&self) -> bool {
        self.cfg.sampling && self.cfg.base == DEPTH_TIMING
    }

    /// A request from the agent or the script (`who` is [`Reason::Agent`] or
    /// [`Reason::Script`]): `depth` for `duration`; depth 0 withdraws that source's request.
    pub fn request(&mut self, who: Reason, depth: u32, duration: DepthDuration, o: &Observed) {
        let req = (depth > DEPTH_TIMING).then(|| {
            let depth = depth.min(DEPTH_NODES);
            let until = match duration {
                DepthDuration::UntilNext => Until::Forever,
                DepthDuration::Tenths(n) => Until::Ns(o.now_ns + u64::from(n) * 100 * MS),
                DepthDuration::Steps(n) if self.millis => {
                    Until::Ns(o.now_ns + u64::from(n) * 100 * MS)
                }
                DepthDuration::Steps(n) => {
                    let step = self.step_ns.map_or(100 * MS, |s| s as u64).max(100 * MS);
                    let cap = o.now_ns + u64::from(n) * 4 * step + 10 * SEC;
                    // +1: the step running now is not complete.
                    Until::Steps(o.steps + u64::from(n) + 1, cap)
                }
            };
            Request { depth, until }
        });
        match who {
            // Switched only at drained moments, a lowering may come a sync interval later and
            // the next raise another one after: the agent's last request lingers
            // (the suite's convnet, H100 2026-12-06: lowered just before a fault and raised
            // again only after it ended, 6 s later).
            Reason::Agent => {
                self.agent = match (req, self.agent) {
                    (None, Some(prev)) if self.draining && prev.depth >= DEPTH_KERNELS => {
                        Some(Request {
                            depth: prev.depth,
                            until: Until::Ns(o.now_ns + DEEP_LINGER_NS),
                        })
                    }
                    _ => req,
                }
            }
            _ => self.script = req,
        }
    }

    /// Where the shim publishes its duty cycle (depth and reason filled by the caller).
    pub fn published(&self) -> ShimDepth {
        let sampling = self.sampling() && self.held.is_none() && self.pinned.is_none();
        let (window, period) = match (sampling, self.millis) {
            (false, _) => (0, 0),
            (true, true) => (self.cfg.window_ms, self.period),
            (true, false) => (self.cfg.window_steps, self.period),
        };
        ShimDepth {
            depth: 0,
            reason: 0,
            window: window.min(u64::from(u32::MAX)) as u32,
            period: period.min(u64::from(u32::MAX)) as u32,
            millis: self.millis,
        }
    }

    /// Forgets an open window (tracing stopped: CUPTI was handed to another tool). The next
    /// window keeps its schedule; one that comes due meanwhile opens when tracing resumes.
    pub fn interrupted(&mut self, o: &Observed) {
        self.window = None;
        self.quiet_since = Some(*o);
        if self.next.is_none() {
            self.schedule_next(o, None);
        }
    }

    fn markers_live(&self, o: &Observed) -> bool {
        let stale = self
            .step_ns
            .map_or(MARKERS_STALE_NS, |s| (20.0 * s) as u64)
            .max(MARKERS_STALE_NS);
        o.steps > 0 && o.last_step_ns > 0 && o.now_ns.saturating_sub(o.last_step_ns) < stale
    }

    fn expired(r: &Request, o: &Observed) -> bool {
        match r.until {
            Until::Forever => false,
            Until::Steps(s, cap) => o.steps >= s || o.now_ns >= cap,
            Until::Ns(t) => o.now_ns >= t,
        }
    }

    /// The next window start: one period after `from` (the window that just opened or
    /// closed), or, before any window of this mode was measured, the first one (step
    /// `first_window_step`, or `first_window_ms` from now).
    fn schedule_next(&mut self, o: &Observed, from: Option<&Observed>) {
        let measured = self.window_cost_ns.is_some() && self.period > 0;
        self.next = Some(match (self.millis, measured) {
            (true, true) => {
                let start = from.map_or(o.now_ns, |f| f.now_ns);
                Next::Ns((start + self.period * MS).max(o.now_ns + 1))
            }
            (true, false) => Next::Ns(o.now_ns + self.cfg.first_window_ms * MS),
            (false, true) => {
                let start = from.map_or(o.steps, |f| f.steps);
                Next::Step((start + self.period).max(o.steps + 1))
            }
            (false, false) => Next::Step(self.cfg.first_window_step.max(o.steps + 1)),
        });
    }

    /// Closes the open window: measures its cost and sets the period.
    fn close_window(&mut self, w: Window, o: &Observed) {
        self.window = None;
        let cost = o.callback_ns.saturating_sub(w.at.callback_ns) as f64
            + o.kernel_launches
                .saturating_sub(w.at.kernel_launches)
                .max(o.kernel_records.saturating_sub(w.at.kernel_records)) as f64
                * self.cfg.record_cost_ns as f64
            // The lowering that follows is assumed to cost what the raise did.
            + 2.0 * o.toggle_ns.saturating_sub(w.at.toggle_ns) as f64;
        let smooth = |old: Option<f64>, new: f64| Some(old.map_or(new, |v| 0.5 * v + 0.5 * new));
        self.window_cost_ns = smooth(self.window_cost_ns, cost);
        let cost = self.window_cost_ns.unwrap_or(cost);
        // Aim at 80% of what is left: the CUPTI part of the cost is an estimate.
        let left = (self.cfg.budget - self.base_share).max(self.cfg.budget / 4.0) * SAFETY;
        if w.millis {
            let period_ns = (cost / left).ceil() as u64;
            let min = (4 * self.cfg.window_ms * MS).max(MIN_PERIOD_NS);
            let p = period_ns.max(min).min(MAX_PERIOD_NS.max(min)) / MS;
            self.period = self.cfg.every_ms.unwrap_or(p);
        } else {
            let steps = o.steps.saturating_sub(w.at.steps);
            let span = o.last_step_ns.saturating_sub(w.at.last_step_ns) as f64;
            if steps > 0 && span > 0.0 {
                // Step time without the shim: the window's steps less what the shim took.
                let s0 = (span - cost).max(span / 2.0) / steps as f64;
                self.step_ns = smooth(self.step_ns, s0);
            }
            let s0 = self.step_ns.unwrap_or(MS as f64).max(1_000.0);
            let p = (cost / (left * s0)).ceil() as u64;
            let min = (4 * (self.cfg.window_steps + 1))
                .max((MIN_PERIOD_NS as f64 / s0).ceil() as u64)
                .min(MAX_PERIOD_STEPS);
            let max = ((MAX_PERIOD_NS as f64 / s0) as u64).clamp(min, MAX_PERIOD_STEPS);
            let p = p.max(min).min(max);
            self.period = self
                .cfg
                .every_steps
                .map_or(p, |e| e.max(self.cfg.window_steps + 2));
        }
        self.quiet_since = Some(*o);
        self.schedule_next(o, Some(&w.at));
        // A window held open long (waiting for its records) still leaves half a period quiet.
        let half = self.period / 2;
        self.next = match self.next {
            Some(Next::Step(n)) => Some(Next::Step(n.max(o.steps + half))),
            Some(Next::Ns(t)) => Some(Next::Ns(t.max(o.now_ns + half * MS))),
            None => None,
        };
    }

    /// While held: resumes windows once the lag has stayed under half the threshold for
    /// [`UNHOLD_AFTER_NS`].
    fn update_hold(&mut self, mut h: Held, o: &Observed) {
        // The lag counts once records came back under the hold.
        let back =
            o.kernel_records > h.from.kernel_records || o.graph_records > h.from.graph_records;
        let low = back && self.hold_threshold().is_none_or(|t| o.gpu_lag_ns < t / 2);
        h.low_since = if low {
            h.low_since.or(Some(o.now_ns))
        } else {
            None
        };
        let costly = self.too_costly(&h.cost_from, o);
        if costly.is_some() {
            h.cost_from = *o;
        }
        // Without markers the copies and fills traced under the hold are the job's iteration
        // clock, and the duty cycle that would follow switches kernel activity under the queue,
        // after which CUPTI held them back for seconds (H100, 2026-12-07, `device-2026-12-07d`
        // call 6: 321 and 603 iterations counted for 829 steps; held on, 829 and 829). Under a
        // deep queue the CPU runs ahead of the GPU and the callbacks' time is spent while it
        // waits on a full queue: the cost ends such a hold only once the queue has stayed
        // shallow for UNHOLD_AFTER_NS, not on a moment of it (on an H200 the same job's opening
        // hold ended on its cost with the GPU 0.7 ms behind, while it built its model; the
        // first window then switched kernel activity on under a 36 ms queue, and 972
        // iterations were counted for 829 steps).
        let shallow_for_long = h.low_since.is_some_and(|t| o.now_ns >= t + UNHOLD_AFTER_NS);
        let costly = costly.unwrap_or(false) && (!self.millis || shallow_for_long);
        let barren = !back
            && o.kernel_launches > h.from.kernel_launches
            && o.now_ns >= h.from.now_ns + NO_RECORDS_NS;
        if (costly && !h.opening) || barren {
            // Held on, it would cost the job more than it may (or it brings nothing back):
            // back to the duty cycle, whose records may be lost under the queue, rather than
            // slow the job.
            self.no_hold_until = o.now_ns + NO_HOLD_AFTER_COST_NS;
        }
        // The opening hold waits for the job's first steps too: torch.compile compiles for
        // seconds to minutes before them, on a shallow queue, and a window switched then comes
        // before the CUDA graphs that pin kernel tracing (see `Planner`).
        let settled = !h.opening
            || o.steps >= self.cfg.first_window_step.max(1)
            || o.now_ns >= h.from.now_ns + OPENING_HOLD_MAX_NS;
        let shallow = settled && h.low_since.is_some_and(|t| o.now_ns >= t + UNHOLD_AFTER_NS);
        // A deep queue known (records back, the lag over the threshold): with `drain_deep`
        // windows go on, switched at drained moments, instead of the hold.
        let deep = self.may_drain()
            && settled
            && back
            && self.hold_threshold().is_some_and(|t| o.gpu_lag_ns >= t);
        self.draining |= deep;
        if costly || barren || shallow || deep {
            // Ended on a queue measured shallow now (a launch-bound job's opening hold ends
            // on its cost, with the lag near 0), in a job that marks its steps: without markers
            // the copies and fills traced at every depth are its iteration clock.
            self.shallow_seen |= low && !deep && !self.millis;
            self.held = None;
            self.resume_windows(o);
            if h.opening {
                // The first window comes as if tracing started now.
                self.next = Some(if self.millis {
                    Next::Ns(o.now_ns + self.cfg.first_window_ms * MS)
                } else {
                    Next::Step(o.steps + self.cfg.first_window_step.max(1))
                });
            }
        } else {
            self.held = Some(h);
        }
    }

    /// While pinned: ends the pin, for good, once it costs more than the hold may.
    fn update_pin(&mut self, from: Observed, o: &Observed) {
        match self.too_costly(&from, o) {
            None => {}
            Some(false) => self.pinned = Some(*o),
            Some(true) => {
                self.pinned = None;
                self.pin_refused = true;
                self.resume_windows(o);
            }
        }
    }

    /// Whether kernel tracing kept on since `from` (its callbacks, and `record_cost_ns` per
    /// launch) costs more than [`Config::hold_max_share`] of the wall time; `None` until
    /// [`HOLD_COST_EVERY_NS`] have passed (then the caller measures from `o` next).
    fn too_costly(&self, from: &Observed, o: &Observed) -> Option<bool> {
        let wall = o.now_ns.saturating_sub(from.now_ns);
        (wall >= HOLD_COST_EVERY_NS).then(|| {
            let cost = o.callback_ns.saturating_sub(from.callback_ns) as f64
                + o.kernel_launches.saturating_sub(from.kernel_launches) as f64
                    * self.cfg.record_cost_ns as f64;
            cost / wall as f64 > self.cfg.hold_max_share
        })
    }

    /// Back to the duty cycle after a hold or the pin: the depth-0 share is measured from
    /// now, a window's cost anew, and the next window is scheduled.
    fn resume_windows(&mut self, o: &Observed) {
        self.quiet_since = Some(*o);
        self.window_cost_ns = None;
        self.schedule_next(o, None);
    }

    /// The depth wanted now.
    pub fn plan(&mut self, o: &Observed) -> Plan {
        for r in [&mut self.agent, &mut self.script] {
            if r.is_some_and(|r| Self::expired(&r, o)) {
                *r = None;
            }
        }
        // Steps or time: follow whether the script marks steps.
        let millis = !self.markers_live(o);
        if millis != self.millis {
            self.millis = millis;
            self.window = None;
            self.period = if millis {
                self.cfg.every_ms.unwrap_or(0)
            } else {
                self.cfg.every_steps.unwrap_or(0)
            };
            self.window_cost_ns = None;
            self.schedule_next(o, None);
        }
        let requested = self
            .agent
            .map_or(0, |r| r.depth)
            .max(self.script.map_or(0, |r| r.depth));
        if self.sampling()
            && self.cfg.graph_floor
            && !self.pin_refused
            && self.pinned.is_none()
            && o.graph_launches > 0
        {
            // Kernels stay on from here: a hold or a window hands over without a switch.
            self.pinned = Some(*o);
            self.held = None;
            self.window = None;
            self.next = None;
        }
        if self.sampling() {
            if let Some(from) = self.pinned {
                self.update_pin(from, o);
            } else if let Some(h) = self.held {
                self.update_hold(h, o);
            } else if let Some(mut w) = self.window {
                let launched = if w.millis {
                    o.now_ns >= w.at.now_ns + self.cfg.window_ms * MS
                } else {
                    // W complete steps: the step running when the window opened is not one.
                    o.steps > w.at.steps + self.cfg.window_steps
                };
                // Then the GPU runs what they launched. The lag is read from the window's own
                // records where a threshold needs it: until one arrives (at most
                // MAX_DRAIN_NS), the window stays open.
                let threshold = self.hold_threshold();
                let arrived =
                    o.kernel_records > w.at.kernel_records || o.graph_records > w.at.graph_records;
                let measured = arrived
                    || threshold.is_none()
                    || w.launched_at.is_some_and(|t| o.now_ns >= t + MAX_DRAIN_NS);
                if launched && w.launched_at.is_none() {
                    w.launched_at = Some(o.now_ns);
                    self.window = Some(w);
                }
                if launched && measured && w.drain_until.is_none() {
                    // A timed window (100 ms) is long enough by itself.
                    let least = if w.millis { 0 } else { MIN_DRAIN_NS };
                    w.drain_until = Some(o.now_ns + o.gpu_lag_ns.clamp(least, MAX_DRAIN_NS));
                    self.window = Some(w);
                }
                let done = w.drain_until.is_some_and(|t| o.now_ns >= t);
                // Launches whose records did not come back within MAX_DRAIN_NS: a queue deeper
                // than that, or records stranded by the switch; switching again strands more.
                let stuck = !arrived
                    && o.kernel_launches > w.at.kernel_launches
                    && w.launched_at.is_some_and(|t| o.now_ns >= t + MAX_DRAIN_NS);
                let deep = o.now_ns >= self.no_hold_until
                    && !self.draining
                    && threshold.is_some_and(|t| (arrived && o.gpu_lag_ns >= t) || stuck);
                if requested > DEPTH_TIMING {
                    // A request took over: this window measures nothing.
                    self.window = None;
                    self.schedule_next(o, Some(&w.at));
                } else if launched && measured && deep && self.may_drain() {
                    // Switched at drained moments from now on: the window closes as any.
                    self.draining = true;
                    if done {
                        self.close_window(w, o);
                    }
                } else if launched && measured && deep {
                    // A deep queue: switching kernel activity off would strand records.
                    self.window = None;
                    self.next = None;
                    self.held = Some(Held {
                        low_since: None,
                        cost_from: *o,
                        from: *o,
                        opening: false,
                    });
                } else if done {
                    self.close_window(w, o);
                }
            } else {
                let due = match self.next {
                    Some(Next::Step(s)) => o.steps >= s,
                    Some(Next::Ns(t)) => o.now_ns >= t,
                    None => false,
                };
                // A window that comes due while a request holds the depth waits for its end
                // (the request traces kernels anyway), so that windows keep their average rate.
                if due && requested == DEPTH_TIMING {
                    if let Some(q) = self.quiet_since {
                        let wall = o.now_ns.saturating_sub(q.now_ns);
                        if wall > 0 {
                            let share =
                                o.callback_ns.saturating_sub(q.callback_ns) as f64 / wall as f64;
                            self.base_share = 0.5 * self.base_share + 0.5 * share;
                        }
                    }
                    self.window = Some(Window {
                        at: *o,
                        millis: self.millis,
                        launched_at: None,
                        drain_until: None,
                    });
                    self.windows += 1;
                }
            }
        }
        // Node level is not switched under CUDA graphs (see `Config::graph_nodes`).
        let cap = if self.no_graph_nodes(o) {
            DEPTH_KERNELS
        } else {
            DEPTH_NODES
        };
        let asked = |r: Option<Request>| r.map_or(0, |r| r.depth.min(cap));
        self.nodes_refused |= [self.agent, self.script]
            .into_iter()
            .flatten()
            .any(|r| r.depth > cap);
        let candidates = [
            (self.cfg.base, Reason::Default),
            (
                if self.window.is_some()
                    || ((self.held.is_some() || self.pinned.is_some()) && self.sampling())
                {
                    DEPTH_KERNELS
                } else {
                    DEPTH_TIMING
                },
                Reason::Sample,
            ),
            (asked(self.script), Reason::Script),
            (asked(self.agent), Reason::Agent),
        ];
        let (depth, reason) = candidates
            .into_iter()
            .filter(|&(d, r)| d > DEPTH_TIMING || r == Reason::Default)
            .max_by_key(|&(d, r)| (d, r.rank()))
            .unwrap_or((self.cfg.base, Reason::Default));
        // When to look again.
        let mut wake_step: Option<u64> = None;
        let mut wake_ns: Option<u64> = None;
        let mut at_step = |s: u64| wake_step = Some(wake_step.map_or(s, |w| w.min(s)));
        let mut at_ns = |t: u64| wake_ns = Some(wake_ns.map_or(t, |w| w.min(t)));
        if self.millis && o.steps == 0 {
            // The first step marker switches sampling to steps at once.
            at_step(1);
        }
        if self.sampling() && (self.held.is_some() || self.pinned.is_some()) {
            // Held or pinned: look at the lag (the cost) again now and then.
            at_ns(o.now_ns + SEC);
        } else if self.sampling() {
            match (self.window, self.next) {
                (
                    Some(Window {
                        drain_until: Some(t),
                        ..
                    }),
                    _,
                ) => at_ns(t),
                (Some(w), _) if w.millis => at_ns(w.at.now_ns + self.cfg.window_ms * MS),
                (Some(w), _) => at_step(w.at.steps + self.cfg.window_steps + 1),
                // Due but held by a request: the request's end wakes the planner.
                (None, Some(Next::Step(s))) if s > o.steps => at_step(s),
                (None, Some(Next::Ns(t))) if t > o.now_ns => at_ns(t),
                (None, _) => {}
            }
        }
        for r in [self.agent, self.script].into_iter().flatten() {
            match r.until {
                Until::Forever => {}
                Until::Steps(s, cap) => {
                    at_step(s);
                    at_ns(cap);
                }
                Until::Ns(t) => at_ns(t),
            }
        }
        Plan {
            depth,
            reason,
            wake_step,
            wake_ns,
        }
    }
}

/// Chooses the kernel-launch callback domains in [`LaunchDomains::Auto`]: both during a probe
/// window, then the domains whose stamps kernel records of that window matched; a new probe
/// every [`DomainChooser::REPROBE_EVERY`] raises (kernels launched through another API may
/// appear later, e.g. after torch.compile).
#[derive(Debug, Clone)]
pub struct DomainChooser {
    mode: LaunchDomains,
    state: Choice,
}

#[derive(Debug, Clone, Copy)]
enum Choice {
    /// Probing with both; the hits per domain when the probe window opened.
    Probing(Option<(u64, u64)>),
    /// These domains, for this many raises so far.
    Chosen(u32, u32),
}

impl DomainChooser {
    /// Raises between two probes.
    pub const REPROBE_EVERY: u32 = 32;

    /// A chooser for `mode`.
    pub fn new(mode: LaunchDomains) -> Self {
        Self {
            mode,
            state: Choice::Probing(None),
        }
    }

    /// The domains to enable for kernels now, as kernel tracing is raised; `hits` are the
    /// cumulative correlation hits of kernel records stamped by (driver, runtime) callbacks.
    pub fn at_raise(&mut self, hits: (u64, u64)) -> u32 {
        match self.mode {
            LaunchDomains::Driver => return DRIVER,
            LaunchDomains::Runtime => return RUNTIME,
            LaunchDomains::Both => return DRIVER | RUNTIME,
            LaunchDomains::Auto => {}
        }
        let (state, mask) = match self.state {
            Choice::Probing(Some(from)) => {
                let d = hits.0.saturating_sub(from.0);
                let r = hits.1.saturating_sub(from.1);
                if d + r == 0 {
                    // The probe saw no kernels: probe again.
                    (Choice::Probing(Some(hits)), DRIVER | RUNTIME)
                } else {
                    let m = if d > 0 { DRIVER } else { 0 } | if r > 0 { RUNTIME } else { 0 };
                    (Choice::Chosen(m, 1), m)
                }
            }
            Choice::Chosen(m, n) if n < Self::REPROBE_EVERY => (Choice::Chosen(m, n + 1), m),
            Choice::Probing(None) | Choice::Chosen(..) => {
                (Choice::Probing(Some(hits)), DRIVER | RUNTIME)
            }
        };
        self.state = state;
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| v.iter().find(|(n, _)| n == k).map(|(_, x)| x.clone())
    }

    #[test]
    fn config_from_env() {
        let (c, bad) = Config::from_env(env(&[]));
        assert_eq!((c, bad.len()), (Config::default(), 0));
        let (c, bad) = Config::from_env(env(&[
            ("SLO_PROBE_DEPTH", "kernels"),
            ("SLO_PROBE_SAMPLE_EVERY", "200"),
            ("SLO_PROBE_SAMPLE_STEPS", "3"),
            ("SLO_PROBE_SAMPLE_BUDGET_PCT", "1"),
            ("SLO_PROBE_LAUNCH_DOMAIN", "runtime"),
            ("SLO_PROBE_SAMPLE_MS", "x"),
        ]));
        assert_eq!(c.base, DEPTH_KERNELS);
        assert_eq!((c.every_steps, c.window_steps), (Some(200), 3));
        assert!((c.budget - 0.01).abs() < 1e-12);
        assert_eq!(c.domains, LaunchDomains::Runtime);
        assert_eq!(c.window_ms, 100);
        assert_eq!(bad, [("SLO_PROBE_SAMPLE_MS".to_string(), "x".to_string())]);
        let (c, _) = Config::from_env(env(&[("SLO_PROBE_DIAGNOSTIC", "1")]));
        assert_eq!(c.base, DEPTH_NODES);
        let (c, _) = Config::from_env(env(&[("SLO_PROBE_SAMPLE", "0")]));
        assert!(!c.sampling);
        let (c, bad) = Config::from_env(env(&[
            ("SLO_PROBE_HOLD_LAG_MS", "20"),
            ("SLO_PROBE_HOLD_MAX_PCT", "-1"),
            ("SLO_PROBE_HOLD_AT_START", "no"),
        ]));
        assert_eq!(c.hold_lag_ns, 20 * MS);
        assert!((c.hold_max_share - 0.08).abs() < 1e-12);
        assert!(c.hold_at_start);
        assert_eq!(bad.len(), 2);
        let (c, _) = Config::from_env(env(&[("SLO_PROBE_HOLD_AT_START", "0")]));
        assert!(!c.hold_at_start);
        assert!(Config::default().graph_floor);
        let (c, bad) = Config::from_env(env(&[("SLO_PROBE_GRAPH_FLOOR", "0")]));
        assert!(!c.graph_floor && bad.is_empty());
        let (c, bad) = Config::from_env(env(&[("SLO_PROBE_GRAPH_FLOOR", "off")]));
        assert!(c.graph_floor);
        assert_eq!(bad.len(), 1);
        assert!(!Config::default().graph_nodes);
        let (c, bad) = Config::from_env(env(&[("SLO_PROBE_GRAPH_NODES", "1")]));
        assert!(c.graph_nodes && bad.is_empty());
        let (c, bad) = Config::from_env(env(&[("SLO_PROBE_GRAPH_NODES", "yes")]));
        assert!(!c.graph_nodes);
        assert_eq!(bad.len(), 1);
    }

    #[test]
    fn depth_zero_goes_quiet_unless_turned_off() {
        let quiet = |v: &str| {
            let (c, bad) = Config::from_env(env(&[("SLO_PROBE_QUIET_IDLE", v)]));
            (c.quiet_idle, bad.is_empty())
        };
        assert!(Config::default().quiet_idle, "on by default");
        assert_eq!(quiet("0"), (false, true));
        assert_eq!(quiet("FALSE"), (false, true));
        assert_eq!(quiet("1"), (true, true));
        assert_eq!(quiet("sometimes"), (true, false));
    }

    /// A job's first observation (at 1 s, the GPU `lag_ns` behind its launches) and a planner
    /// started then.
    fn at_start(lag_ns: u64, cfg: Config) -> (Observed, Planner) {
        let o = Observed {
            now_ns: SEC,
            gpu_lag_ns: lag_ns,
            ..Default::default()
        };
        let p = Planner::new(cfg, o.now_ns);
        (o, p)
    }

    /// Windows only: no hold at the start.
    fn windows_first() -> Config {
        Config {
            hold_at_start: false,
            ..Config::default()
        }
    }

    /// A simulated launch-bound job: 400 kernels per 8 ms step; with kernels traced each launch
    /// costs the shim 0.7 µs in its callback and CUPTI what the planner assumes (4 µs, as
    /// calibrated on the H200). The planner keeps the average under the 0.5% budget and samples
    /// regularly.
    struct Job {
        o: Observed,
        step_ns: u64,
        kernels: u64,
        callback_per_launch: u64,
        cupti_per_launch: u64,
        extra_ns: u64,
        total_ns: u64,
        sampled: u64,
        /// CUDA-graph launches per step (counted at every depth).
        graphs: u64,
    }

    impl Job {
        fn new(step_ns: u64, kernels: u64) -> Self {
            Self {
                o: Observed {
                    now_ns: SEC,
                    ..Default::default()
                },
                step_ns,
                kernels,
                callback_per_launch: 700,
                cupti_per_launch: SHIM_COST_PER_KERNEL_RECORD_NS,
                extra_ns: 0,
                total_ns: 0,
                sampled: 0,
                graphs: 0,
            }
        }

        /// Runs one step at `depth`.
        fn step(&mut self, depth: u32) {
            let mut t = self.step_ns;
            if depth >= DEPTH_KERNELS {
                let cb = self.kernels * self.callback_per_launch;
                let extra = cb + self.kernels * self.cupti_per_launch;
                t += extra;
                self.extra_ns += extra;
                self.o.callback_ns += cb;
                self.o.kernel_launches += self.kernels;
                self.o.kernel_records += self.kernels;
                self.sampled += 1;
            }
            self.o.graph_launches += self.graphs;
            self.total_ns += t;
            self.o.now_ns += t;
            self.o.steps += 1;
            self.o.last_step_ns = self.o.now_ns;
        }
    }

    /// Drives a planner as the flusher does: asks at every wake step or time, and at least every
    /// 200 ms.
    fn run(job: &mut Job, p: &mut Planner, steps: u64) -> Vec<(u64, u32)> {
        let mut changes = Vec::new();
        let mut plan = p.plan(&job.o);
        let mut last_tick = job.o.now_ns;
        for _ in 0..steps {
            job.step(plan.depth);
            let tick = job.o.now_ns >= last_tick + 200 * MS;
            let woke = plan.wake_step.is_some_and(|s| job.o.steps >= s)
                || plan.wake_ns.is_some_and(|t| job.o.now_ns >= t);
            if tick || woke {
                last_tick = job.o.now_ns;
                let before = plan.depth;
                plan = p.plan(&job.o);
                if plan.depth != before {
                    changes.push((job.o.steps, plan.depth));
                }
            }
        }
        changes
    }

    #[test]
    fn launch_bound_job_stays_within_budget() {
        let mut job = Job::new(8 * MS, 400);
        let mut p = Planner::new(Config::default(), job.o.now_ns);
        assert_eq!(p.plan(&job.o).depth, DEPTH_KERNELS, "traced from the start");
        let changes = run(&mut job, &mut p, 100_000);
        let share = job.extra_ns as f64 / (job.total_ns - job.extra_ns) as f64;
        assert!(share <= 0.005, "overhead {share:.4} over budget");
        assert!(
            share >= 0.003,
            "overhead {share:.4}: sampling far less than the budget allows"
        );
        // The opening hold ends at its first cost check (2 s of ~9.9 ms steps); the first
        // window opens 10 steps later and lasts 5 complete steps (6 step ends), then at least
        // MIN_DRAIN_NS (3 steps).
        let (off, depth) = changes[0];
        assert_eq!(depth, DEPTH_TIMING);
        assert!(
            (205..=217).contains(&off),
            "opening hold ended at step {off}"
        );
        assert_eq!(changes[1], (off + 10, DEPTH_KERNELS));
        assert_eq!(changes[2], (off + 19, DEPTH_TIMING));
        assert!(!p.held());
        // Windows keep coming: one every ~530 steps (9 traced steps × 1.88 ms / (80% of 0.5% ×
        // 8 ms)).
        let pub_ = p.published();
        assert!(!pub_.millis);
        assert!((500..=560).contains(&pub_.period), "period {}", pub_.period);
        assert!(job.sampled > 1_500, "{} sampled steps", job.sampled);
    }

    /// A job whose CPU runs 3 ms ahead of its 30 ms steps (under the hold threshold): a
    /// window stays open after its steps until the GPU ran what they launched, and no longer
    /// than that; a lag beyond MAX_DRAIN_NS is capped.
    #[test]
    fn a_window_stays_open_until_the_gpu_ran_its_steps() {
        let cfg = Config {
            hold_lag_ns: 0,
            ..Config::default()
        };
        let mut job = Job::new(30 * MS, 190);
        job.o.gpu_lag_ns = 150 * MS;
        let mut p = Planner::new(cfg.clone(), job.o.now_ns);
        let changes = run(&mut job, &mut p, 20_000);
        assert_eq!(changes[0], (10, DEPTH_KERNELS));
        // Six step ends, then five more steps (150 ms) for the queue to drain.
        assert_eq!(changes[1], (21, DEPTH_TIMING));
        let share = job.extra_ns as f64 / (job.total_ns - job.extra_ns) as f64;
        assert!(share <= 0.005, "overhead {share:.4} over budget");
        let mut job = Job::new(30 * MS, 190);
        job.o.gpu_lag_ns = 60 * SEC;
        let mut p = Planner::new(cfg, job.o.now_ns);
        let changes = run(&mut job, &mut p, 200);
        let open = changes[1].0 - changes[0].0;
        assert!(
            open <= 6 + MAX_DRAIN_NS / (30 * MS) + 1,
            "open for {open} steps"
        );
    }

    /// The eager transformer of the fault suite on the H200: 30 ms steps, the GPU 150 ms behind
    /// the launches. Kernel tracing is on from the start and stays on (no switch under the
    /// queue); when the job turns launch-bound (lag 0.2 ms), windows resume after
    /// UNHOLD_AFTER_NS, and the duty cycle keeps its budget. Without the opening hold, the
    /// first window measures the lag and holds.
    #[test]
    fn a_deep_queue_holds_kernel_tracing_on_until_it_drains() {
        let mut job = Job::new(30 * MS, 190);
        job.o.gpu_lag_ns = 150 * MS;
        let mut p = Planner::new(windows_first(), job.o.now_ns);
        let changes = run(&mut job, &mut p, 2_000);
        assert_eq!(
            changes,
            vec![(10, DEPTH_KERNELS)],
            "switched under the queue"
        );
        assert!(p.held());
        let mut job = Job::new(30 * MS, 190);
        job.o.gpu_lag_ns = 150 * MS;
        let mut p = Planner::new(Config::default(), job.o.now_ns);
        assert_eq!(p.plan(&job.o).depth, DEPTH_KERNELS);
        let changes = run(&mut job, &mut p, 2_000);
        assert_eq!(changes, vec![], "switched under the queue");
        assert_eq!(job.sampled, 2_000);
        assert!(p.held());
        let pub_ = p.published();
        assert_eq!((pub_.window, pub_.period), (0, 0), "held is not sampling");
        // The lag of a launch-bound phase: duty-cycled again 5 s later.
        job.o.gpu_lag_ns = 200_000;
        let at = job.o.steps;
        let changes = run(&mut job, &mut p, 3_000);
        assert!(!p.held());
        let (off, depth) = changes[0];
        assert_eq!(depth, DEPTH_TIMING);
        let waited = (off - at) * 30 * MS;
        assert!(
            (UNHOLD_AFTER_NS..UNHOLD_AFTER_NS + 2 * SEC).contains(&waited),
            "released after {waited} ns"
        );
        assert!(changes.len() > 4, "windows resumed: {changes:?}");
    }

    /// The same job with `drain_deep` (the shim's default): the deep queue is seen in the
    /// opening hold (after the first steps), and instead of holding, windows go on (the shim
    /// switches them at drained moments); from a window as well. A lowering by the agent
    /// lingers DEEP_LINGER_NS once so (a raise is as soon as asked).
    #[test]
    fn a_deep_queue_with_drain_deep_goes_on_with_windows() {
        for cfg in [Config::default(), windows_first()] {
            let cfg = Config {
                drain_deep: true,
                ..cfg
            };
            let mut job = Job::new(30 * MS, 190);
            job.o.gpu_lag_ns = 150 * MS;
            let mut p = Planner::new(cfg.clone(), job.o.now_ns);
            let changes = run(&mut job, &mut p, 2_000);
            assert!(p.drains(), "{cfg:?}");
            assert!(!p.held());
            assert!(changes.len() > 4, "windows: {changes:?}");
            assert!(job.sampled < 1_000, "{} of 2000 steps traced", job.sampled);
        }
        let cfg = Config {
            drain_deep: true,
            ..Config::default()
        };
        let mut job = Job::new(30 * MS, 190);
        job.o.gpu_lag_ns = 150 * MS;
        let mut p = Planner::new(cfg, job.o.now_ns);
        run(&mut job, &mut p, 2_000);
        p.request(
            Reason::Agent,
            DEPTH_KERNELS,
            DepthDuration::Tenths(30),
            &job.o,
        );
        assert_eq!(p.plan(&job.o).depth, DEPTH_KERNELS);
        p.request(
            Reason::Agent,
            DEPTH_TIMING,
            DepthDuration::UntilNext,
            &job.o,
        );
        assert_eq!(p.plan(&job.o).depth, DEPTH_KERNELS, "lingers");
        job.o.now_ns += DEEP_LINGER_NS;
        assert_eq!(
            p.plan(&job.o).depth,
            DEPTH_TIMING,
            "lingered DEEP_LINGER_NS"
        );
        // Without step markers (the kernels are the iteration clock), the hold stays.
        let (mut o, mut p) = at_start(
            150 * MS,
            Config {
                drain_deep: true,
                ..Config::default()
            },
        );
        for _ in 0..400 {
            let depth = p.plan(&o).depth;
            o.now_ns += 200 * MS;
            o.kernel_launches += 1_000;
            if depth >= DEPTH_KERNELS {
                o.kernel_records += 1_000;
            }
        }
        assert!(p.held() && !p.drains(), "80 s without markers");
        assert!(!p.mem_with_kernels());
        // Without drained switching, a lowering is at once.
        let mut job = Job::new(30 * MS, 190);
        let mut p = Planner::new(Config::default(), job.o.now_ns);
        run(&mut job, &mut p, 2_000);
        p.request(
            Reason::Agent,
            DEPTH_KERNELS,
            DepthDuration::Tenths(30),
            &job.o,
        );
        p.request(
            Reason::Agent,
            DEPTH_TIMING,
            DepthDuration::UntilNext,
            &job.o,
        );
        assert!(!p.drains());
        let plan = p.plan(&job.o);
        assert!(plan.depth == DEPTH_TIMING || p.window.is_some(), "{plan:?}");
    }

    /// A hold that would cost more than `hold_max_share` (400 launches per 8 ms step with a deep
    /// queue: ~10% estimated) ends after its first cost check, and none starts again for
    /// NO_HOLD_AFTER_COST_NS: the job is not slowed to keep records.
    #[test]
    fn a_costly_hold_ends_and_the_duty_cycle_keeps_its_budget() {
        let mut job = Job::new(8 * MS, 400);
        job.o.gpu_lag_ns = 150 * MS;
        let mut p = Planner::new(windows_first(), job.o.now_ns);
        run(&mut job, &mut p, 20);
        assert!(p.held());
        run(&mut job, &mut p, 400);
        assert!(!p.held(), "held at ~10% cost");
        let before = job.extra_ns;
        let (t0, w0) = (job.total_ns, p.windows());
        run(&mut job, &mut p, 50_000);
        assert!(!p.held());
        // Each window drains the 150 ms queue (19 more steps): a period of ~1,300 steps.
        assert!(
            p.windows() > w0 + 30,
            "windows: {w0} then {}, {:?}",
            p.windows(),
            p.published()
        );
        let share =
            (job.extra_ns - before) as f64 / (job.total_ns - t0 - (job.extra_ns - before)) as f64;
        assert!(share <= 0.005, "overhead {share:.4} after the hold");
    }

    /// The lag only counts once the window's own kernel records arrived: a window whose
    /// records have not come back yet stays open (at most MAX_DRAIN_NS past its steps) instead
    /// of switching off on a stale lag of 0.
    #[test]
    fn a_window_waits_for_its_records_before_judging_the_queue() {
        let mut p = Planner::new(windows_first(), SEC);
        let mut o = Observed {
            now_ns: SEC,
            ..Default::default()
        };
        let step = |o: &mut Observed, records: u64| {
            o.now_ns += 30 * MS;
            o.steps += 1;
            o.last_step_ns = o.now_ns;
            o.kernel_records += records;
        };
        for _ in 0..10 {
            step(&mut o, 0);
            p.plan(&o);
        }
        assert_eq!(p.plan(&o).depth, DEPTH_KERNELS);
        // Its six steps end with no record back yet and no lag known: still open.
        for _ in 0..8 {
            step(&mut o, 0);
            assert_eq!(p.plan(&o).depth, DEPTH_KERNELS);
        }
        // Its records arrive and say the GPU is 150 ms behind: held.
        o.gpu_lag_ns = 150 * MS;
        step(&mut o, 900);
        assert_eq!(p.plan(&o).depth, DEPTH_KERNELS);
        assert!(p.held());
        // No record at all for MAX_DRAIN_NS, and nothing launched: judged on what is known
        // (lag 0), the window drains and closes.
        let mut p = Planner::new(windows_first(), SEC);
        let mut o = Observed {
            now_ns: SEC,
            ..Default::default()
        };
        let mut depths = Vec::new();
        for _ in 0..120 {
            step(&mut o, 0);
            depths.push(p.plan(&o).depth);
        }
        assert!(!p.held());
        // The first window: from its opening to its first switch off.
        let on = depths
            .iter()
            .skip_while(|&&d| d != DEPTH_KERNELS)
            .take_while(|&&d| d == DEPTH_KERNELS)
            .count() as u64;
        assert!(
            (6..=6 + MAX_DRAIN_NS / (30 * MS) + 2).contains(&on),
            "{on} steps at kernels"
        );
    }

    /// Launches whose records never come back: a window that waited MAX_DRAIN_NS for them
    /// holds (switching again strands more); a hold that brings nothing back for NO_RECORDS_NS
    /// ends, the opening one too, and no hold starts for NO_HOLD_AFTER_COST_NS.
    #[test]
    fn launches_without_records_hold_then_give_up() {
        let step = |o: &mut Observed, depth: u32| {
            o.now_ns += 30 * MS;
            o.steps += 1;
            o.last_step_ns = o.now_ns;
            if depth >= DEPTH_KERNELS {
                o.kernel_launches += 190;
            }
        };
        let (mut o, mut p) = at_start(0, windows_first());
        let mut depth = p.plan(&o).depth;
        let mut held_at = None;
        for i in 0..3_000 {
            step(&mut o, depth);
            depth = p.plan(&o).depth;
            if p.held() && held_at.is_none() {
                held_at = Some(i);
            }
        }
        // Window at step 10, six step ends, then MAX_DRAIN_NS (67 steps) of waiting.
        let at = held_at.expect("held");
        assert!((80..=90).contains(&at), "held at step {at}");
        assert!(!p.held(), "still held without records");
        assert!(p.no_hold_until > o.now_ns, "a new hold may start");
        // The opening hold gives up the same way.
        let (mut o, mut p) = at_start(0, Config::default());
        let mut depth = p.plan(&o).depth;
        let mut released = None;
        for i in 0..3_000 {
            step(&mut o, depth);
            depth = p.plan(&o).depth;
            if !p.held() && released.is_none() {
                released = Some(i);
            }
        }
        let at = released.expect("released");
        let t = NO_RECORDS_NS / (30 * MS);
        assert!((t - 2..=t + 40).contains(&at), "released at step {at}");
    }

    /// A job without step markers under a deep queue: held on although the hold's estimated
    /// cost (2,000 launches per 200 ms at 4.7 µs each: ~5%) passes a 2% budget, since its
    /// copies are its iteration clock and the CPU's time is spent waiting on a full queue; on a
    /// queue shallow from the start, the same cost ends the opening hold after UNHOLD_AFTER_NS.
    #[test]
    fn a_hold_without_markers_under_a_deep_queue_does_not_end_on_its_cost() {
        let cfg = Config {
            hold_max_share: 0.02,
            ..Config::default()
        };
        let (mut o, mut p) = at_start(40 * MS, cfg);
        let step = |p: &mut Planner, o: &mut Observed| {
            let depth = p.plan(o).depth;
            o.now_ns += 200 * MS;
            o.kernel_launches += 2_000;
            o.callback_ns += 2_000 * 700;
            if depth >= DEPTH_KERNELS {
                o.kernel_records += 2_000;
            }
            depth
        };
        let depths: Vec<u32> = (0..600).map(|_| step(&mut p, &mut o)).collect();
        assert!(p.held(), "the hold ended under a 40 ms queue");
        assert!(depths.iter().all(|&d| d == DEPTH_KERNELS), "switched");
        // A shallow queue from the start (a launch-bound job, or one building its model): in
        // the opening hold (whose shallow end waits OPENING_HOLD_MAX_NS without markers) the
        // cost ends it once the queue has stayed shallow for UNHOLD_AFTER_NS, not at the first
        // cost check; the same job at a cost within the budget stays held.
        for (share, ends) in [(0.02, true), (0.5, false)] {
            let (mut o, mut p) = at_start(
                MS,
                Config {
                    hold_max_share: share,
                    ..Config::default()
                },
            );
            for _ in 0..20 {
                step(&mut p, &mut o);
            }
            assert!(p.held(), "ended 4 s into a shallow queue (budget {share})");
            for _ in 0..20 {
                step(&mut p, &mut o);
            }
            assert_eq!(
                !p.held(),
                ends,
                "after 8 s of a shallow queue (budget {share})"
            );
        }
    }

    /// A job under CUDA graphs: its kernels run inside graphs, which `GRAPH_TRACE` records at
    /// every depth, and a few eager launches per step whose kernel records do not come back
    /// yet. The graph records show that CUPTI hands records over and how deep the queue is, so
    /// the opening hold does not end as barren after NO_RECORDS_NS (which would start the duty
    /// cycle switching kernel activity under the queue).
    #[test]
    fn graph_records_keep_a_hold_under_a_deep_queue() {
        let (mut o, mut p) = at_start(40 * MS, Config::default());
        let mut depths = Vec::new();
        for _ in 0..3_000 {
            o.now_ns += 30 * MS;
            o.steps += 1;
            o.last_step_ns = o.now_ns;
            o.kernel_launches += 20;
            o.graph_records += 2;
            depths.push(p.plan(&o).depth);
        }
        assert!(p.held(), "the hold ended under a 40 ms queue");
        assert!(depths.iter().all(|&d| d == DEPTH_KERNELS), "switched");
        // The same job without graph records: barren after NO_RECORDS_NS.
        let (mut o, mut p) = at_start(40 * MS, Config::default());
        for _ in 0..3_000 {
            o.now_ns += 30 * MS;
            o.steps += 1;
            o.last_step_ns = o.now_ns;
            o.kernel_launches += 20;
            p.plan(&o);
        }
        assert!(!p.held());
    }

    /// A job that compiles eagerly for a while (windows come and go), then replays CUDA graphs
    /// with a few kernels outside them (the optimizer step of `reduce-overhead`): from its first
    /// graph launch kernel tracing stays on, without a switch off, and no window is published.
    #[test]
    fn cuda_graphs_pin_kernel_tracing_on() {
        let mut job = Job::new(5 * MS, 20);
        let mut p = Planner::new(windows_first(), job.o.now_ns);
        let before = run(&mut job, &mut p, 3_000);
        assert!(
            before.iter().any(|&(_, d)| d == DEPTH_TIMING) && p.windows() > 2,
            "eager steps are duty-cycled: {before:?}"
        );
        assert!(!p.pinned());
        job.graphs = 1;
        let first_graph = job.o.steps;
        let sampled = job.sampled;
        let after = run(&mut job, &mut p, 20_000);
        assert!(p.pinned(), "the pin ended at {:.1}% cost", 20.0 * 4.7 / 5.0);
        // At most the raise (if the first graph launch came between windows), then nothing.
        assert!(after.len() <= 1, "switched under graphs: {after:?}");
        assert!(after.iter().all(|&(_, d)| d == DEPTH_KERNELS));
        // Every step after the first plan that saw the graph launch is traced.
        assert!(
            job.sampled - sampled >= 20_000 - 2 * 40,
            "{} traced",
            job.sampled - sampled
        );
        assert!(after.first().is_none_or(|&(s, _)| s <= first_graph + 40));
        let published = p.published();
        assert_eq!((published.window, published.period), (0, 0));
    }

    /// The pin on a job that launches many kernels outside its graphs (27% of its time to
    /// trace at 4.7 µs a kernel) ends at the first cost check, for good: windows again.
    #[test]
    fn a_costly_pin_ends_for_good() {
        let mut job = Job::new(5 * MS, 300);
        job.graphs = 1;
        let mut p = Planner::new(windows_first(), job.o.now_ns);
        let changes = run(&mut job, &mut p, 20_000);
        assert!(!p.pinned());
        assert!(
            changes.iter().filter(|&&(_, d)| d == DEPTH_TIMING).count() > 3,
            "{changes:?}"
        );
        let share = job.extra_ns as f64 / (job.total_ns - job.extra_ns) as f64;
        assert!(share <= 0.01, "overhead {share:.4}");
    }

    /// `SLO_PROBE_GRAPH_FLOOR=0`: graph jobs are duty-cycled as eager ones.
    #[test]
    fn without_the_graph_floor_graph_jobs_get_windows() {
        let mut job = Job::new(5 * MS, 20);
        job.graphs = 1;
        let cfg = Config {
            graph_floor: false,
            ..windows_first()
        };
        let mut p = Planner::new(cfg, job.o.now_ns);
        let changes = run(&mut job, &mut p, 20_000);
        assert!(!p.pinned());
        assert!(changes.iter().filter(|&&(_, d)| d == DEPTH_TIMING).count() > 3);
    }

    /// A graph job, pinned, then the agent's request for node level for 1 s: the plan at once,
    /// and the depth changes after it.
    fn node_request_under_the_pin(graph_nodes: bool) -> (Planner, Plan, Vec<(u64, u32)>) {
        let mut job = Job::new(5 * MS, 20);
        let cfg = Config {
            graph_nodes,
            ..windows_first()
        };
        let mut p = Planner::new(cfg, job.o.now_ns);
        // Eager so far: node level is given.
        p.request(
            Reason::Script,
            DEPTH_NODES,
            DepthDuration::Tenths(1),
            &job.o,
        );
        assert_eq!(p.plan(&job.o).depth, DEPTH_NODES);
        p.request(
            Reason::Script,
            DEPTH_TIMING,
            DepthDuration::UntilNext,
            &job.o,
        );
        job.graphs = 1;
        run(&mut job, &mut p, 100);
        assert!(p.pinned() && !p.nodes_refused());
        p.request(
            Reason::Agent,
            DEPTH_NODES,
            DepthDuration::Tenths(10),
            &job.o,
        );
        let plan = p.plan(&job.o);
        let changes = run(&mut job, &mut p, 1_000);
        assert_eq!(p.plan(&job.o).reason, Reason::Sample);
        (p, plan, changes)
    }

    /// Once the process launches CUDA graphs, a request for node level gets kernel level (the
    /// switch back from node level crashed a job in graph replay): no depth change at all under
    /// the pin, and said once.
    #[test]
    fn node_level_is_not_switched_under_cuda_graphs() {
        let (p, plan, changes) = node_request_under_the_pin(false);
        assert_eq!((plan.depth, plan.reason), (DEPTH_KERNELS, Reason::Agent));
        assert!(p.nodes_refused());
        assert!(changes.is_empty(), "{changes:?}");
    }

    /// With `SLO_PROBE_GRAPH_NODES=1` the agent raises the depth to graph nodes under the pin;
    /// when its request ends the depth goes back to kernels, not to timing.
    #[test]
    fn a_request_under_the_pin_returns_to_kernels() {
        let (p, plan, changes) = node_request_under_the_pin(true);
        assert_eq!((plan.depth, plan.reason), (DEPTH_NODES, Reason::Agent));
        assert!(!p.nodes_refused());
        assert_eq!(changes, [(changes[0].0, DEPTH_KERNELS)], "{changes:?}");
    }

    /// torch.compile under `reduce-overhead`: 30 s of compiling before the first step (a few
    /// eager kernels, a shallow queue), then CUDA graphs. The opening hold lasts through the
    /// compilation and the graph pin takes over from it: kernel activity is never switched off.
    #[test]
    fn a_compiling_job_is_held_until_its_graphs_pin_tracing() {
        let (mut o, mut p) = at_start(100_000, Config::default());
        let mut depths = Vec::new();
        for _ in 0..150 {
            o.now_ns += 200 * MS;
            o.kernel_launches += 5;
            o.kernel_records += 5;
            o.callback_ns += 5 * 700;
            depths.push(p.plan(&o).depth);
        }
        assert!(p.held(), "the opening hold ended during compilation");
        for _ in 0..2_000 {
            o.now_ns += 20 * MS;
            o.steps += 1;
            o.last_step_ns = o.now_ns;
            o.graph_launches += 1;
            o.graph_records += 1;
            o.kernel_launches += 8;
            o.kernel_records += 8;
            o.callback_ns += 8 * 700;
            depths.push(p.plan(&o).depth);
        }
        assert!(p.pinned());
        assert!(depths.iter().all(|&d| d == DEPTH_KERNELS), "switched");
        // Without markers or graphs, the opening hold on a shallow queue ends after
        // OPENING_HOLD_MAX_NS.
        let (mut o, mut p) = at_start(100_000, Config::default());
        let mut ended = None;
        for _ in 0..600 {
            o.now_ns += 200 * MS;
            o.kernel_launches += 5;
            o.kernel_records += 5;
            if p.plan(&o).depth == DEPTH_TIMING && ended.is_none() {
                ended = Some(o.now_ns - SEC);
            }
        }
        let ended = ended.expect("the opening hold never ended");
        assert!(
            (OPENING_HOLD_MAX_NS..OPENING_HOLD_MAX_NS + SEC).contains(&ended),
            "{ended}"
        );
        assert!(
            !p.mem_with_kernels(),
            "without markers memory activity stays on: the iteration clock"
        );
    }

    /// A shallow queue (0.2 ms) that costs little: the opening hold ends after UNHOLD_AFTER_NS,
    /// and the first window comes 10 steps later.
    #[test]
    fn a_shallow_queue_ends_the_opening_hold() {
        let mut job = Job::new(10 * MS, 100);
        job.o.gpu_lag_ns = 200_000;
        let mut p = Planner::new(Config::default(), job.o.now_ns);
        let changes = run(&mut job, &mut p, 2_000);
        let (off, depth) = changes[0];
        assert_eq!(depth, DEPTH_TIMING);
        // Steps of ~10.2 ms.
        let steps = UNHOLD_AFTER_NS / (10 * MS);
        assert!(
            (steps * 9 / 10..=steps + 30).contains(&off),
            "opening hold ended at step {off}"
        );
        assert_eq!(changes[1], (off + 10, DEPTH_KERNELS));
        assert!(!p.held());
        assert!(p.mem_with_kernels(), "the queue was measured shallow");
    }

    /// Memory activity goes with kernel activity once a hold ended on a queue measured shallow
    /// (a launch-bound job's opening hold, ended on its cost), never where the hold ended on its
    /// cost under a deep queue (a job with step markers and drained switching off; without
    /// markers such a hold does not end on its cost): there switching it would strand records.
    #[test]
    fn memory_activity_goes_with_kernels_once_the_queue_is_known_shallow() {
        let mut job = Job::new(8 * MS, 400);
        let mut p = Planner::new(Config::default(), job.o.now_ns);
        assert!(!p.mem_with_kernels(), "nothing measured at the start");
        let changes = run(&mut job, &mut p, 1_000);
        assert_eq!(changes[0].1, DEPTH_TIMING, "the opening hold ended");
        assert!(p.mem_with_kernels() && !p.drains());
        // A deep queue (150 ms), steps marked, no drained switching, a hold that costs 20% of
        // the time: it ends on its cost, the queue still deep.
        let mut o = Observed {
            now_ns: SEC,
            gpu_lag_ns: 150 * MS,
            ..Default::default()
        };
        let cfg = Config {
            drain_deep: false,
            ..Config::default()
        };
        let mut p = Planner::new(cfg, o.now_ns);
        let mut ended = false;
        for _ in 0..100 {
            let depth = p.plan(&o).depth;
            ended |= depth == DEPTH_TIMING;
            o.now_ns += 200 * MS;
            o.steps += 1;
            o.last_step_ns = o.now_ns;
            o.kernel_launches += 1_000;
            if depth >= DEPTH_KERNELS {
                o.kernel_records += 1_000;
                o.callback_ns += 40 * MS;
            }
        }
        assert!(ended, "the hold never ended on its cost");
        assert!(!p.mem_with_kernels() && !p.drains());
    }

    #[test]
    fn depth_zero_may_go_quiet_between_windows_of_a_marked_job_without_graphs() {
        let mut job = Job::new(8 * MS, 400);
        let mut p = Planner::new(Config::default(), job.o.now_ns);
        assert!(
            !p.may_quiet(&job.o),
            "the opening hold: nothing measured yet"
        );
        let mut quiet_at = 0;
        let mut plan = p.plan(&job.o);
        for _ in 0..2_000 {
            job.step(plan.depth);
            plan = p.plan(&job.o);
            if p.may_quiet(&job.o) {
                assert_eq!(plan.depth, DEPTH_TIMING, "quiet only at depth 0");
                quiet_at += 1;
            }
        }
        assert!(p.windows() > 3, "{}", p.windows());
        assert!(
            quiet_at > 1_500,
            "quiet between windows: {quiet_at} of 2000 steps"
        );
        // The same job once it has launched a CUDA graph: never quiet again.
        job.graphs = 1;
        for _ in 0..500 {
            job.step(plan.depth);
            plan = p.plan(&job.o);
            assert!(!p.may_quiet(&job.o));
        }
        // Without step markers (the same steps, their clock from the records): never quiet.
        let (mut o, mut p) = at_start(0, Config::default());
        for _ in 0..2_000 {
            let depth = p.plan(&o).depth;
            assert!(!p.may_quiet(&o));
            o.now_ns += 8 * MS;
            o.kernel_launches += 400;
            if depth >= DEPTH_KERNELS {
                o.kernel_records += 400;
                o.callback_ns += 400 * 700;
            }
        }
    }

    #[test]
    fn gpu_bound_and_cheap_jobs_sample_more_often_but_not_faster_than_a_second() {
        // 100 kernels per 10 ms step: cost ~2% per traced step.
        let mut job = Job::new(10 * MS, 100);
        let mut p = Planner::new(Config::default(), job.o.now_ns);
        run(&mut job, &mut p, 50_000);
        let share = job.extra_ns as f64 / (job.total_ns - job.extra_ns) as f64;
        assert!(share <= 0.005, "{share}");
        // 1 ms steps with 2 kernels: a window costs almost nothing; at most one a second.
        let mut job = Job::new(MS, 2);
        let mut p = Planner::new(Config::default(), job.o.now_ns);
        run(&mut job, &mut p, 50_000);
        assert!(p.published().period >= 1_000, "{:?}", p.published());
    }

    #[test]
    fn fixed_period_from_env() {
        let cfg = Config {
            every_steps: Some(50),
            ..windows_first()
        };
        let mut job = Job::new(8 * MS, 400);
        let mut p = Planner::new(cfg, job.o.now_ns);
        let changes = run(&mut job, &mut p, 1_000);
        let starts: Vec<u64> = changes
            .iter()
            .filter(|c| c.1 == DEPTH_KERNELS)
            .map(|c| c.0)
            .collect();
        assert_eq!(&starts[..4], [10, 60, 110, 160]);
    }

    #[test]
    fn requests_win_and_expire() {
        let mut job = Job::new(8 * MS, 400);
        let cfg = Config {
            sampling: false,
            ..Config::default()
        };
        let mut p = Planner::new(cfg, job.o.now_ns);
        run(&mut job, &mut p, 20);
        assert_eq!(p.plan(&job.o).depth, DEPTH_TIMING);
        p.request(Reason::Agent, DEPTH_NODES, DepthDuration::Steps(20), &job.o);
        p.request(
            Reason::Script,
            DEPTH_KERNELS,
            DepthDuration::UntilNext,
            &job.o,
        );
        let plan = p.plan(&job.o);
        assert_eq!((plan.depth, plan.reason), (DEPTH_NODES, Reason::Agent));
        assert_eq!(plan.wake_step, Some(job.o.steps + 21));
        run(&mut job, &mut p, 21);
        let plan = p.plan(&job.o);
        assert_eq!((plan.depth, plan.reason), (DEPTH_KERNELS, Reason::Script));
        p.request(
            Reason::Script,
            DEPTH_TIMING,
            DepthDuration::UntilNext,
            &job.o,
        );
        let plan = p.plan(&job.o);
        assert_eq!((plan.depth, plan.reason), (DEPTH_TIMING, Reason::Default));
        // 100 ms units.
        p.request(
            Reason::Agent,
            DEPTH_KERNELS,
            DepthDuration::Tenths(5),
            &job.o,
        );
        assert_eq!(p.plan(&job.o).wake_ns, Some(job.o.now_ns + 500 * MS));
        job.o.now_ns += 500 * MS;
        assert_eq!(p.plan(&job.o).depth, DEPTH_TIMING);
    }

    #[test]
    fn a_request_during_a_window_takes_over_without_measuring() {
        let mut job = Job::new(8 * MS, 400);
        let mut p = Planner::new(windows_first(), job.o.now_ns);
        run(&mut job, &mut p, 12);
        assert_eq!(p.plan(&job.o).reason, Reason::Sample);
        p.request(
            Reason::Agent,
            DEPTH_KERNELS,
            DepthDuration::Steps(3),
            &job.o,
        );
        let plan = p.plan(&job.o);
        assert_eq!((plan.depth, plan.reason), (DEPTH_KERNELS, Reason::Agent));
        assert_eq!(p.published().period, 0, "no window was measured");
    }

    #[test]
    fn a_window_due_during_a_request_opens_when_it_ends() {
        let cfg = Config {
            every_steps: Some(50),
            ..windows_first()
        };
        let mut job = Job::new(8 * MS, 400);
        let mut p = Planner::new(cfg, job.o.now_ns);
        run(&mut job, &mut p, 55);
        // The script holds kernels from step 55 to 66; the window due at 60 waits.
        p.request(
            Reason::Script,
            DEPTH_KERNELS,
            DepthDuration::Steps(10),
            &job.o,
        );
        let changes = run(&mut job, &mut p, 20);
        let plan = p.plan(&job.o);
        assert_eq!(plan.reason, Reason::Default, "{changes:?}");
        assert_eq!(p.windows(), 2, "the deferred window opened");
        // Released for a while: a window due meanwhile opens when tracing resumes.
        p.interrupted(&job.o);
        job.o.steps += 60;
        job.o.now_ns += 60 * 8 * MS;
        job.o.last_step_ns = job.o.now_ns;
        assert_eq!(p.plan(&job.o).reason, Reason::Sample);
    }

    #[test]
    fn base_depth_disables_sampling() {
        let cfg = Config {
            base: DEPTH_KERNELS,
            ..Config::default()
        };
        let mut job = Job::new(8 * MS, 400);
        let mut p = Planner::new(cfg, job.o.now_ns);
        let changes = run(&mut job, &mut p, 1_000);
        assert!(changes.is_empty());
        assert_eq!(job.sampled, 1_000);
        assert_eq!(p.published().period, 0);
        assert_eq!(p.plan(&job.o).reason, Reason::Default);
    }

    #[test]
    fn without_markers_windows_are_timed() {
        let (mut o, mut p) = at_start(0, windows_first());
        let plan = p.plan(&o);
        assert_eq!(plan.depth, DEPTH_TIMING);
        assert_eq!(plan.wake_ns, Some(3 * SEC));
        o.now_ns = 3 * SEC;
        let plan = p.plan(&o);
        assert_eq!((plan.depth, plan.reason), (DEPTH_KERNELS, Reason::Sample));
        assert_eq!(plan.wake_ns, Some(3 * SEC + 100 * MS));
        // 100 ms of a launch-bound job: 5000 launches, 23.5 ms of cost (0.7 µs callback and
        // 4 µs CUPTI each).
        o.now_ns += 100 * MS;
        o.callback_ns += 5_000 * 700;
        o.kernel_launches += 5_000;
        o.kernel_records += 5_000;
        let plan = p.plan(&o);
        assert_eq!(plan.depth, DEPTH_TIMING);
        let pub_ = p.published();
        assert!(pub_.millis);
        // 23.5 ms / (80% of 0.5%) = 5.875 s.
        assert_eq!(pub_.period, 5_875);
        assert_eq!(plan.wake_ns, Some(3 * SEC + 5_875 * MS));
        // Markers appear: sampling switches to steps.
        o.steps = 1;
        o.last_step_ns = o.now_ns;
        let plan = p.plan(&o);
        assert!(!p.published().millis);
        assert_eq!(plan.wake_step, Some(10));
    }

    #[test]
    fn domain_chooser_probes_then_keeps_what_matched() {
        let mut d = DomainChooser::new(LaunchDomains::Auto);
        assert_eq!(d.at_raise((0, 0)), DRIVER | RUNTIME);
        // The probe window saw nothing: probe again.
        assert_eq!(d.at_raise((0, 0)), DRIVER | RUNTIME);
        // Kernel records matched driver stamps only.
        assert_eq!(d.at_raise((400, 0)), DRIVER);
        for _ in 0..DomainChooser::REPROBE_EVERY - 1 {
            assert_eq!(d.at_raise((400, 0)), DRIVER);
        }
        assert_eq!(d.at_raise((400, 0)), DRIVER | RUNTIME, "re-probe");
        assert_eq!(d.at_raise((800, 300)), DRIVER | RUNTIME);
        assert_eq!(
            DomainChooser::new(LaunchDomains::Runtime).at_raise((5, 5)),
            RUNTIME
        );
    }
}
