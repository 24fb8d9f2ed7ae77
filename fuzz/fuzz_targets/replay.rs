//! The recording reader behind `slo-probe replay` on arbitrary bytes: the whole GPU pipeline
//! (trace assembly, iterations, SLO windows, attribution) runs on whatever decodes; errors are
//! values, never panics, and the report renders.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slo_probe::cli::replay::{replay_bytes, report};

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("4242.bin");
    for detect in [false, true] {
        if let Ok(r) = replay_bytes(data, path, None, detect, Some(100)) {
            assert!(r.undecoded_bytes <= data.len());
            let _ = report(&r);
        }
    }
});
