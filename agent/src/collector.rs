//! The collection loop: on each tick, read the sources, fold what they returned into the core's
//! tables and publish one immutable [`Snapshot`]. Runs on its own thread so that map reads (a
//! syscall per entry) never stall the async runtime that serves exporters.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use slo_probe_common::{decode, AnyRecord, Counter};
use slo_probe_core::{
    runq::RunqTable,
    snapshot::{AgentStats, OutlierLog, ProbeStatus, Snapshot},
};
use tokio::sync::watch;

use crate::{
    config::Config,
    sources::ebpf::{EbpfError, SchedProbe, SchedSettings},
};

/// How many recent outliers a snapshot carries.
const RECENT_OUTLIERS: usize = 64;

/// Reads the sources and builds snapshots.
pub struct Collector {
    sched: Option<SchedProbe>,
    status: ProbeStatus,
    table: RunqTable,
    outliers: OutlierLog,
    decode_failed: u64,
    last_kernel_counters: [u64; Counter::COUNT as usize],
    ticks: u64,
}

impl Collector {
    /// Loads the probes the config enables. With `no_ebpf`, or the run-queue probe disabled in
    /// the config, nothing is loaded and the snapshot says why. A probe that is enabled but
    /// cannot load is an error: the caller decides whether to stop or go on without it.
    pub fn new(config: &Config, no_ebpf: bool) -> Result<Self, EbpfError> {
        let rq = &config.probes.runqueue;
        let (sched, status) = if no_ebpf {
            (None, down("disabled by --no-ebpf"))
        } else if !rq.enabled {
            (
                None,
                down("disabled in config (probes.runqueue.enabled = false)"),
            )
        } else {
            let settings = SchedSettings {
                outlier_threshold: Duration::from_micros(rq.outlier_threshold_us),
                max_threads: rq.max_threads,
                ring_bytes: rq.ring_buffer_kib * 1024,
            };
            let probe = SchedProbe::load(&settings)?;
            (
                Some(probe),
                ProbeStatus {
                    name: "runqueue",
                    up: true,
                    reason: String::new(),
                },
            )
        };
        Ok(Self {
            sched,
            status,
            table: RunqTable::new(config.retention_ticks()),
            outliers: OutlierLog::new(RECENT_OUTLIERS),
            decode_failed: 0,
            last_kernel_counters: [0; Counter::COUNT as usize],
            ticks: 0,
        })
    }

    /// Whether the run-queue probe is attached.
    pub fn ebpf_up(&self) -> bool {
        self.sched.is_some()
    }

    /// Reads every source once and returns the snapshot.
    pub fn tick(&mut self) -> Snapshot {
        self.ticks += 1;
        let now = monotonic_ns();
        let mut runq = None;
        if let Some(probe) = self.sched.as_mut() {
            match probe.read() {
                Ok(read) => {
                    for bytes in &read.outliers {
                        match decode(bytes) {
                            Ok((AnyRecord::RunqLatency(r), _)) => self.outliers.push(&r),
                            Err(e) => {
                                self.decode_failed += 1;
                                log::warn!("dropped a malformed outlier record: {e}");
                            }
                        }
                    }
                    self.last_kernel_counters = read.counters;
                    runq = Some(self.table.apply(now, &read.threads));
                }
                Err(e) => {
                    // Keep the agent up and say why the numbers stopped moving.
                    log::warn!("{}", crate::error_chain(&e));
                    self.status.up = false;
                    self.status.reason = e.to_string();
                }
            }
        }
        let mut counters = self.last_kernel_counters;
        counters[Counter::DecodeFailed as usize] += self.decode_failed;
        let outliers = match &runq {
            Some(r) => self.outliers.snapshot(|pid| r.process(pid).is_some()),
            None => self.outliers.snapshot(|_| true),
        };
        Snapshot {
            taken_at_ns: now,
            runq,
            outliers,
            counters,
            probes: vec![self.status.clone()],
            agent: AgentStats {
                cpu_seconds: self_cpu_seconds(),
                resident_bytes: self_resident_bytes(),
                ticks: self.ticks,
            },
        }
    }
}

fn down(reason: &str) -> ProbeStatus {
    ProbeStatus {
        name: "runqueue",
        up: false,
        reason: reason.to_owned(),
    }
}

/// Runs `collector` on its own thread, publishing a snapshot every `tick` until `stop` is set;
/// then publishes a final snapshot and returns the collector (dropping it detaches the probes).
pub fn spawn(
    mut collector: Collector,
    tick: Duration,
    tx: watch::Sender<Arc<Snapshot>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<thread::JoinHandle<Collector>> {
    thread::Builder::new()
        .name("slo-collector".to_owned())
        .spawn(move || {
            let mut next = Instant::now();
            loop {
                tx.send_replace(Arc::new(collector.tick()));
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                next += tick;
                // Sleep in short steps so that a stop request is honoured quickly.
                while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                    thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
                }
                if stop.load(Ordering::Relaxed) {
                    tx.send_replace(Arc::new(collector.tick()));
                    break;
                }
            }
            collector
        })
}

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns` and of the shim's timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn self_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: getrusage succeeded and filled it.
    let u = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn self_resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    pages * page
}
