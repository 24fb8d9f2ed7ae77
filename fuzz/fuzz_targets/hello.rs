//! The shim's hello message on arbitrary bytes: `ShimHello::from_bytes` never panics, and what
//! it accepts encodes back to the same 32 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slo_probe_common::ring::{ShimHello, HELLO_MAGIC, RING_VERSION};

fuzz_target!(|data: &[u8]| {
    if let Some(h) = ShimHello::from_bytes(data) {
        assert_eq!(h.magic, HELLO_MAGIC);
        assert_eq!(h.version, RING_VERSION);
        assert_eq!(&h.to_bytes()[..], &data[..32]);
    } else if data.len() >= 32 {
        // Refused: wrong magic or version, never a parsing accident.
        let magic = u64::from_ne_bytes(data[..8].try_into().expect("8 bytes"));
        let version = u32::from_ne_bytes(data[8..12].try_into().expect("4 bytes"));
        assert!(magic != HELLO_MAGIC || version != RING_VERSION);
    }
});
