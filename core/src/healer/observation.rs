//! What the healer reads about one job at one tick: a small plain struct that the agent fills
//! from the core snapshot (agent/src/healer/observe.rs), so that the decisions depend on nothing
//! else and tests can script a job tick by tick.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::strategy::Strategy;

/// One finished iteration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterationSample {
    /// CLOCK_MONOTONIC ns when it ended (the healer skips those it has seen).
    pub end_ns: u64,
    /// Its wall time, ms.
    pub wall_ms: f64,
}

/// One SLO node's latest value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeObs {
    /// The value, in the node's unit.
    pub value: f64,
    /// Larger is better (GPU utilisation); else smaller is better (latencies, rates).
    pub higher_is_better: bool,
    /// Counted in the side-effect budget (the tree's weighted nodes).
    pub guarded: bool,
    /// Windows judged so far. The value is new when this grew since the last observation: a
    /// node without data in a window (GPU utilisation outside the shim's sample windows) keeps
    /// its last value, which must not count again. 0: unknown, every observation is new.
    #[serde(default)]
    pub windows: u64,
}

/// The host cause of an open violation, as the policy matches it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum HostCause {
    /// No host cause found.
    #[default]
    None,
    /// The main (launching) threads waited for a CPU.
    RunqueueMain,
    /// DataLoader workers waited for a CPU.
    RunqueueDataLoader,
    /// The pin-memory thread waited for a CPU.
    RunqueuePinMemory,
    /// Communication threads waited for a CPU.
    RunqueueCommunication,
    /// The job's cgroup was CPU-throttled.
    Throttling,
    /// TCP retransmits on the job's communication connections.
    Retransmits,
}

impl HostCause {
    /// Every cause.
    pub const ALL: [HostCause; 7] = [
        HostCause::None,
        HostCause::RunqueueMain,
        HostCause::RunqueueDataLoader,
        HostCause::RunqueuePinMemory,
        HostCause::RunqueueCommunication,
        HostCause::Throttling,
        HostCause::Retransmits,
    ];

    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::RunqueueMain => "runqueue-main",
            Self::RunqueueDataLoader => "runqueue-data-loader",
            Self::RunqueuePinMemory => "runqueue-pin-memory",
            Self::RunqueueCommunication => "runqueue-communication",
            Self::Throttling => "throttling",
            Self::Retransmits => "retransmits",
        }
    }

    /// The cause named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// The open violation the healer acts on (the job's most severe one).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpenViolation {
    /// SLO node, e.g. `iteration`.
    pub node: String,
    /// Attribution dimension of the top cause (`launch_latency`, `data_loading`, ...; see
    /// [`crate::attribution::Dimension::as_str`]); empty when not attributed.
    pub dimension: String,
    /// The host cause behind it.
    pub host: HostCause,
    /// The causal chain, for the audit trail.
    pub detail: String,
    /// CLOCK_MONOTONIC ns when its first breaching window began (the violation's identity).
    pub since_ns: u64,
    /// CLOCK_MONOTONIC ns when it opened: iterations after this are in the fault for sure (the
    /// first breaching window may have begun before the fault did), so the before window of an
    /// action is taken from them.
    pub opened_ns: u64,
}

/// One job at one tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobObservation {
    /// CLOCK_MONOTONIC ns of the tick.
    pub at_ns: u64,
    /// Iteration time P99 of the latest SLO window, ms.
    pub iteration_p99_ms: Option<f64>,
    /// The iteration node's threshold in force (its SLO), ms.
    pub slo_p99_ms: Option<f64>,
    /// Iterations per second over the latest window.
    pub iterations_per_s: Option<f64>,
    /// Host CPU utilisation, 0..1 (all CPUs the job may use).
    pub host_cpu_util: Option<f64>,
    /// GPU utilisation of the job's GPU, 0..1.
    pub gpu_util: Option<f64>,
    /// Gradient-sync jitter (P99 − P50 of communication time), ms.
    pub sync_jitter_ms: Option<f64>,
    /// Windows judged so far of the node `gpu_util` comes from, and of the one
    /// `sync_jitter_ms` comes from: a value is new when its count grew (see
    /// [`NodeObs::windows`]; 0: unknown, every value is new).
    #[serde(default)]
    pub gpu_util_windows: u64,
    /// See [`JobObservation::gpu_util_windows`].
    #[serde(default)]
    pub sync_jitter_windows: u64,
    /// SLO node values by node name.
    pub nodes: BTreeMap<String, NodeObs>,
    /// The open violation, if any.
    pub violation: Option<OpenViolation>,
    /// Recent finished iterations, oldest first (those already seen are skipped).
    pub iterations: Vec<IterationSample>,
    /// Strategies the agent cannot carry out for this job now, and why (no client registered,
    /// no allowed neighbour, a manager owns the knob).
    pub unavailable: BTreeMap<Strategy, String>,
}
