//! Exporters: read the latest snapshot, never the sources.

#[cfg(test)]
pub(crate) mod fixture;
pub mod otlp;
pub mod prometheus;
