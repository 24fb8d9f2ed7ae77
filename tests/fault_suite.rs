//! The real-fault suite replayed (issue 12): every fixture recorded on the H200 (the
//! `*-h100` archives on an H100, 2026-12-06, `faults-A-ro-h100-2` 2026-12-07; the
//! `*-eager-drain-h100` ones with the shim's drained switching, which only jobs with step
//! markers get: left out of the replays without markers; `faults-*-nomarkers-h100*`,
//! 2026-12-07, of jobs that sent no markers: judged only without them) by `scripts/gpu-faults`
//! (tests/fixtures/faults/faults-*.tar.gz: one trimmed recording per
//! injected fault or healthy run, its host samples, and the answer the job wrote at the
//! fault's CLOCK_MONOTONIC onset) goes through `slo-probe replay` as the agent ran it, with the
//! suite's SLO tree (scripts/faults/agent.toml). The answers come from the job, not from the
//! engine.
//!
//! Asserted (what holds today): every recording replays; with step markers, iterations within
//! 1% of the job's true steps; no traced iteration busier than its period on the GPU; every
//! fault with a measured effect (step time ≥ 1.10× before) opens a violation between its onset
//! and 6 s after its end; the top-1 bar (90%, the operator of the first attributed violation,
//! exactly) with markers and without them (replayed again with the markers ignored, as a job
//! that sends none: iterations within 1% in every recording), and floors at what main reaches
//! for quiet healthy runs; every fault with an effect has causes that add up to the change over
//! the windows they were measured over within ±25%. The other bars (see
//! bench/results/faults-h200.md) are not all met yet.

use std::{path::Path, process::Command};

use slo_probe::{cli::replay, config::Config};
use slo_probe_core::slo::Violation;

/// Whether every name in `names` is one of the `known` fixtures (by its number prefix).
fn only_known(names: &[String], known: &[&str]) -> bool {
    names.iter().all(|n| known.iter().any(|k| n.starts_with(k)))
}

fn fixtures() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/faults");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/faults")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .collect();
    v.sort();
    v
}

fn answers(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "answer.json") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A fixture's answer and its recording (`None`: it has none).
fn fixture(answer: &Path) -> Option<(serde_json::Value, std::path::PathBuf)> {
    let a = serde_json::from_str(&std::fs::read_to_string(answer).expect("answer")).expect("json");
    let bin = std::fs::read_dir(answer.parent().expect("folder"))
        .expect("fixture")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))?;
    Some((a, bin))
}

/// A fixture's name: its answer's folder (`A-11-gpt-eager-launch-healthy`).
fn name_of(answer: &Path) -> String {
    answer
        .parent()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The violations a replay opened.
fn violations_of(r: &replay::Replayed) -> &[Violation] {
    r.process
        .slo
        .as_ref()
        .map_or(&[][..], |s| &s.violations[..])
}

/// The violations a fault opened: from its onset to 6 s after its end.
fn opened_by(violations: &[Violation], onset: u64, end: u64) -> impl Iterator<Item = &Violation> {
    violations
        .iter()
        .filter(move |v| (onset..=end + 6_000_000_000).contains(&v.opened_ns))
}

/// The first violation a fault opened.
fn first_violation(violations: &[Violation], onset: u64, end: u64) -> Option<&Violation> {
    opened_by(violations, onset, end).min_by_key(|v| v.opened_ns)
}

/// The violation a fault is judged by, as `scripts/faults/summary.py` judges it: the first it
/// opened with an attribution (a host node's violation names no operator).
fn judged_violation(violations: &[Violation], onset: u64, end: u64) -> Option<&Violation> {
    opened_by(violations, onset, end)
        .filter(|v| v.attribution.as_ref().is_some_and(|a| a.top().is_some()))
        .min_by_key(|v| v.opened_ns)
}

/// Whether the violation a fault is judged by names the operator the answer expects.
fn judged_right(violations: &[Violation], onset: u64, end: u64, a: &serde_json::Value) -> bool {
    judged_violation(violations, onset, end).is_some_and(|v| named(v, a))
}

/// Whether the judged violation's causes add up to the change of the mean iteration over the
/// windows they were measured over, within ±25% (`window_sum_ok` of scripts/faults/summary.py).
fn sums_up(violations: &[Violation], onset: u64, end: u64) -> bool {
    judged_violation(violations, onset, end)
        .and_then(|v| v.attribution.as_ref())
        .and_then(|a| a.sum_ratio())
        .is_some_and(|x| (0.75..=1.25).contains(&x))
}

/// Whether the judged violation named its cause within 10 s of the fault's onset (issue 13's
/// bar for attribution), and not before it opened.
fn attributed_in_time(violations: &[Violation], onset: u64, end: u64) -> bool {
    judged_violation(violations, onset, end).is_some_and(|v| {
        v.attributed_ns
            .is_some_and(|t| t >= v.opened_ns && t <= onset + 10_000_000_000)
    })
}

/// Whether a violation's top cause is the operator the answer expects (exactly).
fn named(v: &Violation, answer: &serde_json::Value) -> bool {
    let want = answer["expect"]["op"].as_str().unwrap_or("");
    let top = v.attribution.as_ref().and_then(|at| at.top());
    top.is_some_and(|c| !want.is_empty() && *c.op == *want)
}

#[test]
fn every_real_fault_replays_with_its_iterations_and_opens_a_violation() {
    let tmp = std::env::temp_dir().join(format!("slo-probe-faults-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp");
    for a in fixtures() {
        let ok = Command::new("tar")
            .arg("xzf")
            .arg(&a)
            .arg("-C")
            .arg(&tmp)
            .status()
            .expect("tar");
        assert!(ok.success(), "cannot unpack {}", a.display());
    }
    let config = Config::from_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/faults/agent.toml"),
    )
    .expect("the suite's config");
    let opts = replay::ReplayOptions {
        spec: Some(config.slo.clone()),
        sidecars: true,
        heal: Some(config.heal.healer_config()),
        ..Default::default()
    };
    let (mut n, mut faults, mut detected, mut top1, mut healthy_quiet, mut healthy) =
        (0, 0, 0, 0, 0, 0);
    let mut healthy_acted = Vec::new();
    let (mut summed, mut attributed) = (0, 0);
    let mut unsummed = Vec::new();
    let (mut throttled, mut throttled_acted) = (0, 0);
    let mut unmarked = 0;
    let mut problems = Vec::new();
    for answer in answers(&tmp) {
        let name = name_of(&answer);
        let Some((a, bin)) = fixture(&answer) else {
            continue;
        };
        let r = replay::replay_with(&bin, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        n += 1;
        assert!(
            r.host_samples > 0,
            "{name}: its host samples were not replayed"
        );
        let its: Vec<_> = r.process.iterations.iter().collect();
        let truth = a["fixture"]["true_steps"].as_u64().unwrap_or(0);
        let got = its.len() as u64;
        if truth > 0 && got.abs_diff(truth) * 100 > truth {
            problems.push(format!("{name}: {got} iterations, the job made {truth}"));
        }
        for i in its.iter().filter(|i| i.traced && i.step_ns() > 0) {
            // As `Iteration::gpu_busy_ratio` has it, uncapped.
            let util = i.gpu_busy_ns as f64 / i.busy_period_ns().max(1) as f64;
            if util > 1.0 + 1e-9 {
                problems.push(format!("{name}: an iteration {:.1}% busy", util * 100.0));
                break;
            }
        }
        // A job that marked no steps (job.py --markers none) stands only for such a job: past
        // its iterations and utilisation, it counts in the bars without markers below.
        if a["markers"] == "none" {
            unmarked += 1;
            continue;
        }
        let violations = violations_of(&r);
        let actions = r.healer.as_ref().map_or(0, |h| h.actions);
        let effect = a["effect"]["ratio"].as_f64().unwrap_or(0.0);
        if a["kind"] == "healthy" {
            healthy += 1;
            healthy_quiet += usize::from(violations.is_empty());
            // The shadow healer's actions on healthy runs whose steps kept their pace on
            // average (B-12 slowed by 13% by itself and is not counted).
            if effect < 1.10 && actions > 0 {
                healthy_acted.push(format!("{name} ({actions} actions)"));
            }
            continue;
        }
        if a["kind"] == "throttling" && effect >= 1.10 {
            throttled += 1;
            throttled_acted += usize::from(actions > 0);
        }
        let (Some(onset), Some(end)) = (a["onset_ns"].as_u64(), a["end_ns"].as_u64()) else {
            continue;
        };
        if effect < 1.10 {
            continue; // the fault did not slow the job: nothing to detect
        }
        faults += 1;
        match first_violation(violations, onset, end) {
            Some(_) => {
                detected += 1;
                top1 += usize::from(judged_right(violations, onset, end, &a));
                if sums_up(violations, onset, end) {
                    summed += 1;
                } else {
                    unsummed.push(name.clone());
                }
                attributed += usize::from(attributed_in_time(violations, onset, end));
            }
            None => problems.push(format!(
                "{name}: no violation opened for {} (step time {effect:.2}x)",
                a["kind"]
            )),
        }
    }
    // Without step markers (iterations detected, as for a job that sends none).
    let detect = replay::ReplayOptions {
        detect: true,
        ..opts.clone()
    };
    // And at the live agent's pace: records fed as they reached it, iterations taken every
    // 50 ms (replays with the suite's bars by end time above; the count at 50 ms is the one a
    // user sees live, and it differed before 2026-12-07: 62/64).
    let live = replay::ReplayOptions {
        arrival: true,
        advance_ms: Some(50),
        ..detect.clone()
    };
    let mut live_missed = Vec::new();
    let (mut within, mut detect_top1, mut detect_quiet, mut detect_summed) = (0, 0, 0, 0);
    let (mut detect_n, mut detect_faults, mut detect_healthy, mut markers_only) = (0, 0, 0, 0);
    let mut detect_missed = Vec::new();
    let mut detect_unsummed = Vec::new();
    for answer in answers(&tmp) {
        let name = name_of(&answer);
        let Some((a, bin)) = fixture(&answer) else {
            continue;
        };
        // Recorded with tracing that only a job marking its steps gets (the default shim's
        // drained switching: a job without markers keeps kernel tracing on): no stand-in for a
        // job that sends none.
        if a["fixture"]["markers_only"].is_string() {
            markers_only += 1;
            continue;
        }
        detect_n += 1;
        let r = replay::replay_with(&bin, &detect).unwrap_or_else(|e| panic!("{e}"));
        let truth = a["fixture"]["true_steps"].as_u64().unwrap_or(0);
        let got = r.process.iterations.len() as u64;
        within += usize::from(truth > 0 && got.abs_diff(truth) * 100 <= truth);
        let paced = replay::replay_with(&bin, &live).unwrap_or_else(|e| panic!("{e}"));
        let got = paced.process.iterations.len() as u64;
        if truth == 0 || got.abs_diff(truth) * 100 > truth {
            live_missed.push(format!("{name} ({got} for {truth})"));
        }
        let violations = violations_of(&r);
        if a["kind"] == "healthy" {
            detect_healthy += 1;
            detect_quiet += usize::from(violations.is_empty());
            continue;
        }
        let (Some(onset), Some(end)) = (a["onset_ns"].as_u64(), a["end_ns"].as_u64()) else {
            continue;
        };
        if a["effect"]["ratio"].as_f64().unwrap_or(0.0) < 1.10 {
            continue;
        }
        detect_faults += 1;
        if judged_right(violations, onset, end, &a) {
            detect_top1 += 1;
        } else {
            detect_missed.push(name.clone());
        }
        if sums_up(violations, onset, end) {
            detect_summed += 1;
        } else {
            detect_unsummed.push(name);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!(
        "without markers ({markers_only} recordings that stand only for jobs with markers left \
         out): iterations within 1% of the true steps in {within}/{detect_n} (at the live \
         pace: {} off); top-1 operator \
         {detect_top1}/{detect_faults}; causes adding up to the change over their windows \
         (±25%) {detect_summed}/{detect_faults}; healthy runs without a violation \
         {detect_quiet}/{detect_healthy}",
        live_missed.len()
    );
    eprintln!(
        "fault suite: {n} recordings ({unmarked} of jobs without step markers, judged only in the \
         bars without markers); {detected}/{faults} faults with an effect detected; \
         top-1 operator {top1}/{detected}; causes adding up to the change over their windows \
         (±25%) {summed}/{faults}; a cause named within 10 s of the onset {attributed}/{faults}; \
         healthy runs without a violation {healthy_quiet}/{healthy}"
    );
    eprintln!("shadow healer: acted on {throttled_acted} of {throttled} throttled runs");
    assert!(n >= 25, "only {n} fixtures found");
    assert!(
        throttled_acted * 2 >= throttled && throttled > 0,
        "the shadow healer acted on {throttled_acted} of {throttled} throttled runs"
    );
    // The top-1 bar (90%, operator exactly), with markers and without; floors at what main
    // reaches for quiet healthy runs (the bar is every one): an engine change that loses a
    // fault or wakes a healthy run fails here.
    assert!(
        detected >= 25 && top1 * 10 >= detected * 9,
        "top-1 {top1}/{detected} is below the 90% bar"
    );
    // A floor at what main reaches (the bar is none): B-21, the convnet under reduce-overhead
    // recorded on an H100 host whose CPUs bound its loader (the job logged a batch costing
    // 70.6 ms at the least, above its 40 ms target), ran 1.07x slower for 8 s and the shadow
    // healer would have boosted its I/O.
    assert!(
        healthy_acted.len() <= 1,
        "the shadow healer would have acted on healthy runs that kept their pace: {}",
        healthy_acted.join(", ")
    );
    assert!(
        healthy_quiet >= 19,
        "healthy runs without a violation {healthy_quiet}/{healthy} fell below main's 19"
    );
    // Without markers: iterations within 1% in every recording (the bar), and top-1 at 90%.
    assert!(
        within == detect_n && detect_n + markers_only == n && detect_n >= 25,
        "without markers, iterations within 1% in only {within}/{detect_n}"
    );
    assert!(
        live_missed.is_empty(),
        "without markers at the live pace (50 ms, records as they arrived), iterations off by \
         more than 1%: {}",
        live_missed.join(", ")
    );
    // Top-1 without markers: the 90% bar (49/53 since the jobs recorded without markers of
    // 2026-12-07, A-57..A-73 and B-46..B-66), and no miss but the four main has.
    // (low occupancy inside CUDA graphs, H200 recordings from before the capture-time launch
    // configurations: `graph#26`; A-55, the same fault recorded with them, is named right);
    // B-25 and B-45 (the convnet under reduce-overhead in a throttled cgroup, H100 and H200):
    // named `(data loading)` ← throttling, the answer's accepted alternative, since its loaders'
    // run-queue wait grew with the main threads' and only the main threads' growth moves to the
    // launches (B-50 and B-61, the same fault recorded without markers, are named right).
    // Healthy runs quiet: main's floor, 20 (B-12, B-21 and B-46, the convnet under
    // reduce-overhead with three loader workers, drift with their loader).
    const DETECT_MISSES: [&str; 4] = ["A-04-", "A-09-", "B-25-", "B-45-"];
    assert!(
        only_known(&detect_missed, &DETECT_MISSES)
            && detect_top1 * 10 >= detect_faults * 9
            && detect_quiet >= 20,
        "without markers, top-1 {detect_top1}/{detect_faults} (bar 90%; missed {}, main misses \
         only {DETECT_MISSES:?}) and healthy quiet {detect_quiet} (main's floor 20)",
        detect_missed.join(", ")
    );
    // The sum bar (±25%), against the change over the windows the causes were measured over,
    // with and without markers: every fault with an effect as main reaches it, but one with
    // markers: B-38 (the convnet under torch.compile, pageable copies, H100 2026-12-06) is
    // judged on a compute violation opened in the window the copies began, whose iterations
    // had not slowed yet: no change over its windows to sum against (its cause, +15.8 ms a step
    // of memcpy HtoD, is the fault's size). Without markers, B-63 (the same fault on the same
    // job recorded without markers, H100 2026-12-07): its copy, named right, grew 14.1 ms a step
    // over windows whose steps grew less (causes 1.58× that change); not explained yet.
    const UNSUMMED: [&str; 1] = ["B-38-"];
    const DETECT_UNSUMMED: [&str; 1] = ["B-63-"];
    assert!(
        only_known(&unsummed, &UNSUMMED) && only_known(&detect_unsummed, &DETECT_UNSUMMED),
        "causes adding up to the change over their windows: {summed}/{faults} with markers \
         (not: {}; main misses only {UNSUMMED:?}), {detect_summed}/{detect_faults} without \
         (not: {}; main misses only {DETECT_UNSUMMED:?})",
        unsummed.join(", "),
        detect_unsummed.join(", ")
    );
    // Attribution within 10 s of the onset (issue 13), by end time: every fault with an effect,
    // as main reaches it.
    assert!(
        attributed == faults,
        "a cause named within 10 s of the onset for {attributed}/{faults} faults with an effect"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
