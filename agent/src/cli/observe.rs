//! `slo-probe observe`: run a command, follow its process tree in the kernel for a while, print
//! what the probes measured for it by thread role. The one-shot form of the agent, for trying it
//! out and for scripts.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    io::Write as _,
    os::{fd::FromRawFd, unix::process::CommandExt},
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

use slo_probe_common::Counter;
use slo_probe_core::{
    net::endpoints,
    roles::Role,
    snapshot::Snapshot,
    threads::{RunqCounts, ThreadCounts},
};

use crate::{collector::Collector, sources::ebpf::EbpfError};

/// Errors of `observe`.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// The command could not be started.
    #[error("cannot start `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The command's process could not be added to the kernel's process set.
    #[error("cannot follow the command's process")]
    Track(#[source] EbpfError),
}

/// What `observe` ends with.
pub struct Observation {
    /// The last snapshot.
    pub snapshot: Snapshot,
    /// Process ids of the command and its descendants seen while observing.
    pub pids: BTreeSet<u32>,
    /// How long it observed.
    pub elapsed: Duration,
    /// The command's exit status, if it ended by itself.
    pub exit: Option<ExitStatus>,
}

fn stop_child(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Environment for the command: the CUPTI shim to inject and the socket it registers on.
#[derive(Clone, Debug, Default)]
pub struct Inject {
    /// `CUDA_INJECTION64_PATH`.
    pub library: Option<std::path::PathBuf>,
    /// `SLO_PROBE_SOCKET`.
    pub socket: Option<std::path::PathBuf>,
}

/// Starts `command` held before it runs until the returned writer is written to or closed, so
/// that the probes follow it from its first instruction. Needs `/bin/sh`.
pub(crate) fn spawn_held(
    command: &[String],
    inject: &Inject,
) -> Result<(Child, std::fs::File), ObserveError> {
    let line = command.join(" ");
    let spawn_err = |source| ObserveError::Spawn {
        command: line.clone(),
        source,
    };
    let (program, args) = command.split_first().ok_or_else(|| {
        spawn_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ))
    })?;
    let mut fds = [0i32; 2];
    // SAFETY: valid pointer to two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    // `Command::spawn` returns only once the child has exec'd, so the child cannot wait before
    // exec'ing the command itself: it exec's a shell that waits on fd 3, then exec's the command
    // in the same process (same pid).
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("read -r _ <&3; exec 3<&-; exec \"$@\"")
        .arg("slo-probe-held")
        .arg(program)
        .args(args);
    // The user's own CUDA_INJECTION64_PATH wins.
    if let Some(lib) = &inject.library {
        if std::env::var_os("CUDA_INJECTION64_PATH").is_none() {
            cmd.env("CUDA_INJECTION64_PATH", lib);
        }
    }
    if let Some(sock) = &inject.socket {
        cmd.env("SLO_PROBE_SOCKET", sock);
    }
    // SAFETY: the hook only calls async-signal-safe functions (dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps FD_CLOEXEC, so clear it explicitly in that case.
            let rc = if read_fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(read_fd, 3)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    // SAFETY: read_fd is ours and used nowhere else in the parent.
    unsafe { libc::close(read_fd) };
    // SAFETY: write_fd is ours; the File owns and closes it.
    let release = unsafe { std::fs::File::from_raw_fd(write_fd) };
    Ok((child.map_err(spawn_err)?, release))
}

/// Runs `command`, ticks the collector until `duration` has passed or the command ended, and
/// returns the final state. Progress goes to stderr once a second.
pub fn run(
    collector: &mut Collector,
    command: &[String],
    duration: Duration,
    tick: Duration,
    inject: &Inject,
) -> Result<Observation, ObserveError> {
    let (mut child, mut release) = spawn_held(command, inject)?;
    let root = child.id();
    if let Err(e) = collector.add_root(root) {
        stop_child(&mut child);
        return Err(ObserveError::Track(e));
    }
    let _ = release.write_all(&[1]);
    drop(release);
    let start = Instant::now();
    let mut exit = None;
    let mut last_progress = Instant::now();
    let mut pids = BTreeSet::from([root]);
    loop {
        let remaining = duration.saturating_sub(start.elapsed());
        std::thread::sleep(remaining.min(tick).min(Duration::from_millis(200)));
        if let Ok(Some(status)) = child.try_wait() {
            exit = Some(status);
            break;
        }
        if start.elapsed() >= duration {
            break;
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let s = collector.tick();
            if let Some(t) = &s.threads {
                pids.extend(t.processes.iter().map(|p| p.pid));
            }
            let waits: u64 = s
                .threads
                .iter()
                .flat_map(|t| &t.processes)
                .map(|p| p.counts.runq.count)
                .sum();
            eprintln!(
                "slo-probe: observing pid {root}: {:.0}/{:.0} s, {} processes, {waits} run-queue \
                 waits so far",
                start.elapsed().as_secs_f64(),
                duration.as_secs_f64(),
                pids.len()
            );
        }
    }
    // Read once more while the threads still exist (or just after they exited, so their final
    // entries are in), then stop the command if it is still running.
    if collector.shim().is_some() && exit.is_none() {
        // Give a shim that is still running one flush period to hand over its last records.
        std::thread::sleep(Duration::from_millis(300));
    }
    collector.finish_gpu();
    let snapshot = collector.tick();
    if let Some(t) = &snapshot.threads {
        pids.extend(t.processes.iter().map(|p| p.pid));
    }
    let elapsed = start.elapsed();
    if exit.is_none() {
        stop_child(&mut child);
    }
    Ok(Observation {
        snapshot,
        pids,
        elapsed,
        exit,
    })
}

/// A duration in ns, human-readable (`830 ns`, `12.4 µs`, `3.10 ms`, `1.25 s`).
pub fn human_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Bytes, human-readable.
pub fn human_bytes(b: u64) -> String {
    let b = b as f64;
    if b < 1024.0 {
        format!("{b:.0} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.2} GiB", b / 1024.0 / 1024.0 / 1024.0)
    }
}

fn quantiles(c: &RunqCounts) -> [String; 3] {
    let q = |q: f64| c.quantile_ns(q).map_or("-".to_owned(), human_ns);
    [q(0.5), q(0.99), human_ns(c.max_ns as f64)]
}

fn thread_row(out: &mut String, pid: u32, tid: &str, name: &str, role: &str, c: &ThreadCounts) {
    let [p50, p99, max] = quantiles(&c.runq);
    let _ = writeln!(
        out,
        "{pid:>7} {tid:>7}  {name:<16} {role:<13} {:>7} {:>10} {p50:>9} {p99:>9} {max:>9} \
         {:>9} {:>9}",
        c.runq.count,
        human_ns(c.runq.total_ns as f64),
        human_ns(c.offcpu_voluntary_ns as f64),
        human_ns(c.offcpu_involuntary_ns as f64),
    );
}

/// The report printed at the end of `observe`: per role, then the threads with the longest
/// run-queue waits (at most `top`), the processes, TCP connections, cgroups, outliers and drops.
pub fn report(obs: &Observation, command: &str, top: usize) -> String {
    let mut out = String::new();
    let s = &obs.snapshot;
    let status = match obs.exit {
        Some(st) => format!("exited with {st}"),
        None => "still running; stopped".to_owned(),
    };
    let _ = writeln!(
        out,
        "slo-probe observed `{command}` for {:.1} s ({status}): {} processes",
        obs.elapsed.as_secs_f64(),
        obs.pids.len()
    );
    let Some(t) = &s.threads else {
        let reason = s
            .probes
            .iter()
            .map(|p| format!("{}: {}", p.name, p.reason))
            .collect::<Vec<_>>()
            .join("; ");
        let _ = writeln!(out, "no per-thread data: {reason}");
        return out;
    };

    let by_role = t.by_role(Some(&obs.pids));
    let retrans = |role: Role| -> u64 {
        s.net.as_ref().map_or(0, |n| {
            n.retransmits
                .iter()
                .filter(|((pid, r), _)| *r == role && obs.pids.contains(pid))
                .map(|(_, n)| n)
                .sum()
        })
    };
    let _ = writeln!(
        out,
        "\nby thread role (run-queue wait = runnable, waiting for a CPU):"
    );
    let _ = writeln!(
        out,
        "{:<14} {:>7} {:>8} {:>10} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "role",
        "threads",
        "waits",
        "run-queue",
        "p50",
        "p99",
        "max",
        "off-cpu v",
        "off-cpu i",
        "tcp sent",
        "tcp recv",
        "retrans"
    );
    for role in Role::ALL {
        let Some(c) = by_role.get(&role) else {
            continue;
        };
        let threads = t
            .threads
            .iter()
            .filter(|th| th.role == role && obs.pids.contains(&th.pid))
            .count();
        let [p50, p99, max] = quantiles(&c.runq);
        let _ = writeln!(
            out,
            "{:<14} {threads:>7} {:>8} {:>10} {p50:>9} {p99:>9} {max:>9} {:>10} {:>10} {:>10} \
             {:>10} {:>7}",
            role.as_str(),
            c.runq.count,
            human_ns(c.runq.total_ns as f64),
            human_ns(c.offcpu_voluntary_ns as f64),
            human_ns(c.offcpu_involuntary_ns as f64),
            human_bytes(c.tcp_sent_bytes),
            human_bytes(c.tcp_recv_bytes),
            retrans(role),
        );
    }

    let mut threads: Vec<_> = t
        .threads
        .iter()
        .filter(|th| obs.pids.contains(&th.pid))
        .collect();
    threads.sort_by_key(|th| std::cmp::Reverse(th.counts.runq.total_ns));
    let _ = writeln!(out, "\nthreads with the longest run-queue waits:");
    let _ = writeln!(
        out,
        "{:>7} {:>7}  {:<16} {:<13} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "pid",
        "tid",
        "thread",
        "role",
        "waits",
        "run-queue",
        "p50",
        "p99",
        "max",
        "off-cpu v",
        "off-cpu i"
    );
    for th in threads.iter().take(top) {
        let name = if th.exited {
            format!("{}*", th.name)
        } else {
            th.name.clone()
        };
        thread_row(
            &mut out,
            th.pid,
            &th.tid.to_string(),
            &name,
            th.role.as_str(),
            &th.counts,
        );
    }
    if threads.len() > top {
        let _ = writeln!(out, "  ... {} more threads", threads.len() - top);
    }
    if threads.iter().any(|th| th.exited) {
        let _ = writeln!(out, "  (* exited)");
    }

    let _ = writeln!(out, "\nprocesses:");
    for p in t.processes.iter().filter(|p| obs.pids.contains(&p.pid)) {
        let _ = writeln!(
            out,
            "{:>7} (parent {:>7})  {:<16} {:<11} {:>3} threads, {} run-queue waits",
            p.pid,
            p.ppid,
            p.name,
            p.kind.as_str(),
            p.threads,
            p.counts.runq.count
        );
    }

    if let Some(net) = &s.net {
        let conns: Vec<_> = net
            .conns
            .iter()
            .filter(|c| obs.pids.contains(&c.pid))
            .collect();
        let _ = writeln!(out, "\nTCP connections: {}", conns.len());
        for c in conns.iter().take(5) {
            let (local, remote) = endpoints(&c.tuple);
            let _ = writeln!(
                out,
                "  {local} -> {remote}  {} ({}, tid {})  {} retransmits, srtt {}, cwnd {}",
                c.process,
                c.role,
                c.tid,
                c.retransmits,
                human_ns(f64::from(c.srtt_us) * 1e3),
                c.snd_cwnd
            );
        }
    } else if let Some(p) = s.probes.iter().find(|p| p.name == "tcp" && !p.up) {
        let _ = writeln!(out, "\nTCP: down: {}", p.reason);
    }

    if !s.cgroups.is_empty() {
        let _ = writeln!(out, "\ncgroups:");
        for c in &s.cgroups {
            let limit = c
                .limit
                .and_then(|l| l.cpus())
                .map_or("no limit".to_owned(), |cpus| {
                    format!("limit {cpus:.2} CPUs")
                });
            let throttled = c.cpu.map_or("no bandwidth control".to_owned(), |st| {
                format!(
                    "throttled {}/{} periods, {} since the cgroup was created",
                    st.nr_throttled,
                    st.nr_periods,
                    human_ns(st.throttled_ns as f64)
                )
            });
            let roles: Vec<&str> = c.roles.iter().map(|r| r.as_str()).collect();
            let _ = writeln!(
                out,
                "  v{} {}  {limit}, {throttled}; roles {}",
                c.version,
                c.path,
                roles.join(",")
            );
        }
    }

    for p in s.shims.iter().filter(|p| obs.pids.contains(&p.pid)) {
        gpu_report(&mut out, p);
    }
    let ranks: Vec<_> = s
        .shims
        .iter()
        .filter(|p| obs.pids.contains(&p.pid))
        .cloned()
        .collect();
    straggler_report(&mut out, &ranks);
    if let Some(g) = &s.gpus {
        for d in &g.devices {
            let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}%"));
            let _ = writeln!(
                out,
                "GPU {} {} (NVML, last sample): utilisation {}, memory {} of {}, SM clock {} MHz, \
                 power {} W; GPM: SM occupancy {}, DRAM bandwidth {}, tensor {}",
                d.index,
                d.name,
                pct(d.gpu_util_percent),
                d.memory_used_bytes.map_or("-".into(), human_bytes),
                d.memory_total_bytes.map_or("-".into(), human_bytes),
                d.sm_clock_mhz.map_or("-".into(), |v| v.to_string()),
                d.power_watts.map_or("-".into(), |v| format!("{v:.0}")),
                pct(d.gpm.sm_occupancy_percent),
                pct(d.gpm.dram_bw_util_percent),
                pct(d.gpm.any_tensor_util_percent),
            );
        }
    }

    let outliers: u64 = obs
        .pids
        .iter()
        .filter_map(|pid| s.outliers.per_process.get(pid))
        .sum();
    let _ = writeln!(
        out,
        "\nrun-queue outliers (waits above the threshold): {outliers}"
    );
    for o in s
        .outliers
        .recent
        .iter()
        .rev()
        .filter(|o| obs.pids.contains(&o.pid))
        .take(5)
    {
        let _ = writeln!(
            out,
            "  {} tid {} ({}) on cpu {} after {} (behind tid {})",
            human_ns(o.delay_ns as f64),
            o.tid,
            o.thread,
            o.cpu,
            if o.preempted {
                "a preemption"
            } else {
                "a wakeup"
            },
            o.prev_tid
        );
    }
    let drops: Vec<String> = Counter::ALL
        .iter()
        .filter(|c| c.is_drop() || **c == Counter::DecodeFailed || **c == Counter::ProbeReadFailed)
        .filter(|c| s.counters[**c as usize] > 0)
        .map(|c| format!("{} {}", c.name(), s.counters[*c as usize]))
        .collect();
    let _ = writeln!(
        out,
        "drops and errors: {}",
        if drops.is_empty() {
            "none".to_owned()
        } else {
            drops.join(", ")
        }
    );
    let down: Vec<String> = s
        .probes
        .iter()
        .filter(|p| !p.up)
        .map(|p| format!("{} ({})", p.name, p.reason))
        .collect();
    if !down.is_empty() {
        let _ = writeln!(out, "probes down: {}", down.join("; "));
    }
    out
}

fn gpu_report(out: &mut String, p: &slo_probe_core::gputrace::ShimProcess) {
    use slo_probe_common::ring::{STATUS_DIAGNOSTIC, STATUS_LOST_RACE, STATUS_TRACING};
    let _ = writeln!(
        out,
        "\nGPU (CUPTI shim of pid {}, CUPTI {}): {} records ({} kernels, {} graph launches, {} \
         memory ops, {} graph nodes, {} steps); dropped {} by the shim, {} by CUPTI{}{}",
        p.pid,
        p.cupti_version,
        p.records,
        p.seen[0],
        p.seen[1],
        p.seen[2],
        p.seen[3],
        p.seen[5] / 2,
        p.dropped,
        p.cupti_dropped,
        if p.status & STATUS_LOST_RACE != 0 {
            "; LOST the CUPTI race (another tool subscribed first)"
        } else if p.status & STATUS_TRACING == 0 {
            "; not tracing"
        } else {
            ""
        },
        if p.status & STATUS_DIAGNOSTIC != 0 {
            "; node-level tracing on"
        } else {
            ""
        },
    );
    iterations_report(out, p);
}

/// The straggler view of every job with two or more ranks in the observed tree.
pub fn straggler_report(out: &mut String, shims: &[slo_probe_core::gputrace::ShimProcess]) {
    let views = slo_probe_core::straggler::stragglers(shims);
    let mut job = "";
    for v in &views {
        if v.job_id != job {
            job = &v.job_id;
            let _ = writeln!(
                out,
                "Stragglers of job {job} (each rank against the median of the others; named from \
                 noncomm {} or host delay {}):",
                slo_probe_core::straggler::NONCOMM_OUTLIER,
                slo_probe_core::straggler::HOST_OUTLIER
            );
        }
        let score = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.2}"));
        let _ = writeln!(
            out,
            "  rank {:>3} pid {:>7}: noncomm {} ({}), host delay {} ({}){}",
            v.rank,
            v.pid,
            v.noncomm_s.map_or("-".to_owned(), |x| human_ns(x * 1e9)),
            score(v.noncomm_score),
            v.host_delay_ms_per_s
                .map_or("-".to_owned(), |x| format!("{x:.1} ms/s")),
            score(v.host_score),
            v.straggler
                .as_deref()
                .map_or(String::new(), |c| format!("  <- the straggler: {c}"))
        );
    }
}

/// The SLO tree as of its last window, and its violations with their causal chains.
pub fn slo_report(out: &mut String, s: &slo_probe_core::slo::SloSnapshot) {
    use slo_probe_core::slo::ROOT;
    let root = &s.nodes[0];
    let _ = writeln!(
        out,
        "  SLO tree ({} windows of {}, {} iterations{}): score {}",
        s.windows,
        human_ns(s.window_ns as f64),
        s.iterations,
        if s.learning {
            "; learning baselines"
        } else {
            ""
        },
        root.compliance
            .map_or("-".to_owned(), |c| format!("{:.1}%", 100.0 * c)),
    );
    let _ = writeln!(
        out,
        "    {:<34} {:>11} {:>22} {:>11} {:>10} {:>6}  state",
        "node", "value", "threshold", "baseline", "compliance", "burn"
    );
    fn walk(out: &mut String, s: &slo_probe_core::slo::SloSnapshot, parent: &str, depth: usize) {
        for n in s.nodes.iter().skip(1).filter(|n| n.parent == parent) {
            let num = |v: Option<f64>| match v {
                Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
                Some(v) => format!("{v:.2}"),
                None => "-".to_owned(),
            };
            let name = format!(
                "{}{} {}",
                "  ".repeat(depth),
                n.name,
                n.stat.map_or("", |s| s.as_str())
            );
            let threshold = n.threshold.map_or("-".to_owned(), |(t, src)| {
                format!(
                    "{} {} {}",
                    match n.objective {
                        Some(slo_probe_core::slo::Objective::Above) => ">",
                        _ => "<",
                    },
                    num(Some(t)),
                    src.as_str()
                )
            });
            let _ = writeln!(
                out,
                "    {:<34} {:>11} {:>22} {:>11} {:>10} {:>6}  {}",
                name,
                format!("{} {}", num(n.value), n.unit),
                threshold,
                num(n.baseline),
                n.compliance
                    .map_or("-".to_owned(), |c| format!("{:.1}%", 100.0 * c)),
                num(n.burn_rate),
                n.state.as_str()
            );
            walk(out, s, &n.name, depth + 1);
        }
    }
    walk(out, s, ROOT, 0);
    if s.violations.is_empty() {
        let _ = writeln!(out, "  violations: none");
    }
    for v in &s.violations {
        let _ = writeln!(
            out,
            "  violation #{} ({}, {}): {}",
            v.id,
            v.severity.as_str(),
            if v.closed_ns.is_some() {
                "closed"
            } else {
                "open"
            },
            v.chain
        );
        if let Some(a) = &v.attribution {
            for c in a.causes.iter().skip(1) {
                let _ = writeln!(
                    out,
                    "      also {} {:+.2} ms per iteration ({}: {})",
                    c.op,
                    c.delta_ns / 1e6,
                    c.dimension.as_str(),
                    c.detail
                );
            }
        }
    }
}

/// The iterations of one process: wall time, GPU busy, kernels and graph launches, launch
/// latency, what NVML saw, and the operators by GPU time.
pub fn iterations_report(out: &mut String, p: &slo_probe_core::gputrace::ShimProcess) {
    if p.iterations.is_empty() {
        let _ = writeln!(out, "  no complete iteration");
        return;
    }
    let mut walls: Vec<u64> = p.iterations.iter().map(|i| i.wall_ns()).collect();
    walls.sort_unstable();
    let q = |v: &[u64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    // Per iteration, then the median: warm-up iterations (compilation, autotuning) last seconds
    // and would swamp a ratio of sums.
    let mut busy: Vec<f64> = p
        .iterations
        .iter()
        .map(|i| i.gpu_busy_ns as f64 / i.wall_ns().max(1) as f64)
        .collect();
    busy.sort_by(f64::total_cmp);
    let lat = p.launch_latencies_ns();
    let _ = writeln!(
        out,
        "  {} iterations ({}): wall p50 {}, p99 {}; GPU busy p50 {:.1}%; {:.1} kernels and {:.1} graph \
         launches per iteration; launch latency p50 {}, p99 {}; GPU idle before the first kernel \
         {} on average",
        p.iterations.len(),
        if p.iterations[0].marked {
            "step markers"
        } else {
            "detected"
        },
        human_ns(q(&walls, 0.5) as f64),
        human_ns(q(&walls, 0.99) as f64),
        100.0 * busy[busy.len() / 2],
        p.iterations.iter().map(|i| f64::from(i.kernels)).sum::<f64>() / p.iterations.len() as f64,
        p.iterations
            .iter()
            .map(|i| f64::from(i.graph_launches))
            .sum::<f64>()
            / p.iterations.len() as f64,
        if lat.is_empty() {
            "-".into()
        } else {
            human_ns(q(&lat, 0.5) as f64)
        },
        if lat.is_empty() {
            "-".into()
        } else {
            human_ns(q(&lat, 0.99) as f64)
        },
        human_ns(
            p.iterations
                .iter()
                .map(|i| i.idle_before_first_ns as f64)
                .sum::<f64>()
                / p.iterations.len() as f64
        ),
    );
    nvml_during_iterations(out, &p.iterations);
    // (GPU ns, kernels, occupancy × ns, ns with an occupancy)
    let mut ops: std::collections::BTreeMap<&str, (u64, u32, f64, u64)> = Default::default();
    for i in &p.iterations {
        for o in &i.ops {
            let e = ops.entry(&*o.op).or_default();
            e.0 += o.gpu_ns;
            e.1 += o.kernels;
            if let Some(occ) = o.occupancy {
                e.2 += occ * o.gpu_ns as f64;
                e.3 += o.gpu_ns;
            }
        }
    }
    let mut ops: Vec<_> = ops.into_iter().collect();
    ops.sort_by_key(|o| std::cmp::Reverse(o.1 .0));
    let total: u64 = ops.iter().map(|o| o.1 .0).sum();
    let _ = writeln!(out, "  operators by GPU time:");
    for (op, (ns, k, occ_w, occ_ns)) in ops.iter().take(8) {
        let occ = if *occ_ns > 0 {
            format!(
                ", theoretical occupancy {:.0}%",
                100.0 * occ_w / *occ_ns as f64
            )
        } else {
            String::new()
        };
        let runs = op
            .strip_prefix("graph#")
            .and_then(|id| id.parse::<u32>().ok())
            .and_then(|id| p.graph_ops.get(&id))
            .map(|ops| {
                let list: Vec<String> = ops
                    .iter()
                    .take(4)
                    .map(|(o, share)| format!("{o} {:.0}%", 100.0 * share))
                    .collect();
                format!(
                    " = {}{}",
                    list.join(", "),
                    if ops.len() > 4 { ", …" } else { "" }
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "    {:>5.1}%  {op} ({k} {}{occ}){runs}",
            100.0 * *ns as f64 / total.max(1) as f64,
            if op.starts_with("graph#") {
                "launches"
            } else if op.contains("memcpy") || op.contains("memset") {
                "operations"
            } else {
                "kernels"
            }
        );
    }
    if let Some(slo) = &p.slo {
        slo_report(out, slo);
    }
}

/// What NVML saw while the iterations ran: medians over the iterations that have samples (the
/// warm-up iterations, seconds long and mostly idle, do not weigh more), and the lowest SM clock.
fn nvml_during_iterations(out: &mut String, iterations: &[slo_probe_core::gputrace::Iteration]) {
    let aligned: Vec<_> = iterations.iter().filter_map(|i| i.gpu.as_ref()).collect();
    if aligned.is_empty() {
        // No NVML (no driver, or a replayed recording): nothing to say.
        return;
    }
    let median = |f: &dyn Fn(&slo_probe_core::gpu::IterationGpu) -> Option<f64>| {
        let mut v: Vec<f64> = aligned.iter().filter_map(|g| f(g)).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}%"));
    let min_clock = aligned
        .iter()
        .filter_map(|g| g.sm_clock_mhz)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))));
    let _ = writeln!(
        out,
        "  NVML during iterations ({} of {} with samples, GPU {}), medians: utilisation {}, SM \
         clock {} MHz (lowest {}), power {} W; GPM: SM occupancy {}, SM active {}, DRAM \
         bandwidth {}, tensor {}",
        aligned.len(),
        iterations.len(),
        aligned[0].index,
        pct(median(&|g| g.gpu_util_percent)),
        median(&|g| g.sm_clock_mhz).map_or("-".into(), |v| format!("{v:.0}")),
        min_clock.map_or("-".into(), |v| format!("{v:.0}")),
        median(&|g| g.power_watts).map_or("-".into(), |v| format!("{v:.0}")),
        pct(median(&|g| g.sm_occupancy_percent)),
        pct(median(&|g| g.sm_util_percent)),
        pct(median(&|g| g.dram_bw_util_percent)),
        pct(median(&|g| g.tensor_util_percent)),
    );
}

/// One process's shim counters and iterations as JSON.
pub fn shim_json(p: &slo_probe_core::gputrace::ShimProcess) -> serde_json::Value {
    use serde_json::json;
    json!({
        "pid": p.pid,
        "connected": p.connected,
        "status": p.status,
        "cupti_version": p.cupti_version,
        "records": p.records,
        "dropped": p.dropped,
        "cupti_dropped": p.cupti_dropped,
        "corrupt_bytes": p.corrupt_bytes,
        "decode_failed": p.decode_failed,
        "late": p.late,
        "seen": {
            "kernels": p.seen[0], "graphs": p.seen[1], "memory": p.seen[2],
            "graph_nodes": p.seen[3], "strings": p.seen[4], "steps": p.seen[5],
        },
        "slo": p.slo.as_ref().map(slo_json),
        "graph_ops": p.graph_ops.iter().map(|(g, ops)| (g.to_string(), json!(ops)))
            .collect::<serde_json::Map<_, _>>(),
        "iterations": p.iterations.iter().map(|i| json!({
            "step": i.step,
            "marked": i.marked,
            "start_ns": i.start_ns,
            "end_ns": i.end_ns,
            "wall_ns": i.wall_ns(),
            "gpu_busy_ns": i.gpu_busy_ns,
            "gpu_span_ns": i.gpu_span_ns(),
            "kernels": i.kernels,
            "graph_launches": i.graph_launches,
            "memory_ops": i.memory_ops,
            "idle_before_first_ns": i.idle_before_first_ns,
            "occupancy": i.occupancy,
            "launch_latency_p50_ns": i.launch_latency_ns(0.5),
            "launch_latency_p99_ns": i.launch_latency_ns(0.99),
            "ops": i.ops.iter().take(20).map(|o| json!({
                "op": &*o.op, "kind": o.kind.as_str(), "gpu_ns": o.gpu_ns,
                "kernels": o.kernels, "occupancy": o.occupancy, "gap_ns": o.gap_ns,
                "launch_latency_ns": o.launch_latency_ns, "bytes": o.bytes,
            })).collect::<Vec<_>>(),
            "device": i.device,
            "gpu": i.gpu.as_ref().map(iteration_gpu_json),
        })).collect::<Vec<_>>(),
    })
}

/// The SLO tree and violations as JSON.
pub fn slo_json(s: &slo_probe_core::slo::SloSnapshot) -> serde_json::Value {
    use serde_json::json;
    let nodes: Vec<_> = s
        .nodes
        .iter()
        .map(|n| {
            json!({
                "name": n.name,
                "parent": n.parent,
                "metric": n.metric.map(|m| m.as_str()),
                "stat": n.stat.map(|m| m.as_str()),
                "unit": n.unit,
                "weight": n.weight,
                "value": n.value,
                "threshold": n.threshold.map(|t| t.0),
                "threshold_source": n.threshold.map(|t| t.1.as_str()),
                "baseline": n.baseline,
                "compliance": n.compliance,
                "burn_rate": n.burn_rate,
                "state": n.state.as_str(),
                "windows": n.windows,
                "violations": n.violations,
            })
        })
        .collect();
    let violations: Vec<_> = s.violations.iter().map(violation_json).collect();
    json!({
        "windows": s.windows,
        "window_ns": s.window_ns,
        "iterations": s.iterations,
        "learning": s.learning,
        "nodes": nodes,
        "violations": violations,
    })
}

fn violation_json(v: &slo_probe_core::slo::Violation) -> serde_json::Value {
    use serde_json::json;
    let causes = v.attribution.as_ref().map(|a| {
        a.causes
            .iter()
            .map(|c| {
                json!({
                    "op": c.op,
                    "dimension": c.dimension.as_str(),
                    "delta_ns": c.delta_ns,
                    "detail": c.detail,
                })
            })
            .collect::<Vec<_>>()
    });
    let host = v
        .attribution
        .as_ref()
        .map(|a| a.host.iter().map(|h| h.what.clone()).collect::<Vec<_>>());
    json!({
        "id": v.id,
        "node": v.node,
        "severity": v.severity.as_str(),
        "since_ns": v.since_ns,
        "opened_ns": v.opened_ns,
        "closed_ns": v.closed_ns,
        "value": v.value,
        "threshold": v.threshold,
        "baseline": v.baseline,
        "chain": v.chain,
        "causes": causes,
        "host_causes": host,
    })
}

fn iteration_gpu_json(g: &slo_probe_core::gpu::IterationGpu) -> serde_json::Value {
    serde_json::json!({
        "nvml_index": g.index,
        "samples": g.samples,
        "covered_ns": g.covered_ns,
        "gpu_util_percent": g.gpu_util_percent,
        "sm_clock_mhz": g.sm_clock_mhz,
        "memory_clock_mhz": g.memory_clock_mhz,
        "power_watts": g.power_watts,
        "memory_used_bytes": g.memory_used_bytes,
        "sm_occupancy_percent": g.sm_occupancy_percent,
        "sm_util_percent": g.sm_util_percent,
        "dram_bw_util_percent": g.dram_bw_util_percent,
        "tensor_util_percent": g.tensor_util_percent,
        "pcie_bytes_per_sec": g.pcie_bytes_per_sec,
        "nvlink_bytes_per_sec": g.nvlink_bytes_per_sec,
    })
}

/// The observation as JSON (for scripts): per process of the job, the shim's counters and every
/// iteration, and the host view by role.
pub fn json(obs: &Observation, command: &str) -> serde_json::Value {
    use serde_json::json;
    let s = &obs.snapshot;
    let shims: Vec<_> = s
        .shims
        .iter()
        .filter(|p| obs.pids.contains(&p.pid))
        .map(shim_json)
        .collect();
    let roles: serde_json::Map<String, serde_json::Value> = s
        .threads
        .as_ref()
        .map(|t| {
            t.by_role(Some(&obs.pids))
                .into_iter()
                .map(|(r, c)| {
                    (
                        r.as_str().to_owned(),
                        json!({
                            "runq_waits": c.runq.count,
                            "runq_ns": c.runq.total_ns,
                            "offcpu_voluntary_ns": c.offcpu_voluntary_ns,
                            "offcpu_involuntary_ns": c.offcpu_involuntary_ns,
                            "tcp_sent_bytes": c.tcp_sent_bytes,
                            "tcp_recv_bytes": c.tcp_recv_bytes,
                        }),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "command": command,
        "elapsed_s": obs.elapsed.as_secs_f64(),
        "exit_code": obs.exit.and_then(|e| e.code()),
        "pids": obs.pids.iter().collect::<Vec<_>>(),
        "roles": roles,
        "gpu": shims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_ns(830.0), "830 ns");
        assert_eq!(human_ns(12_400.0), "12.4 µs");
        assert_eq!(human_ns(3_100_000.0), "3.10 ms");
        assert_eq!(human_ns(1_250_000_000.0), "1.25 s");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3.0 MiB");
    }

    #[test]
    fn held_child_runs_only_when_released() {
        let (mut child, mut release) = spawn_held(
            &["sh".into(), "-c".into(), "exit 7".into()],
            &Inject::default(),
        )
        .expect("spawn");
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "ran before release"
        );
        release.write_all(&[1]).expect("release");
        drop(release);
        assert_eq!(child.wait().expect("wait").code(), Some(7));
    }

    #[test]
    fn straggler_report_names_the_starved_rank() {
        use slo_probe_core::{
            gputrace::{Iteration, ShimProcess},
            slo::{NodeView, SloSnapshot},
        };
        let rank = |pid: u32, r: u32, main_ms_per_s: f64| ShimProcess {
            pid,
            rank: Some(r),
            job_id: Some("ddp".into()),
            iterations: vec![
                Iteration {
                    end_ns: 400_000_000,
                    ..Default::default()
                };
                5
            ],
            slo: Some(SloSnapshot {
                nodes: vec![NodeView {
                    name: "host.runqueue.main".into(),
                    value: Some(main_ms_per_s),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut out = String::new();
        straggler_report(&mut out, &[rank(10, 0, 0.5), rank(11, 1, 120.0)]);
        assert!(out.starts_with("Stragglers of job ddp"), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(!lines[1].contains("straggler:"), "{out}");
        assert!(
            lines[2].contains("rank   1")
                && lines[2].ends_with("<- the straggler: host.runqueue.main"),
            "{out}"
        );
    }
}
