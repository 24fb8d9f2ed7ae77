//! A healer that only decides: `replay` runs one per recording, tick by tick as the agent ran
//! it, and `observe` one per process it follows; their reports list what the healer would have
//! done (`heal.mode = shadow` without reading the host's knobs: every strategy counts as
//! available, and nothing is journalled or written).

use slo_probe_core::{
    healer::{AuditEvent, Decision, Event, Healer, HealerConfig, Outcome},
    snapshot::{ProcessSnapshot, Snapshot},
};

use super::observe::{job_observation, HostExtra};

/// One job's shadow healer and everything it decided.
pub struct ShadowHealer {
    healer: Healer,
    events: Vec<AuditEvent>,
    first_ns: Option<u64>,
}

impl ShadowHealer {
    /// A healer for job `job` with the decision parameters of `config`.
    pub fn new(job: u32, config: HealerConfig) -> Self {
        Self {
            healer: Healer::new(job, config),
            events: Vec::new(),
            first_ns: None,
        }
    }

    /// One tick at `at_ns` over the process as it stands then.
    pub fn tick(&mut self, p: ProcessSnapshot, at_ns: u64) {
        self.first_ns.get_or_insert(at_ns);
        let s = Snapshot {
            taken_at_ns: at_ns,
            processes: vec![p],
            ..Default::default()
        };
        let obs = job_observation(&s, &s.processes[0], &HostExtra::default());
        let step = self.healer.observe(&obs);
        self.events.extend(step.events);
        let reported = match step.decision {
            Decision::Apply { action, .. } => Some((action, Outcome::Shadow)),
            Decision::Revert { action, .. } => Some((action, Outcome::Reverted)),
            Decision::Keep { .. } | Decision::Nothing => None,
        };
        if let Some((action, outcome)) = reported {
            self.events
                .extend(self.healer.outcome(action, outcome, at_ns));
        }
    }

    /// What it decided so far.
    pub fn decided(&self) -> Decided {
        Decided {
            first_ns: self.first_ns,
            events: self.events.clone(),
            actions: self
                .events
                .iter()
                .filter(|e| matches!(e.event, Event::Shadow { .. }))
                .count(),
        }
    }
}

/// What a shadow healer decided.
#[derive(Clone, Debug, Default)]
pub struct Decided {
    /// Its first tick, CLOCK_MONOTONIC ns.
    pub first_ns: Option<u64>,
    /// Its audit events, oldest first.
    pub events: Vec<AuditEvent>,
    /// The actions it would have taken.
    pub actions: usize,
}
