//! Prometheus text exposition of the GPU metrics ([`GpuSnapshot`], from the NVML sampler).
//!
//! Every family is a gauge with the labels `gpu` (NVML index), `uuid` and `name`;
//! `slo_probe_gpu_info` adds `pci_bus_id` and `compute_capability`. Percentages become ratios
//! (0–1), clocks hertz. A value the device did not report is omitted (no series), and a family
//! no device reports is omitted whole. Cardinality: one series per GPU per family (seven for
//! `slo_probe_gpu_pipe_utilization_ratio`).

use std::fmt::Write as _;

use slo_probe_core::gpu::{GpuSample, GpuSnapshot};

use super::{escape, header};

/// How a series reads its value from a sample.
type Value = fn(&GpuSample) -> Option<f64>;

/// A gauge family: name, help, and its series per GPU: extra labels (`pipe="fp16"`, or empty)
/// and value.
struct Family {
    name: &'static str,
    help: &'static str,
    series: &'static [(&'static str, Value)],
}

fn ratio(percent: Option<f64>) -> Option<f64> {
    percent.map(|p| p / 100.0)
}

fn hertz(mhz: Option<u32>) -> Option<f64> {
    mhz.map(|m| f64::from(m) * 1e6)
}

const FAMILIES: &[Family] = &[
    Family {
        name: "slo_probe_gpu_streaming_multiprocessors",
        help: "Streaming multiprocessors (SMs) of the GPU.",
        series: &[("", |s| s.sm_count.map(f64::from))],
    },
    Family {
        name: "slo_probe_gpu_utilization_ratio",
        help: "Fraction of the driver's last sample period (1/6 s to 1 s) during which one or \
               more kernels ran on the GPU (NVML utilization.gpu).",
        series: &[("", |s| ratio(s.gpu_util_percent))],
    },
    Family {
        name: "slo_probe_gpu_memory_utilization_ratio",
        help: "Fraction of the driver's last sample period during which device memory was read \
               or written (NVML utilization.memory; not capacity, not bandwidth).",
        series: &[("", |s| ratio(s.memory_util_percent))],
    },
    Family {
        name: "slo_probe_gpu_memory_used_bytes",
        help: "Device memory in use.",
        series: &[("", |s| s.memory_used_bytes.map(|b| b as f64))],
    },
    Family {
        name: "slo_probe_gpu_memory_total_bytes",
        help: "Device memory in total.",
        series: &[("", |s| s.memory_total_bytes.map(|b| b as f64))],
    },
    Family {
        name: "slo_probe_gpu_sm_clock_hertz",
        help: "Current SM clock.",
        series: &[("", |s| hertz(s.sm_clock_mhz))],
    },
    Family {
        name: "slo_probe_gpu_memory_clock_hertz",
        help: "Current memory clock.",
        series: &[("", |s| hertz(s.memory_clock_mhz))],
    },
    Family {
        name: "slo_probe_gpu_power_watts",
        help: "Power draw of the GPU.",
        series: &[("", |s| s.power_watts)],
    },
    Family {
        name: "slo_probe_gpu_pcie_transmit_bytes_per_second",
        help: "PCIe bytes sent by the GPU per second, over the last tick.",
        series: &[("", |s| s.pcie_tx_bytes_per_sec)],
    },
    Family {
        name: "slo_probe_gpu_pcie_receive_bytes_per_second",
        help: "PCIe bytes received by the GPU per second, over the last tick.",
        series: &[("", |s| s.pcie_rx_bytes_per_sec)],
    },
    Family {
        name: "slo_probe_gpu_nvlink_transmit_bytes_per_second",
        help: "NVLink bytes sent by the GPU per second, summed over its links, over the last \
               tick (GPM, Hopper and newer).",
        series: &[("", |s| s.nvlink_tx_bytes_per_sec)],
    },
    Family {
        name: "slo_probe_gpu_nvlink_receive_bytes_per_second",
        help: "NVLink bytes received by the GPU per second, summed over its links, over the \
               last tick (GPM, Hopper and newer).",
        series: &[("", |s| s.nvlink_rx_bytes_per_sec)],
    },
    Family {
        name: "slo_probe_gpu_graphics_engine_active_ratio",
        help: "Fraction of the last tick during which the graphics/compute engine was active \
               (GPM, Hopper and newer).",
        series: &[("", |s| ratio(s.gpm.graphics_util_percent))],
    },
    Family {
        name: "slo_probe_gpu_sm_utilization_ratio",
        help: "Fraction of the last tick during which each SM had at least one warp assigned, \
               averaged over SMs (GPM, Hopper and newer).",
        series: &[("", |s| ratio(s.gpm.sm_util_percent))],
    },
    Family {
        name: "slo_probe_gpu_sm_occupancy_ratio",
        help: "Resident warps over the theoretical maximum, averaged over SMs and the last tick \
               (GPM, Hopper and newer).",
        series: &[("", |s| ratio(s.gpm.sm_occupancy_percent))],
    },
    Family {
        name: "slo_probe_gpu_dram_bandwidth_utilization_ratio",
        help: "DRAM bandwidth used over the last tick, as a fraction of peak (GPM, Hopper and \
               newer).",
        series: &[("", |s| ratio(s.gpm.dram_bw_util_percent))],
    },
    Family {
        name: "slo_probe_gpu_tensor_utilization_ratio",
        help: "Fraction of the last tick during which the SMs issued any tensor-core \
               instruction (GPM, Hopper and newer).",
        series: &[("", |s| ratio(s.gpm.any_tensor_util_percent))],
    },
    Family {
        name: "slo_probe_gpu_pipe_utilization_ratio",
        help: "Fraction of the last tick during which the SMs issued instructions to a pipe: \
               tensor_hmma (fp16/bf16/tf32 tensor), tensor_imma (integer tensor), tensor_dfma \
               (fp64 tensor), fp16, fp32, fp64, integer (GPM, Hopper and newer; pipes overlap, \
               do not sum them).",
        series: &[
            ("pipe=\"tensor_hmma\"", |s| {
                ratio(s.gpm.hmma_tensor_util_percent)
            }),
            ("pipe=\"tensor_imma\"", |s| {
                ratio(s.gpm.imma_tensor_util_percent)
            }),
            ("pipe=\"tensor_dfma\"", |s| {
                ratio(s.gpm.dfma_tensor_util_percent)
            }),
            ("pipe=\"fp16\"", |s| ratio(s.gpm.fp16_util_percent)),
            ("pipe=\"fp32\"", |s| ratio(s.gpm.fp32_util_percent)),
            ("pipe=\"fp64\"", |s| ratio(s.gpm.fp64_util_percent)),
            ("pipe=\"integer\"", |s| ratio(s.gpm.integer_util_percent)),
        ],
    },
];

/// `gpu="0",uuid="…",name="…"`.
fn labels(s: &GpuSample) -> String {
    format!(
        "gpu=\"{}\",uuid=\"{}\",name=\"{}\"",
        s.index,
        escape(&s.uuid),
        escape(&s.name)
    )
}

/// The topology families: NUMA node and CPU affinity, PCIe link, NVLinks, the path to every
/// other GPU.
fn render_topology(out: &mut String, gpus: &GpuSnapshot) {
    let topo = &gpus.topology;
    if topo.is_empty() {
        return;
    }
    let label_of = |index: u32| {
        gpus.devices
            .iter()
            .find(|d| d.index == index)
            .map(labels)
            .unwrap_or_else(|| format!("gpu=\"{index}\",uuid=\"\",name=\"\""))
    };
    let uuid_of = |index: u32| {
        gpus.devices
            .iter()
            .find(|d| d.index == index)
            .map(|d| escape(&d.uuid))
            .unwrap_or_default()
    };
    header(
        out,
        "slo_probe_gpu_numa_node",
        "gauge",
        "NUMA node of the GPU (its memory and PCIe root), as NVML reports it.",
    );
    for t in topo.iter() {
        if let Some(n) = t.numa_node {
            let _ = writeln!(out, "slo_probe_gpu_numa_node{{{}}} {n}", label_of(t.index));
        }
    }
    header(
        out,
        "slo_probe_gpu_cpu_affinity_info",
        "gauge",
        "The CPUs close to the GPU (NVML's ideal affinity) as a kernel CPU list; always 1.",
    );
    header(
        out,
        "slo_probe_gpu_cpu_affinity_cpus",
        "gauge",
        "Number of CPUs close to the GPU.",
    );
    for t in topo.iter().filter(|t| !t.cpu_affinity.is_empty()) {
        let l = label_of(t.index);
        let _ = writeln!(
            out,
            "slo_probe_gpu_cpu_affinity_info{{{l},cpus=\"{}\"}} 1",
            slo_probe_core::gpu::cpu_list(&t.cpu_affinity)
        );
        let _ = writeln!(
            out,
            "slo_probe_gpu_cpu_affinity_cpus{{{l}}} {}",
            t.cpu_affinity.len()
        );
    }
    type Link = fn(&slo_probe_core::gpu::GpuTopology) -> Option<(u32, u32)>;
    let links: [(&str, &str, Link); 2] = [
        (
            "slo_probe_gpu_pcie_link_generation",
            "PCIe link generation, current (it drops when idle) and max.",
            |t| t.pcie_generation,
        ),
        (
            "slo_probe_gpu_pcie_link_width_lanes",
            "PCIe link width in lanes, current and max.",
            |t| t.pcie_width,
        ),
    ];
    for (name, help, value) in links {
        header(out, name, "gauge", help);
        for t in topo.iter() {
            if let Some((cur, max)) = value(t) {
                let l = label_of(t.index);
                let _ = writeln!(out, "{name}{{{l},which=\"current\"}} {cur}");
                let _ = writeln!(out, "{name}{{{l},which=\"max\"}} {max}");
            }
        }
    }
    header(
        out,
        "slo_probe_gpu_nvlink_active_links",
        "gauge",
        "NVLinks of the GPU that are up.",
    );
    for t in topo.iter() {
        if let Some(n) = t.nvlinks_active {
            let _ = writeln!(
                out,
                "slo_probe_gpu_nvlink_active_links{{{}}} {n}",
                label_of(t.index)
            );
        }
    }
    header(
        out,
        "slo_probe_gpu_peer_path",
        "gauge",
        "The best path from the GPU to another (nvlink, board, pix, pxb, phb, node, sys: \
         nvidia-smi topo's legend), with the NVLinks between them and whether peer-to-peer reads \
         work; always 1.",
    );
    for t in topo.iter() {
        let l = label_of(t.index);
        for p in &t.peers {
            let p2p = match p.p2p_read {
                Some(true) => "yes",
                Some(false) => "no",
                None => "unknown",
            };
            let _ = writeln!(
                out,
                "slo_probe_gpu_peer_path{{{l},peer_gpu=\"{}\",peer_uuid=\"{}\",path=\"{}\",\
                 nvlinks=\"{}\",p2p_read=\"{p2p}\"}} 1",
                p.index,
                uuid_of(p.index),
                p.path.as_str(),
                p.nvlinks
            );
        }
    }
}

/// Appends the GPU families to `out` in the text exposition format (format 0.0.4).
pub fn render_gpus(out: &mut String, gpus: &GpuSnapshot) {
    if gpus.devices.is_empty() {
        return;
    }
    let labels: Vec<String> = gpus.devices.iter().map(labels).collect();
    header(
        out,
        "slo_probe_gpu_info",
        "gauge",
        "GPUs NVML reports; always 1.",
    );
    for (s, l) in gpus.devices.iter().zip(&labels) {
        let cc = s
            .compute_capability
            .map(|c| c.to_string())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "slo_probe_gpu_info{{{l},pci_bus_id=\"{}\",compute_capability=\"{cc}\"}} 1",
            escape(&s.pci_bus_id)
        );
    }
    for f in FAMILIES {
        let reported = gpus
            .devices
            .iter()
            .any(|s| f.series.iter().any(|(_, v)| v(s).is_some()));
        if !reported {
            continue;
        }
        header(out, f.name, "gauge", f.help);
        for (s, l) in gpus.devices.iter().zip(&labels) {
            for (extra, value) in f.series {
                let Some(v) = value(s) else { continue };
                let sep = if extra.is_empty() { "" } else { "," };
                let _ = writeln!(out, "{}{{{l}{sep}{extra}}} {v}", f.name);
            }
        }
    }
    render_topology(out, gpus);
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_core::gpu::{ComputeCapability, GpmMetrics};

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
                f.name.starts_with("slo_probe_gpu_") && !f.name.contains("percent"),
                "{}",
                f.name
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
