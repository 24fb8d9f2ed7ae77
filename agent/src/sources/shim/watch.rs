//! Whether a shim's GPU records reach the agent while it traces kernels. CUPTI can keep them
//! until the process exits (seen on the H200 and an H100 when kernel activity was switched under
//! a deep queue or under CUDA graphs); the SLO engine then judges the job on wall times and host
//! data alone. The agent says so once, in its log and in the process's report, instead of
//! leaving violations without attribution unexplained.

use std::time::Duration;

use slo_probe_common::gpu::{DEPTH_KERNELS, DEPTH_OFF};

/// How long a shim at kernel depth may launch work without any GPU record arriving, ns.
pub const STALLED_AFTER_NS: u64 = 30_000_000_000;

/// Per process: since when no GPU record arrived while kernels were traced and work launched.
#[derive(Debug, Default)]
pub struct RecordWatch {
    /// When the quiet began (CLOCK_MONOTONIC ns), with the launches and GPU records seen then.
    since: Option<(u64, u64, u64)>,
    warned: bool,
}

/// What changed at an [`RecordWatch::update`].
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// No GPU record for this long while kernels were traced and work launched.
    Stalled(Duration),
    /// Records arrive again after a stall.
    Resumed,
}

impl RecordWatch {
    /// Feeds what the agent sees at `now_ns` (CLOCK_MONOTONIC): the shim's published `depth`,
    /// its launch callbacks so far (`launches`) and the GPU records (kernels, graph launches,
    /// copies) that reached the agent so far. Returns a change to report, once per stall.
    pub fn update(
        &mut self,
        now_ns: u64,
        depth: u32,
        launches: u64,
        gpu_records: u64,
    ) -> Option<Change> {
        let traced = depth >= DEPTH_KERNELS && depth != DEPTH_OFF;
        match self.since {
            // Still quiet at kernel depth.
            Some((t, l, r)) if traced && gpu_records <= r => {
                let quiet = now_ns.saturating_sub(t);
                let stalled = !self.warned && quiet >= STALLED_AFTER_NS && launches > l;
                self.warned |= stalled;
                stalled.then(|| Change::Stalled(Duration::from_nanos(quiet)))
            }
            // Records came, or none are expected: the quiet starts again.
            since => {
                let resumed = self.warned && since.is_some_and(|(_, _, r)| gpu_records > r);
                self.warned = false;
                self.since = traced.then_some((now_ns, launches, gpu_records));
                resumed.then_some(Change::Resumed)
            }
        }
    }

    /// How long the records have been stalled at `now_ns`, if they are.
    pub fn stalled(&self, now_ns: u64) -> Option<Duration> {
        let (t, _, _) = self.since.filter(|_| self.warned)?;
        Some(Duration::from_nanos(now_ns.saturating_sub(t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::gpu::DEPTH_TIMING;

    #[test]
    fn a_stall_is_said_once_and_its_end_too() {
        let at = |s: u64| 1_000_000_000 + s * 1_000_000_000;
        let mut w = RecordWatch::default();
        assert_eq!(w.update(at(0), DEPTH_KERNELS, 100, 50), None);
        // Records keep coming: nothing to say.
        assert_eq!(w.update(at(20), DEPTH_KERNELS, 200, 90), None);
        // Launches go on, no record for 30 s.
        assert_eq!(w.update(at(45), DEPTH_KERNELS, 300, 90), None);
        assert_eq!(
            w.update(at(50), DEPTH_KERNELS, 400, 90),
            Some(Change::Stalled(Duration::from_secs(30)))
        );
        assert_eq!(w.update(at(80), DEPTH_KERNELS, 500, 90), None, "said once");
        assert_eq!(w.stalled(at(80)), Some(Duration::from_secs(60)));
        assert_eq!(
            w.update(at(81), DEPTH_KERNELS, 510, 91),
            Some(Change::Resumed)
        );
        assert_eq!(w.stalled(at(81)), None);
    }

    #[test]
    fn no_stall_where_no_record_is_expected() {
        let at = |s: u64| 1_000_000_000 + s * 1_000_000_000;
        let mut w = RecordWatch::default();
        // Timing depth: an eager job without copies sends nothing between windows.
        for s in 0..100 {
            assert_eq!(w.update(at(s), DEPTH_TIMING, 10 * s, 0), None);
        }
        // Kernel depth, but the job launches nothing (waiting for data, or stopped).
        for s in 100..200 {
            assert_eq!(w.update(at(s), DEPTH_KERNELS, 1_000, 0), None);
        }
        // CUPTI handed over.
        for s in 200..300 {
            assert_eq!(w.update(at(s), DEPTH_OFF, 1_000 + s, 0), None);
        }
        assert_eq!(w.stalled(at(300)), None);
    }
}
