//! The slo-probe agent: sources (eBPF), the collection loop around `slo-probe-core`, exporters
//! (Prometheus), the state API and the pieces of the `slo-probe` command line. The binary in `main.rs` only
//! parses arguments and wires these together, so integration tests use the same code.

pub mod api;
pub mod cli;
pub mod collector;
pub mod config;
pub mod exporters;
pub mod sources;

/// An error and its sources on one line: `outer: inner: innermost`.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Some errors repeat their source in their own message.
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
