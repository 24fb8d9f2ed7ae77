//! The report of `slo-probe run`: its JSON ([`RunReport`]), the text summary beside it and the
//! lines printed at the end, and where they go (`-o NAME` or `slo-probe-<host>-<n>.json`,
//! written to a temporary file and renamed, never over an existing report without
//! `--force-overwrite`).

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{say, shell_join, HealMode, RunError};
use crate::{
    api::types::{self, Snapshot},
    cli::report::human_ns,
};

/// Version of the report's JSON.
pub const REPORT_VERSION: u32 = 1;

/// Errors writing the report (reported on stderr; they never change the exit status).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The report could not be encoded.
    #[error("cannot encode the report")]
    Encode(#[source] serde_json::Error),
    /// A file could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The command's exit, in the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Exit {
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Its name (`SIGKILL`).
    pub signal_name: Option<String>,
    /// It dumped core.
    pub core_dumped: bool,
}

/// The report `run` writes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunReport {
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// The command line.
    pub command: Vec<String>,
    /// Host name.
    pub node: String,
    /// When the command started, Unix time s.
    pub started_unix_s: f64,
    /// Its wall time, s.
    pub wall_s: f64,
    /// How it ended.
    pub exit: Exit,
    /// The first stop signal it got while running (`SIGINT`), if any.
    pub interrupted: Option<String>,
    /// It was killed after `--kill-after`.
    pub killed_after_timeout: bool,
    /// Which agent measured: `in-process`, `in-process without eBPF`, or the agent's URL.
    pub agent: String,
    /// Why measuring was partial or off, when it was.
    pub notes: Vec<String>,
    /// `--heal` (the mode the healer ran in is `state.healer.mode`; no healer: absent).
    pub heal: Option<HealMode>,
    /// The shim library injected (`CUDA_INJECTION64_PATH`), if `run` set it.
    pub injected: Option<String>,
    /// The command's processes seen.
    pub pids: Vec<u32>,
    /// The state at the end, for the command's processes (the state API's types).
    pub state: Snapshot,
}

/// Where the report goes.
pub(super) enum ReportTarget {
    /// `-o FILE`.
    Named { json: PathBuf, force: bool },
    /// `slo-probe-<host>-<n>.json` in the current directory.
    Numbered { node: String },
}

impl ReportTarget {
    pub(super) fn new(output: Option<&Path>, force: bool, node: &str) -> Result<Self, RunError> {
        let Some(out) = output else {
            return Ok(Self::Numbered {
                node: if node.is_empty() { "host" } else { node }.to_owned(),
            });
        };
        let json = if out.extension().is_some_and(|e| e == "json") {
            out.to_owned()
        } else {
            let mut s = out.as_os_str().to_owned();
            s.push(".json");
            PathBuf::from(s)
        };
        if !force {
            for p in [&json, &json.with_extension("txt")] {
                if p.exists() {
                    return Err(RunError::ReportExists {
                        path: p.display().to_string(),
                    });
                }
            }
        }
        Ok(Self::Named { json, force })
    }

    /// Writes the JSON and the text through temporary files; returns their paths.
    pub(super) fn write(&self, report: &RunReport) -> Result<(PathBuf, PathBuf), ReportError> {
        let json = serde_json::to_vec_pretty(report).map_err(ReportError::Encode)?;
        let text = text(report);
        match self {
            Self::Named { json: path, force } => {
                let tmp = temp_beside(path);
                write_file(&tmp, &json)?;
                let placed = if *force {
                    std::fs::rename(&tmp, path).map(|_| path.clone())
                } else {
                    place_new(&tmp, path).map(|_| path.clone())
                };
                let path = match placed {
                    Ok(p) => p,
                    // Appeared meanwhile: the numbered name beside it, never an overwrite.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        let dir = path.parent().unwrap_or(Path::new("."));
                        let stem = path
                            .file_stem()
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        let p = place_numbered(&tmp, dir, &stem)?;
                        say(&format!(
                            "{} appeared while the command ran; the report is {} instead",
                            path.display(),
                            p.display()
                        ));
                        p
                    }
                    Err(source) => {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(ReportError::Write {
                            path: path.display().to_string(),
                            source,
                        });
                    }
                };
                let txt = path.with_extension("txt");
                write_atomically(&txt, text.as_bytes())?;
                Ok((path, txt))
            }
            Self::Numbered { node } => {
                let dir = Path::new(".");
                let tmp = temp_beside(&dir.join("slo-probe-report.json"));
                write_file(&tmp, &json)?;
                let path = place_numbered(&tmp, dir, &format!("slo-probe-{node}"))?;
                let txt = path.with_extension("txt");
                write_atomically(&txt, text.as_bytes())?;
                Ok((strip_dot(path), strip_dot(txt)))
            }
        }
    }
}

fn strip_dot(p: PathBuf) -> PathBuf {
    p.strip_prefix(".").map(Path::to_path_buf).unwrap_or(p)
}

fn temp_beside(path: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    std::fs::write(path, bytes).map_err(|source| ReportError::Write {
        path: path.display().to_string(),
        source,
    })
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let tmp = temp_beside(path);
    write_file(&tmp, bytes)?;
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        ReportError::Write {
            path: path.display().to_string(),
            source,
        }
    })
}

/// Moves `tmp` to `path` unless `path` exists (a hard link fails then; where the file system
/// has none, an existence check and a rename).
fn place_new(tmp: &Path, path: &Path) -> std::io::Result<()> {
    match std::fs::hard_link(tmp, path) {
        Ok(()) => {
            let _ = std::fs::remove_file(tmp);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(e),
        Err(_) if path.exists() => Err(std::io::ErrorKind::AlreadyExists.into()),
        Err(_) => std::fs::rename(tmp, path),
    }
}

/// Moves `tmp` to `<dir>/<stem>-<n>.json` with the first `n` whose `.json` and `.txt` are
/// both free.
fn place_numbered(tmp: &Path, dir: &Path, stem: &str) -> Result<PathBuf, ReportError> {
    for n in 1u32.. {
        let path = dir.join(format!("{stem}-{n}.json"));
        if path.with_extension("txt").exists() {
            continue;
        }
        match place_new(tmp, &path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => {
                let _ = std::fs::remove_file(tmp);
                return Err(ReportError::Write {
                    path: path.display().to_string(),
                    source,
                });
            }
        }
    }
    Err(ReportError::Write {
        path: dir.join(format!("{stem}-N.json")).display().to_string(),
        source: std::io::ErrorKind::AlreadyExists.into(),
    })
}

/// How the command ended, in words.
fn ended(e: &Exit) -> String {
    match (e.code, &e.signal_name) {
        (Some(c), _) => format!("exited with {c}"),
        (None, Some(s)) => format!(
            "was killed by {s}{}",
            if e.core_dumped { " (core dumped)" } else { "" }
        ),
        (None, None) => "ended".to_owned(),
    }
}

fn ms(ns: Option<u64>) -> String {
    ns.map_or("-".to_owned(), |v| human_ns(v as f64))
}

fn score(x: Option<f64>) -> String {
    x.map_or("-".to_owned(), |x| format!("{x:.2}"))
}

/// The healer's mode as it ran (`off` when none ran), and `--heal` when it asked otherwise.
fn healer_mode(r: &RunReport) -> String {
    let mode = r.state.healer.as_ref().map_or("off", |h| h.mode.as_str());
    match r.heal.map(HealMode::as_str) {
        Some(asked) if asked != mode => format!("{mode} (--heal {asked}; see the notes)"),
        _ => mode.to_owned(),
    }
}

/// The healer's part of the summary: how many actions it decided and what became of them;
/// nothing when it decided none and `--heal` was not given.
fn healer_line(h: &types::Healer, asked: bool) -> Option<String> {
    let count = |kind: &str| h.timeline.iter().filter(|e| e.kind == kind).count();
    let actions: BTreeSet<(&str, u64)> = h
        .timeline
        .iter()
        .filter(|e| e.id > 0)
        .map(|e| (e.target.as_str(), e.id))
        .collect();
    if actions.is_empty() {
        return asked.then(|| format!("healer ({}): no action; {}", h.mode, h.state));
    }
    let parts: Vec<String> = [
        ("applied", count("applied")),
        ("shadow only", count("shadow")),
        ("kept", count("kept")),
        ("reverted", count("reverted")),
        ("failed", count("apply_failed") + count("revert_failed")),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(what, n)| format!("{n} {what}"))
    .collect();
    Some(format!(
        "healer ({}): {} action{}{}; the timeline is in the report",
        h.mode,
        actions.len(),
        if actions.len() == 1 { "" } else { "s" },
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        }
    ))
}

/// The lines `run` prints to stderr at the end.
pub fn summary(r: &RunReport) -> Vec<String> {
    let mut out = vec![format!(
        "`{}` {} after {:.1} s{}",
        shell_join(&r.command),
        ended(&r.exit),
        r.wall_s,
        r.interrupted
            .as_ref()
            .map_or(String::new(), |s| format!(" ({s} received)"))
    )];
    let procs = &r.state.processes;
    if procs.is_empty() {
        out.push(format!(
            "no training process registered a CUPTI shim (agent: {})",
            r.agent
        ));
    } else {
        let its: u64 = procs.iter().map(|p| p.iterations.total).sum();
        let open = r.state.open_violations();
        let mut line = format!(
            "{} training process{}, {its} iterations",
            procs.len(),
            if procs.len() == 1 { "" } else { "es" }
        );
        if let [p] = procs.as_slice() {
            let _ = write!(
                line,
                ": p50 {}, p99 {}",
                ms(p.iterations.wall_p50_ns),
                ms(p.iterations.wall_p99_ns)
            );
        }
        let _ = write!(
            line,
            "; {} open violation{}",
            open.len(),
            if open.len() == 1 { "" } else { "s" }
        );
        if let Some(v) = open.first() {
            let _ = write!(line, ": {}", v.chain);
        }
        out.push(line);
    }
    if let Some(line) = r
        .state
        .healer
        .as_ref()
        .and_then(|h| healer_line(h, r.heal.is_some()))
    {
        out.push(line);
    }
    out
}

/// The text report.
pub fn text(r: &RunReport) -> String {
    let mut out = String::new();
    let s = &r.state;
    let _ = writeln!(out, "slo-probe run report (version {})", r.version);
    let _ = writeln!(out, "command:    {}", shell_join(&r.command));
    let _ = writeln!(out, "node:       {}", r.node);
    let _ = writeln!(out, "wall time:  {:.1} s", r.wall_s);
    let _ = writeln!(
        out,
        "exit:       {}{}{}",
        ended(&r.exit),
        r.interrupted
            .as_ref()
            .map_or(String::new(), |s| format!("; {s} received while running")),
        if r.killed_after_timeout {
            "; SIGKILLed after the stop timeout"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "agent:      {}", r.agent);
    if r.heal.is_some() || s.healer.is_some() {
        let _ = writeln!(out, "healer:     {}", healer_mode(r));
    }
    if let Some(lib) = &r.injected {
        let _ = writeln!(out, "shim:       {lib}");
    }
    for n in &r.notes {
        let _ = writeln!(out, "note:       {n}");
    }

    let _ = writeln!(out, "\niterations:");
    if s.processes.is_empty() {
        let _ = writeln!(out, "  no training process registered a CUPTI shim");
    }
    for p in &s.processes {
        let who = match (p.rank, &p.job_id) {
            (Some(r), Some(j)) => format!("rank {r} of {j}, pid {}", p.pid),
            (Some(r), None) => format!("rank {r}, pid {}", p.pid),
            _ => format!("pid {}", p.pid),
        };
        let _ = writeln!(
            out,
            "  {who}: {} iterations, wall p50 {}, p99 {}; GPU busy {}; SLO score {}",
            p.iterations.total,
            ms(p.iterations.wall_p50_ns),
            ms(p.iterations.wall_p99_ns),
            p.iterations
                .gpu_busy_p50
                .map_or("-".to_owned(), |b| format!("{:.0}%", b * 100.0)),
            p.slo
                .as_ref()
                .and_then(|s| s.score)
                .map_or("-".to_owned(), |x| format!("{:.1}%", x * 100.0)),
        );
        if p.iterations.before_markers > 0 {
            let _ = writeln!(
                out,
                "    (counted from its step markers; {} iterations detected before they began \
                 were its warm-up and are left out)",
                p.iterations.before_markers
            );
        }
    }

    let _ = writeln!(out, "\nviolations:");
    let all: Vec<&types::Violation> = s.processes.iter().flat_map(|p| &p.violations).collect();
    if all.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for v in all {
        let _ = writeln!(
            out,
            "  pid {} #{} ({}, {}): {}",
            v.pid,
            v.id,
            v.severity.as_str(),
            if v.open { "open" } else { "closed" },
            v.chain
        );
        for c in v.causes.iter().skip(1) {
            let _ = writeln!(
                out,
                "      also {} {:+.2} ms per iteration ({}: {})",
                c.op,
                c.delta_ns / 1e6,
                c.dimension,
                c.detail
            );
        }
    }

    for p in s.processes.iter().filter(|p| !p.operators.is_empty()) {
        let _ = writeln!(out, "\ntop operators of pid {} (share of GPU time):", p.pid);
        for o in p.operators.iter().take(8) {
            let _ = writeln!(
                out,
                "  {:>5.1}%  {} ({}, {} per iteration)",
                100.0 * o.share,
                o.op,
                o.kind,
                human_ns(o.gpu_ns_per_iteration)
            );
        }
    }

    for j in s.jobs.iter().filter(|j| j.ranks.len() >= 2) {
        let _ = writeln!(
            out,
            "\nstragglers of job {} (NVRx scale, 1 = best; relative: the fastest rank over this \
             one; individual: its best iteration over its median):",
            j.id
        );
        for k in &j.ranks {
            let _ = writeln!(
                out,
                "  rank {:>3} pid {:>7}: relative {}, individual {}; noncomm ratio {}, host \
                 ratio {}{}",
                k.rank,
                k.pid,
                score(k.relative),
                score(k.individual),
                score(k.noncomm_ratio),
                score(k.host_ratio),
                k.straggler
                    .as_ref()
                    .map_or(String::new(), |c| format!("  <- the straggler: {c}"))
            );
        }
    }

    if !s.host.roles.is_empty() {
        let _ = writeln!(out, "\nhost by thread role:");
        for r in &s.host.roles {
            let _ = writeln!(
                out,
                "  {:<14} {:>4} threads, {} waiting for a CPU ({} waits), off-CPU {} blocked, \
                 {} preempted, {} TCP retransmits",
                r.role,
                r.threads,
                human_ns(r.runq_ns as f64),
                r.runq_waits,
                human_ns(r.offcpu_voluntary_ns as f64),
                human_ns(r.offcpu_involuntary_ns as f64),
                r.retransmits
            );
        }
    }

    if let Some(h) = &s.healer {
        let _ = writeln!(out, "\nhealer ({}): {}", h.mode, h.state);
        for e in &h.timeline {
            let _ = writeln!(
                out,
                "  #{} {} {} on {}: {}",
                e.id, e.kind, e.strategy, e.target, e.detail
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_report_has_every_section() {
        let r = RunReport {
            version: REPORT_VERSION,
            command: vec!["train".into()],
            exit: Exit {
                code: Some(3),
                ..Default::default()
            },
            state: Snapshot {
                processes: vec![types::Process {
                    pid: 9,
                    iterations: types::Iterations {
                        total: 10,
                        before_markers: 4,
                        wall_p50_ns: Some(1_000_000),
                        wall_p99_ns: Some(2_000_000),
                        ..Default::default()
                    },
                    violations: vec![types::Violation {
                        pid: 9,
                        id: 1,
                        open: true,
                        chain: "iteration p99 +38% ← aten::mm".into(),
                        ..Default::default()
                    }],
                    operators: vec![types::Operator {
                        op: "aten::mm".into(),
                        share: 0.5,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                jobs: vec![types::Job {
                    id: "j".into(),
                    ranks: vec![types::Rank::default(), types::Rank::default()],
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let t = text(&r);
        for want in [
            "exited with 3",
            "p50 1.00 ms, p99 2.00 ms",
            "iteration p99 +38% ← aten::mm",
            "50.0%  aten::mm",
            "stragglers of job j (NVRx scale",
            "4 iterations detected before they began",
        ] {
            assert!(t.contains(want), "{want}: {t}");
        }
        let s = summary(&r).join("\n");
        assert!(s.contains("1 open violation: iteration p99"), "{s}");
        assert!(!s.contains("healer"), "no healer, no --heal: {s}");
        assert!(!t.contains("healer"), "{t}");
    }

    #[test]
    fn the_healers_actions_are_summed_up_and_listed() {
        let event = |id, kind: &str| types::HealerEvent {
            id,
            kind: kind.into(),
            strategy: "deadline-aware".into(),
            target: "pid 9".into(),
            detail: format!("job 9: {kind}"),
            ..Default::default()
        };
        let mut r = RunReport {
            heal: Some(HealMode::Shadow),
            state: Snapshot {
                healer: Some(types::Healer {
                    mode: "shadow".into(),
                    state: "job 9: watching".into(),
                    timeline: vec![
                        event(0, "diagnosed"),
                        event(1, "chose"),
                        event(1, "shadow"),
                        event(2, "chose"),
                        event(2, "shadow"),
                    ],
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let t = text(&r);
        for want in [
            "healer:     shadow\n",
            "healer (shadow): job 9: watching",
            "#1 shadow deadline-aware on pid 9: job 9: shadow",
        ] {
            assert!(t.contains(want), "{want}: {t}");
        }
        let s = summary(&r).join("\n");
        assert!(
            s.contains("healer (shadow): 2 actions (2 shadow only); the timeline is in the report"),
            "{s}"
        );
        // Asked, but none ran: the notes say why.
        r.heal = Some(HealMode::On);
        r.state.healer = None;
        assert!(
            text(&r).contains("healer:     off (--heal on; see the notes)"),
            "{}",
            text(&r)
        );
    }
}
