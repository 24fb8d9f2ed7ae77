//! What a snapshot shows of an SLO tree: each node's value, threshold and its source,
//! baseline, compliance, burn rate and state; the violations with their attribution and chain.

use super::spec::{Metric, Objective, Stat};
use crate::attribution::Attribution;

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
    /// When its attribution first named a cause (end of that window), ns.
    pub attributed_ns: Option<u64>,
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

impl NodeView {
    /// What the reports say of a node [`NodeView::past_by_chance`] holds for.
    pub const PAST_BY_CHANCE: &'static str = "ok (too few iterations over it for a p99 breach)";

    /// A P99 shown past its threshold in a window judged within it: fewer of the window's
    /// iterations were over the threshold than a 1% tail gives by chance (see
    /// [`crate::slo`]).
    pub fn past_by_chance(&self) -> bool {
        let past = match (self.value, self.threshold, self.objective) {
            (Some(v), Some((t, _)), Some(Objective::Below)) => v > t,
            (Some(v), Some((t, _)), Some(Objective::Above)) => v < t,
            _ => false,
        };
        past && self.stat == Some(Stat::P99) && self.state == NodeState::Ok
    }
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
