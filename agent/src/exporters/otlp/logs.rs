//! The healer's audit trail as OTLP log records (issue: every decision and action audited):
//! one record per event of each job's timeline in the snapshot, with the sentence of
//! [`crate::healer::audit::body`] as its body, its severity, and the flat `slo_probe.heal.*`
//! attributes of [`crate::healer::audit::attributes`]. Each goes out once, on the job's own
//! resource when the job is a process the shim reports, else on the node's.

use std::{collections::HashMap, time::SystemTime};

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry_sdk::logs::SdkLoggerProvider;
use slo_probe_core::healer::{AuditEvent, HealerView};

use super::traces::wall;
use crate::healer::audit::{self, AttrValue};

/// Which events of each job's timeline went out: the latest event time and how many events
/// had that time (the timeline is in time order and may hold several at one instant).
#[derive(Default)]
pub(super) struct Sent(HashMap<u32, (u64, usize)>);

impl Sent {
    /// The events of `h`'s timeline not sent yet, marking them sent.
    pub(super) fn take<'a>(&mut self, h: &'a HealerView) -> Vec<&'a AuditEvent> {
        let (last, at_last) = self.0.get(&h.job).copied().unwrap_or((0, 0));
        let mut same = 0;
        let new: Vec<&AuditEvent> = h
            .timeline
            .iter()
            .filter(|e| {
                if e.at_ns < last {
                    return false;
                }
                if e.at_ns == last {
                    same += 1;
                    return same > at_last;
                }
                true
            })
            .collect();
        if let Some(newest) = h.timeline.iter().map(|e| e.at_ns).max() {
            let n = h.timeline.iter().filter(|e| e.at_ns == newest).count();
            self.0.insert(h.job, (newest, n));
        }
        new
    }

    /// Forgets the jobs no healer follows any more.
    pub(super) fn retain(&mut self, jobs: &[u32]) {
        self.0.retain(|j, _| jobs.contains(j));
    }
}

/// Emits `e` as a log record.
pub(super) fn send(provider: &SdkLoggerProvider, e: &AuditEvent, now_mono: u64) {
    let logger = provider.logger("slo-probe.heal");
    let mut r = logger.create_log_record();
    r.set_event_name("slo_probe.heal");
    r.set_timestamp(wall(e.at_ns, now_mono));
    r.set_observed_timestamp(SystemTime::now());
    let (number, text) = match audit::severity(e) {
        audit::Severity::Info => (Severity::Info, "INFO"),
        audit::Severity::Warn => (Severity::Warn, "WARN"),
        audit::Severity::Error => (Severity::Error, "ERROR"),
    };
    r.set_severity_number(number);
    r.set_severity_text(text);
    r.set_body(AnyValue::from(audit::body(e)));
    for (k, v) in audit::attributes(e) {
        let v = match v {
            AttrValue::Str(s) => AnyValue::from(s),
            AttrValue::Int(i) => AnyValue::from(i),
            AttrValue::Float(f) => AnyValue::from(f),
            AttrValue::Bool(b) => AnyValue::from(b),
        };
        r.add_attribute(k, v);
    }
    logger.emit(r);
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_core::healer::{Event, Healer, HealerConfig};

    fn view(job: u32, times: &[u64]) -> HealerView {
        let mut v = Healer::new(job, HealerConfig::default()).view(0);
        v.timeline = times
            .iter()
            .map(|&at_ns| AuditEvent {
                at_ns,
                job,
                action: None,
                event: Event::NoRule,
            })
            .collect();
        v
    }

    #[test]
    fn each_event_goes_out_once_also_several_at_one_instant() {
        let mut sent = Sent::default();
        assert_eq!(sent.take(&view(7, &[1, 2, 2])).len(), 3);
        assert_eq!(sent.take(&view(7, &[1, 2, 2])).len(), 0);
        // A third event at 2 and one at 3 arrive; the oldest fell out of the timeline.
        let new: Vec<u64> = sent
            .take(&view(7, &[2, 2, 2, 3]))
            .iter()
            .map(|e| e.at_ns)
            .collect();
        assert_eq!(new, vec![2, 3]);
        // Another job is apart.
        assert_eq!(sent.take(&view(8, &[3])).len(), 1);
        sent.retain(&[8]);
        assert_eq!(sent.take(&view(7, &[3])).len(), 1);
    }
}
