//! `slo-probe replay`: GPU records that the agent wrote with `shim.record_dir` (one `<pid>.bin`
//! per training process, records end to end as the shim sent them) read back through the same
//! decoding and iteration assembly as the live agent, for a report without a GPU. The traces in
//! `tests/fixtures/gpu/` were recorded this way on an H200.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use slo_probe_common::RecordIter;
use slo_probe_core::{
    occupancy::SmLimits,
    pipeline::{PipelineSettings, ProcessPipeline},
    snapshot::ProcessSnapshot,
};

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
}

/// Replays `path`. `limits`: the GPU's per-SM limits, for theoretical occupancy. With `detect`,
/// step markers are left out and iterations are detected from the kernel sequence.
/// `window_ms`: the SLO windows (see [`slo_probe_core::pipeline::Windows::FitToRecording`]).
pub fn replay(
    path: &Path,
    limits: Option<SmLimits>,
    detect: bool,
    window_ms: Option<u64>,
) -> Result<Replayed, ReplayError> {
    let name = path.display().to_string();
    let data = std::fs::read(path).map_err(|source| ReplayError::Read {
        path: name.clone(),
        source,
    })?;
    let pid = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut settings = PipelineSettings::recording(window_ms);
    settings.limits = limits;
    settings.ignore_markers = detect;
    let mut pipeline = ProcessPipeline::new(pid, settings).map_err(ReplayError::Spec)?;
    let mut records = 0u64;
    let mut iter = RecordIter::new(&data);
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
    })
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
            ", ignored: iterations detected from the kernel sequence"
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
    super::report::iterations_report(&mut out, p);
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
}
