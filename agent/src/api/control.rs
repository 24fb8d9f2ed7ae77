//! [`AgentControl`]: what carries out the state API's write endpoints in `slo-probe agent`
//! (with `[api] allow_writes = true`).
//!
//! - `POST /api/v1/diagnostic`: node-level graph tracing for a while, asked of one shim or of
//!   every connected one through the shim source ([`ShimHandle::request_diagnostic`]).
//! - `POST /api/v1/heal/undo`: restores one action over the healer's journal, the way
//!   `slo-probe heal undo` restores all of them, and journals it as undone `by: "api"`.
//!
//! Undo goes through the journal rather than through a message to the running healer: the
//! healer thread has no inbox (`healer::spawn` hands back its join handle and its views only;
//! its loop owns the job table), and the journal is what says which knobs an action changed and
//! what they held before. The loop already reads the journal every tick for undos made outside
//! it and forgets those actions (`HealerLoop::pick_up_external_undo`), so the same path serves
//! `heal undo` and the API. It also works when no healer runs (mode `off`, or a journal the
//! loop could not open at start), and the reply can say what was restored.
//!
//! Both requests are short (a store into a ring header; a few file reads and writes and one
//! `fdatasync`) and run on the server's runtime.

use std::path::{Path, PathBuf};

use super::{
    types::{DiagnosticRequest, UndoRequest, DEFAULT_DIAGNOSTIC_STEPS},
    Control, ControlError,
};
use crate::{
    config::HealConfig,
    healer::{
        self,
        channel::Channel,
        journal::{self, Journal, Outstanding},
        knobs::{HostKnobs, KnobIo, NoShimControl},
    },
    sources::shim::ShimHandle,
};

/// Who an undo through the API is journalled as.
pub const UNDONE_BY: &str = "api";

/// The agent's write side: the shims it accepts and the healer's journal.
pub struct AgentControl {
    /// The connected shims; `None` when the shim socket is not listening.
    shim: Option<ShimHandle>,
    /// `heal.journal`.
    journal: PathBuf,
    /// `heal.jobs_dir` (strategy-channel knobs are restored there).
    jobs_dir: PathBuf,
}

impl AgentControl {
    /// Diagnostics through `shim` (none when `None`), undo over `heal`'s journal.
    pub fn new(shim: Option<ShimHandle>, heal: &HealConfig) -> Self {
        Self {
            shim,
            journal: heal.journal.clone(),
            jobs_dir: heal.jobs_dir.clone(),
        }
    }
}

impl Control for AgentControl {
    fn diagnostic(&self, req: &DiagnosticRequest) -> Result<String, ControlError> {
        let shim = self.shim.as_ref().ok_or(ControlError::Unavailable {
            what: "diagnostic tracing (the CUPTI shims' socket is not listening)",
        })?;
        let steps = if req.steps == 0 {
            DEFAULT_DIAGNOSTIC_STEPS
        } else {
            req.steps
        };
        let asked = shim.request_diagnostic(req.pid, steps);
        diagnostic_reply(req.pid, &asked, steps)
    }

    fn heal_undo(&self, req: &UndoRequest) -> Result<String, ControlError> {
        let mut io = HostKnobs {
            channel: Channel::new(self.jobs_dir.clone()),
            shim: Box::new(NoShimControl),
        };
        undo(&self.journal, &mut io, req)
    }
}

/// The reply to a diagnostic request for `pid` that reached the shims of `asked`.
fn diagnostic_reply(pid: Option<u32>, asked: &[u32], steps: u32) -> Result<String, ControlError> {
    match (pid, asked) {
        (Some(pid), []) => Err(ControlError::NoSuchProcess { pid }),
        (None, []) => Ok("no training process is connected to this agent: nothing to trace".into()),
        (_, pids) => Ok(format!(
            "asked the shim of {} {} for graph-node tracing during {steps} iterations",
            if pids.len() == 1 { "pid" } else { "pids" },
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The actions `req` names among those still applied (oldest first): with an id, every one
/// with that id (of `req.job` when given; an id in force in several jobs is ambiguous); without
/// one, the latest (of `req.job` when given).
fn pick(open: Vec<Outstanding>, req: &UndoRequest) -> Result<Vec<Outstanding>, ControlError> {
    let mut open: Vec<Outstanding> = open
        .into_iter()
        .filter(|o| req.job.is_none_or(|j| j == o.key.job))
        .collect();
    let Some(id) = req.action else {
        return match open.pop() {
            Some(latest) => Ok(vec![latest]),
            None => Err(ControlError::NoSuchAction { id: None }),
        };
    };
    open.retain(|o| o.key.action == id);
    let mut jobs: Vec<u32> = open.iter().map(|o| o.key.job).collect();
    jobs.dedup();
    jobs.sort_unstable();
    jobs.dedup();
    match jobs.len() {
        0 => Err(ControlError::NoSuchAction { id: Some(id) }),
        // The same job and id in several agent runs: a previous run's leftover, undone too.
        1 => Ok(open),
        _ => Err(ControlError::Ambiguous { id, jobs }),
    }
}

/// Restores what `req` names from the journal at `path` through `io`; the reply, or why not.
fn undo(path: &Path, io: &mut dyn KnobIo, req: &UndoRequest) -> Result<String, ControlError> {
    let heal = |source| ControlError::Heal { source };
    // No journal: nothing was ever applied (and none is made here).
    if !path.exists() {
        return Err(ControlError::NoSuchAction { id: req.action });
    }
    let (lines, _) = journal::read(path).map_err(heal)?;
    let picked = pick(journal::outstanding(&lines), req)?;
    let mut j = Journal::open(path).map_err(heal)?;
    let done = healer::restore_actions(&mut j, io, UNDONE_BY, picked).map_err(heal)?;
    let mut out = Vec::new();
    for (o, r) in &done {
        if !r.failed.is_empty() {
            return Err(ControlError::NotRestored {
                job: o.key.job,
                id: o.key.action,
                failed: r.failed.clone(),
            });
        }
        let mut line = format!(
            "job {} action {} ({}) undone: {} knobs restored",
            o.key.job,
            o.key.action,
            o.strategy,
            r.restored.len()
        );
        if !r.left.is_empty() {
            line.push_str(&format!("; left as is: {}", r.left.join("; ")));
        }
        out.push(line);
    }
    Ok(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use slo_probe_core::healer::{Level, Strategy};

    use super::*;
    use crate::healer::{
        journal::{
            tests::{cg, FakeKnobs},
            ActionKey, Change, Record,
        },
        knobs::{Knob, KnobValue},
    };

    fn temp_journal(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("slo-probe-control-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("heal.jsonl")
    }

    /// Journals `job`'s action `action` as applied: `knob` from 1024 to 102.
    fn applied(j: &mut Journal, job: u32, action: u64, knob: &Knob) {
        let key = ActionKey {
            run: "r1".into(),
            job,
            action,
        };
        j.append_all(vec![
            Record::Prior {
                key: key.clone(),
                job_start: 1,
                strategy: Strategy::NeighborIsolation,
                level: Level::Mild,
                change: Change {
                    knob: knob.clone(),
                    prior: KnobValue::Text("1024".into()),
                    value: KnobValue::Text("102".into()),
                },
            },
            Record::Applied {
                key,
                strategy: Strategy::NeighborIsolation,
                changes: 1,
                notes: vec![],
            },
        ])
        .expect("append");
    }

    fn req(action: Option<u64>, job: Option<u32>) -> UndoRequest {
        UndoRequest { action, job }
    }

    #[test]
    fn undo_restores_the_action_named_and_journals_it() {
        let path = temp_journal("undo");
        let mut io = FakeKnobs::default();
        // No journal yet: nothing to undo, and none is created.
        let e = undo(&path, &mut io, &req(None, None)).expect_err("nothing");
        assert!(matches!(e, ControlError::NoSuchAction { id: None }), "{e}");
        assert!(!path.exists());

        let mut j = Journal::open(&path).expect("journal");
        for (job, action, file) in [(7, 1, "a"), (7, 2, "b"), (8, 1, "c")] {
            applied(&mut j, job, action, &cg(file));
            io.values
                .insert(cg(file).to_string(), KnobValue::Text("102".into()));
        }
        let e = undo(&path, &mut io, &req(Some(9), None)).expect_err("unknown id");
        assert_eq!(e.to_string(), "no healer action to undo with id 9");
        let e = undo(&path, &mut io, &req(Some(1), None)).expect_err("two jobs");
        assert!(
            matches!(&e, ControlError::Ambiguous { id: 1, jobs } if jobs == &[7, 8]),
            "{e}"
        );
        assert!(e.to_string().contains("name one with \"job\""), "{e}");
        assert_eq!(io.writes, 0);

        let t = undo(&path, &mut io, &req(Some(1), Some(7))).expect("job 7 action 1");
        assert_eq!(
            t,
            "job 7 action 1 (neighbor-isolation) undone: 1 knobs restored"
        );
        assert_eq!(
            io.values[&cg("a").to_string()],
            KnobValue::Text("1024".into())
        );
        assert_eq!(
            io.values[&cg("c").to_string()],
            KnobValue::Text("102".into())
        );
        // Without an id: the latest action in force (of the job, when named).
        let t = undo(&path, &mut io, &req(None, Some(7))).expect("job 7's latest");
        assert!(t.starts_with("job 7 action 2 "), "{t}");
        let t = undo(&path, &mut io, &req(None, None)).expect("the latest");
        assert!(t.starts_with("job 8 action 1 "), "{t}");
        assert!(undo(&path, &mut io, &req(None, None)).is_err());

        let (lines, _) = journal::read(&path).expect("read");
        let by_api = lines
            .iter()
            .filter(|l| matches!(&l.record, Record::Reverted { by, .. } if by == UNDONE_BY))
            .count();
        assert_eq!(by_api, 3);
        assert!(journal::outstanding(&lines).is_empty());
        let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
    }

    #[test]
    fn a_knob_that_cannot_be_restored_is_an_error() {
        let path = temp_journal("failed");
        let mut j = Journal::open(&path).expect("journal");
        applied(&mut j, 7, 1, &cg("a"));
        let mut io = FakeKnobs {
            fail_on: Some(cg("a").to_string()),
            ..Default::default()
        };
        io.values
            .insert(cg("a").to_string(), KnobValue::Text("102".into()));
        let e = undo(&path, &mut io, &req(Some(1), None)).expect_err("refused");
        assert!(
            matches!(&e, ControlError::NotRestored { job: 7, id: 1, failed } if failed.len() == 1),
            "{e}"
        );
        assert!(e.to_string().contains("refused by the test"), "{e}");
        let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
    }

    #[test]
    fn an_unreadable_journal_is_a_heal_error() {
        // A directory where the journal should be.
        let path = temp_journal("dir");
        std::fs::create_dir_all(&path).expect("dir");
        let e = undo(&path, &mut FakeKnobs::default(), &req(None, None)).expect_err("a dir");
        assert!(matches!(e, ControlError::Heal { .. }), "{e}");
        assert!(
            crate::error_chain(&e).contains("cannot use the heal journal"),
            "{}",
            crate::error_chain(&e)
        );
        let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
    }

    #[test]
    fn diagnostics_need_the_shim_socket_and_a_connected_process() {
        let none = AgentControl::new(None, &HealConfig::default());
        let e = none
            .diagnostic(&DiagnosticRequest::default())
            .expect_err("no socket");
        assert!(matches!(e, ControlError::Unavailable { .. }), "{e}");

        let dir = temp_journal("shim");
        let dir = dir.parent().expect("dir");
        let pipelines = std::sync::Arc::new(std::sync::Mutex::new(
            slo_probe_core::pipeline::Pipelines::new(
                slo_probe_core::pipeline::PipelineSettings::live(
                    crate::config::Config::default().slo,
                    1_000_000_000,
                ),
            )
            .expect("pipelines"),
        ));
        let source = crate::sources::shim::ShimSource::start(
            &dir.join("shim.sock"),
            &[],
            None,
            pipelines,
            None,
        )
        .expect("shim socket");
        let control = AgentControl::new(Some(source.handle()), &HealConfig::default());
        let e = control
            .diagnostic(&DiagnosticRequest {
                pid: Some(7),
                steps: 0,
            })
            .expect_err("not connected");
        assert_eq!(
            e.to_string(),
            "no training process with pid 7 is connected to this agent"
        );
        let t = control
            .diagnostic(&DiagnosticRequest::default())
            .expect("every shim: none");
        assert!(t.contains("nothing to trace"), "{t}");
        drop(source);
        // The handle does not keep the source's shims.
        assert!(control
            .diagnostic(&DiagnosticRequest {
                pid: Some(7),
                steps: 1
            })
            .is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn diagnostic_replies_name_the_pids() {
        assert_eq!(
            diagnostic_reply(Some(5), &[5], 50).expect("one"),
            "asked the shim of pid 5 for graph-node tracing during 50 iterations"
        );
        assert_eq!(
            diagnostic_reply(None, &[5, 6], 9).expect("two"),
            "asked the shim of pids 5, 6 for graph-node tracing during 9 iterations"
        );
    }
}
