//! The `slo-probe` command line: its arguments, and one function per subcommand. `main.rs` only
//! parses and calls [`run`]; `agent` is in [`agent`], `observe` in [`observe`], `replay` in
//! [`replay`], `run` in [`mod@run`], `top` in [`top`]; `check` and `config` are short enough to
//! live here.

pub mod agent;
pub mod heal;
pub mod json;
pub mod observe;
pub mod python_boot;
pub mod replay;
pub mod report;
pub mod run;
pub mod top;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use slo_probe_core::occupancy::SmLimits;

use crate::{
    collector::Collector,
    config::{Config, DEFAULT_TOML},
    sources::ebpf::preflight::Preflight,
};

/// slo-probe: SLO monitoring and attribution for GPU training nodes.
///
/// Measures what the Linux kernel does to a job's threads (eBPF) and what its GPUs do (a CUPTI
/// shim, NVML), judges it against an SLO tree, and exports it for Prometheus and OpenTelemetry.
/// Loading eBPF programs needs root, or CAP_BPF and CAP_PERFMON.
#[derive(Parser)]
#[command(version, about, long_about)]
pub struct Cli {
    /// Log level: error, warn, info, debug, trace (RUST_LOG overrides). Default: info; warn
    /// for `run`, whose command's output shares the terminal.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the agent: attach the probes, serve Prometheus metrics and push OTLP (when
    /// `[otlp]` or OTEL_EXPORTER_OTLP_ENDPOINT names a collector) until SIGINT or SIGTERM.
    Agent {
        /// TOML configuration file (see `slo-probe config print-default`).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Prometheus listen address (overrides prometheus.listen).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Follow this process and its descendants (repeatable; adds to target.pids). Without
        /// --pid or --cgroup the whole node is followed.
        #[arg(long = "pid", value_name = "PID")]
        pids: Vec<u32>,
        /// Follow the processes of this cgroup (path as in /proc/PID/cgroup; repeatable).
        #[arg(long = "cgroup", value_name = "PATH")]
        cgroups: Vec<String>,
        /// Do not load eBPF programs; serve what is available without them.
        #[arg(long)]
        no_ebpf: bool,
    },
    /// Run a command, follow its process tree for a while, and print what was measured, by
    /// thread role.
    Observe {
        /// TOML configuration file.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// How long to observe, in seconds (the command is stopped after this if still running).
        /// Under 150 s, the SLO windows are a fifteenth of it (1 to 10 s) unless slo.window_ms
        /// is configured.
        #[arg(short, long, default_value_t = 5.0)]
        duration: f64,
        /// Rows of the per-thread table.
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Also write the observation as JSON to this file (iterations, GPU counters, roles).
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Do not inject the CUPTI shim into the command (by default `libslo_probe_cupti.so`
        /// next to this binary is injected with CUDA_INJECTION64_PATH when it exists).
        #[arg(long)]
        no_gpu: bool,
        /// Do not give a Python command without slo_probe.step() markers its automatic ones
        /// (one iteration per optimizer.step(), from a sitecustomize put first on PYTHONPATH;
        /// SLO_PROBE_AUTO_STEPS=0 does the same).
        #[arg(long)]
        no_auto_steps: bool,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
    /// Replay GPU recordings (the <pid>.bin files the agent writes to shim.record_dir, such as
    /// tests/fixtures/gpu/*.bin, recorded on an H200) through the agent's decoding and iteration
    /// assembly, and print the GPU report: no GPU needed.
    Replay {
        /// Recordings.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Compute capability of the GPU they were recorded on (9.0 for H100 and H200), for
        /// theoretical occupancy; without it occupancy is not computed.
        #[arg(long, value_name = "MAJOR.MINOR")]
        compute_capability: Option<String>,
        /// Ignore the step markers and detect iterations as a job without them gets them: from the
        /// period of its copies, fills and graph launches (else of its kernels)
        #[arg(long)]
        detect: bool,
        /// Also write the replayed processes as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// SLO window length in ms (default: a fifteenth of the recording, 100 ms to 10 s).
        #[arg(long, value_name = "MS")]
        window_ms: Option<u64>,
        /// Judge with the SLO tree and windows of this agent configuration (the one the
        /// recording was made under), as the live agent did.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Leave out the host and NVML samples recorded beside each recording (<pid>.host.jsonl,
        /// nvml.jsonl): judge the GPU side only.
        #[arg(long)]
        no_sidecars: bool,
        /// Run no shadow healer. By default one decides at every tick of a replay with host
        /// samples, with the config's `[heal]` parameters, and the report lists what it would
        /// have done (nothing is written: a replay has no host to act on).
        #[arg(long)]
        no_heal: bool,
        /// With host samples: feed each record when it reached the agent (the recording's
        /// order) rather than at its end time, so that records CUPTI handed over late are judged
        /// as late as the live agent got them.
        #[arg(long)]
        arrival: bool,
        /// With host samples: also advance the pipeline every MS of record time, as the live
        /// agent does every 50 ms (by default only at the host samples). With 50, a replay
        /// takes iterations at the live agent's pace.
        #[arg(long, value_name = "MS")]
        advance_ms: Option<u64>,
        /// With --advance-ms: make each of those advances MS past the record time. Live, CUPTI
        /// hands records over in buffers and the agent's clock runs ahead of what it has, so
        /// it takes iterations with less of their records than a replay at the record time
        /// would (0..=10000, default 0).
        #[arg(long, value_name = "MS", requires = "advance_ms")]
        clock_ahead_ms: Option<u64>,
    },
    /// Work on GPU recordings (the <pid>.bin files of shim.record_dir).
    Recording {
        #[command(subcommand)]
        action: RecordingCmd,
    },
    /// Run a command (a training script, `torchrun ...`) the way `perf record` does: measured
    /// by the agent already listening at prometheus.listen, or by one started here that follows
    /// the command's processes; the CUPTI shim injected; its output untouched; its exit status
    /// returned (a fatal signal re-raised); a report written when it ends, Ctrl-C included.
    Run {
        /// TOML configuration file (the agent started here, the shim library, the SLO tree).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// The report: this file (`.json` added when missing) and a text summary beside it
        /// (`.txt`). Default: slo-probe-<host>-<n>.json in the current directory, with the
        /// first free n.
        #[arg(short, long, value_name = "REPORT")]
        output: Option<PathBuf>,
        /// Replace the report named by -o when it exists (else run refuses to start).
        #[arg(long)]
        force_overwrite: bool,
        /// Let the healer act (`on`) or only record what it would do (`shadow`). Default: the
        /// config's heal.mode, but at most shadow. An agent already running heals with its own
        /// heal.mode.
        #[arg(long, value_enum, value_name = "MODE")]
        heal: Option<run::HealMode>,
        /// Seconds the command gets after a stop signal (INT, TERM, HUP, QUIT) before it and
        /// its descendants get SIGKILL.
        #[arg(long, value_name = "SECONDS", default_value_t = run::DEFAULT_KILL_AFTER_S)]
        kill_after: f64,
        /// Do not load eBPF programs in an agent started here (they need root or CAP_BPF and
        /// CAP_PERFMON; without them there are no host metrics by thread role).
        #[arg(long)]
        no_ebpf: bool,
        /// Do not inject the CUPTI shim (CUDA_INJECTION64_PATH).
        #[arg(long)]
        no_gpu: bool,
        /// Do not give a Python command without slo_probe.step() markers its automatic ones
        /// (one iteration per optimizer.step(), from a sitecustomize put first on PYTHONPATH;
        /// SLO_PROBE_AUTO_STEPS=0 does the same).
        #[arg(long)]
        no_auto_steps: bool,
        /// Start the agent here even if one answers at prometheus.listen, and serve Prometheus
        /// metrics and the state API at this address while the command runs (for `slo-probe
        /// top --url`).
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
    /// A terminal view of a node from its agent's state API: jobs and ranks with their SLO
    /// score, the SLO tree, open violations with their chains, top operators, host by thread
    /// role, GPUs, the healer's timeline. Keys: q quit, ? help, Tab pane, arrows or j/k move,
    /// Enter drill in, Esc back, / filter, space or f freeze, s sort.
    Top {
        /// The agent, as http://HOST:PORT; it reconnects by itself (backoff 0.5 to 5 s).
        /// Default: prometheus.listen of --config (127.0.0.1:9617).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// TOML configuration file (for the default address).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Show a GPU recording (a <pid>.bin of shim.record_dir, such as
        /// tests/fixtures/gpu/h200-graphs.bin) instead of an agent: no agent or GPU needed
        /// (repeatable).
        #[arg(long = "replay", value_name = "FILE")]
        replay: Vec<PathBuf>,
        /// Print one snapshot and exit (as the screen would show it, 120x40 when stdout is
        /// not a terminal).
        #[arg(long)]
        once: bool,
        /// With --once: print the snapshot as the state API's JSON.
        #[arg(long)]
        json: bool,
        /// Capture the mouse (the wheel moves; off by default because it blocks copy-paste).
        #[arg(long)]
        mouse: bool,
    },
    /// Check what this machine allows (privileges, kernel BTF, tracefs); exit 1 if the eBPF
    /// probes cannot load.
    Check,
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        action: ConfigCmd,
    },
    /// The self-healing loop's journal: what is applied, what happened, and undo.
    Heal {
        /// TOML configuration file (for heal.journal and heal.jobs_dir).
        #[arg(short, long, global = true)]
        config: Option<PathBuf>,
        /// The journal (overrides heal.journal).
        #[arg(long, global = true, value_name = "FILE")]
        journal: Option<PathBuf>,
        #[command(subcommand)]
        action: HealCmd,
    },
}

#[derive(Subcommand)]
pub enum HealCmd {
    /// Actions still applied, with every knob's prior, written and current value.
    Status,
    /// The audit trail: decisions, actions, verdicts, restores.
    History {
        /// Only this job (its training process id).
        #[arg(long)]
        job: Option<u32>,
        /// The last N lines.
        #[arg(long, default_value_t = 50)]
        last: usize,
        /// JSON lines as journalled.
        #[arg(long)]
        json: bool,
    },
    /// Restore every knob of every action still applied and read each back (exit 1 when one
    /// could not be restored). A running agent forgets the actions undone.
    Undo,
}

#[derive(Subcommand)]
pub enum RecordingCmd {
    /// Keep the part of a recording from --from to --to (CLOCK_MONOTONIC ns): the records of
    /// that span, every name and graph node (what the records use), and the depth in force
    /// when it starts; the host samples beside it (<pid>.host.jsonl) are cut the same way.
    Trim {
        /// The recording.
        input: PathBuf,
        /// Where the trimmed recording goes (its sidecar beside it).
        output: PathBuf,
        /// First instant kept, ns.
        #[arg(long, value_name = "NS")]
        from: u64,
        /// Last instant kept, ns.
        #[arg(long, value_name = "NS")]
        to: u64,
    },
}

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Print the default configuration, with a comment on every key.
    PrintDefault,
    /// Validate a configuration file as the agent does when it starts (with the OTEL_*
    /// variables of this environment).
    Check {
        /// The file.
        path: PathBuf,
    },
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(Config::from_file(p)?),
        None => Ok(Config::default()),
    }
}

/// Runs one subcommand.
pub fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    match cmd {
        Cmd::Agent {
            config,
            listen,
            pids,
            cgroups,
            no_ebpf,
        } => {
            let mut config = load_config(config.as_ref())?;
            if let Some(l) = listen {
                config.prometheus.listen = l;
            }
            config.target.pids.extend(pids);
            config.target.cgroups.extend(cgroups);
            config.validate()?;
            agent::run(config, no_ebpf)
        }
        Cmd::Observe {
            config,
            duration,
            top,
            json,
            no_gpu,
            no_auto_steps,
            command,
        } => {
            let mut config = load_config(config.as_ref())?;
            anyhow::ensure!(
                duration.is_finite() && duration > 0.0,
                "--duration must be a positive number of seconds"
            );
            // A short run gets short SLO windows (unless configured), so that baselines are
            // learned and violations can be judged within it.
            let default_slo = slo_probe_core::slo::SloSpec::default();
            if config.slo.window_ms == default_slo.window_ms && duration < 150.0 {
                config.slo.window_ms = ((duration * 1000.0 / 15.0) as u64).clamp(1000, 10_000);
                if config.slo.learn_windows == default_slo.learn_windows {
                    config.slo.learn_windows = 3;
                }
            }
            let mut collector = Collector::new(&config, false, true)?;
            let inject = observe::Inject {
                library: (!no_gpu && collector.shim().is_some())
                    .then(|| config.shim.library_path())
                    .flatten(),
                socket: collector.shim().map(|s| s.path().to_owned()),
                env: Vec::new(),
            };
            // Automatic step markers for a Python script without them (kept until it ends).
            let python_boot = (!no_gpu && !no_auto_steps)
                .then(|| {
                    python_boot::PythonBoot::write()
                        .map_err(|why| log::warn!("{why}"))
                        .ok()
                })
                .flatten();
            let inject = observe::Inject {
                env: python_boot
                    .as_ref()
                    .map(|b| b.env(std::env::var_os("PYTHONPATH")))
                    .unwrap_or_default(),
                ..inject
            };
            match &inject.library {
                Some(lib) => log::info!("injecting the CUPTI shim {}", lib.display()),
                None if !no_gpu => log::info!(
                    "no CUPTI shim to inject (libslo_probe_cupti.so next to slo-probe, or \
                     shim.library): GPU tracing off"
                ),
                None => {}
            }
            let heal = config.heal.healer_config();
            let obs = observe::run(
                &mut collector,
                &command,
                Duration::from_secs_f64(duration),
                config.tick(),
                &inject,
                Some(&heal),
            )?;
            print!("{}", report::report(&obs, &command.join(" "), top));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&json::json(&obs, &command.join(" ")))
                    .context("cannot encode the observation")?;
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Replay {
            files,
            compute_capability,
            detect,
            json,
            window_ms,
            config,
            no_sidecars,
            no_heal,
            arrival,
            advance_ms,
            clock_ahead_ms,
        } => {
            anyhow::ensure!(
                window_ms.is_none_or(|w| (100..=3_600_000).contains(&w)),
                "--window-ms must be 100..=3600000"
            );
            anyhow::ensure!(
                advance_ms.is_none_or(|a| (1..=60_000).contains(&a)),
                "--advance-ms must be 1..=60000"
            );
            anyhow::ensure!(
                clock_ahead_ms.is_none_or(|a| a <= 10_000),
                "--clock-ahead-ms must be 0..=10000"
            );
            let limits = match compute_capability.as_deref() {
                None => None,
                Some(cc) => {
                    let parsed = cc
                        .split_once('.')
                        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
                    let (major, minor) = parsed.with_context(|| {
                        format!("--compute-capability {cc}: expected MAJOR.MINOR, like 9.0")
                    })?;
                    Some(SmLimits::for_capability(major, minor).with_context(|| {
                        format!("--compute-capability {cc}: not a GPU architecture slo-probe knows")
                    })?)
                }
            };
            let config = match &config {
                Some(p) => Some(Config::from_file(p)?),
                None => None,
            };
            let heal = config
                .as_ref()
                .map_or_else(|| Config::default().heal, |c| c.heal.clone());
            let opts = replay::ReplayOptions {
                limits,
                detect,
                window_ms,
                spec: config.map(|c| c.slo),
                sidecars: !no_sidecars,
                heal: (!no_heal).then(|| heal.healer_config()),
                arrival,
                advance_ms,
                clock_ahead_ms: clock_ahead_ms.unwrap_or(0),
            };
            let mut out = Vec::new();
            for (i, f) in files.iter().enumerate() {
                let r = replay::replay_with(f, &opts)?;
                if i > 0 {
                    println!();
                }
                print!("{}", replay::report(&r));
                out.push(json::process_json(&r.process, r.healer.as_ref()));
            }
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&out)
                    .context("cannot encode the replayed recordings")?;
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            config,
            output,
            force_overwrite,
            heal,
            kill_after,
            no_ebpf,
            no_gpu,
            no_auto_steps,
            listen,
            command,
        } => {
            let config = load_config(config.as_ref())?;
            anyhow::ensure!(
                kill_after.is_finite() && kill_after >= 0.0,
                "--kill-after must be a number of seconds, 0 or more"
            );
            let outcome = run::run(run::Options {
                config,
                output,
                force_overwrite,
                heal,
                kill_after: Duration::from_secs_f64(kill_after),
                no_ebpf,
                no_gpu,
                no_auto_steps,
                listen,
                command,
            })?;
            Ok(match outcome {
                run::Outcome::Exited(code) => ExitCode::from(code),
                run::Outcome::Signalled(sig) => ExitCode::from(run::reraise(sig)),
            })
        }
        Cmd::Top {
            url,
            config,
            replay,
            once,
            json,
            mouse,
        } => {
            let endpoint = match url {
                Some(u) => crate::api::client::Endpoint::parse(&u)?,
                None => crate::api::client::Endpoint::of(
                    load_config(config.as_ref())?.prometheus.listen,
                ),
            };
            top::run(top::Options {
                endpoint,
                replay,
                once,
                json,
                mouse,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Check => {
            let p = Preflight::run();
            print!("{p}");
            Ok(match p.blocker() {
                None => {
                    println!("the eBPF probes can load");
                    ExitCode::SUCCESS
                }
                Some(f) => {
                    println!("the eBPF probes cannot load: {}", f.what);
                    ExitCode::FAILURE
                }
            })
        }
        Cmd::Heal {
            config,
            journal,
            action,
        } => {
            let config = load_config(config.as_ref())?;
            let path = journal.unwrap_or_else(|| config.heal.journal.clone());
            let jobs = &config.heal.jobs_dir;
            match action {
                HealCmd::Status => {
                    print!("{}", heal::status(&path, jobs)?);
                    Ok(ExitCode::SUCCESS)
                }
                HealCmd::History { job, last, json } => {
                    print!("{}", heal::history(&path, job, last, json)?);
                    Ok(ExitCode::SUCCESS)
                }
                HealCmd::Undo => {
                    let (text, ok) = heal::undo(&path, jobs)?;
                    print!("{text}");
                    Ok(heal::exit(ok))
                }
            }
        }
        Cmd::Recording {
            action:
                RecordingCmd::Trim {
                    input,
                    output,
                    from,
                    to,
                },
        } => {
            anyhow::ensure!(from <= to, "--from {from} is after --to {to}");
            let t = replay::trim(&input, &output, from, to)?;
            println!("{}", t.summary(&input, &output));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Config { action } => match action {
            ConfigCmd::PrintDefault => {
                print!("{DEFAULT_TOML}");
                Ok(ExitCode::SUCCESS)
            }
            ConfigCmd::Check { path } => {
                // The same checks as the agent's start, so that what passes here starts.
                agent::check_startup(&Config::from_file(&path)?)?;
                println!("{}: ok", path.display());
                Ok(ExitCode::SUCCESS)
            }
        },
    }
}
