//! `slo_probe_heal_*`: the healer of each job (its training process `pid`). Series: one
//! `state` per phase (a state set), one per strategy in force, one `actions_total` per strategy
//! and outcome seen, one `posterior_mean` per arm tried, three `pareto` per front point (≤ 8).

use std::fmt::Write as _;

use slo_probe_core::healer::{HealerView, Phase};

use super::{escape, header};

/// Renders the healers' views.
pub fn render_heal(out: &mut String, views: &[HealerView]) {
    if views.is_empty() {
        return;
    }
    header(
        out,
        "slo_probe_heal_actions_total",
        "counter",
        "Healer actions by strategy and outcome (decided, applied, failed, skipped, shadow, kept, rolled_back, released).",
    );
    for v in views {
        for o in &v.outcomes {
            let _ = writeln!(
                out,
                "slo_probe_heal_actions_total{{pid=\"{}\",strategy=\"{}\",outcome=\"{}\"}} {}",
                v.job,
                o.strategy.as_str(),
                o.outcome,
                o.count
            );
        }
    }
    header(
        out,
        "slo_probe_heal_state",
        "gauge",
        "The healer's phase of each job: 1 for the phase it is in.",
    );
    for v in views {
        for p in Phase::ALL {
            let _ = writeln!(
                out,
                "slo_probe_heal_state{{pid=\"{}\",state=\"{}\"}} {}",
                v.job,
                p.as_str(),
                u8::from(p == v.phase)
            );
        }
    }
    header(
        out,
        "slo_probe_heal_strategy_in_force",
        "gauge",
        "Strategies kept in force for the job (1), with their level.",
    );
    for v in views {
        for f in &v.in_force {
            let _ = writeln!(
                out,
                "slo_probe_heal_strategy_in_force{{pid=\"{}\",strategy=\"{}\",level=\"{}\",action=\"{}\"}} 1",
                v.job,
                f.arm.strategy.as_str(),
                f.arm.level.as_str(),
                f.action
            );
        }
    }
    header(
        out,
        "slo_probe_heal_reward",
        "gauge",
        "Reward of the latest measured window (seed 4.3: 0.4 latency + 0.35 throughput + 0.25 CPU headroom, against the job's baseline; 0 when a constraint broke).",
    );
    for v in views {
        if let Some(r) = v.reward {
            let _ = writeln!(out, "slo_probe_heal_reward{{pid=\"{}\"}} {r}", v.job);
        }
    }
    header(
        out,
        "slo_probe_heal_posterior_mean",
        "gauge",
        "Posterior mean reward of each arm the tuner has sampled (discounted Thompson sampling).",
    );
    for v in views {
        for a in &v.posterior {
            let _ = writeln!(
                out,
                "slo_probe_heal_posterior_mean{{pid=\"{}\",strategy=\"{}\",level=\"{}\"}} {}",
                v.job,
                a.arm.strategy.as_str(),
                a.arm.level.as_str(),
                a.mean
            );
        }
    }
    header(
        out,
        "slo_probe_heal_hypervolume",
        "gauge",
        "Hypervolume of the Pareto front of the measured arms over (latency, throughput, CPU headroom), against the origin.",
    );
    for v in views {
        let _ = writeln!(
            out,
            "slo_probe_heal_hypervolume{{pid=\"{}\"}} {}",
            v.job, v.hypervolume
        );
    }
    header(
        out,
        "slo_probe_heal_pareto",
        "gauge",
        "Points of the Pareto front: each arm's normalised objective (latency, throughput, cpu).",
    );
    for v in views {
        for p in &v.pareto {
            for (objective, value) in [
                ("latency", p.latency),
                ("throughput", p.throughput),
                ("cpu", p.cpu),
            ] {
                let _ = writeln!(
                    out,
                    "slo_probe_heal_pareto{{pid=\"{}\",strategy=\"{}\",level=\"{}\",objective=\"{objective}\"}} {value}",
                    v.job,
                    escape(p.arm.strategy.as_str()),
                    p.arm.level.as_str()
                );
            }
        }
    }
    header(
        out,
        "slo_probe_heal_actions_last_hour",
        "gauge",
        "Actions the healer took for the job in the last hour (capped by heal.max_actions_per_hour).",
    );
    for v in views {
        let _ = writeln!(
            out,
            "slo_probe_heal_actions_last_hour{{pid=\"{}\"}} {}",
            v.job, v.actions_last_hour
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_core::healer::{
        Arm, ArmView, InForce, Level, OutcomeCount, ParetoPoint, Strategy,
    };

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
        let mut out = String::new();
        render_heal(&mut out, &[v]);
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
        // Every family has HELP and TYPE once.
        for f in ["actions_total", "state", "reward", "hypervolume", "pareto"] {
            assert_eq!(
                out.matches(&format!("# TYPE slo_probe_heal_{f} ")).count(),
                1,
                "{f}"
            );
        }
        let mut empty = String::new();
        render_heal(&mut empty, &[]);
        assert!(empty.is_empty());
    }
}
