//! GPU metrics from NVML, and from NVML GPM (GPU Performance Monitoring) on Hopper and newer:
//! one [`GpuSnapshot`] per tick.
//!
//! Needs: an NVIDIA driver (`libnvidia-ml.so.1`, opened at run time, so the agent builds and runs
//! without one: [`NvmlSampler::new`] then fails with [`NvmlError::LibraryMissing`] and the agent
//! goes on without GPU metrics). Utilisation, memory, clocks and power: any driver and GPU NVML
//! supports. GPM (SM occupancy and utilisation, DRAM bandwidth, tensor and pipe utilisation,
//! PCIe and NVLink bandwidth): a Hopper (sm_90) or newer GPU and a driver with the GPM API
//! (R525 on). Before Hopper, PCIe bandwidth comes from the driver's PCIe byte counters where it
//! has them, and NVLink bandwidth is not reported. MIG instances are not sampled separately:
//! every figure is for the whole GPU.
//!
//! Every query that fails degrades to `None` for that field of that device: it is logged once
//! (debug when the device does not support it, warn otherwise), and a query the device does not
//! support is not asked again.
//!
//! `nvmlDeviceGetPcieThroughput` is not used: it samples for 20 ms per call, which would hold
//! the tick 40 ms per GPU.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock,
    },
    thread,
    time::Duration,
};

use nvml_wrapper::{
    enum_wrappers::device::Clock,
    enums::{device::SampleValue, gpm::GpmMetricId},
    error::NvmlError as WrapperError,
    gpm::gpm_metrics_get,
    struct_wrappers::gpm::GpmMetricResult,
    structs::device::FieldId,
    sys_exports::field_id::{NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES},
    Device, GpmSample, Nvml,
};
use slo_probe_core::gpu::{
    cpus_of_mask, ComputeCapability, GpmMetrics, GpuHistory, GpuPath, GpuPeer, GpuSample,
    GpuSnapshot, GpuTopology,
};

/// Shortest interval between two GPM samples that NVML computes metrics over.
pub const GPM_MIN_INTERVAL_NS: u64 = 100_000_000;

/// The GPM metrics asked for on every tick (one NVML call for all of them).
const GPM_METRICS: [GpmMetricId; 16] = [
    GpmMetricId::GraphicsUtil,
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::DramBwUtil,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::HmmaTensorUtil,
    GpmMetricId::ImmaTensorUtil,
    GpmMetricId::DfmaTensorUtil,
    GpmMetricId::Fp16Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp64Util,
    GpmMetricId::IntegerUtil,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::PcieRxPerSec,
    GpmMetricId::NvlinkTotalTxPerSec,
    GpmMetricId::NvlinkTotalRxPerSec,
];

/// The one NVML handle of the process: NVML is process-global state (its init is reference
/// counted), and GPM samples borrow the handle, so it lives as long as the process.
static NVML: OnceLock<Nvml> = OnceLock::new();

/// Errors starting the NVML sampler; each means the agent runs without GPU metrics.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// `libnvidia-ml.so.1` could not be opened (or lacks `nvmlInit_v2`).
    #[error(
        "no NVIDIA driver found (libnvidia-ml.so.1 not loadable): GPU metrics are off; install \
         the NVIDIA driver, or expose it to the container (NVIDIA container toolkit)"
    )]
    LibraryMissing {
        /// What NVML's loader said.
        #[source]
        source: WrapperError,
    },
    /// The library is there but the kernel driver is not loaded.
    #[error(
        "the NVIDIA kernel driver is not loaded: GPU metrics are off; check that `nvidia-smi` \
         works on this node"
    )]
    DriverNotLoaded {
        /// NVML's error.
        #[source]
        source: WrapperError,
    },
    /// The agent may not open the driver's device files.
    #[error(
        "no permission to talk to the NVIDIA driver: GPU metrics are off; give the agent access \
         to /dev/nvidiactl and /dev/nvidia*"
    )]
    NoPermission {
        /// NVML's error.
        #[source]
        source: WrapperError,
    },
    /// Any other failure of `nvmlInit`.
    #[error("cannot initialise NVML: GPU metrics are off; check that `nvidia-smi` works")]
    Init {
        /// NVML's error.
        #[source]
        source: WrapperError,
    },
    /// The GPUs could not be counted.
    #[error("cannot list the NVIDIA GPUs: GPU metrics are off; check `nvidia-smi -L`")]
    Devices {
        /// NVML's error.
        #[source]
        source: WrapperError,
    },
    /// The driver reports no GPU the agent can open.
    #[error(
        "the NVIDIA driver reports no GPU the agent can open: GPU metrics are off; check \
         `nvidia-smi -L` and the agent's access to /dev/nvidia*"
    )]
    NoDevices,
}

impl NvmlError {
    /// Classifies a failure of `nvmlInit`.
    fn from_init(source: WrapperError) -> Self {
        match source {
            WrapperError::LibloadingError(_)
            | WrapperError::FailedToLoadSymbol(_)
            | WrapperError::LibraryNotFound => Self::LibraryMissing { source },
            WrapperError::DriverNotLoaded => Self::DriverNotLoaded { source },
            WrapperError::NoPermission => Self::NoPermission { source },
            source => Self::Init { source },
        }
    }
}

/// The process's NVML handle, initialised on first use.
fn nvml() -> Result<&'static Nvml, NvmlError> {
    if let Some(nvml) = NVML.get() {
        return Ok(nvml);
    }
    let nvml = Nvml::init().map_err(NvmlError::from_init)?;
    // Another thread may have won the race: then this handle is dropped (nvmlShutdown once,
    // which NVML's reference count allows).
    Ok(NVML.get_or_init(|| nvml))
}

/// The queries of one device, for logging each failure once and not asking again what the
/// device does not support.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Query {
    Uuid,
    Name,
    PciInfo,
    ComputeCapability,
    Cores,
    Utilization,
    Memory,
    SmClock,
    MemoryClock,
    Power,
    PcieCounters,
    GpmSample,
    GpmMetrics,
}

impl Query {
    fn bit(self) -> u32 {
        1 << self as u32
    }

    fn what(self) -> &'static str {
        match self {
            Self::Uuid => "UUID",
            Self::Name => "name",
            Self::PciInfo => "PCI bus id",
            Self::ComputeCapability => "compute capability",
            Self::Cores => "CUDA core count",
            Self::Utilization => "utilisation",
            Self::Memory => "memory use",
            Self::SmClock => "SM clock",
            Self::MemoryClock => "memory clock",
            Self::Power => "power draw",
            Self::PcieCounters => "PCIe byte counters",
            Self::GpmSample => "GPM sample",
            Self::GpmMetrics => "GPM metrics",
        }
    }
}

/// What went wrong with a device's queries so far.
#[derive(Debug, Default)]
struct Health {
    /// Queries the device answered `NotSupported` (never asked again).
    unsupported: u32,
    /// Queries whose failure was logged.
    reported: u32,
    /// GPM metrics (bit = index in [`GPM_METRICS`]) whose failure was logged.
    gpm_reported: u32,
    /// Whether the units NVML gives for the GPM metrics were logged.
    gpm_units_logged: bool,
}

impl Health {
    /// Runs `query` unless the device does not support it; a failure is logged once and gives
    /// `None`.
    fn read<T>(
        &mut self,
        gpu: u32,
        q: Query,
        query: impl FnOnce() -> Result<T, WrapperError>,
    ) -> Option<T> {
        if self.unsupported & q.bit() != 0 {
            return None;
        }
        match query() {
            Ok(v) => Some(v),
            Err(e) => {
                self.failed(gpu, q, &e);
                None
            }
        }
    }

    /// Records (and logs once) a failed query.
    fn failed(&mut self, gpu: u32, q: Query, e: &WrapperError) {
        let unsupported = is_unsupported(e);
        if unsupported {
            self.unsupported |= q.bit();
        }
        if self.reported & q.bit() != 0 {
            return;
        }
        self.reported |= q.bit();
        if unsupported {
            log::debug!(
                "gpu {gpu}: {} not supported here ({e}); not reported",
                q.what()
            );
        } else {
            log::warn!(
                "gpu {gpu}: cannot read {}: {e}; not reported while this lasts (logged once)",
                q.what()
            );
        }
    }

    /// Logs once that one GPM metric failed.
    fn gpm_metric_failed(&mut self, gpu: u32, slot: usize, e: &WrapperError) {
        let bit = 1u32 << slot;
        if self.gpm_reported & bit == 0 {
            self.gpm_reported |= bit;
            log::debug!(
                "gpu {gpu}: GPM metric {:?} unavailable: {e}",
                GPM_METRICS[slot]
            );
        }
    }
}

/// Whether an error says the device or driver lacks the query for good.
fn is_unsupported(e: &WrapperError) -> bool {
    matches!(
        e,
        WrapperError::NotSupported
            | WrapperError::FunctionNotFound
            | WrapperError::FailedToLoadSymbol(_)
    )
}

/// Pairs consecutive GPM samples at least [`GPM_MIN_INTERVAL_NS`] apart: metrics are computed
/// between the previous sample and the new one, which then becomes the previous.
#[derive(Debug)]
struct GpmPairing<S> {
    prev: Option<(u64, S)>,
}

impl<S> GpmPairing<S> {
    fn new() -> Self {
        Self { prev: None }
    }

    /// Whether a sample taken at `now_ns` is worth taking: the first one, or one far enough
    /// from the previous.
    fn due(&self, now_ns: u64) -> bool {
        self.prev
            .as_ref()
            .is_none_or(|(t, _)| now_ns.saturating_sub(*t) >= GPM_MIN_INTERVAL_NS)
    }

    /// Offers a sample taken at `now_ns`. With a previous sample far enough back, returns
    /// `compute(previous, new, interval_ns)` and keeps the new sample; the first sample is only
    /// kept; one too close to the previous is dropped (the previous stays, so the next interval
    /// is long enough).
    fn offer<R>(
        &mut self,
        now_ns: u64,
        sample: S,
        compute: impl FnOnce(&S, &S, u64) -> R,
    ) -> Option<R> {
        if !self.due(now_ns) {
            return None;
        }
        let out = self
            .prev
            .as_ref()
            .map(|(t, prev)| compute(prev, &sample, now_ns - t));
        self.prev = Some((now_ns, sample));
        out
    }

    /// Forgets the previous sample (after a failure, so that no metric spans it).
    fn reset(&mut self) {
        self.prev = None;
    }
}

/// Rate of a cumulative byte counter between ticks.
#[derive(Debug, Default)]
struct CounterRate {
    prev: Option<(u64, u64)>,
}

impl CounterRate {
    /// Per-second rate since the previous reading; `None` on the first reading, when no time
    /// passed, or when the counter went backwards (reset or wrap: the next reading is good).
    fn rate(&mut self, now_ns: u64, value: u64) -> Option<f64> {
        let prev = self.prev.replace((now_ns, value));
        let (t, v) = prev?;
        let dt = now_ns.checked_sub(t).filter(|d| *d > 0)?;
        let dv = value.checked_sub(v)?;
        Some(dv as f64 * 1e9 / dt as f64)
    }

    fn reset(&mut self) {
        self.prev = None;
    }
}

/// Bytes per second from a GPM bandwidth metric and the unit NVML names for it. NVML documents
/// PCIe and NVLink GPM metrics in MiB/s; an empty unit is taken as that. `None` for a unit this
/// does not know.
fn gpm_bytes_per_sec(value: f64, unit: &str) -> Option<f64> {
    let unit = unit.trim().to_ascii_lowercase();
    let per = unit
        .strip_suffix("/sec")
        .or_else(|| unit.strip_suffix("/s"))
        .or_else(|| unit.strip_suffix("ps"))
        .unwrap_or(&unit);
    let scale = match per {
        "" | "mib" => 1024.0 * 1024.0,
        "b" | "bytes" | "byte" => 1.0,
        "kib" => 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        _ => return None,
    };
    Some(value * scale)
}

/// Fills the GPM fields of `s` from the results of one `nvmlGpmMetricsGet` over [`GPM_METRICS`]
/// (same order). Failed metrics stay `None`; `failed(slot, error)` hears about each.
fn apply_gpm(
    s: &mut GpuSample,
    interval_ns: u64,
    results: &[Result<GpmMetricResult, WrapperError>],
    mut failed: impl FnMut(usize, &WrapperError),
) {
    let mut gpm = GpmMetrics {
        interval_ns: Some(interval_ns),
        ..GpmMetrics::default()
    };
    for (slot, (id, result)) in GPM_METRICS.iter().zip(results).enumerate() {
        let r = match result {
            Ok(r) => r,
            Err(e) => {
                failed(slot, e);
                continue;
            }
        };
        // NVML reports NaN for a metric it cannot compute over this interval.
        if !r.value.is_finite() {
            continue;
        }
        let pct = Some(r.value);
        match id {
            GpmMetricId::GraphicsUtil => gpm.graphics_util_percent = pct,
            GpmMetricId::SmUtil => gpm.sm_util_percent = pct,
            GpmMetricId::SmOccupancy => gpm.sm_occupancy_percent = pct,
            GpmMetricId::DramBwUtil => gpm.dram_bw_util_percent = pct,
            GpmMetricId::AnyTensorUtil => gpm.any_tensor_util_percent = pct,
            GpmMetricId::HmmaTensorUtil => gpm.hmma_tensor_util_percent = pct,
            GpmMetricId::ImmaTensorUtil => gpm.imma_tensor_util_percent = pct,
            GpmMetricId::DfmaTensorUtil => gpm.dfma_tensor_util_percent = pct,
            GpmMetricId::Fp16Util => gpm.fp16_util_percent = pct,
            GpmMetricId::Fp32Util => gpm.fp32_util_percent = pct,
            GpmMetricId::Fp64Util => gpm.fp64_util_percent = pct,
            GpmMetricId::IntegerUtil => gpm.integer_util_percent = pct,
            GpmMetricId::PcieTxPerSec => {
                s.pcie_tx_bytes_per_sec = gpm_bytes_per_sec(r.value, &r.metric_info.unit);
            }
            GpmMetricId::PcieRxPerSec => {
                s.pcie_rx_bytes_per_sec = gpm_bytes_per_sec(r.value, &r.metric_info.unit);
            }
            GpmMetricId::NvlinkTotalTxPerSec => {
                s.nvlink_tx_bytes_per_sec = gpm_bytes_per_sec(r.value, &r.metric_info.unit);
            }
            GpmMetricId::NvlinkTotalRxPerSec => {
                s.nvlink_rx_bytes_per_sec = gpm_bytes_per_sec(r.value, &r.metric_info.unit);
            }
            _ => {}
        }
    }
    s.gpm = gpm;
}

/// A cumulative counter's value as `u64`; `None` for a 32-bit value (it would wrap many times
/// per tick at PCIe speeds) or a negative one.
fn counter_value(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::U32(_) | SampleValue::F64(_) => None,
    }
}

/// One GPU being sampled.
struct Gpu {
    device: Device<'static>,
    /// What does not change: index, names, compute capability, SM count.
    fixed: GpuSample,
    /// `None` when the device has no GPM.
    gpm: Option<GpmPairing<GpmSample<'static>>>,
    pcie_tx: CounterRate,
    pcie_rx: CounterRate,
    health: Health,
}

impl Gpu {
    fn open(index: u32, device: Device<'static>) -> Self {
        let mut health = Health::default();
        let uuid = health.read(index, Query::Uuid, || device.uuid());
        let name = health.read(index, Query::Name, || device.name());
        let pci = health.read(index, Query::PciInfo, || device.pci_info());
        let cc = health
            .read(index, Query::ComputeCapability, || {
                device.cuda_compute_capability()
            })
            .and_then(|c| {
                Some(ComputeCapability {
                    major: u32::try_from(c.major).ok()?,
                    minor: u32::try_from(c.minor).ok()?,
                })
            });
        let cores = health.read(index, Query::Cores, || device.num_cores());
        let gpm = match device.gpm_support() {
            Ok(true) => Some(GpmPairing::new()),
            Ok(false) => {
                log::debug!("gpu {index}: no GPM (needs Hopper or newer)");
                None
            }
            Err(e) => {
                log::debug!("gpu {index}: no GPM: {e}");
                None
            }
        };
        Self {
            fixed: GpuSample {
                index,
                uuid: uuid.unwrap_or_default(),
                name: name.unwrap_or_default(),
                pci_bus_id: pci.map(|p| p.bus_id).unwrap_or_default(),
                compute_capability: cc,
                sm_count: cc.zip(cores).and_then(|(cc, cores)| cc.sm_count(cores)),
                ..GpuSample::default()
            },
            device,
            gpm,
            pcie_tx: CounterRate::default(),
            pcie_rx: CounterRate::default(),
            health,
        }
    }

    fn sample(&mut self, nvml: &'static Nvml, now_ns: u64) -> GpuSample {
        let mut s = self.fixed.clone();
        let (i, d, h) = (s.index, &self.device, &mut self.health);
        if let Some(u) = h.read(i, Query::Utilization, || d.utilization_rates()) {
            s.gpu_util_percent = Some(f64::from(u.gpu));
            s.memory_util_percent = Some(f64::from(u.memory));
        }
        if let Some(m) = h.read(i, Query::Memory, || d.memory_info()) {
            s.memory_used_bytes = Some(m.used);
            s.memory_total_bytes = Some(m.total);
        }
        s.sm_clock_mhz = h.read(i, Query::SmClock, || d.clock_info(Clock::SM));
        s.memory_clock_mhz = h.read(i, Query::MemoryClock, || d.clock_info(Clock::Memory));
        s.power_watts = h
            .read(i, Query::Power, || d.power_usage())
            .map(|mw| f64::from(mw) / 1e3);
        match &mut self.gpm {
            Some(pairing) => {
                sample_gpm(nvml, d, h, pairing, &mut s, now_ns);
                // The device claimed GPM but cannot do it (a vGPU, say): use the counters.
                if h.unsupported & (Query::GpmSample.bit() | Query::GpmMetrics.bit()) != 0 {
                    log::debug!("gpu {i}: GPM unusable; PCIe rates from the byte counters");
                    self.gpm = None;
                }
            }
            None => self.sample_pcie_counters(&mut s, now_ns),
        }
        s
    }

    /// PCIe rates from the driver's cumulative byte counters (GPUs without GPM).
    fn sample_pcie_counters(&mut self, s: &mut GpuSample, now_ns: u64) {
        let (i, d) = (s.index, &self.device);
        let ids = [
            FieldId(NVML_FI_DEV_PCIE_COUNT_TX_BYTES),
            FieldId(NVML_FI_DEV_PCIE_COUNT_RX_BYTES),
        ];
        let Some(values) = self
            .health
            .read(i, Query::PcieCounters, || d.field_values_for(&ids))
        else {
            self.pcie_tx.reset();
            self.pcie_rx.reset();
            return;
        };
        let mut read = |n: usize| match values.get(n) {
            Some(Ok(v)) => match &v.value {
                Ok(v) => counter_value(v),
                Err(e) => {
                    self.health.failed(i, Query::PcieCounters, e);
                    None
                }
            },
            Some(Err(e)) => {
                self.health.failed(i, Query::PcieCounters, e);
                None
            }
            None => None,
        };
        let (tx, rx) = (read(0), read(1));
        s.pcie_tx_bytes_per_sec = match tx {
            Some(v) => self.pcie_tx.rate(now_ns, v),
            None => {
                self.pcie_tx.reset();
                None
            }
        };
        s.pcie_rx_bytes_per_sec = match rx {
            Some(v) => self.pcie_rx.rate(now_ns, v),
            None => {
                self.pcie_rx.reset();
                None
            }
        };
    }
}

/// Takes a GPM sample and, with the previous one, fills the GPM metrics (and PCIe and NVLink
/// rates) of `s`.
fn sample_gpm(
    nvml: &'static Nvml,
    d: &Device<'static>,
    h: &mut Health,
    pairing: &mut GpmPairing<GpmSample<'static>>,
    s: &mut GpuSample,
    now_ns: u64,
) {
    let i = s.index;
    if !pairing.due(now_ns) {
        return;
    }
    let Some(sample) = h.read(i, Query::GpmSample, || d.gpm_sample()) else {
        pairing.reset();
        return;
    };
    let results = pairing.offer(now_ns, sample, |prev, new, interval| {
        (gpm_metrics_get(nvml, prev, new, &GPM_METRICS), interval)
    });
    match results {
        None => {}
        Some((Ok(results), interval)) => {
            if !h.gpm_units_logged {
                h.gpm_units_logged = true;
                let units: Vec<String> = results
                    .iter()
                    .flatten()
                    .map(|r| format!("{:?}={:?}", r.metric_id, r.metric_info.unit))
                    .collect();
                log::debug!("gpu {i}: GPM metric units: {}", units.join(" "));
            }
            apply_gpm(s, interval, &results, |slot, e| {
                h.gpm_metric_failed(i, slot, e)
            });
        }
        Some((Err(e), _)) => h.failed(i, Query::GpmMetrics, &e),
    }
}

/// NVLinks a GPU may have (NVML_NVLINK_MAX_LINKS in driver 580).
const MAX_NVLINKS: u32 = 18;

/// Reads how the GPUs connect, once: what a query does not answer is left out (logged at debug;
/// a single-GPU VM, for one, has no peers and often no NVLinks).
fn read_topology(nvml: &'static Nvml, gpus: &[Gpu]) -> Vec<GpuTopology> {
    use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
    let cpu_words = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(1024)
        .div_ceil(64);
    let mut out = Vec::new();
    for g in gpus {
        let d = &g.device;
        let i = g.fixed.index;
        let note = |what: &str, e: &WrapperError| log::debug!("gpu {i}: no {what}: {e}");
        let numa_node = d.numa_node_id().map_err(|e| note("NUMA node", &e)).ok();
        let cpu_affinity = d
            .cpu_affinity(cpu_words)
            .map(|w| cpus_of_mask(&w))
            .map_err(|e| note("CPU affinity", &e))
            .unwrap_or_default();
        let gen = d
            .current_pcie_link_gen()
            .and_then(|c| Ok((c, d.max_pcie_link_gen()?)))
            .map_err(|e| note("PCIe generation", &e))
            .ok();
        let width = d
            .current_pcie_link_width()
            .and_then(|c| Ok((c, d.max_pcie_link_width()?)))
            .map_err(|e| note("PCIe width", &e))
            .ok();
        // Active links and the PCI bus id at their other end.
        let mut active = None;
        let mut remote: Vec<String> = Vec::new();
        for link in 0..MAX_NVLINKS {
            let l = d.link_wrapper_for(link);
            match l.is_active() {
                Ok(true) => {
                    *active.get_or_insert(0) += 1;
                    if let Ok(p) = l.remote_pci_info() {
                        remote.push(p.bus_id.to_ascii_lowercase());
                    }
                }
                Ok(false) => {
                    active.get_or_insert(0);
                }
                Err(_) => break,
            }
        }
        let mut peers = Vec::new();
        for other in gpus.iter().filter(|o| o.fixed.index != i) {
            let bus = other.fixed.pci_bus_id.to_ascii_lowercase();
            let nvlinks = remote.iter().filter(|r| **r == bus).count() as u32;
            // The call takes the other device by value: a second handle to it.
            let level = nvml
                .device_by_index(other.fixed.index)
                .and_then(|o| d.topology_common_ancestor(o));
            let path = if nvlinks > 0 {
                GpuPath::NvLink
            } else {
                match level {
                    Ok(TopologyLevel::Internal) => GpuPath::Board,
                    Ok(TopologyLevel::Single) => GpuPath::Pix,
                    Ok(TopologyLevel::Multiple) => GpuPath::Pxb,
                    Ok(TopologyLevel::HostBridge) => GpuPath::Phb,
                    Ok(TopologyLevel::Node) => GpuPath::Node,
                    Ok(TopologyLevel::System) => GpuPath::Sys,
                    Err(e) => {
                        note("topology to a peer", &e);
                        continue;
                    }
                }
            };
            let p2p_read = d
                .p2p_status(&other.device, P2pCapabilitiesIndex::Read)
                .map(|s| s == P2pStatus::Ok)
                .ok();
            peers.push(GpuPeer {
                index: other.fixed.index,
                path,
                nvlinks,
                p2p_read,
            });
        }
        out.push(GpuTopology {
            index: i,
            numa_node,
            cpu_affinity,
            pcie_generation: gen,
            pcie_width: width,
            nvlinks_active: active,
            peers,
        });
    }
    out
}

/// Samples every GPU of the node through NVML, once per tick.
pub struct NvmlSampler {
    nvml: &'static Nvml,
    gpus: Vec<Gpu>,
    topology: Arc<Vec<GpuTopology>>,
}

impl NvmlSampler {
    /// Loads NVML and opens every GPU it lists. Fails (and the agent should run without GPU
    /// metrics) when no driver or no GPU is there; a GPU that cannot be opened is skipped with a
    /// warning.
    pub fn new() -> Result<Self, NvmlError> {
        let nvml = nvml()?;
        let count = nvml
            .device_count()
            .map_err(|source| NvmlError::Devices { source })?;
        let mut gpus = Vec::new();
        for index in 0..count {
            match nvml.device_by_index(index) {
                Ok(device) => gpus.push(Gpu::open(index, device)),
                Err(e) => log::warn!("gpu {index}: cannot open it: {e}; not sampled"),
            }
        }
        if gpus.is_empty() {
            return Err(NvmlError::NoDevices);
        }
        let topology = Arc::new(read_topology(nvml, &gpus));
        Ok(Self {
            nvml,
            gpus,
            topology,
        })
    }

    /// One line for the log: driver version, GPUs, how many have GPM.
    pub fn describe(&self) -> String {
        let driver = self
            .nvml
            .sys_driver_version()
            .unwrap_or_else(|_| "unknown".to_owned());
        let gpm = self.gpus.iter().filter(|g| g.gpm.is_some()).count();
        format!(
            "NVIDIA driver {driver}, {} GPU(s), GPM on {gpm}",
            self.gpus.len()
        )
    }

    /// Samples every GPU. GPM metrics cover the time since the previous call (at least
    /// [`GPM_MIN_INTERVAL_NS`] before; a call sooner than that leaves them `None`), so the
    /// first call has none. Makes blocking NVML calls (about ten per GPU): call it from a
    /// blocking thread, not from an async task.
    pub fn sample(&mut self, now_ns: u64) -> GpuSnapshot {
        GpuSnapshot {
            devices: self
                .gpus
                .iter_mut()
                .map(|g| g.sample(self.nvml, now_ns))
                .collect(),
            taken_at_ns: now_ns,
            topology: self.topology.clone(),
        }
    }
}

/// Snapshots kept for aligning iterations: 20 minutes at the default period, enough for the
/// shim source's window of recent iterations unless they are slower than about 2 s each.
pub const HISTORY_SNAPSHOTS: usize = 6000;

/// Samples NVML on its own thread, every `period`, into a [`GpuHistory`] that the agent aligns
/// iterations against (finer than the agent's tick: an iteration lasts milliseconds to seconds).
pub struct NvmlThread {
    sampler: Arc<Mutex<NvmlSampler>>,
    history: Arc<Mutex<GpuHistory>>,
    stop: Arc<AtomicBool>,
    /// Where every sample is also appended as a JSON line (with `shim.record_dir`), for
    /// replaying recordings with what NVML saw.
    record: Option<Arc<std::path::PathBuf>>,
}

/// The file in `shim.record_dir` that NVML's samples are appended to.
pub const NVML_RECORDING: &str = "nvml.jsonl";

impl NvmlThread {
    /// Starts sampling every `period` (GPM needs at least [`GPM_MIN_INTERVAL_NS`]); with
    /// `record_dir`, every sample is also appended to [`NVML_RECORDING`] there.
    pub fn start(
        sampler: NvmlSampler,
        period: Duration,
        record_dir: Option<&std::path::Path>,
    ) -> std::io::Result<Self> {
        let sampler = Arc::new(Mutex::new(sampler));
        let history = Arc::new(Mutex::new(GpuHistory::new(HISTORY_SNAPSHOTS)));
        let stop = Arc::new(AtomicBool::new(false));
        let t = Self {
            sampler,
            history,
            stop,
            record: record_dir.map(|d| Arc::new(d.join(NVML_RECORDING))),
        };
        t.sample_now();
        let (sampler, history, stop, record) = (
            t.sampler.clone(),
            t.history.clone(),
            t.stop.clone(),
            t.record.clone(),
        );
        thread::Builder::new()
            .name("slo-nvml".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    thread::sleep(period);
                    sample_into(&sampler, &history, record.as_deref());
                }
            })?;
        Ok(t)
    }

    /// Samples now (besides the period), returns the snapshot and keeps it.
    pub fn sample_now(&self) -> Option<GpuSnapshot> {
        sample_into(&self.sampler, &self.history, self.record.as_deref())
    }

    /// The newest snapshot.
    pub fn latest(&self) -> Option<GpuSnapshot> {
        self.history.lock().ok()?.latest().cloned()
    }

    /// The history, shared with whoever aligns iterations.
    pub fn history(&self) -> Arc<Mutex<GpuHistory>> {
        self.history.clone()
    }
}

impl crate::sources::Source for NvmlThread {
    fn health(&self) -> Vec<slo_probe_core::snapshot::ProbeStatus> {
        crate::sources::flag_health("nvml", &self.stop)
    }

    /// The sampling thread ends after its current period; the history stays.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for NvmlThread {
    fn drop(&mut self) {
        crate::sources::Source::stop(self);
    }
}

fn sample_into(
    sampler: &Mutex<NvmlSampler>,
    history: &Mutex<GpuHistory>,
    record: Option<&std::path::PathBuf>,
) -> Option<GpuSnapshot> {
    // One sampler at a time, so snapshots enter the history in clock order.
    let mut s = sampler.lock().ok()?;
    let snap = s.sample(slo_probe_common::host::monotonic_ns());
    if let Some(path) = record {
        crate::sources::append_json_line(path, &snap);
    }
    history.lock().ok()?.push(snap.clone());
    Some(snap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper::struct_wrappers::gpm::GpmMetricInfo;

    const MS: u64 = 1_000_000;

    /// On a machine without a driver the sampler does not start, and says why in the words
    /// the agent logs. On a GPU machine it samples every GPU.
    #[test]
    fn new_without_driver_is_a_clean_error() {
        match NvmlSampler::new() {
            Err(e @ NvmlError::LibraryMissing { .. }) => {
                assert!(
                    e.to_string().starts_with(
                        "no NVIDIA driver found (libnvidia-ml.so.1 not loadable): GPU metrics \
                         are off;"
                    ),
                    "{e}"
                );
                let chain = crate::error_chain(&e);
                assert!(chain.contains("libnvidia-ml.so.1"), "{chain}");
            }
            Err(e) => assert!(e.to_string().contains("GPU metrics are off"), "{e}"),
            Ok(mut s) => {
                let snap = s.sample(1);
                assert!(!snap.devices.is_empty());
                assert!(snap.devices.iter().all(|d| d.gpm.is_empty()));
            }
        }
    }

    #[test]
    fn init_errors_are_classified() {
        let e = NvmlError::from_init(WrapperError::FailedToLoadSymbol("nvmlInit_v2".into()));
        assert_eq!(
            e.to_string(),
            "no NVIDIA driver found (libnvidia-ml.so.1 not loadable): GPU metrics are off; \
             install the NVIDIA driver, or expose it to the container (NVIDIA container toolkit)"
        );
        assert!(matches!(
            NvmlError::from_init(WrapperError::DriverNotLoaded),
            NvmlError::DriverNotLoaded { .. }
        ));
        assert!(matches!(
            NvmlError::from_init(WrapperError::NoPermission),
            NvmlError::NoPermission { .. }
        ));
        let e = NvmlError::from_init(WrapperError::Unknown);
        assert!(matches!(e, NvmlError::Init { .. }));
        assert!(crate::error_chain(&e).starts_with("cannot initialise NVML: GPU metrics are off"));
    }

    #[test]
    fn gpm_pairs_samples_at_least_100ms_apart() {
        let mut p = GpmPairing::new();
        let pair = |a: &u32, b: &u32, dt: u64| (*a, *b, dt);
        assert!(p.due(0));
        // The first sample only primes.
        assert_eq!(p.offer(1_000 * MS, 1, pair), None);
        // Too soon: dropped, the first one stays.
        assert!(!p.due(1_050 * MS));
        assert_eq!(p.offer(1_050 * MS, 2, pair), None);
        // Exactly 100 ms after the kept one: a pair, and the new one is kept.
        assert_eq!(p.offer(1_100 * MS, 3, pair), Some((1, 3, 100 * MS)));
        assert_eq!(p.offer(2_100 * MS, 4, pair), Some((3, 4, 1_000 * MS)));
        // A failure forgets the previous sample: the next one only primes again.
        p.reset();
        assert_eq!(p.offer(3_100 * MS, 5, pair), None);
        assert_eq!(p.offer(4_100 * MS, 6, pair), Some((5, 6, 1_000 * MS)));
        // A clock that went backwards never pairs.
        assert!(!p.due(4_000 * MS));
    }

    #[test]
    fn counter_rates() {
        let mut c = CounterRate::default();
        assert_eq!(c.rate(1_000 * MS, 100), None);
        assert_eq!(c.rate(1_500 * MS, 1_100), Some(2_000.0));
        // No time passed.
        assert_eq!(c.rate(1_500 * MS, 1_200), None);
        // Went backwards (reset): no rate, then rates from the new base.
        assert_eq!(c.rate(2_500 * MS, 50), None);
        assert_eq!(c.rate(3_500 * MS, 1_050), Some(1_000.0));
        c.reset();
        assert_eq!(c.rate(4_500 * MS, 5_000), None);
        assert_eq!(counter_value(&SampleValue::U64(7)), Some(7));
        assert_eq!(counter_value(&SampleValue::I64(-1)), None);
        assert_eq!(counter_value(&SampleValue::U32(7)), None);
    }

    #[test]
    fn gpm_units() {
        assert_eq!(gpm_bytes_per_sec(2.0, "MiB/sec"), Some(2.0 * 1048576.0));
        assert_eq!(gpm_bytes_per_sec(2.0, ""), Some(2.0 * 1048576.0));
        assert_eq!(gpm_bytes_per_sec(2.0, "MB/s"), Some(2e6));
        assert_eq!(gpm_bytes_per_sec(2.0, "Bps"), Some(2.0));
        assert_eq!(gpm_bytes_per_sec(2.0, "%"), None);
    }

    fn result(
        metric_id: GpmMetricId,
        value: f64,
        unit: &str,
    ) -> Result<GpmMetricResult, WrapperError> {
        Ok(GpmMetricResult {
            metric_id,
            value,
            metric_info: GpmMetricInfo {
                short_name: String::new(),
                long_name: String::new(),
                unit: unit.to_owned(),
            },
        })
    }

    #[test]
    fn gpm_results_fill_the_sample() {
        let results: Vec<_> = GPM_METRICS
            .iter()
            .enumerate()
            .map(|(slot, id)| match id {
                GpmMetricId::ImmaTensorUtil => Err(WrapperError::NotSupported),
                GpmMetricId::Fp64Util => result(*id, f64::NAN, "%"),
                GpmMetricId::PcieTxPerSec | GpmMetricId::NvlinkTotalRxPerSec => {
                    result(*id, 3.0, "MiB/sec")
                }
                GpmMetricId::PcieRxPerSec => result(*id, 1.0, "furlongs"),
                GpmMetricId::NvlinkTotalTxPerSec => result(*id, 14.5, ""),
                _ => result(*id, slot as f64 + 0.5, "%"),
            })
            .collect();
        let mut s = GpuSample::default();
        let mut failed = Vec::new();
        apply_gpm(&mut s, 1_000 * MS, &results, |slot, _| failed.push(slot));
        let slot = |id| GPM_METRICS.iter().position(|m| *m == id).expect("listed");
        assert_eq!(failed, vec![slot(GpmMetricId::ImmaTensorUtil)]);
        let g = s.gpm;
        assert_eq!(g.interval_ns, Some(1_000 * MS));
        assert_eq!(g.graphics_util_percent, Some(0.5));
        assert_eq!(g.sm_util_percent, Some(1.5));
        assert_eq!(g.sm_occupancy_percent, Some(2.5));
        assert_eq!(g.dram_bw_util_percent, Some(3.5));
        assert_eq!(g.any_tensor_util_percent, Some(4.5));
        assert_eq!(g.imma_tensor_util_percent, None);
        assert_eq!(g.fp64_util_percent, None);
        assert_eq!(g.integer_util_percent, Some(11.5));
        assert_eq!(s.pcie_tx_bytes_per_sec, Some(3.0 * 1048576.0));
        assert_eq!(s.pcie_rx_bytes_per_sec, None);
        assert_eq!(s.nvlink_tx_bytes_per_sec, Some(14.5 * 1048576.0));
        assert_eq!(s.nvlink_rx_bytes_per_sec, Some(3.0 * 1048576.0));
    }

    /// The integration may sample from a blocking thread.
    #[test]
    fn sampler_is_send() {
        fn send<T: Send>() {}
        send::<NvmlSampler>();
    }

    #[test]
    fn query_bits_fit() {
        assert!((Query::GpmMetrics as u32) < 32);
        assert!(GPM_METRICS.len() <= 32);
    }
}
