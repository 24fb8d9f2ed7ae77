//! Exporters: read the latest snapshot, never the sources.
pub mod gpu;
pub mod otlp;
pub mod prometheus;
pub mod slo;
