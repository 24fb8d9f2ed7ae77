//! SLO violations as traces: one span per violation (from its start to its end, or now while
//! it is open), with a child span per attributed operator and per host cause. Sent once per
//! violation: when it has its attribution, or when it closes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::{
    trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _},
    Context, KeyValue,
};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use slo_probe_core::{attribution::Attribution, slo::Violation, snapshot::ProcessSnapshot};

/// Whether a violation is ready to go out: attributed, or closed.
pub(super) fn ready(v: &Violation) -> bool {
    v.attribution.is_some() || v.closed_ns.is_some()
}

/// CLOCK_MONOTONIC ns → wall clock.
pub(super) fn wall(mono_ns: u64, now_mono_ns: u64) -> SystemTime {
    let now = SystemTime::now();
    let ago = Duration::from_nanos(now_mono_ns.saturating_sub(mono_ns));
    now.checked_sub(ago).unwrap_or(UNIX_EPOCH)
}

/// One span per violation, a child per attributed operator and per host cause.
pub(super) fn send_violation(
    provider: &SdkTracerProvider,
    p: &ProcessSnapshot,
    v: &Violation,
    now_mono: u64,
) {
    let tracer = provider.tracer("slo-probe");
    let start = wall(v.since_ns, now_mono);
    let end = wall(v.closed_ns.unwrap_or(now_mono), now_mono);
    let mut attrs = vec![
        KeyValue::new("slo.node", v.node.clone()),
        KeyValue::new("slo.metric", v.metric.as_str()),
        KeyValue::new("slo.stat", v.stat.as_str()),
        KeyValue::new("slo.severity", v.severity.as_str()),
        KeyValue::new("slo.value", v.value),
        KeyValue::new("slo.threshold", v.threshold),
        KeyValue::new("slo.violation.id", v.id as i64),
        KeyValue::new("slo.violation.closed", v.closed_ns.is_some()),
        KeyValue::new("slo.chain", v.chain.clone()),
        KeyValue::new("process.pid", i64::from(p.pid)),
    ];
    if let Some(b) = v.baseline {
        attrs.push(KeyValue::new("slo.baseline", b));
    }
    if let Some(j) = &p.job_id {
        attrs.push(KeyValue::new("slo_probe.job.id", j.clone()));
    }
    if let Some(r) = p.rank {
        attrs.push(KeyValue::new("slo_probe.rank", i64::from(r)));
    }
    let mut parent = tracer
        .span_builder(format!("SLO violation: {}", v.node))
        .with_kind(SpanKind::Internal)
        .with_start_time(start)
        .with_attributes(attrs)
        .start(&tracer);
    let cx = Context::new().with_remote_span_context(parent.span_context().clone());
    if let Some(a) = &v.attribution {
        child_spans(&tracer, &cx, a, start, end);
    }
    parent.set_status(Status::error(v.chain.clone()));
    parent.end_with_timestamp(end);
}

fn child_spans(
    tracer: &SdkTracer,
    cx: &Context,
    a: &Attribution,
    start: SystemTime,
    end: SystemTime,
) {
    for (i, c) in a.causes.iter().enumerate() {
        let mut s = tracer
            .span_builder(format!("operator: {}", c.op))
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes([
                KeyValue::new("slo.cause.rank", i as i64 + 1),
                KeyValue::new("slo.cause.op", c.op.clone()),
                KeyValue::new("slo.cause.dimension", c.dimension.as_str()),
                KeyValue::new("slo.cause.delta_ms", c.delta_ns / 1e6),
                KeyValue::new("slo.cause.gpu_ms_before", c.gpu_ns.0 / 1e6),
                KeyValue::new("slo.cause.gpu_ms_now", c.gpu_ns.1 / 1e6),
                KeyValue::new("slo.cause.detail", c.detail.clone()),
            ])
            .start_with_context(tracer, cx);
        s.end_with_timestamp(end);
    }
    for (i, h) in a.host.iter().enumerate() {
        let mut s = tracer
            .span_builder(format!("host: {}", h.what))
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes([
                KeyValue::new("slo.cause.rank", i as i64 + 1),
                KeyValue::new("slo.cause.host", h.what.clone()),
                KeyValue::new("slo.cause.delta", h.delta),
            ])
            .start_with_context(tracer, cx);
        s.end_with_timestamp(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::trace::InMemorySpanExporter;

    /// The fixture's violation through a tracer into memory: parent and children, linked.
    #[test]
    fn a_violation_is_a_span_with_a_child_per_cause() {
        let snap = crate::exporters::fixture::rich_snapshot();
        let p = snap
            .processes
            .iter()
            .find(|p| p.slo.as_ref().is_some_and(|s| s.open().next().is_some()))
            .expect("the fixture has an open violation");
        let v = p
            .slo
            .as_ref()
            .and_then(|s| s.open().find(|v| ready(v)))
            .expect("attributed");
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        send_violation(&provider, p, v, v.since_ns + 5_000_000_000);
        let spans = exporter.get_finished_spans().expect("spans");
        let parent = spans
            .iter()
            .find(|s| s.name.starts_with("SLO violation: "))
            .expect("parent");
        let children: Vec<_> = spans
            .iter()
            .filter(|s| s.parent_span_id == parent.span_context.span_id())
            .collect();
        let causes = v
            .attribution
            .as_ref()
            .map_or(0, |a| a.causes.len() + a.host.len());
        assert_eq!(children.len(), causes);
        assert!(children
            .iter()
            .any(|c| c.name == "operator: ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
        assert!(parent.end_time > parent.start_time);
        let attr = |k: &str| {
            parent
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(attr("slo_probe.rank"), Some(opentelemetry::Value::I64(1)));
        assert_eq!(attr("process.pid"), Some(opentelemetry::Value::I64(4300)));
    }
}
