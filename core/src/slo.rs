//! The SLO tree: what a training job promises (iteration latency, GPU utilisation,
//! communication jitter, data loading, host pressure per thread role), measured over windows,
//! judged against thresholds that the job's own healthy windows calibrate, with violations
//! detected over consecutive windows and attributed to an operator and a cause.
//!
//! Time is cut into tumbling windows of [`SloSpec::window_ns`] (by iteration end time). Per
//! window and node the engine computes one value ([`Stat`] of the node's [`Metric`]; iteration
//! metrics from an HDR histogram of the window's iterations, host metrics as rates from the
//! host counters' growth over the window) and judges it against the node's threshold:
//!
//! - an explicit `threshold` in the config is the user's objective and always applies;
//! - otherwise the seed's `default_threshold` applies until a baseline is learned (the median
//!   of the first [`SloSpec::learn_windows`] windows after [`SloSpec::warmup_iterations`]),
//!   and from then on `baseline × (1 ± tolerance)`, at least `floor` away from the baseline —
//!   so a job with 1.6 ms steps is judged against its own 1.6 ms, not a 1200 ms default. The
//!   baseline then follows healthy windows slowly.
//!
//! A violation opens after [`SloSpec::breach_windows`] consecutive breaching windows (never on
//! a default threshold during learning) and closes after [`SloSpec::clear_windows`]
//! consecutive windows back within the threshold by a 5% margin (hysteresis). Its severity is
//! critical when the value is 1.5× past the threshold, else a warning. Compliance is the share of windows meeting the threshold over
//! [`SloSpec::compliance_windows`]; the burn rate is the share missing over the last
//! [`SloSpec::burn_windows`], divided by the budget `1 − target`. The job's score is the
//! weighted compliance of its nodes.
//!
//! When a violation opens or stays open, the breaching windows' [`Profile`] is compared with
//! the profile of the last healthy windows ([`attribute`]), and the chain from the SLO to the
//! operator to the host cause is kept with the violation.

use std::collections::VecDeque;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::{
    attribution::{attribute, Attribution, Profile},
    gputrace::Iteration,
    host::{HostHistory, HostSample},
    roles::Role,
};

/// What a node measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Iteration wall time, ms.
    IterationTime,
    /// Share of an iteration's wall time with the GPU busy, %.
    GpuUtilisation,
    /// GPU time of an iteration's communication kernels, ms.
    CommTime,
    /// GPU idle time before an iteration's first activity (waiting for data), ms.
    HostWait,
    /// GPU idle time between an iteration's first and last activity, ms.
    LaunchGaps,
    /// Run-queue wait of the `role`'s threads, ms per second.
    RunqueueDelay,
    /// CPU throttling of the job's cgroups, ms per second.
    Throttling,
    /// TCP retransmits of the `role`'s connections (all of the job's without a role), per
    /// second.
    Retransmits,
}

impl Metric {
    /// Whether it is measured per iteration (else as a rate over the window).
    pub fn per_iteration(self) -> bool {
        matches!(
            self,
            Self::IterationTime
                | Self::GpuUtilisation
                | Self::CommTime
                | Self::HostWait
                | Self::LaunchGaps
        )
    }

    /// The unit of values and thresholds.
    pub fn unit(self) -> &'static str {
        match self {
            Self::IterationTime | Self::CommTime | Self::HostWait | Self::LaunchGaps => "ms",
            Self::GpuUtilisation => "%",
            Self::RunqueueDelay | Self::Throttling => "ms/s",
            Self::Retransmits => "/s",
        }
    }

    /// The name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IterationTime => "iteration_time",
            Self::GpuUtilisation => "gpu_utilisation",
            Self::CommTime => "comm_time",
            Self::HostWait => "host_wait",
            Self::LaunchGaps => "launch_gaps",
            Self::RunqueueDelay => "runqueue_delay",
            Self::Throttling => "throttling",
            Self::Retransmits => "retransmits",
        }
    }

    /// Multiplier from the unit to what the histogram records (µs for ms, 0.01% for %).
    fn scale(self) -> f64 {
        match self {
            Self::GpuUtilisation => 100.0,
            _ => 1000.0,
        }
    }

    /// The value of one iteration, in the unit.
    fn of(self, it: &Iteration) -> f64 {
        let ms = |ns: u64| ns as f64 / 1e6;
        match self {
            Self::IterationTime => ms(it.wall_ns()),
            Self::GpuUtilisation => 100.0 * it.gpu_busy_ns as f64 / it.wall_ns().max(1) as f64,
            Self::CommTime => ms(it.comm_ns),
            Self::HostWait => ms(it.idle_before_first_ns),
            Self::LaunchGaps => ms(it.gaps_ns),
            _ => 0.0,
        }
    }
}

/// Which statistic of the window a node judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stat {
    /// Median.
    P50,
    /// 99th percentile.
    P99,
    /// Mean.
    Mean,
    /// P99 − P50.
    Jitter,
    /// Per second (host metrics).
    Rate,
}

impl Stat {
    /// The name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::P50 => "p50",
            Self::P99 => "p99",
            Self::Mean => "mean",
            Self::Jitter => "jitter",
            Self::Rate => "rate",
        }
    }
}

/// Which side of the threshold is good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Good below the threshold.
    Below,
    /// Good above the threshold.
    Above,
}

/// One node of the tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Unique name.
    pub name: String,
    /// Parent node's name; empty: under the root, `job`.
    #[serde(default)]
    pub parent: String,
    /// What it measures.
    pub metric: Metric,
    /// Which statistic.
    pub stat: Stat,
    /// Which side is good.
    pub objective: Objective,
    /// The user's objective, in the metric's unit: always applies when set.
    #[serde(default)]
    pub threshold: Option<f64>,
    /// The seed's default, used until a baseline is learned.
    pub default_threshold: f64,
    /// Allowed relative change from the baseline once learned (0.2: 20% worse).
    pub tolerance: f64,
    /// Smallest change from the baseline that counts, in the unit (for baselines near 0).
    #[serde(default)]
    pub floor: f64,
    /// Weight in the job's score (0: diagnostic only).
    #[serde(default)]
    pub weight: f64,
    /// Compliance target: the share of windows that should meet the threshold.
    #[serde(default = "default_target")]
    pub target: f64,
    /// Thread role, for `runqueue_delay` and `retransmits`.
    #[serde(default)]
    pub role: Option<Role>,
}

fn default_target() -> f64 {
    0.99
}

/// The tree and its windows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloSpec {
    /// Window length, ms.
    pub window_ms: u64,
    /// Consecutive breaching windows that open a violation.
    pub breach_windows: u32,
    /// Consecutive good windows that close one.
    pub clear_windows: u32,
    /// Windows the baseline is learned from.
    pub learn_windows: u32,
    /// Iterations left out at the start (compilation, autotuning, warm-up).
    pub warmup_iterations: u32,
    /// Windows compliance is computed over.
    pub compliance_windows: u32,
    /// Windows the burn rate is computed over.
    pub burn_windows: u32,
    /// Windows the sliding P50/P99 of iteration metrics cover.
    pub slide_windows: u32,
    /// The nodes (the default tree when empty).
    #[serde(rename = "node")]
    pub nodes: Vec<NodeSpec>,
}

impl Default for SloSpec {
    fn default() -> Self {
        Self {
            window_ms: 10_000,
            breach_windows: 2,
            clear_windows: 3,
            learn_windows: 6,
            warmup_iterations: 20,
            compliance_windows: 360,
            burn_windows: 30,
            slide_windows: 6,
            nodes: Vec::new(),
        }
    }
}

/// The root's name.
pub const ROOT: &str = "job";

/// Why a spec is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SloSpecError(pub String);

impl SloSpec {
    /// The seed's tree (§4.1): iteration latency P99 < 1200 ms (weight 40%), GPU utilisation
    /// mean > 85% (35%), gradient-sync jitter P99 − P50 < 80 ms (25%); diagnostic nodes for the
    /// iteration median, launch gaps, data loading, run-queue delay of the main, loader and
    /// communication threads, cgroup throttling and TCP retransmits.
    #[rustfmt::skip]
    pub fn default_nodes() -> Vec<NodeSpec> {
        use Metric::*;
        use Objective::*;
        use Stat::*;
        let n = |name: &str, parent: &str, metric, stat, objective, default_threshold, tolerance,
                 floor, weight, role| NodeSpec {
            name: name.to_owned(),
            parent: parent.to_owned(),
            metric,
            stat,
            objective,
            threshold: None,
            default_threshold,
            tolerance,
            floor,
            weight,
            target: 0.99,
            role,
        };
        vec![
            // name                          parent       metric          stat    objective default tol   floor  weight role
            n("iteration",                   "",          IterationTime,  P99,    Below,   1200.0, 0.15, 0.2,   0.40, None),
            n("iteration.median",            "iteration", IterationTime,  P50,    Below,   1200.0, 0.10, 0.1,   0.0,  None),
            n("compute",                     "",          GpuUtilisation, Mean,   Above,   85.0,   0.10, 3.0,   0.35, None),
            n("compute.launch_gaps",         "compute",   LaunchGaps,     Mean,   Below,   100.0,  0.30, 0.2,   0.0,  None),
            n("communication",               "",          CommTime,       Jitter, Below,   80.0,   0.50, 1.0,   0.25, None),
            n("data_loading",                "",          HostWait,       Mean,   Below,   100.0,  0.50, 0.5,   0.0,  None),
            n("host.runqueue.main",          "",          RunqueueDelay,  Rate,   Below,   50.0,   1.0,  20.0,  0.0,  Some(Role::Main)),
            n("host.runqueue.data_loader",   "",          RunqueueDelay,  Rate,   Below,   200.0,  1.0,  50.0,  0.0,  Some(Role::DataLoader)),
            n("host.runqueue.communication", "",          RunqueueDelay,  Rate,   Below,   50.0,   1.0,  20.0,  0.0,  Some(Role::Communication)),
            n("host.throttling",             "",          Throttling,     Rate,   Below,   10.0,   1.0,  10.0,  0.0,  None),
            n("host.retransmits",            "",          Retransmits,    Rate,   Below,   1.0,    1.0,  20.0,  0.0,  Some(Role::Communication)),
        ]
    }

    /// The nodes in force: the configured ones, else [`SloSpec::default_nodes`].
    pub fn effective_nodes(&self) -> Vec<NodeSpec> {
        if self.nodes.is_empty() {
            Self::default_nodes()
        } else {
            self.nodes.clone()
        }
    }

    /// Window length, ns.
    pub fn window_ns(&self) -> u64 {
        self.window_ms * 1_000_000
    }

    /// Checks what serde cannot: names, parents, ranges, and metric/stat pairs.
    pub fn validate(&self) -> Result<(), SloSpecError> {
        let err = |s: String| Err(SloSpecError(s));
        if !(100..=3_600_000).contains(&self.window_ms) {
            return err(format!(
                "window_ms = {}: must be 100..=3600000",
                self.window_ms
            ));
        }
        for (what, v, max) in [
            ("breach_windows", self.breach_windows, 1000),
            ("clear_windows", self.clear_windows, 1000),
            ("learn_windows", self.learn_windows, 1000),
            ("compliance_windows", self.compliance_windows, 100_000),
            ("burn_windows", self.burn_windows, 100_000),
            ("slide_windows", self.slide_windows, 1000),
        ] {
            if v == 0 || v > max {
                return err(format!("{what} = {v}: must be 1..={max}"));
            }
        }
        let nodes = self.effective_nodes();
        let mut weight = 0.0;
        for (i, n) in nodes.iter().enumerate() {
            let at = format!("node \"{}\"", n.name);
            if n.name.is_empty() || n.name == ROOT {
                return err(format!(
                    "a node needs a name other than \"\" and \"{ROOT}\""
                ));
            }
            if nodes[..i].iter().any(|o| o.name == n.name) {
                return err(format!("{at} is defined twice"));
            }
            if !n.parent.is_empty() && n.parent != ROOT && !nodes.iter().any(|o| o.name == n.parent)
            {
                return err(format!("{at}: parent \"{}\" is not a node", n.parent));
            }
            if n.parent == n.name {
                return err(format!("{at} is its own parent"));
            }
            match (n.metric.per_iteration(), n.stat) {
                (true, Stat::Rate) => {
                    return err(format!(
                        "{at}: {} is per iteration: use p50, p99, mean or jitter, not rate",
                        n.metric.as_str()
                    ))
                }
                (false, s) if s != Stat::Rate => {
                    return err(format!(
                        "{at}: {} is a rate over the window: use stat = \"rate\", not {}",
                        n.metric.as_str(),
                        s.as_str()
                    ))
                }
                _ => {}
            }
            if n.metric == Metric::RunqueueDelay && n.role.is_none() {
                return err(format!("{at}: runqueue_delay needs a role"));
            }
            let finite = [
                n.default_threshold,
                n.tolerance,
                n.floor,
                n.weight,
                n.target,
            ]
            .iter()
            .chain(n.threshold.iter())
            .all(|v| v.is_finite());
            if !finite {
                return err(format!("{at}: every number must be finite"));
            }
            if n.default_threshold < 0.0 || n.threshold.is_some_and(|t| t < 0.0) {
                return err(format!("{at}: thresholds must be ≥ 0"));
            }
            if !(0.0..=10.0).contains(&n.tolerance) {
                return err(format!("{at}: tolerance = {}: must be 0..=10", n.tolerance));
            }
            if n.floor < 0.0 || n.weight < 0.0 {
                return err(format!("{at}: floor and weight must be ≥ 0"));
            }
            if !(0.0 < n.target && n.target < 1.0) {
                return err(format!("{at}: target = {}: must be in (0, 1)", n.target));
            }
            weight += n.weight;
        }
        if weight <= 0.0 {
            return err("the weights sum to 0: give at least one node a weight".to_owned());
        }
        // No cycles: every chain of parents reaches the root.
        for n in &nodes {
            let mut p = n.parent.as_str();
            let mut steps = 0;
            while !p.is_empty() && p != ROOT {
                steps += 1;
                if steps > nodes.len() {
                    return err(format!("node \"{}\": its parents form a cycle", n.name));
                }
                p = nodes
                    .iter()
                    .find(|o| o.name == p)
                    .map_or("", |o| o.parent.as_str());
            }
        }
        Ok(())
    }
}

/// Where a node's threshold came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThresholdSource {
    /// The config's `threshold`.
    Explicit,
    /// The seed default (no baseline yet).
    Default,
    /// The learned baseline and the tolerance.
    Baseline,
}

impl ThresholdSource {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Explicit => "explicit",
            Self::Default => "default",
            Self::Baseline => "baseline",
        }
    }
}

/// How bad a violation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Past the threshold.
    Warning,
    /// 1.5× past it.
    Critical,
}

impl Severity {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warning => "warning",
            Self::Critical => "critical",
        }
    }
}

/// A node's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodeState {
    /// No window judged yet.
    #[default]
    Unknown,
    /// Within the threshold.
    Ok,
    /// The last window breached; not (yet) a violation.
    Breaching,
    /// A violation is open.
    Violated(Severity),
}

impl NodeState {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Ok => "ok",
            Self::Breaching => "breaching",
            Self::Violated(Severity::Warning) => "warning",
            Self::Violated(Severity::Critical) => "critical",
        }
    }
}

/// A violation, open or closed.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    /// Number, from 1, in opening order.
    pub id: u64,
    /// The node.
    pub node: String,
    /// Its metric and statistic.
    pub metric: Metric,
    /// Its statistic.
    pub stat: Stat,
    /// Severity (the worst while open).
    pub severity: Severity,
    /// When the first breaching window started, ns.
    pub since_ns: u64,
    /// When it opened (end of the window that opened it), ns.
    pub opened_ns: u64,
    /// When it closed, ns.
    pub closed_ns: Option<u64>,
    /// The last breaching window's value.
    pub value: f64,
    /// The threshold it broke.
    pub threshold: f64,
    /// The baseline, when learned.
    pub baseline: Option<f64>,
    /// What made the iterations slower (iteration metrics), from the latest breaching windows.
    pub attribution: Option<Attribution>,
    /// The causal chain in words.
    pub chain: String,
}

/// One node as of the last window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    /// Name.
    pub name: String,
    /// Parent (`job` for top-level nodes; empty for the root).
    pub parent: String,
    /// The spec's metric (`None` for the root).
    pub metric: Option<Metric>,
    /// Statistic.
    pub stat: Option<Stat>,
    /// Objective.
    pub objective: Option<Objective>,
    /// Unit.
    pub unit: &'static str,
    /// Weight.
    pub weight: f64,
    /// The last judged window's value.
    pub value: Option<f64>,
    /// Sliding P50 / P99 / mean over the last windows (iteration metrics).
    pub sliding: Option<(f64, f64, f64)>,
    /// Threshold in force, and where it comes from.
    pub threshold: Option<(f64, ThresholdSource)>,
    /// The baseline, once learned.
    pub baseline: Option<f64>,
    /// Share of judged windows that met the threshold (root: weighted over the nodes).
    pub compliance: Option<f64>,
    /// Error-budget burn rate over the recent windows (1: exactly on budget).
    pub burn_rate: Option<f64>,
    /// State.
    pub state: NodeState,
    /// Windows judged.
    pub windows: u64,
    /// Violations opened so far.
    pub violations: u64,
    /// Judged windows that missed the threshold, so far (with `windows`: the error ratio).
    pub missed: u64,
    /// Compliance target (the error budget is `1 - target`).
    pub target: f64,
}

/// The tree at one instant, for exporters, `top` and the healer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SloSnapshot {
    /// End of the last closed window, ns.
    pub at_ns: u64,
    /// Windows closed.
    pub windows: u64,
    /// Iterations taken in (after the warm-up).
    pub iterations: u64,
    /// Iterations that arrived for a window already closed (counted in the open one).
    pub late_iterations: u64,
    /// Whether baselines are still being learned.
    pub learning: bool,
    /// Window length, ns.
    pub window_ns: u64,
    /// Root first, then the nodes in spec order.
    pub nodes: Vec<NodeView>,
    /// Open violations, then the most recent closed ones.
    pub violations: Vec<Violation>,
}

impl SloSnapshot {
    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&NodeView> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Open violations.
    pub fn open(&self) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(|v| v.closed_ns.is_none())
    }
}

/// Highest value a histogram records (µs: an hour).
const HIST_MAX: u64 = 3_600_000_000;

fn histogram() -> Histogram<u32> {
    // 3 significant digits over 1 µs ..= 1 h: < 0.1% error on P50 and P99. The bounds are
    // constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, HIST_MAX, 3).expect("valid histogram bounds")
}

struct Node {
    spec: NodeSpec,
    /// Window length, s.
    window_s: f64,
    /// The open window: histogram, sum and count of values.
    hist: Histogram<u32>,
    sum: f64,
    count: u64,
    /// Closed windows' histograms, for the sliding view.
    slide: VecDeque<Histogram<u32>>,
    /// Whether each judged window met the threshold, oldest first.
    judged: VecDeque<bool>,
    windows: u64,
    learning: Vec<f64>,
    baseline: Option<f64>,
    breach_streak: u32,
    clear_streak: u32,
    open: Option<usize>,
    /// Violations opened so far.
    opened: u64,
    /// Judged windows that missed the threshold, so far.
    missed: u64,
    last: Option<f64>,
    state: NodeState,
}

impl Node {
    fn threshold(&self) -> (f64, ThresholdSource) {
        if let Some(t) = self.spec.threshold {
            return (t, ThresholdSource::Explicit);
        }
        match self.baseline {
            None => (self.spec.default_threshold, ThresholdSource::Default),
            Some(b) => {
                // Counts per second are Poisson-noisy: allow four standard deviations of the
                // window's count on top.
                let noise = match self.spec.metric {
                    Metric::Retransmits => 4.0 * (b * self.window_s).sqrt() / self.window_s,
                    _ => 0.0,
                };
                let t = match self.spec.objective {
                    Objective::Below => (b * (1.0 + self.spec.tolerance))
                        .max(b + self.spec.floor)
                        .max(b + noise),
                    Objective::Above => (b * (1.0 - self.spec.tolerance))
                        .min(b - self.spec.floor)
                        .max(0.0),
                };
                (t, ThresholdSource::Baseline)
            }
        }
    }

    fn meets(&self, v: f64, t: f64, margin: f64) -> bool {
        match self.spec.objective {
            Objective::Below => v <= t * (1.0 - margin),
            Objective::Above => v >= t * (1.0 + margin),
        }
    }

    /// How far past the threshold, as a ratio ≥ 1 when breaching.
    fn excess(&self, v: f64, t: f64) -> f64 {
        match self.spec.objective {
            Objective::Below => v / t.max(1e-9),
            Objective::Above => t / v.max(1e-9),
        }
    }

    fn stat_of(&self, h: &Histogram<u32>, sum: f64, count: u64) -> Option<f64> {
        if count == 0 {
            return None;
        }
        let scale = self.spec.metric.scale();
        let q = |q: f64| h.value_at_quantile(q) as f64 / scale;
        Some(match self.spec.stat {
            Stat::P50 => q(0.5),
            Stat::P99 => q(0.99),
            Stat::Mean => sum / count as f64,
            Stat::Jitter => q(0.99) - q(0.5),
            Stat::Rate => sum,
        })
    }

    fn compliance(&self, n: usize) -> Option<f64> {
        let n = n.min(self.judged.len());
        (n > 0).then(|| self.judged.iter().rev().take(n).filter(|m| **m).count() as f64 / n as f64)
    }
}

/// Turns iterations and host samples into the SLO tree, windows, violations and attributions.
pub struct SloEngine {
    spec: SloSpec,
    nodes: Vec<Node>,
    host: HostHistory,
    /// Start of the open window, ns (None until the first iteration after the warm-up).
    window_start: Option<u64>,
    windows: u64,
    iterations: u64,
    skipped: u64,
    late: u64,
    last_iteration_end: Option<u64>,
    /// The open window's profile.
    profile: Profile,
    /// The last closed windows' profiles (as many as open a violation).
    recent: VecDeque<Profile>,
    /// Profiles of recent healthy windows: the baseline for attribution.
    healthy: VecDeque<Profile>,
    violations: Vec<Violation>,
    next_id: u64,
}

/// Closed violations kept.
const KEEP_VIOLATIONS: usize = 64;

impl SloEngine {
    /// An engine for `spec` (validated).
    pub fn new(spec: SloSpec) -> Result<Self, SloSpecError> {
        spec.validate()?;
        let nodes = spec
            .effective_nodes()
            .into_iter()
            .map(|node| Node {
                spec: node,
                window_s: spec.window_ms as f64 / 1000.0,
                hist: histogram(),
                sum: 0.0,
                count: 0,
                slide: VecDeque::new(),
                judged: VecDeque::new(),
                windows: 0,
                learning: Vec::new(),
                baseline: None,
                breach_streak: 0,
                clear_streak: 0,
                open: None,
                opened: 0,
                missed: 0,
                last: None,
                state: NodeState::Unknown,
            })
            .collect();
        Ok(Self {
            // Enough host samples for a window at 100 ms ticks, and then some.
            host: HostHistory::new((spec.window_ns() / 100_000_000) as usize * 2 + 64),
            spec,
            nodes,
            window_start: None,
            windows: 0,
            iterations: 0,
            skipped: 0,
            late: 0,
            last_iteration_end: None,
            profile: Profile::default(),
            recent: VecDeque::new(),
            healthy: VecDeque::new(),
            violations: Vec::new(),
            next_id: 1,
        })
    }

    /// The spec in force.
    pub fn spec(&self) -> &SloSpec {
        &self.spec
    }

    /// Takes a host sample (cumulative counters; in time order).
    pub fn push_host(&mut self, s: HostSample) {
        self.host.push(s);
    }

    /// Takes a completed iteration. Windows close in [`SloEngine::advance`]; iterations should
    /// come in about the order they ended.
    pub fn push_iteration(&mut self, it: &Iteration) {
        if self.skipped < u64::from(self.spec.warmup_iterations) {
            self.skipped += 1;
            return;
        }
        let w = self.spec.window_ns();
        let start = *self.window_start.get_or_insert(it.end_ns - it.end_ns % w);
        if it.end_ns < start {
            self.late += 1;
        }
        self.iterations += 1;
        self.last_iteration_end = Some(
            self.last_iteration_end
                .map_or(it.end_ns, |l| l.max(it.end_ns)),
        );
        for n in self
            .nodes
            .iter_mut()
            .filter(|n| n.spec.metric.per_iteration())
        {
            let v = n.spec.metric.of(it);
            let scaled = (v * n.spec.metric.scale())
                .round()
                .clamp(1.0, HIST_MAX as f64) as u64;
            n.hist.saturating_record(scaled);
            n.sum += v;
            n.count += 1;
        }
        self.profile.add_iteration(it);
    }

    /// Closes every window that ended at or before `now_ns` (iterations ending before then
    /// must have been pushed, and host samples up to then).
    /// After a long pause (more windows than compliance looks back over), the windows in
    /// between are not judged one by one: the engine jumps to the window holding `now_ns`.
    pub fn advance(&mut self, now_ns: u64) {
        let w = self.spec.window_ns();
        let most = u64::from(self.spec.compliance_windows) + 1;
        let mut closed = 0;
        while let Some(start) = self.window_start {
            if start + w > now_ns {
                break;
            }
            if closed == most {
                self.window_start = Some(now_ns - (now_ns - start) % w);
                break;
            }
            self.close(start, start + w);
            closed += 1;
            self.window_start = Some(start + w);
        }
    }

    fn close(&mut self, start: u64, end: u64) {
        self.windows += 1;
        let host = self.host.delta(start, end);
        let mut profile = std::mem::take(&mut self.profile);
        if let Some(h) = &host {
            profile.host = h.clone();
        }
        let learning_done_before = self.learned();
        let mut breaching_iteration_nodes = false;
        let mut opened_or_open: Vec<usize> = Vec::new();
        let spec = self.spec.clone();
        for k in 0..self.nodes.len() {
            let node = &mut self.nodes[k];
            let value = if node.spec.metric.per_iteration() {
                let v = node.stat_of(&node.hist, node.sum, node.count);
                // A stall: no iteration ended in the window although some did before.
                match (v, node.spec.metric, self.last_iteration_end) {
                    (None, Metric::IterationTime, Some(last)) if last < start => {
                        Some((end - last) as f64 / 1e6)
                    }
                    _ => v,
                }
            } else {
                host.as_ref().map(|h| {
                    let rate = match (node.spec.metric, node.spec.role) {
                        (Metric::RunqueueDelay, Some(r)) => h.per_second(h.role(r).runq_ns) / 1e6,
                        (Metric::Throttling, _) => h.per_second(h.throttled_ns) / 1e6,
                        (Metric::Retransmits, Some(r)) => h.per_second(h.role(r).retransmits),
                        (Metric::Retransmits, None) => {
                            h.per_second(h.roles.iter().map(|r| r.retransmits).sum())
                        }
                        _ => 0.0,
                    };
                    rate
                })
            };
            // Roll the window.
            if node.spec.metric.per_iteration() && node.count > 0 {
                // Reuse the oldest sliding histogram for the next window (no allocation).
                let mut h = if node.slide.len() >= spec.slide_windows as usize {
                    node.slide.pop_front().map_or_else(histogram, |mut h| {
                        h.reset();
                        h
                    })
                } else {
                    histogram()
                };
                std::mem::swap(&mut h, &mut node.hist);
                node.slide.push_back(h);
                node.sum = 0.0;
                node.count = 0;
            }
            let Some(value) = value else { continue };
            node.windows += 1;
            node.last = Some(value);
            let (threshold, source) = node.threshold();
            let met = node.meets(value, threshold, 0.0);
            node.missed += u64::from(!met);
            node.judged.push_back(met);
            while node.judged.len() > spec.compliance_windows as usize {
                node.judged.pop_front();
            }
            // Learn the baseline; afterwards follow healthy windows slowly.
            if node.baseline.is_none() {
                node.learning.push(value);
                if node.learning.len() >= spec.learn_windows as usize {
                    let mut v = std::mem::take(&mut node.learning);
                    v.sort_by(f64::total_cmp);
                    // Tails vary from window to window more than centres: the upper quartile
                    // of the learning windows for P99 and jitter, the median otherwise.
                    let q = match node.spec.stat {
                        Stat::P99 | Stat::Jitter => 0.75,
                        _ => 0.5,
                    };
                    node.baseline = Some(v[((v.len() - 1) as f64 * q).round() as usize]);
                }
            } else if met && node.open.is_none() {
                if let Some(b) = node.baseline.as_mut() {
                    *b = 0.98 * *b + 0.02 * value;
                }
            }
            let may_open = source != ThresholdSource::Default;
            if met {
                node.breach_streak = 0;
                if node.meets(value, threshold, 0.05) {
                    node.clear_streak += 1;
                } else {
                    node.clear_streak = 0;
                }
            } else {
                node.breach_streak += 1;
                node.clear_streak = 0;
                if node.spec.metric.per_iteration() {
                    breaching_iteration_nodes = true;
                }
            }
            let severity = if node.excess(value, threshold) >= 1.5 {
                Severity::Critical
            } else {
                Severity::Warning
            };
            match node.open {
                Some(i) => {
                    let v = &mut self.violations[i];
                    if !met {
                        v.value = value;
                        v.threshold = threshold;
                        v.severity = v.severity.max(severity);
                        opened_or_open.push(i);
                    }
                    if node.clear_streak >= spec.clear_windows {
                        v.closed_ns = Some(end);
                        node.open = None;
                    }
                }
                None if !met && may_open && node.breach_streak >= spec.breach_windows => {
                    let id = self.next_id;
                    self.next_id += 1;
                    self.violations.push(Violation {
                        id,
                        node: node.spec.name.clone(),
                        metric: node.spec.metric,
                        stat: node.spec.stat,
                        severity,
                        since_ns: end - u64::from(node.breach_streak) * (end - start),
                        opened_ns: end,
                        closed_ns: None,
                        value,
                        threshold,
                        baseline: node.baseline,
                        attribution: None,
                        chain: String::new(),
                    });
                    node.open = Some(self.violations.len() - 1);
                    node.opened += 1;
                    opened_or_open.push(self.violations.len() - 1);
                }
                None => {}
            }
            node.state = match (node.open, met) {
                (Some(i), _) => NodeState::Violated(self.violations[i].severity),
                (None, true) => NodeState::Ok,
                (None, false) => NodeState::Breaching,
            };
        }
        // Profiles: the last few for attribution; healthy ones as its baseline.
        self.recent.push_back(profile.clone());
        while self.recent.len() > spec.breach_windows as usize {
            self.recent.pop_front();
        }
        let healthy = !breaching_iteration_nodes && self.nodes.iter().all(|n| n.open.is_none());
        if profile.iterations > 0 && (healthy || !learning_done_before) {
            self.healthy.push_back(profile);
            while self.healthy.len() > spec.learn_windows as usize {
                self.healthy.pop_front();
            }
        }
        if !opened_or_open.is_empty() {
            self.attribute_open(&opened_or_open);
        }
        self.prune_violations();
    }

    /// Whether every node that has seen a window has its threshold (explicit or learned), and
    /// some node has seen one (nodes without data, e.g. host nodes without host samples, do
    /// not hold learning up).
    fn learned(&self) -> bool {
        let seen = || self.nodes.iter().filter(|n| n.windows > 0);
        seen().next().is_some()
            && seen().all(|n| n.baseline.is_some() || n.spec.threshold.is_some())
    }

    fn attribute_open(&mut self, which: &[usize]) {
        let mut baseline = Profile::default();
        for p in &self.healthy {
            baseline.merge(p);
        }
        // The latest window (the first breaching one is often half before the change), or as
        // many recent ones as make ten iterations.
        let mut now = Profile::default();
        for p in self.recent.iter().rev() {
            now.merge(p);
            if now.iterations >= 10 {
                break;
            }
        }
        let attribution = attribute(&baseline, &now);
        for &i in which {
            let v = &mut self.violations[i];
            let head = {
                let unit = v.metric.unit();
                let change = v
                    .baseline
                    .filter(|b| *b > 0.0)
                    .map(|b| format!(" {:+.0}%", 100.0 * (v.value / b - 1.0)))
                    .unwrap_or_default();
                let from = v.baseline.map(|b| format!("{b:.2} → ")).unwrap_or_default();
                format!(
                    "{} {}{change} ({from}{:.2} {unit}, threshold {:.2})",
                    v.node,
                    v.stat.as_str(),
                    v.value,
                    v.threshold
                )
            };
            v.chain = match &attribution {
                Some(a) if v.metric.per_iteration() => a.chain(&head),
                _ => head,
            };
            if v.metric.per_iteration() {
                v.attribution = attribution.clone();
            }
        }
    }

    fn prune_violations(&mut self) {
        let closed = self
            .violations
            .iter()
            .filter(|v| v.closed_ns.is_some())
            .count();
        if closed <= KEEP_VIOLATIONS {
            return;
        }
        let mut drop = closed - KEEP_VIOLATIONS;
        let mut keep = Vec::with_capacity(self.violations.len());
        let mut remap = vec![usize::MAX; self.violations.len()];
        for (i, v) in std::mem::take(&mut self.violations).into_iter().enumerate() {
            if drop > 0 && v.closed_ns.is_some() {
                drop -= 1;
                continue;
            }
            remap[i] = keep.len();
            keep.push(v);
        }
        self.violations = keep;
        for n in &mut self.nodes {
            n.open = n.open.map(|i| remap[i]);
        }
    }

    /// Windows closed so far.
    pub fn snapshot_windows(&self) -> u64 {
        self.windows
    }

    /// Every violation kept, in opening order.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// The tree now.
    pub fn snapshot(&self) -> SloSnapshot {
        let spec = &self.spec;
        let mut nodes = Vec::with_capacity(self.nodes.len() + 1);
        let (mut score, mut wsum, mut burn, mut any) = (0.0, 0.0, 0.0, false);
        for n in &self.nodes {
            let compliance = n.compliance(spec.compliance_windows as usize);
            let burn_rate = n
                .compliance(spec.burn_windows as usize)
                .map(|c| (1.0 - c) / (1.0 - n.spec.target));
            if let (Some(c), true) = (compliance, n.spec.weight > 0.0) {
                score += n.spec.weight * c;
                burn += n.spec.weight * burn_rate.unwrap_or(0.0);
                wsum += n.spec.weight;
                any = true;
            }
            let sliding = (n.spec.metric.per_iteration() && !n.slide.is_empty()).then(|| {
                let mut h = histogram();
                for s in &n.slide {
                    let _ = h.add(s);
                }
                let scale = n.spec.metric.scale();
                (
                    h.value_at_quantile(0.5) as f64 / scale,
                    h.value_at_quantile(0.99) as f64 / scale,
                    h.mean() / scale,
                )
            });
            nodes.push(NodeView {
                name: n.spec.name.clone(),
                parent: if n.spec.parent.is_empty() {
                    ROOT.to_owned()
                } else {
                    n.spec.parent.clone()
                },
                metric: Some(n.spec.metric),
                stat: Some(n.spec.stat),
                objective: Some(n.spec.objective),
                unit: n.spec.metric.unit(),
                weight: n.spec.weight,
                value: n.last,
                sliding,
                threshold: (n.windows > 0 || n.spec.threshold.is_some()).then(|| n.threshold()),
                baseline: n.baseline,
                compliance,
                burn_rate,
                state: n.state,
                windows: n.windows,
                violations: n.opened,
                missed: n.missed,
                target: n.spec.target,
            });
        }
        let worst = nodes
            .iter()
            .filter(|n| n.weight > 0.0)
            .map(|n| n.state)
            .fold(NodeState::Unknown, |acc, s| match (acc, s) {
                (NodeState::Violated(a), NodeState::Violated(b)) => NodeState::Violated(a.max(b)),
                (NodeState::Violated(a), _) | (_, NodeState::Violated(a)) => NodeState::Violated(a),
                (NodeState::Breaching, _) | (_, NodeState::Breaching) => NodeState::Breaching,
                (NodeState::Ok, _) | (_, NodeState::Ok) => NodeState::Ok,
                _ => NodeState::Unknown,
            });
        nodes.insert(
            0,
            NodeView {
                name: ROOT.to_owned(),
                parent: String::new(),
                metric: None,
                stat: None,
                objective: None,
                unit: "",
                weight: 1.0,
                value: any.then(|| score / wsum),
                sliding: None,
                threshold: None,
                baseline: None,
                compliance: any.then(|| score / wsum),
                burn_rate: any.then(|| burn / wsum),
                state: worst,
                windows: self.windows,
                violations: self.next_id - 1,
                missed: 0,
                target: 0.0,
            },
        );
        let mut violations: Vec<Violation> = self
            .violations
            .iter()
            .filter(|v| v.closed_ns.is_none())
            .cloned()
            .collect();
        violations.extend(
            self.violations
                .iter()
                .rev()
                .filter(|v| v.closed_ns.is_some())
                .take(16)
                .cloned(),
        );
        SloSnapshot {
            at_ns: self.window_start.unwrap_or(0),
            windows: self.windows,
            iterations: self.iterations,
            late_iterations: self.late,
            learning: !self.learned(),
            window_ns: self.spec.window_ns(),
            nodes,
            violations,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSample;

    const MS: u64 = 1_000_000;

    fn spec() -> SloSpec {
        SloSpec {
            window_ms: 1000,
            learn_windows: 3,
            warmup_iterations: 0,
            ..SloSpec::default()
        }
    }

    fn it(end_ns: u64, wall_ns: u64) -> Iteration {
        Iteration {
            start_ns: end_ns - wall_ns,
            end_ns,
            gpu_busy_ns: wall_ns * 9 / 10,
            idle_before_first_ns: wall_ns / 20,
            ..Default::default()
        }
    }

    /// Feeds `secs` seconds of iterations of `wall(t)` ms, 1.6 ms apart or their length.
    fn run(e: &mut SloEngine, from_s: u64, secs: u64, wall_ms: impl Fn(u64) -> f64) {
        let mut t = from_s * 1000 * MS;
        let end = (from_s + secs) * 1000 * MS;
        while t < end {
            let w = (wall_ms(t) * MS as f64) as u64;
            t += w;
            e.push_iteration(&it(t, w));
            e.advance(t);
        }
        e.advance(end);
    }

    #[test]
    fn a_fast_job_is_judged_by_its_own_baseline() {
        let mut e = SloEngine::new(spec()).expect("spec");
        // 1.6 ms steps: the 1200 ms default is no use; the baseline is.
        run(&mut e, 0, 5, |_| 1.6);
        let s = e.snapshot();
        assert!(!s.learning || s.node("host.throttling").is_some());
        let n = s.node("iteration").expect("node");
        let (t, src) = n.threshold.expect("threshold");
        assert_eq!(src, ThresholdSource::Baseline);
        assert!((t - 1.6 * 1.15).abs() < 0.01, "{t}");
        assert!(e.violations().is_empty());
        // 2.2 ms steps: +37%: a violation after two windows, warning (1.2× the threshold).
        run(&mut e, 5, 3, |_| 2.2);
        let v = e
            .violations()
            .iter()
            .find(|v| v.node == "iteration")
            .expect("violation");
        assert_eq!(v.severity, Severity::Warning);
        assert_eq!(v.opened_ns, 7000 * MS);
        assert!(
            v.chain.starts_with("iteration p99 +38% (1.60 → 2.20 ms"),
            "{}",
            v.chain
        );
        let a = v.attribution.as_ref().expect("attribution");
        assert!(
            (a.iteration_ns.1 / a.iteration_ns.0 - 2.2 / 1.6).abs() < 0.01,
            "{a:?}"
        );
        assert_eq!(
            e.snapshot().node("iteration").map(|n| n.state),
            Some(NodeState::Violated(Severity::Warning))
        );
        // Back to 1.6 ms: closed after three good windows.
        run(&mut e, 8, 2, |_| 1.6);
        assert!(e.violations()[0].closed_ns.is_none());
        run(&mut e, 10, 1, |_| 1.6);
        assert_eq!(e.violations()[0].closed_ns, Some(11_000 * MS));
    }

    #[test]
    fn hysteresis_needs_a_margin_to_clear() {
        let mut e = SloEngine::new(spec()).expect("spec");
        run(&mut e, 0, 3, |_| 10.0);
        run(&mut e, 3, 3, |_| 20.0);
        assert_eq!(e.violations().len(), 2, "p99 and median");
        // Just under the threshold (11.5 ms): met, but not by the 5% margin: stays open.
        run(&mut e, 6, 5, |_| 11.4);
        assert!(e
            .violations()
            .iter()
            .any(|v| v.node == "iteration" && v.closed_ns.is_none()));
        run(&mut e, 11, 3, |_| 10.0);
        assert!(e.violations().iter().all(|v| v.closed_ns.is_some()));
    }

    #[test]
    fn defaults_never_open_during_learning_but_explicit_thresholds_do() {
        // 2 s steps break the 1200 ms default, but that is just learning.
        let mut e = SloEngine::new(spec()).expect("spec");
        run(&mut e, 0, 10, |_| 2000.0);
        assert!(e.violations().iter().all(|v| v.node != "iteration"));
        let mut s = spec();
        let mut nodes = SloSpec::default_nodes();
        nodes[0].threshold = Some(1200.0);
        s.nodes = nodes;
        let mut e = SloEngine::new(s).expect("spec");
        run(&mut e, 0, 10, |_| 2000.0);
        let v = e
            .violations()
            .iter()
            .find(|v| v.node == "iteration")
            .expect("violation");
        assert!(v.opened_ns <= 5000 * MS, "{v:?}");
        assert_eq!(v.threshold, 1200.0);
        assert_eq!(
            v.severity,
            Severity::Critical,
            "2000 ms is 1.67× the threshold"
        );
    }

    #[test]
    fn a_stalled_job_breaches() {
        let mut e = SloEngine::new(spec()).expect("spec");
        run(&mut e, 0, 4, |_| 10.0);
        // No iteration for 3 s.
        e.advance(7000 * MS);
        let n = e.snapshot().node("iteration").cloned().expect("node");
        assert!(n.value.expect("value") > 2000.0, "{n:?}");
        assert!(e.violations().iter().any(|v| v.node == "iteration"));
    }

    #[test]
    fn a_far_future_advance_does_not_loop() {
        let mut e = SloEngine::new(spec()).expect("spec");
        run(&mut e, 0, 2, |_| 10.0);
        e.advance(u64::MAX / 2);
        let s = e.snapshot();
        assert_eq!(s.windows, 2 + u64::from(spec().compliance_windows) + 1);
        assert!(s.at_ns > u64::MAX / 4);
    }

    #[test]
    fn compliance_burn_rate_and_score() {
        let mut e = SloEngine::new(spec()).expect("spec");
        run(&mut e, 0, 10, |_| 10.0);
        run(&mut e, 10, 2, |_| 30.0);
        let s = e.snapshot();
        let n = s.node("iteration").expect("node");
        assert_eq!(n.windows, 12);
        assert!((n.compliance.expect("c") - 10.0 / 12.0).abs() < 1e-9);
        // 2 of 12 windows missed against a 1% budget.
        assert!((n.burn_rate.expect("b") - (2.0 / 12.0) / 0.01).abs() < 1e-6);
        let root = &s.nodes[0];
        assert_eq!(root.name, ROOT);
        assert!(root.compliance.expect("score") < 1.0);
        let (p50, p99, _) = n.sliding.expect("sliding");
        assert!(p50 > 9.9 && p99 > 29.0, "{p50} {p99}");
    }

    #[test]
    fn host_rates_come_from_the_host_counters() {
        let mut e = SloEngine::new(spec()).expect("spec");
        for k in 0..=60 {
            let mut h = HostSample {
                at_ns: k * 100 * MS,
                ..Default::default()
            };
            // 10 ms of run-queue wait per second for the main thread, 300 after 4 s.
            let runq = if k <= 40 {
                k * MS
            } else {
                40 * MS + (k - 40) * 30 * MS
            };
            h.role_mut(Role::Main).runq_ns = runq;
            e.push_host(h);
        }
        run(&mut e, 0, 6, |_| 10.0);
        let n = e
            .snapshot()
            .node("host.runqueue.main")
            .cloned()
            .expect("node");
        assert!((n.baseline.expect("baseline") - 10.0).abs() < 0.5, "{n:?}");
        assert!((n.value.expect("value") - 300.0).abs() < 1.0, "{n:?}");
        assert!(e
            .violations()
            .iter()
            .any(|v| v.node == "host.runqueue.main"));
    }

    #[test]
    fn invalid_specs_say_what_is_wrong() {
        let with = |f: &dyn Fn(&mut Vec<NodeSpec>)| {
            let mut s = spec();
            let mut n = SloSpec::default_nodes();
            f(&mut n);
            s.nodes = n;
            s.validate().map_err(|e| e.to_string())
        };
        assert!(with(&|_| {}).is_ok());
        let e = with(&|n| n[1].name = "iteration".into()).unwrap_err();
        assert!(e.contains("node \"iteration\" is defined twice"), "{e}");
        let e = with(&|n| n[1].parent = "nope".into()).unwrap_err();
        assert!(e.contains("parent \"nope\" is not a node"), "{e}");
        let e = with(&|n| n[0].stat = Stat::Rate).unwrap_err();
        assert!(e.contains("is per iteration: use p50"), "{e}");
        let e = with(&|n| n[6].stat = Stat::P99).unwrap_err();
        assert!(e.contains("use stat = \"rate\""), "{e}");
        let e = with(&|n| n[6].role = None).unwrap_err();
        assert!(e.contains("needs a role"), "{e}");
        let e = with(&|n| n.iter_mut().for_each(|x| x.weight = 0.0)).unwrap_err();
        assert!(e.contains("weights sum to 0"), "{e}");
        let e = with(&|n| {
            n[0].parent = "iteration.median".into();
        })
        .unwrap_err();
        assert!(e.contains("cycle"), "{e}");
        let e = with(&|n| n[0].tolerance = f64::NAN).unwrap_err();
        assert!(e.contains("finite"), "{e}");
        let mut s = spec();
        s.window_ms = 10;
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("window_ms = 10"));
    }
}
