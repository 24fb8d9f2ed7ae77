//! The slo-probe agent: sources (eBPF), the collection loop around `slo-probe-core`, exporters
//! (Prometheus) and the pieces of the `slo-probe` command line. The binary in `main.rs` only
//! parses arguments and wires these together, so integration tests use the same code.

pub mod cli;
pub mod collector;
pub mod config;
pub mod exporters;
pub mod sources;

/// Characters of user input (a path, a URL, a value) that messages quote.
pub const QUOTED_CHARS: usize = 200;

/// `s` as a message quotes it: at most [`QUOTED_CHARS`] characters, then `…` (a 10 MB value in
/// a config must not become a 10 MB log line).
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(QUOTED_CHARS) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn long_input_is_clipped() {
        assert_eq!(super::clip("short"), "short");
        let long = "é".repeat(10_000);
        let c = super::clip(&long);
        assert_eq!(c.chars().count(), super::QUOTED_CHARS + 1);
        assert!(c.ends_with('…'));
    }
}
