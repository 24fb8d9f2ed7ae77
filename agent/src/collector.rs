//! The collection loop: on each tick, read the sources, fold what they returned into the core's
//! tables and publish one immutable [`Snapshot`]. Runs on its own thread so that map and file
//! reads never stall the async runtime that serves exporters.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use slo_probe_common::{decode, AnyRecord, Counter};
use slo_probe_core::{
    host,
    net::{ConnRead, ConnTable},
    occupancy::SmLimits,
    pipeline::{PipelineSettings, Pipelines},
    proctree::ProcessTree,
    roles::{Role, RoleRules},
    snapshot::{AgentStats, OutlierLog, ProbeStatus, Snapshot},
    threads::ThreadTable,
};
use tokio::sync::watch;

use crate::{
    config::Config,
    sources::{
        cgroup::{self, CgroupMounts},
        ebpf::{EbpfError, EbpfSettings, Probes},
        nvml::{NvmlSampler, NvmlThread},
        procfs,
        shim::ShimSource,
        started_or, Down, Source,
    },
};

/// The eBPF families, in the order the probe list shows them.
const EBPF_FAMILIES: [&str; 3] = ["runqueue", "process", "tcp"];

/// What a process's host samples are recorded as, after its pid, in `shim.record_dir` (beside
/// its GPU records `<pid>.bin`).
pub const HOST_RECORDING: &str = ".host.jsonl";

/// How many recent outliers a snapshot carries.
const RECENT_OUTLIERS: usize = 64;
/// Ticks between rescans of target cgroups and clean-ups of the kernel's process set.
const RESCAN_TICKS: u64 = 5;

/// Why the collector cannot start.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    /// The eBPF probes are enabled but cannot load.
    #[error(transparent)]
    Ebpf(#[from] EbpfError),
    /// The SLO tree of the config is invalid.
    #[error("invalid [slo] configuration")]
    Slo(#[from] slo_probe_core::slo::SloSpecError),
    /// The shim socket is another agent's, or not a socket.
    #[error(transparent)]
    Shim(#[from] crate::sources::shim::ShimError),
}

/// Reads the sources and builds snapshots.
pub struct Collector {
    probes: Option<Probes>,
    /// Why the eBPF families are down when `probes` is `None`.
    probes_down: Down,
    tree: ProcessTree,
    threads: ThreadTable,
    conns: ConnTable,
    outliers: OutlierLog,
    rules: RoleRules,
    cgroups: Option<CgroupMounts>,
    /// cgroup membership of the processes in scope, read once per process.
    cgroup_members: BTreeMap<u32, Vec<procfs::CgroupLine>>,
    target_cgroups: Vec<String>,
    decode_failed: u64,
    last_counters: [u64; Counter::COUNT as usize],
    ticks: u64,
    retention_ticks: u64,
    /// One GPU pipeline per training process: the shim source pushes records, the collector
    /// host samples; the snapshot reads them.
    pipelines: Arc<Mutex<Pipelines>>,
    /// How long a finished training process stays in snapshots, ns.
    retention_ns: u64,
    /// `shim.record_dir`: host samples are recorded beside each process's GPU records.
    record_dir: Option<std::path::PathBuf>,
    /// The healers' views, once the healer runs.
    healers: Option<crate::healer::Views>,
    shim: Option<ShimSource>,
    shim_down: Down,
    nvml: Option<NvmlThread>,
    nvml_down: Down,
}

impl Collector {
    /// Loads the probes the config enables, following the job `config.target` names, or the
    /// whole node unless `job_only` (then only roots added later with [`Collector::add_root`]
    /// are followed). With `no_ebpf`, or the scheduling probes disabled in the config, no eBPF
    /// is loaded and the snapshot says why. Probes that are enabled but cannot load are an error.
    pub fn new(config: &Config, no_ebpf: bool, job_only: bool) -> Result<Self, CollectorError> {
        let rq = &config.probes.runqueue;
        let mut roots: BTreeSet<u32> = config.target.pids.iter().copied().collect();
        let mounts = CgroupMounts::detect();
        roots.extend(cgroup_pids(&mounts, &config.target.cgroups));
        let targets =
            (job_only || config.target.is_set()).then(|| roots.iter().copied().collect::<Vec<_>>());
        let (probes, down_reason) = if no_ebpf {
            (None, "disabled by --no-ebpf".to_owned())
        } else if !rq.enabled {
            (
                None,
                "disabled in config (probes.runqueue.enabled = false)".to_owned(),
            )
        } else {
            let settings = EbpfSettings {
                outlier_threshold: Duration::from_micros(rq.outlier_threshold_us),
                max_threads: rq.max_threads,
                ring_bytes: rq.ring_buffer_kib * 1024,
                net: config.probes.tcp.enabled,
                max_conns: config.probes.tcp.max_connections,
                targets,
                wakeup_stamps: false,
            };
            (Some(Probes::load(&settings)?), String::new())
        };
        let record_dir = (!config.shim.record_dir.as_os_str().is_empty())
            .then(|| config.shim.record_dir.clone());
        if let Some(d) = &record_dir {
            if let Err(e) = std::fs::create_dir_all(d) {
                log::warn!("cannot create shim.record_dir {}: {e}", d.display());
            }
        }
        let (nvml, nvml_down) = if no_ebpf && !config.shim.enabled {
            (None, "off".to_owned())
        } else if !config.gpu.nvml {
            (None, "disabled in config (gpu.nvml = false)".to_owned())
        } else {
            match NvmlSampler::new() {
                Ok(n) => {
                    log::info!("{}", n.describe());
                    match NvmlThread::start(
                        n,
                        Duration::from_millis(config.gpu.sample_ms),
                        record_dir.as_deref(),
                    ) {
                        Ok(t) => (Some(t), String::new()),
                        Err(e) => {
                            let reason = format!("cannot start the NVML sampling thread: {e}");
                            log::warn!("{reason}");
                            (None, reason)
                        }
                    }
                }
                Err(e) => {
                    let reason = crate::error_chain(&e);
                    log::info!("{reason}");
                    (None, reason)
                }
            }
        };
        let mut settings =
            PipelineSettings::live(config.slo.clone(), config.tick().as_nanos() as u64);
        // Occupancy limits from the first GPU (nodes carry one GPU model).
        settings.limits = nvml
            .as_ref()
            .and_then(NvmlThread::latest)
            .and_then(|s| s.devices.first().and_then(|d| d.compute_capability))
            .and_then(|c| SmLimits::for_capability(c.major, c.minor));
        let pipelines = Arc::new(Mutex::new(Pipelines::new(settings)?));
        let (shim, shim_down) = if config.shim.enabled {
            let start = |socket: &Path| {
                ShimSource::start(
                    socket,
                    &config.shim.allowed_uids,
                    record_dir.clone(),
                    pipelines.clone(),
                    nvml.as_ref().map(NvmlThread::history),
                )
            };
            let started = match start(&config.shim.socket) {
                // `observe` beside an agent: its own shims get a socket of their own.
                Err(e) if e.is_conflict() && job_only => {
                    let own = std::env::temp_dir()
                        .join(format!("slo-probe-observe-{}", std::process::id()))
                        .join("shim.sock");
                    log::info!("{}; observe listens on {} instead", e, own.display());
                    start(&own)
                }
                other => other,
            };
            match started {
                Ok(s) => {
                    s.set_depth_on_demand(config.shim.depth_on_demand);
                    (Some(s), String::new())
                }
                // Two agents on one socket is a configuration error: stop before the probes.
                Err(e) if e.is_conflict() => return Err(e.into()),
                Err(e) => {
                    let reason = crate::error_chain(&e);
                    log::warn!("CUPTI shims cannot register: {reason}");
                    (None, reason)
                }
            }
        } else {
            (None, "disabled in config (shim.enabled = false)".to_owned())
        };
        let mut tree = ProcessTree::new();
        tree.set_roots(roots.iter().copied());
        let mut c = Self {
            probes,
            probes_down: Down::new(&EBPF_FAMILIES, down_reason),
            tree,
            threads: ThreadTable::new(config.retention_ticks()),
            conns: ConnTable::new(config.retention_ticks(), config.prometheus.max_connections),
            outliers: OutlierLog::new(RECENT_OUTLIERS),
            rules: config.roles.rules(),
            cgroups: config.probes.cgroup.enabled.then_some(mounts),
            cgroup_members: BTreeMap::new(),
            target_cgroups: config.target.cgroups.clone(),
            decode_failed: 0,
            last_counters: [0; Counter::COUNT as usize],
            ticks: 0,
            retention_ticks: config.retention_ticks(),
            pipelines,
            retention_ns: config.agent.retention_s.saturating_mul(1_000_000_000),
            record_dir,
            healers: None,
            shim,
            shim_down: Down::new(&["shim"], shim_down),
            nvml,
            nvml_down: Down::new(&["nvml"], nvml_down),
        };
        c.scan_processes();
        Ok(c)
    }

    /// The CUPTI shims' source, when listening.
    pub fn shim(&self) -> Option<&ShimSource> {
        self.shim.as_ref()
    }

    /// Samples the GPUs once more, then drains every shim and completes its pending iterations
    /// (the end of `observe`: the last iterations get a sample after their end).
    pub fn finish_gpu(&self) {
        if let Some(n) = &self.nvml {
            n.sample_now();
        }
        if let Some(shim) = &self.shim {
            shim.finish();
        }
    }

    /// Whether the eBPF probes are loaded.
    pub fn ebpf_up(&self) -> bool {
        self.probes.is_some()
    }

    /// Adds a root process to the job while running (`observe` uses it for the command it
    /// starts). In whole-node mode this only marks the process as a root for role purposes.
    pub fn add_root(&mut self, pid: u32) -> Result<(), EbpfError> {
        let mut roots = self.tree.roots().clone();
        roots.insert(pid);
        self.tree.set_roots(roots);
        if let Some(p) = self.probes.as_mut() {
            if p.filtered() {
                let mut pids = BTreeSet::from([pid]);
                procfs::add_descendants(&mut pids);
                p.track(pids)?;
            }
        }
        self.scan_processes();
        Ok(())
    }

    /// Records what `/proc` says about the job's processes (names, parents), and puts the
    /// descendants that the kernel's fork following missed into its process set.
    fn scan_processes(&mut self) {
        let all = procfs::scan();
        for p in &all {
            self.tree.observe(p.pid, p.ppid, &p.name);
        }
        self.tree.mark_missing(&all.iter().map(|p| p.pid).collect());
        if let Some(probes) = self.probes.as_mut().filter(|p| p.filtered()) {
            let job = self.tree.job_pids();
            if let Err(e) = probes.track(job) {
                log::warn!("{}", crate::error_chain(&e));
            }
        }
    }

    /// Puts the healers' views into every snapshot from now on.
    pub fn set_healer_views(&mut self, views: crate::healer::Views) {
        self.healers = Some(views);
    }

    /// Reads every source once and returns the snapshot.
    pub fn tick(&mut self) -> Snapshot {
        self.ticks += 1;
        let now = slo_probe_common::host::monotonic_ns();
        let rescan = self.ticks % RESCAN_TICKS == 0;
        if rescan && !self.target_cgroups.is_empty() {
            if let Some(m) = &self.cgroups {
                let pids = cgroup_pids(m, &self.target_cgroups);
                let mut roots = self.tree.roots().clone();
                if pids.iter().any(|p| roots.insert(*p)) {
                    self.tree.set_roots(roots);
                }
            }
        }

        let mut statuses: Vec<ProbeStatus> = Vec::new();
        let mut threads = None;
        let mut net = None;
        let mut conn_reads = Vec::new();
        let mut closed_conns = Vec::new();
        let mut thread_reads = Vec::new();
        let mut ebpf_ok = false;
        statuses.extend(started_or(&self.probes, &self.probes_down).health());
        if let Some(probes) = self.probes.as_mut() {
            match probes.read() {
                Ok(read) => {
                    ebpf_ok = true;
                    for bytes in &read.records {
                        match decode(bytes) {
                            Ok((AnyRecord::RunqLatency(r), _)) => self.outliers.push(&r),
                            Ok((AnyRecord::ProcessEvent(e), _)) => self.tree.apply_event(&e),
                            Ok((AnyRecord::TcpRetransmit(r), _)) => self.conns.push_record(&r),
                            Ok((AnyRecord::ConnClosed(r), _)) => closed_conns.push(ConnRead {
                                sk: r.skaddr,
                                stats: r.stats,
                            }),
                            Ok((other, _)) => {
                                // GPU records come through the shim source, never the kernel.
                                self.decode_failed += 1;
                                log::warn!("unexpected record from the kernel: {other:?}");
                            }
                            Err(e) => {
                                self.decode_failed += 1;
                                log::warn!("dropped a malformed record: {e}");
                            }
                        }
                    }
                    let lost_events = read.counters[Counter::EventRingFull as usize]
                        > self.last_counters[Counter::EventRingFull as usize];
                    let proc_down = statuses.iter().any(|s| s.name == "process" && !s.up);
                    self.last_counters = read.counters;
                    thread_reads = read.threads;
                    conn_reads = read.conns;
                    if rescan || lost_events || proc_down {
                        self.scan_processes();
                    }
                }
                Err(e) => {
                    // Keep the agent up and say why the numbers stopped moving.
                    let reason = crate::error_chain(&e);
                    log::warn!("{reason}");
                    for s in statuses.iter_mut() {
                        s.up = false;
                        s.reason.clone_from(&reason);
                    }
                }
            }
        }
        self.tree.tick(self.retention_ticks);

        if ebpf_ok {
            let snap = self
                .threads
                .apply(now, &thread_reads, &self.tree, &self.rules);
            if self
                .probes
                .as_ref()
                .is_some_and(|p| p.statuses().iter().any(|s| s.name == "tcp" && s.up))
            {
                let tree = &self.tree;
                net = Some(
                    self.conns
                        .apply(&conn_reads, &closed_conns, Some(&snap), |pid| {
                            tree.in_job(pid)
                        }),
                );
                self.conns.prune(|pid| snap.process(pid).is_some());
            }
            if rescan {
                self.untrack_gone();
            }
            threads = Some(snap);
        }

        let mut cgroups = Vec::new();
        let mut pressure = Vec::new();
        if let Some(m) = &self.cgroups {
            let mut roles: BTreeMap<u32, BTreeSet<Role>> = BTreeMap::new();
            // The job's processes: those the tree knows (some may not have run since attach)
            // and those with threads in the table (recently exited ones too).
            let mut pids = self.tree.job_pids();
            if let Some(t) = &threads {
                for g in &t.groups {
                    roles.entry(g.pid).or_default().insert(g.role);
                }
                pids.extend(t.processes.iter().map(|p| p.pid));
            }
            self.cgroup_members.retain(|pid, _| pids.contains(pid));
            for pid in pids {
                if let std::collections::btree_map::Entry::Vacant(e) =
                    self.cgroup_members.entry(pid)
                {
                    let lines = procfs::cgroups(pid);
                    if !lines.is_empty() {
                        e.insert(lines);
                    }
                }
            }
            cgroups = m.read(&self.cgroup_members, &roles);
            pressure = cgroup::system_pressure();
            statuses.push(ProbeStatus {
                name: "cgroup",
                up: m.v1_cpu.is_some() || m.v2.is_some(),
                reason: if m.v1_cpu.is_some() || m.v2.is_some() {
                    String::new()
                } else {
                    "no cgroup v1 cpu or v2 hierarchy mounted".to_owned()
                },
            });
            statuses.push(ProbeStatus {
                name: "pressure",
                up: !pressure.is_empty(),
                reason: if pressure.is_empty() {
                    "no /proc/pressure: the kernel lacks CONFIG_PSI or boots with psi=0".to_owned()
                } else {
                    String::new()
                },
            });
        }

        // Each training process's part of the job (the process and its descendants), for its
        // SLO engine's host nodes; then what every pipeline shows now.
        let processes = match self.pipelines.lock() {
            Ok(mut pipelines) => {
                let mut job: BTreeSet<u32> = self.tree.job_pids();
                if let Some(t) = &threads {
                    job.extend(t.processes.iter().map(|p| p.pid));
                }
                for pid in pipelines.pids() {
                    let mine: BTreeSet<u32> = job
                        .iter()
                        .copied()
                        .filter(|&p| self.tree.descends_from(p, pid))
                        .chain([pid])
                        .collect();
                    let sample =
                        host::sample_of(&mine, now, threads.as_ref(), net.as_ref(), &cgroups);
                    if let Some(d) = &self.record_dir {
                        crate::sources::append_json_line(
                            &d.join(format!("{pid}{HOST_RECORDING}")),
                            &sample,
                        );
                    }
                    pipelines.push_host(pid, sample);
                }
                let retired = pipelines.retire(self.retention_ns);
                for pid in &retired {
                    log::info!(
                        "training process {pid} ended more than agent.retention_s ago: dropped"
                    );
                }
                if !retired.is_empty() {
                    crate::release_memory();
                }
                pipelines.snapshot()
            }
            Err(_) => Vec::new(),
        };
        let gpus = self.nvml.as_ref().and_then(NvmlThread::latest);
        statuses.extend(started_or(&self.nvml, &self.nvml_down).health());
        statuses.extend(started_or(&self.shim, &self.shim_down).health());
        let mut counters = self.last_counters;
        counters[Counter::DecodeFailed as usize] +=
            self.decode_failed + processes.iter().map(|s| s.decode_failed).sum::<u64>();
        let outliers = match &threads {
            Some(t) => self.outliers.snapshot(|pid| t.process(pid).is_some()),
            None => self.outliers.snapshot(|_| true),
        };
        Snapshot {
            taken_at_ns: now,
            threads,
            outliers,
            net,
            cgroups,
            pressure,
            processes,
            stragglers: Vec::new(),
            counters,
            probes: statuses,
            agent: AgentStats {
                cpu_seconds: self_cpu_seconds(),
                resident_bytes: self_resident_bytes(),
                ticks: self.ticks,
            },
            gpus,
            shim_refused: self
                .shim
                .as_ref()
                .map(ShimSource::refused)
                .unwrap_or_default(),
            healers: self
                .healers
                .as_ref()
                .and_then(|v| v.lock().ok().map(|v| v.clone()))
                .unwrap_or_default(),
        }
        .derive()
    }

    /// Stops every source (the agent's shutdown): the eBPF programs detach, the shim and NVML
    /// threads end; the pipelines keep what they hold for a last snapshot.
    pub fn stop(&mut self) {
        let sources: [Option<&mut dyn Source>; 3] = [
            self.probes.as_mut().map(|s| s as &mut dyn Source),
            self.shim.as_mut().map(|s| s as &mut dyn Source),
            self.nvml.as_mut().map(|s| s as &mut dyn Source),
        ];
        for s in sources.into_iter().flatten() {
            s.stop();
        }
    }

    /// Removes processes that no longer exist from the kernel's process set.
    fn untrack_gone(&mut self) {
        let Some(p) = self.probes.as_mut().filter(|p| p.filtered()) else {
            return;
        };
        match p.tracked() {
            Ok(pids) => {
                let gone: Vec<u32> = pids
                    .into_iter()
                    .filter(|pid| !Path::new(&format!("/proc/{pid}")).exists())
                    .collect();
                if let Err(e) = p.untrack(gone) {
                    log::warn!("{}", crate::error_chain(&e));
                }
            }
            Err(e) => log::warn!("{}", crate::error_chain(&e)),
        }
    }
}

/// Processes in the target cgroups now (`cgroup.procs` under the v2 mount, else the v1 cpu one).
fn cgroup_pids(mounts: &CgroupMounts, paths: &[String]) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for path in paths {
        let rel = path.trim_start_matches('/');
        let found = [&mounts.v2, &mounts.v1_cpu]
            .into_iter()
            .flatten()
            .find_map(|root| std::fs::read_to_string(root.join(rel).join("cgroup.procs")).ok());
        match found {
            Some(text) => out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok())),
            None => log::warn!(
                "target cgroup {path} not found under {:?} or {:?}",
                mounts.v2,
                mounts.v1_cpu
            ),
        }
    }
    out
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
