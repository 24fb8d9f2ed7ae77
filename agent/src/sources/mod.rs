//! Sources: adapt what the kernel (eBPF), the CUPTI shims and NVML report into the core's
//! input types. Each is started by its own constructor (the settings differ); the collector
//! then treats them alike through [`Source`]: what each reports on, up or down with why, and
//! stopping it. The readers without threads or families of their own (`cgroup`, `procfs`) are
//! plain functions the collector calls on its tick.
pub mod cgroup;
pub mod ebpf;
pub mod nvml;
pub mod procfs;
pub mod shim;

use slo_probe_core::snapshot::ProbeStatus;

/// A started source. How it delivers differs: the eBPF probes are read on the collector's
/// tick ([`ebpf::Probes::read`], into the thread, connection and process tables), the shim
/// source's threads push records into the per-process GPU pipelines as they drain the rings,
/// and NVML's thread appends to the history the pipelines align iterations with. What the
/// collector needs of all of them alike is here.
pub trait Source: Send {
    /// The families it reports on, each up or down with why (the snapshot's probe list).
    fn health(&self) -> Vec<ProbeStatus>;
    /// Stops delivering: threads end within their poll period, a bound socket is removed.
    /// What it delivered stays where it went. Dropping a source stops it too.
    fn stop(&mut self);
}

/// The one family of a source whose threads run until `stop` is set: up, or down as stopped.
pub fn flag_health(name: &'static str, stop: &std::sync::atomic::AtomicBool) -> Vec<ProbeStatus> {
    let stopped = stop.load(std::sync::atomic::Ordering::Relaxed);
    vec![ProbeStatus {
        name,
        up: !stopped,
        reason: if stopped {
            "stopped".to_owned()
        } else {
            String::new()
        },
    }]
}

/// A source that did not start: its families, all down for one reason.
#[derive(Clone, Debug)]
pub struct Down {
    families: &'static [&'static str],
    reason: String,
}

impl Down {
    /// `families` down because of `reason` (what the user should read in the probe list).
    pub fn new(families: &'static [&'static str], reason: impl Into<String>) -> Self {
        Self {
            families,
            reason: reason.into(),
        }
    }

    /// Nothing down (the placeholder beside a source that started).
    pub fn none() -> Self {
        Self::new(&[], String::new())
    }
}

impl Source for Down {
    fn health(&self) -> Vec<ProbeStatus> {
        self.families
            .iter()
            .map(|&name| ProbeStatus {
                name,
                up: false,
                reason: self.reason.clone(),
            })
            .collect()
    }

    fn stop(&mut self) {}
}

/// `source` when it started, else what says why not.
pub fn started_or<'a, S: Source>(source: &'a Option<S>, down: &'a Down) -> &'a dyn Source {
    match source {
        Some(s) => s,
        None => down,
    }
}

/// Appends `value` as one JSON line to `path` (the recordings beside `shim.record_dir`'s GPU
/// records); a failure is logged once per path and otherwise ignored: recording never stops
/// the agent.
pub fn append_json_line(path: &std::path::Path, value: &impl serde::Serialize) {
    use std::io::Write as _;
    static WARNED: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
    let result = serde_json::to_vec(value)
        .map_err(std::io::Error::other)
        .and_then(|mut line| {
            line.push(b'\n');
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?
                .write_all(&line)
        });
    if let Err(e) = result {
        if let Ok(mut w) = WARNED.lock() {
            if !w.iter().any(|p| p == path) {
                log::warn!("cannot record to {}: {e}", path.display());
                w.push(path.to_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_that_did_not_start_reports_each_family_down_with_its_reason() {
        let down = Down::new(&["runqueue", "tcp"], "disabled by --no-ebpf");
        let none: Option<Down> = None;
        let h = started_or(&none, &down).health();
        assert_eq!(
            h.iter().map(|s| (s.name, s.up)).collect::<Vec<_>>(),
            [("runqueue", false), ("tcp", false)]
        );
        assert!(h.iter().all(|s| s.reason == "disabled by --no-ebpf"));
        assert!(Down::none().health().is_empty());
    }
}
