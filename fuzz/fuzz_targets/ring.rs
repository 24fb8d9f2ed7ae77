//! The agent's ring reader over a hostile shared region: a client controls every byte of the
//! memory it hands over (header, `head`, `tail`, lengths, padding). The input fills the region
//! (the first two bytes choose the capacity and whether the header is made valid, so that the
//! fuzzer gets past `Ring::open`); `drain` must never read outside it, never panic, hand over
//! only records that fit the buffer, and leave `tail == head`. Then the producer side writes
//! into what is left, and a second drain must give back exactly what was pushed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slo_probe_common::{
    decode,
    ring::{Ring, RING_HEADER_LEN, RING_MAGIC, RING_VERSION},
};
use std::sync::atomic::Ordering;

fuzz_target!(|data: &[u8]| {
    let Some((&shape, rest)) = data.split_first() else {
        return;
    };
    let Some((&fix, rest)) = rest.split_first() else {
        return;
    };
    let capacity = 64usize << (shape % 8); // 64 B .. 8 KiB
    let buf_len = [16usize, 64, 256, 4096][usize::from(shape >> 6)];
    let len = RING_HEADER_LEN + capacity;
    // u64 words: the 8-byte alignment the ring needs.
    let mut region = vec![0u64; len / 8];
    // SAFETY: a u64 slice viewed as bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr().cast::<u8>(), len) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = rest.get(i % rest.len().max(1)).copied().unwrap_or(0);
    }
    if fix & 1 == 0 {
        bytes[..8].copy_from_slice(&RING_MAGIC.to_ne_bytes());
        bytes[8..12].copy_from_slice(&RING_VERSION.to_ne_bytes());
    }
    if fix & 2 == 0 {
        bytes[16..24].copy_from_slice(&(capacity as u64).to_ne_bytes());
    }
    // SAFETY: `len` readable and writable bytes, 8-byte aligned, alive for the ring's use.
    let Ok(ring) = (unsafe { Ring::open(bytes.as_mut_ptr(), len) }) else {
        return;
    };
    let mut buf = vec![0u8; buf_len];
    let mut handed = 0;
    let n = ring.drain(&mut buf, |r| {
        assert!(r.len() >= 8 && r.len() <= buf_len && r.len() % 8 == 0);
        let _ = decode(r);
        handed += 1;
    });
    assert_eq!(n, handed);
    let h = ring.header();
    assert_eq!(h.tail.load(Ordering::Relaxed), h.head.load(Ordering::Relaxed));

    // The producer after a hostile consumer state: what it commits comes back intact. A framed
    // record (kind 1, its own length in the header), as a shim writes one: the drain checks the
    // length field against what the producer committed.
    let mut record = [0x11u8; 24];
    record[..2].copy_from_slice(&1u16.to_ne_bytes());
    record[4..8].copy_from_slice(&24u32.to_ne_bytes());
    let mut pushed = 0;
    while pushed < 4 && ring.push(&record) {
        pushed += 1;
    }
    let mut back = 0;
    ring.drain(&mut buf, |r| {
        if r.len() == record.len() {
            back += 1;
        }
    });
    if buf_len >= record.len() {
        assert_eq!(back, pushed);
    }
});
