//! `slo-probe heal status | history | undo`: the healer's journal for people. `status` lists
//! the actions still applied with every knob's prior, written and current value; `history` the
//! audit trail; `undo` restores every action still applied and reads each knob back (exit 1 when
//! a knob could not be restored).

use std::{fmt::Write as _, path::Path, process::ExitCode};

use crate::healer::{
    self, audit,
    channel::Channel,
    journal::{self, Journal, Line, Record},
    knobs::{HostKnobs, KnobIo, NoShimControl},
};

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time in ms.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn io(jobs_dir: &Path) -> HostKnobs {
    HostKnobs {
        channel: Channel::new(jobs_dir.to_owned()),
        shim: Box::new(NoShimControl),
    }
}

/// The report of `heal status`.
pub fn status(journal_path: &Path, jobs_dir: &Path) -> Result<String, healer::HealError> {
    let (lines, bad) = journal::read(journal_path)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "journal {} ({} lines)",
        journal_path.display(),
        lines.len()
    );
    if bad > 0 {
        let _ = writeln!(
            out,
            "  {bad} lines could not be read (a torn write is skipped)"
        );
    }
    if let Some((at, run, mode)) = lines.iter().rev().find_map(|l| match &l.record {
        Record::Start { run, mode, .. } => Some((l.at_ms, run.clone(), mode.clone())),
        _ => None,
    }) {
        let _ = writeln!(
            out,
            "last agent run {run} started {} UTC in mode {mode}",
            utc(at)
        );
    }
    let open = journal::outstanding(&lines);
    if open.is_empty() {
        let _ = writeln!(
            out,
            "no action applied: every knob the healer touched is restored"
        );
        return Ok(out);
    }
    let mut io = io(jobs_dir);
    let _ = writeln!(out, "{} actions applied:", open.len());
    for o in &open {
        let _ = writeln!(
            out,
            "  job {} action {} (run {}): {}/{} since {} UTC{}",
            o.key.job,
            o.key.action,
            o.key.run,
            o.strategy,
            o.level.as_str(),
            utc(o.since_ms),
            if o.complete {
                ""
            } else {
                " (the agent died while applying it)"
            }
        );
        for c in &o.changes {
            let now = match io.read(&c.knob) {
                Ok(v) => v.to_string(),
                Err(e) => crate::error_chain(&e),
            };
            let _ = writeln!(
                out,
                "    {}: was {}, set to {}, now {now}",
                c.knob, c.prior, c.value
            );
        }
    }
    let _ = writeln!(out, "`slo-probe heal undo` restores them");
    Ok(out)
}

fn describe(l: &Line) -> Option<String> {
    Some(match &l.record {
        Record::Start { run, mode, .. } => format!("agent run {run} started (mode {mode})"),
        Record::Prior { key, change, .. } => format!(
            "job {} action {}: {} was {}, writing {}",
            key.job, key.action, change.knob, change.prior, change.value
        ),
        Record::Applied {
            key,
            strategy,
            changes,
            ..
        } => format!(
            "job {} action {}: {strategy} applied ({changes} knobs)",
            key.job, key.action
        ),
        Record::Shadow {
            key,
            strategy,
            changes,
            ..
        } => format!(
            "job {} action {}: shadow: {strategy} would write {} knobs",
            key.job,
            key.action,
            changes.len()
        ),
        Record::Reverted {
            key,
            strategy,
            by,
            restored,
            left,
        } => format!(
            "job {} action {}: {strategy} undone by {by} ({restored} restored{})",
            key.job,
            key.action,
            if left.is_empty() {
                String::new()
            } else {
                format!("; left: {}", left.join("; "))
            }
        ),
        Record::Audit { event, .. } => audit::body(event),
    })
}

/// The report of `heal history`: the last `last` lines (of job `job`), or JSON lines.
pub fn history(
    journal_path: &Path,
    job: Option<u32>,
    last: usize,
    json: bool,
) -> Result<String, healer::HealError> {
    let (lines, _) = journal::read(journal_path)?;
    let of_job = |l: &Line| match (&l.record, job) {
        (_, None) => true,
        (Record::Start { .. }, Some(_)) => false,
        (Record::Prior { key, .. }, Some(j))
        | (Record::Applied { key, .. }, Some(j))
        | (Record::Shadow { key, .. }, Some(j))
        | (Record::Reverted { key, .. }, Some(j)) => key.job == j,
        (Record::Audit { event, .. }, Some(j)) => event.job == j,
    };
    let picked: Vec<&Line> = lines.iter().filter(|l| of_job(l)).collect();
    let from = picked.len().saturating_sub(last);
    let mut out = String::new();
    for l in &picked[from..] {
        if json {
            if let Ok(t) = serde_json::to_string(l) {
                out.push_str(&t);
                out.push('\n');
            }
        } else if let Some(t) = describe(l) {
            let _ = writeln!(out, "{} UTC  {t}", utc(l.at_ms));
        }
    }
    Ok(out)
}

/// `heal undo`: restores every action still applied; the report and whether all knobs read
/// back their prior value.
pub fn undo(journal_path: &Path, jobs_dir: &Path) -> Result<(String, bool), healer::HealError> {
    let mut out = String::new();
    if !journal_path.exists() {
        let _ = writeln!(
            out,
            "no journal at {}: nothing to undo",
            journal_path.display()
        );
        return Ok((out, true));
    }
    let mut j = Journal::open(journal_path)?;
    let mut io = io(jobs_dir);
    let done = healer::restore_outstanding(&mut j, &mut io, "undo")?;
    let mut ok = true;
    if done.is_empty() {
        let _ = writeln!(out, "nothing to undo: no action is applied");
    }
    for (o, r) in &done {
        let _ = writeln!(
            out,
            "job {} action {} ({}): {} knobs restored and read back",
            o.key.job,
            o.key.action,
            o.strategy,
            r.restored.len()
        );
        for k in &r.restored {
            let _ = writeln!(out, "  restored {k}");
        }
        for l in &r.left {
            let _ = writeln!(out, "  left as is: {l}");
        }
        for f in &r.failed {
            ok = false;
            let _ = writeln!(out, "  FAILED: {f}");
        }
    }
    Ok((out, ok))
}

/// Exit code of `undo`.
pub fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_798_761_599_000), "2026-12-31 23:59:59");
    }

    #[test]
    fn an_empty_journal() {
        let p =
            std::env::temp_dir().join(format!("slo-probe-heal-cli-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let s = status(&p, Path::new("/nonexistent")).expect("status");
        assert!(s.contains("no action applied"), "{s}");
        let (u, ok) = undo(&p, Path::new("/nonexistent")).expect("undo");
        assert!(ok && u.contains("nothing to undo"), "{u}");
        assert!(history(&p, None, 10, false).expect("history").is_empty());
    }
}
