//! The eBPF source: loads the embedded object built from `ebpf/`, patches kernel struct offsets,
//! tracepoint field offsets and settings into it, attaches the program families and reads their
//! maps and rings.
//!
//! Families, each attached on its own so that one missing piece disables only that family:
//! - `runqueue` (required): run-queue latency, off-CPU split, thread exits — BTF tracepoints,
//!   kernel 5.18+ with BTF;
//! - `process`: fork/exec following of the job (the in-kernel filter) — BTF tracepoints;
//! - `tcp`: bytes, ownership, RTT, retransmits — BTF tracepoints too (kernel 6.3+ for
//!   `sock_send_length`), so no family needs tracefs: a container needs no host mount for it.
//!
//! Needs CAP_BPF + CAP_PERFMON (or root).

pub mod batch;
pub mod btf;
pub mod preflight;

use std::{collections::BTreeSet, os::fd::AsFd, time::Duration};

use aya::{
    maps::{HashMap, Map, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, ProgramError},
    Btf, Ebpf, EbpfLoader,
};
use slo_probe_common::{
    ConnStats, Counter, SchedOffsets, SockOffsets, ThreadStats, CONN_CLOSED, THREAD_EXITED,
};
use slo_probe_core::{net::ConnRead, snapshot::ProbeStatus, threads::ThreadRead};

use self::{
    btf::{BtfError, TaskOffsets},
    preflight::Preflight,
};
use crate::sources::procfs;

/// The eBPF object, built by `build.rs`.
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/slo-probe-ebpf"));

/// The wakeup programs, attached only where `sched_switch` cannot read the scheduler's own
/// run-queue stamps (see `SchedOffsets`).
pub const WAKEUP_PROGRAMS: [&str; 2] = ["sched_wakeup", "sched_wakeup_new"];
/// The scheduling programs, in attach order (wakeups first, so that `sched_switch` finds stamps).
pub const SCHED_PROGRAMS: [&str; 4] = [
    "sched_wakeup",
    "sched_wakeup_new",
    "sched_switch",
    "sched_process_exit",
];
/// The process-tree programs.
pub const PROC_PROGRAMS: [&str; 2] = ["sched_process_fork", "sched_process_exec"];
/// The network programs, all BTF tracepoints. Retransmits run in softirq context, where a
/// classic tracepoint program is skipped whenever another one is running on the CPU (the shared
/// `bpf_prog_active` guard); BTF tracepoints only skip their own recursion, so none is missed.
pub const NET_PROGRAMS: [&str; 5] = [
    "sock_send_length",
    "sock_recv_length",
    "inet_sock_set_state",
    "tcp_probe",
    "tcp_retransmit_skb",
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

/// Settings of the eBPF probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EbpfSettings {
    /// Run-queue waits at least this long are also sent one by one.
    pub outlier_threshold: Duration,
    /// Capacity of the per-thread map.
    pub max_threads: u32,
    /// Outlier ring size in bytes (a power of two, at least a page).
    pub ring_bytes: u32,
    /// Attach the TCP family.
    pub net: bool,
    /// Capacity of the connection map.
    pub max_conns: u32,
    /// The job's root processes; `None` follows every process on the node.
    pub targets: Option<Vec<u32>>,
    /// Stamp run-queue waits with the wakeup programs even where the scheduler's own stamps can
    /// be read (the fallback for kernels without them; tests and benches compare the two).
    pub wakeup_stamps: bool,
}

impl Default for EbpfSettings {
    fn default() -> Self {
        Self {
            outlier_threshold: Duration::from_millis(10),
            max_threads: 16_384,
            ring_bytes: 256 * 1024,
            net: true,
            max_conns: 4096,
            targets: None,
            wakeup_stamps: false,
        }
    }
}

/// Which programs to attach (tests leave some out to prove that their absence is noticed).
#[derive(Clone, Debug)]
pub struct Selection {
    /// Program names to attach; `None` attaches everything.
    pub only: Option<Vec<&'static str>>,
}

impl Selection {
    /// Everything.
    pub const ALL: Selection = Selection { only: None };

    fn wants(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.contains(&name))
    }
}

/// What one drain of the maps and rings returned.
#[derive(Debug, Default)]
pub struct EbpfRead {
    /// Every per-thread entry.
    pub threads: Vec<ThreadRead>,
    /// Every connection entry (empty when the TCP family is down).
    pub conns: Vec<ConnRead>,
    /// Records drained from the rings (outliers, process events, retransmits), undecoded.
    pub records: Vec<Vec<u8>>,
    /// Kernel-side counters, summed over CPUs, indexed by [`Counter`].
    pub counters: [u64; Counter::COUNT as usize],
}

/// The loaded probes. Dropping it detaches every program.
pub struct Probes {
    /// Owns the programs and their links: dropping it (or [`Source::stop`]) detaches them.
    ebpf: Option<Ebpf>,
    threads: Map,
    conns: Option<Map>,
    tracked: Map,
    rings: Vec<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    statuses: Vec<ProbeStatus>,
    filtered: bool,
    batch_ok: bool,
    scheduler_stamps: bool,
}

fn up(name: &'static str) -> ProbeStatus {
    ProbeStatus {
        name,
        up: true,
        reason: String::new(),
    }
}

fn down(name: &'static str, reason: String) -> ProbeStatus {
    ProbeStatus {
        name,
        up: false,
        reason,
    }
}

impl crate::sources::Source for Probes {
    fn health(&self) -> Vec<ProbeStatus> {
        self.statuses.clone()
    }

    /// Detaches every program; the maps stay readable, so a last read still sees the counts.
    fn stop(&mut self) {
        if self.ebpf.take().is_some() {
            for s in &mut self.statuses {
                *s = down(s.name, "stopped".to_owned());
            }
        }
    }
}

impl Probes {
    /// Whether `sched_switch` reads the scheduler's own run-queue stamps (no program runs on a
    /// wakeup); `false` where the wakeup programs stamp waits.
    pub fn scheduler_stamps(&self) -> bool {
        self.scheduler_stamps
    }

    /// Checks the machine, loads the object and attaches every family it can.
    pub fn load(settings: &EbpfSettings) -> Result<Self, EbpfError> {
        let preflight = Preflight::run();
        if let Some(f) = preflight.blocker() {
            return Err(EbpfError::Unavailable {
                what: f.what,
                detail: f.detail.clone(),
            });
        }
        Self::load_selected(settings, &Selection::ALL)
    }

    /// Loads the object and attaches the selected programs.
    pub fn load_selected(settings: &EbpfSettings, sel: &Selection) -> Result<Self, EbpfError> {
        let kernel_btf = btf::Btf::from_sys_fs().map_err(EbpfError::Offsets)?;
        let offsets = TaskOffsets::from_btf(&kernel_btf).map_err(EbpfError::Offsets)?;
        let sock = if settings.net {
            btf::sock_offsets(&kernel_btf).map_err(|e| crate::error_chain(&e))
        } else {
            Ok(SockOffsets::default())
        };
        let sched = if settings.wakeup_stamps {
            SchedOffsets::default()
        } else {
            btf::sched_offsets(&kernel_btf).unwrap_or_else(|e| {
                log::info!(
                    "run-queue waits stamped by the wakeup programs ({}): one more program per wakeup",
                    crate::error_chain(&e)
                );
                SchedOffsets::default()
            })
        };
        let threshold_ns = u64::try_from(settings.outlier_threshold.as_nanos()).unwrap_or(u64::MAX);
        let filter = u32::from(settings.targets.is_some());
        let patched_sock = sock.as_ref().copied().unwrap_or_default();
        let mut ebpf = EbpfLoader::new()
            .override_global("TASK_PID_OFFSET", &offsets.pid, true)
            .override_global("TASK_TGID_OFFSET", &offsets.tgid, true)
            .override_global("TASK_COMM_OFFSET", &offsets.comm, true)
            .override_global("RUNQ_OUTLIER_NS", &threshold_ns, true)
            .override_global("FILTER_TRACKED", &filter, true)
            .override_global("SOCK_OFFSETS", &patched_sock, true)
            .override_global("SCHED_OFFSETS", &sched, true)
            .map_max_entries("THREADS", settings.max_threads)
            .map_max_entries("CONNS", settings.max_conns)
            .map_max_entries("RUNQ_EVENTS", settings.ring_bytes)
            .load(EBPF_OBJECT)
            .map_err(EbpfError::Load)?;

        let btf = Btf::from_sys_fs().map_err(EbpfError::AyaBtf)?;
        let mut statuses = Vec::new();

        // Scheduling: required.
        // With the scheduler's stamps nothing runs on a wakeup.
        let stamps_wakeups = |n: &&str| sched.enabled == 0 || !WAKEUP_PROGRAMS.contains(n);
        for name in SCHED_PROGRAMS
            .into_iter()
            .filter(|n| sel.wants(n))
            .filter(stamps_wakeups)
        {
            attach_btf(&mut ebpf, name, &btf)?;
        }
        statuses.push(up("runqueue"));

        // Process tree: optional; without it forked processes are found by /proc scans.
        let proc_result: Result<(), EbpfError> = PROC_PROGRAMS
            .into_iter()
            .filter(|n| sel.wants(n))
            .try_for_each(|name| attach_btf(&mut ebpf, name, &btf));
        statuses.push(match proc_result {
            Ok(()) => up("process"),
            Err(e) => {
                let reason = crate::error_chain(&e);
                log::warn!("process-tree probes down (forked processes found by /proc scans only): {reason}");
                down("process", reason)
            }
        });

        // TCP: optional.
        let net_up = if !settings.net {
            statuses.push(down(
                "tcp",
                "disabled in config (probes.tcp.enabled = false)".into(),
            ));
            false
        } else {
            let attached = sock.map(|_| ()).and_then(|()| {
                NET_PROGRAMS
                    .into_iter()
                    .filter(|n| sel.wants(n))
                    .try_for_each(|name| attach_btf(&mut ebpf, name, &btf))
                    .map_err(|e| crate::error_chain(&e))
            });
            match attached {
                Ok(()) => {
                    statuses.push(up("tcp"));
                    true
                }
                Err(reason) => {
                    log::warn!("TCP probes down: {reason}");
                    statuses.push(down("tcp", reason));
                    false
                }
            }
        };

        let threads = take_map(&mut ebpf, "THREADS")?;
        let conns = if net_up {
            Some(take_map(&mut ebpf, "CONNS")?)
        } else {
            None
        };
        let tracked = take_map(&mut ebpf, "TRACKED")?;
        let mut rings = Vec::new();
        for name in ["RUNQ_EVENTS", "PROC_EVENTS", "NET_EVENTS"] {
            let map = take_map(&mut ebpf, name)?;
            rings.push(RingBuf::try_from(map).map_err(|source| EbpfError::Map { name, source })?);
        }
        let counters = take_map(&mut ebpf, "COUNTERS")?;
        let counters = PerCpuArray::try_from(counters).map_err(|source| EbpfError::Map {
            name: "COUNTERS",
            source,
        })?;
        let mut probes = Self {
            ebpf: Some(ebpf),
            threads,
            conns,
            tracked,
            rings,
            counters,
            statuses,
            filtered: settings.targets.is_some(),
            batch_ok: true,
            scheduler_stamps: sched.enabled != 0,
        };
        if let Some(targets) = &settings.targets {
            // Fork following is attached first, so a process forked from here on is caught in
            // the kernel; the scan catches the descendants that already exist.
            let mut pids: BTreeSet<u32> = targets.iter().copied().collect();
            procfs::add_descendants(&mut pids);
            probes.track(pids)?;
        }
        Ok(probes)
    }

    /// Whether only the job's processes are followed.
    pub fn filtered(&self) -> bool {
        self.filtered
    }

    /// The state of each family.
    pub fn statuses(&self) -> &[ProbeStatus] {
        &self.statuses
    }

    /// Adds processes to the job (no effect in whole-node mode).
    pub fn track(&mut self, pids: impl IntoIterator<Item = u32>) -> Result<(), EbpfError> {
        let map_err = |source| EbpfError::Map {
            name: "TRACKED",
            source,
        };
        let mut tracked: HashMap<&mut MapData, u32, u32> =
            HashMap::try_from(&mut self.tracked).map_err(map_err)?;
        for pid in pids {
            match tracked.insert(pid, 0, 0) {
                Ok(()) => {}
                // Full: counted like the kernel's own misses, the rest of the job still works.
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::E2BIG) =>
                {
                    log::warn!("TRACKED map full: process {pid} not followed");
                }
                Err(e) => return Err(map_err(e)),
            }
        }
        Ok(())
    }

    /// Removes processes that no longer exist from the job's set.
    pub fn untrack(&mut self, pids: impl IntoIterator<Item = u32>) -> Result<(), EbpfError> {
        let map_err = |source| EbpfError::Map {
            name: "TRACKED",
            source,
        };
        let mut tracked: HashMap<&mut MapData, u32, u32> =
            HashMap::try_from(&mut self.tracked).map_err(map_err)?;
        for pid in pids {
            match tracked.remove(&pid) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(e)),
            }
        }
        Ok(())
    }

    /// The job's process set in the kernel.
    pub fn tracked(&self) -> Result<Vec<u32>, EbpfError> {
        let tracked: HashMap<&MapData, u32, u32> =
            HashMap::try_from(&self.tracked).map_err(|source| EbpfError::Map {
                name: "TRACKED",
                source,
            })?;
        tracked
            .keys()
            .collect::<Result<_, _>>()
            .map_err(|source| EbpfError::Map {
                name: "TRACKED",
                source,
            })
    }

    /// Drains the rings, reads every thread and connection entry and the counters, and frees the
    /// entries of exited threads and closed connections (read here for the last time).
    pub fn read(&mut self) -> Result<EbpfRead, EbpfError> {
        let mut out = EbpfRead::default();
        for ring in &mut self.rings {
            while let Some(item) = ring.next() {
                out.records.push(item.to_vec());
            }
        }

        let entries: Vec<(u32, ThreadStats)> =
            read_all(&self.threads, "THREADS", &mut self.batch_ok)?;
        out.threads = entries
            .into_iter()
            .map(|(tid, stats)| ThreadRead { tid, stats })
            .collect();
        let exited = out
            .threads
            .iter()
            .filter(|r| r.stats.flags & THREAD_EXITED != 0)
            .map(|r| r.tid);
        remove_keys::<u32, ThreadStats>(&mut self.threads, "THREADS", exited)?;

        if let Some(conns) = self.conns.as_mut() {
            let entries: Vec<(u64, ConnStats)> = read_all(conns, "CONNS", &mut self.batch_ok)?;
            out.conns = entries
                .into_iter()
                .map(|(sk, stats)| ConnRead { sk, stats })
                .collect();
            let closed = out
                .conns
                .iter()
                .filter(|c| c.stats.flags & CONN_CLOSED != 0)
                .map(|c| c.sk);
            remove_keys::<u64, ConnStats>(conns, "CONNS", closed)?;
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

fn attach_btf(ebpf: &mut Ebpf, name: &'static str, btf: &Btf) -> Result<(), EbpfError> {
    let program: &mut BtfTracePoint = ebpf
        .program_mut(name)
        .ok_or(EbpfError::MissingProgram { name })?
        .try_into()
        .map_err(|source| EbpfError::Program { name, source })?;
    program
        .load(name, btf)
        .map_err(|source| EbpfError::Program { name, source })?;
    program
        .attach()
        .map_err(|source| EbpfError::Program { name, source })?;
    Ok(())
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, EbpfError> {
    ebpf.take_map(name).ok_or(EbpfError::MissingMap { name })
}

fn map_data<'a>(map: &'a Map, name: &'static str) -> Result<&'a MapData, EbpfError> {
    match map {
        Map::HashMap(d) => Ok(d),
        _ => Err(EbpfError::MissingMap { name }),
    }
}

/// Every entry of a hash map: batched when the kernel allows (`batch_ok` is cleared the first
/// time it does not), else key by key.
fn read_all<K: aya::Pod + Ord, V: aya::Pod>(
    map: &Map,
    name: &'static str,
    batch_ok: &mut bool,
) -> Result<Vec<(K, V)>, EbpfError> {
    if *batch_ok {
        match batch::lookup_all::<K, V>(map_data(map, name)?.fd().as_fd()) {
            Ok(v) => return Ok(v),
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                log::info!("no batched map reads on this kernel; reading key by key");
                *batch_ok = false;
            }
            Err(e) => {
                return Err(EbpfError::Map {
                    name,
                    source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                        call: "bpf_map_lookup_batch",
                        io_error: e,
                    }),
                })
            }
        }
    }
    let map_err = |source| EbpfError::Map { name, source };
    let m: HashMap<&MapData, K, V> = HashMap::try_from(map).map_err(map_err)?;
    let keys: Vec<K> = m.keys().collect::<Result<_, _>>().map_err(map_err)?;
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        match m.get(&k, 0) {
            Ok(v) => out.push((k, v)),
            Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(map_err(e)),
        }
    }
    Ok(out)
}

fn remove_keys<K: aya::Pod, V: aya::Pod>(
    map: &mut Map,
    name: &'static str,
    keys: impl Iterator<Item = K>,
) -> Result<(), EbpfError> {
    let map_err = |source| EbpfError::Map { name, source };
    let mut m: HashMap<&mut MapData, K, V> = HashMap::try_from(map).map_err(map_err)?;
    for k in keys {
        match m.remove(&k) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(map_err(e)),
        }
    }
    Ok(())
}
