//! The model on the rich snapshot of [`crate::exporters::fixture`], through a sink that records
//! what it is given: declaration order, naming and unit conventions, label sets, histograms.

use std::collections::HashSet;

use super::*;
use crate::exporters::fixture::{empty_snapshot, rich_snapshot};

/// One call the sink got.
#[derive(Debug)]
enum Call {
    Family(&'static Family),
    Sample(&'static Family, Vec<(String, String)>, f64),
    Histogram(
        &'static Family,
        Vec<(String, String)>,
        Vec<(f64, u64)>,
        f64,
        u64,
    ),
}

#[derive(Default)]
struct Recorder(Vec<Call>);

fn owned(labels: &[Label<'_>]) -> Vec<(String, String)> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl Sink for Recorder {
    fn family(&mut self, family: &'static Family) {
        self.0.push(Call::Family(family));
    }

    fn sample(&mut self, family: &'static Family, labels: &[Label<'_>], value: f64) {
        self.0.push(Call::Sample(family, owned(labels), value));
    }

    fn histogram(&mut self, family: &'static Family, labels: &[Label<'_>], h: &Histogram<'_>) {
        self.0.push(Call::Histogram(
            family,
            owned(labels),
            h.buckets.to_vec(),
            h.sum,
            h.count,
        ));
    }
}

fn record(snapshot: &Snapshot, per_thread: bool) -> Vec<Call> {
    let mut r = Recorder::default();
    walk(snapshot, Options { per_thread }, &mut r);
    r.0
}

/// The unit OTLP has always been sent for a name: from its Prometheus suffix.
fn unit_from_suffix(name: &str) -> &'static str {
    let base = name.trim_end_matches("_total");
    for (suffix, unit) in [
        ("_seconds", "s"),
        ("_bytes", "By"),
        ("_ratio", "1"),
        ("_watts", "W"),
        ("_hertz", "Hz"),
        ("_bytes_per_second", "By/s"),
    ] {
        if base.ends_with(suffix) {
            return unit;
        }
    }
    ""
}

#[test]
fn families_are_declared_once_before_their_samples_and_follow_the_conventions() {
    for (snapshot, per_thread) in [
        (rich_snapshot(), true),
        (rich_snapshot(), false),
        (empty_snapshot(), true),
    ] {
        let mut declared: HashSet<&str> = HashSet::new();
        for call in record(&snapshot, per_thread) {
            let (f, labels) = match &call {
                Call::Family(f) => {
                    assert!(declared.insert(f.name), "{} declared twice", f.name);
                    assert!(f.name.starts_with("slo_probe_"), "{}", f.name);
                    assert!(
                        f.name
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                        "{}",
                        f.name
                    );
                    assert_eq!(
                        f.kind == Kind::Counter,
                        f.name.ends_with("_total"),
                        "counters and only counters end in _total: {}",
                        f.name
                    );
                    assert_eq!(f.unit, unit_from_suffix(f.name), "unit of {}", f.name);
                    assert!(
                        f.help.ends_with('.') && !f.help.contains("  "),
                        "{}",
                        f.name
                    );
                    continue;
                }
                Call::Sample(f, labels, _) => {
                    assert_ne!(f.kind, Kind::Histogram, "{}", f.name);
                    (f, labels)
                }
                Call::Histogram(f, labels, buckets, sum, count) => {
                    assert_eq!(f.kind, Kind::Histogram, "{}", f.name);
                    assert!(buckets
                        .windows(2)
                        .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
                    assert!(buckets.last().is_some_and(|b| b.1 <= *count));
                    assert!(*sum >= 0.0);
                    (f, labels)
                }
            };
            assert!(declared.contains(f.name), "{} sampled undeclared", f.name);
            let mut keys = HashSet::new();
            for (k, _) in labels {
                assert!(keys.insert(k.as_str()), "{} repeats label {k}", f.name);
                assert!(k != "le" && k != "quantile" || f.kind == Kind::Gauge, "{k}");
            }
            if !per_thread {
                assert!(!f.name.starts_with("slo_probe_thread_"), "{}", f.name);
            }
        }
    }
}

#[test]
fn process_series_carry_pid_rank_and_job_first() {
    for call in record(&rich_snapshot(), false) {
        let Call::Sample(f, labels, _) = call else {
            continue;
        };
        let process_family = ["shim_", "iteration", "slo_", "attribution_", "gpu_launch"]
            .iter()
            .any(|p| f.name["slo_probe_".len()..].starts_with(p))
            // The node's refusals: no process to name (most never registered).
            && f.name != "slo_probe_shim_refused_total";
        if process_family {
            let keys: Vec<&str> = labels.iter().take(3).map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, ["pid", "rank", "job_id"], "{}", f.name);
        }
    }
}

#[test]
fn values_come_from_the_snapshot() {
    let snap = rich_snapshot();
    let calls = record(&snap, true);
    let value = |name: &str, want: &[(&str, &str)]| {
        calls.iter().find_map(|c| match c {
            Call::Sample(f, labels, v)
                if f.name == name
                    && want
                        .iter()
                        .all(|(k, w)| labels.iter().any(|(lk, lv)| lk == k && lv == w)) =>
            {
                Some(*v)
            }
            _ => None,
        })
    };
    assert_eq!(
        value("slo_probe_agent_cpu_seconds_total", &[]),
        Some(12.625)
    );
    assert_eq!(
        value("slo_probe_probe_up", &[("probe", "tcp")]),
        Some(0.0),
        "down, with its reason unescaped"
    );
    assert_eq!(
        value(
            "slo_probe_offcpu_seconds_total",
            &[
                ("pid", "4100"),
                ("role", "data_loader"),
                ("kind", "voluntary")
            ]
        ),
        Some(2.5)
    );
    assert_eq!(
        value("slo_probe_gpu_utilization_ratio", &[("uuid", "GPU-\"b\"")]),
        Some(0.87)
    );
    assert_eq!(
        value("slo_probe_iterations_total", &[("pid", "4100")]),
        snap.processes.first().map(|p| p.iterations_total as f64)
    );
    let straggler = snap.stragglers.iter().find(|v| v.straggler.is_some());
    assert!(straggler.is_some(), "the fixture names a straggler");
    let hist = calls.iter().find_map(|c| match c {
        Call::Histogram(f, labels, buckets, sum, count)
            if f.name == "slo_probe_runqueue_latency_seconds"
                && labels
                    .iter()
                    .any(|(k, v)| k == "role" && v == "data_loader") =>
        {
            Some((buckets.clone(), *sum, *count))
        }
        _ => None,
    });
    let (buckets, sum, count) = hist.expect("the loader's histogram");
    assert_eq!(buckets.len(), 25);
    assert_eq!(buckets[0], (1.024e-6, 0));
    assert_eq!(count, 3);
    // 12 s is past the last finite bucket (17.2 s holds it), 40 ms inside 67 ms.
    assert_eq!(buckets.iter().find(|b| b.0 > 0.04).map(|b| b.1), Some(2));
    assert!((sum - 12.040002).abs() < 1e-9, "{sum}");
}

/// Every family the collector's rules may use (`collector-config/families.txt`) is one the
/// model exports, under that name and type: the rules cannot drift from the agent.
#[test]
fn the_rules_families_are_exported() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../collector-config/families.txt");
    let listed = std::fs::read_to_string(&path).expect("families.txt");
    let declared: Vec<&'static Family> = record(&rich_snapshot(), true)
        .into_iter()
        .filter_map(|c| match c {
            Call::Family(f) => Some(f),
            _ => None,
        })
        .collect();
    let mut checked = 0;
    for line in listed.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some((name, kind)) = line.split_once(' ') else {
            continue;
        };
        let f = declared
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} is in {} but not exported", path.display()));
        assert_eq!(f.kind.as_str(), kind.trim(), "type of {name}");
        checked += 1;
    }
    assert!(checked >= 10, "{checked} families checked");
}
