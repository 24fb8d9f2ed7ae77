//! slo-probe's pure logic: aggregation of what the sources read, windows, the SLO tree and its
//! decisions. No OS access (no aya, tokio, libc or NVML), so plain `cargo test` covers all of it
//! with recorded or generated inputs.
#![deny(missing_docs)]

pub mod attribution;
pub mod cgroup;
pub mod gpu;
pub mod gputrace;
pub mod host;
pub mod net;
pub mod occupancy;
pub mod pipeline;
pub mod proctree;
pub mod roles;
pub mod slo;
pub mod snapshot;
pub mod straggler;
#[cfg(any(test, feature = "synth"))]
pub mod synth;
pub mod threads;
