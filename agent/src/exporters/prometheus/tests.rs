//! The exposition as Prometheus reads it: the text of whole snapshots (the golden files), of
//! the GPU families and of the SLO tree, escaping, histogram buckets, well-formedness.

use super::*;
use slo_probe_common::{log2_slot, ThreadStats};
use slo_probe_core::{
    cgroup::{CgroupRow, CpuLimit, CpuStat, Pressure, PressureRow},
    proctree::ProcessTree,
    roles::{Role, RoleRules},
    snapshot::ProbeStatus,
    threads::{ThreadRead, ThreadTable},
};

fn snapshot() -> Snapshot {
    let mut h = ThreadStats::ZERO;
    h.tgid = 7;
    h.comm[..6].copy_from_slice(b"tr\"ain");
    for w in [500u64, 2_000, 3_000_000] {
        h.runq_slots[log2_slot(w)] += 1;
        h.runq_count += 1;
        h.runq_total_ns += w;
    }
    h.offcpu_voluntary_ns = 2_500_000_000;
    h.tcp_sent_bytes = 4096;
    let mut tree = ProcessTree::new();
    tree.set_roots([7]);
    let mut table = ThreadTable::new(10);
    let threads = table.apply(
        1,
        &[ThreadRead { tid: 7, stats: h }],
        &tree,
        &RoleRules::default(),
    );
    Snapshot {
        threads: Some(threads),
        cgroups: vec![CgroupRow {
            path: "/job".into(),
            version: 1,
            cpu: Some(CpuStat {
                nr_periods: 10,
                nr_throttled: 9,
                throttled_ns: 900_000_000,
            }),
            limit: Some(CpuLimit {
                quota_us: Some(10_000),
                period_us: 100_000,
            }),
            pressure: None,
            pids: vec![7],
            roles: vec![Role::Main],
        }],
        pressure: vec![PressureRow {
            resource: "cpu",
            pressure: Pressure {
                some_us: 1_500_000,
                full_us: 0,
            },
        }],
        probes: vec![ProbeStatus {
            name: "runqueue",
            up: true,
            reason: String::new(),
        }],
        ..Default::default()
    }
}

#[test]
fn histogram_buckets_are_cumulative_and_escaped() {
    let text = render(&snapshot(), true);
    let labels = "pid=\"7\",process=\"tr\\\"ain\",role=\"main\"";
    let name = "slo_probe_runqueue_latency_seconds";
    assert!(
        text.contains(&format!("{name}_bucket{{{labels},le=\"0.000001024\"}} 1")),
        "{text}"
    );
    assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"0.000002048\"}} 2")));
    assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"0.004194304\"}} 3")));
    assert!(text.contains(&format!("{name}_bucket{{{labels},le=\"+Inf\"}} 3")));
    assert!(text.contains(&format!("{name}_count{{{labels}}} 3")));
    assert!(text.contains(&format!("{name}_sum{{{labels}}} 0.0030025")));
    assert!(text.contains(
        "slo_probe_thread_runqueue_latency_seconds_count{pid=\"7\",process=\"tr\\\"ain\",\
         tid=\"7\",thread=\"tr\\\"ain\",role=\"main\"} 3"
    ));
    assert!(text.contains(&format!(
        "slo_probe_offcpu_seconds_total{{{labels},kind=\"voluntary\"}} 2.5"
    )));
    assert!(text.contains(&format!("slo_probe_tcp_sent_bytes_total{{{labels}}} 4096")));
    assert!(text.contains("slo_probe_probe_up{probe=\"runqueue\",reason=\"\"} 1"));
    assert!(text.contains("slo_probe_ebpf_events_dropped_total{reason=\"ringbuf_full\"} 0"));
    let cg = "cgroup=\"/job\",version=\"1\",roles=\"main\"";
    assert!(text.contains(&format!(
        "slo_probe_cgroup_cpu_throttled_periods_total{{{cg}}} 9"
    )));
    assert!(text.contains(&format!(
        "slo_probe_cgroup_cpu_throttled_seconds_total{{{cg}}} 0.9"
    )));
    assert!(text.contains(&format!("slo_probe_cgroup_cpu_limit_cpus{{{cg}}} 0.1")));
    assert!(text
        .contains("slo_probe_pressure_stalled_seconds_total{resource=\"cpu\",kind=\"some\"} 1.5"));
}

#[test]
fn per_thread_can_be_switched_off() {
    let text = render(&snapshot(), false);
    assert!(!text.contains("slo_probe_thread_runqueue_latency_seconds_bucket"));
    assert!(text.contains("slo_probe_runqueue_latency_seconds_bucket"));
}

/// The whole exposition of the rich snapshot of [`crate::exporters::fixture`] (and of an
/// empty one), byte for byte, against `tests/fixtures/prometheus/golden-*.prom`; the build
/// version is masked. A change must be deliberate: rerun with `SLO_PROBE_BLESS=1` and say
/// why in the commit.
#[test]
fn golden_exposition() {
    use crate::exporters::fixture::{empty_snapshot, rich_snapshot};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/prometheus");
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    let mut failures = Vec::new();
    for (name, snapshot, per_thread) in [
        ("golden-node.prom", rich_snapshot(), true),
        ("golden-node-no-threads.prom", rich_snapshot(), false),
        ("golden-empty.prom", empty_snapshot(), true),
    ] {
        let text = render(&snapshot, per_thread).replace(&version, "version=\"VERSION\"");
        let path = dir.join(name);
        if std::env::var_os("SLO_PROBE_BLESS").is_some() {
            std::fs::write(&path, &text).expect("bless");
            continue;
        }
        let want = std::fs::read_to_string(&path).expect("golden exposition");
        if text != want {
            let line = text
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(text.lines().count().min(want.lines().count()));
            failures.push(format!(
                "{name}: differs from line {}: got {:?}, want {:?}",
                line + 1,
                text.lines().nth(line),
                want.lines().nth(line)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every sample line belongs to a family declared once with HELP and TYPE before it, and
/// every line parses as `name{labels} value`.
#[test]
fn exposition_is_well_formed() {
    let text = render(&snapshot(), true);
    let mut declared = std::collections::HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let family = rest.split(' ').next().unwrap_or_default().to_owned();
            assert!(declared.insert(family.clone()), "{family} declared twice");
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).expect("name");
        let name = &line[..name_end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| declared.contains(*f)))
            .unwrap_or(name);
        assert!(declared.contains(family), "undeclared family in {line}");
        let value = line.rsplit(' ').next().expect("value");
        assert!(value.parse::<f64>().is_ok(), "bad value in {line}");
    }
}

/// The GPU families in the text format.
mod gpu {
    use super::super::TextSink;
    use crate::exporters::model::gpu::{walk, FAMILIES};
    use slo_probe_core::gpu::{ComputeCapability, GpmMetrics};
    use slo_probe_core::gpu::{GpuSample, GpuSnapshot};

    /// The GPU families of `gpus` in the text format.
    fn render_gpus(text: &mut String, gpus: &GpuSnapshot) {
        walk(&mut TextSink::new(text), gpus);
    }

    fn h200() -> GpuSample {
        GpuSample {
            index: 0,
            uuid: "GPU-8d6c1f2e".into(),
            name: "NVIDIA H200".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
            sm_count: Some(132),
            gpu_util_percent: Some(87.0),
            memory_util_percent: Some(40.0),
            memory_used_bytes: Some(80_000_000_000),
            memory_total_bytes: Some(150_754_820_096),
            sm_clock_mhz: Some(1980),
            memory_clock_mhz: Some(3201),
            power_watts: Some(612.5),
            pcie_tx_bytes_per_sec: Some(1_048_576.0),
            pcie_rx_bytes_per_sec: Some(2_097_152.0),
            nvlink_tx_bytes_per_sec: Some(0.0),
            nvlink_rx_bytes_per_sec: None,
            gpm: GpmMetrics {
                interval_ns: Some(1_000_000_000),
                graphics_util_percent: Some(90.0),
                sm_util_percent: Some(75.0),
                sm_occupancy_percent: Some(31.25),
                dram_bw_util_percent: Some(55.0),
                any_tensor_util_percent: Some(20.0),
                hmma_tensor_util_percent: Some(19.5),
                imma_tensor_util_percent: Some(0.0),
                dfma_tensor_util_percent: Some(0.0),
                fp16_util_percent: Some(1.0),
                fp32_util_percent: Some(12.0),
                fp64_util_percent: None,
                integer_util_percent: Some(8.0),
            },
        }
    }

    /// An older GPU whose driver said little, with a name that needs escaping.
    fn old() -> GpuSample {
        GpuSample {
            index: 1,
            uuid: "GPU-1".into(),
            name: "odd \"card\"\\\n".into(),
            gpu_util_percent: Some(5.0),
            ..GpuSample::default()
        }
    }

    fn snapshot() -> GpuSnapshot {
        GpuSnapshot {
            devices: vec![h200(), old()],
            taken_at_ns: 42,
            ..GpuSnapshot::default()
        }
    }

    #[test]
    fn exact_lines() {
        let mut text = String::new();
        render_gpus(&mut text, &snapshot());
        let l0 = "gpu=\"0\",uuid=\"GPU-8d6c1f2e\",name=\"NVIDIA H200\"";
        let l1 = "gpu=\"1\",uuid=\"GPU-1\",name=\"odd \\\"card\\\"\\\\\\n\"";
        for line in [
            format!(
                "slo_probe_gpu_info{{{l0},pci_bus_id=\"00000000:18:00.0\",\
                 compute_capability=\"9.0\"}} 1"
            ),
            format!("slo_probe_gpu_info{{{l1},pci_bus_id=\"\",compute_capability=\"\"}} 1"),
            format!("slo_probe_gpu_streaming_multiprocessors{{{l0}}} 132"),
            format!("slo_probe_gpu_utilization_ratio{{{l0}}} 0.87"),
            format!("slo_probe_gpu_utilization_ratio{{{l1}}} 0.05"),
            format!("slo_probe_gpu_memory_utilization_ratio{{{l0}}} 0.4"),
            format!("slo_probe_gpu_memory_used_bytes{{{l0}}} 80000000000"),
            format!("slo_probe_gpu_memory_total_bytes{{{l0}}} 150754820096"),
            format!("slo_probe_gpu_sm_clock_hertz{{{l0}}} 1980000000"),
            format!("slo_probe_gpu_memory_clock_hertz{{{l0}}} 3201000000"),
            format!("slo_probe_gpu_power_watts{{{l0}}} 612.5"),
            format!("slo_probe_gpu_pcie_transmit_bytes_per_second{{{l0}}} 1048576"),
            format!("slo_probe_gpu_pcie_receive_bytes_per_second{{{l0}}} 2097152"),
            format!("slo_probe_gpu_nvlink_transmit_bytes_per_second{{{l0}}} 0"),
            format!("slo_probe_gpu_graphics_engine_active_ratio{{{l0}}} 0.9"),
            format!("slo_probe_gpu_sm_utilization_ratio{{{l0}}} 0.75"),
            format!("slo_probe_gpu_sm_occupancy_ratio{{{l0}}} 0.3125"),
            format!("slo_probe_gpu_dram_bandwidth_utilization_ratio{{{l0}}} 0.55"),
            format!("slo_probe_gpu_tensor_utilization_ratio{{{l0}}} 0.2"),
            format!("slo_probe_gpu_pipe_utilization_ratio{{{l0},pipe=\"tensor_hmma\"}} 0.195"),
            format!("slo_probe_gpu_pipe_utilization_ratio{{{l0},pipe=\"tensor_imma\"}} 0"),
            format!("slo_probe_gpu_pipe_utilization_ratio{{{l0},pipe=\"fp32\"}} 0.12"),
            format!("slo_probe_gpu_pipe_utilization_ratio{{{l0},pipe=\"integer\"}} 0.08"),
            "# TYPE slo_probe_gpu_sm_occupancy_ratio gauge".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        // None is no series: not for the old GPU, not for a metric the H200 lacked.
        assert!(!text.contains(&format!("slo_probe_gpu_power_watts{{{l1}}}")));
        assert!(!text.contains("pipe=\"fp64\""));
        assert!(!text.contains("slo_probe_gpu_nvlink_receive_bytes_per_second"));
        // One line per value the two GPUs reported, plus the info lines.
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        // 2 info lines, 17 single values (16 of the H200, 1 of the old GPU), 6 pipes.
        assert_eq!(samples, 2 + 17 + 6);
    }

    /// A GPU without GPM and with few readings: the whole output, byte for byte.
    #[test]
    fn whole_output_of_a_sparse_gpu() {
        let mut text = String::new();
        let gpus = GpuSnapshot {
            devices: vec![GpuSample {
                index: 3,
                uuid: "GPU-3".into(),
                name: "Tesla V100".into(),
                compute_capability: Some(ComputeCapability { major: 7, minor: 0 }),
                power_watts: Some(41.25),
                ..GpuSample::default()
            }],
            taken_at_ns: 1,
            ..GpuSnapshot::default()
        };
        render_gpus(&mut text, &gpus);
        assert_eq!(
            text,
            "# HELP slo_probe_gpu_info GPUs NVML reports; always 1.\n\
             # TYPE slo_probe_gpu_info gauge\n\
             slo_probe_gpu_info{gpu=\"3\",uuid=\"GPU-3\",name=\"Tesla V100\",pci_bus_id=\"\",\
             compute_capability=\"7.0\"} 1\n\
             # HELP slo_probe_gpu_power_watts Power draw of the GPU.\n\
             # TYPE slo_probe_gpu_power_watts gauge\n\
             slo_probe_gpu_power_watts{gpu=\"3\",uuid=\"GPU-3\",name=\"Tesla V100\"} 41.25\n"
        );
    }

    #[test]
    fn no_gpu_no_output() {
        let mut text = String::new();
        render_gpus(&mut text, &GpuSnapshot::default());
        assert!(text.is_empty());
    }

    /// Every sample belongs to a family declared once, HELP before TYPE before its samples;
    /// names follow the conventions; ratios are within 0..=1.
    #[test]
    fn exposition_is_well_formed() {
        let mut text = String::new();
        render_gpus(&mut text, &snapshot());
        let mut declared = std::collections::HashSet::new();
        let mut helped = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                helped = rest.split(' ').next().map(str::to_owned);
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                let family = parts.next().unwrap_or_default().to_owned();
                assert_eq!(parts.next(), Some("gauge"), "{line}");
                assert_eq!(
                    helped.as_deref(),
                    Some(family.as_str()),
                    "HELP before {line}"
                );
                assert!(family.starts_with("slo_probe_gpu_"), "{family}");
                assert!(declared.insert(family.clone()), "{family} declared twice");
                continue;
            }
            let name = &line[..line.find('{').expect("labels")];
            assert!(declared.contains(name), "undeclared family in {line}");
            assert!(line[name.len()..].starts_with("{gpu=\""), "{line}");
            let value: f64 = line
                .rsplit(' ')
                .next()
                .expect("value")
                .parse()
                .expect("f64");
            if name.ends_with("_ratio") {
                assert!((0.0..=1.0).contains(&value), "{line}");
            }
        }
        for f in FAMILIES {
            assert!(
                f.family.name.starts_with("slo_probe_gpu_") && !f.family.name.contains("percent"),
                "{}",
                f.family.name
            );
        }
    }

    #[test]
    fn topology_of_two_nvlinked_gpus() {
        use slo_probe_core::gpu::{GpuPath, GpuPeer, GpuTopology};
        let topo = |index: u32, peer: u32| GpuTopology {
            index,
            numa_node: Some(index),
            cpu_affinity: (index * 16..index * 16 + 16).collect(),
            pcie_generation: Some((1, 5)),
            pcie_width: Some((16, 16)),
            nvlinks_active: Some(18),
            peers: vec![GpuPeer {
                index: peer,
                path: GpuPath::NvLink,
                nvlinks: 18,
                p2p_read: Some(true),
            }],
        };
        let mut a = h200();
        a.index = 0;
        a.uuid = "GPU-a".into();
        let mut b = h200();
        b.index = 1;
        b.uuid = "GPU-b".into();
        let gpus = GpuSnapshot {
            devices: vec![a, b],
            topology: std::sync::Arc::new(vec![topo(0, 1), topo(1, 0)]),
            ..GpuSnapshot::default()
        };
        let mut text = String::new();
        render_gpus(&mut text, &gpus);
        for line in [
            "slo_probe_gpu_numa_node{gpu=\"1\",uuid=\"GPU-b\",name=\"NVIDIA H200\"} 1",
            "slo_probe_gpu_cpu_affinity_info{gpu=\"1\",uuid=\"GPU-b\",name=\"NVIDIA H200\",cpus=\"16-31\"} 1",
            "slo_probe_gpu_cpu_affinity_cpus{gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H200\"} 16",
            "slo_probe_gpu_pcie_link_generation{gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H200\",which=\"max\"} 5",
            "slo_probe_gpu_pcie_link_width_lanes{gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H200\",which=\"current\"} 16",
            "slo_probe_gpu_nvlink_active_links{gpu=\"1\",uuid=\"GPU-b\",name=\"NVIDIA H200\"} 18",
            "slo_probe_gpu_peer_path{gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H200\",peer_gpu=\"1\",peer_uuid=\"GPU-b\",path=\"nvlink\",nvlinks=\"18\",p2p_read=\"yes\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }
}

/// The SLO families in the text format.
mod slo {
    use super::super::TextSink;
    use crate::exporters::model::slo::walk;
    use slo_probe_core::synth::{case, drive, generate, test_spec};

    /// A generated job whose all-reduce slows down, through the pipeline, rendered.
    #[test]
    fn renders_the_tree_and_the_attribution() {
        let mut p = drive(&generate(&case("comm_jitter", 5)), &test_spec());
        let info = p.info_mut();
        info.pid = 42;
        info.rank = Some(3);
        info.job_id = Some("llama".into());
        let shim = p.snapshot();
        let mut out = String::new();
        walk(&mut TextSink::new(&mut out), &[shim]);
        assert!(
            out.contains("slo_probe_slo_score{pid=\"42\",rank=\"3\",job_id=\"llama\"} "),
            "{out}"
        );
        assert!(out.contains(
            "slo_probe_slo_value{pid=\"42\",rank=\"3\",job_id=\"llama\",node=\"iteration\",metric=\"iteration_time\",\
             stat=\"p99\",unit=\"ms\"} "
        ));
        assert!(out.contains(
            "slo_probe_slo_threshold{pid=\"42\",rank=\"3\",job_id=\"llama\",node=\"iteration\",source=\"baseline\"}"
        ));
        assert!(
            out.contains("slo_probe_slo_state{pid=\"42\",rank=\"3\",job_id=\"llama\",node=\"iteration\",state=\"critical\"} 1")
                || out.contains(
                    "slo_probe_slo_state{pid=\"42\",rank=\"3\",job_id=\"llama\",node=\"iteration\",state=\"warning\"} 1"
                ),
            "{out}"
        );
        assert!(
            out.contains(
                "op=\"ncclDevKernel_AllReduce_Sum_f32_RING_LL\",dimension=\"communication\"}"
            ),
            "{out}"
        );
        // Every sample line belongs to a declared family.
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            assert!(out.contains(&format!("# TYPE {name} ")), "{line}");
        }
    }
}
