//! GPU state as the agent's NVML sampler reads it: one [`GpuSample`] per device, gathered into a
//! [`GpuSnapshot`] per tick. Pure data (no OS access, no NVML): the sampler in the agent fills it,
//! exporters and the SLO engine read it.
//!
//! Every measured field is an `Option`: `None` means the driver or the device does not report it
//! (an older GPU, a driver without the query, a transient NVML error), never zero. GPM fields
//! ([`GpmMetrics`]) need a Hopper or newer GPU and two samples, so they are `None` on the first
//! tick and on older GPUs.

use std::{collections::VecDeque, fmt};

/// CUDA compute capability of a device (`9.0` for Hopper).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct ComputeCapability {
    /// Major version (architecture generation).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl ComputeCapability {
    /// CUDA cores per streaming multiprocessor on this architecture, from Volta (7.0) on; `None`
    /// for an architecture this table does not know. Values of CUDA's `helper_cuda.h`
    /// (`_ConvertSMVer2Cores`).
    pub fn cuda_cores_per_sm(self) -> Option<u32> {
        match (self.major, self.minor) {
            (7, 0 | 2 | 5) | (8, 0) => Some(64),
            (8, 6 | 7 | 9) | (9, 0) | (10, 0 | 1 | 3) | (11, 0) | (12, 0 | 1) => Some(128),
            _ => None,
        }
    }

    /// Streaming multiprocessors of a device with `cuda_cores` CUDA cores (NVML reports cores,
    /// not SMs); `None` when the architecture is unknown or the count does not divide evenly.
    pub fn sm_count(self, cuda_cores: u32) -> Option<u32> {
        let per_sm = self.cuda_cores_per_sm()?;
        (cuda_cores > 0 && cuda_cores % per_sm == 0).then_some(cuda_cores / per_sm)
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Device-wide performance metrics from NVML GPM (GPU Performance Monitoring, Hopper and newer),
/// averaged between two samples (consecutive ticks). Percentages are 0–100.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpmMetrics {
    /// Length of the interval the metrics average over, ns.
    pub interval_ns: Option<u64>,
    /// Time the graphics/compute engine was active, % (GPM's `GRAPHICS_UTIL`).
    pub graphics_util_percent: Option<f64>,
    /// Time each SM had at least one warp assigned, averaged over SMs, %.
    pub sm_util_percent: Option<f64>,
    /// Resident warps over the theoretical maximum, averaged over SMs, %.
    pub sm_occupancy_percent: Option<f64>,
    /// DRAM bandwidth used, % of peak.
    pub dram_bw_util_percent: Option<f64>,
    /// Time the SMs issued any tensor-core instruction, %.
    pub any_tensor_util_percent: Option<f64>,
    /// Time the SMs issued HMMA (fp16/bf16/tf32 tensor) instructions, %.
    pub hmma_tensor_util_percent: Option<f64>,
    /// Time the SMs issued IMMA (integer tensor) instructions, %.
    pub imma_tensor_util_percent: Option<f64>,
    /// Time the SMs issued DFMA (fp64 tensor) instructions, %.
    pub dfma_tensor_util_percent: Option<f64>,
    /// Time the SMs issued fp16 (non-tensor) instructions, %.
    pub fp16_util_percent: Option<f64>,
    /// Time the SMs issued fp32 instructions, %.
    pub fp32_util_percent: Option<f64>,
    /// Time the SMs issued fp64 (non-tensor) instructions, %.
    pub fp64_util_percent: Option<f64>,
    /// Time the SMs issued integer instructions, %.
    pub integer_util_percent: Option<f64>,
}

impl GpmMetrics {
    /// Whether any metric is present.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One GPU at one tick.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuSample {
    /// NVML device index (the order `nvidia-smi` lists; not necessarily CUDA's order).
    pub index: u32,
    /// Device UUID (`GPU-…`); empty when the driver did not say.
    pub uuid: String,
    /// Product name (`NVIDIA H200`); empty when the driver did not say.
    pub name: String,
    /// PCI bus id (`00000000:18:00.0`); empty when the driver did not say.
    pub pci_bus_id: String,
    /// CUDA compute capability.
    pub compute_capability: Option<ComputeCapability>,
    /// Streaming multiprocessors, where the architecture is known.
    pub sm_count: Option<u32>,
    /// Time one or more kernels ran over the driver's last sample period, %.
    pub gpu_util_percent: Option<f64>,
    /// Time device memory was read or written over the driver's last sample period, %.
    pub memory_util_percent: Option<f64>,
    /// Device memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Device memory in total, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Current memory clock, MHz.
    pub memory_clock_mhz: Option<u32>,
    /// Power draw, W.
    pub power_watts: Option<f64>,
    /// PCIe bytes sent by the device per second, over the last tick.
    pub pcie_tx_bytes_per_sec: Option<f64>,
    /// PCIe bytes received by the device per second, over the last tick.
    pub pcie_rx_bytes_per_sec: Option<f64>,
    /// NVLink bytes sent per second, summed over links, over the last tick.
    pub nvlink_tx_bytes_per_sec: Option<f64>,
    /// NVLink bytes received per second, summed over links, over the last tick.
    pub nvlink_rx_bytes_per_sec: Option<f64>,
    /// GPM metrics (all `None` before Hopper and on the first tick).
    pub gpm: GpmMetrics,
}

/// Every GPU of the node at one tick.
/// Recorded next to GPU recordings as one JSON object per line (`nvml.jsonl`, without the
/// topology).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuSnapshot {
    /// One sample per device, by index.
    pub devices: Vec<GpuSample>,
    /// CLOCK_MONOTONIC ns when the sample was taken.
    pub taken_at_ns: u64,
    /// How the GPUs connect (read once when NVML opened them; shared by every snapshot; not
    /// recorded).
    #[serde(skip)]
    pub topology: std::sync::Arc<Vec<GpuTopology>>,
}

/// The path between two GPUs, as NVML names it (`nvidia-smi topo -m`'s legend), best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GpuPath {
    /// Direct NVLink(s) (`NV#`).
    NvLink,
    /// On the same board (`Internal`, e.g. a dual-GPU card).
    Board,
    /// Through at most one PCIe switch (`PIX`).
    Pix,
    /// Through several PCIe switches, no host bridge (`PXB`).
    Pxb,
    /// Through one PCIe host bridge (`PHB`).
    Phb,
    /// Through host bridges of one NUMA node (`NODE`).
    Node,
    /// Across NUMA nodes (`SYS`).
    Sys,
}

impl GpuPath {
    /// The label value: `nvlink`, `board`, `pix`, `pxb`, `phb`, `node`, `sys`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NvLink => "nvlink",
            Self::Board => "board",
            Self::Pix => "pix",
            Self::Pxb => "pxb",
            Self::Phb => "phb",
            Self::Node => "node",
            Self::Sys => "sys",
        }
    }
}

/// One GPU's place in the node: what the topology-aware strategy places ranks and loader
/// threads by (seed §3.2).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuTopology {
    /// NVML index.
    pub index: u32,
    /// NUMA node of its memory and PCIe root, when the driver says.
    pub numa_node: Option<u32>,
    /// CPUs close to it (NVML's ideal affinity), ascending.
    pub cpu_affinity: Vec<u32>,
    /// PCIe link generation: current, max.
    pub pcie_generation: Option<(u32, u32)>,
    /// PCIe link width in lanes: current, max.
    pub pcie_width: Option<(u32, u32)>,
    /// Active NVLinks.
    pub nvlinks_active: Option<u32>,
    /// Every other GPU: the path to it and the NVLinks between them.
    pub peers: Vec<GpuPeer>,
}

/// The connection from one GPU to another.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuPeer {
    /// The other GPU's NVML index.
    pub index: u32,
    /// The best path between them.
    pub path: GpuPath,
    /// Active NVLinks from this GPU that end at the other.
    pub nvlinks: u32,
    /// Whether peer-to-peer reads work between them (`None`: the driver did not say).
    pub p2p_read: Option<bool>,
}

/// A CPU list as the kernel writes it: `0-15,32-47`.
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// The CPUs set in NVML's affinity mask (64-bit words, CPU 0 in word 0's bit 0).
pub fn cpus_of_mask(words: &[u64]) -> Vec<u32> {
    let mut cpus = Vec::new();
    for (w, word) in words.iter().enumerate() {
        for bit in 0..64 {
            if word & (1 << bit) != 0 {
                cpus.push(w as u32 * 64 + bit);
            }
        }
    }
    cpus
}

/// What NVML saw on one GPU while one iteration ran: each metric is the mean of the samples
/// whose intervals (previous sample, sample] overlap the iteration's GPU span, weighted by the
/// overlap. NVML is coarse next to an iteration: the driver's own utilisation counters cover its
/// last sample period (1/6 s to 1 s) and GPM averages between two of our samples, so an
/// iteration shorter than the sampling period shares its values with its neighbours.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IterationGpu {
    /// NVML device index.
    pub index: u32,
    /// Samples that overlapped it.
    pub samples: u32,
    /// From the start of the first overlapping interval to the end of the last, ns: what the
    /// values average over.
    pub covered_ns: u64,
    /// GPU utilisation, %.
    pub gpu_util_percent: Option<f64>,
    /// SM clock, MHz (a drop is throttling: power, thermal, or an application clock).
    pub sm_clock_mhz: Option<f64>,
    /// Memory clock, MHz.
    pub memory_clock_mhz: Option<f64>,
    /// Power draw, W.
    pub power_watts: Option<f64>,
    /// Device memory in use at the end, bytes.
    pub memory_used_bytes: Option<u64>,
    /// GPM SM occupancy (resident warps over the maximum), %.
    pub sm_occupancy_percent: Option<f64>,
    /// GPM SM activity (an SM had a warp), %.
    pub sm_util_percent: Option<f64>,
    /// GPM DRAM bandwidth, % of peak.
    pub dram_bw_util_percent: Option<f64>,
    /// GPM any tensor-core activity, %.
    pub tensor_util_percent: Option<f64>,
    /// PCIe bytes per second, both directions.
    pub pcie_bytes_per_sec: Option<f64>,
    /// NVLink bytes per second, both directions.
    pub nvlink_bytes_per_sec: Option<f64>,
}

/// Recent NVML snapshots, oldest first, bounded; iterations are aligned against them.
#[derive(Clone, Debug)]
pub struct GpuHistory {
    snapshots: VecDeque<GpuSnapshot>,
    capacity: usize,
}

/// A weighted mean of optional values.
#[derive(Clone, Copy, Default)]
struct Mean {
    sum: f64,
    weight: f64,
}

impl Mean {
    fn add(&mut self, v: Option<f64>, w: f64) {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            self.sum += v * w;
            self.weight += w;
        }
    }

    fn get(self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }
}

fn sum2(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

impl GpuHistory {
    /// Keeps at most `capacity` snapshots (at least 2).
    pub fn new(capacity: usize) -> Self {
        Self {
            snapshots: VecDeque::new(),
            capacity: capacity.max(2),
        }
    }

    /// Adds a snapshot; one not later than the last is ignored (the clock is monotonic).
    pub fn push(&mut self, snap: GpuSnapshot) {
        if self
            .snapshots
            .back()
            .is_some_and(|l| l.taken_at_ns >= snap.taken_at_ns)
        {
            return;
        }
        if self.snapshots.len() == self.capacity {
            self.snapshots.pop_front();
        }
        self.snapshots.push_back(snap);
    }

    /// The newest snapshot.
    pub fn latest(&self) -> Option<&GpuSnapshot> {
        self.snapshots.back()
    }

    /// Snapshots held.
    pub fn len(&self) -> usize {
        self.snapshots.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty()
    }

    /// The NVML index of CUDA device `ordinal`: the only GPU when there is one, else the GPU
    /// with that index (CUDA's order equals NVML's with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and on
    /// nodes of identical GPUs in practice).
    fn nvml_index(&self, ordinal: u32) -> Option<u32> {
        let devs = &self.snapshots.back()?.devices;
        match devs.as_slice() {
            [only] => Some(only.index),
            _ => devs.iter().find(|d| d.index == ordinal).map(|d| d.index),
        }
    }

    /// What NVML saw on CUDA device `ordinal` from `start_ns` to `end_ns`; `None` until a
    /// snapshot at or after `end_ns` exists, and when NVML does not list the device.
    pub fn align(&self, ordinal: u32, start_ns: u64, end_ns: u64) -> Option<IterationGpu> {
        let index = self.nvml_index(ordinal)?;
        if self.latest()?.taken_at_ns < end_ns {
            return None;
        }
        // The first snapshot whose interval reaches `start_ns`, then on to the one covering
        // `end_ns` (the history's oldest snapshot has no known interval: it weighs as an instant).
        let first = self.snapshots.partition_point(|s| s.taken_at_ns < start_ns);
        let mut out = IterationGpu {
            index,
            ..Default::default()
        };
        let mut m = [Mean::default(); 10];
        let mut covered = (u64::MAX, 0u64);
        for i in first..self.snapshots.len() {
            let s = &self.snapshots[i];
            let from = if i == 0 {
                s.taken_at_ns
            } else {
                self.snapshots[i - 1].taken_at_ns
            };
            let Some(d) = s.devices.iter().find(|d| d.index == index) else {
                continue;
            };
            // Overlap of (from, taken_at] with [start, end]; an instant counts as 1 ns.
            let overlap = s.taken_at_ns.min(end_ns).saturating_sub(from.max(start_ns));
            let w = overlap.max(1) as f64;
            covered = (covered.0.min(from), covered.1.max(s.taken_at_ns));
            out.samples += 1;
            m[0].add(d.gpu_util_percent, w);
            m[1].add(d.sm_clock_mhz.map(f64::from), w);
            m[2].add(d.memory_clock_mhz.map(f64::from), w);
            m[3].add(d.power_watts, w);
            m[4].add(d.gpm.sm_occupancy_percent, w);
            m[5].add(d.gpm.sm_util_percent, w);
            m[6].add(d.gpm.dram_bw_util_percent, w);
            m[7].add(d.gpm.any_tensor_util_percent, w);
            m[8].add(sum2(d.pcie_tx_bytes_per_sec, d.pcie_rx_bytes_per_sec), w);
            m[9].add(
                sum2(d.nvlink_tx_bytes_per_sec, d.nvlink_rx_bytes_per_sec),
                w,
            );
            out.memory_used_bytes = d.memory_used_bytes.or(out.memory_used_bytes);
            if s.taken_at_ns >= end_ns {
                break;
            }
        }
        if out.samples == 0 {
            return None;
        }
        out.covered_ns = covered.1.saturating_sub(covered.0);
        out.gpu_util_percent = m[0].get();
        out.sm_clock_mhz = m[1].get();
        out.memory_clock_mhz = m[2].get();
        out.power_watts = m[3].get();
        out.sm_occupancy_percent = m[4].get();
        out.sm_util_percent = m[5].get();
        out.dram_bw_util_percent = m[6].get();
        out.tensor_util_percent = m[7].get();
        out.pcie_bytes_per_sec = m[8].get();
        out.nvlink_bytes_per_sec = m[9].get();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm_count_from_cuda_cores() {
        let hopper = ComputeCapability { major: 9, minor: 0 };
        assert_eq!(hopper.sm_count(16_896), Some(132));
        let ampere = ComputeCapability { major: 8, minor: 0 };
        assert_eq!(ampere.sm_count(6_912), Some(108));
        assert_eq!(ampere.sm_count(6_913), None);
        assert_eq!(ampere.sm_count(0), None);
        assert_eq!(
            ComputeCapability { major: 6, minor: 1 }.sm_count(2_560),
            None
        );
        assert_eq!(hopper.to_string(), "9.0");
    }

    #[test]
    fn empty_gpm() {
        assert!(GpmMetrics::default().is_empty());
        let m = GpmMetrics {
            sm_occupancy_percent: Some(0.0),
            ..Default::default()
        };
        assert!(!m.is_empty());
    }

    const MS: u64 = 1_000_000;

    /// Snapshots every 100 ms from t = 100 ms, GPU 0 at 10, 20, 30 … % utilisation and GPU 1
    /// at ten times its SM clock.
    fn history(n: u64, devices: u32) -> GpuHistory {
        let mut h = GpuHistory::new(64);
        for k in 1..=n {
            h.push(GpuSnapshot {
                taken_at_ns: k * 100 * MS,
                topology: Default::default(),
                devices: (0..devices)
                    .map(|index| GpuSample {
                        index,
                        gpu_util_percent: Some((k * 10) as f64),
                        sm_clock_mhz: Some(1000 * (index + 1) + k as u32),
                        memory_used_bytes: Some(k),
                        gpm: GpmMetrics {
                            sm_occupancy_percent: (k > 1).then_some(k as f64),
                            ..Default::default()
                        },
                        ..Default::default()
                    })
                    .collect(),
            });
        }
        h
    }

    #[test]
    fn an_iteration_inside_one_interval_takes_that_sample() {
        let h = history(5, 1);
        let g = h.align(0, 150 * MS, 160 * MS).expect("covered");
        assert_eq!(g.samples, 1);
        assert_eq!(g.gpu_util_percent, Some(20.0));
        assert_eq!(g.sm_clock_mhz, Some(1002.0));
        assert_eq!(g.sm_occupancy_percent, Some(2.0));
        assert_eq!(g.memory_used_bytes, Some(2));
        assert_eq!(g.covered_ns, 100 * MS);
        assert_eq!(g.power_watts, None);
        // Ending exactly on a sample: that sample covers it.
        let g = h.align(0, 110 * MS, 200 * MS).expect("covered");
        assert_eq!((g.samples, g.gpu_util_percent), (1, Some(20.0)));
    }

    #[test]
    fn an_iteration_across_intervals_weighs_them_by_overlap() {
        let h = history(5, 1);
        // 50 ms in (100, 200] at 20 %, 100 ms in (200, 300] at 30 %, 10 ms in (300, 400] at 40 %.
        let g = h.align(0, 150 * MS, 310 * MS).expect("covered");
        assert_eq!(g.samples, 3);
        let want = (50.0 * 20.0 + 100.0 * 30.0 + 10.0 * 40.0) / 160.0;
        assert!((g.gpu_util_percent.unwrap() - want).abs() < 1e-9, "{g:?}");
        assert_eq!(g.memory_used_bytes, Some(4), "the last sample's memory");
        assert_eq!(g.covered_ns, 300 * MS);
    }

    #[test]
    fn not_aligned_before_a_later_sample_exists() {
        let h = history(5, 1);
        assert!(h.align(0, 480 * MS, 501 * MS).is_none());
        assert!(h.align(0, 480 * MS, 500 * MS).is_some());
        assert!(GpuHistory::new(4).align(0, 0, 1).is_none());
    }

    #[test]
    fn devices_map_by_index_unless_there_is_one() {
        let one = history(3, 1);
        // A single GPU takes every ordinal (CUDA_VISIBLE_DEVICES renumbers from 0).
        assert_eq!(one.align(3, 150 * MS, 160 * MS).map(|g| g.index), Some(0));
        let two = history(3, 2);
        let g = two.align(1, 150 * MS, 160 * MS).expect("gpu 1");
        assert_eq!((g.index, g.sm_clock_mhz), (1, Some(2002.0)));
        assert!(two.align(2, 150 * MS, 160 * MS).is_none());
    }

    #[test]
    fn cpu_lists_and_masks() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[]), "");
        assert_eq!(cpus_of_mask(&[0xffff]), (0..16).collect::<Vec<_>>());
        assert_eq!(cpus_of_mask(&[1, 1]), vec![0, 64]);
        assert!(GpuPath::NvLink < GpuPath::Sys);
    }

    #[test]
    fn the_history_is_bounded_and_monotonic() {
        let mut h = history(3, 1);
        let before = h.len();
        h.push(GpuSnapshot {
            taken_at_ns: 250 * MS,
            devices: Vec::new(),
            ..GpuSnapshot::default()
        });
        assert_eq!(h.len(), before, "an older snapshot is ignored");
        let mut small = GpuHistory::new(2);
        for k in 1..=5 {
            small.push(GpuSnapshot {
                taken_at_ns: k,
                devices: Vec::new(),
                ..GpuSnapshot::default()
            });
        }
        assert_eq!(small.len(), 2);
        assert_eq!(small.latest().map(|s| s.taken_at_ns), Some(5));
        // Older than the history: only the part it still covers.
        let h = history(5, 1);
        let g = h.align(0, 0, 150 * MS).expect("partly covered");
        assert_eq!(g.samples, 2);
    }
}
