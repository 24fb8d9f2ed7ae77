//! `slo-probe replay`: GPU records that the agent wrote with `shim.record_dir` (one `<pid>.bin`
//! per training process, records end to end as the shim sent them) read back through the same
//! decoding and iteration assembly as the live agent, for a report without a GPU. The traces in
//! `tests/fixtures/gpu/` were recorded this way on an H200.
//!
//! Beside a recording the agent also writes the process's host samples (`<pid>.host.jsonl`)
//! and NVML's (`nvml.jsonl`, one per record folder). When they are there, the replay runs the
//! way the live agent ran: records in the order they arrived, time advancing with the host
//! samples, host causes (run-queue wait, throttling, retransmits) and device causes (SM clock)
//! judged as they were live ([`slo_probe_core::pipeline::drive`]). Without them only the GPU
//! side is judged.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use slo_probe_common::{AnyRecord, RecordIter};
use slo_probe_core::{
    gpu::{GpuHistory, GpuSnapshot},
    host::HostSample,
    occupancy::SmLimits,
    pipeline::{self, fitted_spec, PipelineSettings, ProcessPipeline, Windows},
    slo::SloSpec,
    snapshot::ProcessSnapshot,
};

use crate::{collector::HOST_RECORDING, sources::nvml::NVML_RECORDING};

/// Why a recording cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file cannot be read.
    #[error("cannot read the recording {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The output cannot be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The SLO spec was refused.
    #[error("cannot judge the recording")]
    Spec(#[source] slo_probe_core::slo::SloSpecError),
    /// Not a recording: its first record does not decode.
    #[error(
        "{path} is not a slo-probe GPU recording (its first record does not decode: {why}); \
         recordings are the <pid>.bin files the agent writes to shim.record_dir"
    )]
    NotARecording {
        /// The file.
        path: String,
        /// The decoding error.
        why: String,
    },
}

/// A recording replayed.
#[derive(Debug)]
pub struct Replayed {
    /// The file.
    pub path: PathBuf,
    /// What the agent would have reported for the process (pid from the file name, else 0).
    pub process: ProcessSnapshot,
    /// Bytes at the end that did not decode (a recording cut short), 0 when all decoded.
    pub undecoded_bytes: usize,
    /// Step markers left out (with `detect`).
    pub markers_ignored: u64,
    /// Host samples replayed beside the records (0: the GPU side only).
    pub host_samples: usize,
    /// NVML samples replayed beside the records.
    pub gpu_samples: usize,
    /// What a shadow healer decided over the replay ([`ReplayOptions::heal`]; `None`: none
    /// ran).
    pub healer: Option<crate::healer::shadow::Decided>,
}

/// How to replay.
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// The GPU's per-SM limits, for theoretical occupancy.
    pub limits: Option<SmLimits>,
    /// Leave step markers out and detect iterations (see `TraceAssembler::take_iterations`).
    pub detect: bool,
    /// SLO window length in ms (see [`Windows::FitToRecording`]); ignored with `spec`.
    pub window_ms: Option<u64>,
    /// The SLO tree the agent ran with (its config's), windows as given; `None`: the default
    /// tree with windows fitted to the recording.
    pub spec: Option<SloSpec>,
    /// Read the host and NVML samples recorded beside it, when there are any.
    pub sidecars: bool,
    /// Run a shadow healer with these decision parameters at every tick (replays with host
    /// samples, which tick as the agent did).
    pub heal: Option<slo_probe_core::healer::HealerConfig>,
    /// Feed each record when it reached the agent, not at its own end time: the recording is
    /// in arrival order, so a record is taken to have arrived with the latest time seen in the
    /// file up to it (a step marker or a record end). Records CUPTI handed over late (at a
    /// flush, at the job's exit) then come as late as they came live, and a replay judges only
    /// what the live agent had (the GPT under CUDA graphs of 2026-12-04: GPU records 10–13 s
    /// behind the markers). Replays with host samples only.
    pub arrival: bool,
    /// Also advance the pipeline every this many ms of record time, as the live agent does
    /// every 50 ms (`None`: only at the host samples, as before). Replays with host samples only.
    pub advance_ms: Option<u64>,
    /// With `advance_ms`: each of those advances this many ms past the record time, as the
    /// live agent's clock runs ahead of the records it has ([`pipeline::Every::ahead_ns`]).
    pub clock_ahead_ms: u64,
}

/// What was recorded beside `path`: its host samples and NVML's, each in time order (empty
/// when absent; a line that does not parse is skipped and counted).
pub fn sidecars(path: &Path) -> (Vec<HostSample>, Vec<GpuSnapshot>, usize) {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut bad = 0;
    let mut host: Vec<HostSample> =
        read_lines(&dir.join(format!("{stem}{HOST_RECORDING}")), &mut bad);
    let mut gpu: Vec<GpuSnapshot> =
        read_lines(&dir.join(format!("{stem}.{NVML_RECORDING}")), &mut bad);
    if gpu.is_empty() {
        gpu = read_lines(&dir.join(NVML_RECORDING), &mut bad);
    }
    host.sort_by_key(|h| h.at_ns);
    gpu.sort_by_key(|g| g.taken_at_ns);
    (host, gpu, bad)
}

fn read_lines<T: serde::de::DeserializeOwned>(path: &Path, bad: &mut usize) -> Vec<T> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let v = serde_json::from_str(l).ok();
            *bad += usize::from(v.is_none());
            v
        })
        .collect()
}

/// Replays `path`. `limits`: the GPU's per-SM limits, for theoretical occupancy. With `detect`,
/// step markers are left out and iterations are detected.
/// `window_ms`: the SLO windows (see [`slo_probe_core::pipeline::Windows::FitToRecording`]).
pub fn replay(
    path: &Path,
    limits: Option<SmLimits>,
    detect: bool,
    window_ms: Option<u64>,
) -> Result<Replayed, ReplayError> {
    let data = std::fs::read(path).map_err(|source| ReplayError::Read {
        path: path.display().to_string(),
        source,
    })?;
    replay_bytes(&data, path, limits, detect, window_ms)
}

/// Replays `path` with `opts`: as the live agent ran it when host samples were recorded beside
/// it (and `opts.sidecars`), else as [`replay`] does.
pub fn replay_with(path: &Path, opts: &ReplayOptions) -> Result<Replayed, ReplayError> {
    let data = std::fs::read(path).map_err(|source| ReplayError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let (host, gpu, _) = if opts.sidecars {
        sidecars(path)
    } else {
        Default::default()
    };
    if host.is_empty() && opts.spec.is_none() {
        let mut r = replay_bytes(&data, path, opts.limits, opts.detect, opts.window_ms)?;
        r.gpu_samples = 0;
        return Ok(r);
    }
    replay_live(&data, path, opts, &host, &gpu)
}

/// The live agent's way: every record at the time it had arrived, host samples at theirs.
fn replay_live(
    data: &[u8],
    path: &Path,
    opts: &ReplayOptions,
    host: &[HostSample],
    gpu: &[GpuSnapshot],
) -> Result<Replayed, ReplayError> {
    let name = path.display().to_string();
    let pid = pid_of(path);
    let mut records: Vec<(u64, AnyRecord<'_>)> = Vec::new();
    let mut iter = RecordIter::new(data);
    let mut clock = 0;
    for r in iter.by_ref() {
        match r {
            Ok(r) => {
                let t = pipeline::record_time(&r);
                let at = if opts.arrival && t > 0 {
                    clock = clock.max(t);
                    clock
                } else {
                    t
                };
                records.push((at, r));
            }
            Err(e) if records.is_empty() => {
                return Err(ReplayError::NotARecording {
                    path: name,
                    why: e.to_string(),
                })
            }
            Err(_) => {}
        }
    }
    let undecoded_bytes = iter.dropped_bytes();
    let count = records.len() as u64;
    // Names and graph nodes (time 0) stay ahead of what uses them; the rest by end time, or
    // (`opts.arrival`) in the file's order, as they arrived.
    records.sort_by_key(|(at, _)| *at);
    let spec = match &opts.spec {
        Some(s) => s.clone(),
        None => {
            let times = records.iter().map(|(at, _)| *at).filter(|&t| t > 0);
            let first = times.clone().min().unwrap_or(0);
            let last = times.max().unwrap_or(0);
            fitted_spec(&SloSpec::default(), first, last, opts.window_ms)
        }
    };
    let mut settings = PipelineSettings::live(spec, TICK_NS);
    settings.windows = Windows::Fixed;
    settings.keep_iterations = None;
    settings.limits = opts.limits;
    settings.ignore_markers = opts.detect;
    let mut p = ProcessPipeline::new(pid, settings).map_err(ReplayError::Spec)?;
    let mut history = GpuHistory::new(gpu.len().max(1));
    for g in gpu {
        history.push(g.clone());
    }
    // Without host samples time still advances, once a tick, as the agent's did.
    let host_samples = host.len();
    let ticks: Vec<HostSample>;
    let host = if host.is_empty() {
        let first = records
            .iter()
            .map(|(at, _)| *at)
            .find(|&t| t > 0)
            .unwrap_or(0);
        let last = records.last().map_or(0, |(at, _)| *at);
        ticks = (0..)
            .map(|k| first + k * TICK_NS)
            .take_while(|&t| t <= last + TICK_NS)
            .map(|at_ns| HostSample {
                at_ns,
                ..Default::default()
            })
            .collect();
        &ticks[..]
    } else {
        host
    };
    let mut shadow = opts
        .heal
        .clone()
        .map(|c| crate::healer::shadow::ShadowHealer::new(pid, c));
    pipeline::drive_every(
        &mut p,
        records,
        host,
        (!gpu.is_empty()).then_some(&history),
        pipeline::Every {
            every_ns: opts.advance_ms.unwrap_or(0) * 1_000_000,
            ahead_ns: opts.clock_ahead_ms * 1_000_000,
        },
        |p, at| {
            if let Some(h) = shadow.as_mut() {
                h.tick(p.snapshot(), at);
            }
        },
    );
    let info = p.info_mut();
    info.records = count;
    info.decode_failed = u64::from(undecoded_bytes > 0);
    info.corrupt_bytes = undecoded_bytes as u64;
    let markers_ignored = p.markers_ignored();
    Ok(Replayed {
        path: path.to_owned(),
        process: p.snapshot(),
        undecoded_bytes,
        markers_ignored,
        host_samples,
        gpu_samples: gpu.len(),
        healer: shadow.map(|h| h.decided()),
    })
}

/// Replays the recording `data`, read from `path` (which names it and gives the pid). The
/// bytes are untrusted: anything that does not decode is counted, never a panic (fuzzed by
/// `fuzz/fuzz_targets/replay.rs`).
pub fn replay_bytes(
    data: &[u8],
    path: &Path,
    limits: Option<SmLimits>,
    detect: bool,
    window_ms: Option<u64>,
) -> Result<Replayed, ReplayError> {
    let name = path.display().to_string();
    let pid = pid_of(path);
    let mut settings = PipelineSettings::recording(window_ms);
    settings.limits = limits;
    settings.ignore_markers = detect;
    let mut pipeline = ProcessPipeline::new(pid, settings).map_err(ReplayError::Spec)?;
    let mut records = 0u64;
    let mut iter = RecordIter::new(data);
    for r in iter.by_ref() {
        match r {
            Ok(r) => pipeline.push(&r),
            Err(e) if records == 0 => {
                return Err(ReplayError::NotARecording {
                    path: name,
                    why: e.to_string(),
                })
            }
            Err(_) => {}
        }
        records += 1;
    }
    let undecoded_bytes = iter.dropped_bytes();
    pipeline.finish(None);
    let info = pipeline.info_mut();
    info.records = records - u64::from(undecoded_bytes > 0);
    info.decode_failed = u64::from(undecoded_bytes > 0);
    info.corrupt_bytes = undecoded_bytes as u64;
    let markers_ignored = pipeline.markers_ignored();
    let process = pipeline.snapshot();
    Ok(Replayed {
        path: path.to_owned(),
        process,
        undecoded_bytes,
        markers_ignored,
        host_samples: 0,
        gpu_samples: 0,
        healer: None,
    })
}

/// The agent's tick when it recorded (its default, 1 s), for a replay without host samples.
const TICK_NS: u64 = 1_000_000_000;

/// The pid a recording is named after (`<pid>.bin`), else 0.
fn pid_of(path: &Path) -> u32 {
    path.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What [`trim`] kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Records written.
    pub kept: u64,
    /// Records of the input (that decoded).
    pub of: u64,
    /// Bytes at the end of the input that did not decode (left out).
    pub undecoded_bytes: usize,
    /// Host samples written beside it (`None`: the input had no sidecar).
    pub host_samples: Option<usize>,
}

impl Trimmed {
    /// One line for the user.
    pub fn summary(&self, input: &Path, output: &Path) -> String {
        let mut s = format!(
            "{}: kept {} of {} records in {}",
            input.display(),
            self.kept,
            self.of,
            output.display()
        );
        if let Some(n) = self.host_samples {
            let _ = write!(s, ", {n} host samples beside it");
        }
        if self.undecoded_bytes > 0 {
            let _ = write!(
                s,
                "; the last {} bytes did not decode and were left out",
                self.undecoded_bytes
            );
        }
        s
    }
}

/// Host samples kept before the span, so that the first one inside it has a predecessor to be
/// compared with (the agent's counters are cumulative).
const TRIM_HOST_LEAD_NS: u64 = 2_000_000_000;

/// Writes the part of the recording `input` from `from_ns` to `to_ns` to `output`: the records
/// of that span (activities that ended in it, markers and depth changes in it), every name and
/// graph node, and the depth in force when it starts; `<pid>.host.jsonl` beside the input is
/// cut to the span (plus [`TRIM_HOST_LEAD_NS`] before it) beside the output. The output is
/// written to a temporary file and renamed.
pub fn trim(input: &Path, output: &Path, from_ns: u64, to_ns: u64) -> Result<Trimmed, ReplayError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| ReplayError::Read {
            path: p.display().to_string(),
            source,
        })
    };
    let write = |p: &Path, bytes: &[u8]| {
        let tmp = p.with_extension("trim-tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, p))
            .map_err(|source| ReplayError::Write {
                path: p.display().to_string(),
                source,
            })
    };
    let data = read(input)?;
    let mut out = Vec::with_capacity(data.len() / 4);
    let mut t = Trimmed::default();
    let mut rest = &data[..];
    let mut depth_before: Option<&[u8]> = None;
    while !rest.is_empty() {
        let (r, used) = match slo_probe_common::decode(rest) {
            Ok(x) => x,
            Err(e) if t.of == 0 => {
                return Err(ReplayError::NotARecording {
                    path: input.display().to_string(),
                    why: e.to_string(),
                })
            }
            Err(_) => {
                t.undecoded_bytes = rest.len();
                break;
            }
        };
        let (bytes, next) = rest.split_at(used);
        rest = next;
        t.of += 1;
        let at = pipeline::record_time(&r);
        let timed = !matches!(r, AnyRecord::String(_) | AnyRecord::GraphNode(_));
        if timed && at >= from_ns {
            // The depth in force when the span starts goes first.
            if let Some(d) = depth_before.take() {
                out.extend_from_slice(d);
                t.kept += 1;
            }
        }
        let keep = match r {
            AnyRecord::Depth(_) if at < from_ns => {
                depth_before = Some(bytes);
                false
            }
            _ => !timed || (from_ns..=to_ns).contains(&at),
        };
        if keep {
            out.extend_from_slice(bytes);
            t.kept += 1;
        }
    }
    if let Some(d) = depth_before {
        out.extend_from_slice(d);
        t.kept += 1;
    }
    write(output, &out)?;
    let side = |p: &Path| {
        let stem = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_owned();
        p.with_file_name(format!("{stem}{HOST_RECORDING}"))
    };
    if let Ok(text) = std::fs::read_to_string(side(input)) {
        let lo = from_ns.saturating_sub(TRIM_HOST_LEAD_NS);
        let mut kept = String::new();
        let mut n = 0;
        for line in text.lines() {
            let at = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("at_ns")?.as_u64());
            if at.is_some_and(|at| (lo..=to_ns).contains(&at)) {
                kept.push_str(line);
                kept.push('\n');
                n += 1;
            }
        }
        write(&side(output), kept.as_bytes())?;
        t.host_samples = Some(n);
    }
    Ok(t)
}

/// The report of one replayed recording.
pub fn report(r: &Replayed) -> String {
    let p = &r.process;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "GPU recording {}: {} records ({} kernels, {} graph launches, {} memory ops, {} graph \
         nodes, {} step markers{}){}",
        r.path.display(),
        p.records,
        p.seen[0],
        p.seen[1],
        p.seen[2],
        p.seen[3],
        p.seen[5] / 2 + r.markers_ignored / 2,
        if r.markers_ignored > 0 {
            ", ignored: iterations detected"
        } else {
            ""
        },
        if r.undecoded_bytes > 0 {
            format!(
                "; the last {} bytes did not decode (a recording cut short): reported what came \
                 before",
                r.undecoded_bytes
            )
        } else {
            String::new()
        },
    );
    if r.host_samples > 0 || r.gpu_samples > 0 {
        let _ = writeln!(
            out,
            "  replayed as the agent ran it: {} host samples, {} NVML samples recorded beside it",
            r.host_samples, r.gpu_samples
        );
    }
    super::report::iterations_report(&mut out, p);
    if let Some(h) = &r.healer {
        super::report::shadow_heal_report(&mut out, h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/gpu")
            .join(name)
    }

    #[test]
    fn a_recording_replays_into_iterations_and_a_report() {
        let r = replay(
            &fixture("h200-eager.bin"),
            SmLimits::for_capability(9, 0),
            false,
            None,
        )
        .expect("replays");
        assert_eq!(r.undecoded_bytes, 0);
        assert_eq!(r.process.iterations.len(), 300);
        let text = report(&r);
        assert!(text.contains("300 iterations (step markers)"), "{text}");
        assert!(text.contains("operators by GPU time"), "{text}");
        assert!(text.contains("SLO tree ("), "{text}");
        assert!(text.contains("violations: none"), "{text}");
        let detected = replay(&fixture("h200-eager.bin"), None, true, None).expect("replays");
        assert_eq!(detected.markers_ignored, 600);
        assert!(detected.process.iterations.len() > 250);
        assert!(report(&detected).contains("(detected)"));
    }

    #[test]
    fn a_cut_recording_keeps_what_decoded_and_garbage_is_refused() {
        let dir = std::env::temp_dir().join(format!("slo-probe-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let data = std::fs::read(fixture("h200-eager.bin")).expect("fixture");
        let cut = dir.join("4242.bin");
        std::fs::write(&cut, &data[..data.len() / 2 + 7]).expect("write");
        let r = replay(&cut, None, false, None).expect("replays the decodable part");
        assert_eq!(r.process.pid, 4242);
        assert!(r.undecoded_bytes > 0);
        assert!(r.process.iterations.len() > 100);
        assert!(report(&r).contains("did not decode"));

        let junk = dir.join("junk.bin");
        std::fs::write(&junk, b"this is not a recording at all").expect("write");
        let e = replay(&junk, None, false, None).expect_err("garbage");
        assert!(
            e.to_string().contains("not a slo-probe GPU recording"),
            "{e}"
        );
        let e = replay(&dir.join("missing.bin"), None, false, None).expect_err("missing");
        assert!(e.to_string().contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Host samples every 100 ms from `first` to `last`, one JSON line each.
    fn host_lines(first: u64, last: u64) -> String {
        (0..)
            .map(|k| first + k * 100_000_000)
            .take_while(|&t| t <= last)
            .map(|at_ns| {
                let h = HostSample {
                    at_ns,
                    ..Default::default()
                };
                serde_json::to_string(&h).expect("json") + "\n"
            })
            .collect()
    }

    fn tmp(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("slo-probe-replay-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        dir
    }

    #[test]
    fn a_trimmed_recording_keeps_its_span_names_and_host_samples() {
        let dir = tmp("trim");
        let src = dir.join("77.bin");
        std::fs::copy(fixture("h200-eager.bin"), &src).expect("copy");
        let whole = replay(&src, None, false, None).expect("replays");
        let its: Vec<_> = whole.process.iterations.iter().collect();
        let (from, to) = (its[100].start_ns, its[199].end_ns);
        let lines = host_lines(its[0].start_ns, its[299].end_ns);
        std::fs::write(dir.join(format!("77{HOST_RECORDING}")), &lines).expect("write");
        let out = dir.join("77-cut.bin");
        let t = trim(&src, &out, from, to).expect("trims");
        assert!(t.kept < t.of / 2, "{t:?}");
        assert!(t
            .host_samples
            .is_some_and(|n| n > 0 && n < lines.lines().count()));
        let cut = replay(&out, None, false, None).expect("replays the cut");
        let n = cut.process.iterations.len();
        assert!((99..=101).contains(&n), "{n} iterations");
        // Kernels keep their names: the operators are still named.
        assert!(report(&cut).contains("operators by GPU time"));
        assert!(!report(&cut).contains("(unnamed)"), "{}", report(&cut));
        // Replayed as live with the host samples beside it.
        let live = replay_with(
            &out,
            &ReplayOptions {
                sidecars: true,
                ..Default::default()
            },
        )
        .expect("replays as live");
        assert!(live.host_samples > 0);
        assert!(report(&live).contains("replayed as the agent ran it"));
        let k = live.process.iterations.len();
        assert!((98..=101).contains(&k), "{k} iterations");
        assert!(trim(&src, &out, 0, 1).is_ok_and(|t| t.kept < 2_000));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Kernel records handed over at the job's exit (moved to the end of the file, as CUPTI
    /// delivered the GPT's under CUDA graphs): by end time the replay still gives every
    /// iteration its kernels; by arrival, iterations settle before they come, as live.
    #[test]
    fn an_arrival_replay_judges_late_records_as_late() {
        let dir = tmp("arrival");
        let data = std::fs::read(fixture("h200-eager.bin")).expect("fixture");
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        let mut pos = 0;
        while pos + 8 <= data.len() {
            let kind = u16::from_le_bytes([data[pos], data[pos + 1]]);
            let len = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().expect("4")) as usize;
            if len < 8 || pos + len > data.len() {
                break;
            }
            let to = if kind == 0x0200 { &mut tail } else { &mut head };
            to.extend_from_slice(&data[pos..pos + len]);
            pos += len;
        }
        assert!(!tail.is_empty());
        head.extend_from_slice(&tail);
        let late = dir.join("78.bin");
        std::fs::write(&late, &head).expect("write");
        let whole = replay(&late, None, false, None).expect("replays");
        let its: Vec<_> = whole.process.iterations.iter().collect();
        let lines = host_lines(its[0].start_ns, its[its.len() - 1].end_ns);
        std::fs::write(dir.join(format!("78{HOST_RECORDING}")), &lines).expect("write");
        let kernels = |arrival| {
            let r = replay_with(
                &late,
                &ReplayOptions {
                    sidecars: true,
                    arrival,
                    ..Default::default()
                },
            )
            .expect("replays as live");
            let its = &r.process.iterations;
            let with = its.iter().filter(|i| i.kernels > 0).count();
            (with, its.len())
        };
        let (by_end, n) = kernels(false);
        assert!(
            by_end * 10 >= n * 9,
            "{by_end} of {n} iterations with kernels"
        );
        let (by_arrival, n) = kernels(true);
        // Only those still unsettled when the records came (the recording's last 1.5 s).
        assert!(
            by_arrival * 2 <= n,
            "{by_arrival} of {n} iterations with kernels"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
