//! GPU state as the agent's NVML sampler reads it: one [`GpuSample`] per device, gathered into a
//! [`GpuSnapshot`] per tick. Pure data (no OS access, no NVML): the sampler in the agent fills it,
//! exporters and the SLO engine read it.
//!
//! Every measured field is an `Option`: `None` means the driver or the device does not report it
//! (an older GPU, a driver without the query, a transient NVML error), never zero. GPM fields
//! ([`GpmMetrics`]) need a Hopper or newer GPU and two samples, so they are `None` on the first
//! tick and on older GPUs.

use std::fmt;

/// CUDA compute capability of a device (`9.0` for Hopper).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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
#[derive(Clone, Debug, Default, PartialEq)]
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
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSnapshot {
    /// One sample per device, by index.
    pub devices: Vec<GpuSample>,
    /// CLOCK_MONOTONIC ns when the sample was taken.
    pub taken_at_ns: u64,
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
}
