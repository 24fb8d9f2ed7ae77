//! Verification statistics: block means (consecutive iterations averaged, to tame
//! autocorrelation), the exact one-sided Mann–Whitney test over the blocks before and after an
//! action, the effect size beside it, and the side-effect check on other SLO nodes.
//!
//! With `m` and `n` blocks the null distribution of U is the coefficient list of the Gaussian
//! binomial coefficient `[m+n choose m]_q`, built exactly in integers as
//! `∏ (1 − q^(n+i)) / (1 − q^i)`, i = 1..m; beyond [`EXACT_MAX`] blocks in all the normal
//! approximation with continuity correction is used. Ties count one half in U and the p-value is
//! taken at the integer below (conservative).

/// Most blocks (both sides together) the exact distribution is computed for.
pub const EXACT_MAX: usize = 60;

/// Means of consecutive complete blocks of `block` values (an incomplete tail is left out).
pub fn block_means(values: &[f64], block: usize) -> Vec<f64> {
    if block == 0 {
        return Vec::new();
    }
    values
        .chunks_exact(block)
        .map(|c| c.iter().sum::<f64>() / block as f64)
        .collect()
}

/// U of `x` against `y`: pairs with `x_i > y_j`, plus one half per tie.
pub fn u_statistic(x: &[f64], y: &[f64]) -> f64 {
    let mut u = 0.0;
    for a in x {
        for b in y {
            if a > b {
                u += 1.0;
            } else if a == b {
                u += 0.5;
            }
        }
    }
    u
}

/// Counts of U = 0..=m·n over all C(m+n, m) arrangements without ties.
fn u_counts(m: usize, n: usize) -> Vec<i128> {
    let deg = m * n;
    let mut c = vec![0i128; deg + 1];
    c[0] = 1;
    for i in 1..=m {
        // × (1 − q^(n+i)), from the top so that each coefficient is read before it is written.
        let s = n + i;
        for k in (s..=deg).rev() {
            c[k] -= c[k - s];
        }
        // ÷ (1 − q^i): a running sum with stride i.
        for k in i..=deg {
            c[k] += c[k - i];
        }
    }
    c
}

/// One-sided p-value that `x` tends to be larger than `y` (H1: P(X > Y) > 1/2): the null
/// probability of a U at least as large as the observed one. `None` when a side is empty.
pub fn mann_whitney_greater(x: &[f64], y: &[f64]) -> Option<f64> {
    let (m, n) = (x.len(), y.len());
    if m == 0 || n == 0 {
        return None;
    }
    let u = u_statistic(x, y);
    if m + n <= EXACT_MAX {
        let counts = u_counts(m, n);
        let from = u.floor() as usize;
        let total: i128 = counts.iter().sum();
        let tail: i128 = counts[from.min(counts.len() - 1)..].iter().sum();
        return Some(tail as f64 / total as f64);
    }
    let (mf, nf) = (m as f64, n as f64);
    let mean = mf * nf / 2.0;
    let sd = (mf * nf * (mf + nf + 1.0) / 12.0).sqrt();
    let z = (u.floor() - 0.5 - mean) / sd;
    Some(upper_normal_tail(z))
}

/// P(Z ≥ z) for a standard normal Z (Abramowitz–Stegun 7.1.26 through erfc, |error| < 1.5e-7).
fn upper_normal_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erfc_abs = poly * (-x * x).exp();
    let erfc = if x >= 0.0 { erfc_abs } else { 2.0 - erfc_abs };
    erfc / 2.0
}

/// The median of `v` (`None` when empty).
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let k = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[k]
    } else {
        (s[k - 1] + s[k]) / 2.0
    })
}

/// The mean of `v` (`None` when empty).
pub fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Before/after blocks of a lower-is-better metric (iteration time) compared both ways.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// p-value that after is better (smaller) than before.
    pub p_better: f64,
    /// p-value that after is worse (larger) than before.
    pub p_worse: f64,
    /// Relative improvement of the medians, (before − after) / before: positive when better.
    pub effect: f64,
    /// Median block before, in the metric's unit.
    pub before: f64,
    /// Median block after.
    pub after: f64,
}

/// Compares blocks of a lower-is-better metric; `None` when a side is empty.
pub fn compare(before: &[f64], after: &[f64]) -> Option<Comparison> {
    let b = median(before)?;
    let a = median(after)?;
    Some(Comparison {
        p_better: mann_whitney_greater(before, after)?,
        p_worse: mann_whitney_greater(after, before)?,
        effect: if b.abs() > 0.0 { (b - a) / b } else { 0.0 },
        before: b,
        after: a,
    })
}

/// Values a node needs on each side before its change can count as a side effect.
pub const MIN_NODE_SAMPLES: usize = 3;

/// How much a node got worse from `before` to `after` (values sampled once per tick), as a
/// fraction of its before mean, when that counts as a side effect: worse by more than
/// `budget` and by more than twice the standard error of the difference (so that noise alone
/// never rolls an action back). `None`: no side effect.
pub fn side_effect(
    before: &[f64],
    after: &[f64],
    higher_is_better: bool,
    budget: f64,
) -> Option<f64> {
    if before.len() < MIN_NODE_SAMPLES || after.len() < MIN_NODE_SAMPLES {
        return None; // too few windows judged on a side to tell anything
    }
    let (mb, ma) = (mean(before)?, mean(after)?);
    let (worse_by, relative) = worsening(mb, ma, higher_is_better);
    let var = |v: &[f64], m: f64| {
        if v.len() < 2 {
            0.0
        } else {
            v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64
        }
    };
    let se = (var(before, mb) / before.len() as f64 + var(after, ma) / after.len() as f64).sqrt();
    (relative > budget && worse_by > 2.0 * se).then_some(relative)
}

/// How much worse a value got from `before` to `after` (negative: better), in its unit and as
/// a fraction of `before`.
pub fn worsening(before: f64, after: f64, higher_is_better: bool) -> (f64, f64) {
    let worse = if higher_is_better {
        before - after
    } else {
        after - before
    };
    (worse, worse / before.abs().max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(x: &[f64], y: &[f64]) -> f64 {
        mann_whitney_greater(x, y).expect("p")
    }

    #[test]
    fn exact_null_distribution_sums_to_the_binomial() {
        for (m, n, total) in [(4, 4, 70i128), (5, 5, 252), (3, 5, 56), (8, 8, 12_870)] {
            let c = u_counts(m, n);
            assert_eq!(c.iter().sum::<i128>(), total);
            assert!(c.iter().all(|&x| x >= 0));
            // Symmetric about m·n/2.
            let r: Vec<i128> = c.iter().rev().copied().collect();
            assert_eq!(c, r);
        }
        assert_eq!(u_counts(4, 4)[..5], [1, 1, 2, 3, 5]);
    }

    /// Published one-sided critical probabilities (e.g. Siegel & Castellan, table J): for
    /// n1 = n2 = 4, P(U ≤ 0..=3) = .014 .029 .057 .100; n1 = n2 = 5, P(U ≤ 0..=5) = .004 .008 .016
    /// .028 .048 .075; n1 = 3, n2 = 5, P(U ≤ 0..=3) = .018 .036 .071 .125.
    #[test]
    fn p_values_match_published_tables() {
        // x > y in all but `k` pairs: U = m·n − k, so P(U ≥ m·n − k) = P(U ≤ k).
        fn with_inversions(m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
            // y = 0..n, x all above y; then move the smallest x below k of the y values.
            let y: Vec<f64> = (0..n).map(|i| i as f64).collect();
            let mut x: Vec<f64> = (0..m).map(|i| (n + i) as f64).collect();
            let mut left = k;
            for xi in x.iter_mut() {
                let step = left.min(n);
                *xi = (n - step) as f64 - 0.5;
                left -= step;
                if left == 0 {
                    break;
                }
            }
            (x, y)
        }
        for (m, n, table) in [
            (4, 4, &[0.014, 0.029, 0.057, 0.100][..]),
            (5, 5, &[0.004, 0.008, 0.016, 0.028, 0.048, 0.075][..]),
            (3, 5, &[0.018, 0.036, 0.071, 0.125][..]),
        ] {
            for (k, want) in table.iter().enumerate() {
                let (x, y) = with_inversions(m, n, k);
                assert_eq!(u_statistic(&x, &y), (m * n - k) as f64, "{m}x{n} k={k}");
                let got = p(&x, &y);
                assert!(
                    (got - want).abs() < 0.0015,
                    "{m}x{n} U≤{k}: {got} vs {want}"
                );
            }
        }
        // The smallest one-sided p at 4 vs 4 blocks is exactly 1/70.
        assert_eq!(p(&[5.0, 6.0, 7.0, 8.0], &[1.0, 2.0, 3.0, 4.0]), 1.0 / 70.0);
        assert_eq!(p(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]), 1.0);
    }

    #[test]
    fn ties_are_conservative_and_large_samples_use_the_normal() {
        // All equal: U = m·n/2, p ≥ 1/2.
        assert!(p(&[1.0; 6], &[1.0; 6]) >= 0.5);
        // 40 vs 40 (normal approximation) with complete separation: tiny p.
        let x: Vec<f64> = (0..40).map(|i| 100.0 + i as f64).collect();
        let y: Vec<f64> = (0..40).map(|i| i as f64).collect();
        assert!(p(&x, &y) < 1e-9);
        // Normal tail sanity: P(Z ≥ 1.6449) ≈ 0.05.
        assert!((upper_normal_tail(1.6449) - 0.05).abs() < 1e-4);
        assert!((upper_normal_tail(-1.6449) - 0.95).abs() < 1e-4);
        // At the boundary between exact and normal, both agree roughly.
        let x: Vec<f64> = (0..30).map(|i| i as f64 * 1.1).collect();
        let y: Vec<f64> = (0..30).map(|i| i as f64).collect();
        let exact = p(&x, &y);
        let x2: Vec<f64> = x.iter().chain(&[100.0]).copied().collect();
        let approx = p(&x2, &y);
        assert!((exact - approx).abs() < 0.1, "{exact} {approx}");
    }

    #[test]
    fn blocks_and_comparison() {
        let v: Vec<f64> = (0..12).map(|i| i as f64).collect();
        assert_eq!(block_means(&v, 5), vec![2.0, 7.0]);
        assert!(block_means(&v, 0).is_empty());
        let before = [30.0, 31.0, 29.0, 30.5, 30.2];
        let after = [20.0, 20.5, 19.8, 20.1, 20.3];
        let c = compare(&before, &after).expect("comparison");
        assert!(c.p_better < 0.01 && c.p_worse > 0.99, "{c:?}");
        assert!((c.effect - (30.2 - 20.1) / 30.2).abs() < 1e-12, "{c:?}");
        assert!(compare(&[], &after).is_none());
    }

    #[test]
    fn side_effect_needs_budget_and_significance() {
        let before = [90.0, 90.2, 89.8, 90.1];
        // GPU utilisation down 2%, well beyond noise: a side effect of 0.02.
        let after = [88.2, 88.3, 88.1, 88.2];
        let w = side_effect(&before, &after, true, 0.005).expect("side effect");
        assert!((w - 0.0204).abs() < 1e-3, "{w}");
        // Down 0.3%: inside the budget.
        assert!(side_effect(&before, &[89.8, 89.7, 89.9, 89.75], true, 0.005).is_none());
        // Up: not worse.
        assert!(side_effect(&before, &[95.0; 4], true, 0.005).is_none());
        // Lower-is-better node up 1% but within its noise: not counted.
        let noisy = [10.0, 14.0, 6.0, 12.0, 8.0];
        assert!(side_effect(&noisy, &[10.1, 14.1, 6.1, 12.1, 8.1], false, 0.005).is_none());
        // One or two windows after: not enough to judge, however far down.
        assert!(side_effect(&before, &[45.0, 45.0], true, 0.005).is_none());
    }
}
