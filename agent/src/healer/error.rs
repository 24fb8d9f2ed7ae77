//! The errors of the healer's edge (actuators, journal, channel).

use std::path::PathBuf;

use slo_probe_core::healer::Strategy;

/// Errors of the healer's edge.
#[derive(Debug, thiserror::Error)]
pub enum HealError {
    /// A knob could not be read or written.
    #[error("cannot {op} {knob}")]
    Knob {
        /// The knob.
        knob: String,
        /// The operation.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The process, thread or cgroup of a knob is gone (or its pid was reused).
    #[error("{what}: its process, thread or cgroup is gone")]
    Gone {
        /// The knob.
        what: String,
    },
    /// The knob cannot be used here.
    #[error("{what}: {why}")]
    Unsupported {
        /// The knob.
        what: String,
        /// Why.
        why: String,
    },
    /// A value of the wrong kind for the knob (a bug or a hand-edited journal).
    #[error("{knob}: {value} is not a value for this knob; check the journal entry")]
    Mismatch {
        /// The knob.
        knob: String,
        /// The value.
        value: String,
    },
    /// The journal could not be written or read.
    #[error("cannot use the heal journal {path}; make its directory writable or set heal.journal")]
    Journal {
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The strategy channel could not be used.
    #[error("cannot use the strategy channel {path}; make heal.jobs_dir writable")]
    Channel {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Nothing of the strategy could be carried out (and nothing was written).
    #[error("{strategy} skipped: {reason}")]
    Skipped {
        /// The strategy.
        strategy: Strategy,
        /// Why.
        reason: String,
    },
    /// A write failed; what was written before it is undone.
    #[error("{strategy} could not be applied: {reason}")]
    ApplyFailed {
        /// The strategy.
        strategy: Strategy,
        /// Why.
        reason: String,
    },
    /// The healer thread could not start.
    #[error("cannot start the healer thread")]
    Thread(#[source] std::io::Error),
}
