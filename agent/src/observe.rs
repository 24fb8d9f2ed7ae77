//! `slo-probe observe`: run a command, watch its process tree for a while, print what the probes
//! measured for its threads. The one-shot form of the agent, for trying it out and for scripts.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

use slo_probe_common::Counter;
use slo_probe_core::{runq::RunqCounts, snapshot::Snapshot};

use crate::collector::Collector;

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

/// Parent pid of `pid` from `/proc/<pid>/stat` (`None` once it is gone).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Adds every live descendant of a pid already in `tree` to it.
fn add_descendants(tree: &mut BTreeSet<u32>) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // Repeat until nothing is added, so grandchildren listed before their parent are found.
    loop {
        let before = tree.len();
        for &pid in &pids {
            if !tree.contains(&pid) && parent_of(pid).is_some_and(|pp| tree.contains(&pp)) {
                tree.insert(pid);
            }
        }
        if tree.len() == before {
            break;
        }
    }
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

/// Runs `command`, ticks the collector until `duration` has passed or the command ended, and
/// returns the final state. Progress goes to stderr once a second.
pub fn run(
    collector: &mut Collector,
    command: &[String],
    duration: Duration,
    tick: Duration,
) -> Result<Observation, ObserveError> {
    let line = command.join(" ");
    let (program, args) = command.split_first().ok_or_else(|| ObserveError::Spawn {
        command: String::new(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
    })?;
    // Take a first reading before the command starts, so its first waits are not lost.
    collector.tick();
    let start = Instant::now();
    let mut child =
        Command::new(program)
            .args(args)
            .spawn()
            .map_err(|source| ObserveError::Spawn {
                command: line.clone(),
                source,
            })?;
    let root = child.id();
    let mut pids = BTreeSet::from([root]);
    let mut exit = None;
    let mut last_progress = Instant::now();
    loop {
        let remaining = duration.saturating_sub(start.elapsed());
        std::thread::sleep(remaining.min(tick).min(Duration::from_millis(200)));
        add_descendants(&mut pids);
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
            let waits: u64 = s
                .runq
                .iter()
                .flat_map(|r| &r.processes)
                .filter(|p| pids.contains(&p.pid))
                .map(|p| p.counts.count)
                .sum();
            eprintln!(
                "slo-probe: observing pid {root}: {:.0}/{:.0} s, {waits} run-queue waits so far",
                start.elapsed().as_secs_f64(),
                duration.as_secs_f64()
            );
        }
    }
    // Read once more while the threads still exist (or just after they exited, so their final
    // histograms are in), then stop the command if it is still running.
    let snapshot = collector.tick();
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

fn row(out: &mut String, pid: u32, tid: &str, name: &str, c: &RunqCounts) {
    let q = |q: f64| c.quantile_ns(q).map_or("-".to_owned(), human_ns);
    let _ = writeln!(
        out,
        "{pid:>7} {tid:>7}  {name:<16} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6.0}%",
        c.count,
        human_ns(c.total_ns as f64),
        c.mean_ns().map_or("-".to_owned(), human_ns),
        q(0.5),
        q(0.99),
        human_ns(c.max_ns as f64),
        if c.count > 0 {
            100.0 * c.preempted as f64 / c.count as f64
        } else {
            0.0
        },
    );
}

/// The report printed at the end of `observe`: the threads of `pids`, longest total wait
/// first (at most `top` rows), a total per process, outliers and drops.
pub fn report(obs: &Observation, command: &str, top: usize) -> String {
    let mut out = String::new();
    let s = &obs.snapshot;
    let status = match obs.exit {
        Some(st) => format!("exited with {st}"),
        None => "still running; stopped".to_owned(),
    };
    let _ = writeln!(
        out,
        "slo-probe observed `{command}` for {:.1} s ({status})",
        obs.elapsed.as_secs_f64()
    );
    let Some(runq) = &s.runq else {
        let reason = s
            .probes
            .iter()
            .map(|p| format!("{}: {}", p.name, p.reason))
            .collect::<Vec<_>>()
            .join("; ");
        let _ = writeln!(out, "no run-queue data: {reason}");
        return out;
    };
    let mut threads: Vec<_> = runq
        .threads
        .iter()
        .filter(|t| obs.pids.contains(&t.pid))
        .collect();
    threads.sort_by_key(|t| std::cmp::Reverse(t.counts.total_ns));
    let _ = writeln!(
        out,
        "\nrun-queue latency (time runnable, waiting for a CPU) per thread, since start:"
    );
    let _ = writeln!(
        out,
        "{:>7} {:>7}  {:<16} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "pid", "tid", "thread", "waits", "total", "mean", "p50", "p99", "max", "preempt"
    );
    for t in threads.iter().take(top) {
        let name = if t.exited {
            format!("{}*", t.name)
        } else {
            t.name.clone()
        };
        row(&mut out, t.pid, &t.tid.to_string(), &name, &t.counts);
    }
    if threads.len() > top {
        let _ = writeln!(out, "  ... {} more threads", threads.len() - top);
    }
    if threads.iter().any(|t| t.exited) {
        let _ = writeln!(out, "  (* exited)");
    }
    let _ = writeln!(out);
    for p in runq.processes.iter().filter(|p| obs.pids.contains(&p.pid)) {
        row(&mut out, p.pid, "all", &p.name, &p.counts);
    }
    if threads.is_empty() {
        let _ = writeln!(
            out,
            "  (no thread of the command waited on a run queue while observed)"
        );
    }

    let outliers: u64 = obs
        .pids
        .iter()
        .filter_map(|pid| s.outliers.per_process.get(pid))
        .sum();
    let _ = writeln!(out, "\noutliers (waits above the threshold): {outliers}");
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
        "drops and errors (whole machine): {}",
        if drops.is_empty() {
            "none".to_owned()
        } else {
            drops.join(", ")
        }
    );
    out
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
    }

    #[test]
    fn parent_of_self_is_our_parent() {
        let me = std::process::id();
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() } as u32;
        assert_eq!(parent_of(me), Some(parent));
    }

    #[test]
    fn descendants_include_a_grandchild() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 2 & wait"])
            .spawn()
            .expect("sh");
        std::thread::sleep(Duration::from_millis(300));
        let mut tree = BTreeSet::from([child.id()]);
        add_descendants(&mut tree);
        let _ = child.kill();
        let _ = child.wait();
        assert!(tree.len() >= 2, "{tree:?}");
    }
}
