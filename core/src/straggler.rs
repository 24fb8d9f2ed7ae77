//! The node's view of stragglers: among the ranks of one job on this node, the one that holds the
//! others back, and why.
//!
//! Two signals per rank, each relative to the median of the job's other ranks here:
//!
//! - `noncomm`: the median iteration's wall time minus its time in communication kernels. In
//!   synchronous data-parallel training every rank's iteration lasts as long as the slowest
//!   one's, but the straggler spends the least of it inside the all-reduce (the others wait for
//!   it there), so wall − communication exposes it. Needs NCCL kernels in the trace: with a CPU
//!   collective (gloo) the wait is invisible on the GPU and every rank scores 1.
//! - `host_delay`: the rank's host delay rate, the sum of its SLO tree's run-queue nodes (main,
//!   data loader, communication threads) and cgroup throttling, in ms per second of its last
//!   window. A rank starved of CPU stands out here whatever the collective.
//!
//! The straggler is named when one signal stands out (`noncomm` ≥ [`NONCOMM_OUTLIER`] or
//! `host_delay` ≥ [`HOST_OUTLIER`]); its cause is the host node with the largest excess over the
//! job's median (`host.runqueue.main`, …) when the host signal stands out, otherwise the GPU
//! phase with the largest excess (`compute`, `memory`, `host_wait`, `launch_gaps`).
//!
//! Across nodes the same scores are recording rules over the exported metrics
//! (`collector-config/rules/`).

use std::collections::BTreeMap;

use crate::gputrace::{Iteration, Phase, PHASES};

/// What the straggler view needs of one training process (implemented by
/// [`crate::snapshot::ProcessSnapshot`]; the view is computed once per tick into the snapshot).
pub trait Rank {
    /// Its process id.
    fn pid(&self) -> u32;
    /// Its rank in the job, when known.
    fn rank(&self) -> Option<u32>;
    /// Its job, when known.
    fn job_id(&self) -> Option<&str>;
    /// Its recent iterations.
    fn iterations(&self) -> impl Iterator<Item = &Iteration>;
    /// The last value of one node of its SLO tree.
    fn node_value(&self, node: &str) -> Option<f64>;
}

/// `noncomm` score from which a rank is a straggler.
pub const NONCOMM_OUTLIER: f64 = 1.15;
/// `host_delay` score from which a rank is a straggler.
pub const HOST_OUTLIER: f64 = 3.0;
/// Added to both sides of the host ratio (ms/s): idle ranks have rates near zero, whose ratios
/// mean nothing.
pub const HOST_FLOOR_MS_PER_S: f64 = 1.0;

/// The SLO nodes whose values make the host delay rate.
pub const HOST_NODES: [&str; 4] = [
    "host.runqueue.main",
    "host.runqueue.data_loader",
    "host.runqueue.communication",
    "host.throttling",
];

/// One rank of a job on this node.
#[derive(Clone, Debug, PartialEq)]
pub struct RankView {
    /// Its process.
    pub pid: u32,
    /// Rank.
    pub rank: u32,
    /// Job id.
    pub job_id: String,
    /// Median iteration wall time minus communication, s.
    pub noncomm_s: Option<f64>,
    /// `noncomm_s` over the median of the job's other ranks here.
    pub noncomm_score: Option<f64>,
    /// Host delay rate, ms/s.
    pub host_delay_ms_per_s: Option<f64>,
    /// (`host_delay` + floor) over (the median of the other ranks + floor).
    pub host_score: Option<f64>,
    /// Named straggler: its cause (an SLO host node or a GPU phase).
    pub straggler: Option<String>,
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn median_of<'a>(
    its: impl Iterator<Item = &'a Iteration>,
    f: impl Fn(&Iteration) -> f64,
) -> Option<f64> {
    let mut v: Vec<f64> = its.map(f).collect();
    median(&mut v)
}

/// The phases a straggler's cause is looked for in: all but communication (the straggler has
/// the least of it) and its overlap.
fn cause_phases() -> impl Iterator<Item = &'static Phase> {
    PHASES
        .iter()
        .filter(|(name, _)| !matches!(*name, "communication" | "comm_overlap"))
}

/// The straggler view of every job with at least two ranks on this node.
pub fn stragglers<R: Rank>(ranks: &[R]) -> Vec<RankView> {
    let mut jobs: BTreeMap<&str, Vec<&R>> = BTreeMap::new();
    for p in ranks {
        if let (Some(job), Some(_)) = (p.job_id(), p.rank()) {
            if !job.is_empty() {
                jobs.entry(job).or_default().push(p);
            }
        }
    }
    let mut out = Vec::new();
    for (job, mut procs) in jobs {
        if procs.len() < 2 {
            continue;
        }
        procs.sort_by_key(|p| p.rank());
        let noncomm: Vec<Option<f64>> = procs
            .iter()
            .map(|p| {
                median_of(p.iterations(), |i| {
                    i.wall_ns().saturating_sub(i.comm_ns) as f64 / 1e9
                })
            })
            .collect();
        let host: Vec<Option<f64>> = procs
            .iter()
            .map(|p| {
                let vals: Vec<f64> = HOST_NODES.iter().filter_map(|n| p.node_value(n)).collect();
                (!vals.is_empty()).then(|| vals.iter().sum())
            })
            .collect();
        // Each rank against the median of the others (with itself in, two ranks could never be
        // more than twice their mean).
        let others = |v: &[Option<f64>], k: usize| {
            let mut o: Vec<f64> = v
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != k)
                .filter_map(|(_, x)| *x)
                .collect();
            median(&mut o)
        };
        let mut views: Vec<RankView> = procs
            .iter()
            .enumerate()
            .map(|(k, p)| RankView {
                pid: p.pid(),
                rank: p.rank().unwrap_or_default(),
                job_id: job.to_owned(),
                noncomm_s: noncomm[k],
                noncomm_score: noncomm[k]
                    .zip(others(&noncomm, k))
                    .filter(|&(_, m)| m > 0.0)
                    .map(|(v, m)| v / m),
                host_delay_ms_per_s: host[k],
                host_score: host[k]
                    .zip(others(&host, k))
                    .map(|(v, m)| (v + HOST_FLOOR_MS_PER_S) / (m + HOST_FLOOR_MS_PER_S)),
                straggler: None,
            })
            .collect();
        // The one that stands out most, relative to its signal's threshold.
        let pick = views
            .iter()
            .enumerate()
            .filter_map(|(k, v)| {
                let h = v.host_score.unwrap_or(0.0) / HOST_OUTLIER;
                let g = v.noncomm_score.unwrap_or(0.0) / NONCOMM_OUTLIER;
                let s = h.max(g);
                (s >= 1.0).then_some((k, s, h >= g))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((k, _, by_host)) = pick {
            let cause = if by_host {
                HOST_NODES
                    .iter()
                    .filter_map(|n| {
                        let mine = procs[k].node_value(n)?;
                        let mut others: Vec<f64> = procs
                            .iter()
                            .enumerate()
                            .filter(|&(j, _)| j != k)
                            .filter_map(|(_, p)| p.node_value(n))
                            .collect();
                        Some((*n, mine - median(&mut others)?))
                    })
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(n, _)| n.to_owned())
            } else {
                cause_phases()
                    .filter_map(|(name, f)| {
                        let mine = median_of(procs[k].iterations(), |i| f(i) as f64)?;
                        let mut others: Vec<f64> = procs
                            .iter()
                            .enumerate()
                            .filter(|&(j, _)| j != k)
                            .filter_map(|(_, p)| median_of(p.iterations(), |i| f(i) as f64))
                            .collect();
                        Some((*name, mine - median(&mut others)?))
                    })
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(n, _)| n.to_owned())
            };
            views[k].straggler = Some(cause.unwrap_or_else(|| "unknown".into()));
        }
        out.extend(views);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        slo::{NodeView, SloSnapshot},
        snapshot::ProcessSnapshot,
    };

    fn iteration(wall_ms: u64, comm_ms: u64, host_wait_ms: u64) -> Iteration {
        Iteration {
            start_ns: 0,
            end_ns: wall_ms * 1_000_000,
            comm_ns: comm_ms * 1_000_000,
            idle_before_first_ns: host_wait_ms * 1_000_000,
            compute_ns: (wall_ms - comm_ms - host_wait_ms) * 1_000_000,
            ..Default::default()
        }
    }

    fn node(name: &str, value: f64) -> NodeView {
        NodeView {
            name: name.into(),
            value: Some(value),
            ..NodeView::default()
        }
    }

    fn rank(pid: u32, r: u32, its: Vec<Iteration>, host: [f64; 4]) -> ProcessSnapshot {
        ProcessSnapshot {
            pid,
            rank: Some(r),
            job_id: Some("llama".into()),
            iterations: its.into(),
            slo: Some(std::sync::Arc::new(SloSnapshot {
                nodes: HOST_NODES
                    .iter()
                    .zip(host)
                    .map(|(n, v)| node(n, v))
                    .collect(),
                ..SloSnapshot::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn nccl_straggler_spends_the_least_in_the_all_reduce() {
        // 100 ms iterations everywhere; rank 2 computes for 60 ms and waits 10 ms for data,
        // the others wait for it 40 ms inside the all-reduce.
        let fast = || vec![iteration(100, 40, 2); 9];
        let slow = vec![iteration(100, 5, 10); 9];
        let v = stragglers(&[
            rank(10, 0, fast(), [0.5, 0.1, 0.2, 0.0]),
            rank(11, 1, fast(), [0.6, 0.1, 0.2, 0.0]),
            rank(12, 2, slow, [0.5, 0.2, 0.2, 0.0]),
        ]);
        assert_eq!(v.len(), 3);
        let s: Vec<_> = v.iter().filter(|r| r.straggler.is_some()).collect();
        assert_eq!(s.len(), 1, "{v:?}");
        assert_eq!(s[0].rank, 2);
        assert!((s[0].noncomm_score.expect("score") - 95.0 / 60.0).abs() < 1e-9);
        assert!((v[0].noncomm_score.expect("score") - 60.0 / 77.5).abs() < 1e-9);
        assert_eq!(s[0].straggler.as_deref(), Some("compute"));
    }

    #[test]
    fn a_cpu_starved_rank_is_named_with_its_host_cause() {
        // gloo: no communication kernels, every rank's noncomm is the same; rank 1's main
        // thread waits 90 ms per second in the run queue.
        let its = || vec![iteration(400, 0, 2); 9];
        let v = stragglers(&[
            rank(20, 0, its(), [0.3, 0.1, 8.0, 0.0]),
            rank(21, 1, its(), [90.0, 0.1, 9.0, 0.0]),
        ]);
        let s = v
            .iter()
            .find(|r| r.straggler.is_some())
            .expect("a straggler");
        assert_eq!(s.rank, 1);
        assert_eq!(s.straggler.as_deref(), Some("host.runqueue.main"));
        assert!(s.host_score.expect("host score") > HOST_OUTLIER);
        assert!(v.iter().all(|r| r.noncomm_score == Some(1.0)));
    }

    #[test]
    fn healthy_ranks_name_nobody_and_single_ranks_are_left_out() {
        let its = || vec![iteration(100, 30, 2); 9];
        let v = stragglers(&[
            rank(30, 0, its(), [0.4, 0.1, 2.0, 0.0]),
            rank(31, 1, its(), [0.6, 0.2, 2.5, 0.0]),
        ]);
        assert_eq!(v.len(), 2);
        assert!(v.iter().all(|r| r.straggler.is_none()), "{v:?}");
        let mut lone = rank(40, 0, its(), [0.0; 4]);
        lone.job_id = Some("alone".into());
        assert!(stragglers(&[lone]).is_empty());
    }
}
