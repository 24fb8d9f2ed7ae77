//! Iteration boundaries without step markers, from the activities the shim traces at every
//! depth: copies, fills and CUDA-graph launches.
//!
//! Kernels are traced only in sample windows at the shim's always-on depth, so their sequence
//! is no clock for a whole run (on the H200 suite, iterations detected from kernels alone were
//! within 1% of the job's true steps in 8 of 49 recordings). Copies and fills are traced at
//! every depth, and a training step repeats them: the batch copied host to device, the
//! optimizer's and the loss's small fills, a read-back; under CUDA graphs, the replays. Each
//! becomes a token (its kind, copy direction and size, or its graph), and the token sequence's
//! period is found as the kernels' is ([`detect_period`]). One short run of tokens that occurs
//! once per period — the *anchor*, starting at the batch's host-to-device copy where there is
//! one — then marks every iteration: its occurrences are the boundaries. An anchor is not
//! thrown off by a token added or missing elsewhere in a step (a stray read-back, a dropped
//! record), nor by a graph recaptured mid-run when the anchor is the batch copy; when it stops
//! occurring, the period is searched again.
//!
//! A sequence that is one token repeated (one copy or fill per step and nothing else) is one a
//! step only where it comes at a steady pace ([`one_a_step`]); two a step alternate a short and
//! a long gap and are refused, and the kernels' period is used instead. A lock that stops
//! occurring is forgotten with the tokens it cut, and a search whose anchor never occurs in the
//! first periods of its window starts again from the anchor: the window held another regime
//! (a model's parameter copies before its steps), whose period and the steps' made a multiple.

use std::collections::VecDeque;

use rustc_hash::FxHashSet;

use slo_probe_common::gpu::MEM_KIND_MEMSET;

use super::{Activity, ActivityKind};

/// Tokens a period is searched over at most (a search compares up to its square / 3 pairs).
const SEARCH_TOKENS: usize = 2048;

/// Tokens kept from activities already cut into iterations, for the next search.
const HISTORY_TOKENS: usize = SEARCH_TOKENS;

/// The share of positions `i` with `seq[i] == seq[i + p]` a period needs.
pub(super) const PERIOD_MATCH: f64 = 0.8;

/// A period scoring within this of the best one is preferred when it is shorter: a sequence
/// with period `p` also has `2p`, `3p`, ..., and noise can make a multiple score a little
/// higher (which halves the iterations counted).
const SHORTER_WITHIN: f64 = 0.05;

/// `CUpti_ActivityMemcpyKind` HtoD: a batch on its way to the GPU.
const MEM_KIND_HTOD: u32 = 1;

/// What a search needs before it starts: this many periods of at least two tokens.
const MIN_PERIODS: usize = 3;

/// The last periods of a search's window that its phases are read over.
const RECENT_PERIODS: usize = 16;

/// A lock is lost when this many periods of tokens go by without its anchor.
const LOST_AFTER_PERIODS: usize = 3;

/// The token an activity contributes, if it is one of those traced at every depth: a copy or
/// fill outside a graph (by direction and size), or a graph launch (by graph; a launch traced
/// at node level counts once, at its first node).
fn token(a: &Activity, last_node_launch: &mut (u32, u32)) -> Option<u64> {
    const MEMORY: u64 = 1 << 62;
    const GRAPH: u64 = 2 << 62;
    match a.kind {
        ActivityKind::Memory if a.graph_id == 0 => {
            let kind = u64::from(a.mem_kind.min(MEM_KIND_MEMSET)) << 48;
            Some(MEMORY | kind | (a.bytes & ((1 << 48) - 1)))
        }
        ActivityKind::Graph => Some(GRAPH | u64::from(a.graph_id)),
        ActivityKind::GraphKernel => {
            let launch = (a.graph_id, a.correlation_id);
            (std::mem::replace(last_node_launch, launch) != launch)
                .then_some(GRAPH | u64::from(a.graph_id))
        }
        _ => None,
    }
}

/// The tokens of `acts` with their anchors, in the order the GPU started them: copies and fills
/// on a stream start in the order they were launched, while the launch times the assembler
/// places activities by are estimates for those launched without a stamp (on the H200, every
/// copy of a launch-bound job: placed by the kernels' stamps around them, some a step away).
///
/// A stamp is no anchor where it cannot be the activity's own launch: after its GPU start, or
/// shared with an earlier copy (CUPTI 13.0 repeats the previous record's correlation id after
/// kernel activity was switched: on the H200, hundreds of copies of a launch-bound job carried
/// one launch's stamp); such a token is anchored at its GPU start.
fn tokens<'a>(acts: impl Iterator<Item = &'a Activity>) -> Vec<Token> {
    let mut last = (0, 0);
    let mut v: Vec<(u64, u64, u64, u32, u64)> = acts
        .filter_map(|a| {
            token(a, &mut last).map(|t| {
                let own = a.kind == ActivityKind::Memory && a.stamped_launch_ns() != 0;
                (
                    a.start_ns,
                    t,
                    a.anchor_ns().min(a.start_ns),
                    if own { a.correlation_id } else { 0 },
                    a.anchor_ns(),
                )
            })
        })
        .collect();
    v.sort_by_key(|t| t.0);
    let mut seen = FxHashSet::default();
    v.into_iter()
        .map(|(start, t, anchor, corr, placed_at)| Token {
            token: t,
            anchor: if corr != 0 && !seen.insert(corr) {
                start
            } else {
                anchor
            },
            start,
            placed_at,
        })
        .collect()
}

/// A token with its anchor, its GPU start (the order of tokens) and the anchor its activity
/// is kept pending by ([`Activity::anchor_ns`]: a cut releases what is placed before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Token {
    token: u64,
    anchor: u64,
    start: u64,
    placed_at: u64,
}

fn is_htod(t: u64) -> bool {
    t >> 62 == 1 && (t >> 48) & 0x3fff == u64::from(MEM_KIND_HTOD)
}

/// The share of positions where `seq` repeats itself `p` later.
pub(super) fn period_score<T: PartialEq>(seq: &[T], p: usize) -> f64 {
    let n = seq.len();
    if p == 0 || n <= p {
        return 0.0;
    }
    (0..n - p).filter(|&i| seq[i] == seq[i + p]).count() as f64 / (n - p) as f64
}

/// The period `p` (`min_p` ≤ p ≤ len/3) for which `seq[i] == seq[i + p]` holds most often, if
/// it holds for at least [`PERIOD_MATCH`] of the positions (kernels launched by two threads,
/// e.g. the autograd engine's, interleave a little differently every step: 90% was measured on
/// a PyTorch job); the shortest period within [`SHORTER_WITHIN`] of the best wins.
pub fn detect_period<T: PartialEq>(seq: &[T], min_p: usize) -> Option<usize> {
    let n = seq.len();
    let scores: Vec<(usize, f64)> = (min_p.max(1)..=n / 3)
        .map(|p| (p, period_score(seq, p)))
        .collect();
    let best = scores.iter().map(|s| s.1).fold(0.0, f64::max);
    if best < PERIOD_MATCH {
        return None;
    }
    scores
        .iter()
        .find(|s| s.1 >= best - SHORTER_WITHIN)
        .map(|s| s.0)
}

/// A period found, and the run of tokens that starts each iteration.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Lock {
    period: usize,
    anchor: Vec<u64>,
}

impl Lock {
    /// Where the anchor occurs in `toks`, and where it should have occurred but a token of it
    /// is missing (a copy record lost: on the H200, one of a launch-bound job's two batch copies
    /// in one step of twenty): between two occurrences `m` periods apart, give or take a
    /// quarter period, the token of the anchor nearest to each period's expected place.
    fn occurrences(&self, toks: &[(u64, u64)]) -> Vec<(usize, u64)> {
        let found = occurrences(&self.anchor, toks);
        let p = self.period;
        let mut out: Vec<(usize, u64)> = Vec::with_capacity(found.len());
        for w in found.windows(2) {
            let (i, next) = (w[0].0, w[1].0);
            out.push(w[0]);
            let m = (next - i + p / 2) / p;
            if m < 2 || (next - i).abs_diff(m * p) > p / 4 {
                continue;
            }
            let mut last = i;
            for expect in (1..m).map(|step| i + step * p) {
                let near = (last + 1..next)
                    .filter(|&j| self.anchor.contains(&toks[j].0) && j.abs_diff(expect) <= p / 4)
                    .min_by_key(|&j| (j.abs_diff(expect), j));
                if let Some(j) = near {
                    out.push((j, toks[j].1));
                    last = j;
                }
            }
        }
        out.extend(found.last());
        out
    }
}

/// What [`CycleDetector::boundaries`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// Boundaries (anchor times, ascending).
    Boundaries(Vec<u64>),
    /// Not enough tokens yet to tell whether they have a period: no iterations for now.
    Wait,
    /// No period (or none that tells iterations apart): look elsewhere.
    Nothing,
}

/// Finds iteration boundaries in the always-traced activities (see the module docs).
#[derive(Default)]
pub(super) struct CycleDetector {
    /// Tokens (and their anchors) of the activities already cut, oldest first.
    history: VecDeque<(u64, u64)>,
    lock: Option<Lock>,
    /// Tokens seen (history and pending) when a search last failed: the next waits for half as
    /// many more (at least 6, at most a quarter of a search's worth), so that a job's first
    /// periods are found soon and a sequence without one costs little.
    failed_at: Option<usize>,
    /// Tokens pushed into the history, in all.
    retired: usize,
    /// The anchor of the first token seen.
    first_ns: Option<u64>,
    /// The tokens of the pending activities the last call looked at (and of those carried).
    pending_tokens: Vec<Token>,
    /// Tokens of activities a cut released that started after it (see [`CycleDetector::retire`]).
    carried: Vec<Token>,
    /// The last cut: no boundary is before it (a carried token's anchor can be).
    last_cut: u64,
    /// The horizon at which the last lock was lost, until a search finds one again.
    lost_at: Option<u64>,
}

/// Tokens a search may wait for before the first one is given up (at most [`WAIT_NS`]): a
/// period of up to 85 tokens shows three times in them (the convnet of the H200 suite has 36
/// a step, the GPT 70).
const WAIT_TOKENS: usize = 256;

/// Tokens a search needs while it may wait: a few periods of a short run of fills inside a
/// step repeat as well as whole steps do.
const MIN_SEARCH_TOKENS: usize = 128;

/// How long after the first token a search may wait for [`WAIT_TOKENS`], ns.
const WAIT_NS: u64 = 5_000_000_000;

impl CycleDetector {
    /// The boundaries among `pending` (sorted by anchor) at or before `horizon`.
    pub(super) fn boundaries(&mut self, pending: &[Activity], horizon: u64) -> Found {
        let mut toks = tokens(pending.iter().filter(|a| a.anchor_ns() <= horizon));
        if !self.carried.is_empty() {
            toks.append(&mut self.carried);
            toks.sort_by_key(|t| t.start);
        }
        let pairs: Vec<(u64, u64)> = toks.iter().map(|t| (t.token, t.anchor)).collect();
        let found = match self.find(&pairs, horizon) {
            Found::Boundaries(mut b) => {
                b.retain(|&t| t >= self.last_cut);
                Found::Boundaries(b)
            }
            f => f,
        };
        // What `retire` keeps comes from these: a cut is never past the horizon.
        self.pending_tokens = toks;
        found
    }

    fn find(&mut self, toks: &[(u64, u64)], horizon: u64) -> Found {
        if let Some(lock) = &self.lock {
            let b = spaced(lock.occurrences(toks), lock.period);
            let since = b.last().map_or(toks.len(), |&(i, _)| toks.len() - i);
            if since <= LOST_AFTER_PERIODS * lock.period {
                return Found::Boundaries(ascending(&b));
            }
            self.lock = None;
            // The tokens already cut were the lost period's: a search over them and the new
            // ones finds the old period, or a multiple of both (on an H100, a model's
            // parameter copies, 12 tokens a layer, then two CUDA graphs a step: 12, six
            // steps an iteration).
            self.history.clear();
            self.lost_at = Some(horizon);
        }
        let seen = self.retired + toks.len();
        let Some(first) = self
            .first_ns
            .or_else(|| self.history.front().or(toks.first()).map(|t| t.1))
        else {
            return Found::Nothing;
        };
        self.first_ns = Some(first);
        // A search may wait at first, and again after a lock was lost: the tokens that stopped
        // matching may be those that have not come yet, and a search over the rest finds a
        // period they do not have (on an H100, an eager GPT's copies after a sampled window of
        // kernels came a second or more after its 4-byte fills; searched at once, the lock was
        // on the fills alone, or none and the kernels' period merged the steps between two
        // windows into one iteration of 1 s).
        let early = (seen < WAIT_TOKENS && horizon.saturating_sub(first) < WAIT_NS)
            || self
                .lost_at
                .is_some_and(|l| horizon.saturating_sub(l) < WAIT_NS);
        let retry = |f: usize| f + (f / 2).clamp(MIN_PERIODS * 2, SEARCH_TOKENS / 4);
        if self.failed_at.is_some_and(|f| seen < retry(f)) {
            return if early { Found::Wait } else { Found::Nothing };
        }
        let window: Vec<(u64, u64)> = self
            .history
            .iter()
            .copied()
            .chain(toks.iter().copied())
            .collect();
        if early && window.len() < MIN_SEARCH_TOKENS {
            return Found::Wait;
        }
        self.lock = search(&window[window.len().saturating_sub(SEARCH_TOKENS)..]);
        match &self.lock {
            Some(lock) => {
                self.failed_at = None;
                self.lost_at = None;
                Found::Boundaries(ascending(&spaced(lock.occurrences(toks), lock.period)))
            }
            None => {
                self.failed_at = Some(seen);
                if early {
                    Found::Wait
                } else {
                    Found::Nothing
                }
            }
        }
    }

    /// Keeps the tokens of activities cut into iterations (those before anchor `cut`, a time
    /// at or before the last call's horizon) for the next search, and carries those that
    /// started after the cut into the next call's sequence: a copy whose launch was placed
    /// before the cut (by stamps a step away) is released with the iteration before it, but its
    /// token is in the next step. On an H100 a launch-bound GPT's second batch copy, placed
    /// ~100 ms before it started, went missing from every other step a take every 50 ms cut,
    /// and the lock on the pair of copies merged 15 pairs of steps in 2,074 (1.2%).
    pub(super) fn retire(&mut self, cut: u64) {
        // Where the next step starts in the sequence: the token the cut is the anchor of.
        let next = self
            .pending_tokens
            .iter()
            .find(|t| t.anchor == cut)
            .map_or(cut, |t| t.start);
        let (released, kept): (Vec<Token>, Vec<Token>) = std::mem::take(&mut self.pending_tokens)
            .into_iter()
            .filter(|t| t.placed_at < cut || t.anchor < cut)
            .partition(|t| t.start < next || t.placed_at >= cut);
        for t in released {
            if self.history.len() >= HISTORY_TOKENS {
                self.history.pop_front();
            }
            self.history.push_back((t.token, t.anchor));
            self.retired += 1;
        }
        self.carried = kept;
        self.carried.truncate(SEARCH_TOKENS);
        self.last_cut = self.last_cut.max(cut);
    }
}

/// `occurrences` up to the first one that comes less than half a period (in tokens) after the
/// one before it: an iteration is not that short, so what follows is not what the lock was
/// found on. Records of one time span need not reach the agent together: on an H100, after a
/// sampled window of kernels ended, an eager GPT's 4-byte fills (17 in a row a step, then 50
/// other copies and fills) kept coming while the rest came only at the job's exit, and a lock
/// whose anchor was 10 of those fills matched every 10 of them, cutting each step into pieces
/// of 1.5-3 ms. The lock is lost instead [`LOST_AFTER_PERIODS`] periods after its last good
/// occurrence and searched again.
fn spaced(mut occurrences: Vec<(usize, u64)>, period: usize) -> Vec<(usize, u64)> {
    let keep = occurrences
        .windows(2)
        .position(|w| w[1].0 - w[0].0 < period.div_ceil(2))
        .map_or(occurrences.len(), |k| k + 1);
    occurrences.truncate(keep);
    occurrences
}

/// The anchor times of `occurrences` that rise with them: the longest run of them, in order,
/// each later than the one before. An estimated launch can place a copy before the one the GPU
/// ran ahead of it, or (a stamp of another launch) far after it: each such time is left out,
/// and marks no boundary, without the times after it going too.
fn ascending(occurrences: &[(usize, u64)]) -> Vec<u64> {
    let times: Vec<u64> = occurrences.iter().map(|o| o.1).collect();
    // Patience sorting: `tails[l]` is the index ending the best rising run of length l + 1 so
    // far, `prev` links each index to the one before it in its run.
    let mut tails: Vec<usize> = Vec::new();
    let mut prev: Vec<Option<usize>> = vec![None; times.len()];
    for (i, &t) in times.iter().enumerate() {
        let l = tails.partition_point(|&j| times[j] < t);
        prev[i] = l.checked_sub(1).map(|k| tails[k]);
        if l == tails.len() {
            tails.push(i);
        } else {
            tails[l] = i;
        }
    }
    let mut out = Vec::with_capacity(tails.len());
    let mut at = tails.last().copied();
    while let Some(i) = at {
        out.push(times[i]);
        at = prev[i];
    }
    out.reverse();
    out
}

/// Where `anchor` occurs in `toks` (not overlapping): the index of its first token and the
/// earliest anchor time of its tokens (estimated launches need not follow the GPU's order, and
/// a cut there keeps the whole run for the next take).
fn occurrences(anchor: &[u64], toks: &[(u64, u64)]) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let k = anchor.len();
    let mut i = 0;
    while k > 0 && i + k <= toks.len() {
        let run = &toks[i..i + k];
        if run.iter().map(|t| t.0).eq(anchor.iter().copied()) {
            out.push((i, toks[i].1));
            i += k;
        } else {
            i += 1;
        }
    }
    out
}

/// A period of the tokens in `window` and the anchor of its iterations: the shortest run of
/// tokens, from the phase where an iteration starts, that occurs about once per period. The
/// phase is the host-to-device copy after the longest host gap (the step fetching its batch),
/// or, without such copies, whatever token follows the longest gap.
fn search(window: &[(u64, u64)]) -> Option<Lock> {
    search_in(window, true)
}

/// [`search`], which may start again once (`again`) where its anchor first occurs.
fn search_in(window: &[(u64, u64)], again: bool) -> Option<Lock> {
    let seq: Vec<u64> = window.iter().map(|t| t.0).collect();
    let p = detect_period(&seq, 1)?;
    if seq.len() < MIN_PERIODS * p.max(2) {
        return None;
    }
    if seq[..p].iter().all(|&t| t == seq[0]) {
        return one_a_step(window, p);
    }
    // The phases are read over the last periods of the window (a token missing earlier would
    // shift them): the mean gap before each.
    let recent = (seq.len() / p).min(RECENT_PERIODS);
    let base = seq.len() - recent * p;
    let gap = |i: usize| window[i].1.saturating_sub(window[i - 1].1);
    let mean_gap = |r: usize| {
        let (sum, n) = (base + r..seq.len())
            .step_by(p)
            .filter(|&i| i > 0)
            .fold((0u64, 0u64), |(s, n), i| (s.saturating_add(gap(i)), n + 1));
        sum / n.max(1)
    };
    let htod: Vec<usize> = (0..p).filter(|&r| is_htod(seq[base + r])).collect();
    let phases: Vec<usize> = if htod.is_empty() {
        (0..p).collect()
    } else {
        htod
    };
    let phase = phases
        .iter()
        .copied()
        .max_by_key(|&r| (mean_gap(r), std::cmp::Reverse(r)))?;
    // The anchor starts at the phase in the last period but one (room for a whole period).
    let start = base + phase + p * (recent - 2);
    let expected = seq.len() as f64 / p as f64;
    let lock = (1..=p)
        .map(|k| seq.get(start..start + k))
        .take_while(Option::is_some)
        .flatten()
        .find(|gram| {
            let n = occurrences(gram, window).len() as f64;
            (n - expected).abs() <= (expected / 10.0).max(2.0)
        })
        .map(|gram| Lock {
            period: p,
            anchor: gram.to_vec(),
        })?;
    // The window began with another regime where the anchor never occurs (a model's parameter
    // copies before its steps): the period was a common multiple of both. Searched again from
    // the anchor's first occurrence (on an H100, a GPT's 12-token copies and then one fill a
    // step locked on four fills: four steps an iteration).
    let first = occurrences(&lock.anchor, window).first().map_or(0, |o| o.0);
    if again && first > LOST_AFTER_PERIODS * p {
        return search_in(&window[first..], false);
    }
    Some(lock)
}

/// Gaps between a lone token's occurrences within this share of their median count as steady.
const STEADY_WITHIN: f64 = 0.5;

/// The share of a lone token's gaps that must be steady.
const STEADY_SHARE: f64 = 0.8;

/// The last occurrences of a lone token whose gaps are read.
const LONE_RECENT: usize = 64;

/// A lone token's median gap below this is no step's pace (the shortest steps the suite and
/// the overhead benchmark ran were 2.8 ms, under CUDA graphs), ns: a flood of copies 3 µs apart
/// would be an iteration each, and so were 213 device-to-device copies ~140 µs apart while
/// an H100 compiled a GPT under `torch.compile`.
const MIN_LONE_GAP_NS: f64 = 1_000_000.0;

/// How far the median of every other gap may be from the median of the others, as a share of
/// the median gap, for a lone token to be one a step.
const ALTERNATION: f64 = 0.15;

/// A lone token's gap this many times its median is a long one; at most one of them in the
/// gaps read is a pause, more are the step's own gap after a run of the token. On an H100 an
/// eager GPT's 17 4-byte fills a step, 0.17-0.3 ms apart and then 8-15 ms to the next step,
/// were all of its tokens that reached the agent for a second (the rest of its copies came
/// later): steady by the median, they made 17 iterations a step.
const LONE_LONG_GAP: f64 = 4.0;

/// A sequence of one token repeated (`window`, whose period `p` holds one token only): one a
/// step only where its occurrences come at a steady pace, every gap like the next. Two a step
/// (a batch and its labels, a forward and a backward fill) alternate a short and a long gap,
/// and are refused, as is an unsteady pace: the kernels' period is then used. On an H100 the
/// overhead benchmark's launch-bound GPT without markers (batches on the GPU; kernels traced in
/// sample windows only) had one 432-byte fill a step, 8.7-14.7 ms apart: refused, its kernels
/// in the windows made 44 iterations of its 179 steps.
fn one_a_step(window: &[(u64, u64)], p: usize) -> Option<Lock> {
    let recent = &window[window.len().saturating_sub(LONE_RECENT * p)..];
    let gaps: Vec<f64> = recent
        .windows(2)
        .map(|w| w[1].1.saturating_sub(w[0].1) as f64)
        .collect();
    if gaps.len() < 2 * MIN_PERIODS {
        return None;
    }
    let median_of = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let median = median_of(gaps.clone());
    if median < MIN_LONE_GAP_NS {
        return None;
    }
    let near = gaps
        .iter()
        .filter(|&&g| (g - median).abs() <= STEADY_WITHIN * median)
        .count();
    // Medians, so that one long gap (the first step after compilation) decides nothing.
    let every_other = |parity: usize| gaps.iter().skip(parity).step_by(2).copied().collect();
    // k of them a step (a run of fills) leave a long gap every k: more than one in the window
    // is no pause (a checkpoint saved) but the step's own gap.
    let long = gaps.iter().filter(|&&g| g > LONE_LONG_GAP * median).count();
    let steady = near as f64 >= STEADY_SHARE * gaps.len() as f64
        && long <= 1
        && (median_of(every_other(0)) - median_of(every_other(1))).abs() <= ALTERNATION * median;
    steady.then(|| Lock {
        period: 1,
        anchor: vec![window[window.len() - 1].0],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(kind: ActivityKind, launch: u64, mem_kind: u32, bytes: u64, graph: u32) -> Activity {
        Activity {
            kind,
            start_ns: launch + 10,
            end_ns: launch + 20,
            launch_ns: launch,
            placed: false,
            correlation_id: launch as u32,
            bytes,
            name_id: 0,
            op_id: 0,
            graph_id: graph,
            stream_id: 7,
            mem_kind,
            occupancy: None,
            device: 0,
        }
    }

    /// One copy or fill (of `mem_kind` and `bytes`) launched at each of `times`.
    fn copies_at(times: &[u64], mem_kind: u32, bytes: u64) -> Vec<Activity> {
        times
            .iter()
            .map(|&t| act(ActivityKind::Memory, t, mem_kind, bytes, 0))
            .collect()
    }

    fn found(f: Found) -> Option<Vec<u64>> {
        match f {
            Found::Boundaries(b) => Some(b),
            _ => None,
        }
    }

    /// `steps` steps of a job: two batch copies after a gap, then `fills` fills and a graph.
    fn job(steps: u64, fills: u64) -> Vec<Activity> {
        let mut v = Vec::new();
        let mut t = 1_000;
        for s in 0..steps {
            t += 5_000; // the loop fetching the batch
            v.push(act(ActivityKind::Memory, t, MEM_KIND_HTOD, 4096, 0));
            t += 100;
            v.push(act(ActivityKind::Memory, t, MEM_KIND_HTOD, 4096, 0));
            for _ in 0..fills {
                t += 300;
                v.push(act(ActivityKind::Memory, t, MEM_KIND_MEMSET, 4, 0));
            }
            t += 300;
            // A graph recaptured halfway.
            v.push(act(
                ActivityKind::Graph,
                t,
                0,
                0,
                if s < steps / 2 { 5 } else { 9 },
            ));
        }
        v
    }

    #[test]
    fn the_batch_copy_anchors_each_iteration() {
        let v = job(40, 8);
        let mut d = CycleDetector::default();
        let b = found(d.boundaries(&v, u64::MAX)).expect("a period");
        assert_eq!(b.len(), 40);
        let lock = d.lock.clone().expect("locked");
        assert_eq!(lock.period, 11);
        // Both copies: one alone occurs twice a step.
        assert_eq!(lock.anchor.len(), 2);
        // Each boundary is a step's first copy.
        assert!(b.iter().all(|t| v
            .iter()
            .any(|a| a.launch_ns == *t && a.kind == ActivityKind::Memory)));
        assert_eq!(b[1] - b[0], 5_000 + 100 + 8 * 300 + 300);
    }

    #[test]
    fn a_stray_token_does_not_shift_the_boundaries() {
        let mut v = job(40, 8);
        // A read-back in step 20 only.
        let at = v[20 * 11 + 5].launch_ns + 1;
        v.insert(20 * 11 + 6, act(ActivityKind::Memory, at, 2, 4, 0));
        let mut d = CycleDetector::default();
        assert_eq!(found(d.boundaries(&v, u64::MAX)).map(|b| b.len()), Some(40));
    }

    #[test]
    fn boundaries_carry_over_from_one_take_to_the_next() {
        let v = job(60, 3);
        let mut d = CycleDetector::default();
        let first = found(d.boundaries(&v[..120], u64::MAX)).expect("a period");
        let cut = *first.last().expect("boundaries");
        d.retire(cut);
        let from = v.partition_point(|a| a.anchor_ns() < cut);
        let second = found(d.boundaries(&v[from..], u64::MAX)).expect("still locked");
        assert_eq!(second[0], cut);
        // 60 steps in all: the windows between boundaries, plus the last one still open.
        assert_eq!(first.len() - 1 + second.len(), 60);
    }

    #[test]
    fn only_settled_boundaries_are_given() {
        let v = job(40, 2);
        // Step 30's second copy: its run of two copies is complete at the horizon.
        let horizon = v[30 * 5 + 1].launch_ns;
        let mut d = CycleDetector::default();
        let b = found(d.boundaries(&v, horizon)).expect("a period");
        assert_eq!(b.last(), Some(&v[30 * 5].launch_ns));
        // A run not complete at the horizon is no boundary yet.
        let b = found(d.boundaries(&v, horizon - 1)).expect("a period");
        assert_eq!(b.last(), Some(&v[29 * 5].launch_ns));
    }

    #[test]
    fn a_lost_copy_does_not_merge_two_steps() {
        // Two batch copies and eight fills a step, as the H200 suite's launch-bound GPT.
        let mut v: Vec<Activity> = job(40, 8)
            .into_iter()
            .filter(|a| a.kind == ActivityKind::Memory)
            .collect();
        // Step 5's second batch copy never reached the agent, nor step 12's first.
        v.remove(12 * 10);
        v.remove(5 * 10 + 1);
        let mut d = CycleDetector::default();
        let b = found(d.boundaries(&v, u64::MAX)).expect("a period");
        assert_eq!(d.lock.as_ref().map(|l| l.anchor.len()), Some(2));
        assert_eq!(b.len(), 40);
        // Step 12 starts at the copy that is left.
        assert!(b.contains(&(v[12 * 10 - 1].launch_ns)));
    }

    #[test]
    fn copies_sharing_one_stamp_are_anchored_at_their_start() {
        let mut v = job(40, 8);
        // From step 25 on, every copy and fill carries the correlation id and launch stamp of
        // one earlier copy (CUPTI repeating a correlation id).
        let stale = v[25 * 11];
        for a in v[25 * 11..]
            .iter_mut()
            .filter(|a| a.kind == ActivityKind::Memory)
        {
            a.launch_ns = stale.launch_ns;
            a.correlation_id = stale.correlation_id;
        }
        let mut d = CycleDetector::default();
        let b = found(d.boundaries(&v, u64::MAX)).expect("a period");
        assert_eq!(b.len(), 40);
        // Later steps start at their first copy's GPU start.
        assert_eq!(b[30], v[30 * 11].start_ns);
    }

    /// A model moved to the GPU: `layers` layers' parameters copied 100 ns apart, two kinds of
    /// layer in turn (a period of 12 copies, as a GPT's blocks on an H100).
    fn parameter_copies(layers: usize) -> Vec<Activity> {
        let kinds = [
            [0x40_0000u64, 0x2000, 0x40_0000, 0x800, 0x800, 0x800],
            [0x30_0000u64, 0x1800, 0x10_0000, 0x800, 0x800, 0x800],
        ];
        (0..layers)
            .flat_map(|l| kinds[l % 2])
            .enumerate()
            .map(|(k, bytes)| {
                act(
                    ActivityKind::Memory,
                    1_000 + 100 * k as u64,
                    MEM_KIND_HTOD,
                    bytes,
                    0,
                )
            })
            .collect()
    }

    /// A model moved to the GPU (each layer's parameters: a period of 12 copies), then steps of
    /// 25 small fills and a device-to-device copy (an H100 recording of the overhead
    /// benchmark's GPT under `torch.compile`, without markers): once the copies' lock is lost,
    /// the search is over the steps' tokens alone. With the copies in its window, period 12
    /// scored 0.92, 26 0.91, and 6 came within 0.05 of the best: 899 iterations for 180 steps.
    #[test]
    fn a_lost_lock_leaves_its_tokens_out_of_the_next_search() {
        let mut v = parameter_copies(24);
        let mut t = v.last().map_or(0, |a| a.launch_ns);
        let load = v.len();
        t += 3_000_000_000;
        for _ in 0..30 {
            t += 2_000_000;
            for _ in 0..25 {
                v.push(act(ActivityKind::Memory, t, MEM_KIND_MEMSET, 4, 0));
                t += 10_000;
            }
            v.push(act(ActivityKind::Memory, t, 8, 1 << 24, 0));
            t += 10_000;
        }
        let mut d = CycleDetector::default();
        // The agent took the copies when they had settled, 3 s before the first step.
        let horizon = v[load - 1].launch_ns + 1_000_000;
        let first = found(d.boundaries(&v[..load], horizon)).expect("the copies' period");
        let cut = *first.last().expect("boundaries");
        d.retire(cut);
        // Then the first 30 steps (the search's window holds them and the copies cut before).
        let from = v.partition_point(|a| a.anchor_ns() < cut);
        let to = load + 30 * 26;
        let b = found(d.boundaries(&v[from..to], u64::MAX)).expect("the steps' period");
        assert_eq!(d.lock.as_ref().map(|l| l.period), Some(26));
        assert_eq!(b.len(), 30);
    }

    /// One search over a model's parameter copies (a period of 12) and the steps after them,
    /// one fill a step: the copies' period holds for the whole window (the fills repeat at any
    /// period), and four fills occurred about once per 12 tokens, so the steps were locked four
    /// an iteration (an H100 recording of a launch-bound GPT without markers: 44 iterations for
    /// 179 steps). The anchor never occurs among the copies: the search starts again where it
    /// first does.
    #[test]
    fn a_window_that_begins_in_another_regime_is_searched_from_the_anchor() {
        let mut v = parameter_copies(16);
        let mut t = v.last().map_or(0, |a| a.launch_ns);
        for i in 0..62u64 {
            t += 10_000_000 + (i * 7919 % 2_000_000);
            v.push(act(ActivityKind::Memory, t, MEM_KIND_MEMSET, 432, 0));
        }
        let mut d = CycleDetector::default();
        let b = found(d.boundaries(&v, u64::MAX)).expect("a period");
        assert_eq!(d.lock.as_ref().map(|l| l.period), Some(1));
        assert_eq!(b.len(), 62);
    }

    #[test]
    fn a_late_anchor_drops_itself_not_the_boundaries_after_it() {
        let occ: Vec<(usize, u64)> = [10, 20, 900, 30, 40, 50].into_iter().enumerate().collect();
        assert_eq!(ascending(&occ), vec![10, 20, 30, 40, 50]);
    }

    /// One token repeated is one a step where it comes at a steady pace; two a step alternate
    /// a short and a long gap, and are refused (the kernels' period is used instead).
    #[test]
    fn one_token_repeated_counts_only_at_a_steady_pace() {
        let at = |times: &[u64]| copies_at(times, MEM_KIND_HTOD, 4096);
        // Every 10 ms, give or take 1.5 ms.
        let steady: Vec<u64> = (0..50u64)
            .map(|i| 10_000_000 * i + (i * 7919 % 3_000_000))
            .collect();
        let b = found(CycleDetector::default().boundaries(&at(&steady), u64::MAX));
        assert_eq!(b.map(|b| b.len()), Some(50));
        // Two a step, 3 ms and 7 ms apart.
        let twice: Vec<u64> = (0..50u64)
            .map(|i| 10_000_000 * (i / 2) + if i % 2 == 0 { 0 } else { 3_000_000 })
            .collect();
        assert_eq!(
            CycleDetector::default().boundaries(&at(&twice), u64::MAX),
            Found::Nothing
        );
        // A flood 3 µs apart: no step's pace.
        let flood: Vec<u64> = (0..50u64).map(|i| 3_000 * i).collect();
        assert_eq!(
            CycleDetector::default().boundaries(&at(&flood), u64::MAX),
            Found::Nothing
        );
        // At no steady pace.
        let uneven: Vec<u64> = (0..50u64)
            .map(|i| 1_000_000 * (i * i % 97) + 100_000_000 * i)
            .collect();
        let mut sorted = uneven.clone();
        sorted.sort_unstable();
        assert_eq!(
            CycleDetector::default().boundaries(&at(&sorted), u64::MAX),
            Found::Nothing
        );
    }

    /// A run of one fill a step, 17 of them 1.2 ms apart and 30 ms to the next run, is steady
    /// by its median gap but not a step each: refused (so are runs closer than
    /// [`MIN_LONE_GAP_NS`], like the H100's 0.17-0.3 ms). With a pause now and then (a
    /// checkpoint saved every 40 steps), one a step at a steady pace still counts.
    #[test]
    fn a_run_of_one_token_a_step_is_no_step_each() {
        let at = |times: &[u64]| copies_at(times, MEM_KIND_MEMSET, 4);
        let runs: Vec<u64> = (0..20u64)
            .flat_map(|s| (0..17u64).map(move |k| s * 49_200_000 + k * 1_200_000))
            .collect();
        assert_eq!(
            CycleDetector::default().boundaries(&at(&runs), u64::MAX),
            Found::Nothing
        );
        let paused: Vec<u64> = (0..80u64)
            .map(|i| 10_000_000 * i + if i >= 40 { 900_000_000 } else { 0 })
            .collect();
        let b = found(CycleDetector::default().boundaries(&at(&paused), u64::MAX));
        assert_eq!(b.map(|b| b.len()), Some(80));
    }

    /// A lock whose anchor is part of a longer run of one token matches more than once a step
    /// where the rest of the step's tokens are missing: it cuts nothing closer than half a
    /// period, and is lost once that has gone on for a few periods.
    #[test]
    fn occurrences_closer_than_half_a_period_are_not_boundaries() {
        assert_eq!(
            spaced(vec![(0, 1), (67, 2), (134, 3), (144, 4), (154, 5)], 67),
            vec![(0, 1), (67, 2), (134, 3)]
        );
        assert_eq!(spaced(vec![(0, 1), (1, 2), (2, 3)], 1).len(), 3);
        // Steps of 4 fills then 6 other copies; the lock is on the fills' run.
        let mut d = CycleDetector {
            lock: Some(Lock {
                period: 10,
                anchor: vec![0xf; 3],
            }),
            ..Default::default()
        };
        // Only the fills came: 12 steps of 4 (48 tokens > 3 periods).
        let toks: Vec<(u64, u64)> = (0..48u64).map(|i| (0xf, 1_000 * i)).collect();
        let before = d.lock.clone();
        let f = d.find(&toks[..12], u64::MAX);
        assert_eq!(
            found(f).map(|b| b.len()),
            Some(1),
            "no cut on 3 steps of fills"
        );
        assert_eq!(d.lock, before);
        d.find(&toks, u64::MAX);
        assert_ne!(d.lock, before, "lost after 3 periods");
    }

    #[test]
    fn a_search_waits_for_enough_tokens_at_first() {
        let v = job(40, 2);
        let mut d = CycleDetector::default();
        // 5 tokens a step: 100 tokens in the first 20 steps, a few ms after the first.
        assert_eq!(d.boundaries(&v[..100], v[99].launch_ns), Found::Wait);
        assert_eq!(found(d.boundaries(&v, u64::MAX)).map(|b| b.len()), Some(40));
    }

    #[test]
    fn kernels_are_not_tokens() {
        let v: Vec<Activity> = (0..90)
            .map(|i| act(ActivityKind::Kernel, 1_000 * i, 0, 0, 0))
            .collect();
        assert_eq!(
            CycleDetector::default().boundaries(&v, u64::MAX),
            Found::Nothing
        );
    }

    #[test]
    fn the_shortest_of_equal_periods_wins() {
        assert_eq!(
            detect_period(&[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], 2),
            Some(3)
        );
        assert_eq!(detect_period(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 2), None);
        // Period 3 with one position off in every other period: 6 scores 1.0, 3 scores 0.9.
        let mut s = Vec::new();
        for k in 0..40 {
            s.extend([1, 2, if k % 2 == 0 { 3 } else { 4 }]);
        }
        assert_eq!(detect_period(&s, 2), Some(6));
        for k in 0..40 {
            s.extend([1, 2, if k % 20 == 0 { 4 } else { 3 }]);
        }
        assert_eq!(detect_period(&s[120..], 2), Some(3));
    }
}
