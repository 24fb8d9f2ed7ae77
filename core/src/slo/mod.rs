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
//! A P99 is judged by the lowest value the window's P99 can have at 99% confidence (its
//! values over the threshold must be more than a 1% tail gives by chance); the value shown is
//! the window's P99.
//!
//! A violation opens after [`SloSpec::breach_windows`] consecutive breaching windows (never on
//! a default threshold during learning) and closes after [`SloSpec::clear_windows`]
//! consecutive windows back within the threshold by a 5% margin (hysteresis). Its severity is
//! critical when the value is 1.5× past the threshold, else a warning. Compliance is the share of windows meeting the threshold over
//! [`SloSpec::compliance_windows`]; the burn rate is the share missing over the last
//! [`SloSpec::burn_windows`], divided by the budget `1 − target`. The job's score is the
//! weighted compliance of its nodes.
//!
//! When a violation opens or stays open, the breaching windows' [`Profile`](crate::attribution::Profile) is compared with
//! the profile of the last healthy windows ([`attribute`](crate::attribution::attribute)), and the chain from the SLO to the
//! operator to the host cause is kept with the violation.
//!
//! The module is three parts: [`spec`] (what the config says: nodes, metrics, windows, and
//! their validation), [`engine`] (windows, baselines, violations, attribution) and [`view`]
//! (what a snapshot shows of the tree).

pub mod engine;
pub mod spec;
pub mod view;

pub use engine::SloEngine;
pub use spec::{Metric, NodeSpec, Objective, SloSpec, SloSpecError, Stat, ROOT};
pub use view::{NodeState, NodeView, Severity, SloSnapshot, ThresholdSource, Violation};
