//! Throughput of the GPU pipeline on one core: kernel records through decoding, iteration
//! assembly and the SLO engine's windows, against decoding alone measured in the same run; and
//! memory under high operator cardinality. `cargo bench -p slo-probe-core --bench pipeline`
//! (or `bench/pipeline`, which also writes `bench/results/pipeline.md`).

use std::{hint::black_box, time::Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use slo_probe_common::{AnyRecord, RecordIter};
use slo_probe_core::{
    gputrace::TraceAssembler,
    occupancy::SmLimits,
    pipeline::{PipelineSettings, ProcessPipeline},
    slo::SloSpec,
    synth::{case, generate, Trace},
};

/// A healthy generated job (GPU-bound, ~40 kernels per iteration), 200 s long so that setting
/// up the assembler and the engine does not weigh.
fn trace() -> Trace {
    let mut c = case("healthy", 3);
    c.duration_ns = 200_000_000_000;
    generate(&c)
}

/// Decoding alone: the baseline.
fn decode_only(bytes: &[u8]) -> u64 {
    let mut n = 0u64;
    for r in RecordIter::new(bytes).flatten() {
        if let AnyRecord::GpuKernel(k) = r {
            n = n.wrapping_add(k.end_ns);
        }
    }
    n
}

/// What the agent does with a shim's records, through the same pipeline: decode, assemble
/// iterations (advancing every 4096 records, as the drain loop does every 50 ms), feed the SLO
/// engine and close its windows.
fn pipeline(bytes: &[u8]) -> u64 {
    let mut settings = PipelineSettings::live(
        SloSpec {
            window_ms: 1000,
            ..SloSpec::default()
        },
        0,
    );
    settings.settle_ns = 50_000_000;
    settings.lag_ns = 50_000_000;
    settings.limits = SmLimits::for_capability(9, 0);
    let mut p = ProcessPipeline::new(1, settings).expect("spec");
    let mut last_ts = 0u64;
    let mut n = 0u64;
    for r in RecordIter::new(bytes).flatten() {
        if let AnyRecord::GpuKernel(k) = &r {
            last_ts = k.end_ns;
        }
        p.push(&r);
        n += 1;
        if n % 4096 == 0 {
            p.advance(last_ts, None, true);
        }
    }
    p.finish(None);
    let s = p.snapshot();
    s.iterations_total + s.slo.map_or(0, |t| t.windows)
}

fn median_secs(mut f: impl FnMut(), runs: usize) -> f64 {
    let mut v: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn throughput(c: &mut Criterion) {
    let t = trace();
    let fixture = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/gpu/h200-eager.bin"
    ))
    .unwrap_or_default();
    let mut g = c.benchmark_group("records");
    g.throughput(Throughput::Elements(t.kernels));
    g.sample_size(10);
    g.bench_function("decode only (baseline)", |b| {
        b.iter(|| black_box(decode_only(black_box(&t.records))))
    });
    g.bench_function("decode + assembly + SLO windows", |b| {
        b.iter(|| black_box(pipeline(black_box(&t.records))))
    });
    g.finish();

    // The same, timed here so that the ratio comes from one run.
    let base = median_secs(
        || {
            black_box(decode_only(&t.records));
        },
        7,
    );
    let full = median_secs(
        || {
            black_box(pipeline(&t.records));
        },
        7,
    );
    let k = t.kernels as f64;
    println!(
        "\nsummary (generated job, {} kernel records, {} bytes): decode only {:.1} M kernel \
         records/s; decode + assembly + SLO windows {:.1} M/s = {:.2}x the decode-only time \
         (target: at least 10 M/s)",
        t.kernels,
        t.records.len(),
        k / base / 1e6,
        k / full / 1e6,
        full / base
    );
    if !fixture.is_empty() {
        let kernels = RecordIter::new(&fixture)
            .flatten()
            .filter(|r| matches!(r, AnyRecord::GpuKernel(_)))
            .count() as f64;
        let base = median_secs(
            || {
                black_box(decode_only(&fixture));
            },
            7,
        );
        let full = median_secs(
            || {
                black_box(pipeline(&fixture));
            },
            7,
        );
        println!(
            "summary (H200 eager fixture, {kernels} kernel records): decode only {:.1} M/s; \
             full pipeline {:.1} M/s = {:.2}x",
            kernels / base / 1e6,
            kernels / full / 1e6,
            full / base
        );
    }
}

/// A job whose every kernel has a name of its own (a million distinct operators): the
/// assembler names 4096 and counts the rest under one overflow operator; memory stays bounded.
fn cardinality(c: &mut Criterion) {
    use slo_probe_common::{
        gpu::{STEP_BEGIN, STEP_END, STRING_KERNEL},
        GpuKernelRecord, Record, RecordHeader, StepRecord, StringRecord,
    };
    let n = 1_000_000u32;
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 256];
    let step = |bytes: &mut Vec<u8>, s: u64, ts: u64, phase: u32| {
        let r = StepRecord {
            header: RecordHeader::of::<StepRecord>(),
            step: s,
            ts_ns: ts,
            tid: 1,
            phase,
        };
        bytes.extend_from_slice(r.as_bytes());
    };
    for i in 0..n {
        if i % 1000 == 0 {
            if i > 0 {
                step(
                    &mut bytes,
                    u64::from(i / 1000 - 1),
                    u64::from(i) * 1000,
                    STEP_END,
                );
            }
            step(
                &mut bytes,
                u64::from(i / 1000),
                u64::from(i) * 1000 + 1,
                STEP_BEGIN,
            );
        }
        let name = format!("kernel_{i}");
        let len = StringRecord::encode(i + 1, STRING_KERNEL, name.as_bytes(), &mut buf);
        bytes.extend_from_slice(&buf[..len]);
        let k = GpuKernelRecord {
            header: RecordHeader::of::<GpuKernelRecord>(),
            start_ns: u64::from(i) * 1000 + 10,
            end_ns: u64::from(i) * 1000 + 900,
            launch_ns: u64::from(i) * 1000 + 5,
            graph_node_id: 0,
            correlation_id: i,
            device_id: 0,
            context_id: 1,
            stream_id: 7,
            graph_id: 0,
            grid: [1, 1, 1],
            block: [128, 1, 1],
            registers: 32,
            static_smem: 0,
            dynamic_smem: 0,
            name_id: i + 1,
            op_id: 0,
            launch_tid: 1,
            flags: 0,
        };
        bytes.extend_from_slice(k.as_bytes());
    }
    step(
        &mut bytes,
        u64::from(n / 1000 - 1),
        u64::from(n) * 1000,
        STEP_END,
    );
    let mut g = c.benchmark_group("cardinality");
    g.throughput(Throughput::Elements(u64::from(n)));
    g.sample_size(10);
    g.bench_function("1M distinct kernel names", |b| {
        b.iter(|| black_box(pipeline(black_box(&bytes))))
    });
    g.finish();
    let mut asm = TraceAssembler::new();
    for r in RecordIter::new(&bytes).flatten() {
        asm.push(&r);
    }
    let its = asm.take_iterations(0, 0, true);
    let ops_in_iterations: usize = its.iter().map(|i| i.ops.len()).max().unwrap_or(0);
    println!(
        "\nsummary (1,000,000 distinct kernel names in {} iterations): {} operators named (cap \
         4096 + the overflow operator), {} activities counted under the overflow operator, at \
         most {} operators in one iteration",
        its.len(),
        asm.ops_named(),
        asm.ops_overflowed(),
        ops_in_iterations
    );
}

criterion_group!(benches, throughput, cardinality);
criterion_main!(benches);
