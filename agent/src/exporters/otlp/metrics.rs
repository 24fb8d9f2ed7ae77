//! OTLP metrics from the metric model: a [`Sink`] that turns the walk's samples into data
//! points, per owner (the node, or the training process whose `pid` label a series has), and
//! the meter providers that report them.
//!
//! The families keep their Prometheus names (one namespace: the recording rules and dashboards
//! in `collector-config/` and `dashboards/` work whichever way the data arrives; the
//! collector's `prometheusremotewrite` runs with `add_metric_suffixes: false`). Gauges become
//! observable gauges, counters observable (cumulative, monotonic) counters, and a histogram
//! family its `_sum` and `_count` counters: the SDK takes pre-aggregated buckets from no public
//! API, so the log2 buckets stay Prometheus-only. So do the per-thread families
//! (`slo_probe_thread_*`): they are the unbounded share of the series. The semantic-convention
//! names ([`SEMCONV`]) are sent beside the node's GPU and agent families. Each training
//! process's own iterations also go into a real OTLP histogram, `slo_probe_iteration_seconds`.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use opentelemetry::{
    metrics::{AsyncInstrument, Histogram as OtelHistogram, Meter, MeterProvider as _},
    Key, KeyValue,
};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::{
    metrics::{PeriodicReader, SdkMeterProvider},
    Resource,
};
use slo_probe_core::snapshot::Snapshot;

use super::{configure, OtlpError, Settings};
use crate::{
    config::OtlpProtocol,
    exporters::model::{self, Family, Histogram, Kind, Label, Options, Sink},
};

/// Which part of a model sample an instrument reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Part {
    /// A gauge's or counter's value.
    Value,
    /// A histogram's sum (`<name>_sum`).
    Sum,
    /// A histogram's count (`<name>_count`).
    Count,
}

/// An instrument: its family's (or alias's) name and the part it reports.
pub(super) type InstrumentKey = (&'static str, Part);

/// The instrument's name.
fn instrument_name((name, part): InstrumentKey) -> Cow<'static, str> {
    match part {
        Part::Value => Cow::Borrowed(name),
        Part::Sum => Cow::Owned(format!("{name}_sum")),
        Part::Count => Cow::Owned(format!("{name}_count")),
    }
}

/// One data point.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Point {
    pub(super) attrs: Vec<KeyValue>,
    pub(super) value: f64,
}

/// An observable gauge, or an observable (cumulative, monotonic) counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Instrument {
    Gauge,
    Counter,
}

/// What an instrument is, and what it reports now.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Series {
    pub(super) instrument: Instrument,
    pub(super) help: &'static str,
    pub(super) unit: &'static str,
    pub(super) points: Vec<Point>,
}

/// An owner's instruments.
pub(super) type Points = HashMap<InstrumentKey, Series>;

/// One walk's data points by owner.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// The node's series.
    pub(super) node: Points,
    /// The series of each training process with a resource of its own.
    pub(super) procs: HashMap<u32, Points>,
}

/// A semantic-convention name for a family that has one (hardware GPU metrics, the agent's
/// own process metrics), sent beside the Prometheus-named one on the node's resource so that
/// dashboards built on the conventions find them.
pub(super) struct Alias {
    /// The convention's name.
    pub(super) name: &'static str,
    /// The model family it repeats.
    pub(super) source: &'static str,
    /// The convention's unit.
    pub(super) unit: &'static str,
    /// Label → attribute renames; other labels are dropped.
    pub(super) renames: &'static [(&'static str, &'static str)],
}

const GPU_ATTRIBUTES: &[(&str, &str)] = &[("uuid", "hw.id"), ("name", "hw.name")];

/// The semantic-convention aliases.
pub(super) const SEMCONV: [Alias; 6] = [
    Alias {
        name: "hw.gpu.utilization",
        source: "slo_probe_gpu_utilization_ratio",
        unit: "1",
        renames: GPU_ATTRIBUTES,
    },
    Alias {
        name: "hw.gpu.memory.utilization",
        source: "slo_probe_gpu_memory_utilization_ratio",
        unit: "1",
        renames: GPU_ATTRIBUTES,
    },
    Alias {
        name: "hw.gpu.memory.usage",
        source: "slo_probe_gpu_memory_used_bytes",
        unit: "By",
        renames: GPU_ATTRIBUTES,
    },
    Alias {
        name: "hw.gpu.memory.limit",
        source: "slo_probe_gpu_memory_total_bytes",
        unit: "By",
        renames: GPU_ATTRIBUTES,
    },
    Alias {
        name: "process.cpu.time",
        source: model::AGENT_CPU.name,
        unit: "s",
        renames: &[],
    },
    Alias {
        name: "process.memory.usage",
        source: model::AGENT_RSS.name,
        unit: "By",
        renames: &[],
    },
];

/// Walks `snapshot` (without the per-thread families) into data points; a series with the
/// `pid` label of one of `procs` goes to that process, every other to the node.
pub(super) fn collect(snapshot: &Snapshot, procs: &HashSet<u32>) -> Batch {
    let mut sink = OtlpSink {
        procs,
        batch: Batch::default(),
        alias: None,
    };
    model::walk(snapshot, Options { per_thread: false }, &mut sink);
    sink.batch
}

/// The [`Sink`] that makes the data points.
struct OtlpSink<'a> {
    procs: &'a HashSet<u32>,
    batch: Batch,
    /// The last family sampled and its alias, if any (samples come family by family).
    alias: Option<(&'static Family, Option<&'static Alias>)>,
}

impl OtlpSink<'_> {
    fn owner(&self, labels: &[Label<'_>]) -> Option<u32> {
        labels
            .iter()
            .find(|(k, _)| *k == "pid")
            .and_then(|(_, v)| v.parse().ok())
            .filter(|pid| self.procs.contains(pid))
    }

    fn points(&mut self, owner: Option<u32>) -> &mut Points {
        match owner {
            Some(pid) => self.batch.procs.entry(pid).or_default(),
            None => &mut self.batch.node,
        }
    }

    fn push(&mut self, owner: Option<u32>, key: InstrumentKey, template: Series, point: Point) {
        self.points(owner)
            .entry(key)
            .or_insert(template)
            .points
            .push(point);
    }

    fn alias_of(&mut self, family: &'static Family) -> Option<&'static Alias> {
        match self.alias {
            Some((f, alias)) if std::ptr::eq(f, family) => alias,
            _ => {
                let alias = SEMCONV.iter().find(|a| a.source == family.name);
                self.alias = Some((family, alias));
                alias
            }
        }
    }
}

fn attributes(labels: &[Label<'_>]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue::new(Key::from_static_str(k), (*v).to_owned()))
        .collect()
}

fn empty(instrument: Instrument, help: &'static str, unit: &'static str) -> Series {
    Series {
        instrument,
        help,
        unit,
        points: Vec::new(),
    }
}

impl Sink for OtlpSink<'_> {
    fn family(&mut self, _: &'static Family) {}

    fn sample(&mut self, f: &'static Family, labels: &[Label<'_>], value: f64) {
        let instrument = match f.kind {
            Kind::Counter => Instrument::Counter,
            Kind::Gauge | Kind::Histogram => Instrument::Gauge,
        };
        let owner = self.owner(labels);
        if owner.is_none() {
            if let Some(a) = self.alias_of(f) {
                let attrs = labels
                    .iter()
                    .filter_map(|(k, v)| {
                        let (_, to) = a.renames.iter().find(|(from, _)| from == k)?;
                        Some(KeyValue::new(Key::from_static_str(to), (*v).to_owned()))
                    })
                    .collect();
                self.push(
                    None,
                    (a.name, Part::Value),
                    empty(instrument, f.help, a.unit),
                    Point { attrs, value },
                );
            }
        }
        self.push(
            owner,
            (f.name, Part::Value),
            empty(instrument, f.help, f.unit),
            Point {
                attrs: attributes(labels),
                value,
            },
        );
    }

    fn histogram(&mut self, f: &'static Family, labels: &[Label<'_>], h: &Histogram<'_>) {
        let owner = self.owner(labels);
        let attrs = attributes(labels);
        self.push(
            owner,
            (f.name, Part::Sum),
            empty(Instrument::Counter, f.help, f.unit),
            Point {
                attrs: attrs.clone(),
                value: h.sum,
            },
        );
        self.push(
            owner,
            (f.name, Part::Count),
            empty(Instrument::Counter, f.help, "1"),
            Point {
                attrs,
                value: h.count as f64,
            },
        );
    }
}

/// Bucket bounds of `slo_probe_iteration_seconds`, in seconds (1 ms to 2 min).
const ITERATION_BOUNDS: [f64; 20] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0,
    5.0, 10.0, 30.0, 120.0,
];

/// One resource's meter provider: the instruments registered so far, what they report now,
/// and the iteration histogram.
pub(super) struct Meters {
    provider: SdkMeterProvider,
    meter: Meter,
    /// Shared with the instruments' callbacks, which the SDK's reader thread runs.
    current: Arc<Mutex<Points>>,
    registered: HashSet<InstrumentKey>,
    /// `slo_probe_iteration_seconds`: every iteration's wall time, s.
    pub(super) iteration_seconds: OtelHistogram<f64>,
}

impl Meters {
    /// A provider exporting every `settings.interval` for `resource`.
    pub(super) fn new(settings: &Settings, resource: Resource) -> Result<Self, OtlpError> {
        let exporter = match settings.protocol {
            OtlpProtocol::Grpc => configure(
                opentelemetry_otlp::MetricExporter::builder().with_tonic(),
                settings,
                settings.timeout,
                None,
            )
            .build(),
            OtlpProtocol::HttpProtobuf => configure(
                opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary),
                settings,
                settings.timeout,
                Some("/v1/metrics"),
            )
            .build(),
        }
        .map_err(|source| OtlpError::MetricExporter { source })?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(settings.interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(reader)
            .build();
        Ok(Self::with_provider(provider))
    }

    fn with_provider(provider: SdkMeterProvider) -> Self {
        let meter = provider.meter("slo-probe");
        let iteration_seconds = meter
            .f64_histogram("slo_probe_iteration_seconds")
            .with_description("Wall time of each training iteration the CUPTI shim reported.")
            .with_unit("s")
            .with_boundaries(ITERATION_BOUNDS.to_vec())
            .build();
        Self {
            provider,
            meter,
            current: Arc::default(),
            registered: HashSet::new(),
            iteration_seconds,
        }
    }

    /// Replaces what the instruments report; registers those seen for the first time.
    pub(super) fn publish(&mut self, points: Points) {
        for (&key, series) in &points {
            if !self.registered.insert(key) {
                continue;
            }
            let shared = self.current.clone();
            let callback = move |o: &dyn AsyncInstrument<f64>| {
                if let Ok(current) = shared.lock() {
                    for p in current.get(&key).map_or(&[][..], |s| &s.points) {
                        o.observe(p.value, &p.attrs);
                    }
                }
            };
            let name = instrument_name(key);
            match series.instrument {
                Instrument::Gauge => {
                    self.meter
                        .f64_observable_gauge(name)
                        .with_description(series.help)
                        .with_unit(series.unit)
                        .with_callback(callback)
                        .build();
                }
                Instrument::Counter => {
                    self.meter
                        .f64_observable_counter(name)
                        .with_description(series.help)
                        .with_unit(series.unit)
                        .with_callback(callback)
                        .build();
                }
            }
        }
        if let Ok(mut current) = self.current.lock() {
            *current = points;
        }
    }

    /// Flushes and stops the provider.
    pub(super) fn shutdown(self, timeout: Duration) {
        let _ = self.provider.shutdown_with_timeout(timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::metrics::{
        data::{AggregatedMetrics, MetricData},
        InMemoryMetricExporter,
    };

    fn rich() -> (Snapshot, Batch) {
        let snap = crate::exporters::fixture::rich_snapshot();
        let pids: HashSet<u32> = snap.processes.iter().map(|p| p.pid).collect();
        let batch = collect(&snap, &pids);
        (snap, batch)
    }

    /// The points for the rich snapshot of [`crate::exporters::fixture`], per owner, against
    /// `tests/fixtures/otlp/golden-points.txt`: taken from the exporter that rendered the
    /// Prometheus text and parsed it back, so the data points are the same without the round
    /// trip (build version masked; `SLO_PROBE_BLESS=1` to retake).
    #[test]
    fn golden_points() {
        let (_, batch) = rich();
        let mut owners: Vec<(Option<u32>, &Points)> = vec![(None, &batch.node)];
        owners.extend(batch.procs.iter().map(|(pid, p)| (Some(*pid), p)));
        owners.sort_by_key(|(o, _)| *o);
        let mut out = String::new();
        for (owner, points) in owners {
            let mut keys: Vec<(Cow<'static, str>, &Series)> = points
                .iter()
                .map(|(k, s)| (instrument_name(*k), s))
                .collect();
            keys.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, s) in keys {
                out.push_str(&format!(
                    "{} {name} {:?} unit={:?} help={:?}\n",
                    owner.map_or("node".to_owned(), |p| format!("pid {p}")),
                    s.instrument,
                    s.unit,
                    s.help
                ));
                for p in &s.points {
                    let attrs: Vec<String> = p
                        .attrs
                        .iter()
                        .map(|kv| format!("{}={:?}", kv.key, kv.value.as_str()))
                        .collect();
                    out.push_str(&format!("  {{{}}} {}\n", attrs.join(","), p.value));
                }
            }
        }
        let out = out.replace(env!("CARGO_PKG_VERSION"), "VERSION");
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/otlp/golden-points.txt");
        if std::env::var_os("SLO_PROBE_BLESS").is_some() {
            std::fs::write(&path, &out).expect("bless");
            return;
        }
        let want = std::fs::read_to_string(&path).expect("golden points");
        if out != want {
            let line = out
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(out.lines().count().min(want.lines().count()));
            panic!(
                "the OTLP points differ from {} at line {}: got {:?}, want {:?}",
                path.display(),
                line + 1,
                out.lines().nth(line),
                want.lines().nth(line)
            );
        }
    }

    #[test]
    fn series_go_to_their_process_and_histograms_become_sum_and_count() {
        let (_, batch) = rich();
        let p = &batch.procs[&4100];
        // The training process's host series are on its resource, not the node's.
        let sum = &p[&("slo_probe_runqueue_latency_seconds", Part::Sum)];
        assert_eq!(sum.instrument, Instrument::Counter);
        assert_eq!(sum.unit, "s");
        assert_eq!(
            p[&("slo_probe_runqueue_latency_seconds", Part::Count)].unit,
            "1"
        );
        // pt"odd\ (4200) has no shim: its series stay with the node.
        let odd = &batch.node[&("slo_probe_runqueue_latency_seconds", Part::Count)];
        assert_eq!(odd.points.len(), 1);
        assert_eq!(
            odd.points[0].attrs.first(),
            Some(&KeyValue::new("pid", "4200"))
        );
        assert!(batch
            .procs
            .values()
            .chain([&batch.node])
            .all(|p| p.keys().all(|(n, _)| !n.starts_with("slo_probe_thread_"))));
        // Semantic-convention names on the node only, attributes renamed.
        let util = &batch.node[&("hw.gpu.utilization", Part::Value)];
        assert_eq!(
            util.points[0].attrs,
            vec![
                KeyValue::new("hw.id", "GPU-8d6c1f2e"),
                KeyValue::new("hw.name", "NVIDIA H200")
            ]
        );
        assert_eq!(
            batch.node[&("process.cpu.time", Part::Value)].instrument,
            Instrument::Counter
        );
        assert!(batch
            .procs
            .values()
            .all(|p| !p.contains_key(&("hw.gpu.utilization", Part::Value))));
    }

    #[test]
    fn every_alias_repeats_a_family_of_the_model() {
        let (_, batch) = rich();
        for a in &SEMCONV {
            assert!(
                batch.node.contains_key(&(a.source, Part::Value)),
                "{} repeats {}, which the rich snapshot does not have",
                a.name,
                a.source
            );
            assert!(
                batch.node.contains_key(&(a.name, Part::Value)),
                "{}",
                a.name
            );
        }
    }

    /// Published points through a real meter provider: observable counters are monotonic
    /// cumulative sums, gauges gauges, with the model's units and descriptions.
    #[test]
    fn published_points_reach_the_exporter() {
        let (_, batch) = rich();
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let mut meters = Meters::with_provider(provider);
        meters.publish(batch.node);
        meters.provider.force_flush().expect("flush");
        let got = exporter.get_finished_metrics().expect("metrics");
        let metric = |name: &str| {
            got.iter()
                .flat_map(|rm| rm.scope_metrics())
                .flat_map(|sm| sm.metrics())
                .find(|m| m.name() == name)
                .unwrap_or_else(|| panic!("{name} exported"))
        };
        let ticks = metric("slo_probe_agent_ticks_total");
        let AggregatedMetrics::F64(MetricData::Sum(sum)) = ticks.data() else {
            panic!("ticks is not a sum: {:?}", ticks.data());
        };
        assert!(sum.is_monotonic());
        assert_eq!(sum.data_points().next().map(|p| p.value()), Some(90.0));
        let rss = metric("process.memory.usage");
        assert_eq!(rss.unit(), "By");
        assert_eq!(rss.description(), "Resident memory of the agent.");
        assert!(matches!(
            rss.data(),
            AggregatedMetrics::F64(MetricData::Gauge(_))
        ));
        let cpus = metric("slo_probe_gpu_cpu_affinity_cpus");
        let AggregatedMetrics::F64(MetricData::Gauge(g)) = cpus.data() else {
            panic!("a gauge");
        };
        assert_eq!(g.data_points().count(), 3);
    }
}
