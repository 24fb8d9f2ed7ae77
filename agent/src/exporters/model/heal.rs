//! `slo_probe_heal_*`: the healer of each job (its training process `pid`). Series: one
//! `state` per phase (a state set), one per strategy in force, one `actions_total` per strategy
//! and outcome seen, one `posterior_mean` per arm tried, three `pareto` per front point (≤ 8).

use slo_probe_core::healer::{HealerView, Phase};

use super::{Family, Kind, Sink};

static ACTIONS: Family = Family {
    name: "slo_probe_heal_actions_total",
    kind: Kind::Counter,
    help: "Healer actions by strategy and outcome (decided, applied, failed, skipped, shadow, \
           kept, rolled_back, released).",
    unit: "",
};
static STATE: Family = Family {
    name: "slo_probe_heal_state",
    kind: Kind::Gauge,
    help: "The healer's phase of each job: 1 for the phase it is in.",
    unit: "",
};
static IN_FORCE: Family = Family {
    name: "slo_probe_heal_strategy_in_force",
    kind: Kind::Gauge,
    help: "Strategies kept in force for the job (1), with their level.",
    unit: "",
};
static REWARD: Family = Family {
    name: "slo_probe_heal_reward",
    kind: Kind::Gauge,
    help: "Reward of the latest measured window (seed 4.3: 0.4 latency + 0.35 throughput + 0.25 \
           CPU headroom, against the job's baseline; 0 when a constraint broke).",
    unit: "1",
};
static POSTERIOR: Family = Family {
    name: "slo_probe_heal_posterior_mean",
    kind: Kind::Gauge,
    help: "Posterior mean reward of each arm the tuner has sampled (discounted Thompson \
           sampling).",
    unit: "1",
};
static HYPERVOLUME: Family = Family {
    name: "slo_probe_heal_hypervolume",
    kind: Kind::Gauge,
    help: "Hypervolume of the Pareto front of the measured arms over (latency, throughput, CPU \
           headroom), against the origin.",
    unit: "1",
};
static PARETO: Family = Family {
    name: "slo_probe_heal_pareto",
    kind: Kind::Gauge,
    help: "Points of the Pareto front: each arm's normalised objective (latency, throughput, \
           cpu).",
    unit: "1",
};
static LAST_HOUR: Family = Family {
    name: "slo_probe_heal_actions_last_hour",
    kind: Kind::Gauge,
    help: "Actions the healer took for the job in the last hour (capped by \
           heal.max_actions_per_hour).",
    unit: "",
};

/// The healers' families; none without a healer.
pub(super) fn walk(sink: &mut impl Sink, views: &[HealerView]) {
    if views.is_empty() {
        return;
    }
    let pids: Vec<String> = views.iter().map(|v| v.job.to_string()).collect();
    let jobs = || views.iter().zip(&pids);
    sink.family(&ACTIONS);
    for (v, pid) in jobs() {
        for o in &v.outcomes {
            sink.sample(
                &ACTIONS,
                &[
                    ("pid", pid),
                    ("strategy", o.strategy.as_str()),
                    ("outcome", o.outcome),
                ],
                o.count as f64,
            );
        }
    }
    sink.family(&STATE);
    for (v, pid) in jobs() {
        for p in Phase::ALL {
            sink.sample(
                &STATE,
                &[("pid", pid), ("state", p.as_str())],
                f64::from(u8::from(p == v.phase)),
            );
        }
    }
    sink.family(&IN_FORCE);
    for (v, pid) in jobs() {
        for f in &v.in_force {
            let action = f.action.to_string();
            sink.sample(
                &IN_FORCE,
                &[
                    ("pid", pid),
                    ("strategy", f.arm.strategy.as_str()),
                    ("level", f.arm.level.as_str()),
                    ("action", &action),
                ],
                1.0,
            );
        }
    }
    sink.family(&REWARD);
    for (v, pid) in jobs() {
        if let Some(r) = v.reward {
            sink.sample(&REWARD, &[("pid", pid)], r);
        }
    }
    sink.family(&POSTERIOR);
    for (v, pid) in jobs() {
        for a in &v.posterior {
            sink.sample(
                &POSTERIOR,
                &[
                    ("pid", pid),
                    ("strategy", a.arm.strategy.as_str()),
                    ("level", a.arm.level.as_str()),
                ],
                a.mean,
            );
        }
    }
    sink.family(&HYPERVOLUME);
    for (v, pid) in jobs() {
        sink.sample(&HYPERVOLUME, &[("pid", pid)], v.hypervolume);
    }
    sink.family(&PARETO);
    for (v, pid) in jobs() {
        for p in &v.pareto {
            for (objective, value) in [
                ("latency", p.latency),
                ("throughput", p.throughput),
                ("cpu", p.cpu),
            ] {
                sink.sample(
                    &PARETO,
                    &[
                        ("pid", pid),
                        ("strategy", p.arm.strategy.as_str()),
                        ("level", p.arm.level.as_str()),
                        ("objective", objective),
                    ],
                    value,
                );
            }
        }
    }
    sink.family(&LAST_HOUR);
    for (v, pid) in jobs() {
        sink.sample(&LAST_HOUR, &[("pid", pid)], f64::from(v.actions_last_hour));
    }
}

#[cfg(test)]
mod tests {
    use slo_probe_core::{
        healer::{Arm, ArmView, InForce, Level, OutcomeCount, ParetoPoint, Strategy},
        snapshot::Snapshot,
    };

    use super::*;
    use crate::exporters::prometheus::render;

    #[test]
    fn families_and_series() {
        let arm = Arm {
            strategy: Strategy::NumaPinning,
            level: Level::Strong,
        };
        let v = HealerView {
            job: 42,
            phase: Phase::Kept,
            in_force: vec![InForce {
                action: 3,
                arm,
                since_ns: 1,
            }],
            reward: Some(0.93),
            posterior: vec![ArmView {
                arm,
                mean: 0.8,
                alpha: 8.0,
                beta: 2.0,
                pulls: 1,
            }],
            pareto: vec![ParetoPoint {
                arm,
                latency: 1.0,
                throughput: 0.9,
                cpu: 0.8,
            }],
            hypervolume: 0.72,
            outcomes: vec![OutcomeCount {
                strategy: Strategy::NumaPinning,
                outcome: "kept",
                count: 1,
            }],
            ..Default::default()
        };
        let out = render(
            &Snapshot {
                healers: vec![v],
                ..Default::default()
            },
            false,
        );
        for line in [
            "slo_probe_heal_actions_total{pid=\"42\",strategy=\"numa-pinning\",outcome=\"kept\"} 1",
            "slo_probe_heal_state{pid=\"42\",state=\"kept\"} 1",
            "slo_probe_heal_state{pid=\"42\",state=\"watching\"} 0",
            "slo_probe_heal_strategy_in_force{pid=\"42\",strategy=\"numa-pinning\",level=\"strong\",action=\"3\"} 1",
            "slo_probe_heal_reward{pid=\"42\"} 0.93",
            "slo_probe_heal_hypervolume{pid=\"42\"} 0.72",
            "slo_probe_heal_pareto{pid=\"42\",strategy=\"numa-pinning\",level=\"strong\",objective=\"throughput\"} 0.9",
            "slo_probe_heal_posterior_mean{pid=\"42\",strategy=\"numa-pinning\",level=\"strong\"} 0.8",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        for f in ["actions_total", "state", "reward", "hypervolume", "pareto"] {
            assert_eq!(
                out.matches(&format!("# TYPE slo_probe_heal_{f} ")).count(),
                1,
                "{f}"
            );
        }
        let empty = render(&Snapshot::default(), false);
        assert!(!empty.contains("slo_probe_heal_"));
    }
}
