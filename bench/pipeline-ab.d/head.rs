//! The current pipeline (ProcessPipeline), as core/benches/pipeline.rs drives it. Built by
//! bench/pipeline-ab inside the tree under test.
use slo_probe_common::{AnyRecord, RecordIter};
use slo_probe_core::{occupancy::SmLimits, pipeline::{PipelineSettings, ProcessPipeline}, slo::SloSpec};
fn pipeline(bytes: &[u8]) -> u64 {
    let mut settings = PipelineSettings::live(SloSpec { window_ms: 1000, ..SloSpec::default() }, 0);
    settings.settle_ns = 50_000_000;
    settings.lag_ns = 50_000_000;
    settings.limits = SmLimits::for_capability(9, 0);
    let mut p = ProcessPipeline::new(1, settings).expect("spec");
    let mut last_ts = 0u64;
    let mut n = 0u64;
    for r in RecordIter::new(bytes).flatten() {
        if let AnyRecord::GpuKernel(k) = &r { last_ts = k.end_ns; }
        p.push(&r);
        n += 1;
        if n % 4096 == 0 { p.advance(last_ts, None, true); }
    }
    p.finish(None);
    let s = p.snapshot();
    s.iterations_total + s.slo.map_or(0, |t| t.windows)
}
const LABEL: &str = "head";
