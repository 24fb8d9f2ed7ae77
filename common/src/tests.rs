//! Round-trip and malformed-input tests of the record ABI.
extern crate std;

use std::vec::Vec;

use super::*;

fn sample() -> RunqLatencyRecord {
    RunqLatencyRecord {
        header: RecordHeader::of::<RunqLatencyRecord>(),
        ts_ns: 123_456_789,
        delay_ns: 42_000_000,
        tgid: 1000,
        tid: 1001,
        cpu: 1,
        flags: RUNQ_FLAG_PREEMPTED,
        comm: *b"loader-0\0\0\0\0\0\0\0\0",
        prev_tid: 77,
        _pad: 0,
    }
}

#[test]
fn header_of_record() {
    let h = RecordHeader::of::<RunqLatencyRecord>();
    assert_eq!(h.kind, RecordKind::RunqLatency as u16);
    assert_eq!(h.version, 1);
    assert_eq!(h.len, 64);
}

#[test]
fn round_trip() {
    let r = sample();
    let bytes = r.as_bytes();
    assert_eq!(bytes.len(), 64);
    assert_eq!(decode_as::<RunqLatencyRecord>(bytes), Ok(r));
    assert_eq!(decode(bytes), Ok((AnyRecord::RunqLatency(r), 64)));
}

#[test]
fn round_trip_unaligned() {
    let r = sample();
    let mut buf = Vec::from([0u8; 3]);
    buf.extend_from_slice(r.as_bytes());
    assert_eq!(decode_as::<RunqLatencyRecord>(&buf[3..]), Ok(r));
}

#[test]
fn truncated() {
    let r = sample();
    let bytes = r.as_bytes();
    for cut in 0..bytes.len() {
        let err = decode(&bytes[..cut]).unwrap_err();
        let need = if cut < 8 { 8 } else { 64 };
        assert_eq!(
            err,
            DecodeError::Truncated { need, have: cut },
            "cut at {cut}"
        );
    }
}

#[test]
fn wrong_version() {
    let mut r = sample();
    r.header.version = 2;
    assert_eq!(
        decode(r.as_bytes()).unwrap_err(),
        DecodeError::WrongVersion {
            kind: 1,
            version: 2,
            expected: 1
        }
    );
}

#[test]
fn wrong_length() {
    for len in [0u32, 8, 63, 65, u32::MAX] {
        let mut r = sample();
        r.header.len = len;
        assert_eq!(
            decode(r.as_bytes()).unwrap_err(),
            DecodeError::WrongLength {
                kind: 1,
                len,
                expected: 64
            }
        );
    }
}

#[test]
fn unknown_kind() {
    let mut r = sample();
    r.header.kind = 0x02ff;
    assert_eq!(
        decode(r.as_bytes()).unwrap_err(),
        DecodeError::UnknownKind { kind: 0x02ff }
    );
    // Asking for a specific type with another kind in the header is refused too.
    assert_eq!(
        decode_as::<RunqLatencyRecord>(r.as_bytes()).unwrap_err(),
        DecodeError::UnknownKind { kind: 0x02ff }
    );
}

#[test]
fn iterates_records_and_stops_at_garbage() {
    let a = sample();
    let mut b = sample();
    b.tid = 2002;
    let mut buf = Vec::new();
    buf.extend_from_slice(a.as_bytes());
    buf.extend_from_slice(b.as_bytes());
    buf.extend_from_slice(&[0xff; 11]);
    let mut it = RecordIter::new(&buf);
    assert_eq!(it.next(), Some(Ok(AnyRecord::RunqLatency(a))));
    assert_eq!(it.next(), Some(Ok(AnyRecord::RunqLatency(b))));
    assert!(matches!(
        it.next(),
        Some(Err(DecodeError::UnknownKind { .. }))
    ));
    assert_eq!(it.next(), None);
    assert_eq!(it.dropped_bytes(), 11);
}

/// xorshift64*: deterministic bytes without a dependency.
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

#[test]
fn random_bytes_never_panic() {
    let mut decoded = 0;
    for seed in 0..20_000u64 {
        let len = (seed % 200) as usize;
        let mut bytes = random_bytes(seed, len);
        // Make a share of the inputs start with a plausible header so deeper checks run.
        if seed % 3 == 0 && bytes.len() >= 8 {
            bytes[..8].copy_from_slice(RecordHeader::of::<RunqLatencyRecord>().as_raw().as_slice());
            if seed % 2 == 0 {
                bytes[2] = (seed >> 8) as u8;
            }
        }
        let mut it = RecordIter::new(&bytes);
        for r in it.by_ref() {
            if r.is_ok() {
                decoded += 1;
            }
        }
        let _ = decode(&bytes);
    }
    assert!(
        decoded > 0,
        "no plausible input decoded: the generator is off"
    );
}

impl RecordHeader {
    fn as_raw(&self) -> [u8; 8] {
        let mut out = [0u8; 8];
        out[..2].copy_from_slice(&self.kind.to_ne_bytes());
        out[2..4].copy_from_slice(&self.version.to_ne_bytes());
        out[4..].copy_from_slice(&self.len.to_ne_bytes());
        out
    }
}

#[test]
fn log2_slots() {
    assert_eq!(log2_slot(0), 0);
    assert_eq!(log2_slot(1), 0);
    assert_eq!(log2_slot(2), 1);
    assert_eq!(log2_slot(3), 1);
    assert_eq!(log2_slot(1023), 9);
    assert_eq!(log2_slot(1024), 10);
    assert_eq!(log2_slot(u64::MAX), RUNQ_SLOTS - 1);
    for shift in 1..64u32 {
        for v in [(1u64 << shift) - 1, 1u64 << shift, (1u64 << shift) + 1] {
            let reference = (63 - v.leading_zeros()) as usize;
            assert_eq!(log2_slot(v), reference.min(RUNQ_SLOTS - 1), "v = {v}");
        }
    }
}

#[test]
fn counters_are_dense() {
    for (i, c) in Counter::ALL.iter().enumerate() {
        assert_eq!(*c as u32, i as u32);
    }
}

#[test]
fn process_and_tcp_records_round_trip() {
    let p = ProcessEventRecord {
        header: RecordHeader::of::<ProcessEventRecord>(),
        ts_ns: 5,
        event: PROC_FORK,
        pid: 10,
        ppid: 1,
        tid: 1,
        comm: *b"pt_data_worker\0\0",
    };
    let t = TcpRetransmitRecord {
        header: RecordHeader::of::<TcpRetransmitRecord>(),
        ts_ns: 6,
        skaddr: 0xffff_8880_0000_1000,
        tgid: 10,
        tid: 11,
        tuple: TcpTuple {
            saddr: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            daddr: [10, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            sport: 40000,
            dport: 29500,
            family: net::AF_INET,
            _pad: 0,
        },
        state: 1,
        segments: 2,
    };
    let mut buf = Vec::new();
    buf.extend_from_slice(p.as_bytes());
    buf.extend_from_slice(t.as_bytes());
    let got: Vec<_> = RecordIter::new(&buf).collect();
    assert_eq!(
        got,
        [
            Ok(AnyRecord::ProcessEvent(p)),
            Ok(AnyRecord::TcpRetransmit(t))
        ]
    );
    let mut short = t;
    short.header.len = 48;
    assert!(matches!(
        decode(short.as_bytes()),
        Err(DecodeError::WrongLength { .. })
    ));
}

#[test]
fn gpu_records_and_strings_round_trip() {
    let k = GpuKernelRecord {
        header: RecordHeader::of::<GpuKernelRecord>(),
        start_ns: 100,
        end_ns: 200,
        launch_ns: 90,
        graph_node_id: 7,
        correlation_id: 3,
        device_id: 0,
        context_id: 1,
        stream_id: 7,
        graph_id: 2,
        grid: [4, 1, 1],
        block: [128, 1, 1],
        registers: 32,
        static_smem: 0,
        dynamic_smem: 1024,
        name_id: 5,
        op_id: 6,
        launch_tid: 9,
        flags: gpu::KERNEL_IN_GRAPH,
    };
    let mut buf = Vec::from(k.as_bytes());
    let mut s = [0u8; 64];
    let used = StringRecord::encode(
        5,
        gpu::STRING_KERNEL,
        b"triton_poi_fused_addmm_relu_0",
        &mut s,
    );
    assert_eq!(used % 8, 0);
    buf.extend_from_slice(&s[..used]);
    let got: Vec<_> = RecordIter::new(&buf).collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], Ok(AnyRecord::GpuKernel(k)));
    match got[1] {
        Ok(AnyRecord::String(r)) => {
            assert_eq!((r.id, r.kind), (5, gpu::STRING_KERNEL));
            assert_eq!(r.bytes, b"triton_poi_fused_addmm_relu_0");
        }
        ref other => panic!("{other:?}"),
    }
    // A string record whose length is not a multiple of 8, or too short, is refused.
    let mut bad = s;
    bad[4] = 20;
    assert!(matches!(decode(&bad), Err(DecodeError::WrongLength { .. })));
    // Names longer than the limit are cut, not refused.
    let long = [b'x'; gpu::STRING_MAX + 100];
    let mut out = [0u8; 16 + gpu::STRING_MAX + 8];
    let used = StringRecord::encode(1, gpu::STRING_OP, &long, &mut out);
    match decode(&out[..used]) {
        Ok((AnyRecord::String(r), n)) => {
            assert_eq!(n, used);
            assert_eq!(r.bytes.len(), gpu::STRING_MAX);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn depth_records_round_trip_and_are_checked() {
    let d = DepthRecord {
        header: RecordHeader::of::<DepthRecord>(),
        from_ns: 1_000_000,
        depth: gpu::DEPTH_KERNELS,
        reason: gpu::DEPTH_REASON_SAMPLE,
    };
    assert_eq!(
        (d.header.kind, d.header.len),
        (RecordKind::Depth as u16, 24)
    );
    let mut buf = Vec::from(d.as_bytes());
    let mut off = d;
    off.depth = gpu::DEPTH_OFF;
    off.reason = gpu::DEPTH_REASON_RELEASED;
    buf.extend_from_slice(off.as_bytes());
    let got: Vec<_> = RecordIter::new(&buf).collect();
    assert_eq!(got, [Ok(AnyRecord::Depth(d)), Ok(AnyRecord::Depth(off))]);
    // The decoder stays total: every cut and a wrong length are errors, never a panic.
    for cut in 0..24 {
        assert!(decode(&buf[..cut]).is_err(), "cut at {cut}");
    }
    let mut long = d;
    long.header.len = 32;
    let mut padded = Vec::from(long.as_bytes());
    padded.extend_from_slice(&[0; 8]);
    assert_eq!(
        decode(&padded).unwrap_err(),
        DecodeError::WrongLength {
            kind: RecordKind::Depth as u16,
            len: 32,
            expected: 24
        }
    );
    assert_eq!(RecordKind::from_raw(0x0206), Some(RecordKind::Depth));
}
