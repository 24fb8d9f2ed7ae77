//! The record decoder on arbitrary bytes: `RecordIter` over the whole input and `decode` at
//! every 8-byte offset never panic, never read past the input, and account for every byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slo_probe_common::{decode, RecordIter};

fuzz_target!(|data: &[u8]| {
    let mut iter = RecordIter::new(data);
    let mut decoded = 0usize;
    for r in iter.by_ref() {
        if r.is_ok() {
            decoded += 1;
        }
    }
    assert!(iter.dropped_bytes() <= data.len());
    assert!(decoded <= data.len() / 8 + 1);
    for at in (0..data.len()).step_by(8) {
        if let Ok((_, used)) = decode(&data[at..]) {
            assert!(used >= 8 && used <= data.len() - at, "used {used} at {at}");
        }
    }
});
