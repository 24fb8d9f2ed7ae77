//! The SLO tree as configured: what each node measures ([`Metric`], [`Stat`], [`Objective`]),
//! its thresholds and weights ([`NodeSpec`]), the windows ([`SloSpec`]), the seed's default
//! tree, and validation that says what is wrong ([`SloSpecError`]), linear in the nodes.

use serde::{Deserialize, Serialize};

use crate::{gputrace::Iteration, roles::Role};

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
    pub(super) fn scale(self) -> f64 {
        match self {
            Self::GpuUtilisation => 100.0,
            _ => 1000.0,
        }
    }

    /// The value of one iteration, in the unit.
    pub(super) fn of(self, it: &Iteration) -> f64 {
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

/// Why a spec is refused. Messages name the key or node and the rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SloSpecError {
    /// A window setting is out of range.
    #[error("{key} = {value}: must be {min}..={max}")]
    OutOfRange {
        /// The key.
        key: &'static str,
        /// Its value.
        value: u64,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// A node without a usable name.
    #[error("a node needs a name other than \"\" and \"{ROOT}\"")]
    Unnamed,
    /// Two nodes with one name.
    #[error("node \"{node}\" is defined twice")]
    Duplicate {
        /// The name.
        node: String,
    },
    /// A parent that is not a node.
    #[error("node \"{node}\": parent \"{parent}\" is not a node")]
    NoParent {
        /// The node.
        node: String,
        /// Its parent.
        parent: String,
    },
    /// A node that is its own parent.
    #[error("node \"{node}\" is its own parent")]
    OwnParent {
        /// The node.
        node: String,
    },
    /// A statistic that does not fit the metric.
    #[error("node \"{node}\": {why}")]
    Stat {
        /// The node.
        node: String,
        /// What to use instead.
        why: String,
    },
    /// `runqueue_delay` without a thread role.
    #[error("node \"{node}\": runqueue_delay needs a role")]
    NoRole {
        /// The node.
        node: String,
    },
    /// A number that is not finite, or out of its range.
    #[error("node \"{node}\": {why}")]
    Number {
        /// The node.
        node: String,
        /// Which rule.
        why: String,
    },
    /// No node has a weight.
    #[error("the weights sum to 0: give at least one node a weight")]
    NoWeight,
    /// Parents that lead back to the node.
    #[error("node \"{node}\": its parents form a cycle")]
    Cycle {
        /// A node on the cycle.
        node: String,
    },
}

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

    /// Checks what serde cannot: names, parents, ranges, and metric/stat pairs; linear in the
    /// number of nodes.
    pub fn validate(&self) -> Result<(), SloSpecError> {
        if !(100..=3_600_000).contains(&self.window_ms) {
            return Err(SloSpecError::OutOfRange {
                key: "window_ms",
                value: self.window_ms,
                min: 100,
                max: 3_600_000,
            });
        }
        for (key, v, max) in [
            ("breach_windows", self.breach_windows, 1000),
            ("clear_windows", self.clear_windows, 1000),
            ("learn_windows", self.learn_windows, 1000),
            ("compliance_windows", self.compliance_windows, 100_000),
            ("burn_windows", self.burn_windows, 100_000),
            ("slide_windows", self.slide_windows, 1000),
        ] {
            if v == 0 || v > max {
                return Err(SloSpecError::OutOfRange {
                    key,
                    value: u64::from(v),
                    min: 1,
                    max: u64::from(max),
                });
            }
        }
        let nodes = self.effective_nodes();
        let mut index: std::collections::HashMap<&str, usize> =
            std::collections::HashMap::with_capacity(nodes.len());
        let mut weight = 0.0;
        for (i, n) in nodes.iter().enumerate() {
            let node = || n.name.clone();
            if n.name.is_empty() || n.name == ROOT {
                return Err(SloSpecError::Unnamed);
            }
            if index.insert(n.name.as_str(), i).is_some() {
                return Err(SloSpecError::Duplicate { node: node() });
            }
            match (n.metric.per_iteration(), n.stat) {
                (true, Stat::Rate) => {
                    return Err(SloSpecError::Stat {
                        node: node(),
                        why: format!(
                            "{} is per iteration: use p50, p99, mean or jitter, not rate",
                            n.metric.as_str()
                        ),
                    })
                }
                (false, s) if s != Stat::Rate => {
                    return Err(SloSpecError::Stat {
                        node: node(),
                        why: format!(
                            "{} is a rate over the window: use stat = \"rate\", not {}",
                            n.metric.as_str(),
                            s.as_str()
                        ),
                    })
                }
                _ => {}
            }
            if n.metric == Metric::RunqueueDelay && n.role.is_none() {
                return Err(SloSpecError::NoRole { node: node() });
            }
            let number = |why: String| Err(SloSpecError::Number { node: node(), why });
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
                return number("every number must be finite".into());
            }
            if n.default_threshold < 0.0 || n.threshold.is_some_and(|t| t < 0.0) {
                return number("thresholds must be ≥ 0".into());
            }
            if !(0.0..=10.0).contains(&n.tolerance) {
                return number(format!("tolerance = {}: must be 0..=10", n.tolerance));
            }
            if n.floor < 0.0 || n.weight < 0.0 {
                return number("floor and weight must be ≥ 0".into());
            }
            if !(0.0 < n.target && n.target < 1.0) {
                return number(format!("target = {}: must be in (0, 1)", n.target));
            }
            weight += n.weight;
        }
        for n in &nodes {
            if n.parent == n.name {
                return Err(SloSpecError::OwnParent {
                    node: n.name.clone(),
                });
            }
            if !n.parent.is_empty() && n.parent != ROOT && !index.contains_key(n.parent.as_str()) {
                return Err(SloSpecError::NoParent {
                    node: n.name.clone(),
                    parent: n.parent.clone(),
                });
            }
        }
        if weight <= 0.0 {
            return Err(SloSpecError::NoWeight);
        }
        // No cycles: every chain of parents reaches the root. Each node is walked once: a walk
        // stops at a node already known to reach the root (state 2) and fails on one being
        // walked (state 1).
        let parent = |i: usize| {
            let p = nodes[i].parent.as_str();
            (!p.is_empty() && p != ROOT)
                .then(|| index.get(p).copied())
                .flatten()
        };
        let mut state = vec![0u8; nodes.len()];
        for start in 0..nodes.len() {
            let mut path = Vec::new();
            let mut at = Some(start);
            while let Some(i) = at {
                match state[i] {
                    2 => break,
                    1 => {
                        return Err(SloSpecError::Cycle {
                            node: nodes[i].name.clone(),
                        })
                    }
                    _ => {
                        state[i] = 1;
                        path.push(i);
                        at = parent(i);
                    }
                }
            }
            for i in path {
                state[i] = 2;
            }
        }
        Ok(())
    }
}
