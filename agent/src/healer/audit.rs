//! Audit events as OTLP log records: a sentence for the body, a severity, and flat key/value
//! attributes (`slo_probe.heal.*`, plus `process.pid` for the job). The OTLP exporter turns
//! them into `LogRecord`s; the journal keeps the same events as JSON.

use slo_probe_core::healer::{AuditEvent, Event};

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

/// OTLP severity of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Diagnoses, choices, applies, verdicts that keep.
    Info,
    /// Rollbacks, skips, refusals.
    Warn,
    /// Failures to apply or restore.
    Error,
}

/// The severity of `e`.
pub fn severity(e: &AuditEvent) -> Severity {
    match &e.event {
        Event::ApplyFailed { .. } | Event::RevertFailed { .. } => Severity::Error,
        Event::Revert { .. }
        | Event::Skipped { .. }
        | Event::Refused { .. }
        | Event::NoRule
        | Event::NoCandidate => Severity::Warn,
        _ => Severity::Info,
    }
}

/// A sentence for the log body.
pub fn body(e: &AuditEvent) -> String {
    let job = e.job;
    match &e.event {
        Event::Learning {
            iterations,
            needed,
            followed_s,
            needed_s,
        } => format!(
            "job {job}: violation open but no healthy baseline yet ({iterations} of {needed} \
             iterations, followed {followed_s:.1} of {needed_s:.0} s)"
        ),
        Event::Diagnosed {
            node, host, detail, ..
        } => format!(
            "job {job}: {node} violated, host cause {}: {detail}",
            host.as_str()
        ),
        Event::NoRule => format!("job {job}: no policy rule matches the cause: not acting"),
        Event::AtBaseline {
            now_ms,
            baseline_ms,
        } => format!(
            "job {job}: violation open but the iterations are at the healthy baseline ({now_ms:.2} \
             vs {baseline_ms:.2} ms a block): nothing to heal"
        ),
        Event::Skipped { strategy, reason } => format!("job {job}: {strategy} skipped: {reason}"),
        Event::NoCandidate => format!("job {job}: every candidate strategy was left out"),
        Event::Refused { reason } => format!("job {job}: not acting: {reason}"),
        Event::Chose {
            strategy, level, ..
        } => format!("job {job}: tuner chose {strategy}/{}", level.as_str()),
        Event::Apply {
            strategy, level, ..
        } => format!("job {job}: applying {strategy}/{}", level.as_str()),
        Event::Applied { strategy } => format!("job {job}: {strategy} applied"),
        Event::ApplyFailed { strategy, reason } => {
            format!("job {job}: {strategy} could not be applied: {reason}")
        }
        Event::Shadow { strategy, level } => format!(
            "job {job}: shadow mode: would apply {strategy}/{}",
            level.as_str()
        ),
        Event::Kept {
            strategy,
            stats,
            side_effects,
        } => {
            let mut s = format!(
                "job {job}: {strategy} kept: median block {:.2} → {:.2} ms (p = {:.4})",
                stats.before_ms, stats.after_ms, stats.p_better
            );
            if let Some(w) = side_effects
                .iter()
                .max_by(|a, b| a.worse_by.total_cmp(&b.worse_by))
            {
                s += &format!(
                    "; {} other nodes judged, the worst {} {:+.2}%",
                    side_effects.len(),
                    w.node,
                    w.worse_by * 100.0
                );
            }
            s
        }
        Event::Revert {
            strategy, reason, ..
        } => format!("job {job}: rolling {strategy} back ({})", reason.as_str()),
        Event::Reverted { strategy } => {
            format!("job {job}: {strategy} undone, every knob read back")
        }
        Event::RevertFailed { strategy, reason } => {
            format!("job {job}: {strategy} could not be fully undone: {reason}")
        }
    }
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, AttrValue)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                flatten(&format!("{prefix}.{k}"), v, out);
            }
        }
        serde_json::Value::Array(a) => {
            let items: Vec<String> = a
                .iter()
                .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                .collect();
            out.push((prefix.to_owned(), AttrValue::Str(items.join(","))));
        }
        serde_json::Value::String(s) => out.push((prefix.to_owned(), AttrValue::Str(s.clone()))),
        serde_json::Value::Bool(b) => out.push((prefix.to_owned(), AttrValue::Bool(*b))),
        serde_json::Value::Number(n) => out.push((
            prefix.to_owned(),
            match n.as_i64() {
                Some(i) => AttrValue::Int(i),
                None => AttrValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
        )),
        serde_json::Value::Null => {}
    }
}

/// The event's attributes: `process.pid`, `slo_probe.heal.event`, `slo_probe.heal.action` and
/// every field of the event under `slo_probe.heal.` (nested ones joined with `.`).
pub fn attributes(e: &AuditEvent) -> Vec<(String, AttrValue)> {
    let mut out = vec![
        ("process.pid".to_owned(), AttrValue::Int(i64::from(e.job))),
        (
            "slo_probe.heal.event".to_owned(),
            AttrValue::Str(e.event.name().to_owned()),
        ),
    ];
    if let Some(a) = e.action {
        out.push(("slo_probe.heal.action".to_owned(), AttrValue::Int(a as i64)));
    }
    if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(&e.event) {
        for (k, v) in &m {
            if k != "event" {
                flatten(&format!("slo_probe.heal.{k}"), v, &mut out);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_core::healer::{Level, RevertReason, Strategy, VerifyStats};

    #[test]
    fn attributes_are_flat() {
        let e = AuditEvent {
            at_ns: 1,
            job: 42,
            action: Some(3),
            event: Event::Revert {
                strategy: Strategy::NumaPinning,
                reason: RevertReason::SideEffect {
                    node: "compute".into(),
                    worse_by: 0.02,
                },
                stats: Some(VerifyStats {
                    before_blocks: 8,
                    after_blocks: 4,
                    p_better: 0.5,
                    p_worse: 0.5,
                    effect: 0.0,
                    before_ms: 1.0,
                    after_ms: 1.0,
                    reward: 0.3,
                }),
            },
        };
        let a = attributes(&e);
        let get = |k: &str| a.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("process.pid"), Some(AttrValue::Int(42)));
        assert_eq!(
            get("slo_probe.heal.event"),
            Some(AttrValue::Str("revert".into()))
        );
        assert_eq!(
            get("slo_probe.heal.strategy"),
            Some(AttrValue::Str("numa-pinning".into()))
        );
        assert_eq!(
            get("slo_probe.heal.reason.why"),
            Some(AttrValue::Str("side_effect".into()))
        );
        assert_eq!(
            get("slo_probe.heal.reason.node"),
            Some(AttrValue::Str("compute".into()))
        );
        assert_eq!(
            get("slo_probe.heal.stats.after_blocks"),
            Some(AttrValue::Int(4))
        );
        assert_eq!(severity(&e), Severity::Warn);
        assert!(body(&e).contains("rolling numa-pinning back (side_effect)"));
        let shadow = AuditEvent {
            event: Event::Shadow {
                strategy: Strategy::IoBoost,
                level: Level::Strong,
            },
            ..e
        };
        assert!(body(&shadow).contains("would apply io-boost/strong"));
    }
}
