//! The Pareto front of the arms over the three objectives of the reward (latency, throughput,
//! CPU headroom; each 0..=1, larger is better) and its hypervolume against the origin.
//!
//! With at most [`EXACT_POINTS`] points the hypervolume is computed exactly by
//! inclusion–exclusion (the volume of a union of boxes anchored at the origin: the sum over
//! non-empty subsets, signed by size, of the box of their component-wise minimum); beyond that,
//! by sweeping slabs along the third objective and summing the 2-D staircase areas (also exact).

/// Most points inclusion–exclusion is used for (2^8 − 1 subsets).
pub const EXACT_POINTS: usize = 8;

/// One point: (latency, throughput, CPU headroom).
pub type Point = [f64; 3];

/// Whether `a` dominates `b` (no worse in every objective, better in one).
pub fn dominates(a: &Point, b: &Point) -> bool {
    a.iter().zip(b).all(|(x, y)| x >= y) && a.iter().zip(b).any(|(x, y)| x > y)
}

/// Indices of the non-dominated points (duplicates keep the first).
pub fn front(points: &[Point]) -> Vec<usize> {
    (0..points.len())
        .filter(|&i| {
            !points
                .iter()
                .enumerate()
                .any(|(j, q)| j != i && (dominates(q, &points[i]) || (j < i && *q == points[i])))
        })
        .collect()
}

fn clamp(p: &Point) -> Point {
    p.map(|x| if x.is_finite() { x.max(0.0) } else { 0.0 })
}

/// The hypervolume dominated by `points` with the origin as reference.
pub fn hypervolume(points: &[Point]) -> f64 {
    let pts: Vec<Point> = front(points)
        .into_iter()
        .map(|i| clamp(&points[i]))
        .collect();
    if pts.len() <= EXACT_POINTS {
        inclusion_exclusion(&pts)
    } else {
        sweep(&pts)
    }
}

fn inclusion_exclusion(pts: &[Point]) -> f64 {
    let n = pts.len();
    let mut total = 0.0;
    for mask in 1u32..(1u32 << n) {
        let mut lo = [f64::INFINITY; 3];
        for (i, p) in pts.iter().enumerate() {
            if mask & (1 << i) != 0 {
                for d in 0..3 {
                    lo[d] = lo[d].min(p[d]);
                }
            }
        }
        let vol = lo[0] * lo[1] * lo[2];
        if mask.count_ones() % 2 == 1 {
            total += vol;
        } else {
            total -= vol;
        }
    }
    total
}

/// Area dominated by 2-D points against the origin.
fn area(pts: &mut [[f64; 2]]) -> f64 {
    pts.sort_by(|a, b| b[0].total_cmp(&a[0]));
    let mut best_y: f64 = 0.0;
    let mut a = 0.0;
    for (i, p) in pts.iter().enumerate() {
        best_y = best_y.max(p[1]);
        let next_x = pts.get(i + 1).map_or(0.0, |q| q[0]);
        a += (p[0] - next_x) * best_y;
    }
    a
}

fn sweep(pts: &[Point]) -> f64 {
    let mut zs: Vec<f64> = pts.iter().map(|p| p[2]).collect();
    zs.sort_by(|a, b| b.total_cmp(a));
    zs.dedup();
    let mut v = 0.0;
    for (k, &z) in zs.iter().enumerate() {
        let below = zs.get(k + 1).copied().unwrap_or(0.0);
        let mut slab: Vec<[f64; 2]> = pts
            .iter()
            .filter(|p| p[2] >= z)
            .map(|p| [p[0], p[1]])
            .collect();
        v += area(&mut slab) * (z - below);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_drops_dominated_points() {
        let pts = [
            [0.9, 0.5, 0.5],
            [0.5, 0.9, 0.5],
            [0.4, 0.4, 0.4], // dominated by both
            [0.9, 0.5, 0.5], // duplicate
            [0.1, 0.1, 1.0],
        ];
        assert_eq!(front(&pts), vec![0, 1, 4]);
    }

    /// Hand-computed volumes.
    #[test]
    fn hypervolume_of_known_sets() {
        assert_eq!(hypervolume(&[]), 0.0);
        assert!((hypervolume(&[[0.5, 0.5, 0.5]]) - 0.125).abs() < 1e-12);
        // Two boxes of 0.25 overlapping in 0.5 × 0.5 × 0.5.
        assert!((hypervolume(&[[1.0, 0.5, 0.5], [0.5, 1.0, 0.5]]) - 0.375).abs() < 1e-12);
        // Three unit-slab boxes: 1·1·0.5 + ... by hand:
        // A = (1, 0.5, 0.5), B = (0.5, 1, 0.5), C = (0.5, 0.5, 1): each 0.25, pairwise and
        // triple overlaps 0.125: 3·0.25 − 3·0.125 + 0.125 = 0.5.
        let three = [[1.0, 0.5, 0.5], [0.5, 1.0, 0.5], [0.5, 0.5, 1.0]];
        assert!((hypervolume(&three) - 0.5).abs() < 1e-12);
        // A dominated point adds nothing.
        let mut four = three.to_vec();
        four.push([0.4, 0.4, 0.4]);
        assert!((hypervolume(&four) - 0.5).abs() < 1e-12);
        // The full cube.
        assert!((hypervolume(&[[1.0, 1.0, 1.0], [0.2, 0.3, 0.9]]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn inclusion_exclusion_agrees_with_the_sweep() {
        let mut rng = crate::healer::tuner::Rng::new(3);
        for _ in 0..200 {
            let n = 1 + (rng.next_u64() % 8) as usize;
            let pts: Vec<Point> = (0..n)
                .map(|_| [rng.uniform(), rng.uniform(), rng.uniform()])
                .collect();
            let f: Vec<Point> = front(&pts).into_iter().map(|i| pts[i]).collect();
            let a = inclusion_exclusion(&f);
            let b = sweep(&f);
            assert!((a - b).abs() < 1e-9, "{pts:?}: {a} vs {b}");
        }
        // Beyond 8 points the sweep is used.
        let many: Vec<Point> = (0..12)
            .map(|i| {
                let t = i as f64 / 11.0;
                [t, 1.0 - t, 0.5]
            })
            .collect();
        assert!(hypervolume(&many) > 0.0);
    }
}
