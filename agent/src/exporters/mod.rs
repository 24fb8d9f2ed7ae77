//! Exporters: they read the latest snapshot, never the sources. [`model`] defines every metric
//! family once and walks a snapshot into a [`model::Sink`]; [`prometheus`] writes the text
//! exposition from it and serves it, [`otlp`] builds OTLP data points from it and pushes them
//! (with a span per SLO violation). Each is an [`Exporter`]: `slo-probe agent` starts every
//! one the config enables on the same snapshot channel and stops them together.
//!
//! The healer's actuators (`healer/`, next) read the same snapshot but act on the node and the
//! job instead of exporting: they get their own trait (apply, revert) there, not this one.

#[cfg(test)]
pub(crate) mod fixture;
pub mod model;
pub mod otlp;
pub mod prometheus;

use std::sync::Arc;

use slo_probe_core::snapshot::Snapshot;
use tokio::{sync::watch, task::JoinHandle};

/// A consumer of the agent's snapshots that sends them out of the process.
pub trait Exporter: Send {
    /// Its name, for logs (`prometheus`, `otlp`).
    fn name(&self) -> &'static str;

    /// Starts it on the current Tokio runtime: it reads `snapshots` (the latest one, as it
    /// likes) until `shutdown` turns true, then flushes what it holds and ends the task.
    fn start(
        self: Box<Self>,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        shutdown: watch::Receiver<bool>,
    ) -> JoinHandle<()>;
}
