//! Exporters: read the latest snapshot, never the sources.
pub mod otlp;
pub mod prometheus;
