//! The eBPF source: loads the embedded object built from `ebpf/`, patches kernel struct offsets
//! and settings into it, attaches the scheduling programs and reads their maps.
//!
//! Needs kernel 5.18+ with BTF (`tp_btf/sched_switch` with `prev_state`), and CAP_BPF +
//! CAP_PERFMON (or root). Tracepoint attach goes through BTF, so tracefs is not needed here.

use std::time::Duration;

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, ProgramError},
    Btf, Ebpf, EbpfLoader,
};
use slo_probe_common::{Counter, RunqHist, RUNQ_HIST_EXITED};
use slo_probe_core::runq::ThreadRead;

use crate::{
    btf::{BtfError, TaskOffsets},
    preflight::Preflight,
};

/// The eBPF object, built by `build.rs`.
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/slo-probe-ebpf"));

/// The scheduling programs, in attach order (wakeups first, so that `sched_switch` finds stamps).
pub const SCHED_PROGRAMS: [&str; 4] = [
    "sched_wakeup",
    "sched_wakeup_new",
    "sched_switch",
    "sched_process_exit",
];

/// Errors of the eBPF source.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// Preflight found something missing.
    #[error("cannot load eBPF programs: {what}: {detail}")]
    Unavailable {
        /// What is missing.
        what: &'static str,
        /// What was found and how to fix it.
        detail: String,
    },
    /// Kernel BTF could not be used for struct offsets.
    #[error("cannot read task_struct offsets from kernel BTF")]
    Offsets(#[source] BtfError),
    /// aya could not parse kernel BTF.
    #[error("cannot parse kernel BTF for tracepoint attach")]
    AyaBtf(#[source] aya::BtfError),
    /// The object could not be loaded.
    #[error("cannot load the eBPF object into the kernel (maps or BTF refused)")]
    Load(#[source] aya::EbpfError),
    /// A program is missing from the object (a build mismatch).
    #[error("eBPF program {name} is missing from the embedded object; rebuild the agent")]
    MissingProgram {
        /// The program name.
        name: &'static str,
    },
    /// A map is missing from the object (a build mismatch).
    #[error("eBPF map {name} is missing from the embedded object; rebuild the agent")]
    MissingMap {
        /// The map name.
        name: &'static str,
    },
    /// The verifier or the attach refused a program.
    #[error("cannot load or attach eBPF program {name}")]
    Program {
        /// The program name.
        name: &'static str,
        /// What the kernel said (the verifier log, when there is one).
        #[source]
        source: ProgramError,
    },
    /// A map read or write failed.
    #[error("cannot access eBPF map {name}")]
    Map {
        /// The map name.
        name: &'static str,
        /// The error.
        #[source]
        source: aya::maps::MapError,
    },
}

/// Settings of the scheduling probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedSettings {
    /// Waits at least this long are also sent one by one through the ring buffer.
    pub outlier_threshold: Duration,
    /// Capacity of the per-thread histogram map.
    pub max_threads: u32,
    /// Ring buffer size in bytes (a power of two, at least a page).
    pub ring_bytes: u32,
}

/// What one drain of the maps returned.
#[derive(Debug, Default)]
pub struct SchedRead {
    /// Every per-thread histogram present in the kernel map.
    pub threads: Vec<ThreadRead>,
    /// Outlier records drained from the ring buffer (raw bytes, decoded by the caller).
    pub outliers: Vec<Vec<u8>>,
    /// Kernel-side counters, summed over CPUs, indexed by [`Counter`].
    pub counters: [u64; Counter::COUNT as usize],
}

/// The loaded and attached scheduling probes. Dropping it detaches every program.
pub struct SchedProbe {
    /// Owns the programs and their links: dropping it detaches them.
    _ebpf: Ebpf,
    hist: HashMap<MapData, u32, RunqHist>,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
}

impl SchedProbe {
    /// Checks the machine, loads the object and attaches every scheduling program.
    pub fn load(settings: &SchedSettings) -> Result<Self, EbpfError> {
        let preflight = Preflight::run();
        if let Some(f) = preflight.blocker() {
            return Err(EbpfError::Unavailable {
                what: f.what,
                detail: f.detail.clone(),
            });
        }
        Self::load_programs(settings, &SCHED_PROGRAMS)
    }

    /// Loads the object and attaches only `programs` (tests use this to prove that a missing
    /// program is noticed).
    pub fn load_programs(settings: &SchedSettings, programs: &[&str]) -> Result<Self, EbpfError> {
        let offsets =
            TaskOffsets::from_btf(&crate::btf::Btf::from_sys_fs().map_err(EbpfError::Offsets)?)
                .map_err(EbpfError::Offsets)?;
        let threshold_ns = u64::try_from(settings.outlier_threshold.as_nanos()).unwrap_or(u64::MAX);
        let start_entries = settings.max_threads.max(1024);
        let mut ebpf = EbpfLoader::new()
            .override_global("TASK_PID_OFFSET", &offsets.pid, true)
            .override_global("TASK_TGID_OFFSET", &offsets.tgid, true)
            .override_global("TASK_COMM_OFFSET", &offsets.comm, true)
            .override_global("RUNQ_OUTLIER_NS", &threshold_ns, true)
            .map_max_entries("RUNQ_HIST", settings.max_threads)
            .map_max_entries("RUNQ_START", start_entries)
            .map_max_entries("RUNQ_EVENTS", settings.ring_bytes)
            .load(EBPF_OBJECT)
            .map_err(EbpfError::Load)?;

        let btf = Btf::from_sys_fs().map_err(EbpfError::AyaBtf)?;
        for name in SCHED_PROGRAMS {
            if !programs.contains(&name) {
                continue;
            }
            let program: &mut BtfTracePoint = ebpf
                .program_mut(name)
                .ok_or(EbpfError::MissingProgram { name })?
                .try_into()
                .map_err(|source| EbpfError::Program { name, source })?;
            program
                .load(name, &btf)
                .map_err(|source| EbpfError::Program { name, source })?;
            program
                .attach()
                .map_err(|source| EbpfError::Program { name, source })?;
        }

        let hist = take_map(&mut ebpf, "RUNQ_HIST")?;
        let hist = HashMap::try_from(hist).map_err(|source| EbpfError::Map {
            name: "RUNQ_HIST",
            source,
        })?;
        let ring = take_map(&mut ebpf, "RUNQ_EVENTS")?;
        let ring = RingBuf::try_from(ring).map_err(|source| EbpfError::Map {
            name: "RUNQ_EVENTS",
            source,
        })?;
        let counters = take_map(&mut ebpf, "COUNTERS")?;
        let counters = PerCpuArray::try_from(counters).map_err(|source| EbpfError::Map {
            name: "COUNTERS",
            source,
        })?;
        Ok(Self {
            _ebpf: ebpf,
            hist,
            ring,
            counters,
        })
    }

    /// Drains the ring buffer, reads every histogram and the counters, and frees the entries of
    /// threads that have exited (they were read here for the last time).
    pub fn read(&mut self) -> Result<SchedRead, EbpfError> {
        let mut out = SchedRead::default();
        while let Some(item) = self.ring.next() {
            out.outliers.push(item.to_vec());
        }

        let map_err = |source| EbpfError::Map {
            name: "RUNQ_HIST",
            source,
        };
        let keys: Vec<u32> = self
            .hist
            .keys()
            .collect::<Result<_, _>>()
            .map_err(map_err)?;
        for tid in keys {
            match self.hist.get(&tid, 0) {
                Ok(hist) => out.threads.push(ThreadRead { tid, hist }),
                // Deleted between listing and lookup: nothing to read.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(e)),
            }
        }
        for r in &out.threads {
            if r.hist.flags & RUNQ_HIST_EXITED != 0 {
                match self.hist.remove(&r.tid) {
                    Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                    Err(e) => return Err(map_err(e)),
                }
            }
        }

        for c in Counter::ALL {
            let per_cpu = self
                .counters
                .get(&(c as u32), 0)
                .map_err(|source| EbpfError::Map {
                    name: "COUNTERS",
                    source,
                })?;
            out.counters[c as usize] = per_cpu.iter().sum();
        }
        Ok(out)
    }
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, EbpfError> {
    ebpf.take_map(name).ok_or(EbpfError::MissingMap { name })
}
