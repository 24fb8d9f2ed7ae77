//! The pipeline of fcd3bc2 (before the restructuring): TraceAssembler + SloEngine by hand, as
//! its core/benches/pipeline.rs drove them. Built by bench/pipeline-ab inside that tree.
use slo_probe_common::{AnyRecord, RecordIter};
use slo_probe_core::{gputrace::TraceAssembler, occupancy::SmLimits, slo::{SloEngine, SloSpec}};
fn pipeline(bytes: &[u8]) -> u64 {
    let mut asm = TraceAssembler::new();
    asm.set_limits(SmLimits::for_capability(9, 0));
    let mut engine = SloEngine::new(SloSpec { window_ms: 1000, ..SloSpec::default() }).expect("spec");
    let mut last_ts = 0u64;
    let mut n = 0u64;
    let mut taken = 0u64;
    for r in RecordIter::new(bytes).flatten() {
        if let AnyRecord::GpuKernel(k) = &r { last_ts = k.end_ns; }
        asm.push(&r);
        n += 1;
        if n % 4096 == 0 {
            for it in asm.take_iterations(last_ts, 50_000_000, false) { engine.push_iteration(&it); taken += 1; }
            engine.advance(last_ts.saturating_sub(50_000_000));
        }
    }
    for it in asm.take_iterations(0, 0, true) { engine.push_iteration(&it); taken += 1; }
    engine.advance(last_ts + 1_000_000_000);
    taken + engine.snapshot().windows
}
const LABEL: &str = "base";
