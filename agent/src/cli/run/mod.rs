//! `slo-probe run [-o REPORT] [--heal shadow|on] -- CMD ARGS`: runs a training command the way
//! `perf record` or `nsys profile` do, measures it, and writes a report when it ends.
//!
//! The command comes first: its stdout and stderr are the terminal's (inherited, never piped),
//! its exit status is this command's (a command killed by a signal makes `run` re-raise that
//! signal), and nothing that goes wrong with measuring or the report changes either.
//!
//! - Agent: the one already listening at `prometheus.listen` (its state API answers), else one
//!   in this process following only the command's process tree (eBPF when allowed, else
//!   without) with a private shim socket; with `--listen ADDR` always the latter, serving
//!   metrics and the state API at `ADDR` while the command runs.
//! - Shim: `CUDA_INJECTION64_PATH` names `libslo_probe_cupti.so` next to this binary (or
//!   `shim.library`); a path the user set already is kept, with a warning.
//! - Python: `PYTHONPATH` starts with the bootstrap of [`super::python_boot`] (automatic step
//!   markers for a script without `slo_probe.step()`, one per `optimizer.step()`), unless
//!   `--no-auto-steps` or `--no-gpu`.
//! - Signals: the command stays in this process group, so a terminal's Ctrl-C (or Ctrl-\)
//!   reaches it once, from the terminal, and is not forwarded. INT, TERM, HUP, QUIT, USR1 and
//!   USR2 sent to this process by another one are forwarded. After INT, TERM, HUP or QUIT the
//!   command gets `--kill-after` seconds, then SIGKILL with its descendants.
//! - Healer: an in-process agent runs the healer in `--heal`'s mode, else in the config's
//!   `heal.mode` but never more than `shadow` (a run acts only when asked to), over the
//!   config's `heal.journal`; a journal it cannot use, or one that another running agent's
//!   healer owns, leaves the run without a healer (said, and noted in the report), never
//!   fails it. When the command ends the healer takes one more snapshot (undoing what it had in
//!   force for the command's processes, which are gone) and stops. An external agent heals
//!   with its own `heal.mode`: `--heal` does not change it.
//! - Report: JSON and a text summary, written to a temporary file and renamed; by default
//!   `slo-probe-<host>-<n>.json` (and `.txt`) in the current directory with the first free `n`.
//!   Its own lines go to stderr prefixed `slo-probe:`. The report is in [`report`].

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use libc::c_int;
use serde::{Deserialize, Serialize};
use slo_probe_core::{healer::HealerView, snapshot::Snapshot as CoreSnapshot};
use tokio::sync::watch;

pub mod report;

use report::ReportTarget;
pub use report::{summary, text, Exit, ReportError, RunReport, REPORT_VERSION};

use super::{
    observe::{spawn_held, Inject},
    python_boot::PythonBoot,
};
use crate::{
    api::{
        client::Endpoint,
        convert,
        types::{self, Snapshot},
        Api,
    },
    collector::{self, Collector},
    config::{self, Config, HealConfig},
    exporters::prometheus::PrometheusServer,
    healer::{self, journal},
    sources::procfs,
};

/// Default of `--kill-after`: what torchrun gives its workers.
pub const DEFAULT_KILL_AFTER_S: f64 = 30.0;
/// How long `run` waits for an agent's API to answer when looking for one.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// How often the command's process tree is read (to know its processes in a node-wide agent).
const SCAN_EVERY: Duration = Duration::from_secs(1);
/// How often `run` looks at the command and at the signals it received.
const POLL: Duration = Duration::from_millis(50);
/// How often an in-process healer's views are copied for the report (a job's view leaves them
/// at the healer's first tick after the job ended).
const HEAL_VIEWS_EVERY: Duration = Duration::from_millis(200);
/// How long the end of a run waits for its healer's last tick (undoing what it had in force).
const HEAL_FINISH: Duration = Duration::from_secs(5);

/// What the healer may do during the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HealMode {
    /// Decide and record, change nothing.
    Shadow,
    /// Act, verify and roll back.
    On,
}

impl HealMode {
    /// `shadow` or `on`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shadow => "shadow",
            Self::On => "on",
        }
    }
}

/// The mode of an in-process agent's healer: `--heal`, else the config's `heal.mode` capped at
/// `shadow` (without `--heal on` a run never acts).
pub fn heal_mode(flag: Option<HealMode>, configured: config::HealMode) -> config::HealMode {
    match (flag, configured) {
        (Some(HealMode::On), _) => config::HealMode::On,
        (Some(HealMode::Shadow), _) | (None, config::HealMode::On) => config::HealMode::Shadow,
        (None, mode) => mode,
    }
}

/// Errors that stop `run` before the command starts (once it runs, nothing stops it).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `-o` names a file that exists.
    #[error("{path} exists; choose another report name with -o or pass --force-overwrite")]
    ReportExists {
        /// The file.
        path: String,
    },
    /// The signal handlers could not be installed.
    #[error("cannot install the signal handlers that forward signals to the command")]
    Signals(#[source] std::io::Error),
}

/// `run`'s settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// The configuration (agent settings, shim library, SLO tree).
    pub config: Config,
    /// `-o`: the report's file.
    pub output: Option<PathBuf>,
    /// Replace an existing report.
    pub force_overwrite: bool,
    /// `--heal`.
    pub heal: Option<HealMode>,
    /// Time between a stop signal and SIGKILL.
    pub kill_after: Duration,
    /// Do not load eBPF programs in an in-process agent.
    pub no_ebpf: bool,
    /// Start an agent here (whatever runs at `prometheus.listen`) and serve metrics and the
    /// state API at this address while the command runs.
    pub listen: Option<SocketAddr>,
    /// Do not inject the shim.
    pub no_gpu: bool,
    /// Do not give a Python command the automatic step markers (`python_boot`).
    pub no_auto_steps: bool,
    /// The command.
    pub command: Vec<String>,
}

/// How the command ended, which `run` hands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Exit code.
    Exited(u8),
    /// Killed by this signal: re-raise it.
    Signalled(c_int),
}

// ---------------------------------------------------------------------------------------------
// Signals.

/// Signals `run` catches, forwards (when another process sent them) and reports.
const CAUGHT: [c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];
/// Per caught signal: how many came from another process (`kill`), how many from the kernel
/// (a terminal's Ctrl-C, Ctrl-\, hang-up).
static FROM_PROCESS: [AtomicU32; CAUGHT.len()] = [const { AtomicU32::new(0) }; CAUGHT.len()];
static FROM_KERNEL: [AtomicU32; CAUGHT.len()] = [const { AtomicU32::new(0) }; CAUGHT.len()];
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn install_signal_handlers() -> std::io::Result<()> {
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    for (k, &sig) in CAUGHT.iter().enumerate() {
        // SAFETY: the action only does atomic adds, which are async-signal-safe.
        unsafe {
            signal_hook_registry::register_sigaction(sig, move |info: &libc::siginfo_t| {
                // si_code > 0: sent by the kernel (the terminal's line discipline sends
                // SI_KERNEL); <= 0: by a process (SI_USER, SI_QUEUE, SI_TKILL).
                let slot = if info.si_code > 0 {
                    &FROM_KERNEL[k]
                } else {
                    &FROM_PROCESS[k]
                };
                slot.fetch_add(1, Ordering::SeqCst);
            })?;
        }
    }
    Ok(())
}

/// Signals received since the last call: (signal, sent by the kernel).
fn take_signals() -> Vec<(c_int, bool)> {
    let mut out = Vec::new();
    for (k, &sig) in CAUGHT.iter().enumerate() {
        for _ in 0..FROM_KERNEL[k].swap(0, Ordering::SeqCst) {
            out.push((sig, true));
        }
        for _ in 0..FROM_PROCESS[k].swap(0, Ordering::SeqCst) {
            out.push((sig, false));
        }
    }
    out
}

/// `SIGINT` for 2, ...
pub fn signal_name(sig: c_int) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

fn is_stop_signal(sig: c_int) -> bool {
    matches!(
        sig,
        libc::SIGINT | libc::SIGTERM | libc::SIGHUP | libc::SIGQUIT
    )
}

/// Ends this process with `sig` the way the command ended (so that a shell sees the same), as
/// `perf record` does: default action restored, no core file of our own. Returns only if the
/// signal did not end the process.
pub fn reraise(sig: c_int) -> u8 {
    // SAFETY: plain libc calls on our own process with valid arguments.
    unsafe {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    // A signal whose default is not to terminate: the shell convention.
    128u8.wrapping_add(sig as u8)
}

fn kill(pid: u32, sig: c_int) {
    // SAFETY: signalling a pid; a stale one fails harmlessly with ESRCH.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

// ---------------------------------------------------------------------------------------------
// The agent.

/// A collector in this process, following the command's tree only, and its healer.
struct InProcess {
    collector: Option<Collector>,
    handle: Option<JoinHandle<Collector>>,
    stop: Arc<AtomicBool>,
    /// Where the collector publishes (taken when it starts; the healer and the server read).
    publish: Option<watch::Sender<Arc<CoreSnapshot>>>,
    snapshots: watch::Receiver<Arc<CoreSnapshot>>,
    healer: Option<RunHealer>,
    tick: Duration,
    ctx: convert::Context,
    /// The private socket's folder, removed at the end.
    dir: PathBuf,
    /// `--listen`: where it serves metrics and the state API while the command runs.
    listen: Option<SocketAddr>,
    per_thread: bool,
    /// The server's runtime and its stop switch.
    server: Option<(tokio::runtime::Runtime, watch::Sender<bool>)>,
}

impl InProcess {
    /// Serves `/metrics` and `/api/v1` from `snapshots` at `--listen` (a failure is said and
    /// skipped: the command runs all the same).
    fn serve(&mut self, addr: SocketAddr, snapshots: watch::Receiver<Arc<CoreSnapshot>>) {
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("slo-io")
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                say(&format!(
                    "cannot start the server's runtime: {e}; not serving"
                ));
                return;
            }
        };
        let server = runtime.block_on(PrometheusServer::bind(addr, self.per_thread));
        match server {
            Ok(server) => {
                let server = server.with_api(Api::new(self.ctx.clone()));
                let shown = server.local_addr().map_or(addr, |a| a);
                say(&format!(
                    "serving the state API at http://{shown}/api/v1/snapshot while the command \
                     runs (slo-probe top --url http://{shown})"
                ));
                let (stop_tx, stop_rx) = watch::channel(false);
                runtime.spawn(server.serve(snapshots, stop_rx));
                self.server = Some((runtime, stop_tx));
            }
            Err(e) => say(&format!("{e}; not serving")),
        }
    }

    /// Follows the command from `pid` and starts ticking.
    fn start(&mut self, pid: u32) {
        let (Some(mut c), Some(tx)) = (self.collector.take(), self.publish.take()) else {
            return;
        };
        if let Err(e) = c.add_root(pid) {
            say(&format!(
                "cannot follow the command's processes in the kernel: {}",
                crate::error_chain(&e)
            ));
        }
        if let Some(addr) = self.listen {
            self.serve(addr, self.snapshots.clone());
        }
        match collector::spawn(c, self.tick, tx, self.stop.clone()) {
            Ok(h) => self.handle = Some(h),
            Err(e) => say(&format!(
                "cannot start the collector thread: {e}; no measurements"
            )),
        }
    }

    /// Stops ticking and the healer, and returns the final state; what the healer left in
    /// force goes into `notes`.
    fn finish(mut self, notes: &mut Vec<String>) -> Option<Snapshot> {
        if let Some(h) = self.healer.as_mut() {
            h.remember();
        }
        self.stop.store(true, Ordering::Relaxed);
        // The collector's last snapshot, after the command ended, closes the channel: the
        // healer takes it and stops.
        self.publish = None;
        let joined = self.handle.take().and_then(|h| h.join().ok());
        let seen = self.healer.take().map(|h| h.finish(notes));
        let mut c = joined?;
        c.finish_gpu();
        let mut s = c.tick();
        c.stop();
        if let Some((runtime, stop)) = self.server.take() {
            let _ = stop.send(true);
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        if let Some(seen) = seen {
            s.healers = with_ended_jobs(seen, std::mem::take(&mut s.healers));
        }
        Some(convert::snapshot(&s, &self.ctx))
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(h) = &self.healer {
            h.stop.store(true, Ordering::Relaxed);
        }
        // The private socket's folder, however the run ended.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An in-process agent's healer, and the latest view of every job it has seen.
struct RunHealer {
    handle: JoinHandle<()>,
    views: healer::Views,
    stop: Arc<AtomicBool>,
    journal: PathBuf,
    /// By job: a job's view leaves the healer's views once the job ended, and the report wants
    /// the timeline of every job of the run.
    seen: BTreeMap<u32, HealerView>,
    remembered: Instant,
}

impl RunHealer {
    /// Starts the healer in `heal.mode` on `snapshots`; `None` (with the reason said when
    /// `loud`, and noted) where it cannot run.
    fn start(
        heal: &HealConfig,
        snapshots: watch::Receiver<Arc<CoreSnapshot>>,
        shim: Box<dyn crate::healer::knobs::ShimControl>,
        loud: bool,
        notes: &mut Vec<String>,
    ) -> Option<Self> {
        let mode = heal.mode.as_str();
        let mut off = |why: String| {
            if loud {
                say(&format!("heal {mode}: {why}; running without healing"));
            }
            notes.push(format!("no healer (heal {mode}): {why}"));
        };
        if let Some(pid) = journal_owner(&heal.journal) {
            off(format!(
                "the healer of the slo-probe agent with pid {pid} uses heal.journal {} (a second \
                 healer would undo its actions); its heal.mode applies to the jobs it follows",
                heal.journal.display()
            ));
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        match healer::spawn(heal, snapshots, stop.clone(), shim) {
            Ok((handle, views)) => Some(Self {
                handle,
                views,
                stop,
                journal: heal.journal.clone(),
                seen: BTreeMap::new(),
                remembered: Instant::now(),
            }),
            Err(e) => {
                off(crate::error_chain(&e));
                None
            }
        }
    }

    /// Copies the healer's views (each job's latest).
    fn remember(&mut self) {
        self.remembered = Instant::now();
        if let Ok(views) = self.views.lock() {
            for v in views.iter() {
                self.seen.insert(v.job, v.clone());
            }
        }
    }

    /// Waits (at most [`HEAL_FINISH`]) for the healer to take the collector's last snapshot
    /// and stop, then stops it in any case; notes what this run's healer left in force.
    /// Returns the views seen.
    fn finish(mut self, notes: &mut Vec<String>) -> BTreeMap<u32, HealerView> {
        let deadline = Instant::now() + HEAL_FINISH;
        while !self.handle.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop.store(true, Ordering::Relaxed);
        if self.handle.join().is_err() {
            notes.push("the healer thread panicked".to_owned());
        }
        let left = left_in_force(&self.journal);
        if left > 0 {
            say(&format!(
                "the healer left {left} actions in force (a process of the command still \
                 runs?); `slo-probe heal undo` restores them"
            ));
            notes.push(format!(
                "the healer left {left} actions in force; `slo-probe heal undo` restores them"
            ));
        }
        std::mem::take(&mut self.seen)
    }
}

/// The healers' views at the end, with the last view seen of every job that ended before.
fn with_ended_jobs(mut seen: BTreeMap<u32, HealerView>, now: Vec<HealerView>) -> Vec<HealerView> {
    for v in now {
        seen.insert(v.job, v);
    }
    seen.into_values().collect()
}

/// The run id this process journalled last in `journal`.
fn own_run(lines: &[journal::Line]) -> Option<&str> {
    lines.iter().rev().find_map(|l| match &l.record {
        journal::Record::Start { run, agent_pid, .. } if *agent_pid == std::process::id() => {
            Some(run.as_str())
        }
        _ => None,
    })
}

/// Actions this process's healer journalled as applied and never undid.
fn left_in_force(path: &Path) -> usize {
    let Ok((lines, _)) = journal::read(path) else {
        return 0;
    };
    let Some(run) = own_run(&lines) else {
        return 0;
    };
    journal::outstanding(&lines)
        .iter()
        .filter(|o| o.key.run == run)
        .count()
}

/// A running slo-probe agent (or run) other than this process that started a healer on
/// `journal`: its pid. Two healers on one journal would undo each other's actions at start.
fn journal_owner(path: &Path) -> Option<u32> {
    let (lines, _) = journal::read(path).ok()?;
    let pids: BTreeSet<u32> = lines
        .iter()
        .filter_map(|l| match &l.record {
            journal::Record::Start { agent_pid, .. } => Some(*agent_pid),
            _ => None,
        })
        .collect();
    pids.into_iter()
        .filter(|&p| p != std::process::id())
        .find(|&p| is_healing_agent(p))
}

/// Whether `pid` is `slo-probe agent` or `slo-probe run` (whose healers write a journal).
fn is_healing_agent(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty());
    let named = args
        .next()
        .and_then(|a| Path::new(std::str::from_utf8(a).ok()?).file_name())
        .is_some_and(|n| n == "slo-probe");
    named && args.any(|a| a == b"agent" || a == b"run")
}

/// The agent that measures the run.
enum Agent {
    /// One in this process.
    InProcess(Box<InProcess>),
    /// One already running on the node.
    External(Endpoint),
    /// None could be had: the command runs unmeasured.
    Off,
}

impl Agent {
    /// Copies the in-process healer's views now and then (see [`RunHealer::seen`]).
    fn remember_healer(&mut self) {
        if let Agent::InProcess(a) = self {
            if let Some(h) = a
                .healer
                .as_mut()
                .filter(|h| h.remembered.elapsed() >= HEAL_VIEWS_EVERY)
            {
                h.remember();
            }
        }
    }

    fn describe(&self, ebpf: bool) -> String {
        match self {
            Agent::InProcess(_) if ebpf => "in-process".to_owned(),
            Agent::InProcess(_) => "in-process without eBPF".to_owned(),
            Agent::External(e) => e.url(),
            Agent::Off => "none".to_owned(),
        }
    }
}

/// The agent, whether it has eBPF, and the socket the command's shims register on.
fn start_agent(opts: &Options, notes: &mut Vec<String>) -> (Agent, bool, Option<PathBuf>) {
    let config = &opts.config;
    // With --listen this run is the agent; else the one already at prometheus.listen, if any.
    if config.prometheus.enabled && opts.listen.is_none() {
        let endpoint = Endpoint::of(config.prometheus.listen);
        if let Ok(s) = endpoint.snapshot(PROBE_TIMEOUT) {
            say(&format!("using the agent at {}", endpoint.url()));
            if s.agent.shim_socket.is_none() {
                notes.push(format!(
                    "the agent at {} does not accept CUPTI shims: no GPU data",
                    endpoint.url()
                ));
            }
            if let Some(flag) = opts.heal {
                let mode = s.healer.as_ref().map_or("off", |h| h.mode.as_str());
                say(&format!(
                    "--heal {}: the agent at {} heals with its own heal.mode ({mode}); --heal \
                     does not change it",
                    flag.as_str(),
                    endpoint.url()
                ));
                notes.push(format!(
                    "--heal {} not applied: the agent at {} heals with its heal.mode ({mode})",
                    flag.as_str(),
                    endpoint.url()
                ));
            }
            let ebpf = s.agent.probes.iter().any(|p| p.name == "runqueue" && p.up);
            let socket = s.agent.shim_socket.map(PathBuf::from);
            return (Agent::External(endpoint), ebpf, socket);
        }
    }
    // A private socket: a node-wide agent may own the configured one.
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("slo-probe-run-{}", std::process::id()));
    let mut config = config.clone();
    config.shim.socket = dir.join("shim.sock");
    let collector = match Collector::new(&config, opts.no_ebpf, true) {
        Ok(c) => Ok(c),
        Err(e) => {
            let why = crate::error_chain(&e);
            say(&format!(
                "eBPF probes off ({why}); pass --no-ebpf to run without them quietly"
            ));
            notes.push(format!("eBPF probes off: {why}"));
            Collector::new(&config, true, true)
        }
    };
    let collector = match collector {
        Ok(c) => c,
        Err(e) => {
            let why = crate::error_chain(&e);
            say(&format!(
                "cannot start an agent ({why}); running the command unmeasured"
            ));
            notes.push(format!("no agent: {why}"));
            if let Some(flag) = opts.heal {
                notes.push(format!("--heal {}: no agent, so no healer", flag.as_str()));
            }
            return (Agent::Off, false, None);
        }
    };
    let ebpf = collector.ebpf_up();
    if !ebpf && opts.no_ebpf {
        notes.push("eBPF probes off (--no-ebpf): no host metrics by thread role".to_owned());
    }
    let socket = collector.shim().map(|s| s.path().to_owned());
    if socket.is_none() {
        notes.push("the shims' socket is not listening: no GPU data".to_owned());
    }
    let mut collector = collector;
    let (publish, snapshots) = watch::channel(Arc::new(CoreSnapshot::default()));
    config.heal.mode = heal_mode(opts.heal, config.heal.mode);
    if opts.heal.is_none() && opts.config.heal.mode == config::HealMode::On {
        notes.push(
            "heal.mode = on in the config: run acts only with --heal on, so the healer shadows"
                .to_owned(),
        );
    }
    let healer = if config.heal.mode == config::HealMode::Off {
        None
    } else {
        RunHealer::start(
            &config.heal,
            snapshots.clone(),
            crate::healer::shim_control(collector.shim()),
            opts.heal.is_some(),
            notes,
        )
    };
    if let Some(h) = &healer {
        // Its views go into every snapshot from now on.
        collector.set_healer_views(h.views.clone());
    }
    let ctx = convert::Context {
        host: procfs::hostname(),
        shim_socket: socket.as_ref().map(|p| p.display().to_string()),
        writes_allowed: false,
        heal_mode: if healer.is_some() {
            config.heal.mode.as_str()
        } else {
            "off"
        },
    };
    let agent = InProcess {
        collector: Some(collector),
        handle: None,
        stop: Arc::new(AtomicBool::new(false)),
        publish: Some(publish),
        snapshots,
        healer,
        tick: config.tick(),
        ctx,
        dir,
        listen: opts.listen,
        per_thread: config.prometheus.per_thread,
        server: None,
    };
    (Agent::InProcess(Box::new(agent)), ebpf, socket)
}

// ---------------------------------------------------------------------------------------------
// The command.

/// Whether `program` can be executed: `Err((exit code, why))` with the shell's codes (127 not
/// found, 126 not executable).
fn check_program(program: &str) -> Result<(), (u8, String)> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(program)).collect())
            .unwrap_or_default()
    };
    if candidates.iter().any(|p| executable(p)) {
        return Ok(());
    }
    if candidates.iter().any(|p| p.exists()) {
        Err((126, format!("cannot run `{program}`: permission denied")))
    } else if program.contains('/') {
        Err((127, format!("cannot run `{program}`: no such file")))
    } else {
        Err((127, format!("cannot run `{program}`: not found in PATH")))
    }
}

/// Starts the command: held until the in-process agent follows it when eBPF is up (so that it
/// is followed from its first instruction), directly otherwise.
fn spawn(
    command: &[String],
    inject: &Inject,
    agent: &mut Agent,
    ebpf: bool,
) -> std::io::Result<Child> {
    match agent {
        Agent::InProcess(a) if ebpf => {
            let (child, mut release) = spawn_held(command, inject)
                .map_err(|e| std::io::Error::other(crate::error_chain(&e)))?;
            a.start(child.id());
            let _ = release.write_all(&[1]);
            Ok(child)
        }
        _ => {
            let (program, args) = command
                .split_first()
                .ok_or_else(|| std::io::Error::other("empty command"))?;
            let mut cmd = Command::new(program);
            cmd.args(args);
            inject.apply(&mut cmd);
            let child = cmd.spawn()?;
            if let Agent::InProcess(a) = agent {
                a.start(child.id());
            }
            Ok(child)
        }
    }
}

/// The command's process and its descendants, SIGKILLed.
fn kill_tree(pid: u32) {
    let mut tree = BTreeSet::from([pid]);
    procfs::add_descendants(&mut tree);
    for p in tree.into_iter().rev() {
        kill(p, libc::SIGKILL);
    }
}

/// The command line as a shell would read it back (arguments quoted where needed).
pub fn shell_join(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One line of ours on stderr. Never panics (`eprintln!` would on a closed stderr, and the
/// command's exit status must still come out).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "slo-probe: {line}");
}

/// What the wait for the command saw.
struct Waited {
    status: std::io::Result<ExitStatus>,
    interrupted: Option<String>,
    killed: bool,
    pids: BTreeSet<u32>,
}

/// Waits for the command, forwarding signals and escalating to SIGKILL.
fn wait(child: &mut Child, kill_after: Duration, agent: &mut Agent) -> Waited {
    let pid = child.id();
    let mut pids = BTreeSet::from([pid]);
    let mut deadline: Option<Instant> = None;
    let mut interrupted = None;
    let mut killed = false;
    let mut scanned = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Ok(st),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        for (sig, from_kernel) in take_signals() {
            // From the terminal, the command (in our process group) got it too.
            if !from_kernel {
                kill(pid, sig);
            }
            if is_stop_signal(sig) {
                interrupted.get_or_insert_with(|| signal_name(sig));
                if deadline.is_none() {
                    deadline = Some(Instant::now() + kill_after);
                    say(&format!(
                        "{}{}; waiting for the command to exit (SIGKILL in {:.0} s)",
                        signal_name(sig),
                        if from_kernel {
                            " from the terminal"
                        } else {
                            ", forwarded to the command"
                        },
                        kill_after.as_secs_f64()
                    ));
                }
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) && !killed {
            say(&format!(
                "the command did not exit {:.0} s after the stop signal; sending SIGKILL to it \
                 and its descendants",
                kill_after.as_secs_f64()
            ));
            kill_tree(pid);
            killed = true;
        }
        if scanned.elapsed() >= SCAN_EVERY {
            scanned = Instant::now();
            procfs::add_descendants(&mut pids);
        }
        agent.remember_healer();
        std::thread::sleep(POLL);
    };
    Waited {
        status,
        interrupted,
        killed,
        pids,
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

/// Runs the command and writes its report; returns how it ended.
pub fn run(opts: Options) -> Result<Outcome, RunError> {
    let node = procfs::hostname();
    let target = ReportTarget::new(opts.output.as_deref(), opts.force_overwrite, &node)?;
    install_signal_handlers().map_err(RunError::Signals)?;
    let Some(program) = opts.command.first() else {
        say("no command given; usage: slo-probe run [OPTIONS] -- COMMAND [ARGS]");
        return Ok(Outcome::Exited(2));
    };
    if let Err((code, why)) = check_program(program) {
        say(&why);
        return Ok(Outcome::Exited(code));
    }
    let mut notes = Vec::new();
    let (mut agent, ebpf, socket) = start_agent(&opts, &mut notes);

    // The shim.
    let library = if opts.no_gpu || socket.is_none() {
        None
    } else {
        opts.config.shim.library_path()
    };
    let user_path = std::env::var_os("CUDA_INJECTION64_PATH");
    let mut injected = None;
    match (&library, &user_path) {
        (Some(lib), Some(user)) if Path::new(user) != lib => {
            say(&format!(
                "CUDA_INJECTION64_PATH is already set to {}; keeping it, so the slo-probe shim \
                 {} is not injected (GPU data only if that one is an slo-probe shim)",
                Path::new(user).display(),
                lib.display()
            ));
            notes.push(format!(
                "CUDA_INJECTION64_PATH was set to {}: kept",
                Path::new(user).display()
            ));
        }
        (Some(lib), _) => injected = Some(lib.display().to_string()),
        (None, _) if !opts.no_gpu && socket.is_some() => {
            say(
                "no CUPTI shim to inject (libslo_probe_cupti.so next to slo-probe, or \
                 shim.library): no GPU data",
            );
            notes.push("no CUPTI shim to inject: no GPU data".to_owned());
        }
        (None, _) => {}
    }
    // Automatic step markers for a Python script without them (kept until the command ends).
    let python_boot = if opts.no_gpu || opts.no_auto_steps {
        None
    } else {
        match PythonBoot::write() {
            Ok(b) => Some(b),
            Err(why) => {
                say(&why);
                notes.push("no automatic step markers (bootstrap not written)".to_owned());
                None
            }
        }
    };
    let inject = Inject {
        library: library.clone(),
        socket: socket.clone(),
        env: python_boot
            .as_ref()
            .map(|b| b.env(std::env::var_os("PYTHONPATH")))
            .unwrap_or_default(),
    };

    // Ctrl-C while the agent started: do not start the command at all.
    if let Some((sig, _)) = take_signals().into_iter().find(|(s, _)| is_stop_signal(*s)) {
        say(&format!(
            "{} before the command started; not starting it",
            signal_name(sig)
        ));
        return Ok(Outcome::Exited(128u8.wrapping_add(sig as u8)));
    }
    let started = SystemTime::now();
    let start = Instant::now();
    let mut child = match spawn(&opts.command, &inject, &mut agent, ebpf) {
        Ok(c) => c,
        Err(e) => {
            say(&format!("cannot run `{program}`: {e}"));
            return Ok(Outcome::Exited(
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    126
                } else {
                    127
                },
            ));
        }
    };
    let waited = wait(&mut child, opts.kill_after, &mut agent);
    let wall = start.elapsed();
    let outcome = match &waited.status {
        Ok(st) => outcome_of(st),
        Err(e) => {
            say(&format!("cannot wait for the command: {e}"));
            Outcome::Exited(1)
        }
    };

    // Everything below only reports: it never changes `outcome`, not even by a panic.
    let finish = Finish {
        opts: &opts,
        node,
        started,
        wall,
        waited,
        agent,
        ebpf,
        notes,
        injected,
        target: &target,
    };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| report_and_write(finish))).is_err()
    {
        say("the report was not written (internal error; the message is above)");
    }
    Ok(outcome)
}

/// What the report is made of.
struct Finish<'a> {
    opts: &'a Options,
    node: String,
    started: SystemTime,
    wall: Duration,
    waited: Waited,
    agent: Agent,
    ebpf: bool,
    notes: Vec<String>,
    injected: Option<String>,
    target: &'a ReportTarget,
}

fn report_and_write(f: Finish<'_>) {
    let Finish {
        opts,
        node,
        started,
        wall,
        waited,
        agent,
        ebpf,
        mut notes,
        injected,
        target,
    } = f;
    let description = agent.describe(ebpf);
    let mut pids = waited.pids;
    let state = match agent {
        Agent::InProcess(a) => a.finish(&mut notes),
        Agent::External(endpoint) => match endpoint.snapshot(Duration::from_secs(5)) {
            Ok(mut s) => {
                s.retain_pids(&pids);
                Some(s)
            }
            Err(e) => {
                say(&format!(
                    "cannot read the results: {}",
                    crate::error_chain(&e)
                ));
                notes.push(format!("no results from the agent: {e}"));
                None
            }
        },
        Agent::Off => None,
    };
    let state = state.unwrap_or_else(|| Snapshot {
        version: types::VERSION,
        node: node.clone(),
        ..Default::default()
    });
    pids.extend(state.processes.iter().map(|p| p.pid));
    let report = RunReport {
        version: REPORT_VERSION,
        command: opts.command.clone(),
        node,
        started_unix_s: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        wall_s: wall.as_secs_f64(),
        exit: waited.status.as_ref().map(exit_of).unwrap_or_default(),
        interrupted: waited.interrupted,
        killed_after_timeout: waited.killed,
        agent: description,
        notes,
        heal: opts.heal,
        injected,
        pids: pids.into_iter().collect(),
        state,
    };
    for line in summary(&report) {
        say(&line);
    }
    match target.write(&report) {
        Ok((json, text)) => say(&format!("wrote {} and {}", json.display(), text.display())),
        Err(e) => say(&format!(
            "the report was not written: {}",
            crate::error_chain(&e)
        )),
    }
}

fn outcome_of(st: &ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt as _;
    match (st.code(), st.signal()) {
        (Some(c), _) => Outcome::Exited(c as u8),
        (None, Some(sig)) => Outcome::Signalled(sig),
        (None, None) => Outcome::Exited(1),
    }
}

fn exit_of(st: &ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt as _;
    Exit {
        code: st.code(),
        signal: st.signal(),
        signal_name: st.signal().map(signal_name),
        core_dumped: st.core_dumped(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_read_back_in_a_shell() {
        let args: Vec<String> = ["sh", "-c", "echo 'a b'; exit 3", "x"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(shell_join(&args), r#"sh -c 'echo '\''a b'\''; exit 3' x"#);
    }

    #[test]
    fn a_run_acts_only_with_heal_on() {
        use config::HealMode as M;
        for (flag, configured, want) in [
            (None, M::Off, M::Off),
            (None, M::Shadow, M::Shadow),
            (None, M::On, M::Shadow),
            (Some(HealMode::Shadow), M::Off, M::Shadow),
            (Some(HealMode::Shadow), M::On, M::Shadow),
            (Some(HealMode::On), M::Off, M::On),
        ] {
            assert_eq!(heal_mode(flag, configured), want, "{flag:?} {configured:?}");
        }
    }

    fn view(job: u32, phase_since_ns: u64) -> HealerView {
        HealerView {
            job,
            phase_since_ns,
            ..Default::default()
        }
    }

    #[test]
    fn the_report_keeps_the_views_of_jobs_that_ended() {
        let seen = BTreeMap::from([(1, view(1, 5)), (2, view(2, 5))]);
        let merged = with_ended_jobs(seen, vec![view(2, 9), view(3, 9)]);
        let got: Vec<(u32, u64)> = merged.iter().map(|v| (v.job, v.phase_since_ns)).collect();
        assert_eq!(got, [(1, 5), (2, 9), (3, 9)]);
    }

    #[test]
    fn a_journal_of_dead_or_other_processes_has_no_owner() {
        let dir = std::env::temp_dir().join(format!("slo-probe-run-owner-{}", std::process::id()));
        let path = dir.join("heal.jsonl");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(journal_owner(&path), None);
        let mut j = journal::Journal::open(&path).expect("journal");
        // This test process, init, and a pid that is not running.
        for agent_pid in [std::process::id(), 1, u32::MAX - 1] {
            j.append(journal::Record::Start {
                run: format!("{agent_pid}-1"),
                agent_pid,
                mode: "on".into(),
            })
            .expect("append");
        }
        assert_eq!(journal_owner(&path), None);
        let (lines, _) = journal::read(&path).expect("read");
        assert_eq!(
            own_run(&lines),
            Some(format!("{}-1", std::process::id()).as_str())
        );
        assert_eq!(left_in_force(&path), 0);
        assert!(!is_healing_agent(std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn programs_are_checked_like_a_shell_does() {
        assert!(check_program("sh").is_ok());
        assert_eq!(
            check_program("no-such-program-x").map_err(|e| e.0),
            Err(127)
        );
        let plain = std::env::temp_dir().join(format!("slo-probe-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").expect("write");
        let path = plain.display().to_string();
        assert_eq!(check_program(&path).map_err(|e| e.0), Err(126));
        let _ = std::fs::remove_file(&plain);
        assert_eq!(check_program("./missing").map_err(|e| e.0), Err(127));
    }
}
