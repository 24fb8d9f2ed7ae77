//! The slo-probe agent: sources (eBPF), the collection loop around `slo-probe-core`, exporters
//! (Prometheus), the state API and the pieces of the `slo-probe` command line. The binary in `main.rs` only
//! parses arguments and wires these together, so integration tests use the same code.

// The JSON reports are nested `json!` literals deeper than the default limit.
#![recursion_limit = "256"]

pub mod api;
pub mod cli;
pub mod collector;
pub mod config;
pub mod exporters;
pub mod healer;
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

/// Gives memory that was freed back to the system (glibc keeps freed memory in its arenas
/// otherwise): after a gone process's tables are dropped.
pub fn release_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Large allocations (a process's tables) get their own mappings, returned to the system when
/// freed: glibc would otherwise raise its mmap threshold after the first large free and keep
/// later ones in arena heaps that `malloc_trim` cannot shrink. Called once at start.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt has no preconditions; fixed values also stop the dynamic adjustment.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
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
