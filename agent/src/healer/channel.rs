//! The job-side strategy channel: files in `<jobs_dir>/<pid>/` that the python client
//! (`slo_probe.on_strategy`) reads at step boundaries.
//!
//! - `client.json`, written by the client: `{"pid": N, "strategies": ["graph-replay", ...]}`,
//!   the strategies it registered a callback for. Without it a job-side strategy is skipped with
//!   a reason.
//! - `strategy.json`, written by the agent atomically (temporary file + rename):
//!   `{"version": 1, "seq": N, "strategies": {"graph-replay": {...params...}}}`, every job-side
//!   strategy in force with its parameters; an entry's removal means "back to what you did
//!   before". The client checks the file's identity (inode, mtime, size) at step boundaries,
//!   a `stat` at most every 50 ms, and calls the callbacks of what changed.
//! - `ack.json`, written by the client: `{"seq": N, "applied": [...], "errors": {...}}`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use slo_probe_core::healer::Strategy;

use super::error::HealError;

/// The version of `strategy.json`.
pub const VERSION: u32 = 1;

/// `strategy.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StrategyFile {
    /// Format version.
    pub version: u32,
    /// Bumped on every write.
    pub seq: u64,
    /// Strategies in force by name, with their parameters.
    pub strategies: BTreeMap<String, serde_json::Value>,
}

/// `client.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientFile {
    /// The client's process.
    pub pid: u32,
    /// Strategies it registered a callback for.
    pub strategies: Vec<String>,
}

/// `ack.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AckFile {
    /// The `strategy.json` sequence number handled.
    pub seq: u64,
    /// Strategies whose callbacks ran.
    #[serde(default)]
    pub applied: Vec<String>,
    /// Strategies whose callbacks raised, with the error.
    #[serde(default)]
    pub errors: BTreeMap<String, String>,
}

/// The channel's directory.
#[derive(Clone, Debug)]
pub struct Channel {
    dir: PathBuf,
}

impl Channel {
    /// Channels under `dir` (`heal.jobs_dir`).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The directory of job `pid`.
    pub fn job_dir(&self, pid: u32) -> PathBuf {
        self.dir.join(pid.to_string())
    }

    /// Creates the job's directory, owned by the job's user so that its client can write
    /// `client.json` and `ack.json` there.
    pub fn prepare(&self, pid: u32) -> Result<(), HealError> {
        let dir = self.job_dir(pid);
        if dir.is_dir() {
            return Ok(());
        }
        let io = |source| HealError::Channel {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        if let Some((uid, gid)) = owner(pid) {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).map_err(io)?;
        }
        Ok(())
    }

    /// Removes a finished job's directory.
    pub fn remove(&self, pid: u32) {
        let _ = std::fs::remove_dir_all(self.job_dir(pid));
    }

    fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, HealError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| HealError::Channel {
                    path: path.to_owned(),
                    source: std::io::Error::other(e),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(HealError::Channel {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// What the job's client registered (`None`: no client).
    pub fn client(&self, pid: u32) -> Option<ClientFile> {
        Self::read_json(&self.job_dir(pid).join("client.json"))
            .ok()
            .flatten()
    }

    /// The client's latest acknowledgement.
    pub fn ack(&self, pid: u32) -> Option<AckFile> {
        Self::read_json(&self.job_dir(pid).join("ack.json"))
            .ok()
            .flatten()
    }

    /// Why `strategy`'s job-side part cannot run for `pid`, or `None` when a client registered
    /// a callback for it.
    pub fn missing(&self, pid: u32, strategy: Strategy) -> Option<String> {
        let file = self.job_dir(pid).join("client.json");
        match self.client(pid) {
            None => Some(format!(
                "no python client in the job ({} is absent: the script does not call \
                 slo_probe.on_strategy)",
                file.display()
            )),
            Some(c) if !c.strategies.iter().any(|s| s == strategy.as_str()) => Some(format!(
                "the job's python client registered no callback for {strategy} \
                 (slo_probe.on_strategy(\"{strategy}\", ...))"
            )),
            Some(_) => None,
        }
    }

    /// The strategy file (empty when absent).
    pub fn strategies(&self, pid: u32) -> Result<StrategyFile, HealError> {
        Ok(
            Self::read_json(&self.job_dir(pid).join("strategy.json"))?.unwrap_or(StrategyFile {
                version: VERSION,
                ..Default::default()
            }),
        )
    }

    /// `strategy`'s entry for `pid`.
    pub fn entry(
        &self,
        pid: u32,
        strategy: Strategy,
    ) -> Result<Option<serde_json::Value>, HealError> {
        Ok(self
            .strategies(pid)?
            .strategies
            .get(strategy.as_str())
            .cloned())
    }

    /// Sets or removes `strategy`'s entry, atomically.
    pub fn set_entry(
        &self,
        pid: u32,
        strategy: Strategy,
        value: Option<serde_json::Value>,
    ) -> Result<(), HealError> {
        self.prepare(pid)?;
        let mut f = self.strategies(pid)?;
        match value {
            Some(v) => f.strategies.insert(strategy.as_str().to_owned(), v),
            None => f.strategies.remove(strategy.as_str()),
        };
        f.seq += 1;
        f.version = VERSION;
        let path = self.job_dir(pid).join("strategy.json");
        let tmp = self
            .job_dir(pid)
            .join(format!(".strategy.json.{}.tmp", std::process::id()));
        let io = |source| HealError::Channel {
            path: path.clone(),
            source,
        };
        let text = serde_json::to_vec_pretty(&f).map_err(|e| io(std::io::Error::other(e)))?;
        std::fs::write(&tmp, text).map_err(io)?;
        if let Some((uid, gid)) = owner(pid) {
            let _ = std::os::unix::fs::chown(&tmp, Some(uid), Some(gid));
        }
        std::fs::rename(&tmp, &path).map_err(io)
    }
}

/// The real uid and gid of `pid` (`/proc/<pid>/status`).
fn owner(pid: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u32> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((field("Uid:")?, field("Gid:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_written_atomically_and_read_back() {
        let dir = std::env::temp_dir().join(format!("slo-probe-channel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = Channel::new(dir.clone());
        let pid = std::process::id();
        assert_eq!(c.entry(pid, Strategy::GraphReplay).expect("read"), None);
        assert!(c
            .missing(pid, Strategy::GraphReplay)
            .expect("no client")
            .contains("client.json"));
        let v = serde_json::json!({"replay": false});
        c.set_entry(pid, Strategy::GraphReplay, Some(v.clone()))
            .expect("write");
        assert_eq!(c.entry(pid, Strategy::GraphReplay).expect("read"), Some(v));
        let f = c.strategies(pid).expect("file");
        assert_eq!((f.version, f.seq), (VERSION, 1));
        c.set_entry(pid, Strategy::GraphReplay, None)
            .expect("remove");
        let f = c.strategies(pid).expect("file");
        assert!(f.strategies.is_empty() && f.seq == 2);
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(c.job_dir(pid))
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["strategy.json".to_owned()]);
        std::fs::write(
            c.job_dir(pid).join("client.json"),
            format!("{{\"pid\": {pid}, \"strategies\": [\"comm-relief\"]}}"),
        )
        .expect("client");
        assert!(c.missing(pid, Strategy::CommRelief).is_none());
        assert!(c
            .missing(pid, Strategy::GraphReplay)
            .expect("not registered")
            .contains("no callback"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
