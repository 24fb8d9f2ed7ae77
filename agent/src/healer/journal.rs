//! The healer's journal: one JSON object per line, appended with a single `write` and
//! `fdatasync`ed before the knobs it describes are touched (an action's prior values in one
//! synced append; audit events are appended without a sync), so that whatever the agent changed can
//! be restored after a crash, a SIGKILL or a reboot of the agent: on start the agent restores
//! every action the journal says is still applied, and `slo-probe heal undo` does the same by
//! hand. Audit events go to the same file, so `heal history` reads one trail.
//!
//! Records: `start` (an agent run), `prior` (a knob's value before a write, with the value to
//! be written), `applied`, `shadow` (what shadow mode would have written), `reverted` (who undid
//! an action and what was left as is), `audit` (a healer event). An action is named by the run,
//! the job and the healer's action id. A torn last line (a kill mid-write) is skipped.

use std::{
    collections::BTreeMap,
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use slo_probe_core::healer::{AuditEvent, Level, Strategy};

use super::{
    error::HealError,
    knobs::{Knob, KnobIo, KnobValue},
};

/// One knob of an action: its value before, and the value the action wrote.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// The knob.
    pub knob: Knob,
    /// Its value before the action.
    pub prior: KnobValue,
    /// The value the action wrote.
    pub value: KnobValue,
}

/// What the journal knows about one action.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActionKey {
    /// The agent run.
    pub run: String,
    /// The job (its training process).
    pub job: u32,
    /// The healer's action id.
    pub action: u64,
}

/// A journal record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Record {
    /// An agent started.
    Start {
        /// Its run id.
        run: String,
        /// Its process.
        agent_pid: u32,
        /// `off`, `shadow` or `on`.
        mode: String,
    },
    /// A knob is about to be written.
    Prior {
        /// The action.
        #[serde(flatten)]
        key: ActionKey,
        /// The job's start time (its identity beyond the pid).
        job_start: u64,
        /// The strategy.
        strategy: Strategy,
        /// Its level.
        level: Level,
        /// The knob, its prior value and the value to be written.
        #[serde(flatten)]
        change: Change,
    },
    /// Every knob of an action was written and read back.
    Applied {
        /// The action.
        #[serde(flatten)]
        key: ActionKey,
        /// The strategy.
        strategy: Strategy,
        /// Knobs written.
        changes: usize,
        /// What was left out, and why.
        notes: Vec<String>,
    },
    /// Shadow mode: what an action would have written (nothing was).
    Shadow {
        /// The action.
        #[serde(flatten)]
        key: ActionKey,
        /// The strategy.
        strategy: Strategy,
        /// Its level.
        level: Level,
        /// The knobs, their current values and the values that would be written.
        changes: Vec<Change>,
        /// What would be left out, and why.
        notes: Vec<String>,
    },
    /// An action was undone.
    Reverted {
        /// The action.
        #[serde(flatten)]
        key: ActionKey,
        /// The strategy.
        strategy: Strategy,
        /// Who: `healer` (a verdict), `restart` (the agent's start), `undo` (the command),
        /// `api` (`POST /api/v1/heal/undo`), `job exited`, `failed apply`.
        by: String,
        /// Knobs restored and read back.
        restored: usize,
        /// Knobs left as they are, and why (changed since by someone else, process gone).
        left: Vec<String>,
    },
    /// A healer event.
    Audit {
        /// The agent run.
        run: String,
        /// The event.
        event: AuditEvent,
    },
}

/// A journal line: wall-clock time and the record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// Unix time, ms.
    pub at_ms: u64,
    /// The record.
    #[serde(flatten)]
    pub record: Record,
}

/// Unix time in ms.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The journal file, open for appending.
pub struct Journal {
    path: PathBuf,
    file: std::fs::File,
    /// Bytes this process wrote or has read (others' appends beyond are picked up by
    /// [`Journal::read_new`]).
    seen: u64,
}

impl Journal {
    /// Opens (creates) the journal at `path`, mode 0600, its directory too.
    pub fn open(path: &Path) -> Result<Self, HealError> {
        let io = |source| HealError::Journal {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let seen = file.metadata().map_err(io)?.len();
        Ok(Self {
            path: path.to_owned(),
            file,
            seen,
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record and syncs it to disk.
    pub fn append(&mut self, record: Record) -> Result<(), HealError> {
        self.append_all(vec![record])
    }

    /// Appends records with one `write` and one `fdatasync` (audit events alone are not synced:
    /// losing the last of them in a crash loses no state; every other record is).
    pub fn append_all(&mut self, records: Vec<Record>) -> Result<(), HealError> {
        let io = |source| HealError::Journal {
            path: self.path.clone(),
            source,
        };
        let at_ms = wall_ms();
        let sync = records.iter().any(|r| !matches!(r, Record::Audit { .. }));
        let mut bytes = Vec::new();
        for record in records {
            serde_json::to_writer(&mut bytes, &Line { at_ms, record })
                .map_err(|e| io(std::io::Error::other(e)))?;
            bytes.push(b'\n');
        }
        self.file.write_all(&bytes).map_err(io)?;
        if sync {
            self.file.sync_data().map_err(io)?;
        }
        self.seen += bytes.len() as u64;
        Ok(())
    }

    /// Lines others appended since this process last wrote or read (e.g. `heal undo`'s).
    pub fn read_new(&mut self) -> Vec<Line> {
        let Ok(len) = std::fs::metadata(&self.path).map(|m| m.len()) else {
            return Vec::new();
        };
        if len <= self.seen {
            return Vec::new();
        }
        let Ok(bytes) = std::fs::read(&self.path) else {
            return Vec::new();
        };
        let from = (self.seen as usize).min(bytes.len());
        self.seen = bytes.len() as u64;
        parse(&bytes[from..]).0
    }
}

/// Parses journal text: the lines and how many could not be parsed.
pub fn parse(bytes: &[u8]) -> (Vec<Line>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for l in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        match serde_json::from_slice::<Line>(l) {
            Ok(line) => out.push(line),
            Err(_) => bad += 1,
        }
    }
    (out, bad)
}

/// Reads the journal at `path` (empty when absent).
pub fn read(path: &Path) -> Result<(Vec<Line>, usize), HealError> {
    match std::fs::read(path) {
        Ok(b) => Ok(parse(&b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Vec::new(), 0)),
        Err(source) => Err(HealError::Journal {
            path: path.to_owned(),
            source,
        }),
    }
}

/// An action the journal says is still applied (or was being applied when the agent died).
#[derive(Clone, Debug, PartialEq)]
pub struct Outstanding {
    /// The action.
    pub key: ActionKey,
    /// The job's start time.
    pub job_start: u64,
    /// The strategy.
    pub strategy: Strategy,
    /// Its level.
    pub level: Level,
    /// Its knobs, in the order they were written.
    pub changes: Vec<Change>,
    /// Unix ms of its first write.
    pub since_ms: u64,
    /// Whether its `applied` line was written (else the agent died while applying it).
    pub complete: bool,
}

/// Actions with `prior` lines and no `reverted` line, oldest first.
pub fn outstanding(lines: &[Line]) -> Vec<Outstanding> {
    let mut open: BTreeMap<(String, u32, u64), Outstanding> = BTreeMap::new();
    let mut order: Vec<(String, u32, u64)> = Vec::new();
    for l in lines {
        match &l.record {
            Record::Prior {
                key,
                job_start,
                strategy,
                level,
                change,
            } => {
                let k = (key.run.clone(), key.job, key.action);
                let e = open.entry(k.clone()).or_insert_with(|| {
                    order.push(k);
                    Outstanding {
                        key: key.clone(),
                        job_start: *job_start,
                        strategy: *strategy,
                        level: *level,
                        changes: Vec::new(),
                        since_ms: l.at_ms,
                        complete: false,
                    }
                });
                e.changes.push(change.clone());
            }
            Record::Applied { key, .. } => {
                if let Some(e) = open.get_mut(&(key.run.clone(), key.job, key.action)) {
                    e.complete = true;
                }
            }
            Record::Reverted { key, .. } => {
                open.remove(&(key.run.clone(), key.job, key.action));
            }
            _ => {}
        }
    }
    order.into_iter().filter_map(|k| open.remove(&k)).collect()
}

/// What undoing one action did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Restored {
    /// Knobs written back and read back equal to their prior value (or already there).
    pub restored: Vec<String>,
    /// Knobs left as they are, and why.
    pub left: Vec<String>,
    /// Knobs whose read-back differs from the prior value after writing it.
    pub failed: Vec<String>,
}

/// Restores `changes` (newest first) through `io`: a knob still holding the value the action
/// wrote gets its prior value back and is read back; one already at its prior value counts as
/// restored; one changed since by someone else, or whose process is gone, is left as is.
pub fn restore(io: &mut dyn KnobIo, changes: &[Change]) -> Restored {
    let mut out = Restored::default();
    for c in changes.iter().rev() {
        let name = c.knob.to_string();
        match io.read(&c.knob) {
            Err(HealError::Gone { .. }) => out.left.push(format!(
                "{name}: gone (its process, thread or cgroup no longer exists)"
            )),
            Err(e) => out
                .failed
                .push(format!("{name}: {}", crate::error_chain(&e))),
            Ok(now) if now.same(&c.prior, &c.knob) => out.restored.push(name),
            Ok(now) if !now.same(&c.value, &c.knob) => out.left.push(format!(
                "{name}: changed since by someone else ({now}, the action wrote {}): left as is",
                c.value
            )),
            Ok(_) => match io.write(&c.knob, &c.prior).and_then(|()| io.read(&c.knob)) {
                Ok(back) if back.same(&c.prior, &c.knob) => out.restored.push(name),
                Ok(back) => out
                    .failed
                    .push(format!("{name}: wrote {} but read back {back}", c.prior)),
                Err(e) => out
                    .failed
                    .push(format!("{name}: {}", crate::error_chain(&e))),
            },
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Knobs in memory.
    #[derive(Default)]
    pub(crate) struct FakeKnobs {
        pub values: BTreeMap<String, KnobValue>,
        pub writes: usize,
        pub fail_on: Option<String>,
    }

    impl KnobIo for FakeKnobs {
        fn read(&mut self, knob: &Knob) -> Result<KnobValue, HealError> {
            self.values
                .get(&knob.to_string())
                .cloned()
                .ok_or(HealError::Gone {
                    what: knob.to_string(),
                })
        }

        fn write(&mut self, knob: &Knob, value: &KnobValue) -> Result<(), HealError> {
            if self.fail_on.as_deref() == Some(&knob.to_string()) {
                return Err(HealError::Unsupported {
                    what: knob.to_string(),
                    why: "refused by the test".into(),
                });
            }
            self.writes += 1;
            self.values.insert(knob.to_string(), value.clone());
            Ok(())
        }
    }

    pub(crate) fn cg(file: &str) -> Knob {
        Knob::Cgroup {
            cgroup: "/n".into(),
            file: file.into(),
            path: format!("/sys/fs/cgroup/cpu/n/{file}").into(),
        }
    }

    #[test]
    fn outstanding_actions_and_a_torn_line() {
        let key = |action| ActionKey {
            run: "r1".into(),
            job: 7,
            action,
        };
        let prior = |action, file: &str| Record::Prior {
            key: key(action),
            job_start: 1,
            strategy: Strategy::NeighborIsolation,
            level: Level::Mild,
            change: Change {
                knob: cg(file),
                prior: KnobValue::Text("1024".into()),
                value: KnobValue::Text("102".into()),
            },
        };
        let mut text = Vec::new();
        for r in [
            prior(1, "cpu.shares"),
            Record::Applied {
                key: key(1),
                strategy: Strategy::NeighborIsolation,
                changes: 1,
                notes: vec![],
            },
            Record::Reverted {
                key: key(1),
                strategy: Strategy::NeighborIsolation,
                by: "healer".into(),
                restored: 1,
                left: vec![],
            },
            prior(2, "cpu.shares"),
            prior(2, "cpu.cfs_quota_us"),
        ] {
            text.extend(
                serde_json::to_vec(&Line {
                    at_ms: 5,
                    record: r,
                })
                .expect("json"),
            );
            text.push(b'\n');
        }
        text.extend(b"{\"at_ms\": 6, \"kind\": \"pri"); // torn by a kill
        let (lines, bad) = parse(&text);
        assert_eq!((lines.len(), bad), (5, 1));
        let o = outstanding(&lines);
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].key.action, 2);
        assert!(!o[0].complete);
        assert_eq!(o[0].changes.len(), 2);
    }

    #[test]
    fn restore_writes_back_reads_back_and_does_not_fight() {
        let mut io = FakeKnobs::default();
        let change = |file: &str| Change {
            knob: cg(file),
            prior: KnobValue::Text("1024".into()),
            value: KnobValue::Text("102".into()),
        };
        io.values
            .insert(cg("a").to_string(), KnobValue::Text("102".into())); // ours
        io.values
            .insert(cg("b").to_string(), KnobValue::Text("1024".into())); // never written
        io.values
            .insert(cg("c").to_string(), KnobValue::Text("500".into())); // someone else's
        let r = restore(
            &mut io,
            &[change("a"), change("b"), change("c"), change("gone")],
        );
        assert_eq!(r.restored.len(), 2, "{r:?}");
        assert_eq!(r.left.len(), 2, "{r:?}");
        assert!(r.left.iter().any(|l| l.contains("someone else")), "{r:?}");
        assert!(r.failed.is_empty());
        assert_eq!(
            io.values[&cg("a").to_string()],
            KnobValue::Text("1024".into())
        );
        assert_eq!(
            io.values[&cg("c").to_string()],
            KnobValue::Text("500".into())
        );
        assert_eq!(io.writes, 1);
    }

    #[test]
    fn journal_appends_and_sees_others_lines() {
        let path = std::env::temp_dir().join(format!(
            "slo-probe-journal-{}/heal.jsonl",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let mut j = Journal::open(&path).expect("open");
        j.append(Record::Start {
            run: "r".into(),
            agent_pid: 1,
            mode: "on".into(),
        })
        .expect("append");
        assert!(j.read_new().is_empty());
        let mut other = Journal::open(&path).expect("open again");
        other
            .append(Record::Start {
                run: "r2".into(),
                agent_pid: 2,
                mode: "on".into(),
            })
            .expect("append");
        let new = j.read_new();
        assert_eq!(new.len(), 1);
        assert!(matches!(&new[0].record, Record::Start { run, .. } if run == "r2"));
        let (all, bad) = read(&path).expect("read");
        assert_eq!((all.len(), bad), (2, 0));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
    }
}
