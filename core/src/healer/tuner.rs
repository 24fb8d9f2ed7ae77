//! The tuner of seed §4.3: a reward per measured window, and a posterior per arm sampled by
//! discounted Thompson sampling.
//!
//! Reward = 0.4·latency + 0.35·throughput + 0.25·CPU headroom, each term in 0..=1 and
//! normalised against the job's own healthy baseline (the seed normalised against fixed targets:
//! 95 ms, 12000 QPS, 80% CPU):
//! - latency: 1 when the iteration P99 is at the baseline's or better, 0 at the SLO or worse,
//!   linear between (where the SLO is not above the baseline: baseline / P99);
//! - throughput: iterations/s over the baseline's, capped at 1;
//! - CPU headroom: `1 − util/0.8` (0 at 80% host CPU and above) over the baseline's headroom,
//!   capped at 1.
//!
//! GPU utilisation and gradient-sync jitter are constraints, not terms: a window whose GPU
//! utilisation fell more than the tolerance below the baseline, or whose jitter rose above the
//! SLO's and the baseline's by more than the tolerance, is infeasible (reward 0).
//!
//! Each arm's posterior is a Beta over the reward (fractional Bernoulli updates: α += w·r,
//! β += w·(1 − r), w = the number of blocks the reward was measured over); on every update all
//! arms decay toward the prior by the discount γ (discounted Thompson sampling), so that a job
//! whose conditions change is explored again. Sampling uses a seeded SplitMix64 so that runs
//! and tests are reproducible.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::strategy::Arm;

/// Weights of the three reward terms (seed §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RewardWeights {
    /// Latency term. Default 0.4.
    pub latency: f64,
    /// Throughput term. Default 0.35.
    pub throughput: f64,
    /// CPU-headroom term. Default 0.25.
    pub cpu: f64,
}

impl Default for RewardWeights {
    fn default() -> Self {
        Self {
            latency: 0.4,
            throughput: 0.35,
            cpu: 0.25,
        }
    }
}

/// Host CPU utilisation at and above which there is no headroom (seed §4.3: 80%).
pub const CPU_CEILING: f64 = 0.8;

/// The job's healthy state, the reference every term is normalised against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// Iteration P99, ms.
    pub p99_ms: f64,
    /// Iterations per second.
    pub iterations_per_s: f64,
    /// Host CPU utilisation, 0..1.
    pub host_cpu_util: f64,
    /// GPU utilisation, 0..1 (`None`: unknown, no constraint).
    pub gpu_util: Option<f64>,
    /// Gradient-sync jitter, ms (`None`: unknown, no constraint).
    pub sync_jitter_ms: Option<f64>,
    /// Median block mean of the healthy iterations, ms (what "healed" means for verification).
    pub block_ms: f64,
}

/// What one window measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Iteration P99, ms.
    pub p99_ms: f64,
    /// Iterations per second.
    pub iterations_per_s: f64,
    /// Host CPU utilisation, 0..1 (`None`: unknown, full headroom assumed).
    pub host_cpu_util: Option<f64>,
    /// GPU utilisation, 0..1.
    pub gpu_util: Option<f64>,
    /// Gradient-sync jitter, ms.
    pub sync_jitter_ms: Option<f64>,
}

/// The three normalised objectives (each 0..=1, larger is better) and the reward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Objectives {
    /// Latency term.
    pub latency: f64,
    /// Throughput term.
    pub throughput: f64,
    /// CPU-headroom term.
    pub cpu: f64,
    /// Weighted sum, 0 when a constraint is broken.
    pub reward: f64,
    /// Which constraint was broken, if any.
    pub constraint: Option<Constraint>,
}

/// A broken constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// GPU utilisation fell below the baseline by more than the tolerance.
    GpuUtilisation,
    /// Gradient-sync jitter rose above the SLO and the baseline by more than the tolerance.
    SyncJitter,
}

/// Tolerances of the two constraints.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Constraints {
    /// GPU utilisation may fall this fraction below the baseline. Default 0.05.
    pub gpu_util_drop: f64,
    /// Jitter may rise this fraction above the larger of its SLO and baseline. Default 0.5.
    pub jitter_rise: f64,
    /// Jitter SLO, ms (`None`: only the baseline counts).
    pub jitter_slo_ms: Option<f64>,
}

impl Default for Constraints {
    fn default() -> Self {
        Self {
            gpu_util_drop: 0.05,
            jitter_rise: 0.5,
            jitter_slo_ms: None,
        }
    }
}

fn unit(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

fn headroom(util: f64) -> f64 {
    unit(1.0 - util / CPU_CEILING)
}

/// The objectives and reward of `m` against `base`, with `slo_p99_ms` the iteration SLO.
pub fn objectives(
    m: &Measured,
    base: &Baseline,
    slo_p99_ms: Option<f64>,
    weights: &RewardWeights,
    limits: &Constraints,
) -> Objectives {
    let latency = match slo_p99_ms {
        Some(slo) if slo > base.p99_ms => unit((slo - m.p99_ms) / (slo - base.p99_ms)),
        _ => unit(base.p99_ms / m.p99_ms),
    };
    let throughput = unit(m.iterations_per_s / base.iterations_per_s);
    let cpu = match m.host_cpu_util {
        None => 1.0,
        Some(u) => {
            let h0 = headroom(base.host_cpu_util);
            if h0 <= 0.0 {
                if u <= base.host_cpu_util {
                    1.0
                } else {
                    0.0
                }
            } else {
                unit(headroom(u) / h0)
            }
        }
    };
    let constraint = match (m.gpu_util, base.gpu_util) {
        (Some(g), Some(b)) if g < b * (1.0 - limits.gpu_util_drop) => {
            Some(Constraint::GpuUtilisation)
        }
        _ => None,
    }
    .or(match (m.sync_jitter_ms, base.sync_jitter_ms) {
        (Some(j), Some(b)) => {
            let allowed = b.max(limits.jitter_slo_ms.unwrap_or(0.0)) * (1.0 + limits.jitter_rise);
            (j > allowed).then_some(Constraint::SyncJitter)
        }
        _ => None,
    });
    let total = weights.latency + weights.throughput + weights.cpu;
    let reward = if constraint.is_some() || total <= 0.0 {
        0.0
    } else {
        (weights.latency * latency + weights.throughput * throughput + weights.cpu * cpu) / total
    };
    Objectives {
        latency,
        throughput,
        cpu,
        reward,
        constraint,
    }
}

/// SplitMix64: small, fast, and the same sequence for the same seed everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Gamma(shape, 1) (Marsaglia–Tsang; shape < 1 through the `U^(1/shape)` boost).
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let u = self.uniform();
            return self.gamma(shape + 1.0) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// Beta(a, b).
    pub fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        if x + y > 0.0 {
            x / (x + y)
        } else {
            0.5
        }
    }
}

/// One arm's posterior and running means of its objectives.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Posterior {
    /// Beta α (prior 1).
    pub alpha: f64,
    /// Beta β (prior 1).
    pub beta: f64,
    /// Times it was measured.
    pub pulls: u64,
    /// Discounted means of the objectives (`None` until measured).
    pub objectives: Option<Objectives>,
}

impl Default for Posterior {
    fn default() -> Self {
        Self {
            alpha: 1.0,
            beta: 1.0,
            pulls: 0,
            objectives: None,
        }
    }
}

impl Posterior {
    /// Posterior mean of the reward.
    pub fn mean(&self) -> f64 {
        self.alpha / (self.alpha + self.beta)
    }
}

/// Discounted Thompson sampling over arms.
#[derive(Clone, Debug)]
pub struct Tuner {
    arms: BTreeMap<Arm, Posterior>,
    discount: f64,
    rng: Rng,
}

impl Tuner {
    /// A tuner with discount `discount` (0 < γ ≤ 1) and RNG seed `seed`.
    pub fn new(discount: f64, seed: u64) -> Self {
        Self {
            arms: BTreeMap::new(),
            discount: discount.clamp(1e-6, 1.0),
            rng: Rng::new(seed),
        }
    }

    /// The arm to play: the first of `arms` never measured (the policy lists candidates in
    /// order of preference, each at its mild level before its strong one), with its prior mean
    /// as the sample; once every strategy arm has been measured, each is sampled and the best
    /// returned (`None` if empty). Playing untried arms in order first makes the first action
    /// the policy's best guess instead of a draw between uniform priors: on the VM's busy
    /// neighbours test a first draw of deadline-aware, which cannot beat the neighbours, cost
    /// each attempt 30–60 s (tests/healing.rs).
    pub fn choose(&mut self, arms: &[Arm]) -> Option<(Arm, f64)> {
        if let Some(a) = arms
            .iter()
            .find(|a| !a.strategy.is_baseline() && self.arms.get(a).is_none_or(|p| p.pulls == 0))
        {
            return Some((*a, Posterior::default().mean()));
        }
        let mut best: Option<(Arm, f64)> = None;
        for arm in arms {
            let p = self.arms.get(arm).copied().unwrap_or_default();
            let s = self.rng.beta(p.alpha, p.beta);
            if best.is_none_or(|(_, b)| s > b) {
                best = Some((*arm, s));
            }
        }
        best
    }

    /// Records reward `o.reward` measured for `arm` over `weight` blocks; every arm decays first.
    pub fn update(&mut self, arm: Arm, o: &Objectives, weight: f64) {
        let g = self.discount;
        for p in self.arms.values_mut() {
            p.alpha = 1.0 + g * (p.alpha - 1.0);
            p.beta = 1.0 + g * (p.beta - 1.0);
        }
        let p = self.arms.entry(arm).or_default();
        let r = unit(o.reward);
        p.alpha += weight * r;
        p.beta += weight * (1.0 - r);
        p.pulls += 1;
        p.objectives = Some(match p.objectives {
            None => *o,
            Some(old) => {
                let mix = |a: f64, b: f64| g * a + (1.0 - g) * b;
                Objectives {
                    latency: mix(old.latency, o.latency),
                    throughput: mix(old.throughput, o.throughput),
                    cpu: mix(old.cpu, o.cpu),
                    reward: mix(old.reward, o.reward),
                    constraint: o.constraint,
                }
            }
        });
    }

    /// Every arm measured or sampled so far.
    pub fn posteriors(&self) -> &BTreeMap<Arm, Posterior> {
        &self.arms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::healer::strategy::{Level, Strategy};

    fn base() -> Baseline {
        Baseline {
            p99_ms: 100.0,
            iterations_per_s: 10.0,
            host_cpu_util: 0.4,
            gpu_util: Some(0.9),
            sync_jitter_ms: Some(10.0),
            block_ms: 95.0,
        }
    }

    fn m(p99: f64, ips: f64, cpu: f64) -> Measured {
        Measured {
            p99_ms: p99,
            iterations_per_s: ips,
            host_cpu_util: Some(cpu),
            gpu_util: Some(0.9),
            sync_jitter_ms: Some(10.0),
        }
    }

    #[test]
    fn reward_terms_against_the_baseline() {
        let w = RewardWeights::default();
        let c = Constraints::default();
        // At the baseline: 1.
        let o = objectives(&m(100.0, 10.0, 0.4), &base(), Some(150.0), &w, &c);
        assert_eq!(
            (o.latency, o.throughput, o.cpu, o.reward),
            (1.0, 1.0, 1.0, 1.0)
        );
        // P99 halfway to the SLO, 80% throughput, CPU at 60% (headroom 0.25 of 0.5).
        let o = objectives(&m(125.0, 8.0, 0.6), &base(), Some(150.0), &w, &c);
        assert!((o.latency - 0.5).abs() < 1e-12);
        assert!((o.throughput - 0.8).abs() < 1e-12);
        assert!((o.cpu - 0.5).abs() < 1e-12);
        assert!((o.reward - (0.4 * 0.5 + 0.35 * 0.8 + 0.25 * 0.5)).abs() < 1e-12);
        // Past the SLO, CPU past 80%: those terms are 0.
        let o = objectives(&m(200.0, 5.0, 0.9), &base(), Some(150.0), &w, &c);
        assert_eq!((o.latency, o.cpu), (0.0, 0.0));
        // An SLO at or below the baseline: baseline / P99.
        let o = objectives(&m(200.0, 10.0, 0.4), &base(), Some(90.0), &w, &c);
        assert!((o.latency - 0.5).abs() < 1e-12);
    }

    #[test]
    fn constraints_zero_the_reward() {
        let w = RewardWeights::default();
        let c = Constraints {
            jitter_slo_ms: Some(20.0),
            ..Default::default()
        };
        let mut x = m(100.0, 10.0, 0.4);
        x.gpu_util = Some(0.8);
        let o = objectives(&x, &base(), None, &w, &c);
        assert_eq!(o.constraint, Some(Constraint::GpuUtilisation));
        assert_eq!(o.reward, 0.0);
        let mut x = m(100.0, 10.0, 0.4);
        x.sync_jitter_ms = Some(29.0); // below 20 ms × 1.5
        assert_eq!(objectives(&x, &base(), None, &w, &c).constraint, None);
        x.sync_jitter_ms = Some(31.0);
        assert_eq!(
            objectives(&x, &base(), None, &w, &c).constraint,
            Some(Constraint::SyncJitter)
        );
    }

    #[test]
    fn rng_is_reproducible_and_beta_has_the_right_mean() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut r = Rng::new(1);
        for (alpha, beta) in [(2.0, 5.0), (0.5, 0.5), (30.0, 10.0)] {
            let n = 20_000;
            let mean = (0..n).map(|_| r.beta(alpha, beta)).sum::<f64>() / n as f64;
            let want = alpha / (alpha + beta);
            assert!(
                (mean - want).abs() < 0.01,
                "Beta({alpha},{beta}): {mean} vs {want}"
            );
        }
    }

    /// A simulated job: the baseline arm and six intervention arms with fixed true rewards plus
    /// noise. Thompson sampling ends up choosing the best at least 80% of the time (the discount
    /// keeps some exploration going on purpose: conditions of a live job change).
    #[test]
    fn thompson_converges_to_the_best_arm() {
        let arms: Vec<Arm> = [
            (Strategy::FcfsGpu, Level::Mild, 0.30),
            (Strategy::DeadlineAware, Level::Mild, 0.55),
            (Strategy::DeadlineAware, Level::Strong, 0.70),
            (Strategy::NumaPinning, Level::Mild, 0.60),
            (Strategy::NumaPinning, Level::Strong, 0.92),
            (Strategy::NeighborIsolation, Level::Mild, 0.50),
            (Strategy::NeighborIsolation, Level::Strong, 0.80),
        ]
        .iter()
        .map(|&(strategy, level, _)| Arm { strategy, level })
        .collect();
        let truth = [0.30, 0.55, 0.70, 0.60, 0.92, 0.50, 0.80];
        let mut t = Tuner::new(0.95, 42);
        let mut noise = Rng::new(99);
        let mut best_late = 0;
        for round in 0..300 {
            let (arm, _) = t.choose(&arms).expect("an arm");
            let i = arms.iter().position(|a| *a == arm).expect("known arm");
            let r = (truth[i] + 0.05 * noise.normal()).clamp(0.0, 1.0);
            let o = Objectives {
                reward: r,
                ..Default::default()
            };
            t.update(arm, &o, 8.0);
            if round >= 250 && i == 4 {
                best_late += 1;
            }
        }
        assert!(
            best_late >= 40,
            "best arm chosen {best_late} of the last 50 rounds"
        );
        let best = t.posteriors()[&arms[4]];
        assert!((best.mean() - 0.92).abs() < 0.05, "{best:?}");
        // Same seed, same choices.
        let mut t1 = Tuner::new(0.95, 5);
        let mut t2 = Tuner::new(0.95, 5);
        for _ in 0..10 {
            assert_eq!(t1.choose(&arms), t2.choose(&arms));
        }
    }

    /// Untried strategy arms come first, in the order given (whatever the seed), the baseline
    /// never before them; then sampling takes over.
    #[test]
    fn untried_arms_are_played_in_policy_order_first() {
        let arms = [
            Arm::BASELINE,
            Arm {
                strategy: Strategy::NeighborIsolation,
                level: Level::Mild,
            },
            Arm {
                strategy: Strategy::NeighborIsolation,
                level: Level::Strong,
            },
            Arm {
                strategy: Strategy::DeadlineAware,
                level: Level::Mild,
            },
        ];
        for seed in 0..20 {
            let mut t = Tuner::new(0.95, seed);
            let bad = Objectives {
                reward: 0.1,
                ..Default::default()
            };
            t.update(Arm::BASELINE, &bad, 8.0);
            for want in &arms[1..] {
                let (got, sample) = t.choose(&arms).expect("an arm");
                assert_eq!((got, sample), (*want, 0.5), "seed {seed}");
                t.update(got, &bad, 8.0);
            }
            // All measured: a draw, any arm.
            assert!(t.choose(&arms).is_some());
        }
    }
}
