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
//! - Signals: the command stays in this process group, so a terminal's Ctrl-C (or Ctrl-\)
//!   reaches it once, from the terminal, and is not forwarded. INT, TERM, HUP, QUIT, USR1 and
//!   USR2 sent to this process by another one are forwarded. After INT, TERM, HUP or QUIT the
//!   command gets `--kill-after` seconds, then SIGKILL with its descendants.
//! - Report: JSON and a text summary, written to a temporary file and renamed; by default
//!   `slo-probe-<host>-<n>.json` (and `.txt`) in the current directory with the first free `n`.
//!   Its own lines go to stderr prefixed `slo-probe:`. The report is in [`report`].

use std::{
    collections::BTreeSet,
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
use slo_probe_core::snapshot::Snapshot as CoreSnapshot;
use tokio::sync::watch;

pub mod report;

use report::ReportTarget;
pub use report::{summary, text, Exit, ReportError, RunReport, REPORT_VERSION};

use super::observe::{spawn_held, Inject};
use crate::{
    api::{
        client::Endpoint,
        convert,
        types::{self, Snapshot},
        Api,
    },
    collector::{self, Collector},
    config::Config,
    exporters::prometheus::PrometheusServer,
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

/// What the healer may do during the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HealMode {
    /// Decide and record, change nothing.
    Shadow,
    /// Act, verify and roll back.
    On,
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

/// A collector in this process, following the command's tree only.
struct InProcess {
    collector: Option<Collector>,
    handle: Option<JoinHandle<Collector>>,
    stop: Arc<AtomicBool>,
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
        let Some(mut c) = self.collector.take() else {
            return;
        };
        if let Err(e) = c.add_root(pid) {
            say(&format!(
                "cannot follow the command's processes in the kernel: {}",
                crate::error_chain(&e)
            ));
        }
        let (tx, rx) = watch::channel(Arc::new(CoreSnapshot::default()));
        if let Some(addr) = self.listen {
            self.serve(addr, rx);
        }
        match collector::spawn(c, self.tick, tx, self.stop.clone()) {
            Ok(h) => self.handle = Some(h),
            Err(e) => say(&format!(
                "cannot start the collector thread: {e}; no measurements"
            )),
        }
    }

    /// Stops ticking and returns the final state.
    fn finish(mut self) -> Option<Snapshot> {
        self.stop.store(true, Ordering::Relaxed);
        let mut c = self.handle.take()?.join().ok()?;
        c.finish_gpu();
        let s = c.tick();
        drop(c);
        if let Some((runtime, stop)) = self.server.take() {
            let _ = stop.send(true);
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        Some(convert::snapshot(&s, &self.ctx))
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        // The private socket's folder, however the run ended.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
    let ctx = convert::Context {
        host: procfs::hostname(),
        shim_socket: socket.as_ref().map(|p| p.display().to_string()),
        writes_allowed: false,
        heal_mode: "off",
    };
    let agent = InProcess {
        collector: Some(collector),
        handle: None,
        stop: Arc::new(AtomicBool::new(false)),
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
            if let Some(lib) = &inject.library {
                if std::env::var_os("CUDA_INJECTION64_PATH").is_none() {
                    cmd.env("CUDA_INJECTION64_PATH", lib);
                }
            }
            if let Some(sock) = &inject.socket {
                cmd.env("SLO_PROBE_SOCKET", sock);
            }
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
fn wait(child: &mut Child, kill_after: Duration) -> Waited {
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
    if let Some(mode) = opts.heal {
        // The healer is not part of the agent yet; the flag is kept for when it is.
        let m = if mode == HealMode::On { "on" } else { "shadow" };
        say(&format!(
            "--heal {m}: this agent has no healer yet; running without one"
        ));
        notes.push(format!("--heal {m}: no healer in this agent"));
    }
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
    let inject = Inject {
        library: library.clone(),
        socket: socket.clone(),
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
    let waited = wait(&mut child, opts.kill_after);
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
        Agent::InProcess(a) => a.finish(),
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
