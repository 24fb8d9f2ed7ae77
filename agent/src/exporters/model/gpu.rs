//! The GPU families ([`GpuSnapshot`], from the NVML sampler).
//!
//! Every family is a gauge with the labels `gpu` (NVML index), `uuid` and `name`;
//! `slo_probe_gpu_info` adds `pci_bus_id` and `compute_capability`. Percentages become ratios
//! (0–1), clocks hertz. A value the device did not report is omitted (no series), and a family
//! no device reports is omitted whole. Cardinality: one series per GPU per family (seven for
//! `slo_probe_gpu_pipe_utilization_ratio`).

use slo_probe_core::gpu::{cpu_list, GpuSample, GpuSnapshot, GpuTopology};

use super::{Family, Kind, Label, Sink};

/// How a series reads its value from a sample.
type Value = fn(&GpuSample) -> Option<f64>;

/// A gauge family and its series per GPU: an extra label (`pipe="fp16"`) or none, and the
/// value.
pub struct GpuFamily {
    /// The family.
    pub family: Family,
    /// Its series per GPU.
    pub series: &'static [(Option<Label<'static>>, Value)],
}

fn ratio(percent: Option<f64>) -> Option<f64> {
    percent.map(|p| p / 100.0)
}

fn hertz(mhz: Option<u32>) -> Option<f64> {
    mhz.map(|m| f64::from(m) * 1e6)
}

/// The per-sample families, in exposition order.
pub static FAMILIES: &[GpuFamily] = &[
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_streaming_multiprocessors",
            kind: Kind::Gauge,
            help: "Streaming multiprocessors (SMs) of the GPU.",
            unit: "",
        },
        series: &[(None, |s| s.sm_count.map(f64::from))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_utilization_ratio",
            kind: Kind::Gauge,
            help: "Fraction of the driver's last sample period (1/6 s to 1 s) during which one or \
                   more kernels ran on the GPU (NVML utilization.gpu).",
            unit: "1",
        },
        series: &[(None, |s| ratio(s.gpu_util_percent))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_memory_utilization_ratio",
            kind: Kind::Gauge,
            help:
                "Fraction of the driver's last sample period during which device memory was read \
                   or written (NVML utilization.memory; not capacity, not bandwidth).",
            unit: "1",
        },
        series: &[(None, |s| ratio(s.memory_util_percent))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_memory_used_bytes",
            kind: Kind::Gauge,
            help: "Device memory in use.",
            unit: "By",
        },
        series: &[(None, |s| s.memory_used_bytes.map(|b| b as f64))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_memory_total_bytes",
            kind: Kind::Gauge,
            help: "Device memory in total.",
            unit: "By",
        },
        series: &[(None, |s| s.memory_total_bytes.map(|b| b as f64))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_sm_clock_hertz",
            kind: Kind::Gauge,
            help: "Current SM clock.",
            unit: "Hz",
        },
        series: &[(None, |s| hertz(s.sm_clock_mhz))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_memory_clock_hertz",
            kind: Kind::Gauge,
            help: "Current memory clock.",
            unit: "Hz",
        },
        series: &[(None, |s| hertz(s.memory_clock_mhz))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_power_watts",
            kind: Kind::Gauge,
            help: "Power draw of the GPU.",
            unit: "W",
        },
        series: &[(None, |s| s.power_watts)],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_pcie_transmit_bytes_per_second",
            kind: Kind::Gauge,
            help: "PCIe bytes sent by the GPU per second, over the last tick.",
            unit: "By/s",
        },
        series: &[(None, |s| s.pcie_tx_bytes_per_sec)],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_pcie_receive_bytes_per_second",
            kind: Kind::Gauge,
            help: "PCIe bytes received by the GPU per second, over the last tick.",
            unit: "By/s",
        },
        series: &[(None, |s| s.pcie_rx_bytes_per_sec)],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_nvlink_transmit_bytes_per_second",
            kind: Kind::Gauge,
            help: "NVLink bytes sent by the GPU per second, summed over its links, over the last \
                   tick (GPM, Hopper and newer).",
            unit: "By/s",
        },
        series: &[(None, |s| s.nvlink_tx_bytes_per_sec)],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_nvlink_receive_bytes_per_second",
            kind: Kind::Gauge,
            help: "NVLink bytes received by the GPU per second, summed over its links, over the \
                   last tick (GPM, Hopper and newer).",
            unit: "By/s",
        },
        series: &[(None, |s| s.nvlink_rx_bytes_per_sec)],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_graphics_engine_active_ratio",
            kind: Kind::Gauge,
            help: "Fraction of the last tick during which the graphics/compute engine was active \
                   (GPM, Hopper and newer).",
            unit: "1",
        },
        series: &[(None, |s| ratio(s.gpm.graphics_util_percent))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_sm_utilization_ratio",
            kind: Kind::Gauge,
            help: "Fraction of the last tick during which each SM had at least one warp assigned, \
                   averaged over SMs (GPM, Hopper and newer).",
            unit: "1",
        },
        series: &[(None, |s| ratio(s.gpm.sm_util_percent))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_sm_occupancy_ratio",
            kind: Kind::Gauge,
            help:
                "Resident warps over the theoretical maximum, averaged over SMs and the last tick \
                   (GPM, Hopper and newer).",
            unit: "1",
        },
        series: &[(None, |s| ratio(s.gpm.sm_occupancy_percent))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_dram_bandwidth_utilization_ratio",
            kind: Kind::Gauge,
            help: "DRAM bandwidth used over the last tick, as a fraction of peak (GPM, Hopper and \
                   newer).",
            unit: "1",
        },
        series: &[(None, |s| ratio(s.gpm.dram_bw_util_percent))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_tensor_utilization_ratio",
            kind: Kind::Gauge,
            help: "Fraction of the last tick during which the SMs issued any tensor-core \
                   instruction (GPM, Hopper and newer).",
            unit: "1",
        },
        series: &[(None, |s| ratio(s.gpm.any_tensor_util_percent))],
    },
    GpuFamily {
        family: Family {
            name: "slo_probe_gpu_pipe_utilization_ratio",
            kind: Kind::Gauge,
            help: "Fraction of the last tick during which the SMs issued instructions to a pipe: \
                   tensor_hmma (fp16/bf16/tf32 tensor), tensor_imma (integer tensor), tensor_dfma \
                   (fp64 tensor), fp16, fp32, fp64, integer (GPM, Hopper and newer; pipes overlap, \
                   do not sum them).",
            unit: "1",
        },
        series: &[
            (Some(("pipe", "tensor_hmma")), |s| {
                ratio(s.gpm.hmma_tensor_util_percent)
            }),
            (Some(("pipe", "tensor_imma")), |s| {
                ratio(s.gpm.imma_tensor_util_percent)
            }),
            (Some(("pipe", "tensor_dfma")), |s| {
                ratio(s.gpm.dfma_tensor_util_percent)
            }),
            (Some(("pipe", "fp16")), |s| ratio(s.gpm.fp16_util_percent)),
            (Some(("pipe", "fp32")), |s| ratio(s.gpm.fp32_util_percent)),
            (Some(("pipe", "fp64")), |s| ratio(s.gpm.fp64_util_percent)),
            (Some(("pipe", "integer")), |s| {
                ratio(s.gpm.integer_util_percent)
            }),
        ],
    },
];

static INFO: Family = Family {
    name: "slo_probe_gpu_info",
    kind: Kind::Gauge,
    help: "GPUs NVML reports; always 1.",
    unit: "",
};
static NUMA_NODE: Family = Family {
    name: "slo_probe_gpu_numa_node",
    kind: Kind::Gauge,
    help: "NUMA node of the GPU (its memory and PCIe root), as NVML reports it.",
    unit: "",
};
static CPU_AFFINITY_INFO: Family = Family {
    name: "slo_probe_gpu_cpu_affinity_info",
    kind: Kind::Gauge,
    help: "The CPUs close to the GPU (NVML's ideal affinity) as a kernel CPU list; always 1.",
    unit: "",
};
static CPU_AFFINITY_CPUS: Family = Family {
    name: "slo_probe_gpu_cpu_affinity_cpus",
    kind: Kind::Gauge,
    help: "Number of CPUs close to the GPU.",
    unit: "",
};
/// A PCIe link family and how to read (current, max) from a topology entry.
type Link = (Family, fn(&GpuTopology) -> Option<(u32, u32)>);

/// The PCIe link families.
static LINKS: [Link; 2] = [
    (
        Family {
            name: "slo_probe_gpu_pcie_link_generation",
            kind: Kind::Gauge,
            help: "PCIe link generation, current (it drops when idle) and max.",
            unit: "",
        },
        |t| t.pcie_generation,
    ),
    (
        Family {
            name: "slo_probe_gpu_pcie_link_width_lanes",
            kind: Kind::Gauge,
            help: "PCIe link width in lanes, current and max.",
            unit: "",
        },
        |t| t.pcie_width,
    ),
];
static NVLINK_ACTIVE: Family = Family {
    name: "slo_probe_gpu_nvlink_active_links",
    kind: Kind::Gauge,
    help: "NVLinks of the GPU that are up.",
    unit: "",
};
static PEER_PATH: Family = Family {
    name: "slo_probe_gpu_peer_path",
    kind: Kind::Gauge,
    help: "The best path from the GPU to another (nvlink, board, pix, pxb, phb, node, sys: \
           nvidia-smi topo's legend), with the NVLinks between them and whether peer-to-peer \
           reads work; always 1.",
    unit: "",
};

/// A GPU's `gpu`, `uuid` and `name` labels.
struct GpuLabels<'a> {
    index: String,
    uuid: &'a str,
    name: &'a str,
}

impl<'a> GpuLabels<'a> {
    fn of(s: &'a GpuSample) -> Self {
        Self {
            index: s.index.to_string(),
            uuid: &s.uuid,
            name: &s.name,
        }
    }

    /// A GPU the topology names but no sample has.
    fn unknown(index: u32) -> Self {
        Self {
            index: index.to_string(),
            uuid: "",
            name: "",
        }
    }

    fn get(&self) -> [Label<'_>; 3] {
        [
            ("gpu", &self.index),
            ("uuid", self.uuid),
            ("name", self.name),
        ]
    }
}

/// The topology families: NUMA node and CPU affinity, PCIe link, NVLinks, the path to every
/// other GPU.
fn topology(sink: &mut impl Sink, gpus: &GpuSnapshot) {
    let topo = &gpus.topology;
    if topo.is_empty() {
        return;
    }
    let sample_of = |index: u32| gpus.devices.iter().find(|d| d.index == index);
    let labels: Vec<GpuLabels<'_>> = topo
        .iter()
        .map(|t| sample_of(t.index).map_or_else(|| GpuLabels::unknown(t.index), GpuLabels::of))
        .collect();
    let entries = || topo.iter().zip(&labels);
    sink.family(&NUMA_NODE);
    for (t, l) in entries() {
        if let Some(n) = t.numa_node {
            sink.sample(&NUMA_NODE, &l.get(), f64::from(n));
        }
    }
    // Declared together, sampled per GPU.
    sink.family(&CPU_AFFINITY_INFO);
    sink.family(&CPU_AFFINITY_CPUS);
    for (t, l) in entries().filter(|(t, _)| !t.cpu_affinity.is_empty()) {
        let [gpu, uuid, name] = l.get();
        sink.sample(
            &CPU_AFFINITY_INFO,
            &[gpu, uuid, name, ("cpus", &cpu_list(&t.cpu_affinity))],
            1.0,
        );
        sink.sample(&CPU_AFFINITY_CPUS, &l.get(), t.cpu_affinity.len() as f64);
    }
    for (family, value) in &LINKS {
        sink.family(family);
        for (t, l) in entries() {
            if let Some((cur, max)) = value(t) {
                let [gpu, uuid, name] = l.get();
                sink.sample(
                    family,
                    &[gpu, uuid, name, ("which", "current")],
                    f64::from(cur),
                );
                sink.sample(family, &[gpu, uuid, name, ("which", "max")], f64::from(max));
            }
        }
    }
    sink.family(&NVLINK_ACTIVE);
    for (t, l) in entries() {
        if let Some(n) = t.nvlinks_active {
            sink.sample(&NVLINK_ACTIVE, &l.get(), f64::from(n));
        }
    }
    sink.family(&PEER_PATH);
    for (t, l) in entries() {
        let [gpu, uuid, name] = l.get();
        for p in &t.peers {
            let p2p = match p.p2p_read {
                Some(true) => "yes",
                Some(false) => "no",
                None => "unknown",
            };
            sink.sample(
                &PEER_PATH,
                &[
                    gpu,
                    uuid,
                    name,
                    ("peer_gpu", &p.index.to_string()),
                    (
                        "peer_uuid",
                        sample_of(p.index).map_or("", |d| d.uuid.as_str()),
                    ),
                    ("path", p.path.as_str()),
                    ("nvlinks", &p.nvlinks.to_string()),
                    ("p2p_read", p2p),
                ],
                1.0,
            );
        }
    }
}

/// The GPU families of `gpus` (none without a device).
pub fn walk(sink: &mut impl Sink, gpus: &GpuSnapshot) {
    if gpus.devices.is_empty() {
        return;
    }
    let labels: Vec<GpuLabels<'_>> = gpus.devices.iter().map(GpuLabels::of).collect();
    sink.family(&INFO);
    for (s, l) in gpus.devices.iter().zip(&labels) {
        let cc = s
            .compute_capability
            .map(|c| c.to_string())
            .unwrap_or_default();
        let [gpu, uuid, name] = l.get();
        sink.sample(
            &INFO,
            &[
                gpu,
                uuid,
                name,
                ("pci_bus_id", &s.pci_bus_id),
                ("compute_capability", &cc),
            ],
            1.0,
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
        sink.family(&f.family);
        for (s, l) in gpus.devices.iter().zip(&labels) {
            let [gpu, uuid, name] = l.get();
            for (extra, value) in f.series {
                let Some(v) = value(s) else { continue };
                match extra {
                    Some(e) => sink.sample(&f.family, &[gpu, uuid, name, *e], v),
                    None => sink.sample(&f.family, &[gpu, uuid, name], v),
                }
            }
        }
    }
    topology(sink, gpus);
}
