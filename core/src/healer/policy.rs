//! Diagnosis: from the cause of an open violation (SLO node, attribution dimension, host cause)
//! to at most [`MAX_CANDIDATES`] candidate strategies. The seed's §4.4 decision table (a root
//! cause → the strategies to switch to) generalised to the causes slo-probe attributes, as data:
//! an ordered list of rules, the first that matches wins, loaded from `[[heal.policy]]` in the
//! config, with [`default_rules`] when none is given.

use serde::{Deserialize, Serialize};

use super::{
    observation::{HostCause, OpenViolation},
    strategy::Strategy,
};

/// Most candidates a rule may name (the research note's shortlist of ≤ 3).
pub const MAX_CANDIDATES: usize = 3;

/// Attribution dimensions a rule may name (`Dimension::as_str` of the attribution).
pub const DIMENSIONS: [&str; 6] = [
    "launch_latency",
    "occupancy",
    "memory_bandwidth",
    "execution",
    "communication",
    "data_loading",
];

/// One row of the decision table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// SLO node: a name, a prefix ending in `*` (`host.*`), or `*` for any.
    pub node: String,
    /// Attribution dimension: one of [`DIMENSIONS`], `none` (not attributed), or `*`.
    pub dimension: String,
    /// Host cause: a [`HostCause`] name (`runqueue-main`, `throttling`, `none`, ...) or `*`.
    pub host: String,
    /// Strategies to try, in order of preference, at most [`MAX_CANDIDATES`]: each is tried
    /// once in this order (mild, then strong) before the tuner samples among them.
    pub candidates: Vec<Strategy>,
}

/// Why a table is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A rule's dimension is unknown.
    #[error("rule {index}: dimension {value:?} is not one of {DIMENSIONS:?}, \"none\" or \"*\"")]
    Dimension {
        /// The rule's index.
        index: usize,
        /// What was given.
        value: String,
    },
    /// A rule's host cause is unknown.
    #[error(
        "rule {index}: host {value:?} is not a host cause (none, runqueue-main, \
         runqueue-data-loader, runqueue-pin-memory, runqueue-communication, throttling, \
         retransmits) or \"*\""
    )]
    Host {
        /// The rule's index.
        index: usize,
        /// What was given.
        value: String,
    },
    /// A rule names no candidate, too many, or the baseline.
    #[error(
        "rule {index}: candidates must be 1 to {MAX_CANDIDATES} strategies other than fcfs-gpu \
         (the baseline is always an arm)"
    )]
    Candidates {
        /// The rule's index.
        index: usize,
    },
    /// A rule's node pattern is empty.
    #[error("rule {index}: node must be a node name, a prefix ending in *, or *")]
    Node {
        /// The rule's index.
        index: usize,
    },
}

fn rule(node: &str, dimension: &str, host: HostCause, candidates: &[Strategy]) -> PolicyRule {
    PolicyRule {
        node: node.to_owned(),
        dimension: dimension.to_owned(),
        host: host.as_str().to_owned(),
        candidates: candidates.to_vec(),
    }
}

/// The documented default table. Host causes come first: they are the most specific evidence.
///
/// | node | dimension | host cause | candidates |
/// |---|---|---|---|
/// | * | * | runqueue-main | deadline-aware, numa-pinning, neighbor-isolation |
/// | * | * | throttling | neighbor-isolation |
/// | * | * | runqueue-data-loader | io-boost, numa-pinning, neighbor-isolation |
/// | * | * | runqueue-pin-memory | io-boost, numa-pinning |
/// | * | * | runqueue-communication | comm-relief, deadline-aware, numa-pinning |
/// | * | * | retransmits | comm-relief |
/// | * | communication | none | comm-relief |
/// | * | data_loading | none | io-boost |
/// | * | launch_latency | none | graph-replay, deadline-aware |
/// | * | memory_bandwidth | none | memory-first |
/// | compute* | * | none | graph-replay, io-boost |
///
/// Kernels that got slower on the GPU (execution, occupancy) without a host cause have no rule:
/// nothing on the host explains them, and the healer says so instead of acting.
pub fn default_rules() -> Vec<PolicyRule> {
    use HostCause as H;
    use Strategy::*;
    let any = |host: HostCause, c: &[Strategy]| rule("*", "*", host, c);
    vec![
        // Neighbours first where the config allows touching them (else it is unavailable and
        // skipped): a job's own priority cannot beat busy neighbours on its CPUs.
        any(
            H::RunqueueMain,
            &[NeighborIsolation, DeadlineAware, NumaPinning],
        ),
        any(H::Throttling, &[NeighborIsolation]),
        any(
            H::RunqueueDataLoader,
            &[IoBoost, NumaPinning, NeighborIsolation],
        ),
        any(H::RunqueuePinMemory, &[IoBoost, NumaPinning]),
        any(
            H::RunqueueCommunication,
            &[CommRelief, DeadlineAware, NumaPinning],
        ),
        any(H::Retransmits, &[CommRelief]),
        rule("*", "communication", H::None, &[CommRelief]),
        rule("*", "data_loading", H::None, &[IoBoost]),
        rule(
            "*",
            "launch_latency",
            H::None,
            &[GraphReplay, DeadlineAware],
        ),
        rule("*", "memory_bandwidth", H::None, &[MemoryFirst]),
        rule("compute*", "*", H::None, &[GraphReplay, IoBoost]),
    ]
}

/// Checks the table: known dimensions and host causes, 1..=3 candidates, no baseline.
pub fn validate(rules: &[PolicyRule]) -> Result<(), PolicyError> {
    for (index, r) in rules.iter().enumerate() {
        if r.node.is_empty() {
            return Err(PolicyError::Node { index });
        }
        if !(r.dimension == "*" || r.dimension == "none" || DIMENSIONS.contains(&&*r.dimension)) {
            return Err(PolicyError::Dimension {
                index,
                value: r.dimension.clone(),
            });
        }
        if !(r.host == "*" || HostCause::parse(&r.host).is_some()) {
            return Err(PolicyError::Host {
                index,
                value: r.host.clone(),
            });
        }
        if r.candidates.is_empty()
            || r.candidates.len() > MAX_CANDIDATES
            || r.candidates.iter().any(|s| s.is_baseline())
        {
            return Err(PolicyError::Candidates { index });
        }
    }
    Ok(())
}

fn node_matches(pattern: &str, node: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => node.starts_with(prefix),
        None => pattern == node,
    }
}

impl PolicyRule {
    /// Whether this rule applies to `v`.
    pub fn matches(&self, v: &OpenViolation) -> bool {
        let dimension = if v.dimension.is_empty() {
            "none"
        } else {
            &v.dimension
        };
        node_matches(&self.node, &v.node)
            && (self.dimension == "*" || self.dimension == dimension)
            && (self.host == "*" || self.host == v.host.as_str())
    }
}

/// The first rule matching `v` and its index, if any.
pub fn diagnose<'a>(rules: &'a [PolicyRule], v: &OpenViolation) -> Option<(usize, &'a PolicyRule)> {
    rules.iter().enumerate().find(|(_, r)| r.matches(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(node: &str, dimension: &str, host: HostCause) -> OpenViolation {
        OpenViolation {
            node: node.to_owned(),
            dimension: dimension.to_owned(),
            host,
            ..Default::default()
        }
    }

    #[test]
    fn default_table_is_valid_and_covers_every_host_cause() {
        let rules = default_rules();
        validate(&rules).expect("default table");
        for host in HostCause::ALL.into_iter().filter(|h| *h != HostCause::None) {
            let (_, r) = diagnose(&rules, &v("iteration", "launch_latency", host))
                .unwrap_or_else(|| panic!("{host:?}"));
            assert!(!r.candidates.is_empty());
        }
    }

    #[test]
    fn host_cause_comes_before_dimension() {
        let rules = default_rules();
        let (_, r) = diagnose(
            &rules,
            &v("iteration", "data_loading", HostCause::RunqueueMain),
        )
        .expect("rule");
        assert_eq!(
            r.candidates,
            vec![
                Strategy::NeighborIsolation,
                Strategy::DeadlineAware,
                Strategy::NumaPinning
            ]
        );
        let (_, r) =
            diagnose(&rules, &v("iteration", "data_loading", HostCause::None)).expect("rule");
        assert_eq!(r.candidates, vec![Strategy::IoBoost]);
        let (_, r) = diagnose(&rules, &v("iteration", "", HostCause::Throttling)).expect("rule");
        assert_eq!(r.candidates, vec![Strategy::NeighborIsolation]);
    }

    #[test]
    fn slower_kernels_without_host_cause_have_no_rule() {
        let rules = default_rules();
        assert!(diagnose(&rules, &v("iteration", "execution", HostCause::None)).is_none());
        assert!(diagnose(&rules, &v("iteration", "", HostCause::None)).is_none());
        // ...except on the GPU-utilisation node.
        assert!(diagnose(&rules, &v("compute", "execution", HostCause::None)).is_some());
    }

    #[test]
    fn patterns() {
        assert!(node_matches("*", "x"));
        assert!(node_matches("host.*", "host.runqueue.main"));
        assert!(!node_matches("host.*", "iteration"));
        assert!(node_matches("iteration", "iteration"));
        assert!(!node_matches("iteration", "iteration.median"));
    }

    #[test]
    fn bad_tables_are_refused_with_the_rule_index() {
        let mut rules = default_rules();
        rules[1].dimension = "cpu".into();
        assert_eq!(
            validate(&rules),
            Err(PolicyError::Dimension {
                index: 1,
                value: "cpu".into()
            })
        );
        let mut rules = default_rules();
        rules[2].host = "runqueue".into();
        assert!(matches!(
            validate(&rules),
            Err(PolicyError::Host { index: 2, .. })
        ));
        let mut rules = default_rules();
        rules[0].candidates.push(Strategy::IoBoost);
        assert_eq!(validate(&rules), Err(PolicyError::Candidates { index: 0 }));
        let mut rules = default_rules();
        rules[3].candidates = vec![Strategy::FcfsGpu];
        assert_eq!(validate(&rules), Err(PolicyError::Candidates { index: 3 }));
    }
}
